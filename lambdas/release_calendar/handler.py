"""Release-calendar reconciler: keeps the dated release events as scheduled actions.

Run daily by EventBridge. Reads the calendar (S3 object or SSM parameter), plans the ``at()``
pre-scale/restore pairs of the dated events in the next ``HORIZON_DAYS`` for every configured
SageMaker variant, and makes the variant's scheduled actions match: creates what is missing,
updates what changed, deletes expired or removed actions **it owns** (names starting
``calendar-dated-``) and never touches any other action. Running it twice changes nothing the
second time. A dry run (event ``{"dry_run": true}`` or ``DRY_RUN=true``) reports the plan and
writes nothing.

A bad calendar entry is skipped with an error naming it (its existing actions are kept as they
are); the other entries still apply. A calendar that cannot be read or parsed at all, or a
misconfigured function, changes nothing and raises — the Lambda Errors alarm pages. Failed API
writes are reported and raise after the others were applied.

This module only does the I/O — the environment, the event, the S3/SSM read, the Application Auto
Scaling calls, the log and metric lines; what to create, update and delete, the counts and the
summary are worked out by the pure ``release_calendar.reconcile``.

Handler: ``handler.handler``. The asset is this folder plus the repository's ``release_calendar/``
and ``metrics_contract/`` packages next to ``handler.py``; the runtime's own boto3 is used.

Environment:
  CALENDAR_BUCKET + CALENDAR_KEY   the calendar object (JSON, or YAML if PyYAML is present), or
  CALENDAR_PARAMETER               an SSM parameter holding it
  CALENDAR_CAPACITY_MODELS         JSON from release_calendar.capacity_models_to_json
  SCALABLE_TARGET_LLM              endpoint/<endpoint>/variant/<variant> (and/or
  SCALABLE_TARGET_INTENT           the intent endpoint's); each needs a capacity model
  HORIZON_DAYS                     days ahead to keep actions for (default 14)
  ENVIRONMENT                      metric dimension value (dev, prod)
  DRY_RUN                          "true" to only report (default "false")
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

import metrics_contract
from release_calendar import (
    DEFAULT_HORIZON_DAYS,
    KNOWN_TARGETS,
    CalendarError,
    CalendarRun,
    CapacityModel,
    ExistingScheduledAction,
    ReconcilePlan,
    ScheduledCapacity,
    TargetOutcome,
    capacity_models_from_json,
    issue_record,
    plan_calendar_run,
    run_report,
)

SERVICE_NAMESPACE = "sagemaker"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
RESOURCE_ID = re.compile(r"^endpoint/[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})/variant/"
                         r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})$")
MAX_HORIZON_DAYS = 90
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class ConfigurationError(ValueError):
    """The function's environment is wrong; the message lists every problem."""


@dataclass(frozen=True)
class ReconcilerConfig:
    """What the environment variables say, validated."""

    bucket: str | None
    key: str | None
    parameter: str | None
    models: dict[str, CapacityModel]
    resource_ids: dict[str, str]
    horizon_days: int
    environment: str
    dry_run: bool

    @property
    def source(self) -> str:
        """Where the calendar is read from, for logs."""
        return f"s3://{self.bucket}/{self.key}" if self.bucket else f"ssm:{self.parameter}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ReconcilerConfig:
        """Validate the environment; ConfigurationError names every bad variable."""
        problems: list[str] = []
        bucket, key, parameter = _calendar_location(env, problems)
        models = _capacity_models(env, problems)
        resource_ids = _resource_ids(env, problems)
        problems.extend(_unmatched_targets(models, resource_ids))
        horizon = _horizon_days(env, problems)
        environment = _environment_name(env, problems)
        dry_run = False
        try:
            dry_run = parse_flag(env.get("DRY_RUN", ""), "DRY_RUN")
        except ValueError as error:
            problems.append(str(error))
        if problems:
            raise ConfigurationError("release-calendar Lambda misconfigured: "
                                     + "; ".join(problems))
        return cls(bucket=bucket, key=key, parameter=parameter,
                   models={t: m for t, m in models.items() if t in resource_ids},
                   resource_ids=resource_ids, horizon_days=horizon, environment=environment,
                   dry_run=dry_run)


def _calendar_location(env: Mapping[str, str], problems: list[str]
                       ) -> tuple[str | None, str | None, str | None]:
    """CALENDAR_BUCKET + CALENDAR_KEY, or CALENDAR_PARAMETER: exactly one of the two."""
    bucket, key = env.get("CALENDAR_BUCKET") or None, env.get("CALENDAR_KEY") or None
    parameter = env.get("CALENDAR_PARAMETER") or None
    if parameter and (bucket or key):
        problems.append("set CALENDAR_PARAMETER or CALENDAR_BUCKET + CALENDAR_KEY, not both")
    elif not parameter and not (bucket and key):
        problems.append("CALENDAR_BUCKET and CALENDAR_KEY (or CALENDAR_PARAMETER) are required")
    return bucket, key, parameter


