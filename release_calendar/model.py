"""The release calendar as data: recurring, seasonal and dated release events, and the issues
found while reading or checking them.

Plain frozen dataclasses (no pydantic): this module also runs inside the release-calendar Lambda,
whose Python runtime has boto3 but no pydantic and no PyYAML, and whose asset has no bundling step.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

KNOWN_TARGETS: tuple[str, ...] = ("llm", "intent")
"""Scalable targets an event may apply to: the LLM endpoint and the intent-classifier endpoint."""


class Weekday(IntEnum):
    """Day of the week, numbered like :meth:`datetime.date.weekday` (Monday = 0)."""

    MON = 0
    TUE = 1
    WED = 2
    THU = 3
    FRI = 4
    SAT = 5
    SUN = 6

    @property
    def cron_name(self) -> str:
        """The name Application Auto Scaling's cron day-of-week field accepts (``MON``)."""
        return self.name


class EventKind(StrEnum):
    """How an event recurs. The value is the calendar section it is written in."""

    RECURRING = "recurring"
    SEASONAL = "seasonal"
    DATED = "dated"


class Severity(StrEnum):
    """An error stops synth (and makes the Lambda skip the entry); a warning is only reported."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class CalendarIssue:
    """One problem found in the calendar, worded for the person who edits it.

    ``where`` locates it (``dated[0] (one-piece-ch1100).start``); ``message`` says what the value
    was and what is accepted; ``event_id`` is the event it belongs to, when one is known;
    ``in_entry`` marks an issue about an entry whose id could not be read.
    """

    severity: Severity
    where: str
    message: str
    event_id: str | None = None
    in_entry: bool = False

    @property
    def about_entry(self) -> bool:
        """True when the issue concerns one entry (even one whose id is unreadable), False when
        it concerns the calendar as a whole."""
        return self.in_entry or self.event_id is not None

    def __str__(self) -> str:
        return f"{self.severity.value}: {self.where}: {self.message}"


class CalendarError(ValueError):
    """The calendar cannot be used. ``issues`` holds every error found, not only the first."""

    def __init__(self, issues: list[CalendarIssue] | tuple[CalendarIssue, ...], *,
                 source: str) -> None:
        self.issues = tuple(issues)
        self.source = source
        errors = [i for i in self.issues if i.severity is Severity.ERROR]
        lines = "\n".join(f"  - {issue}" for issue in errors)
        super().__init__(f"{source}: {len(errors)} error(s) in the release calendar:\n{lines}")


@dataclass(frozen=True, kw_only=True)
class ReleaseEvent:
    """What every calendar entry has. Times are local wall-clock times in the calendar's zone.

    The event's *window* runs from ``start - lead_time_min`` (the pre-scale) to
    ``start + duration_min`` (the restore). ``min_capacity``/``max_capacity`` override the computed
    capacity when given. ``priority`` decides which window wins where windows overlap.
    """

    event_id: str
    index: int
    description: str
    start: dt.time
    duration_min: int
    lead_time_min: int
    multiplier: float
    targets: tuple[str, ...]
    priority: int
    min_capacity: int | None
    max_capacity: int | None

    @property
    def kind(self) -> EventKind:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    @property
    def label(self) -> str:
        """How messages name the entry: section, position and id (``recurring[0] (jump)``)."""
        return f"{self.kind.value}[{self.index}] ({self.event_id})"


@dataclass(frozen=True, kw_only=True)
class RecurringRelease(ReleaseEvent):
    """A weekly release (Shonen Jump on Mondays at 18:00), expanded into cron actions at synth."""

    weekdays: tuple[Weekday, ...]

    @property
    def kind(self) -> EventKind:
        return EventKind.RECURRING


@dataclass(frozen=True, kw_only=True)
class SeasonalRelease(ReleaseEvent):
    """A yearly date (anime announcement season on April 1), expanded into cron actions at synth."""

    month: int
    day: int

    @property
    def kind(self) -> EventKind:
        return EventKind.SEASONAL


@dataclass(frozen=True, kw_only=True)
class DatedRelease(ReleaseEvent):
    """A one-off release on a known date, turned into ``at()`` actions by the reconciler."""

    date: dt.date

    @property
    def kind(self) -> EventKind:
        return EventKind.DATED


@dataclass(frozen=True)
class ReleaseCalendar:
    """The valid entries of a calendar file. Entries that failed validation are not in here."""

    timezone: str
    recurring: tuple[RecurringRelease, ...] = ()
    seasonal: tuple[SeasonalRelease, ...] = ()
    dated: tuple[DatedRelease, ...] = ()

    @property
    def events(self) -> tuple[ReleaseEvent, ...]:
        """Every entry, in file order within each section."""
        return (*self.recurring, *self.seasonal, *self.dated)


@dataclass(frozen=True)
class ParsedCalendar:
    """The outcome of reading a calendar file: its valid entries and what was wrong with the rest.

    ``skipped_event_ids`` names entries dropped for errors; ``unidentified_skips`` counts dropped
    entries whose id could not be read — the reconciler then deletes nothing, because it cannot
    tell which existing actions belonged to them.
    """

    calendar: ReleaseCalendar
    issues: tuple[CalendarIssue, ...] = ()
    skipped_event_ids: frozenset[str] = field(default_factory=frozenset)
    unidentified_skips: int = 0

    @property
    def errors(self) -> tuple[CalendarIssue, ...]:
        """The issues that are errors."""
        return tuple(i for i in self.issues if i.severity is Severity.ERROR)
