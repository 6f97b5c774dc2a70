"""Traffic traces: invocations per minute on one endpoint, one row per minute.

File format (CSV, UTF-8): ``#`` comment lines describing the trace, then a header
``minute_start,invocations_per_min`` and one row per consecutive minute, the time in ISO 8601
with its UTC offset (``2026-12-06T20:00:00+09:00``).

Traces are generated, deterministically, from the same two inputs the fleet is sized from: the
endpoint's expected day (``scaling.traffic`` in ``config/<env>.yaml``, linear between the hourly
values) and the release calendar (``config/release_calendar.yaml``): each release on the day
multiplies the load by its ``multiplier``, reached 15 minutes after its start ("3× in 15 minutes",
docs/design-decisions.md#release-calendar), held until an hour before its window ends, then back
over that hour. So a
trace can never disagree with the profile the floors were derived from, nor with the calendar
the pre-scales were sized from. ``python -m tools.scaling_sim.traces`` rewrites the shipped ones
from production's settings:

* ``one-piece`` — Sunday 2026-12-06 17:00-24:00 JST, the One Piece chapter 1,100 release (the
  calendar's dated event, ×3 at 20:00);
* ``weekday`` — Wednesday 2026-12-09, a whole day with the Shonen Magazine release (×1.8 at
  18:00).

:func:`week_trace` and :func:`day_trace` build the cost report's typical week and release day.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from capacity_model import DailyProfile
from release_calendar import (
    DatedRelease,
    EventKind,
    RecurringRelease,
    ReleaseCalendar,
    ReleaseEvent,
    SeasonalRelease,
)

TRACE_DIR = Path(__file__).resolve().parent / "traces"
HEADER = ("minute_start", "invocations_per_min")


@dataclass(frozen=True)
class Trace:
    """Offered load, one value per minute from ``start``."""

    name: str
    description: str
    start: dt.datetime
    invocations_per_min: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError(f"trace {self.name}: start must carry a UTC offset")
        if not self.invocations_per_min:
            raise ValueError(f"trace {self.name}: no minutes")
        bad = [i for i, v in enumerate(self.invocations_per_min) if not (math.isfinite(v)
                                                                         and v >= 0)]
        if bad:
            raise ValueError(f"trace {self.name}: minute {bad[0]} has "
                             f"{self.invocations_per_min[bad[0]]!r}; accepted: a number >= 0")

    @property
    def minutes(self) -> int:
        """Length of the trace in minutes."""
        return len(self.invocations_per_min)

    @property
    def end(self) -> dt.datetime:
        """The end of the last minute."""
        return self.start + dt.timedelta(minutes=self.minutes)

    @property
    def total_invocations(self) -> float:
        """Requests offered over the whole trace."""
        return sum(self.invocations_per_min)

    def to_csv(self) -> str:
        """The file form of the trace."""
        out = io.StringIO()
        for line in self.description.splitlines():
            out.write(f"# {line}\n".replace("# \n", "#\n"))
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(HEADER)
        for index, value in enumerate(self.invocations_per_min):
            moment = self.start + dt.timedelta(minutes=index)
            writer.writerow((moment.isoformat(), f"{value:.1f}"))
        return out.getvalue()


def load_trace(path: Path) -> Trace:
    """Read a trace file; ValueError names the file, the line and what is accepted."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror})") from None
    description: list[str] = []
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            description.append(line[2:] if line.startswith("# ") else line[1:])
        elif line.strip():
            rows.append((number, next(csv.reader([line]))))
    if not rows or tuple(rows[0][1]) != HEADER:
        raise ValueError(f"{path}: the first non-comment line must be {','.join(HEADER)}")
    start: dt.datetime | None = None
    values: list[float] = []
    for number, row in rows[1:]:
        if len(row) != 2:
            raise ValueError(f"{path}:{number}: expected 2 columns, got {len(row)}")
        try:
            moment = dt.datetime.fromisoformat(row[0])
            value = float(row[1])
        except ValueError:
            raise ValueError(f"{path}:{number}: {row!r}; accepted: an ISO time with offset and "
                             "a number") from None
        if moment.tzinfo is None:
            raise ValueError(f"{path}:{number}: {row[0]} has no UTC offset")
        if start is None:
            start = moment
        elif moment != start + dt.timedelta(minutes=len(values)):
            raise ValueError(f"{path}:{number}: {row[0]} is not the minute after the previous "
                             "row; accepted: one row per consecutive minute")
        values.append(value)
    if start is None:
        raise ValueError(f"{path}: no rows")
    try:
        return Trace(name=path.stem, description="\n".join(description), start=start,
                     invocations_per_min=tuple(values))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _piecewise(points: Sequence[tuple[float, float]], hour: float) -> float:
    """Linear interpolation through ``(hour, value)`` points."""
    for (h0, v0), (h1, v1) in itertools.pairwise(points):
        if h0 <= hour <= h1:
            return v0 + (v1 - v0) * (hour - h0) / (h1 - h0)
    raise ValueError(f"hour {hour} outside the curve")


