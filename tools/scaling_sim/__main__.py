"""``python -m tools.scaling_sim``: figures and plots for traces, with and without the calendar.

Example (the hand-written template until the stack exists; later ``cdk.out/<stack>.template.json``):

    python -m tools.scaling_sim \\
        --template tests/tools/scaling_sim_fixtures/scaling.template.json \\
        --plot-dir docs/img
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
from tools.scaling_sim.plot import plot_comparison
from tools.scaling_sim.report import markdown_table
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


def _price(instance_type: str, override: float | None) -> float:
    if override is not None:
        return override
    try:
        from gpu_budget import instance_type as lookup
    except ImportError:
        raise SystemExit("error: gpu_budget is not importable; pass --usd-per-hour") from None
    try:
        return float(lookup(instance_type).on_demand_usd_per_hour)
    except (KeyError, ValueError) as error:
        raise SystemExit(f"error: --instance-type {instance_type}: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
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
    parser.add_argument("--instance-capacity-per-min", type=float, default=300.0,
                        help="invocations per minute one instance serves before shedding "
                             "(default: %(default)s)")
    parser.add_argument("--instance-type", default="ml.g5.xlarge",
                        help="priced from gpu_budget's catalog (default: %(default)s)")
    parser.add_argument("--usd-per-hour", type=float, default=None,
                        help="instance price, overriding the catalog")
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help="write scaling-<trace>.png here (at the longest delay)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)

    try:
        setup = scaling_setup(load_template(args.template),
                              scalable_target=args.scalable_target, calendar_target=args.target)
        traces = [load_trace(p) for p in (args.trace or sorted(TRACE_DIR.glob("*.csv")))]
        price = _price(args.instance_type, args.usd_per_hour)
        delays = [SimulationParams(provisioning_delay_s=round(d * 60),
                                   instance_capacity_per_min=args.instance_capacity_per_min,
                                   usd_per_instance_hour=price)
                  for d in args.provisioning_delay_min]
    except (TemplateError, ValueError, CalendarError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"template {args.template}: scalable target {setup.logical_id} (calendar target "
          f"{setup.calendar_target}), {len(setup.scheduled)} scheduled actions, "
          f"{len(setup.target_tracking)} target-tracking and {len(setup.step)} step policies; "
          f"{args.instance_type} at ${price:.3f}/h", file=sys.stderr)
    figures: list[dict[str, object]] = []
    for trace in traces:
        try:
            extra, notes = dated_actions(trace, setup, args.calendar)
        except CalendarError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
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
        figures.extend({"trace": trace.name, "scenario": r.label,
                        "provisioning_delay_s": r.params.provisioning_delay_s,
                        "offered": round(r.offered), "dropped": round(r.dropped),
                        "dropped_percent": round(r.dropped_percent, 3),
                        "worst_minute_dropped_percent": round(r.worst_minute_dropped_percent, 1),
                        "seconds_over_capacity": r.seconds_over_capacity,
                        "instance_hours": round(r.instance_hours, 2),
                        "cost_usd": round(r.cost_usd, 2), "peak_instances": r.peak_in_service}
                       for r in results)
        if args.plot_dir is not None and pair is not None:
            path = plot_comparison(trace, pair[0], pair[1],
                                   args.plot_dir / f"scaling-{trace.name}.png")
            print(f"wrote {path}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
