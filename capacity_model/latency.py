"""The latency curve one instance runs at: measured, or estimated from the GPU's rates.

:func:`instance_capacity` needs, for the request mix it sizes, the TTFT and TPOT (p50, p99)
at each number of requests in flight, and the TTFT of each bucket's typical request inside that
batch. Two sources give it:

* **a measured profile** (``config/decode_speed.json``, written by ``tools/gpu_smoke.sh``):
  its points at its own request shape; a request's TTFT is scaled by its *uncached* prompt
  tokens over the profile's prompt (a prefill is proportional to the tokens it computes; the
  benchmark's prompts are unique, so nothing of them was cached);
* **an estimate** (the profile carries ``estimated_from``): the roofline
  (:mod:`capacity_model.roofline`) recomputed at the mix's own shape — its mean prompt, the
  mean of it the prefix cache serves, its mean output — from the GPU's rates in the chosen
  scenario (:mod:`capacity_model.rates`), with the tail ratios the stored estimate records. So
  prefix reuse shortens every prefill in the model, and the TTFT of an XL turn is its own
  uncached tokens' prefill behind the batch's queue.

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from capacity_model.decode_speed import DecodePoint, DecodeProfile, FigureStatus, Latency
from capacity_model.rates import GpuRates, Scenario
from capacity_model.roofline import (
    RooflineInputs,
    estimate_point,
    ttft_latency,
)
from gpu_budget import MemoryPlan


class LatencyModel(Protocol):
    """What :func:`capacity_model.instance.instance_capacity` reads."""

    @property
    def max_batch_size(self) -> int:
        """The largest batch the model knows."""
        ...

    @property
    def status(self) -> FigureStatus:
        """``measured`` or ``assumption``."""
        ...

    def describe(self) -> str:
        """How messages name it."""
        ...

    def at(self, batch_size: float) -> DecodePoint:
        """TTFT (of the mix's mean request) and TPOT at ``batch_size`` requests in flight."""
        ...

    def ttft_of(self, batch_size: float, uncached_tokens: float) -> Latency:
        """TTFT of a request that prefills ``uncached_tokens`` in that batch."""
        ...

    def __hash__(self) -> int:
        """Frozen dataclasses hash by value, so the SLO limit is remembered by the model (a
        measured profile whose sources are a dict raises TypeError and is not remembered)."""
        ...


@dataclass(frozen=True)
class MeasuredLatency:
    """A measured profile, TTFT scaled by uncached prompt tokens."""

    profile: DecodeProfile
    mean_uncached_tokens: float

    @property
    def max_batch_size(self) -> int:
        """The profile's last point."""
        return self.profile.max_batch_size

    @property
    def status(self) -> FigureStatus:
        """The profile's status."""
        return self.profile.status

    def describe(self) -> str:
        """The profile's name."""
        return self.profile.describe()

    def at(self, batch_size: float) -> DecodePoint:
        """The profile's point, TTFT scaled to the mix's mean uncached prompt."""
        point = self.profile.at(batch_size)
        return replace(point, ttft=self.ttft_of(batch_size, self.mean_uncached_tokens))

    def ttft_of(self, batch_size: float, uncached_tokens: float) -> Latency:
        """Scaled by ``uncached_tokens`` over the profile's (uncached) prompt."""
        return self.profile.at(batch_size).ttft.scaled(
            uncached_tokens / self.profile.prompt_tokens)


@dataclass(frozen=True)
class RooflineLatency:
    """The roofline at the mix's shape."""

    inputs: RooflineInputs
    batch_limit: int
    name: str

    @property
    def max_batch_size(self) -> int:
        """As far as the engine batches (``max_num_seqs``)."""
        return self.batch_limit

    @property
    def status(self) -> FigureStatus:
        """Always an estimate."""
        return "assumption"

    def describe(self) -> str:
        """The profile it re-estimates, and at which shape."""
        return self.name

    def at(self, batch_size: float) -> DecodePoint:
        """The roofline point (``batch_size`` need not be whole)."""
        return estimate_point(self.inputs, batch_size)

    def ttft_of(self, batch_size: float, uncached_tokens: float) -> Latency:
        """Its own chunked prefill behind the step in progress and the batch's prefill queue."""
        return ttft_latency(self.inputs, batch_size, uncached_tokens)


@dataclass(frozen=True)
class RequestShape:
    """The mix's mean request: prompt tokens, the part the prefix cache serves, output."""

    prompt_tokens: float
    cached_prompt_tokens: float
    output_tokens: float

    @property
    def uncached_tokens(self) -> float:
        """What a prefill computes."""
        return self.prompt_tokens - self.cached_prompt_tokens


def roofline_inputs(rates: GpuRates, scenario: Scenario, plan: MemoryPlan,
                    shape: RequestShape, *, ttft_p99_over_p50: float, tpot_p99_over_p50: float,
                    prefill_factor: float = 1.0, step_overhead_s: float = 0.0,
                    lora_step_factor: float | None = None,
                    decode_compute_efficiency: float | None = None) -> RooflineInputs:
    """The roofline's inputs for ``plan`` running ``shape`` at ``scenario``'s rates (chunked
    prefill in the plan's ``max_num_batched_tokens``); ``prefill_factor`` multiplies the
    prefill rate (a what-if: the cost report's sensitivity). ``lora_step_factor`` (default:
    the rates' at ``scenario`` when the plan serves adapters, else 1) and
    ``decode_compute_efficiency`` (default: the rates' at ``scenario``) are what-ifs across
    their ranges."""
    lora = (lora_step_factor if lora_step_factor is not None
            else rates.lora_factor(scenario) if plan.max_loras > 0 else 1.0)
    decode = rates.decode_compute_tokens_per_s(scenario)
    if decode_compute_efficiency is not None:
        decode = (rates.tensor_peak_tflops.pick(scenario) * 1e12 * decode_compute_efficiency
                  / rates.decode_flops_per_token)
    return RooflineInputs(
        weights_bytes=plan.weights_bytes, kv_bytes_per_token=plan.kv_bytes_per_token,
        memory_bandwidth_gb_s=rates.memory_bandwidth_gb_s,
        bandwidth_efficiency=rates.bandwidth_efficiency.pick(scenario),
        prefill_tokens_per_s=rates.prefill_tokens_per_s(scenario) * prefill_factor,
        decode_compute_tokens_per_s=decode,
        prompt_tokens=shape.prompt_tokens, cached_prompt_tokens=shape.cached_prompt_tokens,
        output_tokens=shape.output_tokens, ttft_p99_over_p50=ttft_p99_over_p50,
        tpot_p99_over_p50=tpot_p99_over_p50,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        step_overhead_s=step_overhead_s, lora_step_factor=lora)


def latency_model(profile: DecodeProfile, *, rates: GpuRates | None, scenario: Scenario,
                  plan: MemoryPlan, shape: RequestShape, prefill_factor: float = 1.0,
                  lora_step_factor: float | None = None,
                  decode_compute_efficiency: float | None = None) -> LatencyModel:
    """The measured profile as it is, or the estimate recomputed at ``shape`` from ``rates``.

    An estimated profile without rates falls back to its stored points (scaled like a
    measured one)."""
    if not profile.estimated_from or rates is None:
        return MeasuredLatency(profile, shape.uncached_tokens)
    stored = profile.estimated_from
    inputs = roofline_inputs(rates, scenario, plan, shape,
                             ttft_p99_over_p50=stored["ttft_p99_over_p50"],
                             tpot_p99_over_p50=stored["tpot_p99_over_p50"],
                             prefill_factor=prefill_factor,
                             step_overhead_s=stored.get("step_overhead_s", 0.0),
                             lora_step_factor=lora_step_factor,
                             decode_compute_efficiency=decode_compute_efficiency)
    factor = "" if prefill_factor == 1 else f", prefill × {prefill_factor:g}"
    if inputs.lora_step_factor != 1:
        factor += f", LoRA step × {inputs.lora_step_factor:g}"
    return RooflineLatency(
        inputs=inputs, batch_limit=plan.max_num_seqs,
        name=(f"{profile.describe()}, re-estimated at the mix's shape from the {scenario} "
              f"rates ({inputs.prefill_tokens_per_s:,.0f} prefill tokens/s, "
              f"decode compute {inputs.decode_compute_tokens_per_s:,.0f} tokens/s, "
              f"{rates.memory_bandwidth_gb_s:g} GB/s × {inputs.bandwidth_efficiency:g}"
              f"{factor})"))
