"""One instance's capacity: the three limits, the gateway's caps, Little's law, the refusals."""

from __future__ import annotations

import dataclasses

import pytest

from capacity_model import (
    BucketDemand,
    CapacityError,
    DecodePoint,
    DecodeProfile,
    Latency,
    LatencySlo,
    instance_capacity,
    request_mix,
)
from gpu_budget import MemoryPlan, plan
from request_buckets import RequestBucket, bucket_bounds
from stacks.settings import REPO_ROOT

MODEL = str(REPO_ROOT / "config" / "models" / "llama-3-8b-instruct.json")


@pytest.fixture(scope="module")
def a10g() -> MemoryPlan:
    return plan(MODEL, quantization="w4a16", instance="ml.g5.xlarge", max_model_len=4096,
                max_loras=3, max_lora_rank=64)


def profile_for(memory: MemoryPlan, *points: tuple[int, float, float]) -> DecodeProfile:
    """Points (batch, TTFT p50 ms, TPOT p50 ms); p99 = 2× TTFT, 1.1× TPOT."""
    return DecodeProfile(
        gpu=memory.gpu_model, model=memory.model_name, quantization=memory.quantization,
        kv_cache_dtype=memory.kv_cache_dtype, prompt_tokens=1000, output_tokens=200,
        points=tuple(DecodePoint(b, Latency(t, 2 * t), Latency(p, 1.1 * p), "measured", "test")
                     for b, t, p in points))


ONE_BUCKET = [BucketDemand(RequestBucket.L, 1.0, 1000, 512, 200)]


def test_the_kv_pool_bounds_a_long_mix_and_littles_law_gives_the_rate(a10g: MemoryPlan) -> None:
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    fast = profile_for(a10g, (1, 100, 10), (128, 500, 50))
    capacity = instance_capacity(a10g, mix, fast, LatencySlo(2000, 100), admission_watermark=0.9)
    # 1,512-token reservations = 95 blocks; 90 % of 6,144 blocks = 5,529 → 58 of them.
    assert capacity.admissible_blocks == 5529
    assert capacity.kv_limit == 5529 // 95 == 58
    assert (capacity.concurrency, capacity.limited_by) == (58, "KV pool")
    # at 58: TTFT p50 100 + (400 × 57/127) ms, TPOT p50 10 + (40 × 57/127) ms
    ttft = 100 + 400 * 57 / 127
    tpot = 10 + 40 * 57 / 127
    duration = (ttft + 200 * tpot) / 1000
    assert capacity.request_seconds == pytest.approx(duration, abs=1e-3)
    assert capacity.sustainable_invocations_per_min == pytest.approx(60 * 58 / duration,
                                                                     abs=0.1)


def test_the_tpot_slo_bounds_a_slow_engine(a10g: MemoryPlan) -> None:
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    slow = profile_for(a10g, (1, 100, 20), (64, 300, 83), (128, 400, 147))
    capacity = instance_capacity(a10g, mix, slow, LatencySlo(2000, 80),
                                 admission_watermark=0.9)
    # TPOT p99 = 1.1 × (20 + b − 1) ≤ 80 ms → b ≤ 53
    assert capacity.slo_limit == 53
    assert (capacity.concurrency, capacity.limited_by) == (53, "latency SLO")
    assert capacity.time_per_output_token_p99_ms <= 80


def test_the_gateway_caps_are_what_the_pool_holds_of_each_buckets_largest_request(
    a10g: MemoryPlan,
) -> None:
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    capacity = instance_capacity(a10g, mix, profile_for(a10g, (1, 100, 10), (256, 300, 30)),
                                 LatencySlo(2000, 100), admission_watermark=0.9)
    caps = {c.bucket: c for c in capacity.bucket_caps}
    # 5,529 admissible blocks ÷ (512, 1,024, 2,048, 4,096 tokens = 32, 64, 128, 256 blocks)
    assert {b: c.kv_limit for b, c in caps.items()} == {"S": 172, "M": 86, "L": 43, "XL": 21}
    # max_num_seqs (88) binds the small buckets, the pool the large ones
    assert {b: c.cap for b, c in caps.items()} == {"S": 88, "M": 86, "L": 43, "XL": 21}
    assert caps["S"].limited_by == "max_num_seqs" and caps["XL"].limited_by == "KV pool"
    assert capacity.gateway_bucket_caps() == "S=88,M=86,L=43,XL=21"
    assert capacity.cap_of("XL") == 21


