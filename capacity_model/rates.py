"""The engine's two rates, with their sources and ranges: how fast a GPU prefills and decodes.

Everything the capacity model says about one instance rests on two physical rates of the GPU
serving the model (:mod:`capacity_model.roofline` turns them into latencies):

* **decode** is memory-bound: a step reads every weight and the KV cache of every running
  sequence, so its rate is the GPU's memory bandwidth × the share of it the engine reaches
  (``bandwidth_efficiency``);
* **prefill** is compute-bound: a prompt token costs ``2 × linear parameters`` FLOPs (the
  attention's share is a few per cent at these lengths and is left out), so its rate is the
  GPU's dense FP16 tensor peak × the share of it the engine reaches (``compute_efficiency``,
  the model-FLOPs utilisation) ÷ those FLOPs. A decode token costs the same FLOPs plus the
  output projection, so the same figures bound a decode step from the compute side too.

Neither has been measured on this platform's stack (vLLM, the AWQ checkpoint, an A10G): the
figures are published specifications and measurements of other set-ups, each a **range**
(low / central / high) with its sources written next to it in ``config/decode_speed.json``
(``rates``) and marked ``assumption``. The capacity model sizes the fleet at the central values
and prices it at all three (:data:`SCENARIOS`: *pessimistic* takes every rate at the slow end,
*optimistic* at the fast end); ``tools/gpu_smoke.sh`` measures the real curve and replaces
the estimate.

Pure module: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Scenario = Literal["pessimistic", "central", "optimistic"]
SCENARIOS: tuple[Scenario, ...] = ("pessimistic", "central", "optimistic")
TERA = 1e12
RANGE_KEYS = ("low", "central", "high")


class RatesError(ValueError):
    """A rates entry the model cannot use; the message names the entry, field and value."""


@dataclass(frozen=True)
class RateRange:
    """One rate's low, central and high value (low <= central <= high, all > 0)."""

    low: float
    central: float
    high: float

    def __post_init__(self) -> None:
        values = (self.low, self.central, self.high)
        if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values):
            raise RatesError(f"range {values}: accepted: numbers > 0")
        if not self.low <= self.central <= self.high:
            raise RatesError(f"range low {self.low:g} / central {self.central:g} / high "
                             f"{self.high:g}: accepted: low <= central <= high")

    def pick(self, scenario: Scenario) -> float:
        """The value a scenario takes: pessimistic the low end, optimistic the high end (every
        range here is "higher is faster")."""
        if scenario not in SCENARIOS:
            raise RatesError(f"scenario {scenario!r}: accepted: {', '.join(SCENARIOS)}")
        return {"pessimistic": self.low, "central": self.central,
                "optimistic": self.high}[scenario]

    def to_dict(self) -> dict[str, float]:
        """JSON form."""
        return {"low": self.low, "central": self.central, "high": self.high}


@dataclass(frozen=True)
class GpuRates:
    """The rates of one model and weight format on one GPU, and where they come from."""

    gpu: str
    model: str
    quantization: str
    memory_bandwidth_gb_s: float
    bandwidth_efficiency: RateRange
    tensor_peak_tflops: RateRange
    compute_efficiency: RateRange
    prefill_flops_per_token: float
    decode_flops_per_token: float
    status: Literal["assumption", "measured"]
    sources: tuple[str, ...]
    decode_compute_efficiency: RateRange | None = None
    """The model-FLOPs utilisation of a *decode* step (small-M GEMMs: a few dozen tokens
    against every weight); None: the prefill's ``compute_efficiency``."""
    lora_step_factor: RateRange | None = None
    """What serving LoRA adapters multiplies a step's time by (low / central / high slowdown;
    "higher is slower", so the pessimistic scenario takes ``high``); None: no cost known."""

    @property
    def key(self) -> tuple[str, str, str]:
        """What a plan looks its rates up by (the KV dtype does not change them)."""
        return (self.gpu, self.model, self.quantization)

    def describe(self) -> str:
        """How messages name the entry."""
        return f"rates {self.gpu} / {self.model} / {self.quantization}"

    def prefill_tokens_per_s(self, scenario: Scenario = "central") -> float:
        """Prompt tokens one GPU prefills per second in ``scenario``."""
        flops = self.tensor_peak_tflops.pick(scenario) * TERA * self.compute_efficiency.pick(
            scenario)
        return flops / self.prefill_flops_per_token

    def decode_compute_tokens_per_s(self, scenario: Scenario = "central") -> float:
        """Decode tokens per second the GPU's compute allows (the compute roof of a step), at
        the decode efficiency (the prefill's when none is given)."""
        efficiency = self.decode_compute_efficiency or self.compute_efficiency
        flops = self.tensor_peak_tflops.pick(scenario) * TERA * efficiency.pick(scenario)
        return flops / self.decode_flops_per_token

    def lora_factor(self, scenario: Scenario = "central") -> float:
        """The step-time factor of serving adapters in ``scenario`` (the slow end for the
        pessimistic one); 1 when the entry gives none."""
        if self.lora_step_factor is None:
            return 1.0
        flipped: dict[Scenario, Scenario] = {"pessimistic": "optimistic", "central": "central",
                                             "optimistic": "pessimistic"}
        return self.lora_step_factor.pick(flipped[scenario])

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "gpu": self.gpu, "model": self.model, "quantization": self.quantization,
            "status": self.status, "memory_bandwidth_gb_s": self.memory_bandwidth_gb_s,
            "bandwidth_efficiency": self.bandwidth_efficiency.to_dict(),
            "tensor_peak_tflops": self.tensor_peak_tflops.to_dict(),
            "compute_efficiency": self.compute_efficiency.to_dict(),
            "prefill_flops_per_token": self.prefill_flops_per_token,
            "decode_flops_per_token": self.decode_flops_per_token,
            "sources": list(self.sources),
        } | {name: value.to_dict() for name in _OPTIONAL_RANGES
             if (value := getattr(self, name)) is not None}


