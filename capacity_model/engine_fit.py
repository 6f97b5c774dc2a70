"""The roofline's inputs fitted to a running engine, and what the model predicts for it.

``benchmarks/capacity_check.py`` checks the capacity model against vLLM's CPU build: it measures
two decode-speed profiles with :mod:`tools.decode_bench` and fits the roofline
(:mod:`capacity_model.roofline`) to them, then predicts loads it runs next. The fit:

* **the decode step** ``d(B) = h + B / Rc``: a least-squares line through the TPOT p50 of a
  profile at the mix's shape (its prefills are short beside its decodes, so its TPOT is the
  decode step, a sequence's attention over its context included) by batch size — ``h`` the
  fixed cost of a step, ``Rc`` the decode tokens a second the compute allows. A CPU has no
  memory roof apart from its compute here (the tiny model's weights sit in cache), so the
  memory term is set to nothing;
* **the prefill rate** ``R``: the difference of the single-request TTFT p50 of a *long* and the
  shorter prompt over the difference of their tokens — the HTTP and gateway time of a request
  cancels out, and is kept apart as ``request_overhead_s``;
* **the unloaded jitter**: the p99 over p50 of both at batch 1.

**What differs from a GPU.** On the CPU build the gateway's and the client's per-request work
(HTTP, the chat template, tokenizing, admission) runs on the same cores as the engine, so it is
not only latency: it takes those cores from the engine's steps. :meth:`EngineFit.inputs` counts
it as the prompt tokens the engine could have prefilled in that time
(:attr:`EngineFit.serial_request_tokens`) — a first check without it predicted the closed loops'
throughput 6 % high and the open loop's ceiling far too high. On a GPU host that work runs on
the CPU beside the GPU's steps, so the GPU estimates leave it out.

:func:`open_loop_batch` turns an arrival rate into the batch it keeps in flight (Little's law at
the closed loop's request time), which is how the model predicts an open-loop load.

Pure module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from capacity_model.decode_speed import DecodeProfile
from capacity_model.roofline import RooflineInputs, request_seconds


class FitError(ValueError):
    """The profiles cannot be fitted (too few points, or a faster long prompt)."""


@dataclass(frozen=True)
class EngineFit:
    """The fitted rates of one engine."""

    step_overhead_s: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    request_overhead_s: float
    ttft_jitter: float
    tpot_jitter: float

    @property
    def serial_request_tokens(self) -> float:
        """The per-request overhead as prompt tokens: what the engine's cores could prefill
        while the gateway and the client work on a request (module docstring)."""
        return self.request_overhead_s * self.prefill_tokens_per_s

    def inputs(self, *, prompt_tokens: float, cached_prompt_tokens: float,
               output_tokens: float, max_num_batched_tokens: int) -> RooflineInputs:
        """The roofline at a request shape, with these rates (no memory roof) and the
        per-request overhead counted as :attr:`serial_request_tokens` more to prefill."""
        return RooflineInputs(
            weights_bytes=1.0, kv_bytes_per_token=1e-9, memory_bandwidth_gb_s=1e6,
            bandwidth_efficiency=1.0, prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_compute_tokens_per_s=self.decode_tokens_per_s,
            prompt_tokens=prompt_tokens + self.serial_request_tokens,
            cached_prompt_tokens=cached_prompt_tokens, output_tokens=output_tokens,
            ttft_p99_over_p50=self.ttft_jitter, tpot_p99_over_p50=self.tpot_jitter,
            max_num_batched_tokens=max_num_batched_tokens,
            step_overhead_s=self.step_overhead_s)


def line_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``y = a + b·x``; FitError for fewer than two
    distinct ``x``."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise FitError(f"a line needs two distinct batch sizes, got {sorted(set(xs))}")
    mean_x = sum(xs) / len(xs)
    mean_y = sum(y for _, y in points) / len(points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x in xs))
    return mean_y - slope * mean_x, slope


def fit_engine(short: DecodeProfile, long: DecodeProfile) -> EngineFit:
    """Fit :class:`EngineFit` to a short-prompt profile at several batch sizes and a
    long-prompt one with a batch-1 point (module docstring)."""
    overhead, per_sequence = line_fit([(p.batch_size, p.tpot.p50_ms / 1000)
                                       for p in short.points])
    if per_sequence <= 0:
        raise FitError(f"the decode step does not grow with the batch ({per_sequence * 1000:.3f}"
                       " ms a sequence): measure larger batches")
    one_short, one_long = short.at(1), long.at(1)
    extra_tokens = long.prompt_tokens - short.prompt_tokens
    extra_s = (one_long.ttft.p50_ms - one_short.ttft.p50_ms) / 1000
    if extra_tokens <= 0 or extra_s <= 0:
        raise FitError(f"the long prompt ({long.prompt_tokens} tokens, TTFT "
                       f"{one_long.ttft.p50_ms:.1f} ms) must be longer and slower than the "
                       f"short one ({short.prompt_tokens}, {one_short.ttft.p50_ms:.1f} ms)")
    prefill = extra_tokens / extra_s
    step_alone = max(0.0, overhead) + short.prompt_tokens / prefill
    return EngineFit(
        step_overhead_s=max(0.0, overhead), decode_tokens_per_s=1 / per_sequence,
        prefill_tokens_per_s=prefill,
        request_overhead_s=max(0.0, one_short.ttft.p50_ms / 1000 - step_alone),
        ttft_jitter=max(1.0, one_long.ttft.p99_ms / one_long.ttft.p50_ms),
        tpot_jitter=max(1.0, one_short.tpot.p99_ms / one_short.tpot.p50_ms))


def open_loop_batch(inputs: RooflineInputs, per_second: float, max_batch: int) -> float | None:
    """The batch ``B`` whose closed loop finishes ``per_second`` requests a second (``B / T(B)
    = rate``, Little's law); None when even ``max_batch`` cannot (the load is beyond the
    engine: its queue grows without bound)."""
    if max_batch / request_seconds(inputs, max_batch) < per_second:
        return None
    low, high = 1e-6, float(max_batch)
    for _ in range(60):
        middle = (low + high) / 2
        if middle / request_seconds(inputs, middle) < per_second:
            low = middle
        else:
            high = middle
    return high


def ratio(predicted: float, measured: float) -> float:
    """Predicted over measured (inf when nothing was measured)."""
    return predicted / measured if measured else math.inf
