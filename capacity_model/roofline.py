"""An estimate of the latency curve from the GPU's two rates, for set-ups nobody has measured yet.

The decode-speed table (:mod:`capacity_model.decode_speed`) should hold measurements, but this
project has not run vLLM on an A10G (``tools/gpu_smoke.sh`` does that and writes its figures
back). Until then the capacity model estimates the curve from the GPU's rates
(:mod:`capacity_model.rates`: memory bandwidth and compute, each a sourced range), and the table
keeps one estimate per profile, marked ``assumption``, with its inputs recorded
(``estimated_from``) so that a test can recompute it and the file cannot drift from its method.

The model is a closed loop of ``B`` requests in flight, each ``P`` prompt tokens in (``C`` of
them served from the prefix cache) and ``O`` tokens out, replaced as soon as it finishes (what
``vllm bench serve --max-concurrency B`` and :mod:`tools.decode_bench` measure):

* **A decode step** reads every weight once and the KV cache of every running sequence
  (PagedAttention), at the usable bandwidth; it also computes ``B`` tokens, each worth the
  FLOPs of a prompt token plus the output projection. Its time is the larger of the two (the
  roofline): ``d(B) = max((W + B × (P + O/2) × kv) / (bandwidth × efficiency), B / Rc)`` with
  ``Rc`` the compute roof in decode tokens per second. Cached prompt tokens are read like any
  other: the cache saves their computation, not their KV.
* **Prefill** is compute-bound and costs ``a = (P − C) / R`` seconds of the GPU per request at a
  prefill rate of ``R`` prompt tokens per second. vLLM's chunked prefill runs it inside the same
  steps as the decodes, so while the GPU prefills it does not decode.
* **Steady state.** Per request the GPU spends ``a`` prefilling and ``O`` decode steps; the
  ``B`` requests' prefills take the share ``B·a/T`` of the time, so a request lasts
  ``T = a + d + O·d / (1 − B·a/T)``, a quadratic in ``T``; then ``TPOT = (T − a − d) / O``.
  The first token comes after its own prefill, slowed by the other ``B − 1`` requests' (a queue
  in front of the prefill), plus one step: ``TTFT = a / (1 − (B−1)·a/T) + d`` (the duration
  equation counts only ``a + d``: the difference is the queueing the closed loop hides). A
  request of another size in the same batch waits the same queue for its own prefill:
  :func:`ttft_seconds` with its own uncached tokens.
* **Tails.** p99 = p50 × a ratio taken from a published ``vllm bench serve`` run at concurrency 8
  (Qwen3-8B, 2,048-token prompts: TTFT p99/median 2,200.61/959.99 ms = 2.29, TPOT 90.57/86.05 ms
  = 1.05; J. Wang, "Jetson Thor LLM benchmarking", 2025-10-12).

It ignores LoRA adapter reads and CUDA-graph effects; a measurement replaces all of it.

Pure module: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from capacity_model.decode_speed import DecodePoint, DecodeProfile, Latency

GB = 1e9


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
    tpot_p99_over_p50: float

    def __post_init__(self) -> None:
        cached = self.cached_prompt_tokens
        if not (isinstance(cached, int | float) and math.isfinite(cached)
                and 0 <= cached < self.prompt_tokens):
            raise ValueError(f"roofline input cached_prompt_tokens: {cached!r} is not "
                             f"accepted; accepted: 0 <= cached < prompt_tokens "
                             f"({self.prompt_tokens!r})")
        for item in fields(self):
            if item.name == "cached_prompt_tokens":
                continue
            value = getattr(self, item.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"roofline input {item.name}: {value!r} is not accepted; "
                                 "accepted: a number > 0")
        if self.bandwidth_efficiency > 1:
            raise ValueError(f"roofline input bandwidth_efficiency: {self.bandwidth_efficiency}"
                             " is not accepted; accepted: (0, 1]")
        for name in ("ttft_p99_over_p50", "tpot_p99_over_p50"):
            if getattr(self, name) < 1:
                raise ValueError(f"roofline input {name}: {getattr(self, name)} is not "
                                 "accepted; accepted: >= 1 (p99 is not below p50)")

    def to_dict(self) -> dict[str, float]:
        """The ``estimated_from`` block of a profile."""
        return {item.name: float(getattr(self, item.name)) for item in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> RooflineInputs:
        """Inverse of :meth:`to_dict`; ValueError names a missing or unknown input."""
        expected = {item.name for item in fields(cls)}
        if set(data) != expected:
            raise ValueError(f"estimated_from: missing {sorted(expected - set(data))}, unknown "
                             f"{sorted(set(data) - expected)}")
        return cls(**{name: float(value) for name, value in data.items()})

    @property
    def prefill_seconds(self) -> float:
        """``a``: the GPU time of one request's prefill (its uncached prompt tokens)."""
        return (self.prompt_tokens - self.cached_prompt_tokens) / self.prefill_tokens_per_s


