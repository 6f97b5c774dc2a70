"""What the reconciling Lambda must change, and its report of what it changed.

Pure: the Lambda reads the calendar and hands its text to :func:`plan_calendar_run`; for each
target it lists the scheduled actions, hands them to :meth:`CalendarRun.plan_for` as
:class:`ExistingScheduledAction`, applies the returned :class:`ReconcilePlan`, and records what
happened as a :class:`TargetOutcome`; :func:`run_report` tallies the outcomes into the summary it
logs. Only names with the Lambda's prefix (``calendar-dated-``) are ever created, updated or
deleted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from release_calendar.actions import DATED_PREFIX, ScheduledCapacity, dated_event_id
from release_calendar.capacity import CapacityModel
from release_calendar.expand import SchedulePlan, plan_dated_schedule, plan_static_schedule
from release_calendar.model import CalendarError, CalendarIssue, Severity
from release_calendar.parse import parse_calendar


@dataclass(frozen=True)
class ExistingScheduledAction:
    """A scheduled action as ``DescribeScheduledActions`` reports it."""

    name: str
    schedule: str
    timezone: str | None
    min_capacity: int | None
    max_capacity: int | None

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> ExistingScheduledAction:
        """Read one element of ``ScheduledActions`` from the API response."""
        target_action = item.get("ScalableTargetAction") or {}
        return cls(name=str(item["ScheduledActionName"]), schedule=str(item.get("Schedule", "")),
                   timezone=item.get("Timezone"),
                   min_capacity=target_action.get("MinCapacity"),
                   max_capacity=target_action.get("MaxCapacity"))

    def matches(self, desired: ScheduledCapacity) -> bool:
        """Whether this action already is ``desired`` (nothing to update)."""
        return (self.schedule == desired.schedule and self.timezone == desired.timezone
                and self.min_capacity == desired.min_capacity
                and self.max_capacity == desired.max_capacity)

    def describe(self) -> dict[str, Any]:
        """Short JSON-ready form for logs."""
        return {"name": self.name, "schedule": self.schedule, "timezone": self.timezone,
                "min": self.min_capacity, "max": self.max_capacity}


@dataclass(frozen=True)
class ReconcilePlan:
    """The changes for one scalable target.

    ``protected`` are owned actions kept untouched because their event was skipped for an error
    (or because deletions are off this run); ``foreign`` counts actions it does not own.
    """

    target: str
    create: tuple[ScheduledCapacity, ...] = ()
    update: tuple[tuple[ScheduledCapacity, ExistingScheduledAction], ...] = ()
    delete: tuple[ExistingScheduledAction, ...] = ()
    unchanged: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    foreign: int = 0
    deletions_held_back: bool = False

    @property
    def changes(self) -> int:
        """How many API writes applying the plan takes."""
        return len(self.create) + len(self.update) + len(self.delete)

    def summary(self) -> dict[str, Any]:
        """JSON-ready description for the structured log."""
        return {
            "target": self.target,
            "create": [_describe(a) for a in self.create],
            "update": [{"from": old.describe(), "to": _describe(new)} for new, old in self.update],
            "delete": [a.describe() for a in self.delete],
            "unchanged": list(self.unchanged),
            "protected": list(self.protected),
            "foreign_actions": self.foreign,
            "deletions_held_back": self.deletions_held_back,
        }


def _describe(action: ScheduledCapacity) -> dict[str, Any]:
    return {"name": action.name, "schedule": action.schedule, "timezone": action.timezone,
            "min": action.min_capacity, "max": action.max_capacity}


def plan_reconciliation(target: str, desired: Sequence[ScheduledCapacity],
                        existing: Iterable[ExistingScheduledAction], *,
                        protected_event_ids: Iterable[str] = (),
                        allow_deletions: bool = True) -> ReconcilePlan:
    """Create what is missing, update what differs, delete owned actions no longer desired.

    Owned actions of a protected event are left as they are. With ``allow_deletions=False``
    (some calendar entry could not even be identified) nothing is deleted.
    """
    for action in desired:
        if not action.name.startswith(DATED_PREFIX):
            raise ValueError(f"plan_reconciliation: {action.name!r} is not a name the "
                             f"reconciler owns (prefix {DATED_PREFIX!r})")
    protected_ids = set(protected_event_ids)
    wanted = {a.name: a for a in desired}
    if len(wanted) != len(desired):
        raise ValueError("plan_reconciliation: two desired actions share a name")
    create: list[ScheduledCapacity] = []
    update: list[tuple[ScheduledCapacity, ExistingScheduledAction]] = []
    delete: list[ExistingScheduledAction] = []
    unchanged: list[str] = []
    protected: list[str] = []
    foreign = 0
    seen: set[str] = set()
    for current in sorted(existing, key=lambda a: a.name):
        if not current.name.startswith(DATED_PREFIX):
            foreign += 1
            continue
        seen.add(current.name)
        if current.name in wanted:
            target_action = wanted[current.name]
            if current.matches(target_action):
                unchanged.append(current.name)
            else:
                update.append((target_action, current))
        elif dated_event_id(current.name) in protected_ids or not allow_deletions:
            protected.append(current.name)
        else:
            delete.append(current)
    create.extend(a for name, a in sorted(wanted.items()) if name not in seen)
    return ReconcilePlan(target=target, create=tuple(create), update=tuple(update),
                         delete=tuple(delete), unchanged=tuple(unchanged),
                         protected=tuple(protected), foreign=foreign,
                         deletions_held_back=not allow_deletions)



@dataclass(frozen=True)
class CalendarRun:
    """One run's desired state: the dated actions per target and what was wrong with the calendar.

    ``skipped_event_ids`` are entries left out for an error anywhere (parsing, the fixed plan, the
    dated plan): their existing actions are protected. ``unidentified_skips`` counts entries
    dropped before their id could be read; then nothing is deleted, because it cannot be told
    which existing actions were theirs.
    """

    source: str
    now: dt.datetime
    horizon_days: int
    dated: SchedulePlan
    issues: tuple[CalendarIssue, ...]
    skipped_event_ids: frozenset[str]
    unidentified_skips: int = 0

    @property
    def allow_deletions(self) -> bool:
        """False when some entry could not even be identified."""
        return self.unidentified_skips == 0

    @property
    def entry_errors(self) -> tuple[CalendarIssue, ...]:
        """The errors, each of which skipped one entry."""
        return tuple(i for i in self.issues if i.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[CalendarIssue, ...]:
        """The issues that are only reported."""
        return tuple(i for i in self.issues if i.severity is Severity.WARNING)

    def plan_for(self, target: str, existing: Iterable[ExistingScheduledAction]) -> ReconcilePlan:
        """The changes that make ``target``'s owned actions this run's dated actions."""
        return plan_reconciliation(target, self.dated.for_target(target), existing,
                                   protected_event_ids=self.skipped_event_ids,
                                   allow_deletions=self.allow_deletions)


def plan_calendar_run(text: str, models: Mapping[str, CapacityModel], *, now: dt.datetime,
                      horizon_days: int, source: str) -> CalendarRun:
    """Parse the calendar and plan the dated actions of the next ``horizon_days`` from ``now``.

    A bad entry is skipped (and named in the issues); raises CalendarError when the calendar as a
    whole is unusable — it cannot be read, or its time zone is not the targets' — so that the
    run changes nothing.
    """
    parsed = parse_calendar(text, source=source)
    static = plan_static_schedule(parsed.calendar, models)
    dated = plan_dated_schedule(parsed.calendar, models, now=now, horizon_days=horizon_days,
                                static=static)
    issues = (*parsed.issues, *static.issues, *dated.issues)
    document_errors = [i for i in issues if i.severity is Severity.ERROR and not i.about_entry]
    if document_errors:
        raise CalendarError(document_errors, source=source)
    return CalendarRun(
        source=source, now=now, horizon_days=horizon_days, dated=dated, issues=issues,
        skipped_event_ids=(parsed.skipped_event_ids | static.skipped_event_ids
                           | dated.skipped_event_ids),
        unidentified_skips=parsed.unidentified_skips)


@dataclass(frozen=True)
class TargetOutcome:
    """What happened on one scalable target.

    ``plan`` is None when the target's actions could not be read (then ``failures`` says why and
    nothing was written); ``failures`` are the calls that failed, as
    ``{"operation", "action", "error"}``.
    """

    target: str
    resource_id: str
    plan: ReconcilePlan | None = None
    failures: tuple[Mapping[str, str], ...] = ()

    @classmethod
    def unread(cls, target: str, resource_id: str, *, operation: str,
               error: str) -> TargetOutcome:
        """The target's actions could not be listed: one failure, no plan."""
        return cls(target=target, resource_id=resource_id,
                   failures=({"operation": operation, "error": error},))

    def written(self) -> dict[str, int]:
        """How many creates, updates and deletes succeeded (the failed calls left out)."""
        if self.plan is None:
            return {"created": 0, "updated": 0, "deleted": 0}
        failed = {f.get("action") for f in self.failures}
        return {"created": sum(1 for a in self.plan.create if a.name not in failed),
                "updated": sum(1 for a, _ in self.plan.update if a.name not in failed),
                "deleted": sum(1 for a in self.plan.delete if a.name not in failed)}

    def record(self) -> dict[str, Any]:
        """The target's entry in the run's summary: its plan and its failures."""
        if self.plan is None:
            return {"resource_id": self.resource_id, "target": self.target,
                    "failures": [dict(f) for f in self.failures]}
        return {"resource_id": self.resource_id, **self.plan.summary(),
                "failures": [dict(f) for f in self.failures]}


