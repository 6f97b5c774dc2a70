"""From one instance to the fleet: headroom, targets, step bands, daily ranges, the calendar."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math

import pytest

from capacity_model import (
    DailyProfile,
    FleetError,
    FleetPolicy,
    InstanceLoad,
    StepBand,
    Surge,
    check_bands,
    fleet_plan,
)

FLAT_NIGHT = (600.0, 500, 400, 300, 300, 300, 400, 500, *([800.0] * 14), 900, 700)
PROFILE = DailyProfile(tuple(float(v) for v in FLAT_NIGHT), "test")
BANDS = (StepBand(0, 1, 2), StepBand(1, 3, 4), StepBand(3, None, 8))


def policy(**changes: object) -> FleetPolicy:
    base = FleetPolicy(min_capacity=2, max_capacity=20, time_zone="Asia/Tokyo",
                       off_peak_start=dt.time(1), business_hours_start=dt.time(8),
                       off_peak_surge_allowance=1.0, business_hours_surge_allowance=None,
                       step_bands=BANDS, step_evaluation_s=60, tracking_evaluation_s=180,
                       provisioning_s=360, unplanned_surge=Surge(1.5, 15))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


LOAD = InstanceLoad(sustainable_invocations_per_min=200.0, concurrency=50, source="test")


def test_headroom_is_the_surges_growth_while_the_fleet_reacts() -> None:
    # The step alarm (60 s) sees it first; 360 s later new instances serve: 7 of the 15 minutes
    # the surge takes to reach 1.5×, so the load has grown by 0.5 × 7/15.
    fleet = fleet_plan(LOAD, policy(), PROFILE)
    assert fleet.reaction_s == 420
    assert fleet.headroom == pytest.approx(0.5 * 7 / 15, abs=1e-4)
    # Without step scaling, target tracking's 3 minutes are the detection.
    assert fleet_plan(LOAD, policy(step_bands=()), PROFILE).reaction_s == 540
    # A surge faster than the reaction: all of it.
    assert fleet_plan(LOAD, policy(unplanned_surge=Surge(3, 5)), PROFILE).headroom == 2


def test_targets_keep_the_headroom_free_and_the_step_bands_are_multiples() -> None:
    fleet = fleet_plan(LOAD, policy(), PROFILE)
    target = math.floor(200 / (1 + fleet.headroom))
    assert fleet.target_invocations_per_instance_per_min == target == 162
    assert fleet.target_concurrent_requests_per_model == round(50 / (1 + fleet.headroom), 1)
    assert fleet.step_threshold_invocations_per_instance_per_min == target
    assert fleet.step_intervals == ((0.0, 162.0, 2), (162.0, 486.0, 4), (486.0, None, 8))
    unknown = fleet_plan(dataclasses.replace(LOAD, concurrency=None), policy(), PROFILE)
    assert unknown.target_concurrent_requests_per_model is None
    no_steps = fleet_plan(LOAD, policy(step_bands=()), PROFILE)
    assert (no_steps.step_threshold_invocations_per_instance_per_min, no_steps.step_intervals) \
        == (None, ())


def test_daily_ranges_follow_the_traffic_each_window_expects() -> None:
    fleet = fleet_plan(LOAD, policy(), PROFILE)
    # off-peak 01:00-08:00: hours 1..7, 300 to 500/min at 162 per instance
    assert (fleet.off_peak.quietest_invocations_per_min,
            fleet.off_peak.busiest_invocations_per_min) == (300, 500)
    assert fleet.off_peak.min_capacity == 2  # ceil(300/162) = 2, also the warm minimum
    assert fleet.off_peak.max_capacity == math.ceil(500 * 2 / 162) == 7
    # business hours 08:00-01:00 wrap midnight: hours 8..23 and 0 → 600-900
    assert (fleet.business_hours.quietest_invocations_per_min,
            fleet.business_hours.busiest_invocations_per_min) == (600, 900)
    assert fleet.business_hours.min_capacity == math.ceil(600 / 162) == 4
    assert fleet.business_hours.max_capacity == 20  # no allowance: the variant's maximum
    assert fleet.release_base_invocations_per_min == 900
    assert fleet.instances_for(900) == 6


def test_ranges_stay_within_the_variants_limits() -> None:
    tiny = fleet_plan(dataclasses.replace(LOAD, sustainable_invocations_per_min=20), policy(
        max_capacity=12), PROFILE)
    assert tiny.business_hours.min_capacity == 12 and tiny.off_peak.max_capacity == 12
    huge = fleet_plan(dataclasses.replace(LOAD, sustainable_invocations_per_min=1e5), policy(),
                      PROFILE)
    assert huge.off_peak.min_capacity == huge.business_hours.min_capacity == 2
    assert huge.off_peak.max_capacity == 2  # never below its own minimum


def test_the_calendar_model_is_the_fleets_numbers() -> None:
    fleet = fleet_plan(LOAD, policy(), PROFILE)
    model = fleet.calendar_model()
    assert (model.base_invocations_per_min, model.per_instance_invocations_per_min,
            model.headroom) == (900, 200, fleet.headroom)
    assert (model.off_peak.min_capacity, model.off_peak.max_capacity) == (
        fleet.off_peak.min_capacity, fleet.off_peak.max_capacity)
    assert model.off_peak.start == dt.time(1) and model.business_hours.start == dt.time(8)
    # ×3: 900 × 3 ÷ 200 × (1 + headroom), ceil
    assert model.required_instances(3.0) == math.ceil(2700 / 200 * (1 + fleet.headroom))


def test_profile_lookups_wrap_midnight_and_interpolate() -> None:
    assert PROFILE.at(dt.time(0, 30)) == pytest.approx(550)
    assert PROFILE.at(23.5) == pytest.approx(650)  # 700 → 600 at midnight
    assert PROFILE.window(dt.time(22), dt.time(2)) == [900, 700, 600, 500]
    assert PROFILE.window(dt.time(1, 30), dt.time(3)) == [500, 400]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: DailyProfile((1.0,) * 23, "x"), "23 hourly values; accepted: 24"),
    (lambda: DailyProfile((0.0,) * 24, "x"), "every hour is 0"),
    (lambda: DailyProfile((1.0,) * 5 + (-1.0,) + (1.0,) * 18, "x"), "hour 05:00 has -1.0"),
    (lambda: Surge(0.5, 15), "surge multiplier 0.5; accepted: >= 1"),
    (lambda: InstanceLoad(0, None, "x"), "sustainable_invocations_per_min 0"),
    (lambda: policy(min_capacity=5, max_capacity=2), "min_capacity 5 / max_capacity 2"),
    (lambda: policy(off_peak_start=dt.time(8)), "start at the same time"),
    (lambda: check_bands((StepBand(0, 1, 2), StepBand(2, None, 4))),
     "bands[0].upper (1) must equal bands[1].lower (2)"),
    (lambda: check_bands((StepBand(0, 1, 2),)), "the last band's upper must be absent"),
])
def test_bad_inputs_name_what_is_wrong(build: object, message: str) -> None:
    with pytest.raises(FleetError) as info:
        build()  # type: ignore[operator]
    assert message in str(info.value)
