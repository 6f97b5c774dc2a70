"""The encrypted SNS topic every alarm of an environment notifies."""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.settings import AlertSettings


class AlarmTopic(Construct):
    """An SSL-only SNS topic encrypted with the project key, with e-mail subscribers.

    CloudWatch publishes alarm notifications as the ``cloudwatch.amazonaws.com`` service. Two
    policies must let it, or every notification fails while the console shows the alarm in ALARM:

    * the topic policy: ``enforce_ssl`` writes one, and a topic policy replaces SNS's default
      policy, so it must allow ``sns:Publish`` to that principal itself. It is held to this
      account (``aws:SourceAccount``) and this environment's alarms (``aws:SourceArn`` like
      ``arn:aws:cloudwatch:<region>:<account>:alarm:<alarm_name_prefix>*``), as CloudWatch's
      guide recommends against the confused deputy ("Notifying users on alarm changes");
    * the key policy: ``kms:GenerateDataKey*`` and ``kms:Decrypt`` for the same principal (SNS
      guide, "Enable compatibility between event sources from AWS services and encrypted
      topics").
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        encryption_key: kms.Key,
        settings: AlertSettings,
        display_name: str,
        alarm_name_prefix: str,
    ) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        self.sns_topic = sns.Topic(
            self,
            "Topic",
            display_name=display_name,
            master_key=encryption_key,
            enforce_ssl=True,
        )
        for address in settings.email_subscribers:
            self.sns_topic.add_subscription(subscriptions.EmailSubscription(address))

        self.sns_topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowThisEnvironmentsAlarmsToPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.sns_topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {"aws:SourceArn": stack.format_arn(
                        service="cloudwatch", resource="alarm",
                        resource_name=f"{alarm_name_prefix}*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME)},
                },
            )
        )
        encryption_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToUseKeyForSns",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )

