"""The roofline estimate of a decode profile: chunked prefill's arithmetic, checked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from capacity_model import RooflineInputs, estimate_point
from capacity_model.roofline import (
    loop_state,
    prefill_of,
    queue_wait_seconds,
    request_seconds,
    step_seconds,
    ttft_latency,
    ttft_seconds,
)

INPUTS = RooflineInputs(weights_bytes=6e9, kv_bytes_per_token=100_000,
                        memory_bandwidth_gb_s=500, bandwidth_efficiency=0.8,
                        prefill_tokens_per_s=5000, decode_compute_tokens_per_s=1e6,
                        prompt_tokens=1000, cached_prompt_tokens=0, output_tokens=200,
                        ttft_p99_over_p50=1.1, tpot_p99_over_p50=1.05,
                        max_num_batched_tokens=2048)


def test_a_decode_step_reads_the_weights_and_every_sequences_kv() -> None:
    # (6e9 + 4 × (1000 + 100) × 1e5) B ÷ (500 GB/s × 0.8) = 6.44e9 / 4e11 s
    assert step_seconds(INPUTS, 4) == pytest.approx(6.44e9 / 4e11)


def test_a_step_takes_the_longer_of_its_reads_and_all_its_tokens_compute() -> None:
    """Prefill tokens share the step with the decodes: 500 prompt tokens at 5,000 a second
    (0.1 s) outlast the reads (16 ms), so the step is compute-bound; 10 tokens ride free."""
    assert step_seconds(INPUTS, 4, 500) == pytest.approx(4 / 1e6 + 500 / 5000)
    assert step_seconds(INPUTS, 4, 10) == step_seconds(INPUTS, 4)
    slow = dataclasses.replace(INPUTS, decode_compute_tokens_per_s=1000, kv_bytes_per_token=1e4)
    assert step_seconds(slow, 64) == pytest.approx(64 / 1000)
    with_overhead = dataclasses.replace(INPUTS, step_overhead_s=0.005)
    assert step_seconds(with_overhead, 4) == pytest.approx(0.005 + 6.44e9 / 4e11)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks() -> None:
    """vLLM gives a step's token budget to the decodes first, the rest to a prefill chunk:
    3,000 tokens beside 99 decodes in 2,048-token steps take ⌈3,000 / 1,950⌉ = 2 chunks."""
    long = dataclasses.replace(INPUTS, prompt_tokens=3000)
    prefill = prefill_of(long, 100)
    assert prefill.chunks == 2
    assert prefill.step_s == pytest.approx(step_seconds(long, 99, 1500))
    assert prefill.extra_s == pytest.approx(2 * (prefill.step_s - step_seconds(long, 100)))
    assert prefill_of(long, 1).chunks == 2  # 3,000 > 2,048 even alone
    assert prefill_of(INPUTS, 1).chunks == 1


def test_one_request_alone_is_its_prefill_step_then_its_decode_steps() -> None:
    """B = 1: the prefill step samples the first token; O − 1 decode steps follow."""
    d = step_seconds(INPUTS, 1)
    a = step_seconds(INPUTS, 0, 1000)
    assert request_seconds(INPUTS, 1) == pytest.approx(a + 199 * d)
    point = estimate_point(INPUTS, 1)
    assert point.ttft.p50_ms == pytest.approx(a * 1000)  # nobody else prefills or runs
    assert point.ttft.p99_ms == pytest.approx(1.1 * a * 1000)
    assert point.tpot.p50_ms == pytest.approx(d * 1000)
    assert point.tpot.p99_ms == pytest.approx(1.05 * d * 1000)
    assert point.status == "assumption"


def test_the_closed_loop_balances_its_steps_and_the_other_prefills() -> None:
    """T = K·d + B·e; the others' prefills take ρ = (B − 1)·e / T of the time, and a decoding
    request's token waits d / (1 − ρ)."""
    state = loop_state(INPUTS, 16)
    d, e = state.decode_step_s, state.prefill.extra_s
    assert state.request_s == pytest.approx((1 + 199) * d + 16 * e)
    assert state.prefill_share == pytest.approx(15 * e / state.request_s)
    assert estimate_point(INPUTS, 16).tpot.p50_ms == pytest.approx(
        d / (1 - state.prefill_share) * 1000)


