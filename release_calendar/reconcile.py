"""What the reconciling Lambda must change: desired dated actions against existing ones.

Pure: the Lambda lists the target's scheduled actions, hands them here as
:class:`ExistingScheduledAction`, and applies the returned :class:`ReconcilePlan`. Only names with
the Lambda's prefix (``calendar-dated-``) are ever created, updated or deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from release_calendar.actions import DATED_PREFIX, ScheduledCapacity, dated_event_id


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

