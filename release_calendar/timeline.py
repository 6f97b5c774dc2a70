"""Release windows on a concrete local timeline, the capacity that should be in force, and a
replay of scheduled actions to check that they produce it.

The meaning of a calendar, stated once: at any local time ``t`` the range in force on a target
is the range of the highest-priority window covering ``t`` (a window runs from its pre-scale at
``start - lead`` up to, not including, its restore at ``start + duration``); where no window
covers ``t`` it is the daily floor in force at that time of day. Every scheduled action sets the
range that should be in force from its own fire time on, so replaying the actions in time order
("the last action wins") gives exactly that function — which is what the tests check.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from release_calendar.actions import ActionRole, ScheduledCapacity
from release_calendar.capacity import CapacityModel, CapacityRange
from release_calendar.cron import parse_schedule
from release_calendar.model import (
    DatedRelease,
    EventKind,
    RecurringRelease,
    ReleaseEvent,
    SeasonalRelease,
)

LAYER_FLOOR = 0
LAYERS: dict[EventKind, int] = {EventKind.RECURRING: 1, EventKind.SEASONAL: 2,
                                EventKind.DATED: 3}
"""Fixed actions of a lower layer cannot be suspended for one occurrence of a higher one: a daily
floor cannot skip one date, a weekly cron cannot skip one year's April 1."""


@dataclass(frozen=True)
class Window:
    """One occurrence of an event on one target: ``start`` (pre-scale) to ``end`` (restore)."""

    event: ReleaseEvent
    target: str
    release: dt.datetime
    start: dt.datetime
    end: dt.datetime
    capacity: CapacityRange

    @property
    def layer(self) -> int:
        """1 recurring, 2 seasonal, 3 dated."""
        return LAYERS[self.event.kind]

    @property
    def rank(self) -> tuple[int, int, str]:
        """Ordering that picks the window in force where several cover a time."""
        return (self.event.priority, self.layer, self.event.event_id)

    def covers(self, moment: dt.datetime) -> bool:
        """Whether the window is in force at ``moment`` (its restore time is outside it)."""
        return self.start <= moment < self.end

    def overlaps(self, other: Window) -> bool:
        """Whether the two windows share some time."""
        return self.start < other.end and other.start < self.end


def window_at(event: ReleaseEvent, target: str, release: dt.datetime,
              capacity: CapacityRange) -> Window:
    """The window of ``event`` released at local time ``release``."""
    return Window(event=event, target=target, release=release,
                  start=release - dt.timedelta(minutes=event.lead_time_min),
                  end=release + dt.timedelta(minutes=event.duration_min), capacity=capacity)


def recurring_windows(event: RecurringRelease, target: str, capacity: CapacityRange,
                      first_day: dt.date, last_day: dt.date) -> list[Window]:
    """Windows of a weekly event released on days ``first_day`` to ``last_day`` inclusive."""
    windows: list[Window] = []
    day = first_day
    while day <= last_day:
        if day.weekday() in event.weekdays:
            windows.append(window_at(event, target, dt.datetime.combine(day, event.start),
                                     capacity))
        day += dt.timedelta(days=1)
    return windows


def seasonal_windows(event: SeasonalRelease, target: str, capacity: CapacityRange,
                     years: Iterable[int]) -> list[Window]:
    """Windows of a yearly event in each of ``years``."""
    return [window_at(event, target,
                      dt.datetime.combine(dt.date(year, event.month, event.day), event.start),
                      capacity) for year in years]


def dated_window(event: DatedRelease, target: str, capacity: CapacityRange) -> Window:
    """The window of a one-off event."""
    return window_at(event, target, dt.datetime.combine(event.date, event.start), capacity)


def top_window(windows: Iterable[Window], moment: dt.datetime) -> Window | None:
    """The window in force at ``moment``: highest priority, then higher layer, then id."""
    covering = [w for w in windows if w.covers(moment)]
    return max(covering, key=lambda w: w.rank) if covering else None


def intended_capacity(moment: dt.datetime, windows: Iterable[Window],
                      model: CapacityModel) -> CapacityRange:
    """The range that should be in force at ``moment``."""
    top = top_window(windows, moment)
    return top.capacity if top else model.floor_at(moment.time()).capacity


@dataclass(frozen=True)
class Firing:
    """A scheduled action firing at a local time."""

    moment: dt.datetime
    action: ScheduledCapacity


def firings(actions: Iterable[ScheduledCapacity], start: dt.datetime,
            end: dt.datetime) -> list[Firing]:
    """Every firing with ``start <= moment < end``, in time order (name breaks ties)."""
    found = [Firing(moment, action) for action in actions
             for moment in parse_schedule(action.schedule).firings(start, end)]
    return sorted(found, key=lambda f: (f.moment, f.action.name))


def replay(actions: Sequence[ScheduledCapacity], start: dt.datetime, end: dt.datetime,
           initial: CapacityRange) -> list[tuple[dt.datetime, CapacityRange]]:
    """Apply the actions in time order from ``initial``: the range after each firing."""
    state = initial
    history: list[tuple[dt.datetime, CapacityRange]] = [(start, state)]
    for firing in firings(actions, start, end):
        state = firing.action.capacity
        history.append((firing.moment, state))
    return history


def range_in_force(history: Sequence[tuple[dt.datetime, CapacityRange]],
                   moment: dt.datetime) -> CapacityRange:
    """The range a :func:`replay` history has at ``moment`` (the last change at or before it)."""
    state = history[0][1]
    for changed_at, capacity in history:
        if changed_at <= moment:
            state = capacity
        else:
            break
    return state


def describe_role(role: ActionRole) -> str:
    """Words for an action role in messages."""
    return {ActionRole.FLOOR: "daily floor", ActionRole.PRESCALE: "pre-scale",
            ActionRole.RESTORE: "restore"}[role]


def replay_mismatches(actions: Sequence[ScheduledCapacity], windows: Sequence[Window],
                      model: CapacityModel, start: dt.datetime, end: dt.datetime, *,
                      warmup_days: int = 8
                      ) -> list[tuple[dt.datetime, CapacityRange, CapacityRange]]:
    """Where replaying ``actions`` disagrees with what should be in force, in ``[start, end)``.

    The actions are replayed from ``warmup_days`` before ``start`` (so the daily floors have
    fired); both functions are piecewise constant, so comparing them at every moment either can
    change (firings, window edges, floor times) compares them everywhere. Returns
    ``(moment, replayed, intended)`` for each disagreement.
    """
    warmup = start - dt.timedelta(days=warmup_days)
    history = replay(actions, warmup, end, intended_capacity(warmup, windows, model))
    moments = {start}
    moments.update(m for m, _ in history if start <= m < end)
    moments.update(edge for w in windows for edge in (w.start, w.end) if start <= edge < end)
    day = start.date()
    while day <= end.date():
        moments.update(moment for floor in model.floors
                       if start <= (moment := dt.datetime.combine(day, floor.start)) < end)
        day += dt.timedelta(days=1)
    found: list[tuple[dt.datetime, CapacityRange, CapacityRange]] = []
    for moment in sorted(moments):
        replayed = range_in_force(history, moment)
        intended = intended_capacity(moment, windows, model)
        if replayed != intended:
            found.append((moment, replayed, intended))
    return found
