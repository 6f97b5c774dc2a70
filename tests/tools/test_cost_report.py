"""``make cost``: the monthly price of each endpoint from the synthesized scaling."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from capacity_model import LlmCapacity
from gpu_budget import instance_type
from release_calendar import parse_calendar
from release_calendar.model import ReleaseCalendar
from tools.cost_report import (
    HOURS_PER_WEEK,
    SEED_BEFORE,
    endpoint_cost,
    main,
)
from tools.scaling_sim.template import InstanceCapacity as TemplateCapacity
from tools.scaling_sim.template import ScalingSetup, TargetTrackingPolicy
from tools.scaling_sim.traces import Trace, week_trace

HOURS_PER_MONTH = 730
REPO_ROOT = Path(__file__).resolve().parents[2]
JST = dt.timezone(dt.timedelta(hours=9))


def flat(name: str, start: dt.datetime, minutes: int, rate: float) -> Trace:
    return Trace(name=name, description="", start=start, invocations_per_min=(rate,) * minutes)


def test_a_fleet_at_constant_load_costs_its_instances_times_the_catalog_price(
        tmp_path: Path) -> None:
    """Hand-checkable: 300/min against a target of 100 = 3 instances all week, a release day
    of 600/min = 6 instances; the month is 730/168 weeks plus one release day's extra."""
    setup = ScalingSetup(
        logical_id="T", min_capacity=1, max_capacity=10, scheduled=(),
        target_tracking=(TargetTrackingPolicy("tt", 100, 60, 600, False),), step=(),
        capacity=TemplateCapacity(invocations_per_min=150), instance_type="ml.g5.xlarge")
    monday = dt.datetime(2026, 12, 14, tzinfo=JST)
    calendar = tmp_path / "calendar.yaml"
    calendar.write_text("version: 1\ntimezone: Asia/Tokyo\n")
    cost = endpoint_cost(
        endpoint="llm", setup=setup, week=flat("week", monday, 7 * 1440, 300),
        release_day=flat("release", monday, 1440, 600), ordinary_day=flat("day", monday, 1440,
                                                                          300),
        calendar_path=calendar, delay_s=0, release_days_per_month=2)
    price = instance_type("ml.g5.xlarge").on_demand_usd_per_hour
    assert cost.week_instance_hours == pytest.approx(3 * HOURS_PER_WEEK)
    assert cost.week_usd == pytest.approx(3 * HOURS_PER_WEEK * price)
    assert cost.release_day_extra_usd == pytest.approx(3 * 24 * price)
    assert cost.monthly_usd == pytest.approx(3 * HOURS_PER_MONTH * price + 2 * 3 * 24 * price)
    assert cost.average_instances == pytest.approx(3)
    assert cost.week_dropped_percent == 0
    # The seed's before: 4 × ml.g5.xlarge always on, at the same catalog price.
    assert cost.before.usd_per_month == pytest.approx(4 * price * HOURS_PER_MONTH)
    assert cost.before_carries_invocations_per_min == 4 * 150


def test_the_seeds_before_is_priced_from_the_catalog() -> None:
    assert SEED_BEFORE["intent"].usd_per_month == pytest.approx(
        4 * instance_type("ml.g4dn.xlarge").on_demand_usd_per_hour * HOURS_PER_MONTH)


def test_a_typical_week_has_the_weekly_releases_and_no_dated_one() -> None:
    text = Path("config/release_calendar.yaml").read_text(encoding="utf-8")
    calendar: ReleaseCalendar = parse_calendar(text).calendar
    from stacks.settings import load_settings

    profile = load_settings("prod").llm.scaling.traffic.profile()
    week = week_trace(dt.date(2026, 12, 14), profile, calendar, target="llm")
    assert week.minutes == 7 * 1440
    per_day = [week.invocations_per_min[d * 1440:(d + 1) * 1440] for d in range(7)]
    # Monday (Jump ×2), Wednesday (Magazine ×1.8) and Friday (×2) peak; the others do not.
    peaks = [max(day) / profile.peak for day in per_day]
    assert [p > 1.5 for p in peaks] == [True, False, True, False, True, False, False]
    assert [p for p in peaks if p <= 1.5] == [1.0] * 4  # the profile's own busiest hour
    with pytest.raises(ValueError, match="is not a Monday"):
        week_trace(dt.date(2026, 12, 15), profile, calendar, target="llm")


