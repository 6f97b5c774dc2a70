"""The decode-speed table: time to first token and time per output token by batch size.

How fast one engine answers depends on the GPU, the model, its weight format and the KV-cache
dtype, and on how many requests it batches. The capacity model needs that curve to turn "the KV
pool holds N requests" into "one instance serves R requests per minute within the latency SLOs".
It lives in a small JSON file in the repository (``config/decode_speed.json``), one *profile* per
(GPU, model, quantization, kv_cache_dtype), each point a closed-loop measurement at one batch size
— ``batch_size`` requests in flight, each replaced as soon as it finishes, with ``prompt_tokens``
in and ``output_tokens`` out — with its p50 and p99:

.. code-block:: json

    {"version": 1, "profiles": [{
        "gpu": "NVIDIA A10G", "model": "llama-3-8b-instruct",
        "quantization": "w4a16 int4 g128", "kv_cache_dtype": "auto",
        "prompt_tokens": 1024, "output_tokens": 256,
        "points": [{"batch_size": 1, "ttft_ms": {"p50": 275, "p99": 633},
                    "tpot_ms": {"p50": 13.6, "p99": 15.0},
                    "status": "assumption", "source": "roofline estimate ..."}]}]}

Every point says where its figures come from (``source``) and whether they are an
``assumption`` (estimated: :mod:`capacity_model.roofline`) or ``measured``
(``tools/gpu_smoke.sh`` runs :mod:`tools.decode_bench` on a GPU through the gateway and writes
its profile back with :meth:`DecodeSpeedTable.with_profile`). The keys are the GPU budget's own
names (``MemoryPlan.gpu_model``, ``model_name``, ``quantization``, ``kv_cache_dtype``) so a plan
finds its profile without a mapping table.

Pure module: standard library only.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from capacity_model.rates import GpuRates, RatesError, parse_rates

TABLE_VERSION = 1
FigureStatus = Literal["assumption", "measured"]
STATUSES: tuple[str, ...] = ("assumption", "measured")


class DecodeTableError(ValueError):
    """The table cannot be read, or has no profile for a plan. The message names the entry,
    the field, the value and what is accepted."""


@dataclass(frozen=True)
class Latency:
    """One latency figure at two percentiles, in milliseconds."""

    p50_ms: float
    p99_ms: float

    def scaled(self, factor: float) -> Latency:
        """Both percentiles multiplied by ``factor``."""
        return Latency(self.p50_ms * factor, self.p99_ms * factor)

    def to_dict(self) -> dict[str, float]:
        """JSON form."""
        return {"p50": round(self.p50_ms, 2), "p99": round(self.p99_ms, 2)}


@dataclass(frozen=True)
class DecodePoint:
    """Time to first token and time per output token with ``batch_size`` requests in flight."""

    batch_size: int
    ttft: Latency
    tpot: Latency
    status: FigureStatus
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the shape :func:`parse_decode_table` reads)."""
        return {"batch_size": self.batch_size, "ttft_ms": self.ttft.to_dict(),
                "tpot_ms": self.tpot.to_dict(), "status": self.status, "source": self.source}


