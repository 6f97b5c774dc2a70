"""Expansion of the calendar into scheduled actions, and the rules that keep them meaningful."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest

from release_calendar import (
    CalendarError,
    CapacityModel,
    CapacityRange,
    ScheduledCapacity,
    Severity,
    build_static_schedule,
    parse_calendar,
    plan_dated_schedule,
    plan_static_schedule,
)
from release_calendar.expand import REPRESENTATIVE_YEARS
from release_calendar.timeline import (
    dated_window,
    recurring_windows,
    replay_mismatches,
    seasonal_windows,
)
from tests.release_calendar.seed_models import seed_llm_model

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "release_calendar.yaml"
JST = dt.timezone(dt.timedelta(hours=9))


def by_name(actions: tuple[ScheduledCapacity, ...]) -> dict[str, tuple[str, str, int, int]]:
    return {a.name: (a.schedule, a.timezone, a.min_capacity, a.max_capacity) for a in actions}


def test_shipped_calendar_expands_to_these_actions(models: dict[str, CapacityModel]) -> None:
    plan = build_static_schedule(SHIPPED.read_text(encoding="utf-8"), models)
    assert plan.issues == ()
    tokyo = "Asia/Tokyo"
    assert by_name(plan.for_target("llm")) == {
        "floor-off-peak": ("cron(0 1 * * ? *)", tokyo, 2, 6),
        "floor-business-hours": ("cron(0 8 * * ? *)", tokyo, 4, 20),
        "calendar-weekly-shonen-jump-prescale": ("cron(0 16 ? * MON *)", tokyo, 8, 20),
        "calendar-weekly-shonen-jump-restore": ("cron(0 21 ? * MON *)", tokyo, 4, 20),
        "calendar-weekly-shonen-magazine-prescale": ("cron(0 16 ? * WED *)", tokyo, 8, 20),
        "calendar-weekly-shonen-magazine-restore": ("cron(0 21 ? * WED *)", tokyo, 4, 20),
        "calendar-weekly-friday-release-window-prescale": ("cron(0 16 ? * FRI *)", tokyo, 8, 20),
        "calendar-weekly-friday-release-window-restore": ("cron(0 22 ? * FRI *)", tokyo, 4, 20),
        "calendar-annual-spring-anime-season-prescale": ("cron(0 9 1 4 ? *)", tokyo, 10, 20),
        "calendar-annual-spring-anime-season-restore": ("cron(30 15 1 4 ? *)", tokyo, 4, 20),
        "calendar-annual-fall-anime-season-prescale": ("cron(0 9 1 10 ? *)", tokyo, 10, 20),
        "calendar-annual-fall-anime-season-restore": ("cron(30 15 1 10 ? *)", tokyo, 4, 20),
    }


def test_shipped_calendar_replays_correctly_in_every_kind_of_year(
        models: dict[str, CapacityModel]) -> None:
    parsed = parse_calendar(SHIPPED.read_text(encoding="utf-8"))
    model = models["llm"]
    actions = plan_static_schedule(parsed.calendar, models).for_target("llm")
    for year in REPRESENTATIVE_YEARS:
        start, end = dt.datetime(year, 3, 25), dt.datetime(year, 4, 8)
        windows = [w for e in parsed.calendar.recurring for w in recurring_windows(
            e, "llm", CapacityRange(8, 20), start.date() - dt.timedelta(days=10), end.date())]
        windows += seasonal_windows(parsed.calendar.seasonal[0], "llm", CapacityRange(10, 20),
                                    [year])
        assert replay_mismatches(actions, windows, model, start, end) == [], year


def test_midnight_release_pre_scales_the_day_before_and_restores_to_off_peak(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    # Jump+ style: Monday 00:30, 2 h lead -> Sunday 22:30; 3 h window ends Monday 03:30, after
    # the 01:00 off-peak floor, which must not fire inside the window on Mondays.
    text = calendar_yaml(recurring=[{"id": "jump-plus", "weekdays": ["MON", "THU"],
                                     "start": "00:30", "duration_min": 180}])
    plan = build_static_schedule(text, models)
    assert by_name(plan.for_target("llm")) == {
        "floor-off-peak": ("cron(0 1 ? * TUE,WED,FRI,SAT,SUN *)", "Asia/Tokyo", 2, 6),
        "floor-business-hours": ("cron(0 8 * * ? *)", "Asia/Tokyo", 4, 20),
        "calendar-weekly-jump-plus-prescale": ("cron(30 22 ? * WED,SUN *)", "Asia/Tokyo", 8, 20),
        "calendar-weekly-jump-plus-restore": ("cron(30 3 ? * MON,THU *)", "Asia/Tokyo", 2, 6),
    }


def test_window_crossing_eight_restores_to_business_hours(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[{"id": "morning", "weekdays": ["SAT"], "start": "07:00",
                                     "lead_time_min": 60, "duration_min": 120}])
    actions = by_name(build_static_schedule(text, models).for_target("llm"))
    assert actions["calendar-weekly-morning-prescale"] == ("cron(0 6 ? * SAT *)", "Asia/Tokyo",
                                                           8, 20)
    assert actions["calendar-weekly-morning-restore"] == ("cron(0 9 ? * SAT *)", "Asia/Tokyo",
                                                          4, 20)
    assert actions["floor-business-hours"][0] == "cron(0 8 ? * MON,TUE,WED,THU,FRI,SUN *)"


def test_explicit_capacities_override_the_formula(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[{"id": "x", "weekdays": ["TUE"], "start": "18:00",
                                     "min_capacity": 6, "max_capacity": 9}])
    actions = by_name(build_static_schedule(text, models).for_target("llm"))
    assert actions["calendar-weekly-x-prescale"][2:] == (6, 9)


def test_overlap_without_a_winner_names_both_events(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[
        {"id": "jump", "weekdays": ["MON"], "start": "18:00", "duration_min": 180},
        {"id": "late-show", "weekdays": ["MON"], "start": "20:00"}])
    with pytest.raises(CalendarError) as caught:
        build_static_schedule(text, models)
    message = str(caught.value)
    assert "recurring[1] (late-show).priority: its window Mon 18:00 - Mon 22:00 overlaps " \
           "recurring[0] (jump)'s window Mon 16:00 - Mon 21:00 on target llm, both priority 0" \
           in message
    assert "different priorities (the higher one is in force" in message


def test_overlap_with_a_winner_is_resolved_by_priority(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[
        {"id": "jump", "weekdays": ["MON"], "start": "18:00", "duration_min": 180},
        {"id": "finale", "weekdays": ["MON"], "start": "20:00", "multiplier": 4.0,
         "priority": 5}])
    plan = build_static_schedule(text, models)
    actions = by_name(plan.for_target("llm"))
    # Jump's restore at 21:00 falls inside the finale's window: it keeps the finale's range.
    assert actions["calendar-weekly-jump-restore"][2:] == (16, 20)
    assert actions["calendar-weekly-finale-prescale"][2:] == (16, 20)
    assert actions["calendar-weekly-finale-restore"][2:] == (4, 20)


def test_own_occurrences_overlapping_is_an_error(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[{"id": "marathon", "weekdays": ["MON", "TUE"],
                                     "start": "18:00", "duration_min": 1800}])
    with pytest.raises(CalendarError, match=r"marathon\)\.duration_min: its own windows overlap"):
        build_static_schedule(text, models)


def test_seasonal_window_over_a_weekly_window_is_an_error(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(
        recurring=[{"id": "jump", "weekdays": ["MON"], "start": "18:00", "duration_min": 180}],
        seasonal=[{"id": "anime", "month": 4, "day": 1, "start": "17:00", "priority": 3,
                   "multiplier": 3.0}])
    with pytest.raises(CalendarError) as caught:
        build_static_schedule(text, models)
    [error] = caught.value.issues
    assert error.event_id == "anime"
    assert "in years when Apr 01 is a Monday" in error.message
    assert "calendar-weekly-jump-prescale" in error.message


def test_seasonal_window_containing_a_floor_is_an_error(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(seasonal=[{"id": "anime", "month": 4, "day": 1, "start": "09:00"}])
    with pytest.raises(CalendarError) as caught:
        build_static_schedule(text, models)
    assert "seasonal[0] (anime).start: the daily floor action floor-business-hours " \
           "(cron(0 8 * * ? *), from settings) fires at 08:00" in str(caught.value)


def test_seasonal_window_crossing_february_into_march_is_an_error(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(seasonal=[{"id": "leap", "month": 2, "day": 28, "start": "22:00",
                                    "lead_time_min": 0, "duration_min": 240}])
    with pytest.raises(CalendarError, match=r"falls on other dates in leap years"):
        build_static_schedule(text, models)


def test_target_time_zone_must_match(calendar_yaml: Callable[..., str]) -> None:
    models = {"llm": seed_llm_model(timezone="Asia/Seoul")}
    with pytest.raises(CalendarError, match="time zone Asia/Tokyo differs from target llm's"):
        build_static_schedule(calendar_yaml(), models)


def test_capacity_warnings(calendar_yaml: Callable[..., str],
                           models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[
        {"id": "huge", "weekdays": ["TUE"], "start": "18:00", "multiplier": 10},
        {"id": "tiny", "weekdays": ["THU"], "start": "18:00", "multiplier": 0.5}])
    plan = build_static_schedule(text, models)
    warnings = [str(w) for w in plan.issues]
    assert all(w.startswith("warning") for w in warnings)
    assert any("huge).multiplier: ×10 needs 39 instances on target llm" in w and
               "its max is 20; capped there" in w for w in warnings)
    assert any("tiny).multiplier: scheduled minimum 2 on target llm is below the business-hours "
               "floor (4)" in w for w in warnings)


def test_capacity_errors_name_event_field_and_limits(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(recurring=[
        {"id": "a", "weekdays": ["TUE"], "start": "18:00", "min_capacity": 40},
        {"id": "b", "weekdays": ["THU"], "start": "18:00", "max_capacity": 5}])
    with pytest.raises(CalendarError) as caught:
        build_static_schedule(text, models)
    text_out = str(caught.value)
    assert "recurring[0] (a).min_capacity: 40 is outside target llm's limits; accepted: 2-20" \
        in text_out
    assert "recurring[1] (b).max_capacity: 5 is below the computed minimum 8 on target llm" \
        in text_out


def test_action_limit_counts_floors_too(calendar_yaml: Callable[..., str],
                                        models: dict[str, CapacityModel]) -> None:
    # 99 non-overlapping weekly events = 198 actions, + 2 floors = 200: allowed. One more: not.
    def events(count: int) -> list[dict[str, object]]:
        return [{"id": f"e{i}", "weekdays": [["MON", "TUE", "WED", "THU", "FRI", "SAT",
                                              "SUN"][i % 7]],
                 "start": f"{9 + (i // 7):02d}:00", "lead_time_min": 0, "duration_min": 30}
                for i in range(count)]

    assert len(build_static_schedule(calendar_yaml(recurring=events(99)), models)
               .for_target("llm")) == 200
    with pytest.raises(CalendarError, match=r"target llm would have 202 fixed scheduled actions "
                                            r"\(2 floors, 200 weekly, 0 yearly\)"):
        build_static_schedule(calendar_yaml(recurring=events(100)), models)


# --- dated events -----------------------------------------------------------------------------


def dated_plan(text: str, models: dict[str, CapacityModel], now: dt.datetime,
               horizon_days: int = 14) -> tuple[dict[str, tuple[str, int, int]], list[str]]:
    parsed = parse_calendar(text)
    plan = plan_dated_schedule(parsed.calendar, models, now=now, horizon_days=horizon_days)
    return ({a.name: (a.schedule, a.min_capacity, a.max_capacity) for a in plan.for_target("llm")},
            [str(i) for i in plan.issues])


def test_dated_event_becomes_an_at_pair_inside_the_horizon(
        models: dict[str, CapacityModel]) -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    inside, issues = dated_plan(text, models, dt.datetime(2026, 11, 30, 3, tzinfo=JST))
    assert issues == []
    assert inside == {
        "calendar-dated-one-piece-ch1100-prescale": ("at(2026-12-06T18:00:00)", 12, 20),
        "calendar-dated-one-piece-ch1100-restore": ("at(2026-12-06T22:00:00)", 4, 20),
    }
    outside, _ = dated_plan(text, models, dt.datetime(2026, 11, 1, 3, tzinfo=JST))
    assert outside == {}
    # Mid-window: the pre-scale has fired, the restore is still needed.
    during, _ = dated_plan(text, models, dt.datetime(2026, 12, 6, 19, tzinfo=JST))
    assert list(during) == ["calendar-dated-one-piece-ch1100-restore"]
    after, _ = dated_plan(text, models, dt.datetime(2026, 12, 6, 23, tzinfo=JST))
    assert after == {}


def test_now_is_converted_to_the_calendar_zone(models: dict[str, CapacityModel]) -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    # 09:30 UTC is 18:30 JST: the 18:00 JST pre-scale has already fired.
    during, _ = dated_plan(text, models, dt.datetime(2026, 12, 6, 9, 30, tzinfo=dt.UTC))
    assert list(during) == ["calendar-dated-one-piece-ch1100-restore"]


def test_dated_event_nested_in_a_weekly_window(calendar_yaml: Callable[..., str],
                                               models: dict[str, CapacityModel]) -> None:
    # 2026-12-07 is a Monday: the chapter's window (18:00-21:00) lies inside Jump's (16:00-23:00).
    recurring = [{"id": "jump", "weekdays": ["MON"], "start": "18:00", "duration_min": 420}]
    chapter = {"id": "chapter", "date": "2026-12-07", "start": "20:00", "duration_min": 60,
               "multiplier": 3.0}
    now = dt.datetime(2026, 12, 1, tzinfo=JST)
    same_priority, issues = dated_plan(calendar_yaml(recurring=recurring, dated=[chapter]),
                                       models, now)
    assert same_priority == {}
    assert any("dated[0] (chapter).priority: its window overlaps recurring[0] (jump)'s window "
               "(2026-12-07 16:00 - 2026-12-08 01:00) on target llm, both priority 0" in i
               for i in issues)
    winner, issues = dated_plan(calendar_yaml(recurring=recurring,
                                              dated=[{**chapter, "priority": 1}]), models, now)
    assert issues == []
    assert winner == {"calendar-dated-chapter-prescale": ("at(2026-12-07T18:00:00)", 12, 20),
                      "calendar-dated-chapter-restore": ("at(2026-12-07T21:00:00)", 8, 20)}


def test_dated_window_with_a_fixed_action_inside_is_skipped_and_others_kept(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[
        {"id": "midnight", "date": "2026-12-08", "start": "00:00", "duration_min": 120},
        {"id": "evening", "date": "2026-12-08", "start": "20:00"}])
    actions, issues = dated_plan(text, models, dt.datetime(2026, 12, 1, tzinfo=JST))
    assert sorted(actions) == ["calendar-dated-evening-prescale",
                               "calendar-dated-evening-restore"]
    [error] = [i for i in issues if i.startswith("error")]
    assert "dated[0] (midnight).start: the daily floor action floor-off-peak (cron(0 1 * * ? *), " \
           "from settings) fires at 01:00 on Tue 2026-12-08 and sets min 2 max 6, but this " \
           "window (min 8 max 20) should be in force" in error


def test_dated_windows_resolve_among_themselves(calendar_yaml: Callable[..., str],
                                                models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[
        {"id": "launch", "date": "2026-12-08", "start": "18:00", "duration_min": 240},
        {"id": "stream", "date": "2026-12-08", "start": "20:00", "duration_min": 60,
         "multiplier": 4.0, "priority": 2}])
    actions, issues = dated_plan(text, models, dt.datetime(2026, 12, 1, tzinfo=JST))
    assert issues == []
    assert actions == {
        "calendar-dated-launch-prescale": ("at(2026-12-08T16:00:00)", 8, 20),
        "calendar-dated-launch-restore": ("at(2026-12-08T22:00:00)", 4, 20),
        "calendar-dated-stream-prescale": ("at(2026-12-08T18:00:00)", 16, 20),
        "calendar-dated-stream-restore": ("at(2026-12-08T21:00:00)", 8, 20),
    }


def test_window_overlapping_one_in_the_horizon_is_planned_with_it(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[
        {"id": "first", "date": "2026-12-08", "start": "20:00", "duration_min": 300},
        {"id": "second", "date": "2026-12-09", "start": "00:30", "lead_time_min": 60,
         "duration_min": 30, "priority": 1, "multiplier": 3}])
    # Horizon ends 2026-12-08 19:00 JST: 'first' reaches into it, 'second' overlaps 'first'.
    actions, issues = dated_plan(text, models, dt.datetime(2026, 12, 7, 19, tzinfo=JST),
                                 horizon_days=1)
    assert issues == []
    assert actions["calendar-dated-first-restore"] == ("at(2026-12-09T01:00:00)", 2, 6)
    assert actions["calendar-dated-second-prescale"] == ("at(2026-12-08T23:30:00)", 12, 20)
    assert actions["calendar-dated-second-restore"] == ("at(2026-12-09T01:00:00)", 2, 6)


def test_dated_actions_over_the_limit_drop_the_latest(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    dated = [{"id": f"d{i}", "date": (dt.date(2027, 1, 1) + dt.timedelta(days=i // 4)).isoformat(),
              "start": f"{10 + 3 * (i % 4):02d}:00", "lead_time_min": 0, "duration_min": 60}
             for i in range(100)]
    parsed = parse_calendar(calendar_yaml(dated=dated))
    plan = plan_dated_schedule(parsed.calendar, models,
                               now=dt.datetime(2026, 12, 31, tzinfo=JST), horizon_days=60)
    assert len(plan.for_target("llm")) == 198  # + 2 floors = 200
    assert plan.skipped_event_ids == {"d99"}
    assert "over Application Auto Scaling's limit of 200" in str(plan.errors[0])
    # At synth every dated event is checked at once: only a warning there.
    synth = build_static_schedule(calendar_yaml(dated=dated), models)
    assert [w.severity for w in synth.issues] == [Severity.WARNING]


def test_synth_checks_dated_events_too(calendar_yaml: Callable[..., str],
                                       models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[{"id": "overnight", "date": "2026-12-08", "start": "23:00",
                                 "duration_min": 180}])
    with pytest.raises(CalendarError, match=r"dated\[0\] \(overnight\)\.start"):
        build_static_schedule(text, models)


def test_window_helpers_compute_lead_and_duration() -> None:
    parsed = parse_calendar(SHIPPED.read_text(encoding="utf-8"))
    window = dated_window(parsed.calendar.dated[0], "llm", CapacityRange(12, 20))
    assert (window.start, window.end) == (dt.datetime(2026, 12, 6, 18), dt.datetime(2026, 12, 6, 22))
    assert window.covers(window.start)
    assert not window.covers(window.end)
