"""Read a release-calendar document (YAML, or JSON) into :class:`ReleaseCalendar`.

Every entry is checked field by field and every problem is collected; an entry with an error is
left out of the result (and named in ``skipped_event_ids``) so the others can still be used.
Problems with the document as a whole — it does not parse, it is not a mapping, an unknown
top-level key, a bad version or time zone — raise :class:`CalendarError`: nothing in it can be
trusted then.

PyYAML is used when it is installed (synth, tests); without it (the Lambda runtime) the document
must be JSON, which is what :func:`calendar_json` produces for the stack to upload.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from release_calendar.model import (
    KNOWN_TARGETS,
    CalendarError,
    CalendarIssue,
    DatedRelease,
    EventKind,
    ParsedCalendar,
    RecurringRelease,
    ReleaseCalendar,
    ReleaseEvent,
    SeasonalRelease,
    Severity,
    Weekday,
)

CALENDAR_VERSION = 1
DEFAULT_LEAD_TIME_MIN = 120
MAX_LEAD_TIME_MIN = 1440
MAX_DURATION_MIN = 2880
MAX_MULTIPLIER = 100.0
EVENT_ID = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?$")
_TOP_LEVEL_KEYS = ("version", "timezone", "recurring", "seasonal", "dated")
_COMMON_KEYS = ("id", "description", "start", "duration_min", "lead_time_min", "multiplier",
                "targets", "priority", "min_capacity", "max_capacity")
_SECTION_KEYS: dict[EventKind, tuple[str, ...]] = {
    EventKind.RECURRING: ("weekdays", *_COMMON_KEYS),
    EventKind.SEASONAL: ("month", "day", *_COMMON_KEYS),
    EventKind.DATED: ("date", *_COMMON_KEYS),
}
_REQUIRED = ("id", "start", "duration_min", "multiplier", "targets")
_EVENT_TYPES: dict[EventKind, type[ReleaseEvent]] = {
    EventKind.RECURRING: RecurringRelease,
    EventKind.SEASONAL: SeasonalRelease,
    EventKind.DATED: DatedRelease,
}
_MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August",
                "September", "October", "November", "December")


def load_document(text: str, *, source: str) -> Any:
    """Parse YAML (JSON when PyYAML is absent); CalendarError if the text does not parse."""
    try:
        import yaml
    except ImportError:  # the Lambda runtime: JSON only
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise CalendarError([CalendarIssue(
                Severity.ERROR, "document",
                f"does not parse as JSON ({error.msg}, line {error.lineno} column "
                f"{error.colno}); this runtime has no PyYAML, so upload the calendar as JSON "
                "(release_calendar.calendar_json)")], source=source) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        position = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise CalendarError([CalendarIssue(
            Severity.ERROR, "document", f"does not parse as YAML{position}: {problem}")],
            source=source) from None


def calendar_json(text: str, *, source: str = "release calendar") -> str:
    """The calendar document re-serialized as JSON (dates as ``YYYY-MM-DD``), for a runtime
    without PyYAML. The document is fully validated first: CalendarError on any error."""
    parsed = parse_calendar(text, source=source)
    if parsed.errors:
        raise CalendarError(parsed.issues, source=source)
    document = load_document(text, source=source)
    return json.dumps(document, default=_json_default, ensure_ascii=False, sort_keys=True,
                      indent=1)


def _json_default(value: object) -> str:
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def parse_calendar(text: str, *, source: str = "release calendar") -> ParsedCalendar:
    """Read and validate a calendar document.

    Raises CalendarError when the document as a whole is unusable. Otherwise returns the valid
    entries plus every issue found; entries with errors are left out.
    """
    document = load_document(text, source=source)
    if not isinstance(document, Mapping):
        raise CalendarError([CalendarIssue(
            Severity.ERROR, "document",
            f"got {type(document).__name__}; accepted: a mapping with keys "
            f"{', '.join(_TOP_LEVEL_KEYS)}")], source=source)
    fatal = _top_level_issues(document)
    sections = _sections(document, fatal)
    if fatal:
        raise CalendarError(fatal, source=source)
    timezone = document["timezone"]
    assert isinstance(timezone, str)
    entries = _Entries()
    if _observes_dst(timezone):
        entries.issues.append(CalendarIssue(
            Severity.WARNING, "timezone",
            f"{timezone} changes its UTC offset during the year; actions at local times that "
            "are skipped or repeated on those nights fire as Application Auto Scaling decides"))
    for kind, raw_entries in sections.items():
        for index, entry in enumerate(raw_entries):
            entries.read(kind, index, entry)
    return entries.parsed(timezone)


def _top_level_issues(document: Mapping[Any, Any]) -> list[CalendarIssue]:
    """Unknown top-level keys, a version other than ours, an unusable time zone."""
    issues: list[CalendarIssue] = []
    unknown = sorted(str(k) for k in document if k not in _TOP_LEVEL_KEYS)
    if unknown:
        issues.append(CalendarIssue(Severity.ERROR, "document",
                                    f"unknown key(s) {unknown}; accepted: "
                                    f"{', '.join(_TOP_LEVEL_KEYS)}"))
    version = document.get("version")
    if version != CALENDAR_VERSION or isinstance(version, bool):
        issues.append(CalendarIssue(Severity.ERROR, "version",
                                    f"got {version!r}; accepted: {CALENDAR_VERSION}"))
    zone_problem = check_timezone(document.get("timezone"))
    if zone_problem:
        issues.append(CalendarIssue(Severity.ERROR, "timezone", zone_problem))
    return issues


def _sections(document: Mapping[Any, Any], fatal: list[CalendarIssue]
              ) -> dict[EventKind, list[Any]]:
    """The entries of each section (a missing section is empty); a section that is not a list
    is added to ``fatal``."""
    sections: dict[EventKind, list[Any]] = {}
    for kind in EventKind:
        raw = document.get(kind.value)
        if raw is None:
            sections[kind] = []
        elif isinstance(raw, list):
            sections[kind] = raw
        else:
            fatal.append(CalendarIssue(Severity.ERROR, kind.value,
                                       f"got {type(raw).__name__}; accepted: a list of entries"))
    return sections


@dataclass
class _Entries:
    """The entries read so far: the valid ones per section, every issue, and who was left out."""

    valid: dict[EventKind, list[ReleaseEvent]] = field(
        default_factory=lambda: {kind: [] for kind in EventKind})
    issues: list[CalendarIssue] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    unidentified: int = 0
    seen_ids: dict[str, str] = field(default_factory=dict)

    def read(self, kind: EventKind, index: int, entry: Any) -> None:
        """Read one entry; an id used before makes it an error (ids are calendar-wide)."""
        reader = _EntryReader(kind, index, entry)
        event = reader.read()
        event_id = reader.event_id
        if event_id is not None and event_id in self.seen_ids:
            reader.error("id", f"{event_id!r} is already used by {self.seen_ids[event_id]}; "
                               "accepted: an id unique across the whole calendar")
            event = None
        elif event_id is not None:
            self.seen_ids[event_id] = reader.label
        self.issues.extend(reader.issues)
        if event is not None:
            self.valid[kind].append(event)
        elif event_id is not None:
            self.skipped.add(event_id)
        else:
            self.unidentified += 1

    def parsed(self, timezone: str) -> ParsedCalendar:
        """The valid entries as a calendar, with the issues and the entries left out."""
        calendar = ReleaseCalendar(
            timezone=timezone,
            recurring=tuple(e for e in self.valid[EventKind.RECURRING]
                            if isinstance(e, RecurringRelease)),
            seasonal=tuple(e for e in self.valid[EventKind.SEASONAL]
                           if isinstance(e, SeasonalRelease)),
            dated=tuple(e for e in self.valid[EventKind.DATED] if isinstance(e, DatedRelease)),
        )
        return ParsedCalendar(calendar=calendar, issues=tuple(self.issues),
                              skipped_event_ids=frozenset(self.skipped),
                              unidentified_skips=self.unidentified)


def check_timezone(name: object) -> str | None:
    """None when ``name`` is a usable IANA zone, else what is wrong and what is accepted."""
    if not isinstance(name, str) or not name.strip():
        return f"got {name!r}; accepted: an IANA time zone name such as 'Asia/Tokyo'"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return (f"{name!r} is not an IANA time zone (or this runtime has no time zone "
                "database); accepted: a name such as 'Asia/Tokyo'")
    return None


def _observes_dst(name: str) -> bool:
    zone = ZoneInfo(name)
    offsets = {dt.datetime(2025, month, 15, 12, tzinfo=zone).utcoffset() for month in (1, 7)}
    return len(offsets) > 1


class _EntryReader:
    """Reads one calendar entry, recording an issue per bad field instead of stopping."""

    def __init__(self, kind: EventKind, index: int, entry: Any) -> None:
        self.kind = kind
        self.index = index
        self.entry = entry
        self.issues: list[CalendarIssue] = []
        self.event_id: str | None = None

    @property
    def label(self) -> str:
        suffix = f" ({self.event_id})" if self.event_id else ""
        return f"{self.kind.value}[{self.index}]{suffix}"

    def error(self, field: str, message: str) -> None:
        self.issues.append(CalendarIssue(Severity.ERROR, f"{self.label}.{field}", message,
                                         self.event_id, in_entry=True))

    def read(self) -> ReleaseEvent | None:
        """The entry as an event, or None when any of its fields is wrong (see ``issues``)."""
        if not isinstance(self.entry, Mapping):
            self.issues.append(CalendarIssue(
                Severity.ERROR, self.label,
                f"got {type(self.entry).__name__}; accepted: a mapping with keys "
                f"{', '.join(_SECTION_KEYS[self.kind])}", in_entry=True))
            return None
        self._check_keys(self.entry)
        values = self._common_values(self.entry)
        values.update(self._section_values(self.entry))
        if self.issues or self.event_id is None:
            return None
        return _EVENT_TYPES[self.kind](event_id=self.event_id, index=self.index, **values)

    def _check_keys(self, entry: Mapping[str, Any]) -> None:
        """Reads the id; an error per unknown key and per missing required key."""
        raw_id = entry.get("id")
        if isinstance(raw_id, str) and EVENT_ID.match(raw_id):
            self.event_id = raw_id
        elif "id" in entry:
            self.error("id", f"got {raw_id!r}; accepted: 1-48 lower-case letters, digits and "
                             "'-', starting and ending with a letter or digit")
        allowed = _SECTION_KEYS[self.kind]
        for key in entry:
            if key not in allowed:
                self.error(str(key), f"unknown key; accepted in {self.kind.value}: "
                                     f"{', '.join(allowed)}")
        for key in _REQUIRED:
            if key not in entry:
                self.error(key, "is required")

    def _common_values(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """The fields every section has, defaults filled in."""
        values: dict[str, Any] = {
            "description": self._optional(entry, "description", "", _read_description),
            "start": self._field(entry, "start", _read_time),
            "duration_min": self._field(entry, "duration_min", _int_reader(1, MAX_DURATION_MIN)),
            "lead_time_min": self._optional(entry, "lead_time_min", DEFAULT_LEAD_TIME_MIN,
                                            _int_reader(0, MAX_LEAD_TIME_MIN)),
            "multiplier": self._field(entry, "multiplier", _read_multiplier),
            "targets": self._field(entry, "targets", _read_targets),
            "priority": self._optional(entry, "priority", 0, _int_reader(-1000, 1000)),
            "min_capacity": self._optional(entry, "min_capacity", None, _int_reader(1, 10_000)),
            "max_capacity": self._optional(entry, "max_capacity", None, _int_reader(1, 10_000)),
        }
        if (values["min_capacity"] is not None and values["max_capacity"] is not None
                and values["min_capacity"] > values["max_capacity"]):
            self.error("min_capacity", f"{values['min_capacity']} is above max_capacity "
                                       f"{values['max_capacity']}; accepted: min <= max")
        return values

    def _section_values(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """When the event happens: weekdays, a month and day, or a date."""
        if self.kind is EventKind.RECURRING:
            return {"weekdays": self._field(entry, "weekdays", _read_weekdays, required=True)}
        if self.kind is EventKind.DATED:
            return {"date": self._field(entry, "date", _read_date, required=True)}
        month = self._field(entry, "month", _int_reader(1, 12), required=True)
        day = self._field(entry, "day", _int_reader(1, 31), required=True)
        if month is not None and day is not None:
            problem = _check_month_day(month, day)
            if problem:
                self.error("day", problem)
        return {"month": month, "day": day}

    def _field(self, entry: Mapping[str, Any], key: str, reader: Callable[[Any], Any],
               *, required: bool = False) -> Any:
        if key not in entry:
            if required:
                self.error(key, "is required")
            return None
        try:
            return reader(entry[key])
        except ValueError as problem:
            self.error(key, str(problem))
            return None

    def _optional(self, entry: Mapping[str, Any], key: str, default: Any,
                  reader: Callable[[Any], Any]) -> Any:
        if key not in entry or entry[key] is None:
            return default
        return self._field(entry, key, reader)


def _read_description(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 500:
        raise ValueError(f"got {value!r}; accepted: text of at most 500 characters")
    return value


def _read_time(value: Any) -> dt.time:
    if isinstance(value, int) and not isinstance(value, bool):
        hours, minutes = divmod(value, 60)
        raise ValueError(
            f"got the number {value}: unquoted, YAML reads {hours}:{minutes:02d} as a base-60 "
            f"number; accepted: a quoted 24-hour local time such as '{hours:02d}:{minutes:02d}'")
    if not isinstance(value, str) or not re.fullmatch(r"\d{2}:\d{2}", value):
        raise ValueError(f"got {value!r}; accepted: a 24-hour local time 'HH:MM' (00:00-23:59)")
    hours, minutes = int(value[:2]), int(value[3:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"got {value!r}, which is not a time of day; accepted: 'HH:MM' from "
                         "00:00 to 23:59")
    return dt.time(hours, minutes)


def _int_reader(low: int, high: int) -> Callable[[Any], int]:
    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"got {value!r}; accepted: an integer from {low} to {high}")
        return value
    return read


def _read_multiplier(value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= MAX_MULTIPLIER):
        raise ValueError(f"got {value!r}; accepted: a number above 0 and at most "
                         f"{MAX_MULTIPLIER:g} (expected traffic ÷ base traffic, e.g. 2.0)")
    return float(value)


def _read_targets(value: Any) -> tuple[str, ...]:
    accepted = f"accepted: a non-empty list of distinct names from {list(KNOWN_TARGETS)}"
    if not isinstance(value, list) or not value:
        raise ValueError(f"got {value!r}; {accepted}")
    bad = [item for item in value if item not in KNOWN_TARGETS]
    if bad or len(set(value)) != len(value):
        raise ValueError(f"got {value!r}; {accepted}")
    return tuple(value)


def _read_weekdays(value: Any) -> tuple[Weekday, ...]:
    accepted = "accepted: a non-empty list of distinct days from MON TUE WED THU FRI SAT SUN"
    if not isinstance(value, list) or not value:
        raise ValueError(f"got {value!r}; {accepted}")
    days: list[Weekday] = []
    for item in value:
        name = item.upper() if isinstance(item, str) else ""
        if name not in Weekday.__members__:
            raise ValueError(f"got {item!r} in {value!r}; {accepted}")
        days.append(Weekday[name])
    if len(set(days)) != len(days):
        raise ValueError(f"got {value!r} with a day listed twice; {accepted}")
    return tuple(sorted(days))


def _read_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        raise ValueError(f"got the date-time {value.isoformat()}; accepted: a date 'YYYY-MM-DD' "
                         "(the time goes in start)")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"got {value!r}; accepted: a calendar date 'YYYY-MM-DD'")


def _check_month_day(month: int, day: int) -> str | None:
    if month == 2 and day == 29:
        return ("February 29 only exists in leap years, so a yearly pre-scale could fire "
                "without its restore; accepted: another day, or a dated event for that year")
    try:
        dt.date(2001, month, day)
    except ValueError:
        return f"{_MONTH_NAMES[month - 1]} has no day {day}; accepted: a day that month has"
    return None
