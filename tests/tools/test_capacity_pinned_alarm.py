"""``capacity-pinned-at-max`` as synthesized, driven through a night-time and a release-day timeline.

For every environment and both endpoints: the scaling simulator replays a trace through the
variant's policies as synthesized (daily floors, release pre-scales, the calendar Lambda's dated
events); each simulated minute, the scaling-limits Lambda's own code publishes the range it
would read from DescribeScalableTargets (EMF, read back as CloudWatch Logs would); SageMaker's
Invocations and InvocationsPerInstance come from the same minutes. The alarm is then replayed
from the template (tools/scaling_sim/alarm.py) and must be in ALARM exactly when the variant has
sat at the maximum *in force* for ``pinned_at_max_minutes`` minutes: the capacity model's night
ceiling in production, the registered maximum (``llm.scaling.max_capacity``) while a dated
release's pre-scale is in force (even at night), 2 in dev.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lambdas.scaling_limits import handler as limits_lambda
from stacks.settings import load_environment, load_settings
from tools.scaling_sim.__main__ import DEFAULT_CALENDAR, dated_actions, simulation_params
from tools.scaling_sim.alarm import find_alarm, metric_key, metrics_from_emf
from tools.scaling_sim.engine import MinuteSample, simulate
from tools.scaling_sim.template import scaling_setup
from tools.scaling_sim.traces import Trace, release_multiplier

JST = dt.timezone(dt.timedelta(hours=9), "JST")
VARIANT = "AllTraffic"


# --- the timelines, in units of "instances' worth of load at the scaling target" ----------------
def _surge(hour: float, *, start: float, peak: float, rise_min: float, hold_min: float,
           fall_min: float) -> float:
    """0 before ``start``, up to ``peak`` over ``rise_min``, held, back to 0 over ``fall_min``."""
    return release_multiplier(hour, release=start, peak=1 + peak, rise_min=rise_min,
                              hold_min=hold_min, fall_min=fall_min) - 1


def night_load(night_max: int) -> tuple[dt.datetime, list[float]]:
    """Tuesday 2026-12-15 00:00-06:00 JST, no release: quiet night traffic, then an unplanned
    surge at 02:30 (a viral post) that needs 1.7x the off-peak ceiling for 90 minutes."""
    start = dt.datetime(2026, 12, 15, 0, 0, tzinfo=JST)
    load = []
    for minute in range(6 * 60):
        hour = minute / 60
        load.append(0.5 * night_max + _surge(hour, start=2.5, peak=1.2 * night_max,
                                             rise_min=15, hold_min=90, fall_min=30))
    return start, load


RELEASE_DAY_EVENT = """
  - id: simulpub-night-release
    description: Global simultaneous release at 03:00 JST (Americas' prime time), test only
    date: 2026-12-08
    start: "03:00"
    lead_time_min: 90
    duration_min: 120
    multiplier: 3.0
    targets: [llm, intent]
"""
"""A dated event inside the night: its pre-scale (01:30) raises the floor and sets the maximum
back to the target's own maximum until its restore (05:00) returns the off-peak range."""


def release_day_load(night_max: int) -> tuple[dt.datetime, list[float]]:
    """Tuesday 2026-12-08 00:00-08:00 JST with the simulpub release at 03:00: 3.5x the night
    base within 15 minutes, held until 05:45 (readers outlast the release window), then down."""
    start = dt.datetime(2026, 12, 8, 0, 0, tzinfo=JST)
    load = []
    for minute in range(8 * 60):
        hour = minute / 60
        load.append(0.5 * night_max * release_multiplier(hour, release=3.0, peak=3.5,
                                                         rise_min=15, hold_min=150,
                                                         fall_min=60))
    return start, load


TIMELINES: dict[str, Callable[[int], tuple[dt.datetime, list[float]]]] = {
    "night": night_load, "release-day": release_day_load}


@pytest.fixture(scope="module")
def release_calendar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped calendar plus the night-time dated event, as the Lambda would read it."""
    path = tmp_path_factory.mktemp("calendar") / "release_calendar.yaml"
    path.write_text(DEFAULT_CALENDAR.read_text(encoding="utf-8").rstrip("\n") + "\n"
                    + RELEASE_DAY_EVENT, encoding="utf-8")
    return path


# --- one simulated variant ------------------------------------------------------------------
@dataclass(frozen=True)
class Replayed:
    samples: tuple[MinuteSample, ...]
    states: list[str]
    data: dict[Any, list[list[float]]]
    endpoint: str
    minutes_pinned: int
    template: dict[str, Any]


class DescribeOnly:
    """DescribeScalableTargets answering with the range the simulator has in force."""

    def __init__(self, resource_id: str) -> None:
        self.resource_id = resource_id
        self.range = (0, 0)

    def describe_scalable_targets(self, **kwargs: Any) -> dict[str, Any]:
        assert kwargs["ResourceIds"] == [self.resource_id]
        return {"ScalableTargets": [{
            "ServiceNamespace": "sagemaker", "ResourceId": self.resource_id,
            "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "MinCapacity": self.range[0], "MaxCapacity": self.range[1]}]}


def published_limits(samples: Sequence[MinuteSample], resource_id: str, start: dt.datetime,
                     skip: Callable[[int], bool] = lambda minute: False
                     ) -> dict[Any, list[list[float]]]:
    """Run the scaling-limits Lambda's publish() once per simulated minute; what CloudWatch
    Logs would extract from its EMF lines, per metric and minute."""
    aas = DescribeOnly(resource_id)
    data: dict[Any, list[list[float]]] = {}
    for minute, sample in enumerate(samples):
        aas.range = (sample.min_capacity, sample.max_capacity)
        out = io.StringIO()
        timestamp = start + dt.timedelta(minutes=minute, seconds=30)
        with contextlib.redirect_stdout(out):
            limits_lambda.publish(aas, [resource_id],
                                  timestamp_ms=int(timestamp.timestamp() * 1000))
        for line in out.getvalue().splitlines():
            document = json.loads(line)
            if "_aws" not in document or skip(minute):
                continue
            for key, value in metrics_from_emf(document):
                data.setdefault(key, [[] for _ in samples])[minute].append(value)
    return data


def sagemaker_metrics(samples: Sequence[MinuteSample], endpoint: str
                      ) -> dict[Any, list[list[float]]]:
    """Invocations and InvocationsPerInstance (per-minute sums) as SageMaker publishes them."""
    dims = {"EndpointName": endpoint, "VariantName": VARIANT}
    return {
        metric_key("AWS/SageMaker", "Invocations", dims): [[s.offered] for s in samples],
        metric_key("AWS/SageMaker", "InvocationsPerInstance", dims): [
            [s.offered / s.in_service] for s in samples],
    }


def replay(synthesized: Any, stage: str, target: str, timeline: str, calendar: Path,
           skip_published: Callable[[int], bool] | None = None,
           alarm_rule: str = "capacity-pinned-at-max") -> Replayed:
    environment = load_environment(stage.lower())
    settings, plans = environment.settings, environment.plans
    endpoint_settings = settings.llm if target == "llm" else settings.intent
    scaling = endpoint_settings.scaling
    endpoint = f"{settings.resource_prefix}-{target}"
    resource_id = f"endpoint/{endpoint}/variant/{VARIANT}"
    template = synthesized.template(f"{stage}/Serving")
    (logical_id,) = [k for k, r in template["Resources"].items()
                     if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
                     and r["Properties"]["ResourceId"] == resource_id]
    setup = scaling_setup(template, scalable_target=logical_id)
    fleet = plans.llm_fleet if target == "llm" else plans.intent_fleet
    start, load = TIMELINES[timeline](fleet.off_peak.max_capacity)
    per_instance_target = fleet.target_invocations_per_instance_per_min
    trace = Trace(name=f"{timeline}-{target}", description="", start=start,
                  invocations_per_min=tuple(round(x * per_instance_target, 1) for x in load))
    extra, notes = dated_actions(trace, setup, calendar)
    assert not [n for n in notes if "simulpub" in n], notes
    result = simulate(trace, setup, simulation_params(
        setup, delay_min=scaling.provisioning_delay_s / 60, capacity_override=None,
        instance_type=None, usd_override=None), extra_actions=extra)
    data = sagemaker_metrics(result.samples, endpoint)
    data.update(published_limits(result.samples, resource_id, start,
                                 skip=skip_published or (lambda minute: False)))
    alarm = find_alarm(template, f"{endpoint}-{alarm_rule}")
    return Replayed(samples=result.samples, states=alarm.states(data, trace.minutes),
                    data=data, endpoint=endpoint,
                    minutes_pinned=endpoint_settings.alarms.pinned_at_max_minutes,
                    template=template)


def pinned(sample: MinuteSample) -> bool:
    """The oracle: the fleet sits at the maximum in force (the simulator's own range)."""
    return sample.offered > 0 and sample.in_service >= sample.max_capacity - 0.5


def expected_states(samples: Sequence[MinuteSample], minutes: int) -> list[str]:
    return ["ALARM" if end >= minutes and all(pinned(s) for s in samples[end - minutes:end])
            else "OK" for end in range(1, len(samples) + 1)]


# --- the tests ------------------------------------------------------------------------------
CASES = [(stage, target, timeline) for stage in ("Dev", "Prod") for target in ("llm", "intent")
         for timeline in TIMELINES]


@pytest.mark.parametrize(("stage", "target", "timeline"), CASES,
                         ids=[f"{s}-{t}-{tl}" for s, t, tl in CASES])
def test_pages_exactly_when_pinned_at_the_maximum_in_force(
    synthesized: Any, release_calendar: Path, stage: str, target: str, timeline: str
) -> None:
    run = replay(synthesized, stage, target, timeline, release_calendar)
    assert run.states == expected_states(run.samples, run.minutes_pinned)
    plans = load_environment(stage.lower()).plans
    night_max = (plans.llm_fleet if target == "llm" else plans.intent_fleet).off_peak.max_capacity
    paged_at = {s.max_capacity for s, state in zip(run.samples, run.states, strict=True)
                if state == "ALARM"}
    # Both timelines end up capped by the off-peak ceiling, and that is what pages.
    assert night_max in paged_at, f"{run.endpoint}: the night-time surge did not page"


def night_ceiling() -> int:
    """Production's night maximum, as the capacity model derives it."""
    return load_environment("prod").plans.llm_fleet.off_peak.max_capacity


def registered_max() -> int:
    """Production's scalable-target maximum (``llm.scaling.max_capacity``)."""
    return load_settings("prod").llm.scaling.max_capacity


def test_a_night_surge_at_the_night_ceiling_pages_although_the_registered_max_is_higher(
    synthesized: Any, release_calendar: Path
) -> None:
    ceiling = night_ceiling()
    assert ceiling < registered_max()
    run = replay(synthesized, "Prod", "llm", "night", release_calendar)
    first = run.states.index("ALARM")
    sample = run.samples[first]
    assert (sample.max_capacity, round(sample.in_service)) == (ceiling, ceiling)
    assert sample.start.astimezone(JST).hour in range(1, 8)  # off-peak: 01:00-08:00 JST
    assert max(s.in_service for s in run.samples) < registered_max(), (
        "never near the registered maximum")


def test_a_night_release_runs_above_the_night_maximum_without_paging(
    synthesized: Any, release_calendar: Path
) -> None:
    ceiling, maximum = night_ceiling(), registered_max()
    run = replay(synthesized, "Prod", "llm", "release-day", release_calendar)
    window = [(s, state) for s, state in zip(run.samples, run.states, strict=True)
              if dt.time(1, 45) <= s.start.astimezone(JST).time() < dt.time(5, 0)]
    # The calendar Lambda's dated pre-scale is in force at night: a floor above the off-peak
    # ceiling and the target's own maximum. A "ceiling between 01:00 and 08:00" rule
    # (metric math on the time of day) would page all through the release.
    assert all(s.min_capacity > ceiling and s.max_capacity == maximum for s, _ in window)
    assert min(s.in_service for s, _ in window) > ceiling
    assert all(state == "OK" for _, state in window)
    # The restore at 05:00 puts the off-peak range back while readers are still there: pinned
    # at the night ceiling, and the page follows.
    after = [(s, state) for s, state in zip(run.samples, run.states, strict=True)
             if s.start.astimezone(JST).time() >= dt.time(5, 0)]
    assert any(state == "ALARM" and s.max_capacity == ceiling for s, state in after)


def test_a_missed_minute_of_the_published_maximum_changes_nothing(
    synthesized: Any, release_calendar: Path
) -> None:
    every = replay(synthesized, "Prod", "llm", "night", release_calendar)
    gaps = replay(synthesized, "Prod", "llm", "night", release_calendar,
                  skip_published=lambda m: m % 7 == 3)
    assert gaps.states == every.states


def test_without_the_published_maximum_it_falls_back_to_the_registered_one_and_warns(
    synthesized: Any, release_calendar: Path
) -> None:
    silent = replay(synthesized, "Prod", "llm", "night", release_calendar,
                    skip_published=lambda m: True)
    # Degraded, never false: compared with the registered maximum, the pin at night does not
    # page ...
    assert "ALARM" not in silent.states
    # ... and capacity-limits-missing says why: no MaxCapacityInForce at all is
    # INSUFFICIENT_DATA ("missing" data handling), which notifies the topic.
    missing = replay(synthesized, "Prod", "llm", "night", release_calendar,
                     skip_published=lambda m: True, alarm_rule="capacity-limits-missing")
    assert set(missing.states) == {"INSUFFICIENT_DATA"}
    published = replay(synthesized, "Prod", "llm", "night", release_calendar,
                       alarm_rule="capacity-limits-missing")
    assert set(published.states) == {"OK"}
