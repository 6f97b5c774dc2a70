"""Application Auto Scaling schedule expressions: written here, and read back to replay them.

Application Auto Scaling takes ``at(yyyy-mm-ddThh:mm:ss)``, ``rate(n unit)`` and six-field
``cron(minutes hours day-of-month month day-of-week year)`` expressions, evaluated in the action's
``Timezone``. Exactly one of day-of-month and day-of-week is ``?``; day-of-week numbers run 1-7 from
Sunday. The builders always write the minute (``cron(0 18 ...)``): a cron without it would fire
every minute of the hour.

:func:`parse_schedule` reads the subset this platform writes and CDK emits (numbers, names, ``*``,
``?``, ranges, lists, steps) and lists when an expression fires, so tests and the scaling simulator
can replay exactly the strings that go to AWS. ``L``, ``W``, ``#`` and ``rate()`` are refused with
a message saying so.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from release_calendar.model import Weekday

_CRON = re.compile(r"^cron\((.*)\)$")
_AT = re.compile(r"^at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)$")
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))}
_CRON_DAYS = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
"""Application Auto Scaling numbers days of the week 1-7 from Sunday."""


def weekly_cron(time_of_day: dt.time, weekdays: Iterable[Weekday]) -> str:
    """A cron firing at ``time_of_day`` on ``weekdays`` (every day when all seven are given)."""
    days = sorted(set(weekdays))
    if not days:
        raise ValueError("weekly_cron: no weekdays given")
    _require_whole_minute(time_of_day)
    if len(days) == 7:
        return f"cron({time_of_day.minute} {time_of_day.hour} * * ? *)"
    names = ",".join(day.cron_name for day in days)
    return f"cron({time_of_day.minute} {time_of_day.hour} ? * {names} *)"


def annual_cron(time_of_day: dt.time, month: int, day: int) -> str:
    """A cron firing every year on ``month``/``day`` at ``time_of_day``."""
    _require_whole_minute(time_of_day)
    dt.date(2004, month, day)  # ValueError for a day the month never has
    return f"cron({time_of_day.minute} {time_of_day.hour} {day} {month} ? *)"


def at_expression(moment: dt.datetime) -> str:
    """A one-time schedule at a local (naive) date and time, whole minutes."""
    if moment.tzinfo is not None:
        raise ValueError("at_expression: pass a naive local time; the zone goes in Timezone")
    _require_whole_minute(moment.time())
    return f"at({moment:%Y-%m-%dT%H:%M:%S})"


def _require_whole_minute(time_of_day: dt.time) -> None:
    if time_of_day.second or time_of_day.microsecond:
        raise ValueError(f"schedule times are whole minutes, got {time_of_day}")


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule expression. Fire times are local wall-clock times (naive datetimes)."""

    expression: str
    one_time: dt.datetime | None = None
    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days_of_month: frozenset[int] | None = None  # None: '?' or '*'
    months: frozenset[int] = frozenset()
    weekdays: frozenset[int] | None = None  # date.weekday() numbering; None: '?' or '*'
    years: frozenset[int] | None = None  # None: '*'

    def fires_on(self, day: dt.date) -> bool:
        """Whether the schedule fires at some time on ``day``."""
        if self.one_time is not None:
            return self.one_time.date() == day
        if self.years is not None and day.year not in self.years:
            return False
        if day.month not in self.months:
            return False
        if self.days_of_month is not None and day.day not in self.days_of_month:
            return False
        return self.weekdays is None or day.weekday() in self.weekdays

    def firings(self, start: dt.datetime, end: dt.datetime) -> Iterator[dt.datetime]:
        """Fire times ``t`` with ``start <= t < end`` (naive local times), in order."""
        if self.one_time is not None:
            if start <= self.one_time < end:
                yield self.one_time
            return
        times = sorted(dt.time(h, m) for h in self.hours for m in self.minutes)
        day = start.date()
        while day <= end.date():
            if self.fires_on(day):
                for time_of_day in times:
                    moment = dt.datetime.combine(day, time_of_day)
                    if start <= moment < end:
                        yield moment
            day += dt.timedelta(days=1)

    def last_firing_before(self, moment: dt.datetime, *, lookback_days: int = 400
                           ) -> dt.datetime | None:
        """The latest fire time strictly before ``moment`` within ``lookback_days``, or None."""
        if self.one_time is not None:
            return self.one_time if self.one_time < moment else None
        times = sorted((dt.time(h, m) for h in self.hours for m in self.minutes), reverse=True)
        day = moment.date()
        for _ in range(lookback_days + 1):
            if self.fires_on(day):
                for time_of_day in times:
                    candidate = dt.datetime.combine(day, time_of_day)
                    if candidate < moment:
                        return candidate
            day -= dt.timedelta(days=1)
        return None