def step_seconds(inputs: RooflineInputs, batch_size: float) -> float:
    """One decode step with ``batch_size`` sequences: weights + their KV at the usable
    bandwidth, or their tokens' FLOPs at the compute roof, whichever takes longer."""
    mean_context = inputs.prompt_tokens + inputs.output_tokens / 2
    read = inputs.weights_bytes + batch_size * mean_context * inputs.kv_bytes_per_token
    memory = read / (inputs.memory_bandwidth_gb_s * GB * inputs.bandwidth_efficiency)
    return max(memory, batch_size / inputs.decode_compute_tokens_per_s)


def request_seconds(inputs: RooflineInputs, batch_size: float) -> float:
    """How long one request lasts in the closed loop (the larger root of the quadratic)."""
    prefill = inputs.prefill_seconds
    step = step_seconds(inputs, batch_size)
    # (T − a − d)(T − B·a) = O·d·T  →  T² − T(a + d + B·a + O·d) + B·a(a + d) = 0
    total = prefill + step + batch_size * prefill + inputs.output_tokens * step
    return (total + math.sqrt(total * total - 4 * batch_size * prefill * (prefill + step))) / 2


def ttft_seconds(inputs: RooflineInputs, batch_size: float,
                 uncached_tokens: float | None = None) -> float:
    """TTFT p50 of a request with ``uncached_tokens`` to prefill (default: the mix's own) in a
    batch of ``batch_size`` requests shaped like ``inputs``."""
    prefill = inputs.prefill_seconds
    own = prefill if uncached_tokens is None else uncached_tokens / inputs.prefill_tokens_per_s
    others_prefilling = (batch_size - 1) * prefill / request_seconds(inputs, batch_size)
    return own / (1 - others_prefilling) + step_seconds(inputs, batch_size)


def estimate_point(inputs: RooflineInputs, batch_size: int) -> DecodePoint:
    """TTFT and TPOT (p50 and p99) at ``batch_size`` requests in flight."""
    step = step_seconds(inputs, batch_size)
    duration = request_seconds(inputs, batch_size)
    tpot_s = (duration - inputs.prefill_seconds - step) / inputs.output_tokens
    ttft_s = ttft_seconds(inputs, batch_size)
    return DecodePoint(
        batch_size=batch_size,
        ttft=Latency(ttft_s * 1000, ttft_s * 1000 * inputs.ttft_p99_over_p50),
        tpot=Latency(tpot_s * 1000, tpot_s * 1000 * inputs.tpot_p99_over_p50),
        status="assumption",
        source=(f"roofline estimate, not measured: {inputs.memory_bandwidth_gb_s:g} GB/s × "
                f"{inputs.bandwidth_efficiency:g}, prefill {inputs.prefill_tokens_per_s:,.0f} "
                f"tokens/s, decode compute {inputs.decode_compute_tokens_per_s:,.0f} tokens/s "
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