def test_the_tail_grows_with_the_load_not_by_a_constant() -> None:
    ratios = [estimate_point(INPUTS, b).ttft.p99_ms / estimate_point(INPUTS, b).ttft.p50_ms
              for b in (1, 4, 16, 64)]
    assert ratios[0] == pytest.approx(1.1)
    assert ratios == sorted(ratios) and ratios[-1] > 2


def test_the_queue_wait_is_an_md1_tail() -> None:
    """Waits with probability ρ, then exponentially with mean e / (2(1 − ρ))."""
    assert queue_wait_seconds(0.3, 0.2, 0.5) == 0  # fewer than half wait at all
    assert queue_wait_seconds(0.6, 0.2, 0.5) == pytest.approx(0.2 / 0.8 * math.log(1.2))
    assert queue_wait_seconds(0.6, 0.2, 0.99) == pytest.approx(0.2 / 0.8 * math.log(60))


def test_cached_prompt_tokens_are_read_but_not_computed() -> None:
    cached = dataclasses.replace(INPUTS, cached_prompt_tokens=800)
    assert cached.prefill_seconds == pytest.approx(200 / 5000)
    assert step_seconds(cached, 8) == step_seconds(INPUTS, 8)
    assert ttft_seconds(cached, 1) == pytest.approx(step_seconds(cached, 0, 200))
    assert request_seconds(cached, 16) < request_seconds(INPUTS, 16)
    # Another request in the same batch waits the same queue for its own prefill.
    assert ttft_latency(cached, 16, 1000).p50_ms > ttft_latency(cached, 16).p50_ms
    with pytest.raises(ValueError, match="cached_prompt_tokens: 1000 is not accepted"):
        dataclasses.replace(INPUTS, cached_prompt_tokens=1000)


def test_batching_slows_each_token_but_raises_throughput_toward_the_prefill_ceiling() -> None:
    sizes = [1, 4, 16, 64, 256]
    tpot = [estimate_point(INPUTS, b).tpot.p50_ms for b in sizes]
    ttft = [estimate_point(INPUTS, b).ttft.p50_ms for b in sizes]
    rates = [b / request_seconds(INPUTS, b) for b in sizes]
    assert tpot == sorted(tpot) and ttft == sorted(ttft)
    assert rates == sorted(rates)
    # Every request needs 1,000 / 5,000 = 0.2 s of compute: never more than 5 a second.
    assert rates[-1] < 5
    assert all(tpot_ms >= step_seconds(INPUTS, b) * 1000 for tpot_ms, b in zip(tpot, sizes,
                                                                                 strict=True))


@pytest.mark.parametrize(("name", "value", "message"), [
    ("bandwidth_efficiency", 1.5, "bandwidth_efficiency: 1.5 is not accepted; accepted: (0, 1]"),
    ("prefill_tokens_per_s", 0, "prefill_tokens_per_s: 0 is not accepted"),
    ("tpot_p99_over_p50", 0.5, "tpot_p99_over_p50: 0.5 is not accepted; accepted: >= 1"),
    ("weights_bytes", math.nan, "weights_bytes: nan is not accepted"),
    ("max_num_batched_tokens", 0, "max_num_batched_tokens: 0 is not accepted"),
    ("step_overhead_s", -1, "step_overhead_s: -1 is not accepted; accepted: a number >= 0"),
])
def test_inputs_are_checked(name: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"roofline input {name}") as info:
        RooflineInputs(**{**INPUTS.to_dict(), name: value})
    assert message in str(info.value)


def test_inputs_round_trip_and_refuse_unknown_keys() -> None:
    assert RooflineInputs.from_dict(INPUTS.to_dict()) == INPUTS
    with pytest.raises(ValueError, match=r"unknown \['colour'\]"):
        RooflineInputs.from_dict({**INPUTS.to_dict(), "colour": 1.0})
