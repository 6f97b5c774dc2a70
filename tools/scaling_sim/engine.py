"""Replay a traffic trace through a SageMaker variant's scaling policies, one second at a time.

The model, and its assumptions (each a parameter where it is a number):

* **Fleet.** Each in-service instance serves ``instance_capacity_per_min`` invocations per
  minute — the capacity model's sustainable rate, read from the template's metadata; requests
  beyond the fleet's capacity in a second are dropped (the gateway sheds with 429/503 — no queue
  is modelled). Instances asked for become in-service after
  ``provisioning_delay_s`` (5-8 min for a g5 with a 16 GB model, seed 001 story 7); they are billed
  from launch. Scale-in removes pending launches first, then in-service instances, at once.
* **Scheduled actions** set MinCapacity/MaxCapacity at their fire times (in their own
  ``Timezone``); the desired count is clamped into the new range (a lower max scales in at once,
  a higher min launches instances). The range in force at the trace's start is that of the
  actions' last firings before it.
* **Target tracking** on InvocationsPerInstance (one datapoint per minute, invocations offered in
  the minute ÷ average in-service instances): scale out when ``tracking_high_datapoints``
  consecutive datapoints are above the target, to ceil(invocations per minute ÷ target); scale in
  when ``tracking_low_datapoints`` are below ``tracking_scale_in_ratio`` × target and
  ScaleInCooldown has passed since the last scaling activity (Application Auto Scaling's own
  alarms are 3 of 3 and 15 of 15 one-minute datapoints). A scale-out during ScaleOutCooldown is
  allowed when it asks for more than the current desired count, as AWS documents.
* **Target tracking on ConcurrentRequestsPerModel (high resolution)**: requests in flight =
  served rate × ``request_seconds`` (Little's law), at most ``concurrency_per_instance`` per
  in-service instance (beyond it the gateway sheds); one datapoint every
  ``high_resolution_period_s`` (SageMaker emits it every 10 s), scale out after
  ``tracking_high_datapoints`` consecutive ones above the target, to ceil(in flight ÷ target);
  scale in like the standard metric (AWS: "the policy scales in at the same rate").
* **Step scaling**: its alarm is evaluated every Period from the same datapoints; while in ALARM
  the policy runs once a minute (CloudWatch re-invokes Auto Scaling actions), at most once per
  Cooldown, adjusting the desired count by the band of (metric − threshold).
* When several policies want to scale out, the largest wins; a scale-in happens only in a minute
  no policy wants to scale out, to the largest of the scale-in proposals.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from tools.scaling_sim.template import (
    CONCURRENCY_HIGH_RESOLUTION,
    ScalingSetup,
    ScheduledAction,
    StepScalingPolicy,
    TargetTrackingPolicy,
)
from tools.scaling_sim.traces import Trace

_EPSILON = 1e-9


@dataclass(frozen=True)
class SimulationParams:
    """The fleet and the Auto Scaling behaviour the template does not say.

    ``instance_capacity_per_min`` (and, for the high-resolution policy,
    ``concurrency_per_instance`` and ``request_seconds``) are the capacity model's figures: the
    CLI reads them from the template (:attr:`ScalingSetup.capacity`); the price is the catalog's.
    """

    instance_capacity_per_min: float
    usd_per_instance_hour: float
    provisioning_delay_s: int = 360
    concurrency_per_instance: float | None = None
    request_seconds: float | None = None
    tracking_high_datapoints: int = 3
    tracking_low_datapoints: int = 15
    tracking_scale_in_ratio: float = 0.9
    high_resolution_period_s: int = 10

    def __post_init__(self) -> None:
        if self.provisioning_delay_s < 0:
            raise ValueError(f"provisioning_delay_s {self.provisioning_delay_s}; accepted: >= 0")
        if self.instance_capacity_per_min <= 0:
            raise ValueError(f"instance_capacity_per_min {self.instance_capacity_per_min}; "
                             "accepted: > 0")
        for name in ("concurrency_per_instance", "request_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} {value}; accepted: > 0 or None")
        if 60 % self.high_resolution_period_s:
            raise ValueError(f"high_resolution_period_s {self.high_resolution_period_s}; "
                             "accepted: a divisor of 60")
        if self.usd_per_instance_hour < 0:
            raise ValueError(f"usd_per_instance_hour {self.usd_per_instance_hour}; "
                             "accepted: >= 0")


@dataclass(frozen=True)
class MinuteSample:
    """The state of one simulated minute."""

    start: dt.datetime
    offered: float
    dropped: float
    in_service: float
    billed: float
    desired: int
    min_capacity: int
    max_capacity: int


@dataclass(frozen=True)
class SimulationResult:
    """What one run produced."""

    label: str
    params: SimulationParams
    samples: tuple[MinuteSample, ...]
    offered: float
    dropped: float
    seconds_over_capacity: int
    instance_hours: float
    cost_usd: float
    peak_in_service: int
    activities: tuple[tuple[dt.datetime, str], ...] = field(default_factory=tuple)

    @property
    def dropped_percent(self) -> float:
        """Dropped requests as a share of those offered."""
        return 100 * self.dropped / self.offered if self.offered else 0.0

    @property
    def worst_minute_dropped_percent(self) -> float:
        """The largest share of one minute's requests that was dropped (the error-rate peak)."""
        return max((100 * s.dropped / s.offered for s in self.samples if s.offered), default=0.0)

    @property
    def first_overload(self) -> dt.datetime | None:
        """Start of the first minute with dropped requests."""
        return next((s.start for s in self.samples if s.dropped > _EPSILON), None)

    @property
    def last_overload(self) -> dt.datetime | None:
        """End of the last minute with dropped requests."""
        last = next((s for s in reversed(self.samples) if s.dropped > _EPSILON), None)
        return last.start + dt.timedelta(minutes=1) if last else None


