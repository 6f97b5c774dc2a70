"""Which compiled batch sizes to run a request's texts through.

Every compiled model has a fixed batch size, so N texts are split into calls of compiled sizes,
the last one padded. The plan minimizes the expected time from the latency the compiler measured
(manifest.json ``latency``): with sizes 1 and 8 at 4 ms and 9 ms, three texts go as one padded
batch of 8 (9 ms) rather than three calls of 1 (12 ms); with 40 ms and 300 ms, as three calls of
1. Without measurements (an artifact compiled with --skip-device-checks) cost is taken as
proportional to the batch size plus a fixed per-call overhead.

Pure module, Python 3.10-compatible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PER_CALL_OVERHEAD = 1.0
"""Fallback cost of one call, in units of one text's compute (used without measurements)."""


@dataclass(frozen=True)
class BatchCall:
    """One model call: texts[start:start + count], padded up to ``batch_size`` rows."""

    start: int
    count: int
    batch_size: int

    @property
    def padding(self) -> int:
        """Rows of padding in this call."""
        return self.batch_size - self.count


def call_costs(batch_sizes: Sequence[int],
               latency_p50_ms: Mapping[int, float] | None) -> dict[int, float]:
    """Expected cost of one call per compiled size: measured p50 if every size has one."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes: {list(batch_sizes)!r}; need at least one size >= 1")
    if latency_p50_ms and all(b in latency_p50_ms and latency_p50_ms[b] > 0
                              for b in batch_sizes):
        return {b: float(latency_p50_ms[b]) for b in batch_sizes}
    return {b: float(b) + PER_CALL_OVERHEAD for b in batch_sizes}


def plan_batches(text_count: int, costs: Mapping[int, float]) -> list[BatchCall]:
    """The cheapest sequence of calls covering ``text_count`` texts (ties: fewer calls).

    Dynamic programming over the number of texts still to cover; a call of size b covers
    min(b, remaining) texts. Calls are returned largest first, in text order.
    """
    if text_count < 0:
        raise ValueError(f"text_count: {text_count!r} must be >= 0")
    if not costs:
        raise ValueError("costs: no compiled batch sizes")
    if any(size < 1 or not cost > 0 for size, cost in costs.items()):
        raise ValueError(f"costs: {dict(costs)!r}; sizes must be >= 1 and costs > 0")
    sizes = sorted(costs)
    best: list[tuple[float, int]] = [(0.0, 0)]  # (cost, calls) to cover k texts
    choice: list[int] = [0]
    for k in range(1, text_count + 1):
        options = [(best[max(0, k - b)][0] + costs[b], best[max(0, k - b)][1] + 1, b)
                   for b in sizes]
        cost, calls, size = min(options, key=lambda o: (o[0], o[1], -o[2]))
        best.append((cost, calls))
        choice.append(size)
    chosen: list[int] = []
    remaining = text_count
    while remaining > 0:
        chosen.append(choice[remaining])
        remaining = max(0, remaining - choice[remaining])
    chosen.sort(reverse=True)
    calls_out: list[BatchCall] = []
    start = 0
    for size in chosen:
        count = min(size, text_count - start)
        calls_out.append(BatchCall(start=start, count=count, batch_size=size))
        start += count
    return calls_out
