"""An estimate of the decode-speed curve, for GPUs and models nobody has measured yet.

The decode-speed table (:mod:`capacity_model.decode_speed`) should hold measurements, but this
project has not run vLLM on an A10G (``scripts/gpu-smoke.sh`` does that and writes its figures
back). Until then the table holds this estimate, marked ``assumption``, with its inputs recorded in
the profile (``estimated_from``) so that a test can recompute it and the file cannot drift from
the method it claims.

The model is a closed loop of ``B`` requests in flight, each ``P`` prompt tokens in and ``O``
tokens out, replaced as soon as it finishes (what ``vllm bench serve --max-concurrency B`` and
:mod:`tools.decode_bench` measure):

* **Decode is memory-bound.** Each engine step reads every weight once and the KV cache of every
  running sequence (PagedAttention): ``d(B) = (W + B × (P + O/2) × kv) / (bandwidth ×
  efficiency)``. A single A100 decodes Llama-3.1-8B at one request at ≈ 77 % of its
  memory-bandwidth ceiling (J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100"); the
  A10G's bandwidth is 600 GB/s (Baseten, "NVIDIA A10 vs A10G for ML model inference").
* **Prefill is compute-bound** and costs ``a = P / R`` seconds of the GPU per request at a
  prefill rate of ``R`` prompt tokens per second. vLLM's chunked prefill runs it inside the same
  steps as the decodes, so while the GPU prefills it does not decode.
* **Steady state.** Per request the GPU spends ``a`` prefilling and ``O`` decode steps; the
  ``B`` requests' prefills take the share ``B·a/T`` of the time, so a request lasts
  ``T = a + d + O·d / (1 − B·a/T)``, a quadratic in ``T``; then ``TPOT = (T − a − d) / O``.
  The first token comes after its own prefill, slowed by the other ``B − 1`` requests' (a queue
  in front of the prefill), plus one step: ``TTFT = a / (1 − (B−1)·a/T) + d`` (the duration
  equation counts only ``a + d``: the difference is the queueing the closed loop hides).
* **Tails.** p99 = p50 × a ratio taken from a published ``vllm bench serve`` run at concurrency 8
  (Qwen3-8B, 2,048-token prompts: TTFT p99/median 2,200.61/959.99 ms = 2.29, TPOT 90.57/86.05 ms
  = 1.05; J. Wang, "Jetson Thor LLM benchmarking", 2025-10-12).

It ignores prefix caching (the shared system prompt is usually cached, which makes real prefills
shorter), LoRA adapter reads and CUDA-graph effects; a measurement replaces all of it.

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
    prompt_tokens: int
    output_tokens: int
    ttft_p99_over_p50: float
    tpot_p99_over_p50: float

    def __post_init__(self) -> None:
        for item in fields(self):
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
        values = {name: float(value) for name, value in data.items()}
        return cls(
            weights_bytes=values["weights_bytes"],
            kv_bytes_per_token=values["kv_bytes_per_token"],
            memory_bandwidth_gb_s=values["memory_bandwidth_gb_s"],
            bandwidth_efficiency=values["bandwidth_efficiency"],
            prefill_tokens_per_s=values["prefill_tokens_per_s"],
            prompt_tokens=int(values["prompt_tokens"]),
            output_tokens=int(values["output_tokens"]),
            ttft_p99_over_p50=values["ttft_p99_over_p50"],
            tpot_p99_over_p50=values["tpot_p99_over_p50"],
        )


def step_seconds(inputs: RooflineInputs, batch_size: int) -> float:
    """One decode step with ``batch_size`` sequences: weights + their KV, at the usable
    bandwidth."""
    mean_context = inputs.prompt_tokens + inputs.output_tokens / 2
    read = inputs.weights_bytes + batch_size * mean_context * inputs.kv_bytes_per_token
    return read / (inputs.memory_bandwidth_gb_s * GB * inputs.bandwidth_efficiency)


def request_seconds(inputs: RooflineInputs, batch_size: int) -> float:
    """How long one request lasts in the closed loop (the larger root of the quadratic)."""
    prefill = inputs.prompt_tokens / inputs.prefill_tokens_per_s
    step = step_seconds(inputs, batch_size)
    # (T − a − d)(T − B·a) = O·d·T  →  T² − T(a + d + B·a + O·d) + B·a(a + d) = 0
    total = prefill + step + batch_size * prefill + inputs.output_tokens * step
    return (total + math.sqrt(total * total - 4 * batch_size * prefill * (prefill + step))) / 2


def estimate_point(inputs: RooflineInputs, batch_size: int) -> DecodePoint:
    """TTFT and TPOT (p50 and p99) at ``batch_size`` requests in flight."""
    prefill = inputs.prompt_tokens / inputs.prefill_tokens_per_s
    step = step_seconds(inputs, batch_size)
    duration = request_seconds(inputs, batch_size)
    tpot_s = (duration - prefill - step) / inputs.output_tokens
    others_prefilling = (batch_size - 1) * prefill / duration
    ttft_s = prefill / (1 - others_prefilling) + step
    return DecodePoint(
        batch_size=batch_size,
        ttft=Latency(ttft_s * 1000, ttft_s * 1000 * inputs.ttft_p99_over_p50),
        tpot=Latency(tpot_s * 1000, tpot_s * 1000 * inputs.tpot_p99_over_p50),
        status="assumption",
        source=(f"roofline estimate, not measured: {inputs.memory_bandwidth_gb_s:g} GB/s × "
                f"{inputs.bandwidth_efficiency:g}, prefill {inputs.prefill_tokens_per_s:,.0f} "
                "tokens/s (capacity_model/roofline.py; measure with scripts/gpu-smoke.sh)"),
    )


def estimate_profile(*, gpu: str, model: str, quantization: str, kv_cache_dtype: str,
                     inputs: RooflineInputs, batch_sizes: Sequence[int]) -> DecodeProfile:
    """A whole estimated profile (every point ``assumption``, inputs recorded)."""
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes {list(batch_sizes)}: accepted: integers >= 1")
    points = tuple(_rounded(estimate_point(inputs, size)) for size in sizes)
    return DecodeProfile(gpu=gpu, model=model, quantization=quantization,
                         kv_cache_dtype=kv_cache_dtype, prompt_tokens=inputs.prompt_tokens,
                         output_tokens=inputs.output_tokens, points=points,
                         estimated_from=inputs.to_dict())


def _rounded(point: DecodePoint) -> DecodePoint:
    """Figures rounded as the file stores them (so a recomputed profile compares equal)."""
    return DecodePoint(batch_size=point.batch_size,
                       ttft=Latency(round(point.ttft.p50_ms, 2), round(point.ttft.p99_ms, 2)),
                       tpot=Latency(round(point.tpot.p50_ms, 2), round(point.tpot.p99_ms, 2)),
                       status=point.status, source=point.source)
