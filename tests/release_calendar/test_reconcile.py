"""The reconciler's pure side: the diff (only its own names, protected events, held-back
deletions), one run's plan of the calendar, and the tally and report of what was written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from release_calendar import (
    ActionRole,
    CalendarError,
    CalendarIssue,
    CalendarRun,
    CapacityModel,
    ExistingScheduledAction,
    ReconcilePlan,
    ScheduledCapacity,
    Severity,
    TargetOutcome,
    dated_event_id,
    issue_record,
    plan_calendar_run,
    plan_reconciliation,
    run_report,
)
from release_calendar.reconcile import planned_changes, tally


def desired(event_id: str, role: ActionRole, schedule: str, low: int = 8) -> ScheduledCapacity:
    return ScheduledCapacity(name=f"calendar-dated-{event_id}-{role.value}", schedule=schedule,
                             timezone="Asia/Tokyo", min_capacity=low, max_capacity=20,
                             target="llm", role=role, event_id=event_id)


def existing(name: str, schedule: str, low: int = 8) -> ExistingScheduledAction:
    return ExistingScheduledAction(name=name, schedule=schedule, timezone="Asia/Tokyo",
                                   min_capacity=low, max_capacity=20)


def test_diff_creates_updates_deletes_and_leaves_foreign_alone() -> None:
    wanted = [desired("a", ActionRole.PRESCALE, "at(2026-12-06T18:00:00)"),
              desired("a", ActionRole.RESTORE, "at(2026-12-06T22:00:00)", low=4),
              desired("b", ActionRole.PRESCALE, "at(2026-12-07T18:00:00)")]
    current = [existing("calendar-dated-a-prescale", "at(2026-12-06T18:00:00)"),
               existing("calendar-dated-a-restore", "at(2026-12-06T22:00:00)", low=2),
               existing("calendar-dated-gone-prescale", "at(2026-12-01T18:00:00)"),
               existing("calendar-dated-kept-restore", "at(2026-12-09T22:00:00)"),
               existing("floor-off-peak", "cron(0 1 * * ? *)"),
               existing("calendar-weekly-jump-prescale", "cron(0 16 ? * MON *)")]
    plan = plan_reconciliation("llm", wanted, current, protected_event_ids={"kept"})
    assert [a.name for a in plan.create] == ["calendar-dated-b-prescale"]
    assert [(new.name, old.min_capacity) for new, old in plan.update] == [
        ("calendar-dated-a-restore", 2)]
    assert [a.name for a in plan.delete] == ["calendar-dated-gone-prescale"]
    assert plan.unchanged == ("calendar-dated-a-prescale",)
    assert plan.protected == ("calendar-dated-kept-restore",)
    assert plan.foreign == 2
    assert plan.changes == 3


def test_deletions_can_be_held_back() -> None:
    plan = plan_reconciliation("llm", [], [existing("calendar-dated-x-prescale", "at(x)")],
                               allow_deletions=False)
    assert plan.delete == ()
    assert plan.protected == ("calendar-dated-x-prescale",)
    assert plan.summary()["deletions_held_back"] is True


def test_refuses_to_manage_names_it_does_not_own() -> None:
    floor = ScheduledCapacity(name="floor-off-peak", schedule="cron(0 1 * * ? *)",
                              timezone="Asia/Tokyo", min_capacity=2, max_capacity=6,
                              target="llm", role=ActionRole.FLOOR)
    with pytest.raises(ValueError, match="'floor-off-peak' is not a name the reconciler owns"):
        plan_reconciliation("llm", [floor], [])


@pytest.mark.parametrize(
    ("name", "event_id"),
    [("calendar-dated-one-piece-ch1100-prescale", "one-piece-ch1100"),
     ("calendar-dated-x-restore", "x"),
     ("calendar-dated--restore", None),
     ("calendar-weekly-jump-prescale", None),
     ("calendar-dated-x-something", None)],
)
def test_event_id_is_read_back_from_owned_names(name: str, event_id: str | None) -> None:
    assert dated_event_id(name) == event_id


def test_invalid_action_names_are_refused() -> None:
    with pytest.raises(ValueError, match="accepted: at most 256 characters from a-z, 0-9"):
        ScheduledCapacity(name="Calendar Dated", schedule="at(x)", timezone="Asia/Tokyo",
                          min_capacity=1, max_capacity=2, target="llm", role=ActionRole.PRESCALE)


# --- one run: the calendar's plan, the outcomes per target, the report ---------------------------

NOW = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone(dt.timedelta(hours=9)))
"""Six days before the 2026-12-06 events below."""


def run_of(text: str, models: dict[str, CapacityModel]) -> CalendarRun:
    return plan_calendar_run(text, models, now=NOW, horizon_days=14, source="test.yaml")


def outcome(plan: ReconcilePlan, *failed: str) -> TargetOutcome:
    return TargetOutcome(target="llm", resource_id="endpoint/e/variant/v", plan=plan,
                         failures=tuple({"operation": "put_scheduled_action", "action": name,
                                         "error": "denied"} for name in failed))


@pytest.fixture
def two_events(calendar_yaml: Callable[..., str]) -> str:
    """One good dated event, one whose multiplier is not a number (skipped)."""
    return calendar_yaml(dated=[
        {"id": "one-piece", "date": "2026-12-06", "start": "20:00"},
        {"id": "broken", "date": "2026-12-07", "start": "20:00", "multiplier": "lots"}])


def test_run_plans_the_horizon_and_protects_the_skipped_entry(
        two_events: str, models: dict[str, CapacityModel]) -> None:
    run = run_of(two_events, models)
    assert [a.name for a in run.dated.for_target("llm")] == [
        "calendar-dated-one-piece-prescale", "calendar-dated-one-piece-restore"]
    assert run.skipped_event_ids == {"broken"}
    assert [i.where for i in run.entry_errors] == ["dated[1] (broken).multiplier"]
    assert run.allow_deletions is True
    plan = run.plan_for("llm", [existing("calendar-dated-broken-prescale", "at(x)"),
                                existing("calendar-dated-gone-restore", "at(y)")])
    assert plan.protected == ("calendar-dated-broken-prescale",)
    assert [a.name for a in plan.delete] == ["calendar-dated-gone-restore"]
    assert [a.name for a in plan.create] == [a.name for a in run.dated.for_target("llm")]


def test_an_entry_without_an_id_holds_back_every_deletion(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[{"date": "2026-12-06", "start": "20:00"}])
    run = run_of(text, models)
    assert run.unidentified_skips == 1
    assert run.allow_deletions is False
    plan = run.plan_for("llm", [existing("calendar-dated-gone-restore", "at(y)")])
    assert plan.delete == ()
    assert plan.protected == ("calendar-dated-gone-restore",)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [("version: 1\ntimezone: Asia/Tokyo\ndated: [\n  - id: x\n", "does not parse as YAML"),
     ("version: 1\ntimezone: Asia/Seoul\ndated: []\n", "differs from target llm")])
def test_a_calendar_unusable_as_a_whole_raises(document: str, fragment: str,
                                               models: dict[str, CapacityModel]) -> None:
    with pytest.raises(CalendarError, match=fragment) as caught:
        run_of(document, models)
    assert caught.value.source == "test.yaml"


def test_tally_counts_what_was_written_not_what_failed() -> None:
    plan = plan_reconciliation(
        "llm",
        [desired("a", ActionRole.PRESCALE, "at(2026-12-06T18:00:00)"),
         desired("b", ActionRole.PRESCALE, "at(2026-12-07T18:00:00)"),
         desired("c", ActionRole.PRESCALE, "at(2026-12-08T18:00:00)"),
         desired("d", ActionRole.PRESCALE, "at(2026-12-09T18:00:00)")],
        [existing("calendar-dated-c-prescale", "at(2026-12-08T19:00:00)"),
         existing("calendar-dated-d-prescale", "at(2026-12-09T18:00:00)"),
         existing("calendar-dated-e-prescale", "at(2026-12-01T18:00:00)"),
         existing("calendar-dated-f-prescale", "at(2026-12-01T18:00:00)")])
    done = outcome(plan, "calendar-dated-b-prescale", "calendar-dated-f-prescale")
    unread = TargetOutcome.unread("intent", "endpoint/i/variant/v", operation="describe",
                                  error="throttled")
    assert done.written() == {"created": 1, "updated": 1, "deleted": 1}
    assert unread.written() == {"created": 0, "updated": 0, "deleted": 0}
    assert tally([done, unread], dry_run=False) == {
        "created": 1, "updated": 1, "deleted": 1, "unchanged": 1, "failed": 3}
    assert tally([outcome(plan), unread], dry_run=True) == {
        "created": 0, "updated": 0, "deleted": 0, "unchanged": 1, "failed": 1}
    assert planned_changes([done, unread]) == {"create": 2, "update": 1, "delete": 2}


def test_outcome_records_carry_the_plan_or_why_there_is_none() -> None:
    plan = plan_reconciliation("llm", [desired("a", ActionRole.PRESCALE, "at(x)")], [])
    record = outcome(plan, "calendar-dated-a-prescale").record()
    assert record["resource_id"] == "endpoint/e/variant/v"
    assert record["target"] == "llm"
    assert [a["name"] for a in record["create"]] == ["calendar-dated-a-prescale"]
    assert record["failures"] == [{"operation": "put_scheduled_action",
                                   "action": "calendar-dated-a-prescale", "error": "denied"}]
    assert TargetOutcome.unread("intent", "endpoint/i/variant/v", operation="describe",
                                error="throttled").record() == {
        "resource_id": "endpoint/i/variant/v", "target": "intent",
        "failures": [{"operation": "describe", "error": "throttled"}]}


def test_report_sums_the_targets_and_names_every_skipped_entry(
        calendar_yaml: Callable[..., str], models: dict[str, CapacityModel]) -> None:
    text = calendar_yaml(dated=[
        {"id": "one-piece", "date": "2026-12-06", "start": "20:00"},
        {"id": "quiet", "date": "2026-12-08", "start": "20:00", "multiplier": 0.5},
        {"id": "broken", "date": "2026-12-07", "start": "20:00", "multiplier": "lots"},
        {"date": "2026-12-09", "start": "20:00"}])
    run = run_of(text, models)
    plan = run.plan_for("llm", [existing("calendar-dated-old-restore", "at(x)")])
    report = run_report(run, [outcome(plan)], environment="dev", dry_run=True)
    assert report["message"] == "release calendar dry run"
    assert (report["environment"], report["source"], report["horizon_days"]) == (
        "dev", "test.yaml", 14)
    assert report["now"] == "2026-11-30T03:00:00+09:00"
    assert report["planned"] == {"create": 4, "update": 0, "delete": 0}
    assert report["counts"] == {"created": 0, "updated": 0, "deleted": 0, "unchanged": 0,
                                "failed": 0, "skipped_entries": 2}
    assert [e["where"] for e in report["skipped_entries"]] == [
        "dated[2] (broken).multiplier", "dated[3].id"]
    assert report["deletions_held_back"] is True
    assert [w["event_id"] for w in report["warnings"]] == ["quiet"]
    assert [t["target"] for t in report["targets"]] == ["llm"]
    assert report["targets"][0]["protected"] == ["calendar-dated-old-restore"]
    applied = run_report(run, [outcome(plan)], environment="dev", dry_run=False)
    assert applied["message"] == "release calendar reconciled"
    assert applied["counts"]["created"] == 4


def test_issue_record_is_what_the_log_shows() -> None:
    issue = CalendarIssue(Severity.ERROR, "dated[0] (x).start", "bad", "x")
    assert issue_record(issue) == {"event_id": "x", "where": "dated[0] (x).start",
                                   "message": "bad"}
