"""``python -m tools.scaling_sim``: figures and plots for traces, with and without the calendar,
and the unpredicted-spike comparison.

What one instance serves and what it costs come from the template itself: the capacity model's
figures in the scalable target's metadata and the variant's instance type priced from the
``gpu_budget`` catalog (``--instance-capacity-per-min`` / ``--usd-per-hour`` override them, e.g.
for the hand-written fixture, which has neither):

    python -m tools.scaling_sim --template cdk.out/assembly-Prod/ProdServing*.template.json \\
        --spike-env prod --plot-dir docs/img
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from release_calendar import (
    CALENDAR_PREFIX,
    CalendarError,
    parse_calendar,
    parse_schedule,
    plan_dated_schedule,
)
from tools.scaling_sim.engine import SimulationParams, SimulationResult, simulate
from tools.scaling_sim.plot import plot_comparison, plot_spike
from tools.scaling_sim.report import markdown_table
from tools.scaling_sim.spike import SpikeOutcome, one_piece_surge, spike_outcomes, spike_table
from tools.scaling_sim.template import (
    ScalingSetup,
    ScheduledAction,
    TemplateError,
    load_template,
    scaling_setup,
)
from tools.scaling_sim.traces import TRACE_DIR, Trace, load_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CALENDAR = REPO_ROOT / "config" / "release_calendar.yaml"


def dated_actions(trace: Trace, setup: ScalingSetup, calendar_path: Path
                  ) -> tuple[list[ScheduledAction], list[str]]:
    """The Lambda's ``at()`` actions for the trace's days, from the calendar and the capacity
    models in the template's release-calendar Lambda environment."""
    notes: list[str] = []
    target = setup.calendar_target
    if target is None or target not in setup.capacity_models:
        notes.append("the template has no release-calendar Lambda environment for this target: "
                     "dated events are not simulated")
        return [], notes
    parsed = parse_calendar(calendar_path.read_text(encoding="utf-8"), source=str(calendar_path))
    notes.extend(str(issue) for issue in parsed.issues)
    plan = plan_dated_schedule(parsed.calendar, {target: setup.capacity_models[target]},
                               now=trace.start - dt.timedelta(days=1),
                               horizon_days=math.ceil(trace.minutes / 1440) + 2)
    notes.extend(str(issue) for issue in plan.issues)
    return [ScheduledAction(name=a.name, schedule=parse_schedule(a.schedule),
                            timezone=a.timezone, min_capacity=a.min_capacity,
                            max_capacity=a.max_capacity)
            for a in plan.for_target(target)], notes


def run(trace: Trace, setup: ScalingSetup, extra: Sequence[ScheduledAction],
        params: SimulationParams) -> tuple[SimulationResult, SimulationResult]:
    """The trace with and without the calendar's actions, same parameters."""
    with_calendar = simulate(trace, setup, params, extra_actions=extra, label="with calendar")
    without = simulate(trace, setup, params, exclude_prefix=CALENDAR_PREFIX,
                       label="without calendar")
    return with_calendar, without


def _price(instance_type: str | None, override: float | None) -> float:
    if override is not None:
        return override
    if instance_type is None:
        raise ValueError("the template names no instance type for this variant; pass "
                         "--instance-type or --usd-per-hour")
    from gpu_budget import instance_type as lookup

    try:
        return float(lookup(instance_type).on_demand_usd_per_hour)
    except (KeyError, ValueError) as error:
        raise ValueError(f"instance type {instance_type}: {error}") from None


def simulation_params(setup: ScalingSetup, *, delay_min: float, capacity_override: float | None,
                      instance_type: str | None, usd_override: float | None) -> SimulationParams:
    """Parameters from the template (capacity model figures, instance type) and the overrides."""
    capacity = setup.capacity
    per_minute = capacity_override if capacity_override is not None else (
        capacity.invocations_per_min if capacity is not None else None)
    if per_minute is None:
        raise ValueError(f"{setup.logical_id}: the template carries no capacity-model figures "
                         "(Metadata MangaAssist::Capacity); pass --instance-capacity-per-min")
    return SimulationParams(
        provisioning_delay_s=round(delay_min * 60), instance_capacity_per_min=per_minute,
        usd_per_instance_hour=_price(instance_type or setup.instance_type, usd_override),
        concurrency_per_instance=capacity.concurrency if capacity is not None else None,
        request_seconds=capacity.request_seconds if capacity is not None else None)


