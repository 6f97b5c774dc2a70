"""Properties of the expansion, checked on generated calendars.

The central one: replaying the emitted schedule strings (through the cron parser, "last action
wins") gives, at every moment, exactly the range that should be in force — the top-priority
window covering that moment, else the daily floor. A pre-scale without its restore, a floor firing
inside a release, a restore to the wrong floor or a missed weekday shift would all break it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from release_calendar import (
    ActionRole,
    CapacityModel,
    DailyFloor,
    ReleaseCalendar,
    SchedulePlan,
    event_capacity,
    parse_calendar,
    parse_schedule,
    plan_dated_schedule,
    plan_static_schedule,
)
from release_calendar.expand import REPRESENTATIVE_YEARS
from release_calendar.timeline import (
    Window,
    dated_window,
    recurring_windows,
    replay_mismatches,
    seasonal_windows,
)

DAYS = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
PROFILE = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])


def hhmm(minute_of_day: int) -> str:
    return f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d}"


@st.composite
def capacity_models(draw: st.DrawFn) -> CapacityModel:
    off_peak, business = draw(st.lists(st.integers(0, 1439), min_size=2, max_size=2,
                                       unique=True))
    low_max = draw(st.integers(2, 10))
    return CapacityModel(
        base_invocations_per_min=draw(st.sampled_from([300, 600, 900])),
        per_instance_invocations_per_min=200, headroom=0.3, min_capacity=1, max_capacity=20,
        timezone="Asia/Tokyo",
        off_peak=DailyFloor("off-peak", dt.time(off_peak // 60, off_peak % 60), 1, low_max),
        business_hours=DailyFloor("business-hours", dt.time(business // 60, business % 60),
                                  draw(st.integers(2, 5)), 20))


@st.composite
def recurring_entries(draw: st.DrawFn, count: int, priorities: list[int]) -> list[dict[str, Any]]:
    entries = []
    for i in range(count):
        lead = draw(st.integers(0, 600))
        entries.append({
            "id": f"weekly-{i}",
            "weekdays": draw(st.lists(st.sampled_from(DAYS), min_size=1, max_size=7,
                                      unique=True)),
            "start": hhmm(draw(st.integers(0, 1439))),
            "lead_time_min": lead,
            "duration_min": draw(st.integers(1, 1440 - lead)),  # no self-overlap
            "multiplier": draw(st.sampled_from([0.5, 1.0, 1.8, 2.0, 3.0, 5.0])),
            "priority": priorities[i],
            "targets": ["llm"],
        })
    return entries


def parse(document: dict[str, Any]) -> ReleaseCalendar:
    parsed = parse_calendar(yaml.safe_dump({"version": 1, "timezone": "Asia/Tokyo",
                                            **document}))
    assert parsed.errors == ()
    return parsed.calendar


def windows_of(calendar: ReleaseCalendar, model: CapacityModel, skipped: frozenset[str],
               first: dt.date, last: dt.date, years: range) -> list[Window]:
    windows: list[Window] = []
    for event in calendar.events:
        if event.event_id in skipped:
            continue
        capacity, _ = event_capacity(event, "llm", model)
        assert capacity is not None
        if event.kind.value == "recurring":
            windows += recurring_windows(event, "llm", capacity, first, last)  # type: ignore[arg-type]
        elif event.kind.value == "seasonal":
            windows += seasonal_windows(event, "llm", capacity, years)  # type: ignore[arg-type]
        else:
            windows.append(dated_window(event, "llm", capacity))  # type: ignore[arg-type]
    return windows


def assert_pairs(plan: SchedulePlan) -> None:
    """Every pre-scale has a restore, firing as often (per week for weekly crons)."""
    fires: Counter[tuple[str | None, ActionRole]] = Counter()
    week = (dt.datetime(2030, 1, 7), dt.datetime(2030, 1, 14))
    for action in plan.for_target("llm"):
        if action.role is not ActionRole.FLOOR:
            schedule = parse_schedule(action.schedule)
            day_of_month = action.schedule.split()[2] if action.schedule.startswith("cron(") \
                else ""
            count = len(list(schedule.firings(*week))) if day_of_month in ("?", "*") else 1
            fires[(action.event_id, action.role)] += count
    for (event_id, role), count in fires.items():
        if role is ActionRole.PRESCALE:
            assert fires[(event_id, ActionRole.RESTORE)] == count, event_id


@PROFILE
@given(model=capacity_models(), data=st.data())
def test_weekly_schedule_replays_to_the_intended_capacity(model: CapacityModel,
                                                          data: st.DataObject) -> None:
    count = data.draw(st.integers(1, 4))
    priorities = data.draw(st.permutations(list(range(count))))
    calendar = parse({"recurring": data.draw(recurring_entries(count, priorities))})
    plan = plan_static_schedule(calendar, {"llm": model})
    assert plan.errors == ()  # distinct priorities, no self-overlap: always valid
    assert_pairs(plan)
    start, end = dt.datetime(2030, 1, 7), dt.datetime(2030, 1, 21)
    windows = windows_of(calendar, model, frozenset(), start.date() - dt.timedelta(days=10),
                         end.date() + dt.timedelta(days=3), range(0))
    assert replay_mismatches(plan.for_target("llm"), windows, model, start, end) == []


@PROFILE
@given(model=capacity_models(), data=st.data())
def test_overlaps_without_a_winner_are_rejected_and_the_rest_still_replays(
        model: CapacityModel, data: st.DataObject) -> None:
    count = data.draw(st.integers(2, 4))
    priorities = data.draw(st.lists(st.integers(0, 1), min_size=count, max_size=count))
    calendar = parse({"recurring": data.draw(recurring_entries(count, priorities))})
    plan = plan_static_schedule(calendar, {"llm": model})
    for error in plan.errors:
        assert error.event_id in plan.skipped_event_ids
        assert error.where.startswith(f"recurring[{error.event_id.split('-')[1]}] "
                                      f"({error.event_id}).")
        assert "overlaps" in error.message
        assert "accepted:" in error.message
    assert_pairs(plan)
    start, end = dt.datetime(2030, 1, 7), dt.datetime(2030, 1, 21)
    windows = windows_of(calendar, model, plan.skipped_event_ids,
                         start.date() - dt.timedelta(days=10), end.date() + dt.timedelta(days=3),
                         range(0))
    assert replay_mismatches(plan.for_target("llm"), windows, model, start, end) == []


@PROFILE
@given(model=capacity_models(), data=st.data())
def test_dated_actions_with_the_fixed_ones_replay_to_the_intended_capacity(
        model: CapacityModel, data: st.DataObject) -> None:
    weekly_count = data.draw(st.integers(0, 2))
    dated_count = data.draw(st.integers(1, 4))
    priorities = data.draw(st.lists(st.integers(0, 3), min_size=weekly_count + dated_count,
                                    max_size=weekly_count + dated_count))
    dated = []
    for i in range(dated_count):
        lead = data.draw(st.integers(0, 180))
        dated.append({
            "id": f"dated-{i}",
            "date": (dt.date(2030, 1, 14) + dt.timedelta(days=data.draw(st.integers(0, 3))))
            .isoformat(),
            "start": hhmm(data.draw(st.integers(0, 1439))),
            "lead_time_min": lead,
            # mostly short windows: long ones nearly always contain a floor and are rejected
            "duration_min": data.draw(st.one_of(st.integers(1, 300), st.integers(1, 1440))),
            "multiplier": data.draw(st.sampled_from([1.0, 2.0, 3.0, 4.0])),
            "priority": priorities[weekly_count + i],
            "targets": ["llm"],
        })
    calendar = parse({"recurring": data.draw(recurring_entries(weekly_count, priorities)),
                      "dated": dated})
    models = {"llm": model}
    static = plan_static_schedule(calendar, models)
    plan = plan_dated_schedule(calendar, models, now=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
                               horizon_days=60, static=static)
    for error in plan.errors:
        assert error.event_id in plan.skipped_event_ids
        assert "accepted:" in error.message
    assert_pairs(plan)
    skipped = static.skipped_event_ids | plan.skipped_event_ids
    start, end = dt.datetime(2030, 1, 10), dt.datetime(2030, 1, 24)
    windows = windows_of(calendar, model, skipped, start.date() - dt.timedelta(days=10),
                         end.date() + dt.timedelta(days=3), range(0))
    actions = (*static.for_target("llm"), *plan.for_target("llm"))
    assert replay_mismatches(actions, windows, model, start, end) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=capacity_models(), data=st.data())
def test_seasonal_actions_replay_correctly_in_every_kind_of_year(
        model: CapacityModel, data: st.DataObject) -> None:
    weekly_count = data.draw(st.integers(0, 1))
    priorities = data.draw(st.lists(st.integers(0, 2), min_size=weekly_count + 2,
                                    max_size=weekly_count + 2))
    seasonal = []
    for i in range(2):
        lead = data.draw(st.integers(0, 300))
        seasonal.append({
            "id": f"season-{i}",
            "month": data.draw(st.sampled_from([1, 2, 3, 12])),
            "day": data.draw(st.sampled_from([1, 2, 27, 28])),
            "start": hhmm(data.draw(st.integers(0, 1439))),
            "lead_time_min": lead,
            "duration_min": data.draw(st.integers(1, 900)),
            "multiplier": data.draw(st.sampled_from([1.0, 2.5, 4.0])),
            "priority": priorities[weekly_count + i],
            "targets": ["llm"],
        })
    calendar = parse({"recurring": data.draw(recurring_entries(weekly_count, priorities)),
                      "seasonal": seasonal})
    plan = plan_static_schedule(calendar, {"llm": model})
    for error in plan.errors:
        assert error.event_id in plan.skipped_event_ids
    assert_pairs(plan)
    for year in REPRESENTATIVE_YEARS:
        for event in calendar.seasonal:
            if event.event_id in plan.skipped_event_ids:
                continue
            release = dt.datetime.combine(dt.date(year, event.month, event.day), event.start)
            start, end = release - dt.timedelta(days=2), release + dt.timedelta(days=2)
            windows = windows_of(calendar, model, plan.skipped_event_ids,
                                 start.date() - dt.timedelta(days=10),
                                 end.date() + dt.timedelta(days=3),
                                 range(year - 1, year + 2))
            assert replay_mismatches(plan.for_target("llm"), windows, model, start, end) == [], (
                year, event.event_id)
