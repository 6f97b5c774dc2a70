"""What one instance serves: concurrent requests per bucket, and requests per minute at the SLOs.

Three limits bound how many requests one engine should hold at once, and the smallest wins:

* **the KV pool** — every request at its worst case (prompt + ``max_tokens``, whole blocks)
  under ``watermark`` × the pool the GPU budget planned: a conservative bound (the gateway
  dispatches a prompt when it fits beside what the running requests hold now, and vLLM
  preempts as answers grow);
* **the engine's** ``max_num_seqs`` — the GPU budget sized it (the sampler's memory grows with
  it); requests beyond it wait inside vLLM;
* **the latency SLOs** — the largest batch whose time-per-output-token p99 and the time to
  first token p99 of *every* bucket's typical request stay within the SLOs
  (:mod:`capacity_model.latency`: a request's first token waits for the prefill of its own
  *uncached* prompt tokens — what the prefix cache does not serve — behind the batch's prefill
  queue). The XL bucket, long conversations, is the one that binds.

Per bucket, the KV limit is taken at the bucket's *largest* request (a bucket full of its
biggest requests must fit), bounded by ``max_num_seqs``: those are the gateway's per-bucket
concurrency caps (``GATEWAY_BUCKET_CAPS``). The latency SLO is not in them: the gateway's
admission refuses on arrival what would start after
``GATEWAY_TTFT_SLO_S`` (docs/design-decisions.md#ttft-admission), so a cap at the mix's SLO-bound
batch would only turn away short requests the engine could serve in time. For the mix, the
limit is the smallest of the three; at the resulting concurrency ``N`` a request lasts ``TTFT +
generated tokens × TPOT`` (p50s) and Little's law gives the sustainable rate ``60 × N /
duration`` per minute: what the fleet is scaled by.

Pure module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from capacity_model.decode_speed import DecodeProfile, Latency
from capacity_model.demand import RequestMix
from capacity_model.latency import LatencyModel, MeasuredLatency
from capacity_model.queue_sim import SimResult
from gpu_budget import MemoryPlan
from gpu_budget.lengths import blocks_for_tokens
from request_buckets import RequestBucket

Z99 = 2.326
"""The standard normal's 99th percentile."""
Z999 = 3.090
"""The standard normal's 99.9th percentile."""
FIRST_RESPONSE_P999_MS = 5000.0
"""Seed 001's "P99.9 first-response latency < 5 s" (``llm.alarms.first_response_p999_ms``)."""
SHAPE_MISMATCH = 0.5
"""A mix whose mean prompt or output differs from the profile's shape by more than this share
gets a note: the profile was measured (or estimated) for other requests."""


class CapacityError(ValueError):
    """The SLOs cannot be met at all, or the inputs do not belong together."""


@dataclass(frozen=True)
class LatencySlo:
    """What users feel: first token and streaming pace, both p99, in milliseconds; and seed
    001's p99.9 first response, which the plan reports (it does not size for it: the p99 binds
    first, docs/capacity.md)."""

    time_to_first_token_p99_ms: float
    time_per_output_token_p99_ms: float
    first_response_p999_ms: float = FIRST_RESPONSE_P999_MS

    def __post_init__(self) -> None:
        for name in ("time_to_first_token_p99_ms", "time_per_output_token_p99_ms",
                     "first_response_p999_ms"):
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
class BucketLatency:
    """The first token of one bucket's typical request at the instance's batch."""

    bucket: str
    prompt_tokens: int
    cached_tokens: float
    time_to_first_token_p50_ms: float
    time_to_first_token_p99_ms: float
    meets_slo: bool


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
    history_reuse: float = 0.0
    """Share of the earlier conversation in a prompt the prefix cache serves (sessions,
    retention and the window's steps counted)."""
    mean_cached_prompt_tokens: float = 0.0
    bucket_latency: tuple[BucketLatency, ...] = ()
    closed_form_slo_limit: int = 0
    """The SLO's batch by the closed form at the mix's mean prompt (what ``slo_limit`` was
    before the simulation of the mix's own buckets replaced it)."""
    tail_source: str = "closed form at the mix's mean request"
    """Where the TTFT and TPOT quantiles and the per-bucket first tokens come from."""
    time_to_first_token_p999_ms: float = 0.0
    """The first token's p99.9 over all requests at the batch, from the same model as the p99:
    the simulation's 7th slowest of 6,000 when it ran, else the closed form's log-normal
    (:func:`lognormal_p999`). A steady state: no cold engine, no rebuild in it."""

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
        data["bucket_latency"] = [asdict(b) for b in self.bucket_latency]
        data["notes"] = list(self.notes)
        return data

    def latency_of(self, bucket: RequestBucket | str) -> BucketLatency:
        """The first-token latency of ``bucket``'s typical request."""
        name = RequestBucket(bucket).value
        return next(b for b in self.bucket_latency if b.bucket == name)


