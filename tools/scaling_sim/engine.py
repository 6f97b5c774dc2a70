"""Replay a traffic trace through a SageMaker variant's scaling policies, one second at a time.

The model, and its assumptions (each a parameter where it is a number):

* **Fleet.** Each in-service instance serves ``instance_capacity_per_min`` invocations per
  minute — the capacity model's sustainable rate, read from the template's metadata; requests
  beyond the fleet's capacity in a second are dropped (the gateway sheds with 429/503 — no queue
  is modelled). Instances asked for become in-service after
  ``provisioning_delay_s`` (5-8 min for a g5 with a 16 GB model,
  docs/design-decisions.md#provisioning-delay); they are billed
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
    MetricAlarm,
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
    return _Simulation(trace, setup, params, actions).run(label)


@dataclass
class _Minute:
    """What the seconds of one trace minute add up to."""

    offered: float
    dropped: float = 0.0
    in_service_seconds: int = 0
    billed_seconds: int = 0
    concurrency: float = 0.0
    """Sum over the seconds of requests in flight per in-service instance."""

    @property
    def average_in_service(self) -> float:
        """In-service instances averaged over the minute (the InvocationsPerInstance divisor)."""
        return self.in_service_seconds / 60


class _Simulation:
    """One run: the fleet, the metric histories the policies read, and the tallies.

    Each method is one step of the model in the module docstring; :meth:`run` calls them in the
    order a second and a minute see them: scheduled actions firing, a second of serving (with the
    high-resolution concurrency datapoints), then the per-minute target-tracking and step
    policies.
    """

    def __init__(self, trace: Trace, setup: ScalingSetup, params: SimulationParams,
                 actions: Sequence[ScheduledAction]) -> None:
        self.trace = trace
        self.params = params
        self.step_policies = setup.step
        self.firings = _firings(actions, trace)
        self.next_firing = 0
        low, high = _range_at_start(actions, trace.start, setup)
        self.invocation_policies = [p for p in setup.target_tracking
                                    if p.metric != CONCURRENCY_HIGH_RESOLUTION]
        self.concurrency_policies = [p for p in setup.target_tracking
                                     if p.metric == CONCURRENCY_HIGH_RESOLUTION]
        if self.concurrency_policies and (params.concurrency_per_instance is None
                                          or params.request_seconds is None):
            raise ValueError("target tracking on ConcurrentRequestsPerModel needs "
                             "concurrency_per_instance and request_seconds (the capacity "
                             "model's figures in the template's metadata)")
        self.voters = _voters(self.invocation_policies, self.concurrency_policies)
        initial = _initial_desired(trace.invocations_per_min[0], self.invocation_policies,
                                   self.concurrency_policies, params, low)
        self.fleet = _Fleet(min(max(initial, low), high), low, high, params.provisioning_delay_s)
        self.per_instance_per_s = params.instance_capacity_per_min / 60
        self.datapoints: list[float] = []
        """InvocationsPerInstance, one a minute."""
        self.concurrency_minutes: list[float] = []
        """Requests in flight per instance, averaged over each minute."""
        self.concurrency_points: list[float] = []
        """The high-resolution datapoints, one every ``high_resolution_period_s``."""
        self.window_concurrency = 0.0
        self.last_step_run: dict[str, float] = {p.name: -math.inf for p in setup.step}
        self.last_activity = -math.inf
        self.samples: list[MinuteSample] = []
        self.activities: list[tuple[dt.datetime, str]] = []
        self.dropped_total = 0.0
        self.over_seconds = 0
        self.billed_seconds = 0
        self.peak = self.fleet.in_service

    def run(self, label: str) -> SimulationResult:
        """Every minute of the trace, second by second, then the minute's policies."""
        for minute, offered in enumerate(self.trace.invocations_per_min):
            tally = _Minute(offered)
            for second in range(minute * 60, minute * 60 + 60):
                self.fire_scheduled(second)
                self.serve(second, tally)
            self.close_minute(minute, tally)
            self.evaluate_policies((minute + 1) * 60, minute + 1, tally)
        instance_hours = self.billed_seconds / 3600
        return SimulationResult(
            label=label, params=self.params, samples=tuple(self.samples),
            offered=self.trace.total_invocations, dropped=self.dropped_total,
            seconds_over_capacity=self.over_seconds, instance_hours=instance_hours,
            cost_usd=instance_hours * self.params.usd_per_instance_hour,
            peak_in_service=self.peak, activities=tuple(self.activities))

    def fire_scheduled(self, second: int) -> None:
        """Apply the scheduled actions due by ``second``: a new range, the desired count
        clamped into it."""
        fleet = self.fleet
        while (self.next_firing < len(self.firings)
               and self.firings[self.next_firing].second <= second):
            action = self.firings[self.next_firing].action
            before = fleet.desired
            fleet.set_range(action.min_capacity, action.max_capacity, second)
            self.activities.append((_at(self.trace, second),
                                    f"{action.name}: min {fleet.low} max {fleet.high}"
                                    + (f", desired {before} -> {fleet.desired}"
                                       if fleet.desired != before else "")))
            self.next_firing += 1

    def serve(self, second: int, tally: _Minute) -> None:
        """One second: launches that are ready join, the fleet serves up to its capacity and
        sheds the rest; billing counts pending launches too."""
        fleet = self.fleet
        fleet.promote(second)
        arrivals_per_s = tally.offered / 60
        capacity = fleet.in_service * self.per_instance_per_s
        served = min(arrivals_per_s, capacity)
        if arrivals_per_s > capacity + _EPSILON:
            tally.dropped += arrivals_per_s - capacity
            self.over_seconds += 1
        tally.in_service_seconds += fleet.in_service
        tally.billed_seconds += fleet.in_service + len(fleet.pending)
        self.peak = max(self.peak, fleet.in_service)
        if self.concurrency_policies:
            self.track_concurrency(second, served, tally)

    def track_concurrency(self, second: int, served: float, tally: _Minute) -> None:
        """Requests in flight this second (Little's law, capped per instance); a datapoint at
        the end of each high-resolution period."""
        fleet, params = self.fleet, self.params
        assert params.request_seconds is not None
        assert params.concurrency_per_instance is not None
        in_flight = min(served * params.request_seconds,
                        fleet.in_service * params.concurrency_per_instance)
        per_model = in_flight / max(fleet.in_service, 1)
        self.window_concurrency += per_model
        tally.concurrency += per_model
        if (second + 1) % params.high_resolution_period_s == 0:
            self.concurrency_datapoint(second + 1)

    def concurrency_datapoint(self, now: int) -> None:
        """Close a high-resolution period; a policy whose last datapoints are all above its
        target scales out at once, to ceil(in flight ÷ target)."""
        params, fleet = self.params, self.fleet
        self.concurrency_points.append(self.window_concurrency / params.high_resolution_period_s)
        self.window_concurrency = 0.0
        latest = self.concurrency_points[-1]
        for policy in self.concurrency_policies:
            wanted = max(1, math.ceil(latest * max(fleet.in_service, 1) / policy.target_value
                                      - _EPSILON))
            if _tracking_out(policy, self.concurrency_points, params) and wanted > fleet.desired:
                self.change_desired(wanted, f"target tracking on concurrency "
                                            f"({latest:.1f}/model)", now)

    def close_minute(self, minute: int, tally: _Minute) -> None:
        """Add the minute to the totals and record its sample (before the policies act)."""
        fleet = self.fleet
        self.billed_seconds += tally.billed_seconds
        self.dropped_total += tally.dropped
        self.samples.append(MinuteSample(
            start=_at(self.trace, minute * 60), offered=tally.offered, dropped=tally.dropped,
            in_service=tally.average_in_service, billed=tally.billed_seconds / 60,
            desired=fleet.desired, min_capacity=fleet.low, max_capacity=fleet.high))

    def evaluate_policies(self, now: int, minutes_elapsed: int, tally: _Minute) -> None:
        """The end of a minute: its datapoints, then every policy's proposal. The largest
        scale-out wins; without one, the largest scale-in (tracking scales in only when every
        policy that may scale in agrees)."""
        metric = tally.offered / max(tally.average_in_service, _EPSILON)
        self.datapoints.append(metric)
        self.concurrency_minutes.append(tally.concurrency / 60)
        out, tracking_in = self.invocation_proposals(now, tally.offered, metric)
        tracking_in += self.concurrency_scale_in(now, tally.average_in_service)
        scale_in = tracking_in if self.voters and len(tracking_in) == self.voters else []
        step_out, step_in = self.step_proposals(now, minutes_elapsed, metric)
        out += step_out
        scale_in += step_in
        if out:
            self.change_desired(*max(out), now)
        elif scale_in:
            self.change_desired(*max(scale_in), now)

    def invocation_proposals(self, now: int, offered: float, metric: float
                             ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """Target tracking on InvocationsPerInstance: (scale-outs, scale-ins) to
        ceil(invocations per minute ÷ target)."""
        out: list[tuple[int, str]] = []
        scale_in: list[tuple[int, str]] = []
        desired = self.fleet.desired
        for policy in self.invocation_policies:
            wanted = max(1, math.ceil(offered / policy.target_value - _EPSILON))
            reason = f"target tracking ({metric:.0f}/instance)"
            if _tracking_out(policy, self.datapoints, self.params) and wanted > desired:
                out.append((wanted, reason))
            if (_tracking_in(policy, self.datapoints, self.params, now - self.last_activity)
                    and wanted < desired):
                scale_in.append((wanted, reason))
        return out, scale_in

    def concurrency_scale_in(self, now: int, average_in_service: float
                             ) -> list[tuple[int, str]]:
        """Target tracking on concurrency scales in from the per-minute averages (it scales
        out every high-resolution period, :meth:`concurrency_datapoint`)."""
        found: list[tuple[int, str]] = []
        latest = self.concurrency_minutes[-1]
        for policy in self.concurrency_policies:
            wanted = max(1, math.ceil(latest * average_in_service / policy.target_value
                                      - _EPSILON))
            if (_tracking_in(policy, self.concurrency_minutes, self.params,
                             now - self.last_activity)
                    and wanted < self.fleet.desired):
                found.append((wanted, f"target tracking on concurrency ({latest:.1f}/model)"))
        return found

    def step_proposals(self, now: int, minutes_elapsed: int, metric: float
                       ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """Each step policy whose alarm is in ALARM and whose cooldown has passed runs (and
        restarts its cooldown): (scale-outs, scale-ins)."""
        out: list[tuple[int, str]] = []
        scale_in: list[tuple[int, str]] = []
        desired = self.fleet.desired
        for policy in self.step_policies:
            proposal = _step_proposal(policy, self.datapoints, minutes_elapsed, desired,
                                      now - self.last_step_run[policy.name])
            if proposal is None:
                continue
            self.last_step_run[policy.name] = now
            if proposal > desired:
                out.append((proposal, f"step scaling ({metric:.0f}/instance)"))
            elif proposal < desired:
                scale_in.append((proposal, f"step scaling ({metric:.0f}/instance)"))
        return out, scale_in

    def change_desired(self, target: int, reason: str, now: int) -> None:
        """Set the desired count (clamped to the range); a change is a scaling activity."""
        fleet = self.fleet
        before = fleet.desired
        fleet.set_desired(target, now)
        if fleet.desired != before:
            self.last_activity = now
            self.activities.append((_at(self.trace, now), f"{reason}: desired {before} -> "
                                                          f"{fleet.desired}"))


def _initial_desired(first_rate: float, invocation: Sequence[TargetTrackingPolicy],
                     concurrency: Sequence[TargetTrackingPolicy], params: SimulationParams,
                     low: int) -> int:
    """The desired count the fleet starts at: what every tracking policy would ask for the
    trace's first minute, at least the minimum in force."""
    return max([math.ceil(first_rate / p.target_value) for p in invocation]
               + [math.ceil(first_rate / 60 * (params.request_seconds or 0) / p.target_value)
                  for p in concurrency] + [low])


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
    if since_last_run_s < policy.cooldown_s:
        return None
    alarm = policy.alarm
    periods = _alarm_periods(alarm, values, minutes_elapsed)
    if not _in_alarm(alarm, periods):
        return None
    delta = periods[-1] - alarm.threshold
    step = next((s for s in policy.steps if s.contains(delta)), None)
    if step is None or step.adjustment == 0:
        return None
    return _adjusted(policy, step.adjustment, desired)


def _alarm_periods(alarm: MetricAlarm, values: list[float], minutes_elapsed: int) -> list[float]:
    """The alarm's datapoints of complete periods, newest last, aligned to the end of this
    minute: at most ``evaluation_periods`` of them."""
    period_min = alarm.period_s // 60
    periods: list[float] = []
    for end in range(minutes_elapsed, 0, -period_min):
        chunk = values[max(0, end - period_min):end]
        if len(chunk) < period_min:
            break
        periods.append(_aggregate(alarm.statistic, chunk))
        if len(periods) == alarm.evaluation_periods:
            break
    periods.reverse()
    return periods


def _in_alarm(alarm: MetricAlarm, periods: Sequence[float]) -> bool:
    """Whether the alarm is in ALARM: all its evaluation periods present, and at least
    ``datapoints_to_alarm`` of them past the threshold."""
    return (len(periods) >= alarm.evaluation_periods
            and sum(1 for v in periods if alarm.breaches(v)) >= alarm.datapoints_to_alarm)


def _adjusted(policy: StepScalingPolicy, adjustment: int, desired: int) -> int:
    """The desired count after one step ``adjustment`` of the policy's AdjustmentType."""
    if policy.adjustment_type == "ExactCapacity":
        return adjustment
    if policy.adjustment_type == "PercentChangeInCapacity":
        change = desired * adjustment / 100
        rounded = math.copysign(1 if abs(change) < 1 else math.floor(abs(change)), change)
        if policy.min_adjustment_magnitude and abs(rounded) < policy.min_adjustment_magnitude:
            rounded = math.copysign(policy.min_adjustment_magnitude, change)
        return desired + int(rounded)
    return desired + adjustment


def _aggregate(statistic: str, values: Sequence[float]) -> float:
    if statistic == "Sum":
        return sum(values)
    if statistic == "Maximum":
        return max(values)
    if statistic == "Minimum":
        return min(values)
    return sum(values) / len(values)
