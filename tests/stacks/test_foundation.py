"""The foundation stack of every environment: key, artifact bucket, access logs, alarm topic."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template

ENVIRONMENTS = {"Dev": "ml-platform-dev@example.com", "Prod": "ml-platform-oncall@example.com"}


@pytest.fixture(scope="module")
def foundation(synthesized, stage: str) -> Template:  # type: ignore[no-untyped-def]
    return Template.from_json(synthesized.template(f"{stage}/Foundation"))


def test_customer_managed_key_rotates_and_is_retained(foundation: Template) -> None:
    foundation.resource_count_is("AWS::KMS::Key", 1)
    foundation.has_resource("AWS::KMS::Key", {
        "Properties": {"EnableKeyRotation": True},
        "DeletionPolicy": "Retain",
        "UpdateReplacePolicy": "Retain",
    })


def test_cloudwatch_may_use_the_key_for_the_encrypted_topic(foundation: Template) -> None:
    foundation.has_resource_properties("AWS::KMS::Key", {
        "KeyPolicy": {"Statement": Match.array_with([Match.object_like({
            "Sid": "AllowCloudWatchAlarmsToUseKeyForSns",
            "Principal": {"Service": "cloudwatch.amazonaws.com"},
            "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
            "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
        })])}
    })


def test_artifact_bucket_is_kms_encrypted_versioned_private_and_logged(
    foundation: Template,
) -> None:
    key_ref = {"Fn::GetAtt": [Match.string_like_regexp("^ProjectKey"), "Arn"]}
    foundation.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [{
            "BucketKeyEnabled": True,
            "ServerSideEncryptionByDefault": {
                "SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_ref,
            },
        }]},
        "VersioningConfiguration": {"Status": "Enabled"},
        "PublicAccessBlockConfiguration": {
            "BlockPublicAcls": True, "BlockPublicPolicy": True,
            "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
        },
        "LoggingConfiguration": {
            "DestinationBucketName": {"Ref": Match.string_like_regexp("^ModelArtifactsAccessLogs")},
            "LogFilePrefix": "model-artifacts/",
        },
        "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
    })


def test_both_buckets_refuse_plain_http_and_old_tls(foundation: Template) -> None:
    policies = foundation.find_resources("AWS::S3::BucketPolicy")
    assert len(policies) == 2
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        conditions = [s.get("Condition", {}) for s in statements if s["Effect"] == "Deny"]
        assert {"Bool": {"aws:SecureTransport": "false"}} in conditions
        assert {"NumericLessThan": {"s3:TlsVersion": 1.2}} in conditions


def test_access_log_bucket_uses_s3_managed_keys_and_expires_logs(foundation: Template) -> None:
    foundation.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [{
            "ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
        }]},
        "LifecycleConfiguration": {"Rules": Match.array_with([Match.object_like({
            "Id": "expire-access-logs", "Status": "Enabled",
        })])},
    })


def test_alarm_topic_is_encrypted_ssl_only_and_has_the_subscribers(
    foundation: Template, stage: str
) -> None:
    foundation.has_resource_properties("AWS::SNS::Topic", {
        "KmsMasterKeyId": {"Fn::GetAtt": [Match.string_like_regexp("^ProjectKey"), "Arn"]},
    })
    foundation.has_resource_properties("AWS::SNS::TopicPolicy", {
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "sns:Publish",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        })])}
    })
    foundation.has_resource_properties("AWS::SNS::Subscription", {
        "Protocol": "email", "Endpoint": ENVIRONMENTS[stage],
    })


def test_removal_policy_follows_settings(synthesized) -> None:  # type: ignore[no-untyped-def]
    dev = Template.from_json(synthesized.template("Dev/Foundation"))
    prod = Template.from_json(synthesized.template("Prod/Foundation"))
    dev.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Delete"})
    prod.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Retain"})
    assert not dev.find_resources("AWS::S3::Bucket", {"DeletionPolicy": "Retain"})


def test_outputs_for_operators(foundation: Template) -> None:
    outputs = foundation.to_json()["Outputs"]
    assert {"ModelArtifactBucketName", "AlarmTopicArn", "ProjectKeyArn"} <= set(outputs)


def test_every_resource_is_tagged_with_the_environment(synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    template = Template.from_json(synthesized.template(f"{stage}/Foundation"))
    template.has_resource_properties("AWS::S3::Bucket", {
        "Tags": Match.array_with([{"Key": "Environment", "Value": stage.lower()}]),
    })
