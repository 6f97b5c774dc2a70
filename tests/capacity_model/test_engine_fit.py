"""The fit of the roofline to a running engine (benchmarks/capacity_check.py): the method, on
profiles an exactly known engine would produce — not the CPU engine's noisy figures."""

from __future__ import annotations

import pytest

from capacity_model.decode_speed import DecodePoint, DecodeProfile, Latency
from capacity_model.engine_fit import (
    EngineFit,
    FitError,
    fit_engine,
    line_fit,
    open_loop_batch,
    ratio,
)
from capacity_model.roofline import request_seconds

STEP_S, PER_SEQ_S, PREFILL, OVERHEAD_S = 0.010, 0.002, 8000.0, 0.004


def profile(prompt: int, sizes: list[int], *, jitter: float = 1.0) -> DecodeProfile:
    """What an engine with a step of 10 ms + 2 ms a sequence, 8,000 prompt tokens a second and
    4 ms of HTTP per request shows at batch ``sizes``."""
    points = []
    for size in sizes:
        tpot = (STEP_S + PER_SEQ_S * size) * 1000
        ttft = (OVERHEAD_S + STEP_S + prompt / PREFILL) * 1000
        points.append(DecodePoint(size, Latency(ttft, ttft * jitter), Latency(tpot, tpot * 1.02),
                                  "measured", "synthetic"))
    return DecodeProfile(gpu="cpu", model="m", quantization="bf16", kv_cache_dtype="auto",
                         prompt_tokens=prompt, output_tokens=32, points=tuple(points))


def test_the_fit_recovers_the_engines_rates() -> None:
    fit = fit_engine(profile(24, [1, 2, 4, 8]), profile(600, [1], jitter=1.3))
    assert fit.step_overhead_s == pytest.approx(STEP_S)
    assert fit.decode_tokens_per_s == pytest.approx(1 / PER_SEQ_S)
    assert fit.prefill_tokens_per_s == pytest.approx(PREFILL)
    # The short prompt's TTFT: 4 ms of HTTP + its step (10 ms + 24 tokens' prefill).
    assert fit.request_overhead_s == pytest.approx(OVERHEAD_S)
    assert fit.ttft_jitter == pytest.approx(1.3)
    assert fit.tpot_jitter == pytest.approx(1.02)
    # On a shared CPU the request's overhead takes the engine's cores: 4 ms = 32 prompt tokens.
    assert fit.serial_request_tokens == pytest.approx(OVERHEAD_S * PREFILL)
    inputs = fit.inputs(prompt_tokens=100, cached_prompt_tokens=0, output_tokens=10,
                        max_num_batched_tokens=2048)
    assert inputs.prompt_tokens == pytest.approx(100 + 32)


def test_a_fit_that_cannot_be_made_says_why() -> None:
    with pytest.raises(FitError, match="two distinct batch sizes"):
        fit_engine(profile(24, [4]), profile(600, [1]))
    with pytest.raises(FitError, match="must be longer and slower"):
        fit_engine(profile(600, [1, 2]), profile(24, [1]))
    assert line_fit([(1, 3), (3, 7)]) == pytest.approx((1, 2))


def test_an_open_loop_rate_becomes_the_batch_littles_law_keeps_in_flight() -> None:
    fit = EngineFit(step_overhead_s=STEP_S, decode_tokens_per_s=1 / PER_SEQ_S,
                    prefill_tokens_per_s=PREFILL, request_overhead_s=0.0, ttft_jitter=1.0,
                    tpot_jitter=1.0)
    inputs = fit.inputs(prompt_tokens=200, cached_prompt_tokens=0, output_tokens=40,
                        max_num_batched_tokens=2048)
    batch = open_loop_batch(inputs, 2.0, 64)
    assert batch is not None
    assert batch / request_seconds(inputs, batch) == pytest.approx(2.0, rel=1e-6)
    most = 64 / request_seconds(inputs, 64)
    assert open_loop_batch(inputs, most * 1.01, 64) is None  # beyond the engine
    assert ratio(3, 2) == 1.5
