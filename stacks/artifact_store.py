"""The model-artifact bucket: AWQ weights, LoRA adapters and compiled Neuron models."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import acknowledge, acknowledge_checkov, acknowledge_guard
from stacks.settings import ArtifactBucketSettings

LOG_LOOP = ("This bucket receives the artifact bucket's server access logs; logging it into "
            "itself would create a log loop. Object-level access is in CloudTrail data events.")

SSE_S3_ONLY = (
    "S3 server access logging delivers only to a bucket whose default encryption is SSE-S3: "
    "'Default server-side encryption with AWS KMS keys (SSE-KMS) is not supported for server "
    "access logging destination buckets' (Amazon S3 User Guide, 'Enabling Amazon S3 server "
    "access logging', https://docs.aws.amazon.com/AmazonS3/latest/userguide/"
    "enable-server-access-logging.html).")

NO_OBJECT_LOCK = (
    "Object Lock is not used: replaced model weights (gigabytes per version) are kept as "
    "noncurrent versions for artifacts.noncurrent_version_expiration_days and then expired by the "
    "lifecycle rule, which a retention period would block; the bucket is versioned, KMS-encrypted, "
    "retained on stack deletion, and written only by make publish, the promotion and the job.")


class ArtifactStore(Construct):
    """A versioned, KMS-encrypted, SSL-only bucket with server access logs.

    The access-log bucket uses S3-managed keys because S3 server access logging cannot deliver
    to a bucket whose default encryption is SSE-KMS. Object events of the artifact bucket go to
    EventBridge's default bus (each publish, promotion and job upload is an event there);
    the access-log bucket's would be one per delivered log object, so it sends none.
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
        acknowledge(self.s3_access_log_bucket, "AwsSolutions-S1", LOG_LOOP)
        acknowledge_checkov(self.s3_access_log_bucket, "CKV_AWS_18", LOG_LOOP)
        acknowledge_guard(self.s3_access_log_bucket, "CT.S3.PR.2", LOG_LOOP)
        acknowledge_guard(self.s3_access_log_bucket, "CT.S3.PR.10", SSE_S3_ONLY)
        acknowledge_guard(self.s3_access_log_bucket, "CT.S3.PR.9", NO_OBJECT_LOCK)
        acknowledge_guard(
            self.s3_access_log_bucket, "CT.S3.PR.4",
            "No event notifications from the access-log bucket: S3 delivers a log object every few "
            "minutes, and nothing reacts to a log delivery; the logs are read when investigating.")

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
        cfn_bucket = self.s3_bucket.node.default_child
        assert isinstance(cfn_bucket, s3.CfnBucket)
        # CloudFormation's own EventBridgeConfiguration (CDK's event_bridge_enabled would add a
        # custom-resource Lambda to set it).
        cfn_bucket.add_property_override(
            "NotificationConfiguration.EventBridgeConfiguration.EventBridgeEnabled", True)
        acknowledge_guard(self.s3_bucket, "CT.S3.PR.9", NO_OBJECT_LOCK)
