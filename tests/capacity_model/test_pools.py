"""Seed 002's separate pools, sized and priced with the same capacity model as the endpoint."""

from __future__ import annotations

import datetime as dt

import pytest

from capacity_model import DailyProfile, FleetPlan, LlmCapacity
from capacity_model.fleet import FloorPlan
from capacity_model.pools import (
    PoolSpec,
    evaluate_pools,
    expected_day_instances,
    seed_002_options,
)
from gpu_budget import INSTANCE_CATALOG
from stacks.settings import load_settings


def test_the_expected_day_takes_each_hours_floor_or_its_load_at_the_target() -> None:
    floors = (FloorPlan("off-peak", dt.time(1), 2, 6, 0, 0),
              FloorPlan("business-hours", dt.time(8), 4, 20, 0, 0))
    fleet = FleetPlan(per_instance_invocations_per_min=120, headroom=0.2, reaction_s=390,
                      target_invocations_per_instance_per_min=100,
                      target_concurrent_requests_per_model=None,
                      step_threshold_invocations_per_instance_per_min=None, step_intervals=(),
                      off_peak=floors[0], business_hours=floors[1],
                      release_base_invocations_per_min=900, min_capacity=2, max_capacity=10,
                      time_zone="Asia/Tokyo", source="test")
    loads = [50.0] * 24
    loads[0], loads[3], loads[12], loads[20] = 150, 250, 2000, 350
    hours = expected_day_instances(fleet, DailyProfile(tuple(loads), "test"))
    assert hours[0] == 4    # 00:00 is business hours (from 08:00 to 01:00): floor 4
    assert hours[3] == 3    # night: ⌈250 / 100⌉ = 3 above the floor of 2
    assert hours[5] == 2    # night floor
    assert hours[12] == 10  # 20 needed, capped at the maximum
    assert hours[20] == 4   # ⌈350 / 100⌉ = 4 = the day floor


def test_one_pool_as_configured_is_the_endpoints_own_plan(prod: LlmCapacity) -> None:
    settings = load_settings("prod").llm
    options = evaluate_pools(prod, settings.memory_plan, settings.decode_speed_table(),
                             seed_002_options("ml.g5.xlarge", "ml.g6e.xlarge"))
    configured = options[0]
    [pool] = configured.pools
    assert pool.traffic_share == pytest.approx(1)
    assert (pool.capacity.instance.sustainable_invocations_per_min
            == prod.instance.sustainable_invocations_per_min)
    assert pool.capacity.fleet.off_peak == prod.fleet.off_peak
    assert configured.xl_ttft_p99_ms == prod.instance.latency_of("XL").time_to_first_token_p99_ms
    assert pool.monthly_usd == pytest.approx(
        sum(expected_day_instances(prod.fleet, prod.profile))
        * INSTANCE_CATALOG["ml.g5.xlarge"].on_demand_usd_per_hour * 730 / 24)
    split = options[1]
    assert sum(p.traffic_share for p in split.pools) == pytest.approx(1)
    xl = next(p for p in split.pools if p.spec.buckets == ("XL",))
    assert xl.capacity.profile.peak == pytest.approx(prod.profile.peak * 0.15)
    assert xl.capacity.mix.share_of("XL") == 1
    # Every option keeps two warm instances per pool.
    assert all(p.night_min >= 2 for option in options for p in option.pools)


def test_an_option_must_serve_every_bucket_once(prod: LlmCapacity) -> None:
    settings = load_settings("prod").llm
    with pytest.raises(ValueError, match=r"serves \['L', 'M', 'S'\]"):
        evaluate_pools(prod, settings.memory_plan, settings.decode_speed_table(),
                       [("no XL", [PoolSpec("short", "ml.g5.xlarge", ("S", "M", "L"))])])
