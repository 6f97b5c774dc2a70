"""The simulated tail (capacity_model/queue_sim.py): it reproduces what can be computed by hand,
it grows with the batch and the long prompts, and the plan's in-flight cap is the smaller of
the KV pool's and the simulated SLO's batch."""

from __future__ import annotations

import pytest

from capacity_model import LlmCapacity
from capacity_model.queue_sim import (
    RequestClass,
    SimulationError,
    quantile,
    simulate,
    simulate_open,
    slo_limit,
)
from capacity_model.roofline import RooflineInputs, step_seconds


def _inputs(**overrides: float) -> RooflineInputs:
    values = {"weights_bytes": 5e9, "kv_bytes_per_token": 131072.0,
              "memory_bandwidth_gb_s": 600.0, "bandwidth_efficiency": 0.8,
              "prefill_tokens_per_s": 3600.0, "decode_compute_tokens_per_s": 3400.0,
              "prompt_tokens": 600.0, "cached_prompt_tokens": 0.0, "output_tokens": 100.0,
              "ttft_p99_over_p50": 1.0, "tpot_p99_over_p50": 1.0,
              "max_num_batched_tokens": 2048.0}
    values.update(overrides)
    return RooflineInputs(**values)


def test_one_request_alone_is_its_own_prefill_and_decode_steps() -> None:
    """Batch 1, no jitter: the first token is the prefill step (the arrival lands a uniform
    share into the step before, so the wait is under one step), every token after it one
    decode step."""
    inputs = _inputs()
    result = simulate(inputs, [RequestClass("M", 1.0, 600, 50, spread=0.0)], 1, requests=200)
    prefill = step_seconds(inputs, 0, 600)
    decode = step_seconds(inputs, 1)
    assert result.tpot.p50_ms == pytest.approx(1000 * decode, abs=0.05)
    assert 1000 * prefill <= result.ttft.p50_ms <= 1000 * (prefill + decode)


def test_long_prompts_wait_longer_and_the_tail_grows_with_the_batch() -> None:
    inputs = _inputs()
    mix = [RequestClass("S", 0.85, 100, 100), RequestClass("XL", 0.15, 2500, 100)]
    small, large = (simulate(inputs, mix, size, requests=2000) for size in (8, 48))
    assert small.ttft_of("XL").p99_ms > small.ttft_of("S").p99_ms
    assert large.ttft.p99_ms > small.ttft.p99_ms
    assert large.tpot.p50_ms > small.tpot.p50_ms
    assert large.throughput_per_min > small.throughput_per_min


def test_the_mean_prompt_hides_the_tail_of_the_real_mix() -> None:
    """The same mean prompt as one bucket or as short and long ones: the mix's own sizes
    give the longer first-token p99 (what issue 39 found the closed form missed)."""
    inputs = _inputs()
    mean = [RequestClass("M", 1.0, 600, 100)]
    real = [RequestClass("S", 0.8, 150, 100), RequestClass("XL", 0.2, 2400, 100)]
    assert (simulate(inputs, real, 32, requests=2000).ttft.p99_ms
            > simulate(inputs, mean, 32, requests=2000).ttft.p99_ms)


def test_jitter_sets_the_unloaded_ratio() -> None:
    inputs = _inputs(tpot_p99_over_p50=1.3)
    result = simulate(inputs, [RequestClass("M", 1.0, 300, 60, spread=0.0)], 1, requests=3000)
    assert result.tpot.p99_ms / result.tpot.p50_ms == pytest.approx(1.3, rel=0.08)


