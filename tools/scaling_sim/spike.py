"""An unpredicted spike, measured: the One Piece release replayed without the release calendar.

Seed 001 (story 7) promises that a spike nobody scheduled costs "< 1 % errors for < 90
seconds". The calendar absorbs the spikes it knows; this module asks what the reactive policies
do alone, three ways, on the same trace and provisioning delay:

* **without high-resolution tracking** — target tracking on ``InvocationsPerInstance`` (three
  1-minute datapoints) and step scaling from a 1-minute alarm, at the headroom the capacity model
  keeps for an *ordinary* unplanned surge (the policies before this comparison);
* **with high-resolution tracking** — the same plus target tracking on SageMaker's
  ``ConcurrentRequestsPerModel``, which it emits every 10 seconds, at the capacity model's
  concurrency target: it sees the spike in 30 s;
* **recommended headroom** — the capacity model's fleet plan re-derived for *this* surge (3×
  within 15 minutes) and this provisioning delay: targets, step thresholds and daily floors low
  enough that the load the spike reaches while new instances start still fits.

Whichever of them the template already is, is marked "(as synthesized)". The daily floors stay in
all three; only the actions named ``calendar-*`` are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from capacity_model import FleetPlan, Surge
from release_calendar import CALENDAR_PREFIX, FLOOR_PREFIX
from tools.scaling_sim.engine import SimulationParams, SimulationResult, simulate
from tools.scaling_sim.template import (
    CONCURRENCY_HIGH_RESOLUTION,
    INVOCATIONS_PER_INSTANCE,
    MetricAlarm,
    ScalingSetup,
    ScheduledAction,
    StepAdjustment,
    StepScalingPolicy,
    TargetTrackingPolicy,
)
from tools.scaling_sim.traces import RISE_MIN, Trace

SEED_ERROR_PERCENT = 1.0
"""Seed 001, story 7: "Error rate during unpredicted spikes: <1% for <90 seconds"."""
SEED_ERROR_SECONDS = 90

WITHOUT_CONCURRENCY = "without high-resolution tracking"
WITH_CONCURRENCY = "with high-resolution tracking"
RECOMMENDED = "recommended headroom"
AS_SYNTHESIZED = " (as synthesized)"


def one_piece_surge(multiplier: float) -> Surge:
    """The spike of the trace: ``multiplier`` within :data:`RISE_MIN` minutes."""
    return Surge(multiplier=multiplier, rise_min=RISE_MIN)


@dataclass(frozen=True)
class SpikeOutcome:
    """One scenario's result and how it compares with the seed's promise."""

    label: str
    result: SimulationResult
    target_invocations_per_instance_per_min: float | None
    headroom: float | None

    @property
    def error_seconds(self) -> int:
        """Seconds in which requests were shed."""
        return self.result.seconds_over_capacity

    @property
    def worst_minute_percent(self) -> float:
        """The error-rate peak: the largest share of one minute's requests shed."""
        return self.result.worst_minute_dropped_percent

    @property
    def meets_seed(self) -> bool:
        """Errors below 1 % in every minute, for less than 90 seconds in all."""
        return (self.worst_minute_percent < SEED_ERROR_PERCENT
                and self.error_seconds < SEED_ERROR_SECONDS)


def with_concurrency_tracking(setup: ScalingSetup, *, target: float) -> ScalingSetup:
    """``setup`` plus target tracking on the high-resolution concurrency (same cooldowns as its
    InvocationsPerInstance policy)."""
    base = next((p for p in setup.target_tracking if p.metric == INVOCATIONS_PER_INSTANCE),
                None)
    if any(p.metric == CONCURRENCY_HIGH_RESOLUTION for p in setup.target_tracking):
        return setup
    policy = TargetTrackingPolicy(
        name="ConcurrencyTracking", target_value=target,
        scale_out_cooldown_s=base.scale_out_cooldown_s if base else 60,
        scale_in_cooldown_s=base.scale_in_cooldown_s if base else 600,
        disable_scale_in=False, metric=CONCURRENCY_HIGH_RESOLUTION)
    return replace(setup, target_tracking=(*setup.target_tracking, policy))


