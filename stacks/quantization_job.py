"""What the AWQ quantization job needs to run as a SageMaker training job.

The job itself is started by ``python -m tools.quantize`` (the sagemaker SDK), not by
CloudFormation: a training job is a run, not a resource. The stack provides what a run uses —
the job image (``containers/quantize``, pushed as a CDK asset) and an execution role scoped to

* read the base models under ``quantization.base_model_root``;
* write a gated model under ``quantization.candidates_prefix`` (``<run id>/``, with its own
  artifact-manifest.json) and every run's reports — never the served prefix: ``make promote``
  copies a candidate there, checked (tools/promote);
* encrypt and decrypt with the project key through S3 (and, only for an EBS-backed training
  instance, grant the training volume that key: instances with local NVMe storage refuse a
  ``VolumeKmsKeyId``);
* pull its own image, write its log group and metrics, and attach to the models' VPC.

Permissions follow "CreateTrainingJob API: Execution Role Permissions"
(https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html#sagemaker-roles-createtrainingjob-perms).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from gpu_budget import instance_type as catalog_instance
from stacks.container_image import repo_image_asset
from stacks.model_role import literal_bucket_name, log_group_resources, vpc_access_statements
from stacks.nag import acknowledge
from stacks.network import ModelNetwork

QUANTIZE_IMAGE_SOURCES: tuple[str, ...] = ("containers/quantize", "quantization", "prompts",
                                           "artifact_manifest")
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class QuantizationJobResources(Construct):
    """The quantization job's image asset and execution role (``self.iam_role``)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        artifact_bucket: s3.IBucket,
        encryption_key: kms.IKey,
        base_model_root: str,
        candidates_prefix: str,
        reports_prefix: str,
        instance_type: str,
        network: ModelNetwork,
    ) -> None:
        super().__init__(scope, id_)
        stack = cdk.Stack.of(self)
        self.ecr_image: ecr_assets.DockerImageAsset = repo_image_asset(
            self, "Image", dockerfile="containers/quantize/Dockerfile",
            sources=QUANTIZE_IMAGE_SOURCES,
        )
        self.iam_role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(
                "sagemaker.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            ),
            description="AWQ quantization training job: base models in, gated model and "
            "reports out, nothing else",
        )
        self._allow_artifacts(artifact_bucket, encryption_key, instance_type,
                              (base_model_root, candidates_prefix, reports_prefix))
        self.ecr_image.repository.grant_pull(self.iam_role)
        log_group_arn = self._allow_logs_and_metrics()
        for statement in vpc_access_statements(stack, network.ec2_vpc.vpc_id):
            self.iam_role.add_to_policy(statement)
        self._acknowledge_wildcards(literal_bucket_name(artifact_bucket.bucket_name),
                                    (base_model_root, candidates_prefix, reports_prefix),
                                    log_group_arn)

    def _allow_artifacts(self, artifact_bucket: s3.IBucket, encryption_key: kms.IKey,
                         instance_type: str, prefixes: tuple[str, str, str]) -> None:
        """Read the base models, write the gated model and the reports, list only those
        prefixes, use the project key through S3 (and for an EBS training volume)."""
        stack = cdk.Stack.of(self)
        base_model_root, candidates_prefix, reports_prefix = prefixes
        read_objects = artifact_bucket.arn_for_objects(f"{base_model_root}/*")
        write_objects = [artifact_bucket.arn_for_objects(f"{candidates_prefix}/*"),
                         artifact_bucket.arn_for_objects(f"{reports_prefix}/*")]
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="ReadBaseModels", actions=["s3:GetObject"], resources=[read_objects]))
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="WriteModelAndReports",
            actions=["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"],
            resources=write_objects,
        ))
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="ListOwnPrefixes", actions=["s3:ListBucket"],
            resources=[artifact_bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [
                f"{prefix}/*" for prefix in (base_model_root, candidates_prefix, reports_prefix)]}},
        ))
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="ProjectKeyThroughS3",
            actions=["kms:Decrypt", "kms:GenerateDataKey"],
            resources=[encryption_key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"s3.{stack.region}.amazonaws.com"}},
        ))
        if not catalog_instance(instance_type).local_instance_storage:
            # An EBS-backed training volume is encrypted with the project key (VolumeKmsKeyId).
            self.iam_role.add_to_policy(iam.PolicyStatement(
                sid="VolumeKeyGrant", actions=["kms:CreateGrant"],
                resources=[encryption_key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            ))

    def _allow_logs_and_metrics(self) -> str:
        """The training log group and metric namespace; returns the log group's ARN."""
        stack = cdk.Stack.of(self)
        log_group_arn = stack.format_arn(
            service="logs", resource="log-group", resource_name=TRAINING_LOG_GROUP,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="TrainingLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                     "logs:DescribeLogStreams"],
            resources=log_group_resources(log_group_arn),
        ))
        self.iam_role.add_to_policy(iam.PolicyStatement(
            sid="TrainingMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}},
        ))
        return log_group_arn

    def _acknowledge_wildcards(self, bucket_name: str, prefixes: tuple[str, str, str],
                               log_group_arn: str) -> None:
        """Why each remaining wildcard is as narrow as the API allows (cdk-nag IAM5)."""
        base_model_root, candidates_prefix, reports_prefix = prefixes
        acknowledge(
            self.iam_role,
            "AwsSolutions-IAM5",
            "Each wildcard is as narrow as the API allows: objects under the base-model root, "
            "the candidates prefix and the reports prefix; the training log "
            "group and its streams; PutMetricData is limited to the training namespace, "
            "ecr:GetAuthorizationToken and EC2 Describe* have no resource-level permissions, and "
            "the network-interface calls are limited to the models' VPC by ec2:Vpc.",
            applies_to=[
                f"Resource::arn:aws:s3:::{bucket_name}/{base_model_root}/*",
                f"Resource::arn:aws:s3:::{bucket_name}/{candidates_prefix}/*",
                f"Resource::arn:aws:s3:::{bucket_name}/{reports_prefix}/*",
                f"Resource::{log_group_arn}:*",
                "Resource::*",
            ],
        )
