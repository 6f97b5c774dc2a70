"""An estimate of the latency curve from the GPU's two rates, for set-ups nobody has measured yet.

The decode-speed table (:mod:`capacity_model.decode_speed`) should hold measurements, but this
project has not run vLLM on an A10G (``tools/gpu_smoke.sh`` does that and writes its figures
back). Until then the capacity model estimates the curve from the GPU's rates
(:mod:`capacity_model.rates`: memory bandwidth and compute, each a sourced range), and the table
keeps one estimate per profile, marked ``assumption``, with its inputs recorded
(``estimated_from``) so that a test can recompute it and the file cannot drift from its method.
``benchmarks/capacity_check.py`` checks the same arithmetic against vLLM's CPU build: it fits the
inputs to that engine and prints this model's predictions beside what the engine did.

The model is a closed loop of ``B`` requests in flight, each ``P`` prompt tokens in (``C`` of
them served from the prefix cache, so ``U = P − C`` to compute) and ``O`` tokens out, replaced as
soon as it finishes (what ``vllm bench serve --max-concurrency B`` and :mod:`tools.decode_bench`
measure). It schedules as vLLM does with chunked prefill:

* **A step** runs every decoding sequence's next token and, in the same forward pass, up to
  ``max_num_batched_tokens`` minus those decodes of prompt tokens (a prefill *chunk*). It reads
  every weight once and the KV cache of every running sequence (PagedAttention) at the usable
  bandwidth, and computes its tokens at the compute roof; its time is the larger of the two
  (the roofline) plus a fixed per-step cost (scheduling, sampling: ``step_overhead_s``, 0 for a
  GPU whose efficiency figures already include it):
  ``s(n, x) = h + max((W + n × (P + O/2) × kv) / (bandwidth × efficiency), n / Rc + x / R)``
  for ``n`` decodes and ``x`` prompt tokens, ``Rc`` and ``R`` the compute roof in decode and
  prompt tokens per second. A decode-only step is ``d = s(B, 0)``. Cached prompt tokens are
  read like any other: the cache saves their computation, not their KV.
* **Prefill** rides in those steps instead of stopping the decodes: a request's ``U`` tokens
  take ``k = ⌈U / (M − (B − 1))⌉`` chunk steps of ``s(B − 1, U / k)`` each (``M`` the token
  budget); the last one samples the first token. Its cost to everyone else is only what those
  steps take beyond a decode step, ``e = k × (s(B − 1, U/k) − d)`` (0 when a chunk fits into a
  memory-bound step: prefill then comes free).
* **Steady state.** A request lives ``K = k + O − 1`` steps; the ``B`` requests' prefills add
  ``e`` each, so it lasts ``T = K × d + B × e`` and the engine finishes ``B / T`` requests a
  second — never more than the compute allows (``T >= B × (U/R + O/Rc) + K × h``: a memory-bound
  step's slack takes one chunk, not every one). The other requests' prefills take the share
  ``ρ = (B − 1) × e / T`` of the time, so a decoding request waits for them:
  ``TPOT = d / (1 − ρ)``.
* **First token.** Its own chunk steps, behind the step in progress when it arrives (half a mean
  step ``T / K`` at the median, almost a whole one at p99, when anybody else runs) and behind
  the other requests' prefills still queued for the compute (an M/D/1 queue of utilisation ``ρ``
  and service ``e``: it waits with probability ``ρ``, then about exponentially with mean
  ``e / (2(1 − ρ))``). A request of another size in the same batch waits the same queue for its
  own prefill: :func:`ttft_latency` with its own uncached tokens.
* **Tails** follow from that load: the queue's quantiles give TTFT p99, and TPOT p99 counts a
  request's decode steps that another prefill lengthened (Poisson, mean ``ρ/(1 − ρ) × (O − 1) ×
  d / e``) at 2.326 standard deviations. ``ttft_p99_over_p50`` and ``tpot_p99_over_p50`` are
  only the jitter of an unloaded engine on top (an assumption; the CPU check measures it), not a
  ratio borrowed from another machine at another load.

It ignores CUDA-graph effects; a measurement replaces all of it. The closed forms above hold
for the mix's *mean* request; :mod:`capacity_model.queue_sim` runs the same steps on the mix's
own buckets for the tail.

Pure module: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from capacity_model.decode_speed import DecodePoint, DecodeProfile, Latency

GB = 1e9
Z99 = 2.326
"""The standard normal's 99th percentile."""
_OPTIONAL_ZERO = ("cached_prompt_tokens", "step_overhead_s")
_OPTIONAL = {"step_overhead_s": 0.0, "lora_step_factor": 1.0}
"""Inputs a stored ``estimated_from`` may leave out, and the value they then take."""


