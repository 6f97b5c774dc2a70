"""Schedule expressions: what the builders write and what the parser replays."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

import pytest

from release_calendar import Weekday, annual_cron, at_expression, parse_schedule, weekly_cron


def test_builders_always_write_the_minute() -> None:
    assert weekly_cron(dt.time(16, 0), [Weekday.MON]) == "cron(0 16 ? * MON *)"
    assert weekly_cron(dt.time(22, 30), [Weekday.SUN, Weekday.TUE]) == "cron(30 22 ? * TUE,SUN *)"
    assert weekly_cron(dt.time(1, 0), list(Weekday)) == "cron(0 1 * * ? *)"
    assert annual_cron(dt.time(9, 5), 4, 1) == "cron(5 9 1 4 ? *)"
    assert at_expression(dt.datetime(2026, 12, 6, 18)) == "at(2026-12-06T18:00:00)"


@pytest.mark.parametrize(
    ("call", "fragment"),
    [(lambda: weekly_cron(dt.time(1, 0, 30), [Weekday.MON]), "whole minutes"),
     (lambda: weekly_cron(dt.time(1), []), "no weekdays given"),
     (lambda: annual_cron(dt.time(1), 4, 31), "day is out of range for month"),
     (lambda: at_expression(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)), "pass a naive local time")],
)
def test_builders_refuse_what_aws_would_misread(call: Callable[[], str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        call()


def test_weekday_names_and_numbers_mean_the_same_days() -> None:
    start, end = dt.datetime(2026, 11, 23), dt.datetime(2026, 11, 30)  # Monday to Monday
    by_name = list(parse_schedule("cron(0 16 ? * MON,SUN *)").firings(start, end))
    by_number = list(parse_schedule("cron(0 16 ? * 2,1 *)").firings(start, end))
    assert by_name == by_number == [dt.datetime(2026, 11, 23, 16), dt.datetime(2026, 11, 29, 16)]


def test_daily_cron_fires_once_a_day_at_its_minute() -> None:
    times = list(parse_schedule("cron(0 1 * * ? *)").firings(
        dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 4)))
    assert times == [dt.datetime(2026, 1, d, 1, 0) for d in (1, 2, 3)]


def test_ranges_steps_and_years() -> None:
    schedule = parse_schedule("cron(0/20 8-9 1 JAN-MAR ? 2027)")
    times = list(schedule.firings(dt.datetime(2026, 1, 1), dt.datetime(2028, 1, 1)))
    assert len(times) == 3 * 2 * 3  # months × hours × minutes (0, 20, 40)
    assert times[0] == dt.datetime(2027, 1, 1, 8, 0)
    assert times[-1] == dt.datetime(2027, 3, 1, 9, 40)


def test_yearly_cron_and_last_firing_before() -> None:
    schedule = parse_schedule(annual_cron(dt.time(9), 4, 1))
    assert schedule.last_firing_before(dt.datetime(2027, 3, 1)) == dt.datetime(2026, 4, 1, 9)
    assert schedule.last_firing_before(dt.datetime(2027, 4, 1, 9)) == dt.datetime(2026, 4, 1, 9)
    assert schedule.last_firing_before(dt.datetime(2027, 4, 1, 9, 1)) == dt.datetime(2027, 4, 1, 9)


def test_one_time_schedule() -> None:
    schedule = parse_schedule("at(2026-12-06T18:00:00)")
    assert list(schedule.firings(dt.datetime(2026, 12, 6), dt.datetime(2026, 12, 7))) == [
        dt.datetime(2026, 12, 6, 18)]
    assert list(schedule.firings(dt.datetime(2026, 12, 6, 18, 1), dt.datetime(2026, 12, 7))) == []
    assert schedule.last_firing_before(dt.datetime(2026, 12, 6, 18)) is None


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [("cron(0 16 * * MON *)", "exactly one of day-of-month and day-of-week"),
     ("cron(0 16 ? * MON)", "needs 6 fields"),
     ("cron(0 16 L * ? *)", "L, W and # are not supported"),
     ("cron(0 16 ? * MON#2 *)", "L, W and # are not supported"),
     ("cron(61 16 * * ? *)", "accepted values are 0-59"),
     ("cron(0 16 ? * FUN *)", "'FUN' is not a number"),
     ("rate(5 minutes)", "rate() depends on when the action was created"),
     ("at(2026-02-30T10:00:00)", "not a real date"),
     ("every monday", "accepted: 'at(yyyy-mm-ddThh:mm:ss)'")],
)
def test_parser_errors_say_what_is_wrong(expression: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_schedule(expression)
