"""From one instance to the fleet: headroom, scaling targets, step thresholds, daily limits.

Everything Application Auto Scaling is given for an endpoint follows from three things: what one
instance sustains (:class:`InstanceLoad` — for the LLM the capacity model's rate at the latency
SLOs, for the classifier its declared rate), the traffic expected over a day
(:class:`DailyProfile`), and the scaling policy's shape (:class:`FleetPolicy`: limits, cooldown-free
reaction times, the surge the fleet must absorb on its own).

* **Headroom.** A surge nobody scheduled (a spike the calendar did not know,
  docs/design-decisions.md#unpredicted-spike) grows while the fleet reacts: an alarm has to
  see it (the fastest policy's evaluation time) and new instances need ``provisioning_s`` to
  serve (5-8 minutes for a g5 loading a 16 GB model, docs/design-decisions.md#provisioning-delay).
  If load can rise by ``multiplier`` over ``rise_min`` minutes, by the time new capacity arrives
  it has risen by ``(multiplier − 1) × reaction / rise``; that share, kept free, is the headroom.
* **Targets.** Target tracking holds each instance at ``sustainable / (1 + headroom)``
  invocations per minute, rounded down to a whole one (and, for the high-resolution policy, at
  the matching concurrency);
  step scaling's alarm threshold is the same target, its bands multiples of it.
* **Daily limits.** For each daily window (off-peak, business hours) the floor is what the
  window's quietest hour needs at the target (never below ``min_capacity``, the warm
  instances), the ceiling what its busiest hour needs with a surge allowance (absent: the
  variant's ``max_capacity``).
* **Release calendar.** Events multiply the day's busiest hour (a conservative base: releases
  land in the evening, near the peak); instances = load × multiplier ÷ sustainable × (1 +
  headroom), which is the calendar's own formula fed with these numbers.

Pure module (standard library, :mod:`release_calendar`).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from release_calendar import CapacityModel, DailyFloor

HOURS_PER_DAY = 24
_ROUNDING_SLACK = 1e-9


class FleetError(ValueError):
    """Inputs the fleet plan cannot use; the message names the field and the value."""


@dataclass(frozen=True)
class InstanceLoad:
    """What one instance sustains, and where that figure comes from."""

    sustainable_invocations_per_min: float
    concurrency: float | None
    """Requests in flight per instance at that rate (None when unknown: no concurrency target)."""
    source: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sustainable_invocations_per_min)
                and self.sustainable_invocations_per_min > 0):
            raise FleetError(f"sustainable_invocations_per_min "
                             f"{self.sustainable_invocations_per_min!r}; accepted: > 0")


@dataclass(frozen=True)
class Surge:
    """An unplanned rise the fleet must absorb before new capacity arrives."""

    multiplier: float
    rise_min: float

    def __post_init__(self) -> None:
        if not self.multiplier >= 1:
            raise FleetError(f"surge multiplier {self.multiplier!r}; accepted: >= 1")
        if not self.rise_min > 0:
            raise FleetError(f"surge rise_min {self.rise_min!r}; accepted: > 0 minutes")

    def growth_within(self, seconds: float) -> float:
        """How much the load has grown, as a share of where it started, ``seconds`` in."""
        return (self.multiplier - 1) * min(1.0, seconds / 60 / self.rise_min)


@dataclass(frozen=True)
class DailyProfile:
    """Expected invocations per minute for each local hour of a typical day (0-23)."""

    hourly_invocations_per_min: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        values = self.hourly_invocations_per_min
        if len(values) != HOURS_PER_DAY:
            raise FleetError(f"daily profile: {len(values)} hourly values; accepted: "
                             f"{HOURS_PER_DAY}, one per local hour from 00:00")
        bad = [hour for hour, value in enumerate(values)
               if not (math.isfinite(value) and value >= 0)]
        if bad:
            raise FleetError(f"daily profile: hour {bad[0]:02d}:00 has {values[bad[0]]!r}; "
                             "accepted: a number >= 0")
        if max(values) <= 0:
            raise FleetError("daily profile: every hour is 0; accepted: some traffic")

    @property
    def peak(self) -> float:
        """The busiest hour's load."""
        return max(self.hourly_invocations_per_min)

    def at(self, moment: dt.time | float) -> float:
        """Load at a local time of day, linear between the hours (the hour's value at :00)."""
        hour = (moment.hour + moment.minute / 60 if isinstance(moment, dt.time)
                else float(moment)) % HOURS_PER_DAY
        low = math.floor(hour)
        share = hour - low
        values = self.hourly_invocations_per_min
        return values[low] + (values[(low + 1) % HOURS_PER_DAY] - values[low]) * share

    def window(self, start: dt.time, end: dt.time) -> list[float]:
        """The hourly values of every hour that overlaps ``[start, end)`` (wrapping midnight)."""
        first = start.hour
        last = end.hour if end.minute == 0 else end.hour + 1
        hours = (list(range(first, last)) if first < last
                 else [*range(first, HOURS_PER_DAY), *range(last)])
        return [self.hourly_invocations_per_min[h % HOURS_PER_DAY] for h in hours]


