"""The root of one environment's settings: ``config/<env>.yaml`` as one validated object."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator, model_validator

from stacks.settings import naming
from stacks.settings.aws import KNOWN_REGIONS
from stacks.settings.base import AccountId, EnvironmentName, StrictModel, TagValue
from stacks.settings.foundation import AlertSettings, ArtifactBucketSettings, NetworkSettings
from stacks.settings.intent import IntentEndpointSettings
from stacks.settings.jobs import DeliverySettings, QuantizationJobSettings, SmokeSettings
from stacks.settings.llm import LlmEndpointSettings
from stacks.settings.release_calendar import ReleaseCalendarSettings


class EnvironmentSettings(StrictModel):
    """Everything that differs between environments. Read by every stack, validated once."""

    name: EnvironmentName = Field(description="Short environment name: dev, prod, ...")
    stage_name: Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Za-z0-9]{1,15}$")] = Field(
        description="CDK Stage id, e.g. Dev or Prod; `cdk deploy \"Prod/*\"` selects it."
    )
    account: AccountId = Field(description="12-digit AWS account id.")
    region: str = Field(description="AWS region, e.g. ap-northeast-1.")
    tags: dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 _.:/=+\-@]{1,128}$")], TagValue
    ] = Field(default_factory=dict, description="Tags applied to every resource.")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    artifacts: ArtifactBucketSettings = Field(default_factory=ArtifactBucketSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    release_calendar: ReleaseCalendarSettings = Field(default_factory=ReleaseCalendarSettings)
    llm: LlmEndpointSettings
    intent: IntentEndpointSettings
    delivery: DeliverySettings | None = Field(
        None, description="The delivery pipeline's access (absent: deploy from a laptop only)."
    )
    smoke: SmokeSettings = Field(default_factory=SmokeSettings)
    quantization: QuantizationJobSettings = Field(default_factory=QuantizationJobSettings)

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", value):
            raise ValueError("must look like ap-northeast-1")
        if value not in KNOWN_REGIONS:
            raise ValueError(f"must be one of {', '.join(sorted(KNOWN_REGIONS))}")
        return value

    @model_validator(mode="after")
    def _artifacts_apart(self) -> EnvironmentSettings:
        llm, intent = self.llm.model.artifact_prefix, self.intent.artifact_folder
        if f"{intent}/".startswith(f"{llm}/") or f"{llm}/".startswith(f"{intent}/"):
            raise ValueError(
                f"intent.artifact_key {self.intent.artifact_key!r} and "
                f"llm.model.artifact_prefix {llm!r} overlap: SageMaker copies the LLM's whole "
                "prefix into its model directory, so each endpoint needs its own folder"
            )
        return self

    @model_validator(mode="after")
    def _consistent_prefixes_and_accounts(self) -> EnvironmentSettings:
        if self.delivery is not None:
            role_account = self.delivery.deploy_role_arn.split(":")[4]
            if role_account != self.account:
                raise ValueError(
                    f"delivery.deploy_role_arn: {self.delivery.deploy_role_arn!r} is in account "
                    f"{role_account}; accepted: a role in this environment's account "
                    f"{self.account}"
                )
        return self._quantization_prefixes_apart()

    def _quantization_prefixes_apart(self) -> EnvironmentSettings:
        quant = self.quantization
        served = self.llm.model.artifact_prefix
        intent = self.intent.artifact_key.rsplit("/", 1)[0]
        prefixes = {"quantization.base_model_root": quant.base_model_root,
                    "quantization.candidates_prefix": quant.candidates_prefix,
                    "quantization.reports_prefix": quant.reports_prefix}
        for label, prefix in prefixes.items():
            if _overlaps(prefix, served):
                raise ValueError(
                    f"{label}: {prefix!r} overlaps the model prefix {served!r}; accepted: a "
                    "prefix outside the served model's")
            if _overlaps(prefix, intent):
                raise ValueError(f"{label}: {prefix!r} overlaps the intent model "
                                 f"{self.intent.artifact_key!r}; accepted: a prefix of its own")
        labels = list(prefixes)
        for index, first in enumerate(labels):
            for second in labels[index + 1:]:
                if _overlaps(prefixes[first], prefixes[second]):
                    raise ValueError(f"{second}: {prefixes[second]!r} overlaps {first} "
                                     f"{prefixes[first]!r}")
        return self

    @model_validator(mode="after")
    def _served_models_under_their_prefix(self) -> EnvironmentSettings:
        root = self.artifacts.models_prefix
        served = {"llm.model.artifact_prefix": self.llm.model.artifact_prefix,
                  "intent.artifact_key": self.intent.artifact_key}
        for label, key in served.items():
            if not key.startswith(f"{root}/"):
                raise ValueError(
                    f"{label}: {key!r} is not under artifacts.models_prefix {root!r}, the only "
                    f"prefix the deploy role reads and publishes; accepted: {root}/<name>")
        quant = self.quantization
        for label, prefix in {"quantization.base_model_root": quant.base_model_root,
                              "quantization.candidates_prefix": quant.candidates_prefix,
                              "quantization.reports_prefix": quant.reports_prefix}.items():
            if _overlaps(prefix, root):
                raise ValueError(
                    f"{label}: {prefix!r} overlaps artifacts.models_prefix {root!r}, where the "
                    "deploy role reads and writes; accepted: a prefix outside it")
        return self

    @property
    def resource_prefix(self) -> str:
        """Prefix for physical names that must be stable per environment."""
        return naming.resource_prefix(self.name)

    @property
    def foundation_stack_name(self) -> str:
        """CloudFormation name of the Foundation stack (key, bucket, topic): Prod-Foundation."""
        return naming.foundation_stack_name(self.stage_name)

    @property
    def serving_stack_name(self) -> str:
        """CloudFormation name of the Serving stack, e.g. Prod-Serving."""
        return naming.serving_stack_name(self.stage_name)

    @property
    def alarm_name_prefix(self) -> str:
        """Every alarm of the environment is named with this prefix (the alarm topic's policy
        lets CloudWatch publish for exactly these alarms)."""
        return naming.alarm_name_prefix(self.name)

    @property
    def artifact_bucket_name(self) -> str:
        """The model-artifact bucket's name: fixed, so the serving stack needs no export."""
        return naming.artifact_bucket_name(self.name, account=self.account, region=self.region)


def _overlaps(first: str, second: str) -> bool:
    """Whether one S3 prefix (a folder, no trailing slash) contains the other."""
    a, b = f"{first}/", f"{second}/"
    return a.startswith(b) or b.startswith(a)


