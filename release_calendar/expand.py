"""Turn a release calendar into scheduled actions, and check that they mean what the calendar says.

Two plans, one meaning (see :mod:`release_calendar.timeline`):

* :func:`plan_static_schedule` — what the stack synthesizes: the daily floors from settings, a
  pre-scale/restore pair of weekly crons per recurring release and of yearly crons per seasonal
  date. Counted together against the 200-actions-per-target limit.
* :func:`plan_dated_schedule` — what the reconciling Lambda keeps: ``at()`` pairs for the dated
  one-off events inside its horizon.

**What "restore" means.** A restore does not put back what was in force at the pre-scale: it sets
what should be in force from the end of the window on — the window still covering that time with
the highest priority, else the daily floor in force at that time of day. A Sunday 22:00 to Monday
03:00 window therefore restores to the off-peak floor (it crossed 01:00), an 06:00-09:00 window to
the business-hours floor (it crossed 08:00).

**Floors yield to weekly releases.** A daily floor action that would fire inside a recurring
window (the 01:00 off-peak floor during a midnight release) is left out on that weekday — its cron
lists only the other days — and the window's restore sets the floor in force when it ends. A
floor cannot skip a single date, and a weekly cron cannot skip a single year's April 1, so a
seasonal or dated window must not contain a fixed action that would set anything other than what
should be in force (an error names the action and the time). Inside a higher-priority recurring
window the floors are already suspended, so a dated event may sit there.

**Overlaps** on one target are errors unless the priorities differ; where windows overlap, the
higher priority is in force.
"""

from __future__ import annotations

import calendar as gregorian
import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from zoneinfo import ZoneInfo

from release_calendar.actions import (
    ANNUAL_PREFIX,
    FLOOR_PREFIX,
    MAX_ACTIONS_PER_TARGET,
    WEEKLY_PREFIX,
    ActionRole,
    ScheduledCapacity,
    annual_action_name,
    dated_action_name,
    floor_action_name,
    weekly_action_name,
)
from release_calendar.capacity import CapacityModel, CapacityRange
from release_calendar.cron import annual_cron, at_expression, weekly_cron
from release_calendar.model import (
    CalendarError,
    CalendarIssue,
    EventKind,
    RecurringRelease,
    ReleaseCalendar,
    ReleaseEvent,
    SeasonalRelease,
    Severity,
    Weekday,
)
from release_calendar.parse import parse_calendar
from release_calendar.timeline import (
    LAYER_FLOOR,
    LAYERS,
    Firing,
    Window,
    dated_window,
    describe_role,
    firings,
    intended_capacity,
    recurring_windows,
    seasonal_windows,
    top_window,
)

REFERENCE_MONDAY = dt.date(2001, 1, 1)
"""Weekly crons are worked out on the week starting here (any Monday would do)."""
REFERENCE_YEAR = 2001
LEAP_REFERENCE_YEAR = 2004
DEFAULT_HORIZON_DAYS = 14
_ONE_MINUTE = dt.timedelta(minutes=1)


def _representative_years() -> tuple[int, ...]:
    """One year for each (weekday of January 1, leap or not): every way a date can fall."""
    seen: dict[tuple[int, bool], int] = {}
    for year in range(2001, 2101):
        seen.setdefault((dt.date(year, 1, 1).weekday(), gregorian.isleap(year)), year)
    return tuple(sorted(seen.values()))


REPRESENTATIVE_YEARS = _representative_years()