def release_multiplier(hour: float, *, release: float, peak: float, rise_min: float,
                       hold_min: float, fall_min: float) -> float:
    """1 before ``release``, rising linearly to ``peak`` over ``rise_min``, holding, falling."""
    minutes = (hour - release) * 60
    if minutes < 0:
        return 1.0
    if minutes < rise_min:
        return 1 + (peak - 1) * minutes / rise_min
    if minutes < rise_min + hold_min:
        return peak
    if minutes < rise_min + hold_min + fall_min:
        return peak - (peak - 1) * (minutes - rise_min - hold_min) / fall_min
    return 1.0


RISE_MIN = 15
"""Minutes a release takes to reach its multiplier (3× in 15 minutes,
docs/design-decisions.md#release-calendar)."""
FALL_MIN = 60
"""Minutes a release takes to fade after its window's last hour."""
ONE_PIECE_EVENT = "one-piece-ch1100"
ONE_PIECE_DAY = dt.date(2026, 12, 6)
WEEKDAY_DAY = dt.date(2026, 12, 9)
TYPICAL_WEEK_MONDAY = dt.date(2026, 12, 14)
"""A week without a dated release or a seasonal date: the cost report's typical week."""


def releases_on(day: dt.date, calendar: ReleaseCalendar, *, target: str,
                kinds: Iterable[EventKind] = tuple(EventKind)) -> list[ReleaseEvent]:
    """The calendar's releases on ``day`` for ``target`` (of the given kinds)."""
    wanted = set(kinds)
    found: list[ReleaseEvent] = []
    for event in calendar.events:
        if event.kind not in wanted or target not in event.targets:
            continue
        on_day = (
            (isinstance(event, RecurringRelease) and day.weekday() in event.weekdays)
            or (isinstance(event, SeasonalRelease) and (day.month, day.day) == (event.month,
                                                                                  event.day))
            or (isinstance(event, DatedRelease) and event.date == day))
        if on_day:
            found.append(event)
    return found


def release_factor(event: ReleaseEvent, hour: float) -> float:
    """How much ``event`` multiplies the load at local ``hour`` of its day."""
    start = event.start.hour + event.start.minute / 60
    hold = max(0.0, event.duration_min - RISE_MIN - FALL_MIN)
    return release_multiplier(hour, release=start, peak=event.multiplier, rise_min=RISE_MIN,
                              hold_min=hold, fall_min=FALL_MIN)


def day_load(day: dt.date, profile: DailyProfile, calendar: ReleaseCalendar, *, target: str,
             kinds: Iterable[EventKind] = tuple(EventKind), first_hour: float = 0,
             last_hour: float = 24) -> list[float]:
    """Invocations per minute from ``first_hour`` to ``last_hour`` of ``day``: the profile times
    the strongest release in force (overlapping releases do not stack)."""
    events = releases_on(day, calendar, target=target, kinds=kinds)
    values = []
    for minute in range(round(first_hour * 60), round(last_hour * 60)):
        hour = minute / 60
        factor = max([1.0, *(release_factor(event, hour) for event in events)])
        values.append(round(profile.at(hour) * factor, 1))
    return values


