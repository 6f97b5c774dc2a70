"""Figures of a set of runs as a Markdown table (pasteable into docs/scaling.md)."""

from __future__ import annotations

from collections.abc import Sequence

from tools.scaling_sim.engine import SimulationResult
from tools.scaling_sim.traces import Trace

COLUMNS = ("scenario", "provisioning delay", "dropped requests", "dropped %",
           "worst minute dropped %", "seconds over capacity", "overloaded (first - last)",
           "instance-hours", "cost (USD)", "peak instances")


def _span(result: SimulationResult) -> str:
    first, last = result.first_overload, result.last_overload
    if first is None or last is None:
        return "-"
    return f"{first:%H:%M} - {last:%H:%M}"


def result_row(result: SimulationResult) -> tuple[str, ...]:
    """One table row."""
    return (result.label, f"{result.params.provisioning_delay_s / 60:g} min",
            f"{result.dropped:,.0f}", f"{result.dropped_percent:.2f}",
            f"{result.worst_minute_dropped_percent:.1f}",
            f"{result.seconds_over_capacity:,}", _span(result),
            f"{result.instance_hours:.1f}", f"{result.cost_usd:,.2f}",
            str(result.peak_in_service))


def markdown_table(trace: Trace, results: Sequence[SimulationResult]) -> str:
    """A heading for the trace and a table of its runs."""
    hours = trace.minutes / 60
    lines = [f"### {trace.name}: {trace.start:%Y-%m-%d %H:%M} for {hours:g} h, "
             f"{trace.total_invocations:,.0f} requests offered", "",
             "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines.extend("| " + " | ".join(result_row(r)) + " |" for r in results)
    return "\n".join(lines)
