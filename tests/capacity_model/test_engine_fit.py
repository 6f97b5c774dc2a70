"""The fit of the roofline to a running engine (benchmarks/capacity_check.py): the method, on
profiles an exactly known engine would produce — not the CPU engine's noisy figures."""

from __future__ import annotations

import pytest

from capacity_model.decode_speed import DecodePoint, DecodeProfile, Latency
from capacity_model.engine_fit import (
    ClientCost,
    EngineFit,
    FitError,
    fit_engine,
    line_fit,
    open_loop_batch,
    ratio,
)
from capacity_model.roofline import request_seconds

STEP_S, PER_SEQ_S, PREFILL, FRONT_S = 0.010, 0.002, 8000.0, 0.004
ANSWER = 32


def profile(prompt: int, sizes: list[int], *, jitter: float = 1.0,
            interference: bool = True) -> DecodeProfile:
    """What an engine with a step of 10 ms + 2 ms a sequence, 8,000 prompt tokens a second and
    4 ms of front end per request on its own cores shows at batch ``sizes``: a closed loop's
    TPOT carries the other requests' front ends and prefills, one each per answer of
    ``ANSWER`` tokens."""
    points = []
    for size in sizes:
        tpot = STEP_S + PER_SEQ_S * size
        if interference:
            tpot += (size - 1) / ANSWER * (FRONT_S + prompt / PREFILL)
        ttft = (FRONT_S + STEP_S + prompt / PREFILL) * 1000
        points.append(DecodePoint(size, Latency(ttft, ttft * jitter),
                                  Latency(tpot * 1000, tpot * 1000 * 1.02), "measured",
                                  "synthetic"))
    return DecodeProfile(gpu="cpu", model="m", quantization="bf16", kv_cache_dtype="auto",
                         prompt_tokens=prompt, output_tokens=ANSWER, points=tuple(points))


def alone(*prompts: int) -> list[DecodeProfile]:
    """Single-request profiles at ``prompts`` (the longest with a TTFT p99 1.3 × its p50)."""
    return [profile(p, [1], jitter=1.3 if p == max(prompts) else 1.0) for p in prompts]


def test_the_fit_recovers_the_engines_rates() -> None:
    fit = fit_engine(profile(240, [1, 2, 8, 24]), alone(80, 240, 480))
    assert fit.step_overhead_s == pytest.approx(STEP_S)
    assert fit.decode_tokens_per_s == pytest.approx(1 / PER_SEQ_S)
    assert fit.prefill_tokens_per_s == pytest.approx(PREFILL)
    # The single requests' TTFT line: 4 ms of front end + the step (10 ms) + P / R.
    assert fit.front_end_s == pytest.approx(FRONT_S)
    assert fit.ttft_jitter == pytest.approx(1.3)
    assert fit.tpot_jitter == pytest.approx(1.02)
    # The front end is the simulation's time, not prompt tokens the roofline prefills.
    inputs = fit.inputs(prompt_tokens=100, cached_prompt_tokens=0, output_tokens=10,
                        max_num_batched_tokens=2048)
    assert inputs.prompt_tokens == 100


def test_the_decode_step_is_fitted_without_the_other_requests_prefills() -> None:
    """Read as it is, a closed loop's TPOT carries (B - 1) / n front ends and prefills a
    token: the step fitted through it would grow 1.06 ms a sequence too fast here."""
    fit = fit_engine(profile(240, [1, 2, 8, 24]), alone(80, 240, 480))
    assert 1 / fit.decode_tokens_per_s == pytest.approx(PER_SEQ_S)
    plain = fit_engine(profile(240, [1, 2, 8, 24], interference=False), alone(80, 240, 480))
    assert 1 / plain.decode_tokens_per_s < PER_SEQ_S  # the correction is applied, not assumed


def test_a_fit_that_cannot_be_made_says_why() -> None:
    with pytest.raises(FitError, match="two distinct batch sizes"):
        fit_engine(profile(24, [4]), alone(80, 240, 480))
    with pytest.raises(FitError, match="three prompt lengths"):
        fit_engine(profile(24, [1, 2]), alone(80, 480))
    flat = [profile(p, [1]) for p in (80, 240, 480)]
    flat = [DecodeProfile(gpu="cpu", model="m", quantization="bf16", kv_cache_dtype="auto",
                          prompt_tokens=p.prompt_tokens, output_tokens=4,
                          points=(DecodePoint(1, Latency(20.0, 20.0), Latency(5.0, 5.0),
                                              "measured", "synthetic"),))
            for p in flat]
    with pytest.raises(FitError, match="does not grow with the prompt"):
        fit_engine(profile(24, [1, 2]), flat)
    assert line_fit([(1, 3), (3, 7)]) == pytest.approx((1, 2))


def test_an_open_loop_rate_becomes_the_batch_littles_law_keeps_in_flight() -> None:
    fit = EngineFit(step_overhead_s=STEP_S, decode_tokens_per_s=1 / PER_SEQ_S,
                    prefill_tokens_per_s=PREFILL, front_end_s=0.0, ttft_jitter=1.0,
                    tpot_jitter=1.0)
    inputs = fit.inputs(prompt_tokens=200, cached_prompt_tokens=0, output_tokens=40,
                        max_num_batched_tokens=2048)
    batch = open_loop_batch(inputs, 2.0, 64)
    assert batch is not None
    assert batch / request_seconds(inputs, batch) == pytest.approx(2.0, rel=1e-6)
    most = 64 / request_seconds(inputs, 64)
    assert open_loop_batch(inputs, most * 1.01, 64) is None  # beyond the engine
    assert ratio(3, 2) == 1.5


def test_the_clients_cpu_is_split_into_a_request_and_a_token() -> None:
    """Two sets of requests with different answer lengths: 2 ms a request and 50 µs a token
    recovered; sets that cannot be told apart give no cost rather than a guess."""
    cost = ClientCost
    first = (105 * 0.002 + 105 * 73 * 50e-6, 105, 105 * 73)
    second = (39 * 0.002 + 39 * 4 * 50e-6, 39, 39 * 4)
    solved = cost.solve(first, second)
    assert solved.per_request_s == pytest.approx(0.002)
    assert solved.per_token_s == pytest.approx(50e-6)
    assert cost.solve((1.0, 10, 40), (2.0, 20, 80)) == cost(0.0, 0.0)
