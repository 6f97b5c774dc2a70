"""The roofline's inputs fitted to a running engine, and what the model predicts for it.

``benchmarks/capacity_check.py`` checks the capacity model against vLLM's CPU build: it measures
decode-speed profiles with :mod:`tools.decode_bench` and fits the roofline
(:mod:`capacity_model.roofline`) to them, then predicts loads it runs next. The fit:

* **the first token alone** ``TTFT(P) = f + h + P / R``: a least-squares line through the
  single-request TTFT p50 of three or more prompt lengths — its slope the prefill rate ``R``,
  its intercept the fixed step ``h`` plus the **front end** ``f``, the per-request work in
  front of the engine (HTTP, the gateway rendering and tokenizing the prompt), which
  :mod:`capacity_model.queue_sim` runs as a FIFO server: simultaneous arrivals queue for it;
* **the decode step** ``d(B) = h + B / Rc``: least squares through a closed loop's TPOT p50
  by batch size, less what the other requests add to it: in a closed loop of ``B`` with
  ``n``-token answers each of the other ``B − 1`` passes the front end and prefills its ``P``
  tokens about once in a request's ``n`` steps, so ``(B − 1) / n × (f + P / R)`` a token, the
  front end's ``f`` included because on the CPU host it runs on the engine's cores (the
  simulation's ``shared_cores_s``; the benchmark client's own work a request, which the check
  also charges there, is not taken out here and stays in the fitted step). With ``f = a − h``
  (``a`` the first-token line's intercept) that is linear in ``h`` and ``1 / Rc``:
  ``TPOT − (B − 1)/n × (a + P/R) = h × (1 − (B − 1)/n) + B / Rc``. The simulation adds both
  back where they fall. A CPU has no memory roof apart from its compute here (the tiny model's
  weights sit in cache), so the memory term is set to nothing;
* **the unloaded jitter**: the p99 over p50 of the first token (longest prompt) and of the
  decode step at batch 1.

Issue 39's first run counted the per-request work as prompt tokens the engine could have
prefilled in that time; with a two-point prefill fit under a loaded host that became ~27,000
tokens a request and every prediction 4–27 × slow. It is time now, in its own queue.

:func:`open_loop_batch` turns an arrival rate into the batch it keeps in flight (Little's law at
the closed loop's request time), which is how the plan's seed check reads an arrival rate.

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
    front_end_s: float
    """The serial per-request work in front of the engine (module docstring)."""
    ttft_jitter: float
    tpot_jitter: float

    def inputs(self, *, prompt_tokens: float, cached_prompt_tokens: float,
               output_tokens: float, max_num_batched_tokens: int) -> RooflineInputs:
        """The roofline at a request shape, with these rates (no memory roof); the front end
        is the simulation's (``front_end_s``), not the roofline's."""
        return RooflineInputs(
            weights_bytes=1.0, kv_bytes_per_token=1e-9, memory_bandwidth_gb_s=1e6,
            bandwidth_efficiency=1.0, prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_compute_tokens_per_s=self.decode_tokens_per_s,
            prompt_tokens=prompt_tokens, cached_prompt_tokens=cached_prompt_tokens,
            output_tokens=output_tokens, ttft_p99_over_p50=self.ttft_jitter,
            tpot_p99_over_p50=self.tpot_jitter, max_num_batched_tokens=max_num_batched_tokens,
            step_overhead_s=self.step_overhead_s)


@dataclass(frozen=True)
class ClientCost:
    """A benchmark client's own CPU a request and a streamed token, from two sets of requests
    with different answer lengths (two equations, two unknowns): on the CPU host it runs on
    the engine's cores too (``benchmarks/capacity_check.py``)."""

    per_request_s: float
    per_token_s: float

    @classmethod
    def solve(cls, first: tuple[float, int, int], second: tuple[float, int, int]) -> ClientCost:
        """From ``(cpu seconds, requests, tokens)`` of two sets; zeros when they cannot be
        told apart, no cost below 0."""
        (c1, r1, t1), (c2, r2, t2) = first, second
        det = r1 * t2 - r2 * t1
        if not det:
            return cls(0.0, 0.0)
        per_token = (r1 * c2 - r2 * c1) / det
        per_request = (c1 * t2 - c2 * t1) / det
        return cls(max(0.0, per_request), max(0.0, per_token))


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


def plane_fit(points: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Least-squares ``h`` and ``c`` of ``y = h·u + c·v`` (no intercept) over ``(u, v, y)``;
    FitError when the points cannot separate them (fewer than two distinct batch sizes)."""
    suu = sum(u * u for u, _, _ in points)
    svv = sum(v * v for _, v, _ in points)
    suv = sum(u * v for u, v, _ in points)
    det = suu * svv - suv * suv
    if len({v for _, v, _ in points}) < 2 or abs(det) <= 1e-12 * max(1.0, suu * svv):
        raise FitError(f"a line needs two distinct batch sizes, got "
                       f"{sorted({v for _, v, _ in points})}")
    suy = sum(u * y for u, _, y in points)
    svy = sum(v * y for _, v, y in points)
    return (suy * svv - svy * suv) / det, (svy * suu - suy * suv) / det


def fit_engine(decode: DecodeProfile, prompts: Sequence[DecodeProfile]) -> EngineFit:
    """Fit :class:`EngineFit` to a closed-loop profile at several batch sizes (``decode``) and
    single-request profiles at three or more prompt lengths (``prompts``, each with a batch-1
    point); module docstring. FitError names what cannot be fitted."""
    lengths = sorted({p.prompt_tokens for p in prompts})
    if len(lengths) < 3:
        raise FitError(f"the prefill line needs three prompt lengths, got {lengths}")
    alone = sorted(prompts, key=lambda p: p.prompt_tokens)
    intercept, seconds_a_token = line_fit([(p.prompt_tokens, p.at(1).ttft.p50_ms / 1000)
                                           for p in alone])
    if seconds_a_token <= 0:
        raise FitError(f"the first token does not grow with the prompt over {lengths} tokens "
                       f"({seconds_a_token * 1e6:.3f} µs a token): measure longer prompts")
    prefill = 1 / seconds_a_token
    answer = max(1, decode.output_tokens)
    others = intercept + decode.prompt_tokens / prefill  # one other request: f + h + P / R
    step, per_sequence = plane_fit([
        (1 - (p.batch_size - 1) / answer, p.batch_size,
         p.tpot.p50_ms / 1000 - (p.batch_size - 1) / answer * others)
        for p in decode.points])
    if per_sequence <= 0:
        raise FitError(f"the decode step does not grow with the batch ({per_sequence * 1000:.3f}"
                       " ms a sequence): measure larger batches")
    step = max(0.0, step)
    return EngineFit(
        step_overhead_s=step, decode_tokens_per_s=1 / per_sequence,
        prefill_tokens_per_s=prefill, front_end_s=max(0.0, intercept - step),
        ttft_jitter=max(1.0, alone[-1].at(1).ttft.p99_ms / alone[-1].at(1).ttft.p50_ms),
        tpot_jitter=max(1.0, decode.at(1).tpot.p99_ms / decode.at(1).tpot.p50_ms))


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