def spike_comparison(trace: Trace, setup: ScalingSetup, params: SimulationParams, *,
                     env: str, multiplier: float) -> list[SpikeOutcome]:
    """The unpredicted-spike scenarios for ``env``'s LLM capacity plan (tools/scaling_sim/spike)."""
    from stacks.settings import load_environment

    capacity = load_environment(env).plans.llm_capacity
    recommended = capacity.fleet_for(one_piece_surge(multiplier),
                                     provisioning_s=params.provisioning_delay_s)
    return spike_outcomes(trace, setup, params, current=capacity.fleet, recommended=recommended)


def main(argv: Sequence[str] | None = None) -> int:
    """Tables on stdout, progress on stderr; exit status 0, or 2 with one ``error:`` line."""
    args = _parser().parse_args(argv)
    try:
        setup, traces, delays = _inputs(args)
    except (TemplateError, ValueError, CalendarError) as error:
        return _error(error)
    first = delays[0]
    print(f"template {args.template}: scalable target {setup.logical_id} (calendar target "
          f"{setup.calendar_target}), {len(setup.scheduled)} scheduled actions, "
          f"{len(setup.target_tracking)} target-tracking and {len(setup.step)} step policies; "
          f"{args.instance_type or setup.instance_type or 'priced'} at "
          f"${first.usd_per_instance_hour:.3f}/h, {first.instance_capacity_per_min:g} "
          "invocations/min per instance", file=sys.stderr)
    figures: list[dict[str, object]] = []
    for trace in traces:
        try:
            extra, notes = dated_actions(trace, setup, args.calendar)
        except CalendarError as error:
            return _error(error)
        figures.extend(_replay(trace, setup, extra, notes, delays, args.plot_dir))
    if args.spike_env is not None and _unpredicted_spike(args, traces, setup, delays,
                                                         figures) != 0:
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.scaling_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, required=True,
                        help="synthesized CloudFormation template (JSON)")
    parser.add_argument("--trace", type=Path, action="append",
                        help="trace CSV (repeatable; default: every file in "
                             "tools/scaling_sim/traces)")
    parser.add_argument("--calendar", type=Path, default=DEFAULT_CALENDAR,
                        help="release calendar for the dated events (default: %(default)s)")
    parser.add_argument("--target", default=None,
                        help="calendar target the scalable target serves (default: matched "
                             "through the Lambda's environment, else llm)")
    parser.add_argument("--scalable-target", default=None,
                        help="logical id of the ScalableTarget when the template has several")
    parser.add_argument("--provisioning-delay-min", type=float, nargs="+", default=[5.0, 8.0],
                        help="reactive provisioning delays to compare (default: 5 8)")
    parser.add_argument("--instance-capacity-per-min", type=float, default=None,
                        help="invocations per minute one instance serves before shedding "
                             "(default: the capacity model's, from the template's metadata)")
    parser.add_argument("--instance-type", default=None,
                        help="priced from gpu_budget's catalog (default: the variant's, from "
                             "the template)")
    parser.add_argument("--usd-per-hour", type=float, default=None,
                        help="instance price, overriding the catalog")
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help="write scaling-<trace>.png here (at the longest delay)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--spike-env", default=None, metavar="ENV",
                        help="also replay the one-piece trace without the calendar under the "
                             "current policies, + high-resolution concurrency tracking and the "
                             "capacity model's recommended headroom for ENV")
    return parser


def _inputs(args: argparse.Namespace
            ) -> tuple[ScalingSetup, list[Trace], list[SimulationParams]]:
    """The scalable target's setup, the traces, and one set of parameters per provisioning
    delay."""
    setup = scaling_setup(load_template(args.template),
                          scalable_target=args.scalable_target, calendar_target=args.target)
    traces = [load_trace(p) for p in (args.trace or sorted(TRACE_DIR.glob("*.csv")))]
    delays = [simulation_params(setup, delay_min=d,
                                capacity_override=args.instance_capacity_per_min,
                                instance_type=args.instance_type,
                                usd_override=args.usd_per_hour)
              for d in args.provisioning_delay_min]
    return setup, traces, delays


def _error(error: Exception) -> int:
    """Print ``error`` as the one line the CLI's errors are; the exit status."""
    print(f"error: {error}", file=sys.stderr)
    return 2


def _replay(trace: Trace, setup: ScalingSetup, extra: Sequence[ScheduledAction],
            notes: Sequence[str], delays: Sequence[SimulationParams],
            plot_dir: Path | None) -> list[dict[str, object]]:
    """One trace with and without the calendar at each delay: its table on stdout, a plot at
    the longest delay, and its figures."""
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    results: list[SimulationResult] = []
    pair: tuple[SimulationResult, SimulationResult] | None = None
    for params in delays:
        print(f"simulating {trace.name} ({trace.minutes} min), provisioning delay "
              f"{params.provisioning_delay_s / 60:g} min ...", file=sys.stderr)
        pair = run(trace, setup, extra, params)
        results.extend(pair)
    print(markdown_table(trace, results))
    print()
    if plot_dir is not None and pair is not None:
        path = plot_comparison(trace, pair[0], pair[1], plot_dir / f"scaling-{trace.name}.png")
        print(f"wrote {path}", file=sys.stderr)
    return [_result_figures(trace.name, r) for r in results]