@dataclass(frozen=True)
class DecodeProfile:
    """The curve of one (GPU, model, quantization, KV dtype), measured or estimated at one
    request shape (``prompt_tokens`` in, ``output_tokens`` out)."""

    gpu: str
    model: str
    quantization: str
    kv_cache_dtype: str
    prompt_tokens: int
    output_tokens: int
    points: tuple[DecodePoint, ...]
    estimated_from: Mapping[str, float] = field(default_factory=dict)
    """For estimated profiles: the inputs of :func:`capacity_model.roofline.estimate_profile`."""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What a plan looks the profile up by."""
        return (self.gpu, self.model, self.quantization, self.kv_cache_dtype)

    @property
    def max_batch_size(self) -> int:
        """The largest batch size the profile covers: nothing is known beyond it."""
        return self.points[-1].batch_size

    @property
    def status(self) -> FigureStatus:
        """``measured`` only when every point is."""
        return "measured" if all(p.status == "measured" for p in self.points) else "assumption"

    def at(self, batch_size: float) -> DecodePoint:
        """The point at ``batch_size``, linearly interpolated between the two points around it.

        A batch below the first point takes the first point's figures (latency does not fall
        below one request's); above the last one is unknown and raises DecodeTableError.
        """
        if batch_size > self.max_batch_size:
            raise DecodeTableError(
                f"{self.describe()}: batch size {batch_size:g} is beyond the largest one the "
                f"profile covers ({self.max_batch_size}); accepted: 1-{self.max_batch_size}")
        if batch_size <= self.points[0].batch_size:
            return self.points[0]
        for low, high in itertools.pairwise(self.points):
            if low.batch_size <= batch_size <= high.batch_size:
                share = (batch_size - low.batch_size) / (high.batch_size - low.batch_size)
                return DecodePoint(
                    batch_size=math.ceil(batch_size),
                    ttft=_mix(low.ttft, high.ttft, share),
                    tpot=_mix(low.tpot, high.tpot, share),
                    status="measured" if low.status == high.status == "measured"
                    else "assumption",
                    source=f"interpolated between batch {low.batch_size} and "
                           f"{high.batch_size}",
                )
        raise AssertionError("unreachable: points are sorted and cover the range")

    def describe(self) -> str:
        """How messages name the profile."""
        return (f"decode profile {self.gpu} / {self.model} / {self.quantization} / "
                f"kv {self.kv_cache_dtype}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        data: dict[str, Any] = {
            "gpu": self.gpu, "model": self.model, "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.estimated_from:
            data["estimated_from"] = dict(self.estimated_from)
        data["points"] = [p.to_dict() for p in self.points]
        return data


def _mix(low: Latency, high: Latency, share: float) -> Latency:
    return Latency(low.p50_ms + (high.p50_ms - low.p50_ms) * share,
                   low.p99_ms + (high.p99_ms - low.p99_ms) * share)


@dataclass(frozen=True)
class DecodeSpeedTable:
    """Every profile of the table file."""

    profiles: tuple[DecodeProfile, ...]
    source: str = "decode-speed table"
    rates: tuple[GpuRates, ...] = ()
    """The GPUs' prefill and decode rates with their ranges and sources
    (:mod:`capacity_model.rates`): what estimated profiles are computed from."""

    def lookup(self, gpu: str, model: str, quantization: str,
               kv_cache_dtype: str) -> DecodeProfile:
        """The profile for a plan; DecodeTableError lists the profiles there are."""
        wanted = (gpu, model, quantization, kv_cache_dtype)
        for profile in self.profiles:
            if profile.key == wanted:
                return profile
        known = "; ".join(" / ".join(p.key) for p in self.profiles) or "none"
        raise DecodeTableError(
            f"{self.source}: no decode profile for {' / '.join(wanted)} (gpu / model / "
            f"quantization / kv_cache_dtype); the table has: {known}. Measure it with "
            "tools/gpu_smoke.sh on that GPU, or add an estimate (capacity_model.roofline)")

    def rates_for(self, gpu: str, model: str, quantization: str) -> GpuRates:
        """The rates of a GPU, model and weight format; DecodeTableError lists the ones there
        are."""
        wanted = (gpu, model, quantization)
        for rates in self.rates:
            if rates.key == wanted:
                return rates
        known = "; ".join(" / ".join(r.key) for r in self.rates) or "none"
        raise DecodeTableError(
            f"{self.source}: no rates for {' / '.join(wanted)} (gpu / model / quantization); "
            f"the table has: {known}. Add them with their sources (capacity_model.rates)")

    def with_profile(self, profile: DecodeProfile) -> DecodeSpeedTable:
        """The table with ``profile`` added, or replacing the profile with the same key."""
        kept = tuple(p for p in self.profiles if p.key != profile.key)
        return replace(self, profiles=(*kept, profile))

    def to_json(self) -> str:
        """The file form, profiles sorted by key (stable diffs)."""
        document: dict[str, Any] = {"version": TABLE_VERSION}
        if self.rates:
            document["rates"] = [r.to_dict() for r in sorted(self.rates, key=lambda r: r.key)]
        document["profiles"] = [p.to_dict() for p in sorted(self.profiles, key=lambda p: p.key)]
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------- parsing
def parse_decode_table(text: str, *, source: str = "decode-speed table") -> DecodeSpeedTable:
    """Read and check the JSON table; DecodeTableError names the place and what is accepted."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DecodeTableError(f"{source}: not JSON ({error.msg} at line {error.lineno})") \
            from None
    if not isinstance(document, dict):
        raise DecodeTableError(f"{source}: accepted: an object with version and profiles")
    _keys(document, {"version", "profiles"}, {"rates"}, source)
    if document["version"] != TABLE_VERSION:
        raise DecodeTableError(f"{source}.version: {document['version']!r} is not accepted; "
                               f"accepted: {TABLE_VERSION}")
    profiles_data = document["profiles"]
    if not isinstance(profiles_data, list):
        raise DecodeTableError(f"{source}.profiles: accepted: a list of profiles")
    profiles = tuple(_profile(item, f"{source}.profiles[{index}]")
                     for index, item in enumerate(profiles_data))
    keys = [p.key for p in profiles]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise DecodeTableError(f"{source}: two profiles for {' / '.join(duplicates[0])}; "
                               "accepted: one per gpu / model / quantization / kv_cache_dtype")
    return DecodeSpeedTable(profiles=profiles, source=source,
                            rates=_rates(document.get("rates", []), source))


