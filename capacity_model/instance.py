"""What one instance serves: concurrent requests per bucket, and requests per minute at the SLOs.

Three limits bound how many requests one engine should hold at once, and the smallest wins:

* **the KV pool** — the gateway admits a request only when its reservation (prompt +
  ``max_tokens``, whole blocks) fits under ``watermark`` × the pool the GPU budget planned;
* **the engine's** ``max_num_seqs`` — the GPU budget sized it (the sampler's memory grows with
  it); requests beyond it wait inside vLLM;
* **the latency SLOs** — the largest batch whose time-per-output-token p99 and time-to-first-
  token p99 stay within the SLOs, from the decode-speed table (TTFT scaled by the mix's mean
  prompt over the profile's: a prefill is proportional to its tokens; measure the profile at
  the mix's shape and the scale is 1).

Per bucket, the KV limit is taken at the bucket's *largest* request (a bucket full of its
biggest requests must fit): those are the gateway's per-bucket concurrency caps. For the mix,
the KV limit is at the mix's mean reservation; at the resulting concurrency ``N`` a request
lasts ``TTFT + generated tokens × TPOT`` (p50s) and Little's law gives the sustainable rate
``60 × N / duration`` per minute.

Pure module.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from capacity_model.decode_speed import DecodeProfile
from capacity_model.demand import RequestMix, blocks_for
from gpu_budget import MemoryPlan
from request_buckets import RequestBucket

SHAPE_MISMATCH = 0.5
"""A mix whose mean prompt or output differs from the profile's shape by more than this share
gets a note: the profile was measured (or estimated) for other requests."""


class CapacityError(ValueError):
    """The SLOs cannot be met at all, or the inputs do not belong together."""


@dataclass(frozen=True)
class LatencySlo:
    """What users feel: first token and streaming pace, both p99, in milliseconds."""

    time_to_first_token_p99_ms: float
    time_per_output_token_p99_ms: float

    def __post_init__(self) -> None:
        for name in ("time_to_first_token_p99_ms", "time_per_output_token_p99_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise CapacityError(f"latency SLO {name}: {value!r}; accepted: a number > 0")


@dataclass(frozen=True)
class BucketCap:
    """The gateway's concurrency cap for one bucket and the limit that set it."""

    bucket: str
    largest_request_tokens: int
    kv_limit: int
    cap: int
    limited_by: str