@dataclass(frozen=True)
class _Firing:
    second: int
    action: ScheduledAction


class _Fleet:
    def __init__(self, desired: int, low: int, high: int, delay_s: int) -> None:
        self.in_service = desired
        self.pending: list[int] = []  # ready-at seconds
        self.desired = desired
        self.low = low
        self.high = high
        self.delay_s = delay_s

    def set_desired(self, desired: int, second: int) -> None:
        self.desired = min(max(desired, self.low), self.high)
        total = self.in_service + len(self.pending)
        if self.desired > total:
            self.pending.extend([second + self.delay_s] * (self.desired - total))
        elif self.desired < total:
            surplus = total - self.desired
            while surplus and self.pending:
                self.pending.pop()  # the latest launch is cancelled first
                surplus -= 1
            self.in_service -= surplus

    def set_range(self, low: int | None, high: int | None, second: int) -> None:
        if low is not None:
            self.low = low
        if high is not None:
            self.high = high
        self.set_desired(self.desired, second)

    def promote(self, second: int) -> None:
        ready = [t for t in self.pending if t <= second]
        if ready:
            self.pending = [t for t in self.pending if t > second]
            self.in_service += len(ready)


def simulate(trace: Trace, setup: ScalingSetup, params: SimulationParams, *,
             extra_actions: Sequence[ScheduledAction] = (), exclude_prefix: str | None = None,
             label: str = "") -> SimulationResult:
    """Run the trace through the setup's policies.

    ``extra_actions`` are added to the template's scheduled actions (the Lambda's dated ones);
    actions whose name starts with ``exclude_prefix`` are left out (the "without the calendar"
    run).
    """
    actions = [a for a in (*setup.scheduled, *extra_actions)
               if exclude_prefix is None or not a.name.startswith(exclude_prefix)]
    firings = _firings(actions, trace)
    low, high = _range_at_start(actions, trace.start, setup)
    invocation_policies = [p for p in setup.target_tracking
                           if p.metric != CONCURRENCY_HIGH_RESOLUTION]
    concurrency_policies = [p for p in setup.target_tracking
                            if p.metric == CONCURRENCY_HIGH_RESOLUTION]
    if concurrency_policies and (params.concurrency_per_instance is None
                                 or params.request_seconds is None):
        raise ValueError("target tracking on ConcurrentRequestsPerModel needs "
                         "concurrency_per_instance and request_seconds (the capacity model's "
                         "figures in the template's metadata)")
    first_rate = trace.invocations_per_min[0]
    initial = max([math.ceil(first_rate / p.target_value) for p in invocation_policies]
                  + [math.ceil(first_rate / 60 * (params.request_seconds or 0) / p.target_value)
                     for p in concurrency_policies] + [low])
    fleet = _Fleet(min(max(initial, low), high), low, high, params.provisioning_delay_s)

    per_instance_per_s = params.instance_capacity_per_min / 60
    period_s = params.high_resolution_period_s
    datapoints: list[float] = []
    concurrency_minutes: list[float] = []
    concurrency_points: list[float] = []
    window_concurrency = 0.0
    last_step_run: dict[str, float] = {p.name: -math.inf for p in setup.step}
    last_activity = -math.inf
    samples: list[MinuteSample] = []
    activities: list[tuple[dt.datetime, str]] = []
    dropped_total = 0.0
    over_seconds = 0
    billed_seconds = 0
    peak = fleet.in_service
    next_firing = 0

    def change_desired(target: int, reason: str, now: int) -> None:
        nonlocal last_activity
        before = fleet.desired
        fleet.set_desired(target, now)
        if fleet.desired != before:
            last_activity = now
            activities.append((_at(trace, now), f"{reason}: desired {before} -> "
                                                 f"{fleet.desired}"))

    for minute, offered in enumerate(trace.invocations_per_min):
        arrivals_per_s = offered / 60
        dropped_minute = 0.0
        in_service_seconds = 0
        billed_minute = 0
        minute_concurrency = 0.0
        for second in range(minute * 60, minute * 60 + 60):
            while next_firing < len(firings) and firings[next_firing].second <= second:
                action = firings[next_firing].action
                before = fleet.desired
                fleet.set_range(action.min_capacity, action.max_capacity, second)
                activities.append((_at(trace, second),
                                   f"{action.name}: min {fleet.low} max {fleet.high}"
                                   + (f", desired {before} -> {fleet.desired}"
                                      if fleet.desired != before else "")))
                next_firing += 1
            fleet.promote(second)
            capacity = fleet.in_service * per_instance_per_s
            served = min(arrivals_per_s, capacity)
            if arrivals_per_s > capacity + _EPSILON:
                dropped_minute += arrivals_per_s - capacity
                over_seconds += 1
            in_service_seconds += fleet.in_service
            billed_minute += fleet.in_service + len(fleet.pending)
            peak = max(peak, fleet.in_service)
            if concurrency_policies:
                assert params.request_seconds is not None
                assert params.concurrency_per_instance is not None
                in_flight = min(served * params.request_seconds,
                                fleet.in_service * params.concurrency_per_instance)
                per_model = in_flight / max(fleet.in_service, 1)
                window_concurrency += per_model
                minute_concurrency += per_model
                if (second + 1) % period_s == 0:
                    concurrency_points.append(window_concurrency / period_s)
                    window_concurrency = 0.0
                    now_s = second + 1
                    for policy in concurrency_policies:
                        run = concurrency_points[-params.tracking_high_datapoints:]
                        wanted = max(1, math.ceil(
                            concurrency_points[-1] * max(fleet.in_service, 1)
                            / policy.target_value - _EPSILON))
                        if (len(run) == params.tracking_high_datapoints
                                and all(v > policy.target_value for v in run)
                                and wanted > fleet.desired):
                            change_desired(wanted, f"target tracking on concurrency "
                                                   f"({concurrency_points[-1]:.1f}/model)", now_s)
        billed_seconds += billed_minute
        dropped_total += dropped_minute
        average_in_service = in_service_seconds / 60
        samples.append(MinuteSample(
            start=_at(trace, minute * 60), offered=offered, dropped=dropped_minute,
            in_service=average_in_service, billed=billed_minute / 60, desired=fleet.desired,
            min_capacity=fleet.low, max_capacity=fleet.high))

        # --- policies, evaluated at the end of the minute --------------------------------------
        now = (minute + 1) * 60
        metric = offered / max(average_in_service, _EPSILON)
        datapoints.append(metric)
        concurrency_minutes.append(minute_concurrency / 60)
        out: list[tuple[int, str]] = []
        scale_in: list[tuple[int, str]] = []
        tracking_in: list[tuple[int, str]] = []
        for tracking in invocation_policies:
            wanted = max(1, math.ceil(offered / tracking.target_value - _EPSILON))
            if _tracking_out(tracking, datapoints, params) and wanted > fleet.desired:
                out.append((wanted, f"target tracking ({metric:.0f}/instance)"))
            if (_tracking_in(tracking, datapoints, params, now - last_activity)
                    and wanted < fleet.desired):
                tracking_in.append((wanted, f"target tracking ({metric:.0f}/instance)"))
        for tracking in concurrency_policies:
            wanted = max(1, math.ceil(concurrency_minutes[-1] * average_in_service
                                      / tracking.target_value - _EPSILON))
            if (_tracking_in(tracking, concurrency_minutes, params, now - last_activity)
                    and wanted < fleet.desired):
                tracking_in.append((wanted, f"target tracking on concurrency "
                                            f"({concurrency_minutes[-1]:.1f}/model)"))
        voters = _voters(invocation_policies, concurrency_policies)
        if voters and len(tracking_in) == voters:
            scale_in.extend(tracking_in)
        for step_policy in setup.step:
            proposal = _step_proposal(step_policy, datapoints, minute + 1, fleet.desired,
                                      now - last_step_run[step_policy.name])
            if proposal is None:
                continue
            last_step_run[step_policy.name] = now
            if proposal > fleet.desired:
                out.append((proposal, f"step scaling ({metric:.0f}/instance)"))
            elif proposal < fleet.desired:
                scale_in.append((proposal, f"step scaling ({metric:.0f}/instance)"))
        if out:
            change_desired(*max(out), now)
        elif scale_in:
            change_desired(*max(scale_in), now)
    instance_hours = billed_seconds / 3600
    return SimulationResult(
        label=label, params=params, samples=tuple(samples), offered=trace.total_invocations,
        dropped=dropped_total, seconds_over_capacity=over_seconds,
        instance_hours=instance_hours, cost_usd=instance_hours * params.usd_per_instance_hour,
        peak_in_service=peak, activities=tuple(activities))