def lognormal_p999(latency: Latency) -> float:
    """The p99.9 of a log-normal with ``latency``'s p50 and p99 — the shape the closed form
    gives each request's first token (:func:`mixture_quantile`): p50 × (p99 / p50) ^ (Z99.9 /
    Z99). An extrapolation beyond the figures it rests on, so no better than that shape."""
    if latency.p99_ms <= latency.p50_ms:
        return latency.p99_ms
    return latency.p50_ms * (latency.p99_ms / latency.p50_ms) ** (Z999 / Z99)


def _limited_by(limits: dict[str, int]) -> str:
    smallest = min(limits.values())
    return " and ".join(name for name, value in limits.items() if value == smallest)


def mixture_quantile(latencies: Sequence[tuple[float, Latency]], quantile: float = 0.99) -> float:
    """The ``quantile`` of all requests' TTFT when each bucket (share, its p50 and p99) is
    log-normal: what the SLO alarm, a p99 over every request, sees. (Remembered per process: a
    plan asks for the same mixtures while it re-solves its reuse, and again at each load.)"""
    return _mixture_quantile(tuple(latencies), quantile)


@functools.lru_cache(maxsize=65536)
def _mixture_quantile(latencies: tuple[tuple[float, Latency], ...], quantile: float) -> float:
    spread = [(share, math.log(lat.p50_ms), max(math.log(lat.p99_ms / lat.p50_ms) / Z99, 1e-9))
              for share, lat in latencies if share > 0]
    total = sum(share for share, _, _ in spread)

    def below(ms: float) -> float:
        return sum(share * 0.5 * math.erfc(-(math.log(ms) - mu) / (sigma * math.sqrt(2)))
                   for share, mu, sigma in spread) / total

    low, high = min(lat.p50_ms for _, lat in latencies), max(lat.p99_ms for _, lat in latencies)
    for _ in range(60):
        middle = math.sqrt(low * high)
        if below(middle) >= quantile:
            high = middle
        else:
            low = middle
    return high


def slo_limit(latency: LatencyModel, slo: LatencySlo, *,
              uncached_tokens: dict[str, float], shares: dict[str, float]) -> int:
    """The largest batch whose TPOT p99 and TTFT p99 over all requests (the buckets' typical
    requests, ``uncached_tokens`` to prefill each, mixed by ``shares``) meet ``slo``.
    CapacityError when even one request misses it. (Remembered per process, as the simulation
    is: a plan asks again for the same reuse at every environment load.)"""
    uncached_items, share_items = tuple(uncached_tokens.items()), tuple(shares.items())
    try:
        hash(latency)
    except TypeError:  # a measured profile that names its sources in a dict: not remembered
        return _slo_limit.__wrapped__(latency, slo, uncached_items, share_items)
    return _slo_limit(latency, slo, uncached_items, share_items)


@functools.lru_cache(maxsize=4096)
def _slo_limit(latency: LatencyModel, slo: LatencySlo,
               uncached_items: tuple[tuple[str, float], ...],
               share_items: tuple[tuple[str, float], ...]) -> int:
    uncached_tokens, shares = dict(uncached_items), dict(share_items)
    best = 0
    for size in range(1, latency.max_batch_size + 1):
        point = latency.at(size)
        ttft = mixture_quantile([(shares[b], latency.ttft_of(size, u))
                                 for b, u in uncached_tokens.items()])
        if (point.tpot.p99_ms <= slo.time_per_output_token_p99_ms
                and ttft <= slo.time_to_first_token_p99_ms):
            best = size
        else:
            break
    if best == 0:
        first = latency.at(1)
        ttft = mixture_quantile([(shares[b], latency.ttft_of(1, u))
                                 for b, u in uncached_tokens.items()])
        bucket, tokens = max(uncached_tokens.items(), key=lambda item: item[1])
        raise CapacityError(
            f"{latency.describe()}: even one request misses the latency SLOs — TPOT p99 "
            f"{first.tpot.p99_ms:,.1f} ms (SLO {slo.time_per_output_token_p99_ms:g}), TTFT "
            f"p99 {ttft:,.0f} ms over all requests (SLO {slo.time_to_first_token_p99_ms:g}; "
            f"the longest prefill: {tokens:,.0f} prompt tokens, {bucket}); relax the SLOs, "
            "shorten the prompts, reuse more of them or choose a faster GPU")
    return best