def _capacity_models(env: Mapping[str, str], problems: list[str]) -> dict[str, CapacityModel]:
    try:
        return capacity_models_from_json(env.get("CALENDAR_CAPACITY_MODELS", ""))
    except ValueError as error:
        problems.append(str(error))
        return {}


def _resource_ids(env: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    """SCALABLE_TARGET_<TARGET> per known target that has one; at least one is required."""
    resource_ids: dict[str, str] = {}
    for target in KNOWN_TARGETS:
        variable = f"SCALABLE_TARGET_{target.upper()}"
        value = env.get(variable)
        if not value:
            continue
        if not RESOURCE_ID.match(value):
            problems.append(f"{variable}={value!r}: accepted: "
                            "'endpoint/<endpoint-name>/variant/<variant-name>'")
        resource_ids[target] = value
    if not resource_ids:
        problems.append("no SCALABLE_TARGET_LLM or SCALABLE_TARGET_INTENT: nothing to reconcile")
    return resource_ids


def _unmatched_targets(models: Mapping[str, CapacityModel],
                       resource_ids: Mapping[str, str]) -> list[str]:
    """A model for a target nobody knows, or a configured target without a model."""
    problems = [f"CALENDAR_CAPACITY_MODELS has unknown target {target!r}; "
                f"accepted: {list(KNOWN_TARGETS)}"
                for target in models if target not in KNOWN_TARGETS]
    if models:  # no models at all is already reported
        problems.extend(f"SCALABLE_TARGET_{target.upper()} is set but "
                        f"CALENDAR_CAPACITY_MODELS has no model for {target!r}"
                        for target in resource_ids if target not in models)
    return problems


def _horizon_days(env: Mapping[str, str], problems: list[str]) -> int:
    text = env.get("HORIZON_DAYS", str(DEFAULT_HORIZON_DAYS))
    horizon = int(text) if text.isdigit() else -1
    if not 1 <= horizon <= MAX_HORIZON_DAYS:
        problems.append(f"HORIZON_DAYS={text!r}: accepted: 1-{MAX_HORIZON_DAYS}")
    return horizon


def _environment_name(env: Mapping[str, str], problems: list[str]) -> str:
    environment = env.get("ENVIRONMENT", "")
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", environment):
        problems.append(f"ENVIRONMENT={environment!r}: accepted: a short lower-case name "
                        "such as 'dev' or 'prod'")
    return environment


def parse_flag(value: object, name: str) -> bool:
    """Read a boolean from an environment variable or event field."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: accepted: true or false")


def read_calendar_text(config: ReconcilerConfig, *, s3: Any = None, ssm: Any = None) -> str:
    """Fetch the calendar document from S3 or SSM."""
    if config.parameter:
        ssm = ssm or boto3.client("ssm")
        response = ssm.get_parameter(Name=config.parameter, WithDecryption=True)
        return str(response["Parameter"]["Value"])
    s3 = s3 or boto3.client("s3")
    body = s3.get_object(Bucket=config.bucket, Key=config.key)["Body"].read()
    return bytes(body).decode("utf-8")


def list_scheduled_actions(aas: Any, resource_id: str) -> list[ExistingScheduledAction]:
    """Every scheduled action on one SageMaker variant, all pages."""
    paginator = aas.get_paginator("describe_scheduled_actions")
    found: list[ExistingScheduledAction] = []
    for page in paginator.paginate(ServiceNamespace=SERVICE_NAMESPACE, ResourceId=resource_id,
                                   ScalableDimension=SCALABLE_DIMENSION):
        found.extend(ExistingScheduledAction.from_api(item)
                     for item in page.get("ScheduledActions", []))
    return found


def is_registered(aas: Any, resource_id: str) -> bool:
    """Whether the variant is a registered scalable target (actions cannot exist otherwise)."""
    response = aas.describe_scalable_targets(ServiceNamespace=SERVICE_NAMESPACE,
                                             ResourceIds=[resource_id],
                                             ScalableDimension=SCALABLE_DIMENSION)
    return bool(response.get("ScalableTargets"))


def apply_plan(aas: Any, resource_id: str, plan: ReconcilePlan) -> list[dict[str, str]]:
    """Write the plan; returns one entry per failed call (the others still happen)."""
    failures: list[dict[str, str]] = []
    target_ids = {"ServiceNamespace": SERVICE_NAMESPACE, "ResourceId": resource_id,
                  "ScalableDimension": SCALABLE_DIMENSION}

    def attempt(operation: str, name: str, call: Any, **kwargs: Any) -> None:
        try:
            call(**target_ids, **kwargs)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if operation == "delete_scheduled_action" and code == "ObjectNotFoundException":
                return  # already gone (an overlapping run deleted it): the goal is reached
            failures.append({"operation": operation, "action": name, "error": str(error)})
        except BotoCoreError as error:
            failures.append({"operation": operation, "action": name, "error": str(error)})

    writes: list[ScheduledCapacity] = [*plan.create, *(new for new, _ in plan.update)]
    for action in writes:
        attempt("put_scheduled_action", action.name, aas.put_scheduled_action,
                **action.api_fields())
    for existing in plan.delete:
        attempt("delete_scheduled_action", existing.name, aas.delete_scheduled_action,
                ScheduledActionName=existing.name)
    return failures


def reconcile(text: str, config: ReconcilerConfig, aas: Any, *, now: dt.datetime,
              dry_run: bool) -> dict[str, Any]:
    """Plan and (unless ``dry_run``) apply; returns the structured summary.

    Raises CalendarError when the calendar as a whole is unusable (nothing is changed then).
    """
    run = plan_calendar_run(text, config.models, now=now, horizon_days=config.horizon_days,
                            source=config.source)
    outcomes = [reconcile_target(aas, run, target, resource_id, dry_run=dry_run)
                for target, resource_id in sorted(config.resource_ids.items())]
    return run_report(run, outcomes, environment=config.environment, dry_run=dry_run)


def reconcile_target(aas: Any, run: CalendarRun, target: str, resource_id: str, *,
                     dry_run: bool) -> TargetOutcome:
    """Read one variant's actions, plan against them and (unless ``dry_run``) write the plan.

    A variant whose actions cannot be read is reported and left alone; the others still apply.
    """
    try:
        registered = is_registered(aas, resource_id)
        existing = list_scheduled_actions(aas, resource_id) if registered else []
    except (ClientError, BotoCoreError) as error:
        return TargetOutcome.unread(target, resource_id, operation="describe", error=str(error))
    if not registered:
        return TargetOutcome.unread(
            target, resource_id, operation="describe_scalable_targets",
            error=f"{resource_id} is not a registered scalable target")
    plan = run.plan_for(target, existing)
    failures = [] if dry_run else apply_plan(aas, resource_id, plan)
    return TargetOutcome(target=target, resource_id=resource_id, plan=plan,
                         failures=tuple(failures))


def metrics_document(summary: Mapping[str, Any], *, timestamp_ms: int) -> dict[str, Any]:
    """The EMF document for one run (what was actually written; zeros in a dry run)."""
    counts = summary["counts"]
    return metrics_contract.emf_document(
        {
            metrics_contract.CALENDAR_ACTIONS_CREATED: counts["created"],
            metrics_contract.CALENDAR_ACTIONS_UPDATED: counts["updated"],
            metrics_contract.CALENDAR_ACTIONS_DELETED: counts["deleted"],
            metrics_contract.CALENDAR_ENTRIES_SKIPPED: counts["skipped_entries"],
        },
        {"Environment": summary["environment"]},
        timestamp_ms=timestamp_ms,
        properties={"dry_run": summary["dry_run"], "planned": summary["planned"]},
    )


def utc_now() -> dt.datetime:
    """The current time (a seam for tests)."""
    return dt.datetime.now(dt.UTC)


def handler(event: Mapping[str, Any] | None, context: Any) -> dict[str, Any]:
    """Lambda entry point."""
    config = ReconcilerConfig.from_env(os.environ)
    event = event or {}
    dry_run = config.dry_run
    if isinstance(event, Mapping) and "dry_run" in event:
        dry_run = parse_flag(event["dry_run"], "event.dry_run")
    now = utc_now()
    try:
        text = read_calendar_text(config)
        summary = reconcile(text, config, boto3.client("application-autoscaling"), now=now,
                            dry_run=dry_run)
    except CalendarError as error:
        _log({"level": "ERROR", "message": "release calendar unusable; nothing changed",
              "environment": config.environment, "source": config.source,
              "errors": [issue_record(i) for i in error.issues]})
        raise
    _log({"level": "WARNING" if summary["skipped_entries"] else "INFO", **summary})
    _log(metrics_document(summary, timestamp_ms=int(time.time() * 1000)))
    if summary["counts"]["failed"]:
        raise RuntimeError(f"release calendar: {summary['counts']['failed']} scheduled-action "
                           "call(s) failed; see the summary log line")
    return summary


def _log(record: Mapping[str, Any]) -> None:
    print(json.dumps(record, default=str, ensure_ascii=False), flush=True)
