"""Latency statistics from repeated timings: p50 / p90 / p99 and friends, in milliseconds.

Percentiles use linear interpolation between closest ranks (numpy's default), so they agree with
what a reader would compute from the same samples elsewhere.

Pure module, Python 3.10-compatible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, linearly interpolated.

    Raises ValueError for an empty sequence, a q outside [0, 100] or a non-finite sample.
    """
    if not samples:
        raise ValueError("percentile: no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile: q={q!r} is outside [0, 100]")
    ordered = sorted(float(s) for s in samples)
    if not all(math.isfinite(s) for s in ordered):
        raise ValueError("percentile: samples contain NaN or infinity")
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = math.ceil(position)
    if lower == upper:
        return ordered[lower]
    weight = position - lower
    return ordered[lower] * (1.0 - weight) + ordered[upper] * weight


@dataclass(frozen=True)
class LatencyStats:
    """Latency of one compiled shape, measured ``iterations`` times after a warmup."""

    batch_size: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def from_samples_ms(cls, samples_ms: Sequence[float], *, batch_size: int) -> LatencyStats:
        """Summarize per-call timings (milliseconds) of a model called with ``batch_size``."""
        if batch_size < 1:
            raise ValueError(f"batch_size: {batch_size!r} must be at least 1")
        if not samples_ms:
            raise ValueError("samples_ms: no timings to summarize")
        if any(s < 0 for s in samples_ms):
            raise ValueError("samples_ms: a timing is negative")
        return cls(
            batch_size=batch_size,
            iterations=len(samples_ms),
            p50_ms=percentile(samples_ms, 50),
            p90_ms=percentile(samples_ms, 90),
            p99_ms=percentile(samples_ms, 99),
            mean_ms=math.fsum(samples_ms) / len(samples_ms),
            min_ms=min(samples_ms),
            max_ms=max(samples_ms),
        )

    @property
    def p50_per_text_ms(self) -> float:
        """Median cost of one text when the batch is full."""
        return self.p50_ms / self.batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the manifest's ``latency`` entries)."""
        return {key: (round(value, 4) if isinstance(value, float) else value)
                for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "latency") -> LatencyStats:
        """Read the form :meth:`to_dict` writes; raise ValueError naming the bad field."""
        values: dict[str, Any] = {}
        for name, kind in (("batch_size", int), ("iterations", int), ("p50_ms", float),
                           ("p90_ms", float), ("p99_ms", float), ("mean_ms", float),
                           ("min_ms", float), ("max_ms", float)):
            raw = data.get(name)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ValueError(f"{where}.{name}: expected a number, got {raw!r}")
            if kind is int and not isinstance(raw, int):
                raise ValueError(f"{where}.{name}: expected an integer, got {raw!r}")
            if raw < 0 or not math.isfinite(raw):
                raise ValueError(f"{where}.{name}: {raw!r} must be a finite number >= 0")
            values[name] = kind(raw)
        if values["batch_size"] < 1 or values["iterations"] < 1:
            raise ValueError(f"{where}: batch_size and iterations must be at least 1")
        return cls(**values)


def format_latency_table(rows: Sequence[LatencyStats]) -> str:
    """A small fixed-width table (batch, iterations, p50, p90, p99, per-text p50)."""
    lines = [f"{'batch':>5} {'iters':>5} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} "
             f"{'p50/text ms':>12}"]
    for row in rows:
        lines.append(f"{row.batch_size:>5} {row.iterations:>5} {row.p50_ms:>9.3f} "
                     f"{row.p90_ms:>9.3f} {row.p99_ms:>9.3f} {row.p50_per_text_ms:>12.3f}")
    return "\n".join(lines)
