"""The roofline estimate of a decode profile: the closed loop's arithmetic, checked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from capacity_model import RooflineInputs, estimate_point
from capacity_model.roofline import request_seconds, step_seconds, ttft_seconds

INPUTS = RooflineInputs(weights_bytes=6e9, kv_bytes_per_token=100_000,
                        memory_bandwidth_gb_s=500, bandwidth_efficiency=0.8,
                        prefill_tokens_per_s=5000, decode_compute_tokens_per_s=1e6,
                        prompt_tokens=1000, cached_prompt_tokens=0, output_tokens=200,
                        ttft_p99_over_p50=2.0, tpot_p99_over_p50=1.1)


def test_a_decode_step_reads_the_weights_and_every_sequences_kv() -> None:
    # (6e9 + 4 × (1000 + 100) × 1e5) B ÷ (500 GB/s × 0.8) = 6.44e9 / 4e11 s
    assert step_seconds(INPUTS, 4) == pytest.approx(6.44e9 / 4e11)


def test_a_large_batch_hits_the_compute_roof() -> None:
    """B tokens a step at the compute roof: 64 tokens at 1,000 tokens/s take 64 ms, more than
    reading 6e9 + 64 × 1,100 × 1e4 B at 400 GB/s (32.6 ms)."""
    slow = dataclasses.replace(INPUTS, decode_compute_tokens_per_s=1000, kv_bytes_per_token=1e4)
    assert step_seconds(slow, 64) == pytest.approx(64 / 1000)
    assert step_seconds(slow, 1) == pytest.approx((6e9 + 1100 * 1e4) / 4e11)


def test_cached_prompt_tokens_are_read_but_not_computed() -> None:
    """A prefix-cache hit shortens the prefill (a = (P − C)/R) but the decode steps still read
    the whole prompt's KV."""
    cached = dataclasses.replace(INPUTS, cached_prompt_tokens=800)
    assert cached.prefill_seconds == pytest.approx(200 / 5000)
    assert step_seconds(cached, 8) == step_seconds(INPUTS, 8)
    assert ttft_seconds(cached, 1) == pytest.approx(200 / 5000 + step_seconds(INPUTS, 1))
    assert request_seconds(cached, 16) < request_seconds(INPUTS, 16)
    # Another request in the same batch waits the same queue for its own prefill.
    assert ttft_seconds(cached, 16, 1000) > ttft_seconds(cached, 16)
    with pytest.raises(ValueError, match="cached_prompt_tokens: 1000 is not accepted"):
        dataclasses.replace(INPUTS, cached_prompt_tokens=1000)


def test_one_request_alone_is_prefill_then_its_decode_steps() -> None:
    # B = 1: (T − a − d)(T − a) = O·d·T; T solves it and TPOT = (T − a − d)/O.
    a, d = 1000 / 5000, step_seconds(INPUTS, 1)
    duration = request_seconds(INPUTS, 1)
    assert (duration - a - d) * (duration - a) == pytest.approx(200 * d * duration)
    point = estimate_point(INPUTS, 1)
    assert point.tpot.p50_ms == pytest.approx((duration - a - d) / 200 * 1000)
    assert point.ttft.p50_ms == pytest.approx((a + d) * 1000)  # nobody else prefills
    assert point.ttft.p99_ms == pytest.approx(2 * point.ttft.p50_ms)
    assert point.tpot.p99_ms == pytest.approx(1.1 * point.tpot.p50_ms)
    assert point.status == "assumption"


def test_batching_slows_each_token_but_raises_throughput_toward_the_prefill_ceiling() -> None:
    sizes = [1, 4, 16, 64, 256]
    tpot = [estimate_point(INPUTS, b).tpot.p50_ms for b in sizes]
    ttft = [estimate_point(INPUTS, b).ttft.p50_ms for b in sizes]
    rates = [b / request_seconds(INPUTS, b) for b in sizes]
    assert tpot == sorted(tpot) and ttft == sorted(ttft)
    assert rates == sorted(rates)
    # Every request needs a = 0.2 s of prefill: never more than 5 requests per second.
    assert rates[-1] < 5
    assert all(tpot_ms >= step_seconds(INPUTS, b) * 1000 for tpot_ms, b in zip(tpot, sizes,
                                                                                 strict=True))


@pytest.mark.parametrize(("name", "value", "message"), [
    ("bandwidth_efficiency", 1.5, "bandwidth_efficiency: 1.5 is not accepted; accepted: (0, 1]"),
    ("prefill_tokens_per_s", 0, "prefill_tokens_per_s: 0 is not accepted"),
    ("tpot_p99_over_p50", 0.5, "tpot_p99_over_p50: 0.5 is not accepted; accepted: >= 1"),
    ("weights_bytes", math.nan, "weights_bytes: nan is not accepted"),
])
def test_inputs_are_checked(name: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"roofline input {name}") as info:
        RooflineInputs(**{**INPUTS.to_dict(), name: value})
    assert message in str(info.value)


def test_inputs_round_trip_and_refuse_unknown_keys() -> None:
    assert RooflineInputs.from_dict(INPUTS.to_dict()) == INPUTS
    with pytest.raises(ValueError, match=r"unknown \['colour'\]"):
        RooflineInputs.from_dict({**INPUTS.to_dict(), "colour": 1.0})