def parse_schedule(expression: str) -> Schedule:
    """Parse an ``at()`` or six-field ``cron()`` expression; ValueError says what is wrong."""
    text = expression.strip()
    at_match = _AT.match(text)
    if at_match:
        try:
            return Schedule(expression, one_time=dt.datetime.fromisoformat(at_match.group(1)))
        except ValueError:
            raise ValueError(f"schedule {expression!r}: not a real date and time") from None
    if text.startswith("rate("):
        raise ValueError(f"schedule {expression!r}: rate() depends on when the action was "
                         "created and cannot be replayed; accepted: at() or cron()")
    cron_match = _CRON.match(text)
    if not cron_match:
        raise ValueError(f"schedule {expression!r}: accepted: 'at(yyyy-mm-ddThh:mm:ss)' or "
                         "'cron(minutes hours day-of-month month day-of-week year)'")
    fields = cron_match.group(1).split()
    if len(fields) != 6:
        raise ValueError(f"schedule {expression!r}: cron needs 6 fields (minutes hours "
                         f"day-of-month month day-of-week year), got {len(fields)}")
    minute, hour, dom, month, dow, year = fields
    if (dom == "?") == (dow == "?"):
        raise ValueError(f"schedule {expression!r}: exactly one of day-of-month and day-of-week "
                         "must be '?'")
    weekdays: frozenset[int] | None = None
    if dow not in ("?", "*"):
        cron_days = _parse_field(dow, 1, 7, _CRON_DAYS, "day-of-week", expression)
        weekdays = frozenset((d - 2) % 7 for d in cron_days)  # 1=SUN -> 6, 2=MON -> 0
    return Schedule(
        expression,
        minutes=_parse_field(minute, 0, 59, {}, "minutes", expression),
        hours=_parse_field(hour, 0, 23, {}, "hours", expression),
        days_of_month=None if dom in ("?", "*") else _parse_field(dom, 1, 31, {}, "day-of-month",
                                                                   expression),
        months=_parse_field(month, 1, 12, _MONTHS, "month", expression),
        weekdays=weekdays,
        years=None if year == "*" else _parse_field(year, 1970, 2199, {}, "year", expression),
    )


def _parse_field(text: str, low: int, high: int, names: dict[str, int], field_name: str,
                 expression: str) -> frozenset[int]:
    def fail(detail: str) -> ValueError:
        return ValueError(f"schedule {expression!r}: {field_name} field {text!r}: {detail}")

    without_names = text.upper()
    for name in names:
        without_names = without_names.replace(name, "")
    if any(mark in without_names for mark in ("L", "W", "#")):
        raise fail("L, W and # are not supported here; accepted: numbers, names, *, ranges, "
                   "lists and steps")
    values: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            if not step_text.isdigit() or int(step_text) < 1:
                raise fail(f"step {step_text!r} is not a positive integer")
            step = int(step_text)
        if part in ("*", "?"):
            first, last = low, high
        elif "-" in part:
            first_text, last_text = part.split("-", 1)
            first, last = _value(first_text, names, fail), _value(last_text, names, fail)
        else:
            first = _value(part, names, fail)
            last = high if step > 1 else first
        if not (low <= first <= high and low <= last <= high) or first > last:
            raise fail(f"accepted values are {low}-{high}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


def _value(text: str, names: dict[str, int], fail: Callable[[str], ValueError]) -> int:
    upper = text.upper()
    if upper in names:
        return names[upper]
    if text.isdigit():
        return int(text)
    raise fail(f"{text!r} is not a number" + (f" or one of {sorted(names)}" if names else ""))
