"""``make cost ENV=<env>``: what each endpoint costs a month, from the synthesized scaling.

For each endpoint of the environment (the LLM and the intent classifier) the scaling simulator
replays, through the scalable target *as synthesized* (its floors, release pre-scales, target
tracking and step policies, the capacity model's per-instance figures in its metadata):

* a **typical week** — the endpoint's expected day (``scaling.traffic``) seven times, with the
  calendar's weekly releases (no dated or seasonal ones);
* a **release day** — the day of the calendar's first dated release for the endpoint (One
  Piece chapter 1,100), with its pre-scale from the release-calendar Lambda, and the same day
  without it.

The month is the week scaled to 730 hours (AWS's convention) plus ``release_days_per_month``
times what a release day adds over an ordinary one, at the ``gpu_budget`` catalog's price of
the variant's instance type. Next to it: the seeds' "before" configuration
(docs/design-decisions.md#before-fleet: four ``ml.g5.xlarge`` always on for the LLM, four
``ml.g4dn.xlarge`` for the classifier) at the same catalog prices, a table and a bar chart.

**A range, not a point.** The LLM's per-instance rate rests on GPU rates that nobody has
measured on this stack (``config/decode_speed.json`` ``rates``: each a low / central / high
range with its sources). The environment is synthesized at the central rates; the report also
synthesizes it (in process, no nag checks) at the pessimistic and optimistic ends and with the
central prefill rate ±40 %, simulates the LLM's typical week and release day through each of
those scalable targets, and prints the month for each: the price's range and its sensitivity
to the prefill rate (``--no-range`` skips it).

Prices are the catalog's approximate Tokyo on-demand figures (``gpu_budget/instances.py``):
estimates, not a bill.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_budget import instance_type
from gpu_budget.instances import HOURS_PER_MONTH
from release_calendar import CalendarError, EventKind, ReleaseCalendar, parse_calendar
from tools.scaling_sim.__main__ import dated_actions, simulation_params
from tools.scaling_sim.engine import SimulationResult, simulate
from tools.scaling_sim.template import ScalingSetup, TemplateError, load_template, scaling_setup
from tools.scaling_sim.traces import TYPICAL_WEEK_MONDAY, Trace, day_trace, week_trace

if TYPE_CHECKING:
    from stacks.settings import Environment, EnvironmentSettings

HOURS_PER_WEEK = 7 * 24
ENDPOINTS: tuple[str, ...] = ("llm", "intent")
PREFILL_SENSITIVITY = 0.4


@dataclass(frozen=True)
class RateVariant:
    """One point of the range: which end of the rates, and a factor on the prefill rate."""

    name: str
    scenario: str
    prefill_factor: float = 1.0


RANGE_VARIANTS: tuple[RateVariant, ...] = (
    RateVariant("optimistic rates", "optimistic"),
    RateVariant("central rates (as synthesized)", "central"),
    RateVariant("pessimistic rates", "pessimistic"),
    RateVariant(f"central, prefill −{PREFILL_SENSITIVITY:.0%}", "central",
                1 - PREFILL_SENSITIVITY),
    RateVariant(f"central, prefill +{PREFILL_SENSITIVITY:.0%}", "central",
                1 + PREFILL_SENSITIVITY),
)


@dataclass(frozen=True)
class SeedBefore:
    """An endpoint's configuration before this platform, as the seed describes it."""

    instance_type: str
    instances: int
    source: str

    @property
    def usd_per_month(self) -> float:
        """Always on, at the catalog's price."""
        return self.instances * instance_type(self.instance_type).on_demand_usd_per_hour \
            * HOURS_PER_MONTH


SEED_BEFORE: dict[str, SeedBefore] = {
    "llm": SeedBefore("ml.g5.xlarge", 4, "\"4 instances always on\" "
                                         "(docs/design-decisions.md#before-fleet)"),
    "intent": SeedBefore("ml.g4dn.xlarge", 4, "DistilBERT on ml.g4dn.xlarge × 4 "
                                               "(docs/design-decisions.md#before-fleet)"),
}


