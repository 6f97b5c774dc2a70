"""Settings of the Foundation stack's pieces and of the models' network: who hears the alarms, the
artifact bucket, the private VPC."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from stacks.settings.aws import LogRetentionDays
from stacks.settings.base import Email, S3Prefix, StrictModel


class AlertSettings(StrictModel):
    """Who hears the alarms: the encrypted SNS topic's subscribers."""

    email_subscribers: list[Email] = Field(
        default_factory=list,
        description="Addresses subscribed to the alarm topic (each must confirm by email).",
    )


class ArtifactBucketSettings(StrictModel):
    """The model-artifact bucket (AWQ weights, LoRA adapters, compiled Neuron models)."""

    removal_policy: Literal["retain", "destroy"] = Field(
        "retain",
        description="What CloudFormation does with the bucket when the stack is deleted. "
        "'destroy' only works on an empty bucket.",
    )
    noncurrent_version_expiration_days: int = Field(
        90, ge=1, le=3650, description="Days a replaced object version is kept."
    )
    access_log_retention_days: int = Field(
        365, ge=1, le=3650, description="Days server access logs are kept."
    )
    models_prefix: S3Prefix = Field(
        "models",
        description="Prefix under which every served model lives: llm.model.artifact_prefix and "
        "intent.artifact_key must be inside it, quantization's base models, candidates and "
        "reports outside. The deploy role reads and publishes under it only, so a promotion to a "
        "new llm.model.artifact_prefix needs no new role policy (tools/deploy_role.py).",
    )


class NetworkSettings(StrictModel):
    """The models' private VPC."""

    cidr: Annotated[str, StringConstraints(pattern=r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$")] = (
        "10.40.0.0/20"
    )
    availability_zone_count: int = Field(
        2, ge=2, le=3,
        description="AZs of the isolated subnets, chosen by CloudFormation (Fn::GetAZs) in the "
        "stack's region, so synth never looks them up.",
    )
    flow_log_retention_days: LogRetentionDays = Field(
        365, description="VPC flow logs. At least a year (AWS Control Tower CT.CLOUDWATCH.PR.2).")