def parse_profile(data: Any, *, source: str = "decode-speed profile") -> DecodeProfile:
    """One profile as ``DecodeProfile.to_dict`` writes it (``python -m tools.decode_bench``'s
    output), checked as the table's are; DecodeTableError names the place."""
    return _profile(data, source)


def _rates(data: Any, source: str) -> tuple[GpuRates, ...]:
    if not isinstance(data, list):
        raise DecodeTableError(f"{source}.rates: accepted: a list of rates entries")
    try:
        rates = tuple(parse_rates(item, f"{source}.rates[{index}]")
                      for index, item in enumerate(data))
    except RatesError as error:
        raise DecodeTableError(str(error)) from None
    keys = [r.key for r in rates]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise DecodeTableError(f"{source}: two rates entries for {' / '.join(duplicates[0])}; "
                               "accepted: one per gpu / model / quantization")
    return rates


def _profile(data: Any, where: str) -> DecodeProfile:
    if not isinstance(data, dict):
        raise DecodeTableError(f"{where}: accepted: an object")
    _keys(data, {"gpu", "model", "quantization", "kv_cache_dtype", "prompt_tokens",
                 "output_tokens", "points"}, {"estimated_from"}, where)
    for name in ("gpu", "model", "quantization", "kv_cache_dtype"):
        if not isinstance(data[name], str) or not data[name].strip():
            raise DecodeTableError(f"{where}.{name}: {data[name]!r} is not accepted; accepted: "
                                   "a non-empty string")
    prompt = _positive_int(data["prompt_tokens"], f"{where}.prompt_tokens")
    output = _positive_int(data["output_tokens"], f"{where}.output_tokens")
    points_data = data["points"]
    if not isinstance(points_data, list) or not points_data:
        raise DecodeTableError(f"{where}.points: accepted: a non-empty list of points")
    points = tuple(_point(item, f"{where}.points[{index}]")
                   for index, item in enumerate(points_data))
    sizes = [p.batch_size for p in points]
    if sizes != sorted(set(sizes)):
        raise DecodeTableError(f"{where}.points: batch sizes {sizes} are not accepted; "
                               "accepted: strictly increasing")
    estimated = data.get("estimated_from", {})
    if not isinstance(estimated, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in estimated.values()):
        raise DecodeTableError(f"{where}.estimated_from: accepted: an object of numbers")
    return DecodeProfile(gpu=data["gpu"], model=data["model"], quantization=data["quantization"],
                         kv_cache_dtype=data["kv_cache_dtype"], prompt_tokens=prompt,
                         output_tokens=output, points=points,
                         estimated_from={str(k): float(v) for k, v in estimated.items()})


def _point(data: Any, where: str) -> DecodePoint:
    if not isinstance(data, dict):
        raise DecodeTableError(f"{where}: accepted: an object")
    _keys(data, {"batch_size", "ttft_ms", "tpot_ms", "status", "source"}, set(), where)
    batch = _positive_int(data["batch_size"], f"{where}.batch_size")
    status = data["status"]
    if status not in STATUSES:
        raise DecodeTableError(f"{where}.status: {status!r} is not accepted; accepted: "
                               f"{', '.join(STATUSES)}")
    source = data["source"]
    if not isinstance(source, str) or not source.strip():
        raise DecodeTableError(f"{where}.source: accepted: a non-empty string saying where the "
                               "figures come from")
    return DecodePoint(batch_size=batch, ttft=_latency(data["ttft_ms"], f"{where}.ttft_ms"),
                       tpot=_latency(data["tpot_ms"], f"{where}.tpot_ms"),
                       status=status, source=source)


def _latency(data: Any, where: str) -> Latency:
    if not isinstance(data, dict):
        raise DecodeTableError(f"{where}: accepted: an object with p50 and p99 (ms)")
    _keys(data, {"p50", "p99"}, set(), where)
    p50 = _positive_number(data["p50"], f"{where}.p50")
    p99 = _positive_number(data["p99"], f"{where}.p99")
    if p99 < p50:
        raise DecodeTableError(f"{where}: p99 {p99:g} is below p50 {p50:g}; accepted: "
                               "p99 >= p50")
    return Latency(p50, p99)


def _keys(data: Mapping[str, Any], required: set[str], optional: set[str], where: str) -> None:
    missing = sorted(required - set(data))
    unknown = sorted(set(data) - required - optional)
    if missing or unknown:
        raise DecodeTableError(f"{where}: missing {missing}, unknown {unknown}; accepted keys: "
                               f"{sorted(required | optional)}")


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DecodeTableError(f"{where}: {value!r} is not accepted; accepted: an integer >= 1")
    return value


def _positive_number(value: Any, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise DecodeTableError(f"{where}: {value!r} is not accepted; accepted: a number > 0")
    return float(value)
