"""The roofline estimate of a decode profile: the closed loop's arithmetic, checked by hand."""

from __future__ import annotations

import math

import pytest

from capacity_model import RooflineInputs, estimate_point
from capacity_model.roofline import request_seconds, step_seconds

INPUTS = RooflineInputs(weights_bytes=6e9, kv_bytes_per_token=100_000,
                        memory_bandwidth_gb_s=500, bandwidth_efficiency=0.8,
                        prefill_tokens_per_s=5000, prompt_tokens=1000, output_tokens=200,
                        ttft_p99_over_p50=2.0, tpot_p99_over_p50=1.1)


def test_a_decode_step_reads_the_weights_and_every_sequences_kv() -> None:
    # (6e9 + 4 × (1000 + 100) × 1e5) B ÷ (500 GB/s × 0.8) = 6.44e9 / 4e11 s
    assert step_seconds(INPUTS, 4) == pytest.approx(6.44e9 / 4e11)


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
        RooflineInputs(**{**INPUTS.to_dict(), "prompt_tokens": 1000, "output_tokens": 200,
                          name: value})
    assert message in str(info.value)


def test_inputs_round_trip_and_refuse_unknown_keys() -> None:
    assert RooflineInputs.from_dict(INPUTS.to_dict()) == INPUTS
    with pytest.raises(ValueError, match=r"unknown \['colour'\]"):
        RooflineInputs.from_dict({**INPUTS.to_dict(), "colour": 1.0})
