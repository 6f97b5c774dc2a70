"""The model-artifact bucket: AWQ weights, LoRA adapters and compiled Neuron models."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import acknowledge, acknowledge_checkov
from stacks.settings import ArtifactBucketSettings


class ArtifactStore(Construct):
    """A versioned, KMS-encrypted, SSL-only bucket with server access logs.

    The access-log bucket uses S3-managed keys because S3 server access logging cannot deliver
    to a bucket whose default encryption is SSE-KMS.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        encryption_key: kms.IKey,
        settings: ArtifactBucketSettings,
        bucket_name: str,
    ) -> None:
        super().__init__(scope, id_)
        removal_policy = (
            cdk.RemovalPolicy.DESTROY
            if settings.removal_policy == "destroy"
            else cdk.RemovalPolicy.RETAIN
        )

        self.s3_access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-access-logs",
                    expiration=cdk.Duration.days(settings.access_log_retention_days),
                    noncurrent_version_expiration=cdk.Duration.days(1),
                )
            ],
            removal_policy=removal_policy,
        )
        acknowledge(
            self.s3_access_log_bucket,
            "AwsSolutions-S1",
            "This bucket receives the artifact bucket's server access logs; logging it into "
            "itself would create a log loop. Object-level access is in CloudTrail data events.",
        )
        acknowledge_checkov(
            self.s3_access_log_bucket,
            "CKV_AWS_18",
            "This bucket receives the artifact bucket's server access logs; logging it into "
            "itself would create a log loop. Object-level access is in CloudTrail data events.",
        )

        self.s3_bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=encryption_key,
            bucket_key_enabled=True,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=self.s3_access_log_bucket,
            server_access_logs_prefix="model-artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-replaced-versions",
                    noncurrent_version_expiration=cdk.Duration.days(
                        settings.noncurrent_version_expiration_days
                    ),
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(7),
                )
            ],
            removal_policy=removal_policy,
        )
