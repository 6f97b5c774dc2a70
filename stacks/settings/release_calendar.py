"""Settings of the release calendar and its reconciling Lambda."""

from __future__ import annotations

from pydantic import Field, field_validator

from stacks.settings.aws import LogRetentionDays
from stacks.settings.base import REPO_ROOT, LocalTime, RepoRelativePath, StrictModel


class ReleaseCalendarSettings(StrictModel):
    """Where the release calendar is and how its reconciling Lambda runs."""

    file: RepoRelativePath = Field(
        "config/release_calendar.yaml", description="The calendar, relative to the repo root."
    )
    horizon_days: int = Field(14, ge=1, le=90, description="Dated events kept this far ahead.")
    daily_run_utc: LocalTime = Field(
        "15:05", description="When the Lambda reconciles every day, UTC (15:05 = 00:05 JST)."
    )
    log_retention_days: LogRetentionDays = Field(
        365, description="The reconciler's logs. At least a year (AWS Control Tower "
        "CT.CLOUDWATCH.PR.2).")

    @field_validator("file")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            raise ValueError("no such file")
        return value
