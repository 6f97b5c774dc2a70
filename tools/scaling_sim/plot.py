"""Plots: a run with and without the release calendar, and the unpredicted-spike scenarios."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.scaling_sim.engine import SimulationResult
from tools.scaling_sim.spike import SpikeOutcome
from tools.scaling_sim.traces import Trace


def plot_comparison(trace: Trace, with_calendar: SimulationResult,
                    without_calendar: SimulationResult, path: Path) -> Path:
    """Write a two-panel PNG to ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    zone = trace.start.tzinfo
    times = [s.start for s in with_calendar.samples]
    per_instance = with_calendar.params.instance_capacity_per_min
    figure, (load_axis, fleet_axis) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    offered = [s.offered for s in with_calendar.samples]
    load_axis.plot(times, offered, color="black", linewidth=1.6, label="offered load")
    styles = (("without calendar", without_calendar, "#c0392b", "--"),
              ("with calendar", with_calendar, "#1f6fb2", "-"))
    for name, result, colour, line in styles:
        capacity = [s.in_service * per_instance for s in result.samples]
        load_axis.plot(times, capacity, color=colour, linestyle=line, linewidth=1.3,
                       label=f"fleet capacity, {name}")
        load_axis.fill_between(times, capacity, offered,
                               where=[o > c for o, c in zip(offered, capacity, strict=True)],
                               color=colour, alpha=0.25, interpolate=True,
                               label=f"dropped, {name}: {result.dropped:,.0f} "
                                     f"({result.dropped_percent:.1f} %)")
        fleet_axis.step(times, [s.in_service for s in result.samples], where="post",
                        color=colour, linestyle=line, linewidth=1.5,
                        label=f"in service, {name} ({result.instance_hours:.1f} instance-h, "
                              f"${result.cost_usd:,.0f})")
        fleet_axis.step(times, [s.min_capacity for s in result.samples], where="post",
                        color=colour, linestyle=":", linewidth=1.0,
                        label=f"scheduled MinCapacity, {name}")
    load_axis.set_ylabel("invocations per minute")
    load_axis.set_ylim(bottom=0)
    load_axis.legend(loc="upper left", fontsize=8)
    delay_min = with_calendar.params.provisioning_delay_s / 60
    load_axis.set_title(f"{trace.name} ({trace.start:%a %Y-%m-%d}): provisioning delay "
                        f"{delay_min:g} min, {per_instance:g} invocations/min per instance")
    return _finish(figure, load_axis, fleet_axis, trace=trace, zone=zone, path=path, fontsize=8)


def plot_spike(trace: Trace, outcomes: Sequence[SpikeOutcome], path: Path) -> Path:
    """The unpredicted spike under each scenario: capacity against load, and instances."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not outcomes:
        raise ValueError("plot_spike: no outcomes")
    zone = trace.start.tzinfo
    first = outcomes[0].result
    times = [s.start for s in first.samples]
    per_instance = first.params.instance_capacity_per_min
    colours = ("#c0392b", "#8e44ad", "#1f6fb2", "#27ae60")
    figure, (load_axis, fleet_axis) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    load_axis.plot(times, [s.offered for s in first.samples], color="black", linewidth=1.6,
                   label="offered load")
    for outcome, colour in zip(outcomes, colours, strict=False):
        samples = outcome.result.samples
        load_axis.plot(times, [s.in_service * per_instance for s in samples], color=colour,
                       linewidth=1.3,
                       label=f"capacity, {outcome.label}: {outcome.result.dropped_percent:.2f} % "
                             f"shed, worst minute {outcome.worst_minute_percent:.1f} %, "
                             f"{outcome.error_seconds} s with errors")
        fleet_axis.step(times, [s.in_service for s in samples], where="post", color=colour,
                        linewidth=1.5,
                        label=f"in service, {outcome.label} ({outcome.result.instance_hours:.1f}"
                              f" instance-h, ${outcome.result.cost_usd:,.0f})")
    load_axis.set_ylabel("invocations per minute")
    load_axis.set_ylim(bottom=0)
    load_axis.legend(loc="upper left", fontsize=7)
    load_axis.set_title(f"{trace.name} without the calendar ({trace.start:%a %Y-%m-%d}): "
                        f"provisioning delay {first.params.provisioning_delay_s / 60:g} min, "
                        f"{per_instance:g} invocations/min per instance")
    return _finish(figure, load_axis, fleet_axis, trace=trace, zone=zone, path=path, fontsize=7)


def _finish(figure: Any, load_axis: Any, fleet_axis: Any, *, trace: Trace, zone: Any, path: Path,
            fontsize: int) -> Path:
    """The fleet axis (instances over local time), a grid on both, and the PNG at ``path``."""
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fleet_axis.set_ylabel("instances")
    fleet_axis.set_ylim(bottom=0)
    fleet_axis.legend(loc="upper left", fontsize=fontsize)
    fleet_axis.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=zone))
    fleet_axis.set_xlabel(f"local time ({trace.start:%Z})")
    for axis in (load_axis, fleet_axis):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
