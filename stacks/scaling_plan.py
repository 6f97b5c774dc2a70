"""Which scheduled actions each endpoint's scalable target gets, from the fleet plans and the
calendar.

Every target gets its daily floors (the capacity model's minima and maxima for the off-peak and
business-hours windows); targets whose ``scaling.release_calendar`` is enabled also get the
calendar's weekly and yearly pre-scale/restore pairs, sized by the same model (the floors may
then skip the weekdays a release window covers). The calendar is validated here, at synth, with
the same module the Lambda runs; its warnings are returned for the stack to surface.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from capacity_model import FleetPlan
from release_calendar import (
    CalendarIssue,
    CapacityModel,
    ScheduledCapacity,
    build_static_schedule,
    calendar_json,
)
from stacks.settings import REPO_ROOT, ScalingSettings


@dataclass(frozen=True)
class ScalingTarget:
    """One scalable target as the plan needs it: the settings' policy shape and the fleet plan."""

    settings: ScalingSettings
    fleet: FleetPlan


@dataclass(frozen=True)
class ScalingPlan:
    """Scheduled actions per target, the calendar for the Lambda, and the calendar's warnings."""

    actions: Mapping[str, tuple[ScheduledCapacity, ...]]
    calendar_models: Mapping[str, CapacityModel]
    calendar_json: str | None
    warnings: tuple[CalendarIssue, ...]


def plan_scaling(targets: Mapping[str, ScalingTarget], *, calendar_file: str) -> ScalingPlan:
    """Expand floors and calendar for ``targets`` (name → settings and fleet plan)."""
    models = {name: target.fleet.calendar_model() for name, target in targets.items()}
    with_calendar = {
        name: models[name]
        for name, target in targets.items()
        if target.settings.release_calendar is not None
        and target.settings.release_calendar.enabled
    }
    actions: dict[str, tuple[ScheduledCapacity, ...]] = {}
    warnings: tuple[CalendarIssue, ...] = ()
    text: str | None = None
    if with_calendar:
        text = (REPO_ROOT / calendar_file).read_text(encoding="utf-8")
        calendar_plan = build_static_schedule(text, with_calendar, source=calendar_file)
        actions.update({name: calendar_plan.for_target(name) for name in with_calendar})
        warnings = calendar_plan.warnings
    for name, model in models.items():
        if name in with_calendar:
            continue
        floors_only = build_static_schedule(
            f"version: 1\ntimezone: {model.timezone}\n", {name: model}, source="(daily floors)"
        )
        actions[name] = floors_only.for_target(name)
    return ScalingPlan(
        actions=actions,
        calendar_models=with_calendar,
        calendar_json=calendar_json(text) if text is not None else None,
        warnings=warnings,
    )