@dataclass(frozen=True)
class SchedulePlan:
    """Scheduled actions per target, with every issue found while planning them.

    ``skipped_event_ids`` are events left out because of an error (their existing actions are
    protected by the reconciler).
    """

    actions: Mapping[str, tuple[ScheduledCapacity, ...]]
    issues: tuple[CalendarIssue, ...] = ()
    skipped_event_ids: frozenset[str] = field(default_factory=frozenset)

    @property
    def errors(self) -> tuple[CalendarIssue, ...]:
        """The issues that are errors."""
        return tuple(i for i in self.issues if i.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[CalendarIssue, ...]:
        """The issues that are warnings."""
        return tuple(i for i in self.issues if i.severity is Severity.WARNING)

    def for_target(self, target: str) -> tuple[ScheduledCapacity, ...]:
        """The actions of one target (empty when it has none)."""
        return self.actions.get(target, ())


def event_capacity(event: ReleaseEvent, target: str, model: CapacityModel
                   ) -> tuple[CapacityRange | None, list[CalendarIssue]]:
    """The range an event's pre-scale sets on ``target``, or None with the errors why not.

    min = the formula's instances (or the event's min_capacity); max = the target's max (or the
    event's max_capacity). Warnings: the formula asked for more than the target allows, or the
    minimum is below what the business-hours floor already guarantees.
    """
    issues: list[CalendarIssue] = []
    label = event.label

    def issue(severity: Severity, field_name: str, message: str) -> None:
        issues.append(CalendarIssue(severity, f"{label}.{field_name}", message, event.event_id))

    limits = f"{model.min_capacity}-{model.max_capacity}"
    if event.min_capacity is not None:
        minimum = event.min_capacity
        if not model.min_capacity <= minimum <= model.max_capacity:
            issue(Severity.ERROR, "min_capacity",
                  f"{minimum} is outside target {target}'s limits; accepted: {limits}")
    else:
        needed = model.instances_needed(event.multiplier)
        minimum = model.required_instances(event.multiplier)
        if needed > model.max_capacity:
            issue(Severity.WARNING, "multiplier",
                  f"×{event.multiplier:g} needs {needed} instances on target {target} "
                  f"({model.base_invocations_per_min:g}/min × {event.multiplier:g} ÷ "
                  f"{model.per_instance_invocations_per_min:g}/min per instance × "
                  f"{1 + model.headroom:g}) but its max is {model.max_capacity}; capped there")
    maximum = event.max_capacity if event.max_capacity is not None else model.max_capacity
    if event.max_capacity is not None and not (
            model.min_capacity <= maximum <= model.max_capacity):
        issue(Severity.ERROR, "max_capacity",
              f"{maximum} is outside target {target}'s limits; accepted: {limits}")
    if minimum > maximum:
        source = "min_capacity" if event.min_capacity is not None else "computed minimum"
        issue(Severity.ERROR, "max_capacity",
              f"{maximum} is below the {source} {minimum} on target {target}; accepted: "
              f"max_capacity >= {minimum}")
    if any(i.severity is Severity.ERROR for i in issues):
        return None, issues
    if minimum < model.business_hours.min_capacity:
        issue(Severity.WARNING, "min_capacity" if event.min_capacity is not None else "multiplier",
              f"scheduled minimum {minimum} on target {target} is below the business-hours floor "
              f"({model.business_hours.min_capacity}); a pre-scale during business hours would "
              "lower capacity, not raise it")
    return CapacityRange(minimum, maximum), issues


def plan_static_schedule(calendar: ReleaseCalendar,
                         models: Mapping[str, CapacityModel]) -> SchedulePlan:
    """The fixed actions per target: floors, recurring pairs and seasonal pairs.

    Events with errors are left out (and named); the others are planned as if those did not
    exist, repeating until no new error appears.
    """
    return _fixpoint(lambda target, skipped: _StaticTarget(
        calendar, target, models[target], skipped).build(), models)


def plan_dated_schedule(calendar: ReleaseCalendar, models: Mapping[str, CapacityModel], *,
                        now: dt.datetime | None, horizon_days: int = DEFAULT_HORIZON_DAYS,
                        static: SchedulePlan | None = None,
                        enforce_action_limit: bool = True) -> SchedulePlan:
    """The ``at()`` actions for dated events, per target.

    With ``now`` (timezone-aware), only events whose window reaches into
    ``[now, now + horizon_days)`` are planned (plus any window overlapping those), and only
    actions still in the future. With ``now=None`` every dated event is checked (synth).
    """
    if now is not None and now.tzinfo is None:
        raise ValueError("plan_dated_schedule: now must be timezone-aware")
    if horizon_days < 1:
        raise ValueError(f"plan_dated_schedule: horizon_days {horizon_days}; accepted: >= 1")
    fixed = static if static is not None else plan_static_schedule(calendar, models)
    now_local = None
    if now is not None:
        now_local = now.astimezone(ZoneInfo(calendar.timezone)).replace(tzinfo=None)
    return _fixpoint(lambda target, skipped: _DatedTarget(
        calendar, target, models[target], skipped | fixed.skipped_event_ids,
        fixed.for_target(target), now_local, horizon_days, enforce_action_limit,
        fixed.skipped_event_ids).build(), models)


def build_static_schedule(text: str, models: Mapping[str, CapacityModel], *,
                          source: str = "config/release_calendar.yaml") -> SchedulePlan:
    """What the stack calls at synth: parse, plan the fixed actions and check every dated event.

    Raises CalendarError listing every error; returns the fixed actions and the warnings.
    """
    parsed = parse_calendar(text, source=source)
    static = plan_static_schedule(parsed.calendar, models)
    dated = plan_dated_schedule(parsed.calendar, models, now=None, static=static,
                                enforce_action_limit=False)
    issues = _dedupe([*parsed.issues, *static.issues, *dated.issues])
    if any(i.severity is Severity.ERROR for i in issues):
        raise CalendarError(issues, source=source)
    return SchedulePlan(actions=static.actions, issues=issues)


# --- planning machinery -------------------------------------------------------------------------


@dataclass
class _TargetResult:
    actions: tuple[ScheduledCapacity, ...] = ()
    event_errors: list[CalendarIssue] = field(default_factory=list)
    other_issues: list[CalendarIssue] = field(default_factory=list)

    def file(self, issues: Iterable[CalendarIssue]) -> None:
        """Errors leave their event out of the next pass; everything else is only reported."""
        for issue in issues:
            (self.event_errors if issue.severity is Severity.ERROR
             else self.other_issues).append(issue)

    def refuse(self, blame: _Blame) -> bool:
        """Record the errors of one check; True when there are any (the pass stops there)."""
        self.event_errors.extend(blame.errors)
        return bool(blame.errors)


def _fixpoint(build: Callable[[str, frozenset[str]], _TargetResult],
              models: Mapping[str, CapacityModel]) -> SchedulePlan:
    skipped: set[str] = set()
    recorded: list[CalendarIssue] = []
    while True:
        actions: dict[str, tuple[ScheduledCapacity, ...]] = {}
        new_errors: list[CalendarIssue] = []
        others: list[CalendarIssue] = []
        for target in sorted(models):
            result = build(target, frozenset(skipped))
            actions[target] = result.actions
            new_errors.extend(result.event_errors)
            others.extend(result.other_issues)
        if not new_errors:
            return SchedulePlan(actions=actions, issues=_dedupe([*recorded, *others]),
                                skipped_event_ids=frozenset(skipped))
        recorded.extend(new_errors)
        skipped.update(i.event_id for i in new_errors if i.event_id)


def _dedupe(issues: Iterable[CalendarIssue]) -> tuple[CalendarIssue, ...]:
    seen: set[tuple[str, str, str]] = set()
    kept: list[CalendarIssue] = []
    for issue in issues:
        key = (issue.severity.value, issue.where, issue.message)
        if key not in seen:
            seen.add(key)
            kept.append(issue)
    return tuple(kept)


class _Blame:
    """Collects at most one error per event (the first found) for one planning pass."""

    def __init__(self) -> None:
        self.by_event: dict[str, CalendarIssue] = {}

    def add(self, event: ReleaseEvent, field_name: str, message: str) -> None:
        if event.event_id not in self.by_event:
            self.by_event[event.event_id] = CalendarIssue(
                Severity.ERROR, f"{event.label}.{field_name}", message, event.event_id)

    @property
    def errors(self) -> list[CalendarIssue]:
        return list(self.by_event.values())


_Event = TypeVar("_Event", bound=ReleaseEvent)


def _ranged_events(events: Iterable[_Event], target: str, model: CapacityModel,
                  skipped: frozenset[str], result: _TargetResult
                  ) -> list[tuple[_Event, CapacityRange]]:
    """The capacity loop both plans start with: each event on ``target`` that was not skipped,
    with the range its pre-scale sets; events whose range has an error are dropped, and every
    issue :func:`event_capacity` found is filed in ``result``."""
    ranged: list[tuple[_Event, CapacityRange]] = []
    for event in events:
        if target not in event.targets or event.event_id in skipped:
            continue
        capacity, issues = event_capacity(event, target, model)
        result.file(issues)
        if capacity is not None:
            ranged.append((event, capacity))
    return ranged


def _window_edges(window: Window) -> tuple[tuple[ActionRole, dt.datetime], ...]:
    """The emit step's two moments of a window: the pre-scale at its start, the restore at its
    end (in that order, which is the order actions are emitted in)."""
    return ((ActionRole.PRESCALE, window.start), (ActionRole.RESTORE, window.end))


def _scheduled_action(model: CapacityModel, target: str, *, name: str, schedule: str,
                     capacity: CapacityRange, role: ActionRole,
                     event_id: str | None) -> ScheduledCapacity:
    """One action on ``target`` setting ``capacity``, in the target's schedule time zone."""
    return ScheduledCapacity(name=name, schedule=schedule, timezone=model.timezone,
                             min_capacity=capacity.min_capacity,
                             max_capacity=capacity.max_capacity, target=target, role=role,
                             event_id=event_id)


def _action_limit_excess(target: str, total: int, *, counted: str, breakdown: str) -> str | None:
    """The sentence saying ``target`` would hold ``total`` actions, over Application Auto
    Scaling's per-target limit (``counted`` names them, ``breakdown`` splits the total), or None
    when ``total`` is within the limit."""
    if total <= MAX_ACTIONS_PER_TARGET:
        return None
    return (f"target {target} would have {total} {counted} ({breakdown}), over Application Auto "
            f"Scaling's limit of {MAX_ACTIONS_PER_TARGET} per scalable target")


def _rivals(window: Window, context: Iterable[Window]) -> Iterator[Window]:
    """The other windows overlapping ``window`` at its priority: neither is in force there."""
    return (other for other in context
            if other is not window and other.event.priority == window.event.priority
            and window.overlaps(other))


def _misfires(actions: Sequence[ScheduledCapacity], window: Window, context: Sequence[Window],
              model: CapacityModel) -> Iterator[tuple[Firing, Window | None, CapacityRange]]:
    """Each fixed action firing inside ``window`` (its restore minute included) that sets another
    range than should be in force then: the firing, the window in force (None: the daily floor
    is) and the range expected."""
    for firing in firings(actions, window.start, window.end + _ONE_MINUTE):
        top = top_window(context, firing.moment)
        expected = top.capacity if top else model.floor_at(firing.moment.time()).capacity
        if firing.action.capacity != expected:
            yield firing, top, expected


def _later(a: ReleaseEvent, b: ReleaseEvent) -> ReleaseEvent:
    """The entry to blame for a clash between two: the higher layer, then the later in file."""
    return max(a, b, key=lambda e: (LAYERS[e.kind], e.index))


def _weekly_span(window: Window) -> str:
    return f"{window.start:%a %H:%M} - {window.end:%a %H:%M}"


def _dated_span(window: Window) -> str:
    return f"{window.start:%Y-%m-%d %H:%M} - {window.end:%Y-%m-%d %H:%M}"


def _yearly_span(window: Window) -> str:
    return f"{window.start:%b %d %H:%M} - {window.end:%b %d %H:%M}"


_OVERLAP_ACCEPTED = ("accepted: windows (start - lead_time_min to start + duration_min) that do "
                     "not overlap on one target, or different priorities (the higher one is in "
                     "force where they overlap)")


def _conflict_message(firing: Firing, expected: CapacityRange, top: Window | None, *,
                      blamed: ReleaseEvent, when: str) -> str:
    action = firing.action
    owner = f"'{action.event_id}'" if action.event_id else "settings"
    what = (f"the {describe_role(action.role)} action {action.name} ({action.schedule}, from "
            f"{owner}) fires at {firing.moment:%H:%M} {when} and sets {action.capacity}")
    if top is not None and top.event is not blamed:
        should = f"{top.event.label} ({top.capacity}, priority {top.event.priority}) is in force"
    elif top is not None:
        should = f"this window ({top.capacity}) should be in force"
    else:
        should = f"the daily floor ({expected}) should be in force"
    accepted = ("accepted: windows and priorities such that no fixed action fires inside this "
                "window with a different range: move start, change lead_time_min or "
                "duration_min, or nest a dated event inside a lower-priority recurring window "
                "(which suspends the daily floors)")
    return f"{what}, but {should}; a fixed cron cannot skip one date; {accepted}"


class _StaticTarget:
    """Plans the fixed actions of one target."""

    def __init__(self, calendar: ReleaseCalendar, target: str, model: CapacityModel,
                 skipped: frozenset[str]) -> None:
        self.calendar = calendar
        self.target = target
        self.model = model
        self.skipped = skipped

    def build(self) -> _TargetResult:
        """Floors, weekly pairs, yearly pairs; each check stops the pass at its first errors."""
        result = _TargetResult()
        if self.calendar.timezone != self.model.timezone:
            result.other_issues.append(self._timezone_error())
            result.actions = self._floor_actions([])
            return result
        ranged = _ranged_events((*self.calendar.recurring, *self.calendar.seasonal), self.target,
                               self.model, self.skipped, result)
        if result.event_errors:
            return result
        capacities = {event.event_id: capacity for event, capacity in ranged}
        recurring = [event for event, _ in ranged if isinstance(event, RecurringRelease)]
        seasonal = [event for event, _ in ranged if isinstance(event, SeasonalRelease)]
        weekly, this_week = self._reference_weeks(recurring, capacities)
        if result.refuse(self._weekly_overlaps(this_week, weekly)):
            return result
        actions = [*self._floor_actions(weekly), *self._weekly_actions(this_week, weekly)]
        result.other_issues.extend(self._silenced_floors(actions))
        seasonal_actions, leap_errors = self._seasonal_actions(seasonal, capacities)
        if result.refuse(leap_errors):
            return result
        actions.extend(seasonal_actions)
        if result.refuse(self._verify_seasonal(seasonal, recurring, capacities, actions)):
            return result
        result.other_issues.extend(self._action_limit(actions))
        result.actions = tuple(sorted(actions, key=lambda a: a.name))
        return result

    def _timezone_error(self) -> CalendarIssue:
        return CalendarIssue(
            Severity.ERROR, "timezone",
            f"the calendar's time zone {self.calendar.timezone} differs from target "
            f"{self.target}'s schedule time zone {self.model.timezone} (settings); "
            "accepted: the same IANA zone, so releases and daily floors share one clock")

    def _reference_weeks(self, recurring: Sequence[RecurringRelease],
                         capacities: Mapping[str, CapacityRange]
                         ) -> tuple[list[Window], list[Window]]:
        """The weekly windows around the reference week (a week either side, so a window that
        crosses a week boundary is seen), and those starting in the reference week itself."""
        first = REFERENCE_MONDAY - dt.timedelta(days=7)
        last = REFERENCE_MONDAY + dt.timedelta(days=13)
        weekly = [w for e in recurring
                  for w in recurring_windows(e, self.target, capacities[e.event_id], first, last)]
        week_start = dt.datetime.combine(REFERENCE_MONDAY, dt.time())
        week_end = week_start + dt.timedelta(days=7)
        return weekly, [w for w in weekly if week_start <= w.start < week_end]

    def _weekly_overlaps(self, this_week: Sequence[Window], weekly: Sequence[Window]) -> _Blame:
        blame = _Blame()
        for window in this_week:
            for other in _rivals(window, weekly):
                if other.event is window.event:
                    blame.add(window.event, "duration_min",
                              f"its own windows overlap on target {self.target} "
                              f"({_weekly_span(window)} and {_weekly_span(other)}); accepted: "
                              "lead_time_min + duration_min shorter than the gap between its "
                              "weekdays")
                    continue
                blamed = _later(window.event, other.event)
                partner = other if blamed is window.event else window
                own = window if blamed is window.event else other
                blame.add(blamed, "priority",
                          f"its window {_weekly_span(own)} overlaps {partner.event.label}'s "
                          f"window {_weekly_span(partner)} on target {self.target}, both priority "
                          f"{window.event.priority}; {_OVERLAP_ACCEPTED}")
        return blame

    def _silenced_floors(self, actions: Sequence[ScheduledCapacity]) -> list[CalendarIssue]:
        """A warning per daily floor that every day's release windows keep from firing."""
        return [CalendarIssue(
            Severity.WARNING, "recurring",
            f"on target {self.target} the {floor.name} floor at {floor.start:%H:%M} falls "
            "inside a release window every day, so it never fires")
            for floor in self.model.floors
            if not any(a.name == floor_action_name(floor.name) for a in actions)]

    def _action_limit(self, actions: Sequence[ScheduledCapacity]) -> list[CalendarIssue]:
        """An error when the fixed actions alone exceed the per-target limit."""
        counts = {kind: sum(1 for a in actions if a.name.startswith(prefix))
                  for kind, prefix in (("floor", FLOOR_PREFIX), ("weekly", WEEKLY_PREFIX),
                                       ("yearly", ANNUAL_PREFIX))}
        excess = _action_limit_excess(
            self.target, len(actions), counted="fixed scheduled actions",
            breakdown=(f"{counts['floor']} floors, {counts['weekly']} weekly, "
                       f"{counts['yearly']} yearly"))
        if excess is None:
            return []
        return [CalendarIssue(Severity.ERROR, "document",
                              f"{excess}; accepted: fewer recurring or seasonal events on it")]

    def _action(self, name: str, schedule: str, capacity: CapacityRange, role: ActionRole,
                event_id: str | None) -> ScheduledCapacity:
        return _scheduled_action(self.model, self.target, name=name, schedule=schedule,
                                capacity=capacity, role=role, event_id=event_id)

    def _floor_actions(self, weekly: Sequence[Window]) -> tuple[ScheduledCapacity, ...]:
        actions: list[ScheduledCapacity] = []
        for floor in self.model.floors:
            days = [Weekday(offset) for offset in range(7) if not any(
                w.covers(dt.datetime.combine(REFERENCE_MONDAY + dt.timedelta(days=offset),
                                             floor.start)) for w in weekly)]
            if days:
                actions.append(self._action(floor_action_name(floor.name),
                                            weekly_cron(floor.start, days), floor.capacity,
                                            ActionRole.FLOOR, None))
        return tuple(actions)

    def _weekly_actions(self, this_week: Sequence[Window],
                        weekly: Sequence[Window]) -> list[ScheduledCapacity]:
        groups: dict[tuple[str, ActionRole], dict[tuple[dt.time, CapacityRange], set[Weekday]]]
        groups = {}
        for window in this_week:
            for role, moment in _window_edges(window):
                capacity = intended_capacity(moment, weekly, self.model)
                by_value = groups.setdefault((window.event.event_id, role), {})
                by_value.setdefault((moment.time(), capacity), set()).add(
                    Weekday(moment.weekday()))
        actions: list[ScheduledCapacity] = []
        for (event_id, role), by_value in sorted(groups.items()):
            ordered = sorted(by_value.items(), key=lambda item: (min(item[1]), item[0][0]))
            for number, ((time_of_day, capacity), days) in enumerate(ordered, start=1):
                group = number if len(ordered) > 1 else 0
                actions.append(self._action(weekly_action_name(event_id, role, group),
                                            weekly_cron(time_of_day, days), capacity, role,
                                            event_id))
        return actions

    def _seasonal_actions(self, seasonal: Sequence[SeasonalRelease],
                          capacities: Mapping[str, CapacityRange]
                          ) -> tuple[list[ScheduledCapacity], _Blame]:
        blame = _Blame()
        context = [w for e in seasonal for w in seasonal_windows(
            e, self.target, capacities[e.event_id],
            (REFERENCE_YEAR - 1, REFERENCE_YEAR, REFERENCE_YEAR + 1))]
        actions: list[ScheduledCapacity] = []
        for event in seasonal:
            plain, leap = (seasonal_windows(event, self.target, capacities[event.event_id], [y])[0]
                           for y in (REFERENCE_YEAR, LEAP_REFERENCE_YEAR))

            def day_and_time(moment: dt.datetime) -> tuple[int, int, dt.time]:
                return moment.month, moment.day, moment.time()

            if (day_and_time(plain.start) != day_and_time(leap.start)
                    or day_and_time(plain.end) != day_and_time(leap.end)):
                blame.add(event, "day",
                          f"its window {_yearly_span(plain)} falls on other dates in leap years "
                          f"({_yearly_span(leap)}), so its yearly pre-scale and restore would not "
                          "pair up; accepted: a window that does not cross the end of February, "
                          "or a dated event per year")
                continue
            for role, moment in _window_edges(plain):
                actions.append(self._action(
                    annual_action_name(event.event_id, role),
                    annual_cron(moment.time(), moment.month, moment.day),
                    intended_capacity(moment, context, self.model), role, event.event_id))
        return actions, blame

    def _verify_seasonal(self, seasonal: Sequence[SeasonalRelease],
                         recurring: Sequence[RecurringRelease],
                         capacities: Mapping[str, CapacityRange],
                         actions: Sequence[ScheduledCapacity]) -> _Blame:
        """Replay the fixed actions over every seasonal window in every kind of year."""
        blame = _Blame()
        for year in REPRESENTATIVE_YEARS:
            yearly = [w for e in seasonal for w in seasonal_windows(
                e, self.target, capacities[e.event_id], (year - 1, year, year + 1))]
            for window in (w for w in yearly if w.release.year == year):
                low = window.start - dt.timedelta(days=3)
                high = window.end + dt.timedelta(days=3)
                context = [w for e in recurring for w in recurring_windows(
                    e, self.target, capacities[e.event_id], low.date(), high.date())]
                context.extend(w for w in yearly if w.start < high and low < w.end)
                when = (f"in years when {window.release:%b %d} is a {window.release:%A}")
                self._check_overlaps(window, context, blame, when)
                # The window's own restore moment counts too: a yearly restore's fixed range is
                # wrong in the years a weekly window still covers that time.
                for firing, top, expected in _misfires(actions, window, context, self.model):
                    blamed = _blamed_for(firing, top, window, self.calendar)
                    blame.add(blamed, "start", _conflict_message(
                        firing, expected, top, blamed=blamed, when=when))
        return blame

    def _check_overlaps(self, window: Window, context: Sequence[Window], blame: _Blame,
                        when: str) -> None:
        for other in _rivals(window, context):
            if other.event is window.event:
                continue
            blamed = _later(window.event, other.event)
            partner = other if blamed is window.event else window
            blame.add(blamed, "priority",
                      f"its window overlaps {partner.event.label}'s window "
                      f"({_dated_span(partner)[11:]}) on target {self.target} {when}, both "
                      f"priority {window.event.priority}; {_OVERLAP_ACCEPTED}")


def _blamed_for(firing: Firing, top: Window | None, window: Window,
                calendar: ReleaseCalendar) -> ReleaseEvent:
    """A conflict is the fault of the higher-layer party: the window a fixed action breaks into,
    or the action whose fixed range is wrong in some years."""
    owner = next((e for e in calendar.events if e.event_id == firing.action.event_id), None)
    candidates: list[tuple[int, int, ReleaseEvent]] = []
    if owner is not None:
        candidates.append((LAYERS[owner.kind], owner.index, owner))
    if top is not None:
        candidates.append((top.layer, top.event.index, top.event))
    if not candidates:
        return window.event
    layer, _, event = max(candidates, key=lambda c: (c[0], c[1]))
    return event if layer > LAYER_FLOOR else window.event


_Planned = tuple[Window, list[ScheduledCapacity]]
"""A dated window and the actions kept for it (those still in the future)."""


class _DatedTarget:
    """Plans the ``at()`` actions of one target."""

    def __init__(self, calendar: ReleaseCalendar, target: str, model: CapacityModel,
                 skipped: frozenset[str], fixed_actions: Sequence[ScheduledCapacity],
                 now_local: dt.datetime | None, horizon_days: int, enforce_action_limit: bool,
                 static_skipped: frozenset[str]) -> None:
        self.calendar = calendar
        self.target = target
        self.model = model
        self.skipped = skipped
        self.fixed_actions = fixed_actions
        self.now_local = now_local
        self.horizon_days = horizon_days
        self.enforce_action_limit = enforce_action_limit
        self.static_skipped = static_skipped

    def build(self) -> _TargetResult:
        """The pairs of the windows in the horizon, once nothing clashes and the limit holds."""
        result = _TargetResult()
        if self.calendar.timezone != self.model.timezone:
            return result  # reported by the static plan
        ranged = _ranged_events(self.calendar.dated, self.target, self.model, self.skipped,
                               result)
        if result.event_errors:
            return result
        windows = {event.event_id: dated_window(event, self.target, capacity)
                   for event, capacity in ranged}
        candidates = self._candidates(list(windows.values()))
        if not candidates:
            return result
        low = min(w.start for w in candidates) - dt.timedelta(days=3)
        high = max(w.end for w in candidates) + dt.timedelta(days=3)
        context = [*self._fixed_windows(low, high), *windows.values()]
        if result.refuse(self._conflicts(candidates, context)):
            return result
        planned = self._pairs(candidates, context)
        if self._held_to_action_limit(planned, result):
            return result
        result.actions = tuple(a for _, pair in planned for a in pair)
        return result

    def _conflicts(self, candidates: Sequence[Window], context: Sequence[Window]) -> _Blame:
        """Same-priority overlaps, and fixed actions firing inside a window with another range."""
        blame = _Blame()
        for window in candidates:
            for other in _rivals(window, context):
                if other.event is window.event:
                    continue
                blamed = (_later(window.event, other.event)
                          if other.event.kind is EventKind.DATED else window.event)
                partner = other if blamed is window.event else window
                blame.add(blamed, "priority",
                          f"its window overlaps {partner.event.label}'s window "
                          f"({_dated_span(partner)}) on target {self.target}, both priority "
                          f"{window.event.priority}; {_OVERLAP_ACCEPTED}")
            for firing, top, expected in _misfires(self.fixed_actions, window, context,
                                                   self.model):
                blamed = top.event if top is not None and top.layer == 3 else window.event
                blame.add(blamed, "start", _conflict_message(
                    firing, expected, top, blamed=blamed,
                    when=f"on {firing.moment:%a %Y-%m-%d}"))
        return blame

    def _pairs(self, candidates: Sequence[Window], context: Sequence[Window]) -> list[_Planned]:
        """Each window's pre-scale and restore, in time order, leaving out moments already past
        (they have fired, or never will: nothing to keep)."""
        planned: list[_Planned] = []
        for window in sorted(candidates, key=lambda w: (w.start, w.event.index)):
            pair = [_scheduled_action(
                self.model, self.target, name=dated_action_name(window.event.event_id, role),
                schedule=at_expression(moment),
                capacity=intended_capacity(moment, context, self.model), role=role,
                event_id=window.event.event_id)
                for role, moment in _window_edges(window)
                if self.now_local is None or moment > self.now_local]
            planned.append((window, pair))
        return planned

    def _held_to_action_limit(self, planned: Sequence[_Planned], result: _TargetResult) -> bool:
        """True when the latest events were left out to stay within the per-target limit (the
        pass stops there). At synth (not enforced) it only warns: the reconciler keeps just the
        events inside its horizon."""
        fixed = len(self.fixed_actions)
        total = fixed + sum(len(pair) for _, pair in planned)
        excess = _action_limit_excess(self.target, total, counted="scheduled actions",
                                     breakdown=f"{fixed} fixed + {total - fixed} dated")
        if excess is None:
            return False
        if not self.enforce_action_limit:
            result.other_issues.append(CalendarIssue(
                Severity.WARNING, "dated",
                f"{excess} if every dated event were in the reconciler's horizon at once; "
                "it keeps only those inside its horizon (remove past events)"))
            return False
        blame = _Blame()
        for window, pair in reversed(planned):
            if total <= MAX_ACTIONS_PER_TARGET:
                break
            total -= len(pair)
            blame.add(window.event, "date",
                      f"{excess}; this one, the latest, is left out; accepted: fewer "
                      "dated events within the horizon, or a shorter horizon")
        result.refuse(blame)
        return True

    def _candidates(self, windows: list[Window]) -> list[Window]:
        if self.now_local is None:
            return windows
        horizon_end = self.now_local + dt.timedelta(days=self.horizon_days)
        chosen = [w for w in windows if w.end > self.now_local and w.start < horizon_end]
        grew = True
        while grew:  # a window overlapping a chosen one shapes its restore: plan it too
            grew = False
            for window in windows:
                if window not in chosen and any(window.overlaps(c) for c in chosen):
                    chosen.append(window)
                    grew = True
        return chosen

    def _fixed_windows(self, low: dt.datetime, high: dt.datetime) -> list[Window]:
        found: list[Window] = []
        for event in (*self.calendar.recurring, *self.calendar.seasonal):
            if self.target not in event.targets or event.event_id in self.static_skipped:
                continue
            capacity, _ = event_capacity(event, self.target, self.model)
            if capacity is None:
                continue
            if isinstance(event, RecurringRelease):
                found.extend(recurring_windows(event, self.target, capacity,
                                               low.date() - dt.timedelta(days=3), high.date()))
            elif isinstance(event, SeasonalRelease):
                found.extend(w for w in seasonal_windows(
                    event, self.target, capacity, range(low.year - 1, high.year + 2))
                    if w.start < high and low < w.end)
        return found