def _voters(invocation: Sequence[TargetTrackingPolicy],
            concurrency: Sequence[TargetTrackingPolicy]) -> int:
    """Target-tracking policies that may scale in. A scalable target may carry several
    target-tracking policies, each on a different metric, and Application Auto Scaling "scales
    based on the policy that provides the largest capacity for both scale in and scale out"
    (Application Auto Scaling User Guide, "Target tracking scaling policies for Application Auto
    Scaling", https://docs.aws.amazon.com/autoscaling/application/userguide/application-auto-scaling-target-tracking.html):
    any policy may scale out, and capacity comes down only when every policy whose scale-in is
    enabled asks for less."""
    return sum(1 for p in (*invocation, *concurrency) if not p.disable_scale_in)


def _tracking_out(policy: TargetTrackingPolicy, values: Sequence[float],
                  params: SimulationParams) -> bool:
    run = values[-params.tracking_high_datapoints:]
    return (len(run) == params.tracking_high_datapoints
            and all(v > policy.target_value for v in run))


def _tracking_in(policy: TargetTrackingPolicy, values: Sequence[float],
                 params: SimulationParams, since_activity_s: float) -> bool:
    run = values[-params.tracking_low_datapoints:]
    return (not policy.disable_scale_in
            and len(run) == params.tracking_low_datapoints
            and all(v < policy.target_value * params.tracking_scale_in_ratio for v in run)
            and since_activity_s >= policy.scale_in_cooldown_s)