def with_fleet(setup: ScalingSetup, fleet: FleetPlan) -> ScalingSetup:
    """``setup`` with every capacity number replaced by ``fleet``'s: target-tracking targets,
    the step alarm's threshold and bands, the daily floors' ranges."""
    tracking = tuple(
        replace(p, target_value=(fleet.target_invocations_per_instance_per_min
                                 if p.metric == INVOCATIONS_PER_INSTANCE
                                 else fleet.target_concurrent_requests_per_model
                                 or p.target_value))
        for p in setup.target_tracking)
    steps: list[StepScalingPolicy] = []
    threshold = fleet.step_threshold_invocations_per_instance_per_min
    for policy in setup.step:
        if threshold is None:
            continue
        alarm: MetricAlarm = replace(policy.alarm, threshold=threshold)
        bands = tuple(StepAdjustment(lower, upper, add)
                      for lower, upper, add in fleet.step_intervals)
        steps.append(replace(policy, alarm=alarm, steps=bands))
    floors = {f"{FLOOR_PREFIX}{floor.name}": floor for floor in fleet.floors}
    scheduled: list[ScheduledAction] = []
    for action in setup.scheduled:
        floor = floors.get(action.name)
        scheduled.append(action if floor is None else replace(
            action, min_capacity=floor.min_capacity, max_capacity=floor.max_capacity))
    return replace(setup, target_tracking=tracking, step=tuple(steps),
                   scheduled=tuple(scheduled))


def without_concurrency_tracking(setup: ScalingSetup) -> ScalingSetup:
    """``setup`` without its high-resolution target-tracking policies."""
    return replace(setup, target_tracking=tuple(
        p for p in setup.target_tracking if p.metric != CONCURRENCY_HIGH_RESOLUTION))


def spike_outcomes(trace: Trace, setup: ScalingSetup, params: SimulationParams, *,
                   current: FleetPlan, recommended: FleetPlan) -> list[SpikeOutcome]:
    """The trace without the calendar under the three scenarios of the module docstring."""
    concurrency_target = current.target_concurrent_requests_per_model
    without = without_concurrency_tracking(setup)
    scenarios: list[tuple[str, ScalingSetup, FleetPlan]] = [
        (WITHOUT_CONCURRENCY + (AS_SYNTHESIZED if without == setup else ""), without, current)]
    best = without
    if concurrency_target is not None:
        best = with_concurrency_tracking(setup, target=concurrency_target)
        scenarios.append((WITH_CONCURRENCY + (AS_SYNTHESIZED if best == setup else ""), best,
                          current))
    scenarios.append((RECOMMENDED, with_fleet(best, recommended), recommended))
    outcomes = []
    for label, scenario, fleet in scenarios:
        result = simulate(trace, scenario, params, exclude_prefix=CALENDAR_PREFIX, label=label)
        outcomes.append(SpikeOutcome(
            label=label, result=result,
            target_invocations_per_instance_per_min=fleet.target_invocations_per_instance_per_min,
            headroom=fleet.headroom))
    return outcomes


SPIKE_COLUMNS = ("scenario", "provisioning delay", "headroom", "target / instance",
                 "dropped %", "worst minute %", "seconds with errors", "errors (first - last)",
                 "peak instances", "instance-hours", "cost (USD)", "seed: < 1 % for < 90 s")


def spike_table(outcomes: Sequence[SpikeOutcome]) -> str:
    """A Markdown table of the outcomes."""
    lines = ["| " + " | ".join(SPIKE_COLUMNS) + " |", "|" + "|".join("---" for _ in SPIKE_COLUMNS)
             + "|"]
    for outcome in outcomes:
        result = outcome.result
        first, last = result.first_overload, result.last_overload
        span = "-" if first is None or last is None else f"{first:%H:%M} - {last:%H:%M}"
        lines.append("| " + " | ".join((
            outcome.label, f"{result.params.provisioning_delay_s / 60:g} min",
            "-" if outcome.headroom is None else f"{outcome.headroom:.0%}",
            "-" if outcome.target_invocations_per_instance_per_min is None
            else f"{outcome.target_invocations_per_instance_per_min:g}/min",
            f"{result.dropped_percent:.2f}", f"{outcome.worst_minute_percent:.1f}",
            f"{outcome.error_seconds:,}", span, str(result.peak_in_service),
            f"{result.instance_hours:.1f}", f"{result.cost_usd:,.2f}",
            "yes" if outcome.meets_seed else "no")) + " |")
    return "\n".join(lines)