@dataclass(frozen=True)
class InstanceCapacity:
    """One instance's capacity for a mix, and the gateway caps that follow from it."""

    instance_type: str
    kv_pool_blocks: int
    admission_watermark: float
    admissible_blocks: int
    bucket_caps: tuple[BucketCap, ...]
    kv_limit: int
    max_num_seqs: int
    slo_limit: int
    concurrency: int
    limited_by: str
    time_to_first_token_p50_ms: float
    time_to_first_token_p99_ms: float
    time_per_output_token_p50_ms: float
    time_per_output_token_p99_ms: float
    request_seconds: float
    sustainable_invocations_per_min: float
    decode_status: str
    decode_profile: str
    notes: tuple[str, ...]

    def cap_of(self, bucket: RequestBucket | str) -> int:
        """The gateway's cap for ``bucket``."""
        name = RequestBucket(bucket).value
        return next(c.cap for c in self.bucket_caps if c.bucket == name)

    def gateway_bucket_caps(self) -> str:
        """``GATEWAY_BUCKET_CAPS``: ``S=..,M=..,L=..,XL=..``."""
        return ",".join(f"{c.bucket}={c.cap}" for c in self.bucket_caps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        data = asdict(self)
        data["bucket_caps"] = [asdict(c) for c in self.bucket_caps]
        data["notes"] = list(self.notes)
        return data


def _limited_by(limits: dict[str, int]) -> str:
    smallest = min(limits.values())
    return " and ".join(name for name, value in limits.items() if value == smallest)


def slo_limit(profile: DecodeProfile, slo: LatencySlo, *, prompt_tokens: float) -> int:
    """The largest batch size of ``profile`` whose p99s meet ``slo`` (TTFT scaled from the
    profile's prompt to ``prompt_tokens``). CapacityError when even one request misses it."""
    prompt_scale = prompt_tokens / profile.prompt_tokens
    best = 0
    for size in range(1, profile.max_batch_size + 1):
        point = profile.at(size)
        if (point.tpot.p99_ms <= slo.time_per_output_token_p99_ms
                and point.ttft.p99_ms * prompt_scale <= slo.time_to_first_token_p99_ms):
            best = size
        else:
            break
    if best == 0:
        first = profile.at(1)
        raise CapacityError(
            f"{profile.describe()}: even one request misses the latency SLOs — TPOT p99 "
            f"{first.tpot.p99_ms:,.1f} ms (SLO {slo.time_per_output_token_p99_ms:g}), TTFT "
            f"p99 {first.ttft.p99_ms * prompt_scale:,.0f} ms at {prompt_tokens:,.0f} "
            f"prompt tokens (SLO {slo.time_to_first_token_p99_ms:g}); relax the SLOs, shorten "
            "the prompts or choose a faster GPU")
    return best


def instance_capacity(plan: MemoryPlan, mix: RequestMix, profile: DecodeProfile,
                      slo: LatencySlo, *, admission_watermark: float) -> InstanceCapacity:
    """Derive the capacity of one instance sized by ``plan`` for ``mix`` within ``slo``."""
    if not 0 < admission_watermark <= 1:
        raise CapacityError(f"admission_watermark {admission_watermark!r}; accepted: (0, 1]")
    if mix.bounds.max_model_len != plan.max_model_len:
        raise CapacityError(f"the mix is bucketed for max_model_len {mix.bounds.max_model_len:,}"
                            f", the plan runs {plan.max_model_len:,}")
    if profile.key != (plan.gpu_model, plan.model_name, plan.quantization, plan.kv_cache_dtype):
        raise CapacityError(f"{profile.describe()} does not describe the plan's "
                            f"{plan.gpu_model} / {plan.model_name} / {plan.quantization} / kv "
                            f"{plan.kv_cache_dtype}")
    admissible = math.floor(admission_watermark * plan.kv_pool_blocks)
    by_slo = slo_limit(profile, slo, prompt_tokens=mix.mean_prompt_tokens)
    caps = []
    for bucket in RequestBucket:
        largest = mix.bounds.upper(bucket)
        kv = admissible // blocks_for(largest, plan.block_size)
        limits = {"KV pool": kv, "max_num_seqs": plan.max_num_seqs, "latency SLO": by_slo}
        caps.append(BucketCap(bucket=bucket.value, largest_request_tokens=largest, kv_limit=kv,
                              cap=max(1, min(limits.values())), limited_by=_limited_by(limits)))
    kv_mix = math.floor(admissible / mix.mean_reserved_blocks(plan.block_size))
    limits = {"KV pool": kv_mix, "max_num_seqs": plan.max_num_seqs, "latency SLO": by_slo}
    concurrency = max(1, min(limits.values()))
    point = profile.at(concurrency)
    prompt_scale = mix.mean_prompt_tokens / profile.prompt_tokens
    ttft_p50_ms = point.ttft.p50_ms * prompt_scale
    duration_s = (ttft_p50_ms + mix.mean_output_tokens * point.tpot.p50_ms) / 1000
    notes: list[str] = []
    for label, mine, theirs in (("prompt", mix.mean_prompt_tokens, profile.prompt_tokens),
                                ("output", mix.mean_output_tokens, profile.output_tokens)):
        if abs(mine - theirs) > SHAPE_MISMATCH * theirs:
            notes.append(f"the mix's mean {label} ({mine:,.0f} tokens) differs from the decode "
                         f"profile's ({theirs:,}) by more than {SHAPE_MISMATCH:.0%}: measure at "
                         "the mix's shape (tools/decode_bench.py --prompt-tokens/--output-tokens)")
    if profile.status != "measured":
        notes.append(f"{profile.describe()} is an assumption (not measured): run "
                     "scripts/gpu-smoke.sh on the GPU to replace it")
    return InstanceCapacity(
        instance_type=plan.instance_type,
        kv_pool_blocks=plan.kv_pool_blocks,
        admission_watermark=admission_watermark,
        admissible_blocks=admissible,
        bucket_caps=tuple(caps),
        kv_limit=kv_mix,
        max_num_seqs=plan.max_num_seqs,
        slo_limit=by_slo,
        concurrency=concurrency,
        limited_by=_limited_by(limits),
        time_to_first_token_p50_ms=round(ttft_p50_ms, 1),
        time_to_first_token_p99_ms=round(point.ttft.p99_ms * prompt_scale, 1),
        time_per_output_token_p50_ms=round(point.tpot.p50_ms, 2),
        time_per_output_token_p99_ms=round(point.tpot.p99_ms, 2),
        request_seconds=round(duration_s, 3),
        sustainable_invocations_per_min=round(60 * concurrency / duration_s, 1),
        decode_status=profile.status,
        decode_profile=profile.describe(),
        notes=tuple(notes),
    )
