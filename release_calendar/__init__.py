"""The release calendar: MangaAssist's predictive scaling for SageMaker endpoints.

Predictive scaling does not exist for SageMaker, so known traffic spikes — weekly manga releases,
anime announcement seasons, a specific chapter on a specific date — are written in
``config/release_calendar.yaml`` and turned into Application Auto Scaling scheduled actions:
a pre-scale ``lead_time_min`` before each release to the capacity its traffic multiplier needs,
and a restore when its window ends. The stack synthesizes the fixed (weekly and yearly) actions;
the release-calendar Lambda reconciles the dated ones every day.

Pure package (standard library only; PyYAML used when present): the stack imports it at synth,
the Lambda at run time. See docs/scaling.md for the file format and the rules.
"""

from release_calendar.actions import (
    ANNUAL_PREFIX,
    CALENDAR_PREFIX,
    DATED_PREFIX,
    FLOOR_PREFIX,
    MAX_ACTIONS_PER_TARGET,
    WEEKLY_PREFIX,
    ActionRole,
    ScheduledCapacity,
    dated_event_id,
)
from release_calendar.capacity import (
    CapacityModel,
    CapacityRange,
    DailyFloor,
    capacity_models_from_json,
    capacity_models_to_json,
)
from release_calendar.cron import Schedule, annual_cron, at_expression, parse_schedule, weekly_cron
from release_calendar.expand import (
    DEFAULT_HORIZON_DAYS,
    SchedulePlan,
    build_static_schedule,
    event_capacity,
    plan_dated_schedule,
    plan_static_schedule,
)
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
from release_calendar.parse import calendar_json, parse_calendar
from release_calendar.reconcile import (
    CalendarRun,
    ExistingScheduledAction,
    ReconcilePlan,
    TargetOutcome,
    issue_record,
    plan_calendar_run,
    plan_reconciliation,
    run_report,
)

__all__ = [
    "ANNUAL_PREFIX",
    "CALENDAR_PREFIX",
    "DATED_PREFIX",
    "DEFAULT_HORIZON_DAYS",
    "FLOOR_PREFIX",
    "KNOWN_TARGETS",
    "MAX_ACTIONS_PER_TARGET",
    "WEEKLY_PREFIX",
    "ActionRole",
    "CalendarError",
    "CalendarIssue",
    "CalendarRun",
    "CapacityModel",
    "CapacityRange",
    "DailyFloor",
    "DatedRelease",
    "EventKind",
    "ExistingScheduledAction",
    "ParsedCalendar",
    "ReconcilePlan",
    "RecurringRelease",
    "ReleaseCalendar",
    "ReleaseEvent",
    "Schedule",
    "SchedulePlan",
    "ScheduledCapacity",
    "SeasonalRelease",
    "Severity",
    "TargetOutcome",
    "Weekday",
    "annual_cron",
    "at_expression",
    "build_static_schedule",
    "calendar_json",
    "capacity_models_from_json",
    "capacity_models_to_json",
    "dated_event_id",
    "event_capacity",
    "issue_record",
    "parse_calendar",
    "parse_schedule",
    "plan_calendar_run",
    "plan_dated_schedule",
    "plan_reconciliation",
    "plan_static_schedule",
    "run_report",
    "weekly_cron",
]