_OPTIONAL_RANGES = ("decode_compute_efficiency", "lora_step_factor")
_RATE_FIELDS = {"gpu", "model", "quantization", "status", "memory_bandwidth_gb_s",
                "bandwidth_efficiency", "tensor_peak_tflops", "compute_efficiency",
                "prefill_flops_per_token", "decode_flops_per_token", "sources"}


def parse_rates(data: Any, where: str) -> GpuRates:
    """One ``rates`` entry of the table; RatesError names the place and what is accepted."""
    if not isinstance(data, dict):
        raise RatesError(f"{where}: accepted: an object")
    missing = sorted(_RATE_FIELDS - set(data))
    unknown = sorted(set(data) - _RATE_FIELDS - set(_OPTIONAL_RANGES))
    if missing or unknown:
        raise RatesError(f"{where}: missing {missing}, unknown {unknown}; accepted keys: "
                         f"{sorted(_RATE_FIELDS)} and optionally {list(_OPTIONAL_RANGES)}")
    for name in ("gpu", "model", "quantization"):
        if not isinstance(data[name], str) or not data[name].strip():
            raise RatesError(f"{where}.{name}: {data[name]!r}; accepted: a non-empty string")
    if data["status"] not in ("assumption", "measured"):
        raise RatesError(f"{where}.status: {data['status']!r}; accepted: assumption, measured")
    sources = data["sources"]
    if not isinstance(sources, list) or not sources or not all(
            isinstance(s, str) and s.strip() for s in sources):
        raise RatesError(f"{where}.sources: accepted: a non-empty list of strings saying where "
                         "each figure comes from")
    ranges = {name: _range(data[name], f"{where}.{name}") for name in (
        "bandwidth_efficiency", "tensor_peak_tflops", "compute_efficiency")}
    optional = _optional_ranges(data, where)
    ranges |= optional
    for name in ("bandwidth_efficiency", "compute_efficiency", "decode_compute_efficiency"):
        if name in ranges and ranges[name].high > 1:
            raise RatesError(f"{where}.{name}.high: {ranges[name].high:g}; accepted: at most 1 "
                             "(a share of the peak)")
    return GpuRates(
        gpu=data["gpu"], model=data["model"], quantization=data["quantization"],
        status=data["status"], sources=tuple(sources),
        memory_bandwidth_gb_s=_positive(data["memory_bandwidth_gb_s"],
                                        f"{where}.memory_bandwidth_gb_s"),
        prefill_flops_per_token=_positive(data["prefill_flops_per_token"],
                                          f"{where}.prefill_flops_per_token"),
        decode_flops_per_token=_positive(data["decode_flops_per_token"],
                                         f"{where}.decode_flops_per_token"),
        bandwidth_efficiency=ranges["bandwidth_efficiency"],
        tensor_peak_tflops=ranges["tensor_peak_tflops"],
        compute_efficiency=ranges["compute_efficiency"],
        decode_compute_efficiency=optional.get("decode_compute_efficiency"),
        lora_step_factor=optional.get("lora_step_factor"))


def _optional_ranges(data: dict[str, Any], where: str) -> dict[str, RateRange]:
    """The optional ranges present (a LoRA factor is a step-time factor: at least 1)."""
    optional = {name: _range(data[name], f"{where}.{name}") for name in _OPTIONAL_RANGES
                if name in data}
    if "lora_step_factor" in optional and optional["lora_step_factor"].low < 1:
        raise RatesError(f"{where}.lora_step_factor.low: {optional['lora_step_factor'].low:g}; "
                         "accepted: at least 1 (a step-time factor)")
    return optional


def _positive(value: Any, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise RatesError(f"{where}: {value!r}; accepted: a number > 0")
    return float(value)


def _range(value: Any, where: str) -> RateRange:
    if not isinstance(value, Mapping) or set(value) != set(RANGE_KEYS):
        raise RatesError(f"{where}: {value!r}; accepted: an object with low, central, high")
    numbers = [_positive(value[k], f"{where}.{k}") for k in RANGE_KEYS]
    try:
        return RateRange(*numbers)
    except RatesError as error:
        raise RatesError(f"{where}: {error}") from None