@dataclass(frozen=True)
class StepBand:
    """Add ``add_instances`` while the metric is between threshold × (1 + lower) and threshold
    × (1 + upper): bounds are multiples of the threshold above it."""

    lower: float
    upper: float | None
    add_instances: int


@dataclass(frozen=True)
class FleetPolicy:
    """How the variant may scale; nothing here is a capacity figure."""

    min_capacity: int
    max_capacity: int
    time_zone: str
    off_peak_start: dt.time
    business_hours_start: dt.time
    off_peak_surge_allowance: float | None
    business_hours_surge_allowance: float | None
    step_bands: tuple[StepBand, ...]
    step_evaluation_s: int
    tracking_evaluation_s: int
    provisioning_s: int
    unplanned_surge: Surge

    def __post_init__(self) -> None:
        if not 1 <= self.min_capacity <= self.max_capacity:
            raise FleetError(f"min_capacity {self.min_capacity} / max_capacity "
                             f"{self.max_capacity}; accepted: 1 <= min <= max")
        if self.off_peak_start == self.business_hours_start:
            raise FleetError("off_peak and business_hours start at the same time")
        for name in ("off_peak_surge_allowance", "business_hours_surge_allowance"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise FleetError(f"{name} {value!r}; accepted: >= 0 or absent")
        for name in ("step_evaluation_s", "tracking_evaluation_s", "provisioning_s"):
            if getattr(self, name) < 0:
                raise FleetError(f"{name} {getattr(self, name)}; accepted: >= 0 seconds")

    @property
    def detection_s(self) -> int:
        """How long the fastest scale-out policy needs to see a rise."""
        options = [self.tracking_evaluation_s]
        if self.step_bands:
            options.append(self.step_evaluation_s)
        return min(options)


@dataclass(frozen=True)
class FloorPlan:
    """One daily window's scheduled range and the loads it was derived from."""

    name: str
    start: dt.time
    min_capacity: int
    max_capacity: int
    quietest_invocations_per_min: float
    busiest_invocations_per_min: float

    def daily_floor(self) -> DailyFloor:
        """The release calendar's view of it."""
        return DailyFloor(self.name, self.start, self.min_capacity, self.max_capacity)


@dataclass(frozen=True)
class FleetPlan:
    """Every number Application Auto Scaling gets for one variant, derived, with its inputs."""

    per_instance_invocations_per_min: float
    headroom: float
    reaction_s: int
    target_invocations_per_instance_per_min: float
    target_concurrent_requests_per_model: float | None
    step_threshold_invocations_per_instance_per_min: float | None
    step_intervals: tuple[tuple[float, float | None, int], ...]
    """(lower, upper, add) in invocations/min/instance *above* the threshold."""
    off_peak: FloorPlan
    business_hours: FloorPlan
    release_base_invocations_per_min: float
    min_capacity: int
    max_capacity: int
    time_zone: str
    source: str

    @property
    def floors(self) -> tuple[FloorPlan, FloorPlan]:
        """Both daily windows, off-peak first."""
        return (self.off_peak, self.business_hours)

    def instances_for(self, invocations_per_min: float) -> int:
        """Instances that carry ``invocations_per_min`` at the target (unclamped, at least 1)."""
        exact = invocations_per_min / self.target_invocations_per_instance_per_min
        return max(1, math.ceil(exact - _ROUNDING_SLACK))

    def calendar_model(self) -> CapacityModel:
        """The release calendar's capacity model for this variant."""
        return CapacityModel(
            base_invocations_per_min=self.release_base_invocations_per_min,
            per_instance_invocations_per_min=self.per_instance_invocations_per_min,
            headroom=self.headroom,
            min_capacity=self.min_capacity,
            max_capacity=self.max_capacity,
            timezone=self.time_zone,
            off_peak=self.off_peak.daily_floor(),
            business_hours=self.business_hours.daily_floor(),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (times as HH:MM)."""
        data = asdict(self)
        for name in ("off_peak", "business_hours"):
            data[name]["start"] = getattr(self, name).start.strftime("%H:%M")
        data["step_intervals"] = [list(i) for i in self.step_intervals]
        return data


def _clamp(value: int, low: int, high: int) -> int:
    return min(max(value, low), high)


def fleet_plan(load: InstanceLoad, policy: FleetPolicy, profile: DailyProfile) -> FleetPlan:
    """Derive the variant's targets, step thresholds, daily ranges and calendar inputs."""
    reaction_s = policy.detection_s + policy.provisioning_s
    headroom = round(policy.unplanned_surge.growth_within(reaction_s), 4)
    sustainable = load.sustainable_invocations_per_min
    # Whole invocations per minute, rounded down: the step bands' bounds are differences of
    # these, and CloudFormation should read 300, not 300.80000000000001.
    target = float(max(1, math.floor(sustainable / (1 + headroom))))
    concurrency_target = (None if load.concurrency is None
                          else round(load.concurrency / (1 + headroom), 1))

    def needed(invocations_per_min: float) -> int:
        return max(1, math.ceil(invocations_per_min / target - _ROUNDING_SLACK))

    floors = []
    windows = (("off-peak", policy.off_peak_start, policy.business_hours_start,
                policy.off_peak_surge_allowance),
               ("business-hours", policy.business_hours_start, policy.off_peak_start,
                policy.business_hours_surge_allowance))
    for name, start, end, allowance in windows:
        loads = profile.window(start, end)
        low = _clamp(needed(min(loads)), policy.min_capacity, policy.max_capacity)
        high = (policy.max_capacity if allowance is None
                else _clamp(needed(max(loads) * (1 + allowance)), low, policy.max_capacity))
        floors.append(FloorPlan(name=name, start=start, min_capacity=low, max_capacity=high,
                                quietest_invocations_per_min=min(loads),
                                busiest_invocations_per_min=max(loads)))
    threshold = target if policy.step_bands else None
    intervals = tuple(
        (float(round(target * band.lower)),
         None if band.upper is None else float(round(target * band.upper)), band.add_instances)
        for band in policy.step_bands)
    return FleetPlan(
        per_instance_invocations_per_min=sustainable,
        headroom=headroom,
        reaction_s=reaction_s,
        target_invocations_per_instance_per_min=target,
        target_concurrent_requests_per_model=concurrency_target,
        step_threshold_invocations_per_instance_per_min=threshold,
        step_intervals=intervals,
        off_peak=floors[0],
        business_hours=floors[1],
        release_base_invocations_per_min=profile.peak,
        min_capacity=policy.min_capacity,
        max_capacity=policy.max_capacity,
        time_zone=policy.time_zone,
        source=load.source,
    )


def check_bands(bands: Sequence[StepBand]) -> None:
    """Bands must start at the threshold (lower 0), touch each other and end open."""
    if not bands:
        return
    if bands[0].lower != 0:
        raise FleetError("step bands: the first band's lower must be 0 (it starts at the "
                         "threshold)")
    for index, (band, following) in enumerate(itertools.pairwise(bands)):
        if band.upper is None or band.upper != following.lower:
            raise FleetError(f"step bands[{index}].upper ({band.upper}) must equal bands"
                             f"[{index + 1}].lower ({following.lower}): bands must be contiguous")
    if bands[-1].upper is not None:
        raise FleetError("step bands: the last band's upper must be absent (open-ended)")
