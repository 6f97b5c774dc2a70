"""Scheduled actions as this platform writes them, and the names that say who owns them.

Names are deterministic and made of ``[a-z0-9-]`` only (valid as Application Auto Scaling action
names and as CDK construct ids), at most 256 characters:

* ``floor-<name>``                      daily floors from settings (stack)
* ``calendar-weekly-<event>-prescale``  recurring releases (stack), ``-restore`` for the pair
* ``calendar-annual-<event>-prescale``  seasonal dates (stack)
* ``calendar-dated-<event>-prescale``   dated one-off events: owned by the reconciling Lambda,
  which creates, updates and deletes only names with this prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from release_calendar.capacity import CapacityRange

CALENDAR_PREFIX = "calendar-"
"""Every action that comes from the release calendar (the simulator's 'without calendar' drops
these)."""
WEEKLY_PREFIX = "calendar-weekly-"
ANNUAL_PREFIX = "calendar-annual-"
DATED_PREFIX = "calendar-dated-"
"""The prefix the reconciling Lambda owns."""
FLOOR_PREFIX = "floor-"
MAX_ACTIONS_PER_TARGET = 200
"""Application Auto Scaling's limit of scheduled actions per scalable target."""
MAX_NAME_LENGTH = 256
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ActionRole(StrEnum):
    """What a scheduled action is for."""

    FLOOR = "floor"
    PRESCALE = "prescale"
    RESTORE = "restore"


@dataclass(frozen=True)
class ScheduledCapacity:
    """One scheduled action: at ``schedule`` (in ``timezone``) set the target's min and max.

    ``event_id`` is the calendar event it comes from (None for a daily floor).
    """

    name: str
    schedule: str
    timezone: str
    min_capacity: int
    max_capacity: int
    target: str
    role: ActionRole
    event_id: str | None = None

    def __post_init__(self) -> None:
        if len(self.name) > MAX_NAME_LENGTH or not _NAME.match(self.name):
            raise ValueError(f"scheduled action name {self.name!r}: accepted: at most "
                             f"{MAX_NAME_LENGTH} characters from a-z, 0-9 and '-'")
        if not 1 <= self.min_capacity <= self.max_capacity:
            raise ValueError(f"scheduled action {self.name}: min {self.min_capacity} max "
                             f"{self.max_capacity}: accepted: 1 <= min <= max")

    @property
    def capacity(self) -> CapacityRange:
        """The range this action sets."""
        return CapacityRange(self.min_capacity, self.max_capacity)

    def api_fields(self) -> dict[str, Any]:
        """The fields of ``PutScheduledAction`` that describe this action (no target ids)."""
        return {
            "ScheduledActionName": self.name,
            "Schedule": self.schedule,
            "Timezone": self.timezone,
            "ScalableTargetAction": {"MinCapacity": self.min_capacity,
                                     "MaxCapacity": self.max_capacity},
        }


def weekly_action_name(event_id: str, role: ActionRole, group: int = 0) -> str:
    """``calendar-weekly-<event>-<role>``; ``group`` > 0 adds ``-<group>`` when a recurring
    event needs several crons for one role (different restore ranges on different days)."""
    suffix = f"-{group}" if group else ""
    return f"{WEEKLY_PREFIX}{event_id}-{role.value}{suffix}"


def annual_action_name(event_id: str, role: ActionRole) -> str:
    """``calendar-annual-<event>-<role>``."""
    return f"{ANNUAL_PREFIX}{event_id}-{role.value}"


def dated_action_name(event_id: str, role: ActionRole) -> str:
    """``calendar-dated-<event>-<role>``: a name the reconciling Lambda owns."""
    return f"{DATED_PREFIX}{event_id}-{role.value}"


def floor_action_name(floor_name: str) -> str:
    """``floor-<name>`` for a daily floor from settings."""
    return f"{FLOOR_PREFIX}{floor_name}"


def dated_event_id(action_name: str) -> str | None:
    """The event id inside a Lambda-owned action name, or None if the name is not one."""
    if not action_name.startswith(DATED_PREFIX):
        return None
    rest = action_name[len(DATED_PREFIX):]
    for role in (ActionRole.PRESCALE, ActionRole.RESTORE):
        tail = f"-{role.value}"
        if rest.endswith(tail) and len(rest) > len(tail):
            return rest[: -len(tail)]
    return None