def test_make_cost_on_the_synthesized_prod(synthesized, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           capsys: pytest.CaptureFixture[str],
                                           prod_capacity: LlmCapacity) -> None:
    plot, figures = tmp_path / "cost-prod.png", tmp_path / "cost.json"
    assert main(["--env", "prod", "--assembly", str(synthesized.outdir), "--plot", str(plot),
                 "--json", str(figures)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Monthly cost, prod (ap-northeast-1, catalog prices, approximate)")
    document = json.loads(figures.read_text())
    costs = {c["endpoint"]: c for c in document["endpoints"]}
    assert set(costs) == {"llm", "intent"}
    llm = costs["llm"]
    assert llm["instance_type"] == "ml.g5.xlarge"
    assert llm["usd_per_instance_hour"] == instance_type("ml.g5.xlarge").on_demand_usd_per_hour
    assert llm["monthly_usd"] == pytest.approx(
        llm["week_usd"] * HOURS_PER_MONTH / HOURS_PER_WEEK + llm["release_day_extra_usd"],
        abs=0.05)
    assert llm["week_dropped_percent"] == 0, "the scaling as synthesized serves the typical week"
    assert llm["release_day_extra_usd"] > 0, "the release pre-scale costs something"
    fleet = prod_capacity.fleet
    # Never below the night's floor or above the day's ceiling.
    assert fleet.off_peak.min_capacity <= llm["average_instances"] <= fleet.max_capacity
    assert costs["intent"]["instance_type"] == "ml.inf1.xlarge"
    for endpoint, cost in costs.items():
        assert f"| {endpoint} | {cost['instance_type']} @ " in out
        assert f"**${cost['monthly_usd']:,.0f}**" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The range: the LLM at both ends of the GPU rates and with the prefill rate ±40 %, each
    # synthesized and simulated; the central point is the table's LLM row.
    points = {p["variant"]: p for p in document["range"]}
    central = points["central rates (as synthesized)"]
    assert central["monthly_usd"] == llm["monthly_usd"]
    assert central["per_instance_invocations_per_min"] == fleet.per_instance_invocations_per_min
    low, high = points["optimistic rates"], points["pessimistic rates"]
    assert low["monthly_usd"] < central["monthly_usd"] < high["monthly_usd"]
    assert low["per_instance_invocations_per_min"] > central["per_instance_invocations_per_min"]
    faster, slower = points["central, prefill +40%"], points["central, prefill −40%"]
    assert faster["prefill_tokens_per_s"] == pytest.approx(1.4 * central["prefill_tokens_per_s"],
                                                           abs=0.2)
    assert faster["monthly_usd"] < central["monthly_usd"] < slower["monthly_usd"]
    assert "### The LLM's price across the GPU rates' range (prod)" in out
    for point in points.values():
        assert f"**${point['monthly_usd']:,.0f}**" in out
    assert (tmp_path / "cost-prod-range.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # docs/capacity.md quotes the range table as printed, and the prices.
    capacity_text = (REPO_ROOT / "docs" / "capacity.md").read_text(encoding="utf-8")
    capacity_doc = capacity_text.splitlines()
    range_rows = [line for line in out.split("### The LLM's price across")[1].splitlines()
                  if line.startswith("| ") and "sized at" not in line]
    assert len(range_rows) == 5
    assert [row for row in range_rows if row not in capacity_doc] == []
    for figure in (llm["monthly_usd"], costs["intent"]["monthly_usd"],
                   llm["monthly_usd"] + costs["intent"]["monthly_usd"],
                   *(p["monthly_usd"] for p in points.values())):
        assert f"**${figure:,.0f}**" in capacity_text, figure


def test_a_missing_assembly_is_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--env", "prod", "--assembly", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no ProdServing template" in err and "run make synth first" in err