def _as_latency(plan: MemoryPlan, mix: RequestMix, latency: LatencyModel | DecodeProfile,
                history_reuse: float) -> LatencyModel:
    if not isinstance(latency, DecodeProfile):
        return latency
    if latency.key != (plan.gpu_model, plan.model_name, plan.quantization, plan.kv_cache_dtype):
        raise CapacityError(f"{latency.describe()} does not describe the plan's "
                            f"{plan.gpu_model} / {plan.model_name} / {plan.quantization} / kv "
                            f"{plan.kv_cache_dtype}")
    uncached = mix.mean_prompt_tokens - mix.mean_cached_tokens(plan.block_size, history_reuse)
    return MeasuredLatency(latency, uncached)


def _notes(mix: RequestMix, latency: LatencyModel) -> list[str]:
    notes: list[str] = []
    if isinstance(latency, MeasuredLatency):
        profile = latency.profile
        for label, mine, theirs in (("prompt", mix.mean_prompt_tokens, profile.prompt_tokens),
                                    ("output", mix.mean_output_tokens, profile.output_tokens)):
            if abs(mine - theirs) > SHAPE_MISMATCH * theirs:
                notes.append(f"the mix's mean {label} ({mine:,.0f} tokens) differs from the "
                             f"decode profile's ({theirs:,}) by more than {SHAPE_MISMATCH:.0%}: "
                             "measure at the mix's shape (tools/decode_bench.py "
                             "--prompt-tokens/--output-tokens)")
    if latency.status != "measured":
        notes.append(f"{latency.describe()} is an assumption (not measured): run "
                     "tools/gpu_smoke.sh on the GPU to replace it")
    return notes


def _bucket_caps(plan: MemoryPlan, mix: RequestMix, admissible: int) -> list[BucketCap]:
    caps = []
    for bucket in RequestBucket:
        largest = mix.bounds.upper(bucket)
        kv = admissible // blocks_for_tokens(largest, plan.block_size)
        limits = {"KV pool": kv, "max_num_seqs": plan.max_num_seqs}
        caps.append(BucketCap(bucket=bucket.value, largest_request_tokens=largest, kv_limit=kv,
                              cap=max(1, min(limits.values())), limited_by=_limited_by(limits)))
    return caps


def _bucket_latency(plan: MemoryPlan, mix: RequestMix, model: LatencyModel, slo: LatencySlo,
                    concurrency: int, uncached: dict[str, float], history_reuse: float,
                    tail: SimResult | None) -> list[BucketLatency]:
    """Each bucket's first token at the batch: the simulation's quantiles when it ran, else the
    closed form for the bucket's typical request."""
    buckets = []
    for demand in mix.demands:
        name = demand.bucket.value
        if tail is not None:
            quantiles = tail.ttft_of(name)
            ttft = Latency(quantiles.p50_ms, quantiles.p99_ms)
        else:
            ttft = model.ttft_of(concurrency, uncached[name])
        buckets.append(BucketLatency(
            bucket=name, prompt_tokens=demand.prompt_tokens,
            cached_tokens=round(demand.cached_tokens(plan.block_size, history_reuse), 1),
            time_to_first_token_p50_ms=round(ttft.p50_ms, 1),
            time_to_first_token_p99_ms=round(ttft.p99_ms, 1),
            meets_slo=ttft.p99_ms <= slo.time_to_first_token_p99_ms))
    return buckets


