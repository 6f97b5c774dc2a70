"""How many instances a release needs, and the daily floors it is layered on.

A :class:`CapacityModel` describes one scalable target (the LLM or the intent endpoint): the load
it sees at a typical release hour, what one instance should carry, the headroom kept on top, the
target's absolute limits and its two daily floors (off-peak and business hours). The stack fills
it from the environment's settings, passes it to the release-calendar Lambda as JSON in an
environment variable (:func:`capacity_models_to_json`), and both expand the calendar with it.

Units: invocations per minute, the unit of SageMaker's ``InvocationsPerInstance`` metric and of
the target-tracking target (200 per instance per minute).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_FLOOR_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
_ROUNDING_SLACK = 1e-9
"""ceil(11.000000000000002) must be 11: float noise in base × multiplier is not a real need."""


@dataclass(frozen=True, order=True)
class CapacityRange:
    """What a scheduled action sets: the scalable target's MinCapacity and MaxCapacity."""

    min_capacity: int
    max_capacity: int

    def __str__(self) -> str:
        return f"min {self.min_capacity} max {self.max_capacity}"


@dataclass(frozen=True)
class DailyFloor:
    """A daily scheduled action from settings: from ``start`` (local time) the range is this.

    The floors partition the day: the floor in force at any time of day is the one whose
    ``start`` came last (off-peak from 01:00 to 08:00, business hours from 08:00 to 01:00).
    """

    name: str
    start: dt.time
    min_capacity: int
    max_capacity: int

    @property
    def capacity(self) -> CapacityRange:
        """The range this floor sets."""
        return CapacityRange(self.min_capacity, self.max_capacity)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``start`` as ``HH:MM``)."""
        return {"name": self.name, "start": self.start.strftime("%H:%M"),
                "min_capacity": self.min_capacity, "max_capacity": self.max_capacity}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str) -> DailyFloor:
        """Inverse of :meth:`to_dict`; ValueError names ``where`` and the bad field."""
        _require_keys(data, {"name", "start", "min_capacity", "max_capacity"}, where)
        start_text = data["start"]
        try:
            start = dt.time.fromisoformat(str(start_text))
        except ValueError:
            raise ValueError(f"{where}.start: {start_text!r} is not a time; accepted: 'HH:MM'") \
                from None
        return cls(name=str(data["name"]), start=start,
                   min_capacity=_as_int(data["min_capacity"], f"{where}.min_capacity"),
                   max_capacity=_as_int(data["max_capacity"], f"{where}.max_capacity"))


@dataclass(frozen=True)
class CapacityModel:
    """Inputs of the capacity formula and the daily floors of one scalable target.

    instances = ceil(base_invocations_per_min × multiplier / per_instance_invocations_per_min
    × (1 + headroom)), clamped to [min_capacity, max_capacity].
    """

    base_invocations_per_min: float
    per_instance_invocations_per_min: float
    headroom: float
    min_capacity: int
    max_capacity: int
    timezone: str
    off_peak: DailyFloor
    business_hours: DailyFloor

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.base_invocations_per_min > 0:
            problems.append(f"base_invocations_per_min {self.base_invocations_per_min!r}: "
                            "accepted: a number > 0")
        if not self.per_instance_invocations_per_min > 0:
            problems.append(f"per_instance_invocations_per_min "
                            f"{self.per_instance_invocations_per_min!r}: accepted: a number > 0")
        if not 0 <= self.headroom <= 5:
            problems.append(f"headroom {self.headroom!r}: accepted: 0 to 5 (0.3 = 30 %)")
        if not 1 <= self.min_capacity <= self.max_capacity:
            problems.append(f"min_capacity {self.min_capacity} / max_capacity "
                            f"{self.max_capacity}: accepted: 1 <= min_capacity <= max_capacity")
        for label, floor in (("off_peak", self.off_peak), ("business_hours", self.business_hours)):
            if not _FLOOR_NAME.match(floor.name):
                problems.append(f"{label}.name {floor.name!r}: accepted: lower-case letters, "
                                "digits and '-', at most 40 characters")
            if not (self.min_capacity <= floor.min_capacity <= floor.max_capacity
                    <= self.max_capacity):
                problems.append(
                    f"{label} min {floor.min_capacity} max {floor.max_capacity}: accepted: "
                    f"{self.min_capacity} <= min <= max <= {self.max_capacity} "
                    "(the target's own limits)")
            if floor.start.second or floor.start.microsecond:
                problems.append(f"{label}.start {floor.start}: accepted: whole minutes")
        if self.off_peak.start == self.business_hours.start:
            problems.append(f"off_peak.start and business_hours.start are both "
                            f"{self.off_peak.start:%H:%M}: accepted: two different times")
        if self.off_peak.name == self.business_hours.name:
            problems.append(f"off_peak.name and business_hours.name are both "
                            f"{self.off_peak.name!r}: accepted: two different names")
        if problems:
            raise ValueError("CapacityModel: " + "; ".join(problems))

    @property
    def floors(self) -> tuple[DailyFloor, ...]:
        """Both daily floors, earliest start first."""
        return tuple(sorted((self.off_peak, self.business_hours), key=lambda f: f.start))

    def floor_at(self, time_of_day: dt.time) -> DailyFloor:
        """The floor in force at ``time_of_day``: the last one that started, wrapping midnight."""
        in_force = self.floors[-1]  # before the first start of the day, yesterday's last floor
        for floor in self.floors:
            if floor.start <= time_of_day:
                in_force = floor
        return in_force

    def instances_needed(self, multiplier: float) -> int:
        """The formula's result before clamping to the target's limits."""
        load = self.base_invocations_per_min * multiplier
        exact = load / self.per_instance_invocations_per_min * (1 + self.headroom)
        return max(1, math.ceil(exact - _ROUNDING_SLACK))

    def required_instances(self, multiplier: float) -> int:
        """Instances for a release with this traffic multiplier, within the target's limits."""
        return min(max(self.instances_needed(multiplier), self.min_capacity), self.max_capacity)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, the shape :meth:`from_dict` reads."""
        return {
            "base_invocations_per_min": self.base_invocations_per_min,
            "per_instance_invocations_per_min": self.per_instance_invocations_per_min,
            "headroom": self.headroom,
            "min_capacity": self.min_capacity,
            "max_capacity": self.max_capacity,
            "timezone": self.timezone,
            "off_peak": self.off_peak.to_dict(),
            "business_hours": self.business_hours.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "capacity model") -> CapacityModel:
        """Inverse of :meth:`to_dict`; ValueError names ``where`` and the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        _require_keys(data, {"base_invocations_per_min", "per_instance_invocations_per_min",
                             "headroom", "min_capacity", "max_capacity", "timezone", "off_peak",
                             "business_hours"}, where)
        try:
            return cls(
                base_invocations_per_min=_as_float(data["base_invocations_per_min"],
                                                   f"{where}.base_invocations_per_min"),
                per_instance_invocations_per_min=_as_float(
                    data["per_instance_invocations_per_min"],
                    f"{where}.per_instance_invocations_per_min"),
                headroom=_as_float(data["headroom"], f"{where}.headroom"),
                min_capacity=_as_int(data["min_capacity"], f"{where}.min_capacity"),
                max_capacity=_as_int(data["max_capacity"], f"{where}.max_capacity"),
                timezone=str(data["timezone"]),
                off_peak=DailyFloor.from_dict(_as_mapping(data["off_peak"], f"{where}.off_peak"),
                                              where=f"{where}.off_peak"),
                business_hours=DailyFloor.from_dict(
                    _as_mapping(data["business_hours"], f"{where}.business_hours"),
                    where=f"{where}.business_hours"),
            )
        except ValueError as error:
            if str(error).startswith(where):
                raise
            raise ValueError(f"{where}: {error}") from None


def capacity_models_to_json(models: Mapping[str, CapacityModel]) -> str:
    """Serialize the per-target models for the Lambda's ``CALENDAR_CAPACITY_MODELS`` variable."""
    return json.dumps({target: model.to_dict() for target, model in sorted(models.items())},
                      separators=(",", ":"), sort_keys=True)


def capacity_models_from_json(text: str, *, where: str = "CALENDAR_CAPACITY_MODELS"
                              ) -> dict[str, CapacityModel]:
    """Inverse of :func:`capacity_models_to_json`; ValueError names the target and field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg} at position {error.pos})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{where}: accepted: a non-empty object of target name -> model")
    return {str(target): CapacityModel.from_dict(model, where=f"{where}.{target}")
            for target, model in data.items()}


def _require_keys(data: Mapping[str, Any], expected: set[str], where: str) -> None:
    missing = sorted(expected - set(data))
    unknown = sorted(set(data) - expected)
    if missing or unknown:
        raise ValueError(f"{where}: missing {missing}, unknown {unknown}; "
                         f"accepted keys: {sorted(expected)}")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {value!r} is not an integer")
    return value


def _as_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    return float(value)