@dataclass(frozen=True)
class RooflineInputs:
    """Everything :func:`estimate_profile` assumes, by name (stored in the profile)."""

    weights_bytes: float
    kv_bytes_per_token: float
    memory_bandwidth_gb_s: float
    bandwidth_efficiency: float
    prefill_tokens_per_s: float
    decode_compute_tokens_per_s: float
    prompt_tokens: float
    cached_prompt_tokens: float
    output_tokens: float
    ttft_p99_over_p50: float
    """The jitter of an unloaded engine's first token (p99 over p50 with nobody queued)."""
    tpot_p99_over_p50: float
    """The same for the time per output token."""
    max_num_batched_tokens: float
    """vLLM's token budget of one step: decodes first, the rest to prefill chunks."""
    step_overhead_s: float = 0.0
    """A fixed cost every step adds to its roofline time (scheduling, sampling)."""
    lora_step_factor: float = 1.0
    """What serving LoRA adapters multiplies a step's roofline time by (1: no adapters; the
    rates' ``lora_step_factor`` range, sourced in config/decode_speed.json)."""

    def __post_init__(self) -> None:
        cached = self.cached_prompt_tokens
        if not (isinstance(cached, int | float) and math.isfinite(cached)
                and 0 <= cached < self.prompt_tokens):
            raise ValueError(f"roofline input cached_prompt_tokens: {cached!r} is not "
                             f"accepted; accepted: 0 <= cached < prompt_tokens "
                             f"({self.prompt_tokens!r})")
        overhead = self.step_overhead_s
        if not (isinstance(overhead, int | float) and math.isfinite(overhead) and overhead >= 0):
            raise ValueError(f"roofline input step_overhead_s: {overhead!r} is not accepted; "
                             "accepted: a number >= 0")
        for item in fields(self):
            if item.name in _OPTIONAL_ZERO:
                continue
            value = getattr(self, item.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"roofline input {item.name}: {value!r} is not accepted; "
                                 "accepted: a number > 0")
        if self.bandwidth_efficiency > 1:
            raise ValueError(f"roofline input bandwidth_efficiency: {self.bandwidth_efficiency}"
                             " is not accepted; accepted: (0, 1]")
        for name in ("ttft_p99_over_p50", "tpot_p99_over_p50", "lora_step_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"roofline input {name}: {getattr(self, name)} is not "
                                 "accepted; accepted: >= 1 (p99 is not below p50)")

    def to_dict(self) -> dict[str, float]:
        """The ``estimated_from`` block of a profile (``lora_step_factor`` only when not 1)."""
        data = {item.name: float(getattr(self, item.name)) for item in fields(self)}
        if data["lora_step_factor"] == _OPTIONAL["lora_step_factor"]:
            del data["lora_step_factor"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> RooflineInputs:
        """Inverse of :meth:`to_dict`; ValueError names a missing or unknown input
        (``step_overhead_s`` may be left out: 0; ``lora_step_factor``: 1)."""
        expected = {item.name for item in fields(cls)}
        missing = expected - set(data) - set(_OPTIONAL)
        if missing or set(data) - expected:
            raise ValueError(f"estimated_from: missing {sorted(missing)}, unknown "
                             f"{sorted(set(data) - expected)}")
        return cls(**{name: float(value) for name, value in data.items()})

    @property
    def uncached_tokens(self) -> float:
        """``U``: the prompt tokens a prefill computes."""
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def prefill_seconds(self) -> float:
        """``U / R``: the compute time of one request's prefill, alone."""
        return self.uncached_tokens / self.prefill_tokens_per_s


def step_seconds(inputs: RooflineInputs, batch_size: float,
                 prefill_tokens: float = 0.0) -> float:
    """One step with ``batch_size`` sequences decoding and ``prefill_tokens`` prompt tokens
    beside them: the weights and every sequence's KV at the usable bandwidth, or all its tokens'
    FLOPs at the compute roof, whichever takes longer, plus the fixed step cost."""
    mean_context = inputs.prompt_tokens + inputs.output_tokens / 2
    read = inputs.weights_bytes + batch_size * mean_context * inputs.kv_bytes_per_token
    memory = read / (inputs.memory_bandwidth_gb_s * GB * inputs.bandwidth_efficiency)
    compute = (batch_size / inputs.decode_compute_tokens_per_s
               + prefill_tokens / inputs.prefill_tokens_per_s)
    return inputs.step_overhead_s + inputs.lora_step_factor * max(memory, compute)


@dataclass(frozen=True)
class Prefill:
    """How one request's prefill is scheduled in a batch of ``batch_size``."""

    chunks: int
    """``k``: the steps it takes (the token budget left beside the other decodes)."""
    step_s: float
    """One of those steps (the other ``B − 1`` decode in it)."""
    extra_s: float
    """``e``: what its chunks add to the engine's time over as many decode-only steps."""


def prefill_of(inputs: RooflineInputs, batch_size: float,
               uncached_tokens: float | None = None) -> Prefill:
    """The chunked prefill of ``uncached_tokens`` (default: the mix's own) in that batch."""
    tokens = inputs.uncached_tokens if uncached_tokens is None else uncached_tokens
    others = max(0.0, batch_size - 1)
    room = max(1.0, inputs.max_num_batched_tokens - others)
    chunks = max(1, math.ceil(tokens / room))
    step = step_seconds(inputs, others, tokens / chunks)
    extra = max(0.0, chunks * (step - step_seconds(inputs, batch_size)))
    return Prefill(chunks=chunks, step_s=step, extra_s=extra)


@dataclass(frozen=True)
class LoopState:
    """The closed loop's steady state at ``batch_size`` requests in flight."""

    decode_step_s: float
    """``d``: a decode-only step."""
    prefill: Prefill
    request_s: float
    """``T``: how long one request lasts."""
    prefill_share: float
    """``ρ``: the share of the engine's time the *other* requests' prefills take."""
    steps_after_first: float
    """``O − 1``: its decode steps after the first token."""

    @property
    def mean_step_s(self) -> float:
        """The mean step, prefill chunks included."""
        return self.request_s / (self.prefill.chunks + self.steps_after_first)


def loop_state(inputs: RooflineInputs, batch_size: float) -> LoopState:
    """``T = K·d + B·e`` and ``ρ = (B − 1)·e / T`` (module docstring)."""
    decode = step_seconds(inputs, batch_size)
    prefill = prefill_of(inputs, batch_size)
    after_first = max(0.0, inputs.output_tokens - 1)
    steps = prefill.chunks + after_first
    request = steps * decode + batch_size * prefill.extra_s
    # Prefill rides free in a memory-bound step only once a step: the engine can never finish
    # more requests than its compute allows (every prompt and output token at the roof).
    compute = (inputs.prefill_seconds + inputs.output_tokens / inputs.decode_compute_tokens_per_s)
    request = max(request, batch_size * compute * inputs.lora_step_factor
                  + steps * inputs.step_overhead_s)
    share = max(0.0, batch_size - 1) * prefill.extra_s / request
    return LoopState(decode_step_s=decode, prefill=prefill, request_s=request,
                     prefill_share=share, steps_after_first=after_first)


def request_seconds(inputs: RooflineInputs, batch_size: float) -> float:
    """How long one request lasts in the closed loop."""
    return loop_state(inputs, batch_size).request_s


def queue_wait_seconds(share: float, extra_s: float, quantile: float) -> float:
    """The ``quantile`` of the wait behind the other prefills: an M/D/1 queue of utilisation
    ``share`` and service ``extra_s`` waits with probability ``share``, then about
    exponentially with mean ``extra_s / (2(1 − share))``."""
    if share <= 0 or extra_s <= 0 or share <= 1 - quantile:
        return 0.0
    return extra_s / (2 * (1 - share)) * math.log(share / (1 - quantile))


def ttft_latency(inputs: RooflineInputs, batch_size: float,
                 uncached_tokens: float | None = None) -> Latency:
    """TTFT p50 and p99 (milliseconds) of a request with ``uncached_tokens`` to prefill
    (default: the mix's own) in a batch of ``batch_size`` requests shaped like ``inputs``."""
    state = loop_state(inputs, batch_size)
    own = prefill_of(inputs, batch_size, uncached_tokens)
    alone = own.chunks * own.step_s
    busy = max(0.0, batch_size - 1) / max(batch_size, 1.0)
    share, extra = state.prefill_share, state.prefill.extra_s
    p50 = alone + 0.5 * busy * state.mean_step_s + queue_wait_seconds(share, extra, 0.5)
    p99 = (alone * inputs.ttft_p99_over_p50 + 0.99 * busy * state.mean_step_s
           + queue_wait_seconds(share, extra, 0.99))
    return Latency(p50 * 1000, max(p50, p99) * 1000)


def ttft_seconds(inputs: RooflineInputs, batch_size: float,
                 uncached_tokens: float | None = None) -> float:
    """TTFT p50 in seconds (:func:`ttft_latency`)."""
    return ttft_latency(inputs, batch_size, uncached_tokens).p50_ms / 1000


def tpot_latency(inputs: RooflineInputs, batch_size: float) -> Latency:
    """TPOT p50 ``d / (1 − ρ)`` and p99 (milliseconds): the other prefills a request's
    ``O − 1`` decode steps meet are Poisson, the p99 meets 2.326 standard deviations more."""
    state = loop_state(inputs, batch_size)
    share, decode = state.prefill_share, state.decode_step_s
    p50 = decode / (1 - share)
    steps = max(1.0, state.steps_after_first)
    extra = state.prefill.extra_s
    met = share / (1 - share) * steps * decode / extra if extra > 0 else 0.0
    p99 = (decode * steps + extra * (met + Z99 * math.sqrt(met))) / steps
    return Latency(p50 * 1000, max(p50, p99 * inputs.tpot_p99_over_p50) * 1000)


def estimate_point(inputs: RooflineInputs, batch_size: float) -> DecodePoint:
    """TTFT and TPOT (p50 and p99) at ``batch_size`` requests in flight."""
    return DecodePoint(
        batch_size=batch_size,  # type: ignore[arg-type]
        ttft=ttft_latency(inputs, batch_size),
        tpot=tpot_latency(inputs, batch_size),
        status="assumption",
        source=(f"roofline estimate, not measured: {inputs.memory_bandwidth_gb_s:g} GB/s × "
                f"{inputs.bandwidth_efficiency:g}, prefill {inputs.prefill_tokens_per_s:,.0f} "
                f"tokens/s, decode compute {inputs.decode_compute_tokens_per_s:,.0f} tokens/s, "
                f"chunked prefill in {inputs.max_num_batched_tokens:,.0f}-token steps "
                "(capacity_model/roofline.py; measure with tools/gpu_smoke.sh)"),
    )


def estimate_profile(*, gpu: str, model: str, quantization: str, kv_cache_dtype: str,
                     inputs: RooflineInputs, batch_sizes: Sequence[int]) -> DecodeProfile:
    """A whole estimated profile (every point ``assumption``, inputs recorded)."""
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes {list(batch_sizes)}: accepted: integers >= 1")
    if not all(float(v).is_integer() for v in (inputs.prompt_tokens, inputs.output_tokens)):
        raise ValueError("a stored profile is estimated at whole prompt and output tokens, got "
                         f"{inputs.prompt_tokens!r} / {inputs.output_tokens!r}")
    points = tuple(_rounded(estimate_point(inputs, size)) for size in sizes)
    return DecodeProfile(gpu=gpu, model=model, quantization=quantization,
                         kv_cache_dtype=kv_cache_dtype, prompt_tokens=int(inputs.prompt_tokens),
                         output_tokens=int(inputs.output_tokens), points=points,
                         estimated_from=inputs.to_dict())


def _rounded(point: DecodePoint) -> DecodePoint:
    """Figures rounded as the file stores them (so a recomputed profile compares equal)."""
    return DecodePoint(batch_size=point.batch_size,
                       ttft=Latency(round(point.ttft.p50_ms, 2), round(point.ttft.p99_ms, 2)),
                       tpot=Latency(round(point.tpot.p50_ms, 2), round(point.tpot.p99_ms, 2)),
                       status=point.status, source=point.source)