def instance_capacity(plan: MemoryPlan, mix: RequestMix, latency: LatencyModel | DecodeProfile,
                      slo: LatencySlo, *, admission_watermark: float,
                      history_reuse: float = 0.0, slo_cap: int | None = None,
                      tail: SimResult | None = None) -> InstanceCapacity:
    """Derive the capacity of one instance sized by ``plan`` for ``mix`` within ``slo``.

    ``latency`` is a measured profile (its TTFT scaled by uncached prompt tokens) or a latency
    model already shaped to the mix (:func:`capacity_model.latency.latency_model`);
    ``history_reuse`` the share of each prompt's earlier conversation the prefix cache serves.
    ``slo_cap``: the SLO's batch from the simulation of the mix's own buckets
    (:mod:`capacity_model.queue_sim`), which then replaces the closed form's; ``tail``: that
    simulation at the resulting batch, whose quantiles the capacity reports.
    """
    if not 0 < admission_watermark <= 1:
        raise CapacityError(f"admission_watermark {admission_watermark!r}; accepted: (0, 1]")
    if not 0 <= history_reuse <= 1:
        raise CapacityError(f"history_reuse {history_reuse!r}; accepted: 0 to 1")
    if mix.bounds.max_model_len != plan.max_model_len:
        raise CapacityError(f"the mix is bucketed for max_model_len {mix.bounds.max_model_len:,}"
                            f", the plan runs {plan.max_model_len:,}")
    model = _as_latency(plan, mix, latency, history_reuse)
    uncached = {d.bucket.value: d.uncached_tokens(plan.block_size, history_reuse)
                for d in mix.demands}
    admissible = math.floor(admission_watermark * plan.kv_pool_blocks)
    shares = {d.bucket.value: d.share for d in mix.demands}
    closed_form = slo_limit(model, slo, uncached_tokens=uncached, shares=shares)
    by_slo = closed_form if slo_cap is None else slo_cap
    kv_mix = math.floor(admissible / mix.mean_reserved_blocks(plan.block_size))
    limits = {"KV pool": kv_mix, "max_num_seqs": plan.max_num_seqs, "latency SLO": by_slo}
    concurrency = max(1, min(limits.values()))
    point = model.at(concurrency)
    duration_s = (point.ttft.p50_ms + mix.mean_output_tokens * point.tpot.p50_ms) / 1000
    if tail is not None and tail.batch_size == concurrency:
        ttft_all, tpot_all = Latency(tail.ttft.p50_ms, tail.ttft.p99_ms), Latency(
            tail.tpot.p50_ms, tail.tpot.p99_ms)
        ttft_p999 = (tail.ttft.p999_ms if tail.ttft.p999_ms is not None
                     else lognormal_p999(ttft_all))
        source = (f"simulated: the mix's own buckets in a closed loop of {concurrency} "
                  f"({tail.requests:,} requests, capacity_model/queue_sim.py)")
    else:
        tail, ttft_all, tpot_all = None, point.ttft, point.tpot
        ttft_p999 = lognormal_p999(ttft_all)
        source = "closed form at the mix's mean request"
    buckets = _bucket_latency(plan, mix, model, slo, concurrency, uncached, history_reuse, tail)
    return InstanceCapacity(
        instance_type=plan.instance_type,
        kv_pool_blocks=plan.kv_pool_blocks,
        admission_watermark=admission_watermark,
        admissible_blocks=admissible,
        bucket_caps=tuple(_bucket_caps(plan, mix, admissible)),
        kv_limit=kv_mix,
        max_num_seqs=plan.max_num_seqs,
        slo_limit=by_slo,
        concurrency=concurrency,
        limited_by=_limited_by(limits),
        time_to_first_token_p50_ms=round(ttft_all.p50_ms, 1),
        time_to_first_token_p99_ms=round(ttft_all.p99_ms, 1),
        time_per_output_token_p50_ms=round(tpot_all.p50_ms, 2),
        time_per_output_token_p99_ms=round(tpot_all.p99_ms, 2),
        request_seconds=round(duration_s, 3),
        sustainable_invocations_per_min=round(60 * concurrency / duration_s, 1),
        decode_status=model.status,
        decode_profile=model.describe(),
        notes=tuple(_notes(mix, model)),
        history_reuse=round(history_reuse, 4),
        mean_cached_prompt_tokens=round(mix.mean_cached_tokens(plan.block_size, history_reuse),
                                        1),
        bucket_latency=tuple(buckets),
        closed_form_slo_limit=closed_form,
        tail_source=source,
        time_to_first_token_p999_ms=round(ttft_p999, 1),
    )