def _at(trace: Trace, second: int) -> dt.datetime:
    return trace.start + dt.timedelta(seconds=second)


def _firings(actions: Sequence[ScheduledAction], trace: Trace) -> list[_Firing]:
    found: list[_Firing] = []
    for action in actions:
        zone = ZoneInfo(action.timezone)
        local_start = trace.start.astimezone(zone).replace(tzinfo=None)
        local_end = trace.end.astimezone(zone).replace(tzinfo=None)
        for moment in action.schedule.firings(local_start, local_end):
            aware = moment.replace(tzinfo=zone)
            if not _active(action, aware):
                continue
            second = int((aware - trace.start).total_seconds())
            found.append(_Firing(second, action))
    return sorted(found, key=lambda f: (f.second, f.action.name))


def _active(action: ScheduledAction, moment: dt.datetime) -> bool:
    return ((action.start_time is None or moment >= action.start_time)
            and (action.end_time is None or moment <= action.end_time))


def _range_at_start(actions: Sequence[ScheduledAction], start: dt.datetime,
                    setup: ScalingSetup) -> tuple[int, int]:
    """Min/max in force at ``start``: the target's own, then each action's last firing, in
    time order."""
    last: list[tuple[dt.datetime, ScheduledAction]] = []
    for action in actions:
        zone = ZoneInfo(action.timezone)
        moment = action.schedule.last_firing_before(start.astimezone(zone).replace(tzinfo=None))
        if moment is not None and _active(action, moment.replace(tzinfo=zone)):
            last.append((moment.replace(tzinfo=zone), action))
    low, high = setup.min_capacity, setup.max_capacity
    for _, action in sorted(last, key=lambda item: (item[0], item[1].name)):
        low = action.min_capacity if action.min_capacity is not None else low
        high = action.max_capacity if action.max_capacity is not None else high
    return low, high


