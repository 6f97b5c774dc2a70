"""Application Auto Scaling of one endpoint variant: limits, the policies' shape, the daily windows
and the traffic the capacity model sizes from."""

from __future__ import annotations

import datetime as dt
import math
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from capacity_model import (
    DailyProfile,
    FleetError,
    FleetPolicy,
    StepBand,
    Surge,
    check_bands,
)
from stacks.settings.aws import HIGH_RESOLUTION_PERIOD_S, TRACKING_DATAPOINTS
from stacks.settings.base import LocalTime, StrictModel


class DailyWindowSettings(StrictModel):
    """A daily scheduled action: from ``start`` (local time) until the other window starts.

    Its minimum and maximum are not typed here: the capacity model derives them from the traffic
    the window expects (:mod:`capacity_model.fleet`). ``surge_allowance`` is how far above the
    window's busiest expected hour the fleet may grow before ``capacity-pinned-at-max`` pages
    (1.0 = twice the expected load); absent, the window's maximum is ``max_capacity``.
    """

    start: LocalTime = Field(description="Local time, HH:MM, in scaling.time_zone.")
    surge_allowance: float | None = Field(
        None, ge=0, le=20,
        description="Share above the busiest expected hour the maximum allows (absent: "
        "max_capacity).",
    )


class StepBandSettings(StrictModel):
    """Add ``add_instances`` while the metric is between threshold × (1 + lower) and threshold ×
    (1 + upper): bounds are multiples of the threshold (the capacity model's target) above it."""

    lower: float = Field(ge=0, description="Multiple of the threshold above it (0 = at it).")
    upper: float | None = Field(None, gt=0, description="Open-ended when absent.")
    add_instances: int = Field(ge=1, le=50)


class StepScalingSettings(StrictModel):
    """Step scaling from a 1-minute InvocationsPerInstance alarm
    (docs/design-decisions.md#step-scaling).

    The alarm's threshold is the target-tracking target the capacity model derives; the bands
    are multiples of it (+2 above the threshold, +4 from 2×, +8 from 4×).
    """

    bands: list[StepBandSettings] = Field(
        default_factory=lambda: [
            StepBandSettings(lower=0, upper=1, add_instances=2),
            StepBandSettings(lower=1, upper=3, add_instances=4),
            StepBandSettings(lower=3, upper=None, add_instances=8),
        ]
    )
    cooldown_s: int = Field(60, ge=0, le=3600)

    @model_validator(mode="after")
    def _contiguous(self) -> StepScalingSettings:
        if not self.bands:
            raise ValueError("bands: at least one band is required")
        try:
            check_bands(self.step_bands())
        except FleetError as error:
            raise ValueError(str(error)) from None
        return self

    def step_bands(self) -> tuple[StepBand, ...]:
        """The bands as the capacity model reads them."""
        return tuple(StepBand(b.lower, b.upper, b.add_instances) for b in self.bands)


class ReleaseCalendarCapacitySettings(StrictModel):
    """Whether this endpoint follows the release calendar.

    The calendar's capacity formula is fed by the capacity model: the load is the traffic
    profile's busiest hour, the per-instance figure what one instance sustains, the headroom
    the one the fleet keeps (:meth:`capacity_model.FleetPlan.calendar_model`).
    """

    enabled: bool = True


class TrafficProfileSettings(StrictModel):
    """The traffic an endpoint expects over a typical day, by local hour (scaling.time_zone)."""

    hourly_invocations_per_min: list[float] = Field(
        min_length=24, max_length=24,
        description="Invocations per minute expected at each local hour, 00:00 first.",
    )
    source: str = Field(min_length=1, description="Where the figures come from.")

    @field_validator("hourly_invocations_per_min")
    @classmethod
    def _non_negative(cls, value: list[float]) -> list[float]:
        bad = [hour for hour, load in enumerate(value) if not (math.isfinite(load) and load >= 0)]
        if bad:
            raise ValueError(f"hour {bad[0]:02d}:00 is {value[bad[0]]!r}; accepted: a number "
                             ">= 0")
        if max(value) <= 0:
            raise ValueError("every hour is 0; accepted: the traffic the endpoint expects")
        return value

    def profile(self) -> DailyProfile:
        """The capacity model's view."""
        return DailyProfile(tuple(self.hourly_invocations_per_min), self.source)


