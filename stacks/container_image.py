"""Container images and Lambda code built from this repository, with the repo root as the source.

An image may copy shared pure modules (``gpu_budget``, ``metrics_contract``, ``intents``) next to
its own folder, and a Lambda function imports them too, so both take the repository root and
keep only the folders they name. Only those are staged into the cloud assembly; an asset's hash
therefore changes only when they do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.nag import acknowledge_guard
from stacks.settings import REPO_ROOT

VPC_GUIDANCE = (
    " Lambda attaches a function to a VPC only to reach resources in it ('Giving Lambda functions "
    "access to resources in an Amazon VPC', https://docs.aws.amazon.com/lambda/latest/dg/"
    "configuration-vpc.html); this one calls public AWS APIs only.")
"""Appended to each function's CT.LAMBDA.PR.3 acknowledgement."""

ALWAYS_EXCLUDED: tuple[str, ...] = ("**/__pycache__", "**/*.pyc", "**/.pytest_cache", "**/tests")


def repo_asset_excludes(sources: Sequence[str]) -> list[str]:
    """Docker-ignore patterns that keep exactly ``sources`` (repo-relative folders or files)
    of the repository root: for image build contexts and Lambda code assets alike."""
    for source in sources:
        if not (REPO_ROOT / source).exists():
            raise ValueError(f"asset source {source!r} does not exist under {REPO_ROOT}")
    return ["*", *(f"!{source}" for source in sources), *ALWAYS_EXCLUDED]


PYTHON_RUNTIME = lambda_.Runtime.PYTHON_3_14
"""The platform's Lambda functions: plain boto3 and the repository's pure packages."""


def repo_python_function(scope: Construct, id_: str, *, handler: str, sources: Sequence[str],
                         **props: Any) -> lambda_.Function:
    """A Python Lambda function (arm64) whose code is the repository root with only ``sources``
    in it — the handler's folder and the pure packages it imports; no bundling step. ``props``
    are the function's own (role, log group, timeout, environment, failure handling)."""
    return lambda_.Function(
        scope,
        id_,
        runtime=PYTHON_RUNTIME,
        architecture=lambda_.Architecture.ARM_64,
        handler=handler,
        code=lambda_.Code.from_asset(
            str(REPO_ROOT),
            exclude=repo_asset_excludes(sources),
            ignore_mode=cdk.IgnoreMode.DOCKER,
        ),
        **props,
    )


def lambda_logs_and_role(scope: Construct, *, encryption_key: kms.IKey,
                         retention: logs.RetentionDays,
                         description: str) -> tuple[logs.LogGroup, iam.Role]:
    """A Lambda function's own log group (``Logs``, encrypted with the project key, removed with
    the stack) and execution role (``Role``) that may write to it and to nothing else yet: the
    caller adds exactly what its function calls."""
    log_group = logs.LogGroup(
        scope,
        "Logs",
        encryption_key=encryption_key,
        retention=retention,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    role = iam.Role(
        scope,
        "Role",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=description,
    )
    log_group.grant_write(role)
    acknowledge_project_key_log_group(log_group)
    return log_group, role


def acknowledge_project_key_log_group(log_group: logs.LogGroup) -> None:
    """CT.CLOUDWATCH.PR.3 on a log group encrypted with the Foundation stack's project key:
    its ``KmsKeyId`` is that key's ARN, which the Serving stack reads with ``Fn::GetStackOutput``
    (CDK's cross-stack reference), a value the rule does not resolve."""
    acknowledge_guard(
        log_group, "CT.CLOUDWATCH.PR.3",
        "KmsKeyId is the project key (customer managed, rotated; its key policy lets CloudWatch "
        "Logs in this account use it), read from the Foundation stack's output.",
        unreadable_value="KmsKeyId: Fn::GetStackOutput")


IMAGE_OUTPUTS: tuple[str, ...] = ("type=docker",)
"""``docker build --output`` of every image asset (see :func:`repo_image_asset`)."""


def repo_image_asset(
    scope: Construct,
    id_: str,
    *,
    dockerfile: str,
    sources: Sequence[str],
    build_args: dict[str, str] | None = None,
) -> ecr_assets.DockerImageAsset:
    """A linux/amd64 image built from ``dockerfile`` with only ``sources`` in its context.

    Built with ``--output type=docker``: Docker's exporter writes Docker media types
    (``oci-mediatypes`` is false for it), so the pushed manifest is a Docker image manifest v2,
    schema 2 — the only kind SageMaker CreateModel takes (tools/image_check.py, which checks it
    after ``cdk publish-assets``). ``make deploy`` also sets ``BUILDX_NO_DEFAULT_ATTESTATIONS=1``
    (Docker's "Build variables": "Turn off default provenance attestations"), without which
    buildx pushes an OCI index carrying a provenance attestation.
    """
    if not any(dockerfile.startswith(f"{source}/") for source in sources):
        raise ValueError(f"{dockerfile} must lie inside one of the image sources {list(sources)}")
    return ecr_assets.DockerImageAsset(
        scope,
        id_,
        directory=str(REPO_ROOT),
        file=dockerfile,
        platform=ecr_assets.Platform.LINUX_AMD64,
        exclude=repo_asset_excludes(sources),
        ignore_mode=cdk.IgnoreMode.DOCKER,
        build_args=build_args,
        outputs=list(IMAGE_OUTPUTS),
    )
