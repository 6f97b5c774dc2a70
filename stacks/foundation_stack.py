"""Foundation stack: what every other stack of an environment builds on, and what outlives it.

The customer-managed key, the model-artifact bucket and the alarm topic live here, apart from the
serving stack, so that replacing or deleting serving resources never touches stored artifacts.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from quantization import job_outputs
from stacks.alerting import AlarmTopic
from stacks.artifact_store import ArtifactStore
from stacks.settings import EnvironmentSettings


def grants_only_for_aws_services() -> iam.PolicyStatement:
    """Deny CreateGrant unless an AWS service asks for it (or is the caller)."""
    return iam.PolicyStatement(
        sid="CreateGrantOnlyForAwsServices",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["kms:CreateGrant"],
        resources=["*"],
        conditions={"BoolIfExists": {"kms:GrantIsForAWSResource": "false",
                                     "aws:PrincipalIsAWSService": "false"}},
    )


class FoundationStack(cdk.Stack):
    """Project key (rotation on), artifact bucket with access logs, encrypted alarm topic."""

    def __init__(
        self, scope: Construct, id_: str, *, settings: EnvironmentSettings, **kwargs: Any
    ) -> None:
        super().__init__(
            scope,
            id_,
            description=f"MangaAssist GPU inference platform ({settings.name}): key, model "
            "artifacts, alarm topic",
            termination_protection=settings.artifacts.removal_policy == "retain",
            **kwargs,
        )
        self.kms_key = kms.Key(
            self,
            "ProjectKey",
            description=f"MangaAssist {settings.name}: model artifacts, endpoint volumes, "
            "alarm topic, logs",
            enable_key_rotation=True,
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        self.kms_key.add_alias(f"alias/{settings.resource_prefix}")
        # Grants only for AWS services acting for a principal (SageMaker's volume encryption,
        # Lambda's environment): nobody may hand the key out directly. "kms:GrantIsForAWSResource
        # allows principals to call CreateGrant ... only when an AWS service that is integrated
        # with AWS KMS sends the request on the principal's behalf" ("Controlling access to
        # grants", https://docs.aws.amazon.com/kms/latest/developerguide/grant-authorization.html);
        # AWS Control Tower's CT.KMS.PR.3 asks for exactly this statement.
        self.kms_key.add_to_resource_policy(grants_only_for_aws_services())
        # CloudWatch Logs encrypts the environment's log groups (VPC flow logs, Lambda logs).
        self.kms_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchLogsInThisAccount",
                principals=[iam.ServicePrincipal(f"logs.{self.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                         "kms:Describe*"],
                resources=["*"],
                conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": self.format_arn(
                    service="logs", resource="log-group", resource_name="*",
                    arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)}},
            )
        )
        # EventBridge puts events it cannot deliver on the release-calendar function's
        # dead-letter queue, which this key encrypts; a service writing to an SQS queue under a
        # customer-managed key needs GenerateDataKey and Decrypt in the key policy ("Access
        # management for encrypted Amazon SQS queues with least privilege policies",
        # https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-least-privilege-policy.html).
        self.kms_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowEventBridgeRuleDeadLetterQueues",
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=["*"],
                conditions={
                    "StringEquals": {"aws:SourceAccount": self.account},
                    "ArnLike": {"aws:SourceArn": self.format_arn(
                        service="events", resource="rule", resource_name="*")},
                },
            )
        )

        self.artifact_store = ArtifactStore(
            self,
            "ModelArtifacts",
            encryption_key=self.kms_key,
            settings=settings.artifacts,
            bucket_name=settings.artifact_bucket_name,
        )
        self.alarm_topic = AlarmTopic(
            self,
            "Alarms",
            encryption_key=self.kms_key,
            settings=settings.alerts,
            display_name=f"MangaAssist {settings.name} inference alarms",
            alarm_name_prefix=settings.alarm_name_prefix,
        )

        cdk.CfnOutput(self, job_outputs.ARTIFACT_BUCKET,
                      value=self.artifact_store.s3_bucket.bucket_name,
                      description="Upload model weights, adapters and Neuron artifacts here.")
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.sns_topic.topic_arn)
        cdk.CfnOutput(self, job_outputs.PROJECT_KEY_ARN, value=self.kms_key.key_arn)