class SurgeSettings(StrictModel):
    """An unplanned rise: ``multiplier`` times the load within ``rise_min`` minutes."""

    multiplier: float = Field(ge=1, le=20)
    rise_min: float = Field(gt=0, le=1440)


class ScalingSettings(StrictModel):
    """Application Auto Scaling of one endpoint variant: limits, the policies' shape, the traffic.

    No capacity figure is typed here: targets, step thresholds, the daily windows' minima and
    maxima and the release calendar's inputs come from the capacity model
    (:meth:`fleet_policy` + the endpoint's instance capacity → :func:`capacity_model.fleet_plan`).
    """

    min_capacity: int = Field(ge=1, le=100, description="Also the initial instance count.")
    max_capacity: int = Field(ge=1, le=100)
    target_metric: Literal["invocations_per_instance", "concurrent_requests_per_model", "both"] = (
        Field("invocations_per_instance",
              description="Target tracking on InvocationsPerInstance, on the high-resolution "
              "ConcurrentRequestsPerModel, or a policy on each (the largest wins).")
    )
    scale_out_cooldown_s: int = Field(60, ge=0, le=3600)
    scale_in_cooldown_s: int = Field(600, ge=0, le=86400)
    step_scaling: StepScalingSettings | None = Field(default_factory=StepScalingSettings)
    time_zone: str = Field("Asia/Tokyo", description="IANA zone of every schedule.")
    off_peak: DailyWindowSettings
    business_hours: DailyWindowSettings
    traffic: TrafficProfileSettings
    unplanned_surge: SurgeSettings = Field(
        default_factory=lambda: SurgeSettings(multiplier=1.5, rise_min=15),
        description="The rise the fleet absorbs unaided while new instances start: it sets "
        "the headroom.",
    )
    provisioning_delay_s: int = Field(
        360, ge=0, le=3600,
        description="From a scale-out decision to a new instance serving (5-8 min, "
        "docs/design-decisions.md#provisioning-delay).",
    )
    release_calendar: ReleaseCalendarCapacitySettings | None = None

    @field_validator("time_zone")
    @classmethod
    def _iana_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("is not an IANA time zone (e.g. Asia/Tokyo)") from None
        return value

    @model_validator(mode="after")
    def _limits(self) -> ScalingSettings:
        if self.min_capacity > self.max_capacity:
            raise ValueError(
                f"min_capacity {self.min_capacity} is above max_capacity {self.max_capacity}"
            )
        if self.off_peak.start == self.business_hours.start:
            raise ValueError("off_peak.start and business_hours.start must differ")
        return self

    @property
    def tracks_invocations(self) -> bool:
        """Whether a target-tracking policy follows InvocationsPerInstance."""
        return self.target_metric in ("invocations_per_instance", "both")

    @property
    def tracks_concurrency(self) -> bool:
        """Whether a target-tracking policy follows the high-resolution concurrency metric."""
        return self.target_metric in ("concurrent_requests_per_model", "both")

    def fleet_policy(self) -> FleetPolicy:
        """The capacity model's view of the policy (no capacity figures in it)."""

        tracking_period_s = HIGH_RESOLUTION_PERIOD_S if self.tracks_concurrency else 60
        return FleetPolicy(
            min_capacity=self.min_capacity,
            max_capacity=self.max_capacity,
            time_zone=self.time_zone,
            off_peak_start=dt.time.fromisoformat(self.off_peak.start),
            business_hours_start=dt.time.fromisoformat(self.business_hours.start),
            off_peak_surge_allowance=self.off_peak.surge_allowance,
            business_hours_surge_allowance=self.business_hours.surge_allowance,
            step_bands=self.step_scaling.step_bands() if self.step_scaling else (),
            step_evaluation_s=60,
            tracking_evaluation_s=TRACKING_DATAPOINTS * tracking_period_s,
            provisioning_s=self.provisioning_delay_s,
            unplanned_surge=Surge(self.unplanned_surge.multiplier, self.unplanned_surge.rise_min),
        )
