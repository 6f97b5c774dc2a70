"""Fake AWS credentials for tests that talk to moto (boto3 finds these before any real ones, so
nothing a test does can reach an AWS account), and moto's account as the Foundation stack leaves
it (:func:`aws_environment`): the environment's bucket (versioned), the project KMS key and a
Foundation stack whose outputs name them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from stacks.settings import EnvironmentSettings

REGION = "ap-northeast-1"
"""The embedded configurations' region (config/*.yaml)."""

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing"}
"""moto's documented dummy credentials, also for the environment of a child process."""


def fake_credentials(monkeypatch: pytest.MonkeyPatch, region: str = REGION,
                     **extra: str) -> None:
    """Set the fake credentials, the default region and any ``extra`` variables for one test;
    forget AWS_PROFILE so a developer's profile is never read."""
    for name, value in {**FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": region, **extra}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@dataclass(frozen=True)
class AwsEnvironment:
    """What :func:`aws_environment` yields: a boto3 session on moto, the bucket and key."""

    session: Any
    bucket: str
    key_arn: str


@contextmanager
def aws_environment(settings: EnvironmentSettings, *, foundation: bool = True,
                    bucket: bool = True) -> Iterator[AwsEnvironment]:
    """moto's account (123456789012, the embedded configs' placeholder) with the Foundation
    stack's bucket, key and outputs as `cdk deploy` of the Foundation stack leaves them."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        session = boto3.Session(region_name=settings.region)
        key_arn = session.client("kms").create_key(Description="project key")["KeyMetadata"][
            "Arn"]
        name = settings.artifact_bucket_name
        if bucket:
            s3 = session.client("s3")
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={
                "LocationConstraint": settings.region})
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        if foundation:
            template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                        "Outputs": {"ProjectKeyArn": {"Value": key_arn},
                                    "ModelArtifactBucketName": {"Value": name}}}
            session.client("cloudformation").create_stack(
                StackName=settings.foundation_stack_name, TemplateBody=json.dumps(template))
        yield AwsEnvironment(session=session, bucket=name, key_arn=key_arn)
