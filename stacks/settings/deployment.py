"""Blue/green updates of an endpoint: how traffic moves to the new fleet and how long alarms watch
it (what SageMaker accepts on a variant: :func:`stacks.settings.aws.deployment_problem`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stacks.settings.base import StrictModel

TrafficShift = Literal["all_at_once", "canary", "linear"]

DEFAULT_STEP_PERCENT = 10


class DeploymentSettings(StrictModel):
    """Blue/green updates: how traffic moves to the new fleet, how long alarms watch it.

    ``all_at_once`` shifts everything at once and bakes ``bake_s``; ``canary`` shifts
    ``canary_percent`` of the capacity first and bakes; ``linear`` shifts ``linear_step_percent``
    per step, baking after each. Auto-rollback on the endpoint's rollback alarms applies to all
    three. What SageMaker accepts also depends on the instance type and count, so the endpoint
    settings check it (:func:`deployment_problem`).
    """

    traffic_shift: TrafficShift = Field(
        "canary", description="all_at_once, canary or linear (TrafficRoutingConfig Type)."
    )
    canary_percent: int | None = Field(
        None, ge=1, le=50, description=f"canary only: capacity share of the canary "
        f"(default {DEFAULT_STEP_PERCENT})."
    )
    linear_step_percent: int | None = Field(
        None, ge=10, le=50, description=f"linear only: capacity share per step "
        f"(default {DEFAULT_STEP_PERCENT})."
    )
    bake_s: int = Field(
        600, ge=0, le=3600,
        description="Alarms watch the new fleet this long after each traffic step before the "
        "next one, or before the old fleet goes (WaitIntervalInSeconds).",
    )
    termination_wait_s: int = Field(
        300, ge=0, le=3600, description="Keep the old fleet this long after the full shift."
    )
    maximum_execution_timeout_s: int = Field(3600, ge=600, le=14400)

    @model_validator(mode="after")
    def _sizes_belong_to_their_shift(self) -> DeploymentSettings:
        for field, shift in (("canary_percent", "canary"), ("linear_step_percent", "linear")):
            if getattr(self, field) is not None and self.traffic_shift != shift:
                raise ValueError(
                    f"{field} applies to traffic_shift {shift}, not {self.traffic_shift}"
                )
        return self

    @property
    def step_percent(self) -> int | None:
        """Capacity share of the first (canary) or every (linear) step; None for all-at-once."""
        if self.traffic_shift == "canary":
            return self.canary_percent or DEFAULT_STEP_PERCENT
        if self.traffic_shift == "linear":
            return self.linear_step_percent or DEFAULT_STEP_PERCENT
        return None

