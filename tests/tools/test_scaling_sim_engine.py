"""The simulator's arithmetic on small cases computed by hand, and the shipped traces."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from release_calendar import parse_schedule
from tools.scaling_sim.engine import SimulationParams, simulate
from tools.scaling_sim.template import (
    CONCURRENCY_HIGH_RESOLUTION,
    MetricAlarm,
    ScalingSetup,
    ScheduledAction,
    StepAdjustment,
    StepScalingPolicy,
    TargetTrackingPolicy,
)
from tools.scaling_sim.traces import (
    TRACE_DIR,
    Trace,
    load_trace,
    shipped_traces,
)

JST = dt.timezone(dt.timedelta(hours=9))
START = dt.datetime(2026, 12, 6, 12, 0, tzinfo=JST)
ONE_PER_SECOND = SimulationParams(provisioning_delay_s=120, instance_capacity_per_min=60,
                                  usd_per_instance_hour=2.0)


def trace(*rates: float) -> Trace:
    return Trace(name="t", description="", start=START, invocations_per_min=rates)


def setup(*, tracking: float | None = None, step: StepScalingPolicy | None = None,
          scheduled: tuple[ScheduledAction, ...] = (), low: int = 1,
          high: int = 10) -> ScalingSetup:
    policies = (TargetTrackingPolicy("tt", tracking, 60, 600, False),) if tracking else ()
    return ScalingSetup(logical_id="T", min_capacity=low, max_capacity=high, scheduled=scheduled,
                        target_tracking=policies, step=(step,) if step else ())


def at(name: str, moment: str, low: int | None, high: int | None) -> ScheduledAction:
    return ScheduledAction(name=name, schedule=parse_schedule(f"at({moment})"),
                           timezone="Asia/Tokyo", min_capacity=low, max_capacity=high)


def test_steady_load_within_capacity_costs_exactly_the_fleet() -> None:
    result = simulate(trace(*[120.0] * 60), setup(tracking=60), ONE_PER_SECOND)
    assert result.dropped == 0
    assert result.seconds_over_capacity == 0
    assert result.instance_hours == pytest.approx(2.0)  # ceil(120/60) = 2 instances for 1 h
    assert result.cost_usd == pytest.approx(4.0)


def test_target_tracking_reacts_after_three_datapoints_and_the_delay() -> None:
    # 1 instance serves 60/min. Load 180/min from minute 10: datapoints at the end of minutes
    # 10, 11, 12 are above 60 -> desired 3 at t=780 s, in service at t=900 s (minute 15).
    result = simulate(trace(*[60.0] * 10, *[180.0] * 20), setup(tracking=60), ONE_PER_SECOND)
    assert result.seconds_over_capacity == 5 * 60
    assert result.dropped == pytest.approx(5 * 120)
    assert [round(s.in_service) for s in result.samples[9:17]] == [1, 1, 1, 1, 1, 1, 3, 3]
    assert [s.desired for s in result.samples[12:14]] == [1, 3]
    assert result.first_overload == START + dt.timedelta(minutes=10)
    assert result.last_overload == START + dt.timedelta(minutes=15)
    assert result.worst_minute_dropped_percent == pytest.approx(100 * 120 / 180)
    assert any("target tracking (180/instance): desired 1 -> 3" in text
               for _, text in result.activities)


def test_step_scaling_fires_from_a_one_minute_alarm() -> None:
    policy = StepScalingPolicy(
        name="step", adjustment_type="ChangeInCapacity", cooldown_s=60,
        steps=(StepAdjustment(0, 100, 1), StepAdjustment(100, None, 2)),
        alarm=MetricAlarm(name="alarm", statistic="Sum", period_s=60, evaluation_periods=1,
                          datapoints_to_alarm=1, threshold=90,
                          comparison="GreaterThanOrEqualToThreshold"))
    # 180/instance - 90 = 90 -> +1 at the end of minute 10 (in service 2 min later, minute 13);
    # the alarm stays in ALARM, so +1 again at the end of minutes 11 and 12 (cooldown 60 s):
    # step scaling counts the pending launches in the desired count and overshoots.
    result = simulate(trace(*[60.0] * 10, *[180.0] * 10), setup(step=policy), ONE_PER_SECOND)
    assert [s.desired for s in result.samples[10:14]] == [1, 2, 3, 4]
    assert [round(s.in_service) for s in result.samples[10:16]] == [1, 1, 1, 2, 3, 4]
    assert result.dropped == pytest.approx(3 * 120 + 60)  # minutes 10-12 fully, 13 half


def test_scheduled_minimum_launches_and_a_lower_maximum_removes_at_once() -> None:
    actions = (at("calendar-dated-x-prescale", "2026-12-06T12:05:00", 4, 10),
               at("floor-night", "2026-12-06T12:20:00", 1, 2))
    result = simulate(trace(*[30.0] * 30), setup(tracking=60, scheduled=actions),
                      ONE_PER_SECOND)
    in_service = [round(s.in_service) for s in result.samples]
    assert in_service[4] == 1
    assert in_service[6] == 1
    assert in_service[7] == 4
    assert in_service[20] == 2  # max 2 at 12:20 removes two instances at once
    assert [s.min_capacity for s in result.samples][4:6] == [1, 4]
    without = simulate(trace(*[30.0] * 30), setup(tracking=60, scheduled=actions),
                       ONE_PER_SECOND, exclude_prefix="calendar-")
    assert max(s.in_service for s in without.samples) == 1


def test_range_at_start_comes_from_the_last_firings() -> None:
    night = ScheduledAction("floor-night", parse_schedule("cron(0 1 * * ? *)"), "Asia/Tokyo", 2, 3)
    day = ScheduledAction("floor-day", parse_schedule("cron(0 8 * * ? *)"), "Asia/Tokyo", 5, 9)
    at_three = Trace(name="t", description="", invocations_per_min=(10.0,) * 5,
                     start=dt.datetime(2026, 12, 6, 3, 0, tzinfo=JST))
    result = simulate(at_three, setup(tracking=60, scheduled=(night, day)), ONE_PER_SECOND)
    assert (result.samples[0].min_capacity, result.samples[0].max_capacity) == (2, 3)
    assert result.samples[0].in_service == 2


def test_scale_in_waits_for_fifteen_low_datapoints() -> None:
    result = simulate(trace(*[300.0] * 5, *[60.0] * 30), setup(tracking=60), ONE_PER_SECOND)
    desired = [s.desired for s in result.samples]
    assert desired[0] == 5
    # datapoints of minutes 5..19 are low (12/instance < 54): scale in from minute 20
    assert desired[19] == 5
    assert desired[20] == 1


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="instance_capacity_per_min 0"):
        SimulationParams(instance_capacity_per_min=0, usd_per_instance_hour=1.0)
    with pytest.raises(ValueError, match="concurrency_per_instance -1"):
        SimulationParams(instance_capacity_per_min=60, usd_per_instance_hour=1.0,
                         concurrency_per_instance=-1)


def test_shipped_traces_are_the_generated_ones() -> None:
    # Generated from production's traffic profile and the release calendar, so they can never
    # disagree with the numbers the floors and the pre-scales were derived from.
    generated = shipped_traces()
    assert load_trace(TRACE_DIR / "one-piece.csv") == generated["one-piece"]
    assert load_trace(TRACE_DIR / "weekday.csv") == generated["weekday"]


def test_one_piece_trace_is_three_times_base_fifteen_minutes_after_release() -> None:
    from stacks.settings import load_settings

    profile = load_settings("prod").llm.scaling.traffic.profile()
    traces = shipped_traces()
    trace_ = traces["one-piece"]
    by_time = {trace_.start + dt.timedelta(minutes=i): v
               for i, v in enumerate(trace_.invocations_per_min)}
    release = dt.datetime(2026, 12, 6, 20, 0, tzinfo=JST)
    assert by_time[release] == pytest.approx(profile.at(20.0))
    assert by_time[release + dt.timedelta(minutes=15)] == pytest.approx(
        3 * by_time[release], rel=0.01)
    # The weekday's trough is the profile's quietest hour; its peak the 18:00 Magazine (×1.8)
    # held from 18:15 until an hour before its 3-hour window ends.
    weekday = traces["weekday"].invocations_per_min
    assert min(weekday) == pytest.approx(min(profile.hourly_invocations_per_min))
    held = [profile.at(18.25 + minute / 60) for minute in range(106)]
    assert max(weekday) == pytest.approx(1.8 * max(held), rel=0.001)


def concurrency_setup(target: float, *, with_invocations: float | None = None) -> ScalingSetup:
    policies = [TargetTrackingPolicy("hr", target, 60, 600, False,
                                     metric=CONCURRENCY_HIGH_RESOLUTION)]
    if with_invocations is not None:
        policies.append(TargetTrackingPolicy("tt", with_invocations, 60, 600, False))
    return ScalingSetup(logical_id="T", min_capacity=1, max_capacity=10, scheduled=(),
                        target_tracking=tuple(policies), step=())


CONCURRENT = SimulationParams(provisioning_delay_s=120, instance_capacity_per_min=60,
                              usd_per_instance_hour=2.0, concurrency_per_instance=20,
                              request_seconds=10)


def test_high_resolution_tracking_reacts_after_three_ten_second_datapoints() -> None:
    # 60/min = 1 request/s × 10 s = 10 in flight: at the target of 10 per model. From minute 10,
    # 90/min: 1.5/s, but one instance serves 1/s, so 10 in flight (the gateway sheds the rest).
    # Capped at 20 per model, the metric is 10 > 8 (target) for 30 s: desired ceil(10/8) = 2 at
    # 10:30 — two and a half minutes before InvocationsPerInstance's three minutes.
    result = simulate(trace(*[60.0] * 10, *[90.0] * 10), concurrency_setup(8),
                      CONCURRENT)
    assert result.samples[0].desired == 2  # 10 in flight at start needs ceil(10/8)
    result = simulate(trace(*[40.0] * 10, *[120.0] * 10), concurrency_setup(8), CONCURRENT)
    # 40/min: 6.7 in flight, 1 instance. 120/min: 1 instance serves 60 → 10 in flight > 8.
    moments = [(t - START).total_seconds() for t, text in result.activities
               if "concurrency" in text]
    assert moments and moments[0] == 10 * 60 + 30
    assert any("desired 1 -> 2" in text for _, text in result.activities)
    # the new instance serves 2 min later, at 12:30; only then does the fleet sustain 120/min
    assert result.last_overload is not None
    assert result.last_overload <= START + dt.timedelta(minutes=13)


def test_the_concurrency_needs_the_capacity_models_figures() -> None:
    with pytest.raises(ValueError, match="needs concurrency_per_instance and request_seconds"):
        simulate(trace(60.0), concurrency_setup(8), ONE_PER_SECOND)


def test_with_several_tracking_policies_scale_in_needs_every_one() -> None:
    # After a burst to 10 instances, 10/min: invocations say 1 instance is plenty (1/min per
    # instance against 60); 10/min × 10 s = 1.7 in flight, 0.17 per model, is not below 90 % of
    # a 0.15 concurrency target, so that policy is not ready and nothing scales in.
    burst = (*[120.0] * 3, *[10.0] * 40)
    held = simulate(trace(*burst), concurrency_setup(0.15, with_invocations=60), CONCURRENT)
    assert held.samples[3].desired == 10
    assert held.samples[-1].desired == 10
    # At a 0.5 target both are ready after 15 low minutes: scale in to the larger proposal,
    # ceil(1.7 / 0.5) = 4, not the invocations policy's 1.
    agreed = simulate(trace(*burst), concurrency_setup(0.5, with_invocations=60), CONCURRENT)
    assert agreed.samples[-1].desired == 4
    alone = simulate(trace(*burst), setup(tracking=60), CONCURRENT)
    assert alone.samples[-1].desired == 1


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("minute,value\n", "the first non-comment line must be"),
     ("minute_start,invocations_per_min\n2026-12-06T12:00:00,5\n", "has no UTC offset"),
     ("minute_start,invocations_per_min\n2026-12-06T12:00:00+09:00,5\n"
      "2026-12-06T12:02:00+09:00,5\n", ":3: 2026-12-06T12:02:00+09:00 is not the minute after"),
     ("minute_start,invocations_per_min\n2026-12-06T12:00:00+09:00,-5\n", "minute 0 has -5.0"),
     ("minute_start,invocations_per_min\n2026-12-06T12:00:00+09:00,lots\n", ":2: ")],
)
def test_bad_trace_files_are_refused_with_the_line(tmp_path: Path, content: str,
                                                   fragment: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        load_trace(path)
