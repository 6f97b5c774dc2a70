"""The execution role of a SageMaker model: read one prefix, pull one image, write its logs.

SageMaker documents what a hosting execution role needs (SageMaker Developer Guide, "How to use
SageMaker AI execution roles", section "CreateModel API: Execution Role Permissions",
https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html#sagemaker-roles-createmodel-perms):
cloudwatch:PutMetricData, logs:CreateLogStream, logs:PutLogEvents, logs:CreateLogGroup,
logs:DescribeLogStreams, s3:GetObject, s3:ListBucket, ecr:GetAuthorizationToken,
ecr:BatchCheckLayerAvailability, ecr:GetDownloadUrlForLayer, ecr:BatchGetImage; with deployment
guardrails, cloudwatch:DescribeAlarms on the auto-rollback alarms; in a VPC, the EC2
network-interface calls. This role grants each, scoped as narrowly as the service allows.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import acknowledge
from stacks.network import ModelNetwork

SAGEMAKER_METRIC_NAMESPACES: list[str] = ["/aws/sagemaker/*"]
"""CloudWatch namespaces the role may publish to: SageMaker's own (the endpoint instance metrics
are in /aws/sagemaker/Endpoints). The containers' custom metrics go through EMF log lines, which
need no PutMetricData; "AWS/" namespaces are reserved for AWS itself."""


class ModelExecutionRole(Construct):
    """A role SageMaker assumes for one endpoint's model, and nothing more.

    * read ``<artifact_prefix>/*`` of the artifact bucket (and decrypt with its key);
    * pull the endpoint's image from its ECR repository;
    * write the endpoint's log group ``/aws/sagemaker/Endpoints/<endpoint_name>``;
    * publish the instance metrics (``/aws/sagemaker/Endpoints``: CPU, memory, GPU and GPU
      memory utilization, which the GPU-memory alarm and the dashboard read) and nothing else:
      PutMetricData has no resources, so a ``cloudwatch:namespace`` condition keeps it to
      SageMaker's own namespaces;
    * read the auto-rollback alarms' state during a blue/green deployment (when there are any);
    * manage the network interfaces SageMaker attaches in the model's VPC.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        endpoint_name: str,
        artifact_bucket: s3.IBucket,
        artifact_prefix: str,
        image: ecr_assets.DockerImageAsset,
        network: ModelNetwork,
        reads_rollback_alarms: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        stack = cdk.Stack.of(self)
        self.iam_role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker model of {endpoint_name}: its artifacts, image and logs only",
        )
        self._allow_model_data(artifact_bucket, artifact_prefix)
        image.repository.grant_pull(self.iam_role)
        log_group_arn = self._allow_logs_and_metrics(endpoint_name, reads_rollback_alarms)
        for statement in vpc_access_statements(stack, network.ec2_vpc.vpc_id):
            self.iam_role.add_to_policy(statement)
        self._acknowledge_wildcards(artifact_bucket, artifact_prefix, log_group_arn)

    def _allow_model_data(self, artifact_bucket: s3.IBucket, artifact_prefix: str) -> None:
        """Read (and decrypt) the objects under this model's own prefix, nothing else."""
        stack = cdk.Stack.of(self)
        objects_arn = artifact_bucket.arn_for_objects(f"{artifact_prefix}/*")
        self.iam_role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadModelData",
                actions=["s3:GetObject"],
                resources=[objects_arn],
            )
        )
        self.iam_role.add_to_policy(
            iam.PolicyStatement(
                sid="ListModelData",
                actions=["s3:ListBucket"],
                resources=[artifact_bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{artifact_prefix}/*"]}},
            )
        )
        if artifact_bucket.encryption_key is not None:
            self.iam_role.add_to_policy(
                iam.PolicyStatement(
                    sid="DecryptModelData",
                    actions=["kms:Decrypt"],
                    resources=[artifact_bucket.encryption_key.key_arn],
                    conditions={
                        "StringEquals": {"kms:ViaService": f"s3.{stack.region}.amazonaws.com"}
                    },
                )
            )

    def _allow_logs_and_metrics(self, endpoint_name: str, reads_rollback_alarms: bool) -> str:
        """This endpoint's own log group, SageMaker's metric namespaces and (when there are any)
        the rollback alarms; returns the log group's ARN."""
        stack = cdk.Stack.of(self)
        log_group_arn = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.iam_role.add_to_policy(
            iam.PolicyStatement(
                sid="EndpointLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                         "logs:DescribeLogStreams"],
                resources=log_group_resources(log_group_arn),
            )
        )
        self.iam_role.add_to_policy(
            iam.PolicyStatement(
                sid="EndpointInstanceMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": SAGEMAKER_METRIC_NAMESPACES}},
            )
        )
        if reads_rollback_alarms:
            self.iam_role.add_to_policy(
                iam.PolicyStatement(
                    sid="DeploymentRollbackAlarms",
                    actions=["cloudwatch:DescribeAlarms"],
                    resources=["*"],
                )
            )
        return log_group_arn

    def _acknowledge_wildcards(self, artifact_bucket: s3.IBucket, artifact_prefix: str,
                               log_group_arn: str) -> None:
        """Why each remaining wildcard is as narrow as the API allows (cdk-nag IAM5)."""
        bucket_name = literal_bucket_name(artifact_bucket.bucket_name)
        acknowledge(
            self.iam_role,
            "AwsSolutions-IAM5",
            "Each wildcard is as narrow as the API allows: the objects under this model's own "
            "prefix; this endpoint's own log group and its streams; ecr:GetAuthorizationToken, "
            "cloudwatch:PutMetricData (held to SageMaker's namespaces by cloudwatch:namespace) "
            "and EC2 Describe* have no resource-level permissions; cloudwatch:DescribeAlarms "
            "returns composite alarms only when scoped to * and SageMaker does not document how "
            "it reads the rollback alarms; the network-interface calls SageMaker makes for the "
            "model's VPC are limited to that VPC by ec2:Vpc.",
            applies_to=[
                f"Resource::arn:aws:s3:::{bucket_name}/{artifact_prefix}/*",
                f"Resource::{log_group_arn}:*",
                "Resource::*",
            ],
        )


def vpc_access_statements(stack: cdk.Stack, vpc_id: str) -> list[iam.PolicyStatement]:
    """What SageMaker needs to put a job's or an endpoint's instances in the private subnets:
    the network-interface calls, limited to this VPC by ``ec2:Vpc``, and the Describe calls, which
    have no resource-level permissions."""
    return [
        iam.PolicyStatement(
            sid="VpcNetworkInterfaces",
            actions=["ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                     "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission"],
            resources=["*"],
            conditions={"ArnEquals": {"ec2:Vpc": stack.format_arn(
                service="ec2", resource="vpc", resource_name=vpc_id)}},
        ),
        iam.PolicyStatement(
            sid="VpcDescribe",
            actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
                     "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
                     "ec2:DescribeSecurityGroups"],
            resources=["*"],
        ),
    ]


def log_group_resources(log_group_arn: str) -> list[str]:
    """A log group's two ARN forms for IAM: ``log-group:NAME`` and ``log-group:NAME:*`` — the
    one "to refer to the ARN when specifying permissions in IAM policies for all other API
    actions" than tagging, which also covers its streams (``…:log-stream:NAME``). CloudWatch Logs
    User Guide, "Overview of managing access permissions to your CloudWatch Logs resources",
    https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/iam-access-control-overview-cwl.html.
    Without it SageMaker cannot ship the container's log lines: no logs, no EMF metrics, and the
    alarms on them (time to first token, time per output token) never fire."""
    return [log_group_arn, f"{log_group_arn}:*"]


def literal_bucket_name(value: str) -> str:
    """The artifact bucket's name as a literal: the cdk-nag acknowledgements name its ARNs."""
    if cdk.Token.is_unresolved(value):
        raise ValueError("the artifact bucket must be referenced by its literal name")
    return value