def _result_figures(trace_name: str, result: SimulationResult) -> dict[str, object]:
    """One run's figures as the ``--json`` file lists them (rounded as the tables print)."""
    r = result
    return {"trace": trace_name, "scenario": r.label,
            "provisioning_delay_s": r.params.provisioning_delay_s,
            "offered": round(r.offered), "dropped": round(r.dropped),
            "dropped_percent": round(r.dropped_percent, 3),
            "worst_minute_dropped_percent": round(r.worst_minute_dropped_percent, 1),
            "seconds_over_capacity": r.seconds_over_capacity,
            "instance_hours": round(r.instance_hours, 2),
            "cost_usd": round(r.cost_usd, 2), "peak_instances": r.peak_in_service}


def _unpredicted_spike(args: argparse.Namespace, traces: Sequence[Trace], setup: ScalingSetup,
                       delays: Sequence[SimulationParams],
                       figures: list[dict[str, object]]) -> int:
    """The one-piece trace without the calendar under ``--spike-env``'s capacity plan: its
    table on stdout, a plot at the longest delay, its figures appended; the exit status."""
    spike_trace = _spike_trace(traces)
    peak = max(spike_trace.invocations_per_min) / spike_trace.invocations_per_min[0]
    multiplier = _one_piece_multiplier(args.calendar)
    print(f"### Unpredicted spike: {spike_trace.name} without the calendar (×{multiplier:g} "
          f"in 15 min; peak {peak:.1f}× the 17:00 load), capacity plan of "
          f"{args.spike_env}\n")
    outcomes: list[SpikeOutcome] = []
    for params in delays:
        print(f"simulating the spike at a {params.provisioning_delay_s / 60:g}-minute "
              "provisioning delay ...", file=sys.stderr)
        try:
            outcomes.extend(spike_comparison(spike_trace, setup, params, env=args.spike_env,
                                             multiplier=multiplier))
        except ValueError as error:
            return _error(error)
    print(spike_table(outcomes))
    print()
    figures.extend(_spike_figures(spike_trace.name, o) for o in outcomes)
    if args.plot_dir is not None:
        longest = max(p.provisioning_delay_s for p in delays)
        path = plot_spike(spike_trace, [o for o in outcomes
                                        if o.result.params.provisioning_delay_s == longest],
                          args.plot_dir / f"spike-{spike_trace.name}.png")
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _spike_trace(traces: Sequence[Trace]) -> Trace:
    """The one-piece trace: the one replayed above, else the shipped one."""
    found = next((t for t in traces if t.name == "one-piece"), None)
    return found if found is not None else load_trace(TRACE_DIR / "one-piece.csv")


def _spike_figures(trace_name: str, outcome: SpikeOutcome) -> dict[str, object]:
    """One spike scenario's figures as the ``--json`` file lists them."""
    o = outcome
    return {"trace": trace_name, "scenario": f"spike: {o.label}",
            "provisioning_delay_s": o.result.params.provisioning_delay_s,
            "headroom": o.headroom,
            "target_invocations_per_instance_per_min":
                o.target_invocations_per_instance_per_min,
            "dropped_percent": round(o.result.dropped_percent, 3),
            "worst_minute_dropped_percent": round(o.worst_minute_percent, 1),
            "seconds_over_capacity": o.error_seconds,
            "meets_seed": o.meets_seed, "peak_instances": o.result.peak_in_service,
            "instance_hours": round(o.result.instance_hours, 2),
            "cost_usd": round(o.result.cost_usd, 2)}


def _one_piece_multiplier(calendar_path: Path) -> float:
    """The One Piece event's multiplier in the calendar (the spike the trace replays)."""
    from tools.scaling_sim.traces import ONE_PIECE_EVENT

    parsed = parse_calendar(calendar_path.read_text(encoding="utf-8"), source=str(calendar_path))
    event = next((e for e in parsed.calendar.dated if e.event_id == ONE_PIECE_EVENT), None)
    if event is None:
        raise SystemExit(f"error: {calendar_path} has no dated event {ONE_PIECE_EVENT}")
    return event.multiplier


if __name__ == "__main__":
    raise SystemExit(main())