def test_slo_limit_is_the_largest_batch_that_meets_both_slos() -> None:
    inputs = _inputs()
    mix = [RequestClass("S", 0.85, 100, 100), RequestClass("XL", 0.15, 2500, 100)]
    limit, run = slo_limit(inputs, mix, ttft_p99_ms=900, tpot_p99_ms=1000, max_batch=64,
                           requests=1500)
    assert 1 <= limit < 64 and run.batch_size == limit
    assert run.ttft.p99_ms <= 900
    assert simulate(inputs, mix, limit + 1, requests=1500).ttft.p99_ms > 900
    nothing, _ = slo_limit(inputs, mix, ttft_p99_ms=1, tpot_p99_ms=1000, max_batch=64,
                           requests=500)
    assert nothing == 0


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(SimulationError, match="share"):
        RequestClass("S", 0.0, 100, 10)
    with pytest.raises(SimulationError, match="batch_size"):
        simulate(_inputs(), [RequestClass("S", 1.0, 100, 10)], 0)
    with pytest.raises(SimulationError, match="spread"):
        RequestClass("S", 1.0, 100, 10, spread=1.0)
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_the_front_end_is_a_queue_requests_pass_one_at_a_time() -> None:
    """The front end is a FIFO server, not latency added to each request: alone, a request's
    first token is 10 ms later; under Poisson arrivals at 80 % of its 100 a second, requests
    also wait for each other there — the M/D/1 queue's mean wait, ρ / (2μ(1 − ρ)) = 20 ms —
    on an engine fast enough (1 ms steps) not to be the bottleneck."""
    inputs = _inputs()
    klass = [RequestClass("M", 1.0, 100, 200, spread=0.0)]
    alone = simulate(inputs, klass, 1, requests=200, front_end_s=0.010)
    alone_plain = simulate(inputs, klass, 1, requests=200)
    assert alone.ttft.p50_ms == pytest.approx(alone_plain.ttft.p50_ms + 10, abs=0.5)
    fast = _inputs(step_overhead_s=0.001, weights_bytes=1.0, prefill_tokens_per_s=1e9,
                   decode_compute_tokens_per_s=1e9)
    short = [RequestClass("M", 1.0, 10, 2, spread=0.0)]
    engine_only = simulate_open(fast, short, 80.0, requests=6000).request_s
    queued = simulate_open(fast, short, 80.0, requests=6000, front_end_s=0.010)
    assert engine_only < 0.004
    # 29.7-30.7 ms over four seeds: the wait, the service, a share of a step at the engine.
    assert queued.request_s - engine_only == pytest.approx(0.020 + 0.010, rel=0.06)
    with pytest.raises(SimulationError, match="front_end_s"):
        simulate(inputs, klass, 8, requests=400, front_end_s=-1.0)
    with pytest.raises(SimulationError, match="shared_cores_s"):
        simulate(inputs, klass, 8, requests=400, shared_cores_s=float("nan"))


def test_a_front_end_on_the_engines_cores_lengthens_its_steps() -> None:
    """``shared_cores_s``: a request's host work is taken from the engine (the CPU host), so a
    closed loop of 8 short requests, whose front end takes 10 ms each of the engine's cores,
    finishes fewer a minute than with the front end on cores of its own — by about the engine
    time it takes, not more."""
    inputs = _inputs()
    klass = [RequestClass("M", 1.0, 100, 20)]
    apart = simulate(inputs, klass, 8, requests=2000, front_end_s=0.010)
    shared = simulate(inputs, klass, 8, requests=2000, front_end_s=0.010,
                      shared_cores_s=0.010)
    per_s = apart.throughput_per_min / 60
    assert shared.throughput_per_min < apart.throughput_per_min
    # Each request takes 10 ms of the engine's time: at ``per_s`` a second the engine keeps
    # 1 - per_s × 10 ms of itself; the closed loop slows by at most that (its front-end wait
    # overlaps the steps it lengthens).
    assert shared.throughput_per_min / apart.throughput_per_min >= 1 - per_s * 0.010 - 0.03
    assert shared.tpot.p50_ms > apart.tpot.p50_ms


def test_host_work_shares_the_cores_over_the_next_steps_not_one() -> None:
    """100 ms of host work a request, one request at a time: the cores are shared one for one,
    so the prefill step (~28 ms) lasts twice as long rather than 100 ms longer, and the rest
    of the work slows the decode steps after it: the request as a whole still takes about the
    100 ms longer that the work costs."""
    inputs = _inputs()
    klass = [RequestClass("M", 1.0, 100, 40, spread=0.0)]
    alone = simulate(inputs, klass, 1, requests=300)
    shared = simulate(inputs, klass, 1, requests=300, shared_cores_s=0.100)
    prefill_ms = 1000 * step_seconds(inputs, 0, 100)
    assert shared.ttft.p50_ms - alone.ttft.p50_ms <= prefill_ms + 1
    assert 1000 * (shared.request_s - alone.request_s) == pytest.approx(100, rel=0.1)