def _step_proposal(policy: StepScalingPolicy, values: list[float], minutes_elapsed: int,
                   desired: int, since_last_run_s: float) -> int | None:
    """The desired count the step policy asks for this minute, or None."""
    alarm = policy.alarm
    period_min = alarm.period_s // 60
    if since_last_run_s < policy.cooldown_s:
        return None
    periods: list[float] = []
    # datapoints of complete periods, newest last, aligned to the end of this minute
    for end in range(minutes_elapsed, 0, -period_min):
        chunk = values[max(0, end - period_min):end]
        if len(chunk) < period_min:
            break
        periods.append(_aggregate(alarm.statistic, chunk))
        if len(periods) == alarm.evaluation_periods:
            break
    periods.reverse()
    if len(periods) < alarm.evaluation_periods:
        return None
    if sum(1 for v in periods if alarm.breaches(v)) < alarm.datapoints_to_alarm:
        return None
    delta = periods[-1] - alarm.threshold
    step = next((s for s in policy.steps if s.contains(delta)), None)
    if step is None or step.adjustment == 0:
        return None
    if policy.adjustment_type == "ExactCapacity":
        return step.adjustment
    if policy.adjustment_type == "PercentChangeInCapacity":
        change = desired * step.adjustment / 100
        rounded = math.copysign(1 if abs(change) < 1 else math.floor(abs(change)), change)
        if policy.min_adjustment_magnitude and abs(rounded) < policy.min_adjustment_magnitude:
            rounded = math.copysign(policy.min_adjustment_magnitude, change)
        return desired + int(rounded)
    return desired + step.adjustment


def _aggregate(statistic: str, values: Sequence[float]) -> float:
    if statistic == "Sum":
        return sum(values)
    if statistic == "Maximum":
        return max(values)
    if statistic == "Minimum":
        return min(values)
    return sum(values) / len(values)
