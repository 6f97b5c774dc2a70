"""The reconciler's pure diff: only its own names, protected events, held-back deletions."""

from __future__ import annotations

import pytest

from release_calendar import (
    ActionRole,
    ExistingScheduledAction,
    ScheduledCapacity,
    dated_event_id,
    plan_reconciliation,
)


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
