"""Seed 001's criteria read as written (capacity_model/seeds.py): the method, on the shipped
plan — each figure recomputed from the plan's own parts, not pinned."""

from __future__ import annotations

import pytest

from capacity_model import LlmCapacity
from capacity_model.report import format_capacity
from capacity_model.seeds import (
    SEED_OUTPUT_TOKENS,
    SEED_PROMPT_TOKENS,
    SEED_REQUEST_TOKENS,
    _in_business,
)


def test_the_seeds_request_is_the_mean_of_their_examples() -> None:
    mean = sum(SEED_REQUEST_TOKENS) / len(SEED_REQUEST_TOKENS)
    assert pytest.approx(mean, abs=1) == SEED_PROMPT_TOKENS + SEED_OUTPUT_TOKENS


def test_both_mixes_are_read_side_by_side(prod: LlmCapacity) -> None:
    seeds, mine = prod.seed_readings
    assert (seeds.prompt_tokens, seeds.output_tokens) == (SEED_PROMPT_TOKENS,
                                                          SEED_OUTPUT_TOKENS)
    assert mine.prompt_tokens == pytest.approx(prod.mix.mean_prompt_tokens)
    assert mine.concurrency == prod.instance.concurrency  # the mix's row is the plan's own
    # Smaller requests: at least as many in flight, and a faster first token at 50.
    assert seeds.concurrency >= mine.concurrency
    assert seeds.ttft_p99_at_50_ms < mine.ttft_p99_at_50_ms
    assert seeds.answer_p99_at_50_ms > seeds.ttft_p99_at_50_ms


def test_the_fleet_criteria_follow_the_fleet(prod: LlmCapacity) -> None:
    fleet, criteria = prod.fleet, prod.fleet_criteria
    assert criteria is not None
    night = prod.profile.at(2)
    assert criteria.night_instances == min(fleet.off_peak.max_capacity, max(
        fleet.off_peak.min_capacity, fleet.instances_for(night)))
    assert 0 < criteria.business_load_over_sustainable <= 1
    assert criteria.queue_instances == fleet.instances_for(6000)
    assert criteria.queue_wait_p99_ms is not None and criteria.queue_wait_p99_ms > 0
    assert _in_business(fleet, 12) and not _in_business(fleet, 2)


def test_the_plan_prints_them(prod: LlmCapacity) -> None:
    text = format_capacity(prod)
    for fragment in ("Seed 001's criteria, as written", "concurrent requests per GPU >= 60",
                     "P99 < 2 s at 50 in flight", "30+-turn conversations within the SLA",
                     "GPU utilisation (nvidia-smi) in business hours > 75%",
                     "the plan's own measure, not the seed's: load over sustainable",
                     "queue wait p99 at 100 RPS < 150 ms", "LLM instances at 2 AM JST <= 2"):
        assert fragment in text, fragment
    assert ">= 60 thirty-turn" not in text and "30+-turn conversations per GPU" not in text


def test_utilisation_is_the_share_of_time_a_kernel_runs(prod: LlmCapacity) -> None:
    """nvidia-smi's utilisation (what the seed measures): a continuously batching engine runs
    a kernel whenever a request is in flight — 1 − e^−L at L in flight on average (Poisson),
    recomputed here hour by hour from the plan's own fleet."""
    import math

    from capacity_model.seeds import _clamped

    fleet, criteria = prod.fleet, prod.fleet_criteria
    assert criteria is not None
    busy = [1 - math.exp(-load / 60 / _clamped(fleet, load, hour)
                         * prod.instance.request_seconds)
            for hour, load in enumerate(prod.profile.hourly_invocations_per_min)
            if _in_business(fleet, hour)]
    assert criteria.kernel_busy_share == pytest.approx(sum(busy) / len(busy))
    assert criteria.kernel_busy_share > criteria.business_load_over_sustainable