def tally(outcomes: Iterable[TargetOutcome], *, dry_run: bool) -> dict[str, int]:
    """Actions created, updated, deleted and left unchanged, and failed calls, over all targets.

    A dry run writes nothing, so it counts nothing as written.
    """
    totals = {"created": 0, "updated": 0, "deleted": 0, "unchanged": 0, "failed": 0}
    for outcome in outcomes:
        totals["failed"] += len(outcome.failures)
        if outcome.plan is None:
            continue
        totals["unchanged"] += len(outcome.plan.unchanged)
        if not dry_run:
            for name, count in outcome.written().items():
                totals[name] += count
    return totals


def planned_changes(outcomes: Iterable[TargetOutcome]) -> dict[str, int]:
    """The creates, updates and deletes planned over all targets (written or not)."""
    plans = [o.plan for o in outcomes if o.plan is not None]
    return {"create": sum(len(p.create) for p in plans),
            "update": sum(len(p.update) for p in plans),
            "delete": sum(len(p.delete) for p in plans)}


def issue_record(issue: CalendarIssue) -> dict[str, Any]:
    """An issue as the log reports it."""
    return {"event_id": issue.event_id, "where": issue.where, "message": issue.message}


def run_report(run: CalendarRun, outcomes: Sequence[TargetOutcome], *, environment: str,
               dry_run: bool) -> dict[str, Any]:
    """The run's structured summary: what was planned, what was written, what was skipped."""
    return {
        "message": "release calendar dry run" if dry_run else "release calendar reconciled",
        "environment": environment,
        "dry_run": dry_run,
        "source": run.source,
        "now": run.now.isoformat(),
        "horizon_days": run.horizon_days,
        "planned": planned_changes(outcomes),
        "counts": {**tally(outcomes, dry_run=dry_run),
                   "skipped_entries": len(run.skipped_event_ids) + run.unidentified_skips},
        "skipped_entries": [issue_record(i) for i in run.entry_errors],
        "deletions_held_back": not run.allow_deletions,
        "warnings": [issue_record(i) for i in run.warnings],
        "targets": [o.record() for o in outcomes],
    }