def test_a_looser_watermark_admits_more(a10g: MemoryPlan) -> None:
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    profile = profile_for(a10g, (1, 100, 10), (256, 300, 30))
    tight = instance_capacity(a10g, mix, profile, LatencySlo(2000, 100), admission_watermark=0.5)
    loose = instance_capacity(a10g, mix, profile, LatencySlo(2000, 100), admission_watermark=1.0)
    assert tight.cap_of("XL") == 3072 // 256 and loose.cap_of("XL") == 24
    assert tight.sustainable_invocations_per_min < loose.sustainable_invocations_per_min


def test_an_slo_not_even_one_request_meets_is_refused_with_the_numbers(a10g: MemoryPlan) -> None:
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    with pytest.raises(CapacityError) as info:
        instance_capacity(a10g, mix, profile_for(a10g, (1, 900, 40), (8, 1000, 60)),
                          LatencySlo(1000, 100), admission_watermark=0.9)
    message = str(info.value)
    assert "even one request misses the latency SLOs" in message
    assert ("TTFT p99 1,800 ms over all requests (SLO 1000; the longest prefill: 1,000 prompt "
            "tokens, L)") in message


def test_inputs_that_do_not_belong_together_are_refused(a10g: MemoryPlan) -> None:
    profile = profile_for(a10g, (1, 100, 10), (64, 300, 30))
    with pytest.raises(CapacityError, match="bucketed for max_model_len 2,048"):
        instance_capacity(a10g, request_mix([BucketDemand(RequestBucket.L, 1.0, 500, 512, 100)],
                                            bucket_bounds(2048)),
                          profile, LatencySlo(2000, 100), admission_watermark=0.9)
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    with pytest.raises(CapacityError, match="does not describe the plan's NVIDIA A10G"):
        instance_capacity(a10g, mix, dataclasses.replace(profile, kv_cache_dtype="fp8_e5m2"),
                          LatencySlo(2000, 100), admission_watermark=0.9)
    with pytest.raises(CapacityError, match=r"admission_watermark 1\.5"):
        instance_capacity(a10g, mix, profile, LatencySlo(2000, 100), admission_watermark=1.5)
    with pytest.raises(CapacityError, match="time_per_output_token_p99_ms: 0"):
        LatencySlo(2000, 0)


def test_an_estimated_profile_and_a_shape_mismatch_are_noted(a10g: MemoryPlan) -> None:
    estimated = profile_for(a10g, (1, 100, 10), (64, 300, 30))
    estimated = dataclasses.replace(estimated, prompt_tokens=300, points=tuple(
        dataclasses.replace(p, status="assumption") for p in estimated.points))
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    notes = instance_capacity(a10g, mix, estimated, LatencySlo(5000, 100),
                              admission_watermark=0.9).notes
    assert any("mean prompt (1,000 tokens) differs from the decode profile's (300)" in n
               for n in notes)
    assert any("is an assumption (not measured)" in n for n in notes)


def test_the_first_token_p999_comes_from_the_same_model_as_the_p99(a10g: MemoryPlan) -> None:
    """The closed form gives each first token a log-normal through its p50 and p99; its p99.9
    is that log-normal's: p50 × (p99 / p50) ^ (3.090 / 2.326), above the p99."""
    from capacity_model.instance import lognormal_p999

    assert lognormal_p999(Latency(100, 200)) == pytest.approx(100 * 2 ** (3.090 / 2.326))
    assert lognormal_p999(Latency(100, 100)) == 100
    mix = request_mix(ONE_BUCKET, bucket_bounds(4096))
    capacity = instance_capacity(a10g, mix, profile_for(a10g, (1, 100, 10), (128, 500, 50)),
                                 LatencySlo(2000, 100), admission_watermark=0.9)
    assert capacity.tail_source.startswith("closed form")
    expected = lognormal_p999(Latency(capacity.time_to_first_token_p50_ms,
                                      capacity.time_to_first_token_p99_ms))
    assert capacity.time_to_first_token_p999_ms == pytest.approx(expected, abs=0.2)
    assert capacity.time_to_first_token_p999_ms > capacity.time_to_first_token_p99_ms
    with pytest.raises(CapacityError, match="first_response_p999_ms"):
        LatencySlo(2000, 100, 0)