@dataclass(frozen=True)
class EndpointCost:
    """One endpoint's month, and where it comes from."""

    endpoint: str
    instance_type: str
    usd_per_instance_hour: float
    week_instance_hours: float
    week_dropped_percent: float
    release_day_instance_hours: float
    ordinary_day_instance_hours: float
    release_day_dropped_percent: float
    release_days_per_month: float
    before: SeedBefore
    per_instance_invocations_per_min: float
    peak_invocations_per_min: float

    @property
    def before_carries_invocations_per_min(self) -> float | None:
        """What the seed's fleet sustains at the capacity model's per-instance rate (None when
        the seed's instance type is not the one the model sized)."""
        if self.before.instance_type != self.instance_type:
            return None
        return self.before.instances * self.per_instance_invocations_per_min

    @property
    def week_usd(self) -> float:
        """The typical week's cost."""
        return self.week_instance_hours * self.usd_per_instance_hour

    @property
    def release_day_extra_usd(self) -> float:
        """What one release day costs over the same day without the release."""
        extra = self.release_day_instance_hours - self.ordinary_day_instance_hours
        return extra * self.usd_per_instance_hour

    @property
    def monthly_usd(self) -> float:
        """Typical weeks for 730 hours plus the month's release days."""
        return (self.week_usd * HOURS_PER_MONTH / HOURS_PER_WEEK
                + self.release_days_per_month * self.release_day_extra_usd)

    @property
    def average_instances(self) -> float:
        """Instances running on average in a typical week."""
        return self.week_instance_hours / HOURS_PER_WEEK

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures."""
        data = asdict(self)
        data["before"] = {**asdict(self.before), "usd_per_month": round(
            self.before.usd_per_month, 2)}
        carries = self.before_carries_invocations_per_min
        data.update(before_carries_invocations_per_min=None if carries is None
                    else round(carries, 1),
                    week_usd=round(self.week_usd, 2),
                    release_day_extra_usd=round(self.release_day_extra_usd, 2),
                    monthly_usd=round(self.monthly_usd, 2),
                    average_instances=round(self.average_instances, 2))
        return data


def target_logical_id(template: dict[str, Any], endpoint_name: str) -> str:
    """The scalable target of ``endpoint_name``'s variant."""
    for logical_id, resource in template["Resources"].items():
        if (resource.get("Type") == "AWS::ApplicationAutoScaling::ScalableTarget"
                and str(resource["Properties"].get("ResourceId", "")).startswith(
                    f"endpoint/{endpoint_name}/variant/")):
            return logical_id
    raise TemplateError(f"no scalable target for endpoint {endpoint_name}")


def _run(trace: Trace, setup: ScalingSetup, calendar_path: Path, *, delay_s: int,
         with_dated: bool) -> SimulationResult:
    extra, _notes = dated_actions(trace, setup, calendar_path) if with_dated else ([], [])
    params = simulation_params(setup, delay_min=delay_s / 60, capacity_override=None,
                               instance_type=None, usd_override=None)
    return simulate(trace, setup, params, extra_actions=extra,
                    exclude_prefix=None if with_dated else "calendar-dated-")


def endpoint_cost(*, endpoint: str, setup: ScalingSetup, week: Trace, release_day: Trace,
                  ordinary_day: Trace, calendar_path: Path, delay_s: int,
                  release_days_per_month: float) -> EndpointCost:
    """Simulate the week and the release day of one endpoint and price them."""
    week_result = _run(week, setup, calendar_path, delay_s=delay_s, with_dated=False)
    release = _run(release_day, setup, calendar_path, delay_s=delay_s, with_dated=True)
    ordinary = _run(ordinary_day, setup, calendar_path, delay_s=delay_s, with_dated=False)
    if setup.instance_type is None:
        raise TemplateError(f"{setup.logical_id}: the template names no instance type")
    return EndpointCost(
        endpoint=endpoint, instance_type=setup.instance_type,
        usd_per_instance_hour=week_result.params.usd_per_instance_hour,
        week_instance_hours=week_result.instance_hours,
        week_dropped_percent=week_result.dropped_percent,
        release_day_instance_hours=release.instance_hours,
        ordinary_day_instance_hours=ordinary.instance_hours,
        release_day_dropped_percent=release.dropped_percent,
        release_days_per_month=release_days_per_month, before=SEED_BEFORE[endpoint],
        per_instance_invocations_per_min=week_result.params.instance_capacity_per_min,
        peak_invocations_per_min=max(week.invocations_per_min))


def first_dated_release(calendar: ReleaseCalendar, target: str) -> dt.date:
    """The date of the calendar's first dated release for ``target``."""
    dates = sorted(e.date for e in calendar.dated if target in e.targets)
    if not dates:
        raise ValueError(f"the release calendar has no dated release for {target}")
    return dates[0]


