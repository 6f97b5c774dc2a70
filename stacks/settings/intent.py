"""Settings of the intent classifier's endpoint (DistilBERT on Inferentia)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from capacity_model import FleetPlan, InstanceLoad, fleet_plan
from gpu_budget import instance_type
from stacks.settings.aws import deployment_problem
from stacks.settings.base import ArchiveKey, StrictModel
from stacks.settings.deployment import DeploymentSettings
from stacks.settings.endpoint import EndpointAlarmSettings, HealthCheckSettings
from stacks.settings.scaling import ScalingSettings


class DeclaredCapacitySettings(StrictModel):
    """What one instance of an endpoint the GPU budget does not size (the classifier) serves."""

    per_instance_invocations_per_min: float = Field(gt=0)
    source: str = Field(min_length=1, description="Where the figure comes from.")


class IntentEndpointSettings(StrictModel):
    """The DistilBERT intent classifier on Inferentia (inf1 by default, inf2 supported)."""

    target: Literal["inf1", "inf2"] = Field(
        "inf1", description="Neuron target the model was compiled for; picks the image's base."
    )
    instance_type: str = Field(
        "ml.inf1.xlarge", description="An Inferentia instance of that target."
    )
    artifact_key: ArchiveKey = Field(
        description="Key of the compiled model.tar.gz (neuron/compile.py) in the artifact bucket."
    )
    model_copies: int | None = Field(
        None, ge=1, le=64, description="Model copies over the NeuronCores (default: one per core)."
    )
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    capacity: DeclaredCapacitySettings
    deployment: DeploymentSettings = Field(
        # inf1, the default target, is excluded from deployment guardrails: all at once, no bake.
        default_factory=lambda: DeploymentSettings(traffic_shift="all_at_once", bake_s=0)
    )
    scaling: ScalingSettings
    alarms: EndpointAlarmSettings = Field(
        default_factory=lambda: EndpointAlarmSettings(latency_p99_sla_ms=100)
    )

    @field_validator("artifact_key")
    @classmethod
    def _in_a_folder(cls, value: str) -> str:
        if "/" not in value:
            raise ValueError(
                "must lie in a folder (e.g. models/intent/<name>/model.tar.gz): the endpoint's "
                "role may read that folder only"
            )
        return value

    @property
    def artifact_folder(self) -> str:
        """The folder of the archive: what the execution role reads, where its manifest goes."""
        return self.artifact_key.rsplit("/", 1)[0]

    def fleet_plan(self) -> FleetPlan:
        """The classifier's fleet numbers from its declared per-instance rate (the stacks get
        them computed once when the settings load: :mod:`stacks.settings.plans`)."""
        load = InstanceLoad(
            sustainable_invocations_per_min=self.capacity.per_instance_invocations_per_min,
            concurrency=None, source=self.capacity.source)
        return fleet_plan(load, self.scaling.fleet_policy(), self.scaling.traffic.profile())

    @model_validator(mode="after")
    def _instance_matches_target(self) -> IntentEndpointSettings:
        entry = instance_type(self.instance_type)
        if entry.family != f"ml.{self.target}":
            raise ValueError(
                f"instance_type {self.instance_type!r} does not run {self.target} models; "
                f"accepted: ml.{self.target}.* instances"
            )
        if self.model_copies is not None and entry.neuron_cores is not None and (
            self.model_copies > entry.neuron_cores
        ):
            raise ValueError(
                f"model_copies {self.model_copies} exceeds the {entry.neuron_cores} NeuronCores "
                f"of {self.instance_type}"
            )
        return self

    @model_validator(mode="after")
    def _tracks_invocations_only(self) -> IntentEndpointSettings:
        # The fleet plan itself is made once the settings have loaded (stacks.settings.plans).
        if self.scaling.tracks_concurrency:
            raise ValueError(
                f"scaling.target_metric: {self.scaling.target_metric!r} needs a concurrency per "
                "instance, which only the LLM's capacity model derives; accepted: "
                "invocations_per_instance")
        return self

    def deployment_problem(self) -> str | None:
        """What SageMaker would not honour in :attr:`deployment` on this instance type and
        count, or None.

        Not a validator: the section's rules ran in the order fleet plan, then deployment, so a
        section failing both reports the fleet's refusal. The fleet plan is made once the
        settings have loaded, so :func:`stacks.settings.plans.plan_intent` checks this right
        after it."""
        return deployment_problem(self.deployment, instance_type=self.instance_type,
                                  min_capacity=self.scaling.min_capacity)