def test_an_open_loop_keeps_littles_law_and_refuses_a_rate_beyond_the_engine() -> None:
    """Poisson arrivals: the throughput is the arrival rate, what is in flight is the rate
    times the time a request lasts, and the random gaps make a longer first-token tail than
    a closed loop holding the same number in flight."""
    inputs = _inputs()
    mix = [RequestClass("S", 0.85, 100, 100), RequestClass("XL", 0.15, 2500, 100)]
    rate = 0.6 * simulate(inputs, mix, 32, requests=2000).throughput_per_min / 60
    run = simulate_open(inputs, mix, rate, requests=3000)
    assert run.throughput_per_min / 60 == pytest.approx(rate, rel=0.05)
    assert run.in_flight == pytest.approx(rate * run.request_s, rel=0.05)
    closed = simulate(inputs, mix, max(1, round(run.in_flight)), requests=3000)
    assert run.ttft.p99_ms > closed.ttft.p99_ms
    with pytest.raises(SimulationError, match="outrun the engine"):
        simulate_open(inputs, mix, 20 * rate, requests=500)
    with pytest.raises(SimulationError, match="per_second"):
        simulate_open(inputs, mix, 0.0)


def test_identical_requests_move_in_waves_unless_answers_vary() -> None:
    """A closed loop of one request shape with every answer alike keeps its arrivals in
    lock-step (a wave of prefills every answer-length): the spread breaks the waves, keeps the
    throughput and shortens the first token's wait."""
    inputs = _inputs()
    varied = simulate(inputs, [RequestClass("M", 1.0, 400, 70)], 48, requests=3000)
    alike = simulate(inputs, [RequestClass("M", 1.0, 400, 70, spread=0.0)], 48, requests=3000)
    assert varied.throughput_per_min == pytest.approx(alike.throughput_per_min, rel=0.1)
    assert varied.ttft.p50_ms < alike.ttft.p50_ms


def test_the_plans_cap_is_the_smaller_of_kv_pool_and_simulated_slo(prod: LlmCapacity) -> None:
    instance = prod.instance
    assert instance.concurrency == min(instance.kv_limit, instance.max_num_seqs,
                                       instance.slo_limit)
    assert instance.tail_source.startswith("simulated")
    assert instance.time_to_first_token_p99_ms <= prod.slo.time_to_first_token_p99_ms
    assert instance.time_per_output_token_p99_ms <= prod.slo.time_per_output_token_p99_ms
    buckets = {b.bucket: b for b in instance.bucket_latency}
    assert set(buckets) == {"S", "M", "L", "XL"}
    assert all(b.time_to_first_token_p50_ms <= b.time_to_first_token_p99_ms
               for b in buckets.values())
    assert buckets["XL"].time_to_first_token_p50_ms == max(
        b.time_to_first_token_p50_ms for b in buckets.values())


def test_the_first_token_p999_is_the_simulations_own_tail() -> None:
    """Over all requests the simulation reads the p99.9 off the same runs as the p99 (the
    nearest rank: the 7th slowest of 6,000); per bucket it has too few requests for it."""
    inputs = _inputs(ttft_p99_over_p50=1.5)
    mix = [RequestClass("S", 0.85, 100, 100), RequestClass("XL", 0.15, 2500, 100)]
    result = simulate(inputs, mix, 24)
    assert result.requests == 6000
    assert result.ttft.p999_ms is not None
    assert result.ttft.p50_ms <= result.ttft.p99_ms <= result.ttft.p999_ms
    assert result.ttft_of("XL").p999_ms is None
    assert quantile(list(range(1, 6001)), 0.999) == 6000 - 6  # the 7th largest


def test_the_plan_reports_the_p999_beside_the_p99(prod: LlmCapacity) -> None:
    """Seed 001's P99.9 first response: the plan's first-token p99.9 at its batch, from the
    simulation that gives its p99, printed beside it and against the seed's 5 s."""
    from capacity_model.report import format_capacity

    instance = prod.instance
    assert instance.tail_source.startswith("simulated")
    assert instance.time_to_first_token_p99_ms <= instance.time_to_first_token_p999_ms
    assert prod.slo.first_response_p999_ms == 5000
    printed = format_capacity(prod)
    assert (f"/ p99 {instance.time_to_first_token_p99_ms:,.0f} ms / p99.9 "
            f"{instance.time_to_first_token_p999_ms:,.0f} ms") in printed
    (row,) = [line for line in printed.splitlines() if "P99.9 first response < 5 s" in line]
    verdict = "met" if instance.time_to_first_token_p999_ms < 5000 else "missed"
    assert f"TTFT p99.9 {instance.time_to_first_token_p999_ms:,.0f} ms ({verdict})" in row