def cost_table(costs: Sequence[EndpointCost]) -> str:
    """The Markdown table docs/capacity.md shows."""
    lines = [
        "| endpoint | instance | typical week: avg instances, USD | shed in the week | release "
        "day adds | per month | seed's before | it sustains (capacity model) | per month "
        "before | change |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cost in costs:
        before = cost.before
        change = cost.monthly_usd / before.usd_per_month - 1
        carries = cost.before_carries_invocations_per_min
        sustains = ("another instance type" if carries is None
                    else f"{carries:,.0f}/min vs a {cost.peak_invocations_per_min:,.0f}/min peak")
        lines.append(
            f"| {cost.endpoint} | {cost.instance_type} @ ${cost.usd_per_instance_hour:,.3f}/h "
            f"| {cost.average_instances:.1f}, ${cost.week_usd:,.0f} "
            f"| {cost.week_dropped_percent:.2f} % "
            f"| ${cost.release_day_extra_usd:,.0f} × {cost.release_days_per_month:g} "
            f"| **${cost.monthly_usd:,.0f}** "
            f"| {before.instances} × {before.instance_type} always on "
            f"| {sustains} | ${before.usd_per_month:,.0f} | {change:+.0%} |")
    total = sum(c.monthly_usd for c in costs)
    total_before = sum(c.before.usd_per_month for c in costs)
    lines.append(f"| **total** | | | | | **${total:,.0f}** | | | ${total_before:,.0f} | "
                 f"{total / total_before - 1:+.0%} |")
    return "\n".join(lines)


def plot_costs(costs: Sequence[EndpointCost], path: Path, *, title: str) -> Path:
    """Monthly cost per endpoint, now and the seed's before, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [cost.endpoint for cost in costs]
    positions = range(len(costs))
    width = 0.38
    figure, axis = plt.subplots(figsize=(8, 4.8))
    before = [cost.before.usd_per_month for cost in costs]
    weeks = [cost.week_usd * HOURS_PER_MONTH / HOURS_PER_WEEK for cost in costs]
    releases = [cost.release_days_per_month * cost.release_day_extra_usd for cost in costs]
    axis.bar([p - width / 2 for p in positions], before, width, color="#9e9e9e",
             label="seed's before (always on)")
    axis.bar([p + width / 2 for p in positions], weeks, width, color="#1f6fb2",
             label="typical weeks (730 h)")
    axis.bar([p + width / 2 for p in positions], releases, width, bottom=weeks,
             color="#e67e22", label="release days")
    for position, cost, old in zip(positions, costs, before, strict=True):
        axis.text(position + width / 2, cost.monthly_usd, f"${cost.monthly_usd:,.0f}",
                  ha="center", va="bottom", fontsize=9)
        axis.text(position - width / 2, old, f"${old:,.0f}", ha="center", va="bottom",
                  fontsize=9)
    axis.set_xticks(list(positions), [f"{label}\n({cost.instance_type})"
                                      for label, cost in zip(labels, costs, strict=True)])
    axis.set_ylabel("USD per month (catalog prices, approximate)")
    axis.set_title(title)
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@dataclass(frozen=True)
class RangePoint:
    """The LLM's month at one point of the rates' range."""

    variant: RateVariant
    prefill_tokens_per_s: float
    per_instance_invocations_per_min: float
    night_min: int
    xl_ttft_p99_ms: float
    cost: EndpointCost


def variant_environment(data: dict[str, Any], variant: RateVariant,
                        source: str) -> Environment:
    """The environment with the LLM sized at ``variant``'s rates: its settings and plans."""
    from stacks.settings import parse_environment

    edited = json.loads(json.dumps(data))
    edited["llm"].setdefault("capacity", {})["rates"] = {
        "scenario": variant.scenario, "prefill_factor": variant.prefill_factor}
    return parse_environment(edited, source=f"{source} ({variant.name})")


def synthesize_serving(environment: Environment, outdir: Path) -> dict[str, Any]:
    """The environment's Serving template, synthesized in process (no nag checks: a what-if)."""
    import aws_cdk as cdk

    from stacks.stage import MangaAssistStage
    from stacks.synth import feature_flags

    app = cdk.App(outdir=str(outdir), context=feature_flags())
    MangaAssistStage(app, settings=environment.settings, plans=environment.plans)
    app.synth()
    return load_template(serving_template(outdir, environment.settings.stage_name))


def range_point(variant: RateVariant, environment: Environment, template: dict[str, Any],
                traces: dict[str, Trace], calendar_path: Path,
                release_days_per_month: float) -> RangePoint:
    """Simulate and price the LLM of ``template`` (synthesized at ``variant``'s rates)."""
    settings = environment.settings
    llm = settings.llm
    capacity = environment.plans.llm_capacity
    setup = scaling_setup(template, calendar_target="llm", scalable_target=target_logical_id(
        template, f"{settings.resource_prefix}-llm"))
    cost = endpoint_cost(endpoint="llm", setup=setup, week=traces["week"],
                         release_day=traces["release_day"], ordinary_day=traces["ordinary_day"],
                         calendar_path=calendar_path, delay_s=llm.scaling.provisioning_delay_s,
                         release_days_per_month=release_days_per_month)
    rates = capacity.rates
    return RangePoint(
        variant=variant,
        prefill_tokens_per_s=(0.0 if rates is None else rates.prefill_tokens_per_s(
            capacity.reuse_inputs.scenario) * capacity.reuse_inputs.prefill_factor),
        per_instance_invocations_per_min=capacity.instance.sustainable_invocations_per_min,
        night_min=capacity.fleet.off_peak.min_capacity,
        xl_ttft_p99_ms=capacity.instance.latency_of("XL").time_to_first_token_p99_ms
        if any(d.bucket.value == "XL" for d in capacity.mix.demands) else 0.0,
        cost=cost)


def range_table(points: Sequence[RangePoint], intent_monthly_usd: float) -> str:
    """The LLM's month across the rates' range, and with it the total."""
    lines = [
        "| LLM sized at | prefill tokens/s | per instance | night min | XL TTFT p99 | avg "
        "instances | shed in the week | LLM per month | total per month |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in points:
        cost = point.cost
        lines.append(
            f"| {point.variant.name} | {point.prefill_tokens_per_s:,.0f} "
            f"| {point.per_instance_invocations_per_min:,.1f}/min | {point.night_min} "
            f"| {point.xl_ttft_p99_ms / 1000:.2f} s | {cost.average_instances:.1f} "
            f"| {cost.week_dropped_percent:.2f} % | **${cost.monthly_usd:,.0f}** "
            f"| ${cost.monthly_usd + intent_monthly_usd:,.0f} |")
    return "\n".join(lines)


def plot_range(points: Sequence[RangePoint], path: Path, *, title: str) -> Path:
    """The LLM's monthly price at each point of the range, as horizontal bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 3.6))
    labels = [p.variant.name for p in points]
    values = [p.cost.monthly_usd for p in points]
    colors = ["#1f6fb2" if p.variant.prefill_factor == 1 else "#e67e22" for p in points]
    axis.barh(range(len(points)), values, color=colors)
    for index, value in enumerate(values):
        axis.text(value, index, f" ${value:,.0f}", va="center", fontsize=9)
    axis.set_yticks(range(len(points)), labels)
    axis.invert_yaxis()
    axis.set_xlabel("LLM endpoint, USD per month (catalog prices, approximate)")
    axis.set_title(title)
    axis.set_xlim(0, max(values) * 1.2)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def serving_template(assembly: Path, stage: str) -> Path:
    """``<assembly>/assembly-<Stage>/<Stage>Serving*.template.json``."""
    found = sorted((assembly / f"assembly-{stage}").glob(f"{stage}Serving*.template.json"))
    if not found:
        raise TemplateError(f"no {stage}Serving template under {assembly}/assembly-{stage}: "
                            "run make synth first")
    return found[0]


def _traces(endpoint: str, settings: EnvironmentSettings, calendar: ReleaseCalendar,
            release_date: dt.date) -> dict[str, Trace]:
    profile = getattr(settings, endpoint).scaling.traffic.profile()
    return {
        "week": week_trace(TYPICAL_WEEK_MONDAY, profile, calendar, target=endpoint),
        "release_day": day_trace(release_date, profile, calendar, name="release-day",
                                 target=endpoint, description=""),
        "ordinary_day": day_trace(release_date, profile, calendar, name="ordinary-day",
                                  target=endpoint, description="",
                                  kinds=(EventKind.RECURRING, EventKind.SEASONAL)),
    }


def price_range(environment: Environment, template: dict[str, Any],
                traces: dict[str, Trace], calendar_path: Path,
                release_days_per_month: float) -> list[RangePoint]:
    """The LLM priced at every :data:`RANGE_VARIANTS` point (the central one from ``template``,
    the others synthesized here)."""
    import yaml

    from stacks.settings import CONFIG_DIR

    settings = environment.settings
    data = yaml.safe_load((CONFIG_DIR / f"{settings.name}.yaml").read_text(encoding="utf-8"))
    points = []
    with tempfile.TemporaryDirectory(prefix="cost-range-") as scratch:
        for index, variant in enumerate(RANGE_VARIANTS):
            as_synthesized = variant.scenario == "central" and variant.prefill_factor == 1
            sized = (environment if as_synthesized else
                     variant_environment(data, variant, f"config/{settings.name}.yaml"))
            print(f"pricing the LLM at {variant.name} ...", file=sys.stderr)
            variant_template = (template if as_synthesized else synthesize_serving(
                sized, Path(scratch) / str(index)))
            points.append(range_point(variant, sized, variant_template, traces,
                                      calendar_path, release_days_per_month))
    return points


def main(argv: Sequence[str] | None = None) -> int:
    """Run the report; returns the exit code (2 on a bad input, one line)."""
    parser = argparse.ArgumentParser(prog="python -m tools.cost_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="environment (config/<env>.yaml)")
    parser.add_argument("--assembly", type=Path, default=Path("cdk.out"),
                        help="the synthesized cloud assembly (default: %(default)s)")
    parser.add_argument("--release-days-per-month", type=float, default=1.0,
                        help="dated releases per month like the calendar's first (default: 1)")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="the bar chart; the range goes beside it as FILE-range.png")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-range", action="store_true",
                        help="skip the price range over the GPU rates (saves four syntheses)")
    args = parser.parse_args(argv)
    from stacks.settings import REPO_ROOT, SettingsError, load_environment

    try:
        environment = load_environment(args.env)
        settings = environment.settings
        template_path = serving_template(args.assembly, settings.stage_name)
        template = load_template(template_path)
        calendar_path = REPO_ROOT / settings.release_calendar.file
        calendar = parse_calendar(calendar_path.read_text(encoding="utf-8"),
                                  source=str(calendar_path)).calendar
        if args.release_days_per_month < 0:
            raise ValueError(f"--release-days-per-month {args.release_days_per_month}; "
                             "accepted: >= 0")
    except (SettingsError, TemplateError, CalendarError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"template {template_path}", file=sys.stderr)
    costs: list[EndpointCost] = []
    traces: dict[str, dict[str, Trace]] = {}
    for endpoint in ENDPOINTS:
        try:
            setup = scaling_setup(
                template, calendar_target=endpoint,
                scalable_target=target_logical_id(
                    template, f"{settings.resource_prefix}-{endpoint}"))
            release_date = first_dated_release(calendar, endpoint)
        except (TemplateError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"simulating {endpoint}: a typical week from {TYPICAL_WEEK_MONDAY} and the "
              f"release day {release_date} ...", file=sys.stderr)
        traces[endpoint] = _traces(endpoint, settings, calendar, release_date)
        costs.append(endpoint_cost(
            endpoint=endpoint, setup=setup, **traces[endpoint], calendar_path=calendar_path,
            delay_s=getattr(settings, endpoint).scaling.provisioning_delay_s,
            release_days_per_month=args.release_days_per_month))
    points = ([] if args.no_range else price_range(
        environment, template, traces["llm"], calendar_path, args.release_days_per_month))
    _report(settings, costs, points, plot=args.plot, json_path=args.json)
    return 0


def _report(settings: EnvironmentSettings, costs: Sequence[EndpointCost],
            points: Sequence[RangePoint], *, plot: Path | None, json_path: Path | None) -> None:
    print(f"### Monthly cost, {settings.name} ({settings.region}, catalog prices, approximate)")
    print()
    print(cost_table(costs))
    if points:
        intent = next(c.monthly_usd for c in costs if c.endpoint == "intent")
        print()
        print(f"### The LLM's price across the GPU rates' range ({settings.name})")
        print()
        print(range_table(points, intent))
    if plot is not None:
        path = plot_costs(costs, plot, title=f"{settings.name}: monthly cost per endpoint")
        print(f"wrote {path}", file=sys.stderr)
        if points:
            ranged = plot_range(points, plot.with_name(f"{plot.stem}-range{plot.suffix}"),
                                title=f"{settings.name}: the LLM's month across the rates")
            print(f"wrote {ranged}", file=sys.stderr)
    if json_path is not None:
        document: dict[str, Any] = {"endpoints": [c.to_dict() for c in costs], "range": [
            {"variant": p.variant.name, "scenario": p.variant.scenario,
             "prefill_factor": p.variant.prefill_factor,
             "prefill_tokens_per_s": round(p.prefill_tokens_per_s, 1),
             "per_instance_invocations_per_min": p.per_instance_invocations_per_min,
             "night_min": p.night_min, "xl_ttft_p99_ms": p.xl_ttft_p99_ms,
             **p.cost.to_dict()} for p in points]}
        json_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