def day_trace(day: dt.date, profile: DailyProfile, calendar: ReleaseCalendar, *, name: str,
              target: str, description: str,
              kinds: Iterable[EventKind] = tuple(EventKind), first_hour: float = 0,
              last_hour: float = 24) -> Trace:
    """One day (or part of it) of ``target``'s expected traffic with its releases."""
    zone = ZoneInfo(calendar.timezone)
    start = dt.datetime.combine(day, dt.time(0), tzinfo=zone) + dt.timedelta(hours=first_hour)
    return Trace(name=name, description=description, start=start,
                 invocations_per_min=tuple(day_load(day, profile, calendar, target=target,
                                                    kinds=kinds, first_hour=first_hour,
                                                    last_hour=last_hour)))


def week_trace(monday: dt.date, profile: DailyProfile, calendar: ReleaseCalendar, *,
               target: str) -> Trace:
    """Seven days from ``monday`` with the weekly (recurring) releases only: a typical week."""
    if monday.weekday() != 0:
        raise ValueError(f"week_trace: {monday} is not a Monday")
    values: list[float] = []
    for offset in range(7):
        values.extend(day_load(monday + dt.timedelta(days=offset), profile, calendar,
                               target=target, kinds=(EventKind.RECURRING,)))
    zone = ZoneInfo(calendar.timezone)
    return Trace(name=f"week-{target}",
                 description=f"A typical week on the {target} endpoint from {monday}: the daily "
                             "profile and the weekly releases of the calendar.",
                 start=dt.datetime.combine(monday, dt.time(0), tzinfo=zone),
                 invocations_per_min=tuple(values))


def one_piece_trace(profile: DailyProfile, calendar: ReleaseCalendar) -> Trace:
    """Seed 001 story 7: One Piece chapter 1,100 on the LLM endpoint, 17:00-24:00."""
    event = next((e for e in calendar.dated if e.event_id == ONE_PIECE_EVENT), None)
    if event is None:
        raise ValueError(f"the calendar has no dated event {ONE_PIECE_EVENT}")
    return day_trace(
        event.date, profile, calendar, name="one-piece", target="llm", first_hour=17,
        last_hour=24,
        description=(
            f"One Piece chapter 1,100 release, {event.date:%A %Y-%m-%d} 17:00-24:00 "
            f"{calendar.timezone} (docs/design-decisions.md#release-calendar).\n"
            "Invocations per minute on the LLM "
            f"endpoint: the daily profile (config/prod.yaml llm.scaling.traffic), x"
            f"{event.multiplier:g} within {RISE_MIN} min of the {event.start:%H:%M} release "
            f"(config/release_calendar.yaml).\nGenerated by tools/scaling_sim/traces.py."))


def weekday_trace(profile: DailyProfile, calendar: ReleaseCalendar) -> Trace:
    """A Wednesday: off-peak trough, business hours, the weekly releases of the day."""
    return day_trace(
        WEEKDAY_DAY, profile, calendar, name="weekday", target="llm",
        kinds=(EventKind.RECURRING,),
        description=(
            f"A {WEEKDAY_DAY:%A} on the LLM endpoint, {WEEKDAY_DAY} 00:00-24:00 "
            f"{calendar.timezone}.\nThe daily profile (config/prod.yaml llm.scaling.traffic) "
            "and the day's weekly releases (config/release_calendar.yaml).\nGenerated by "
            "tools/scaling_sim/traces.py."))


def shipped_inputs() -> tuple[DailyProfile, ReleaseCalendar]:
    """Production's LLM traffic profile and the release calendar the shipped traces use."""
    from release_calendar import parse_calendar
    from stacks.settings import REPO_ROOT, load_settings

    settings = load_settings("prod")
    text = (REPO_ROOT / settings.release_calendar.file).read_text(encoding="utf-8")
    calendar = parse_calendar(text, source=settings.release_calendar.file).calendar
    return settings.llm.scaling.traffic.profile(), calendar


def shipped_traces() -> dict[str, Trace]:
    """The traces ``tools/scaling_sim/traces/`` holds, generated from production's inputs."""
    profile, calendar = shipped_inputs()
    return {"one-piece": one_piece_trace(profile, calendar),
            "weekday": weekday_trace(profile, calendar)}


def main() -> None:
    """Rewrite the shipped trace files."""
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    for name, trace in shipped_traces().items():
        path = TRACE_DIR / f"{name}.csv"
        path.write_text(trace.to_csv(), encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
