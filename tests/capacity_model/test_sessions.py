"""Sticky sessions: affinity and its TTL, LRU retention, the load spread pinning causes, and what
it does when the fleet grows or shrinks."""

from __future__ import annotations

import math
import random

import pytest

from capacity_model.sessions import (
    SessionError,
    affinity_share,
    hold_seconds,
    pinning_spread,
    recommended_ttl_s,
    retention_share,
    scale_effects,
)


def test_the_ttl_is_the_fleets_reaction_time_in_whole_minutes() -> None:
    # 30 s of detection (three 10-second datapoints) + 360 s of provisioning = 390 s → 6 min.
    assert recommended_ttl_s(390) == 360
    assert recommended_ttl_s(30) == 60  # never below a minute
    with pytest.raises(SessionError, match="reaction_s 0; accepted: a number > 0"):
        recommended_ttl_s(0)


def test_affinity_is_all_but_the_turns_after_an_expiry_or_one_in_n() -> None:
    assert affinity_share(sessions=True, turn_interval_s=60, ttl_s=360,
                          instances=4) == pytest.approx(1 - 60 / 360)
    assert affinity_share(sessions=True, turn_interval_s=600, ttl_s=360, instances=4) == 0
    assert affinity_share(sessions=False, turn_interval_s=60, ttl_s=360,
                          instances=4) == pytest.approx(0.25)


def test_lru_keeps_a_prefix_while_fewer_blocks_are_handed_out_than_are_free() -> None:
    # 6,144 blocks, 3,600 in use, 100 allocated a second: a freed block survives 25.44 s.
    hold = hold_seconds(pool_blocks=6144, in_use_blocks=3600, allocated_blocks_per_s=100)
    assert hold == pytest.approx(25.44)
    assert hold_seconds(pool_blocks=100, in_use_blocks=150, allocated_blocks_per_s=1) == 0
    # exponential think time, mean 45 s: P(think < 25.44 s)
    assert retention_share(hold_s=hold, think_time_s=45) == pytest.approx(
        1 - math.exp(-25.44 / 45))
    assert retention_share(hold_s=0, think_time_s=45) == 0


def test_pinned_instances_spread_wider_than_pooled_ones_as_a_simulation_shows() -> None:
    """Each instance's in-flight count is the sum of its sessions' (each busy a share p of the
    time): a Monte Carlo of 20,000 instants agrees with the normal approximation within a few
    per cent, and pooling N instances narrows it by √N."""
    spread = pinning_spread(target_concurrency=8, sustainable_concurrency=10,
                            active_share=0.1, instances=9)
    assert spread.sessions_per_instance == pytest.approx(80)
    rng = random.Random(22)
    draws = sorted(sum(rng.random() < 0.1 for _ in range(80)) for _ in range(20_000))
    simulated_p99 = draws[int(0.99 * len(draws))] / 8
    assert spread.p99_over_mean_pinned == pytest.approx(simulated_p99, rel=0.08)
    assert spread.p99_over_mean_pooled - 1 == pytest.approx(
        (spread.p99_over_mean_pinned - 1) / 3)
    overloaded = sum(d > 10 for d in draws) / len(draws)
    assert spread.overload_share_pinned == pytest.approx(overloaded, abs=0.08)
    assert spread.overload_share_pooled < spread.overload_share_pinned


def test_scale_out_drains_within_a_ttl_and_scale_in_costs_one_prefill_per_session() -> None:
    effects = scale_effects(ttl_s=360, turn_interval_s=60, sessions_per_instance=100,
                            cached_history_tokens=1000, prefill_tokens_per_s=2500)
    assert effects.drain_s == 360
    assert effects.repin_share == pytest.approx(60 / 360)
    assert effects.scale_in_prefill_s == pytest.approx(100 * 1000 / 2500)  # 40 GPU-seconds
