"""Reading calendar files: good entries are kept, every bad field is reported with the event's
name, the field, the value and what is accepted."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from release_calendar import (
    CalendarError,
    EventKind,
    Severity,
    Weekday,
    calendar_json,
    parse_calendar,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "config" / "release_calendar.yaml"


def test_shipped_calendar_parses_cleanly() -> None:
    parsed = parse_calendar(SHIPPED.read_text(encoding="utf-8"), source=str(SHIPPED))
    assert parsed.issues == ()
    calendar = parsed.calendar
    assert calendar.timezone == "Asia/Tokyo"
    jump = calendar.recurring[0]
    assert (jump.event_id, jump.weekdays, jump.start, jump.multiplier, jump.lead_time_min) == (
        "shonen-jump", (Weekday.MON,), dt.time(18), 2.0, 120)
    assert [e.event_id for e in calendar.recurring] == [
        "shonen-jump", "shonen-magazine", "friday-release-window"]
    assert {(e.month, e.day, e.multiplier) for e in calendar.seasonal} == {(4, 1, 2.5),
                                                                           (10, 1, 2.5)}
    one_piece = calendar.dated[0]
    assert (one_piece.date, one_piece.start, one_piece.multiplier, one_piece.kind) == (
        dt.date(2026, 12, 6), dt.time(20), 3.0, EventKind.DATED)


def test_every_bad_field_is_reported_and_good_entries_survive(
        calendar_yaml: Callable[..., str]) -> None:
    text = calendar_yaml(recurring=[
        {"id": "good", "weekdays": ["MON"], "start": "18:00"},
        {"id": "bad-time", "weekdays": ["TUE"], "start": "25:00"},
        {"id": "bad-many", "weekdays": ["XYZ"], "start": "18:00", "multiplier": -1,
         "targets": ["gpu"], "lead_time_min": 5000, "colour": "red"},
    ], dated=[{"id": "Bad Id", "date": "2026-13-01", "start": "20:00"}])
    parsed = parse_calendar(text, source="cal.yaml")
    assert [e.event_id for e in parsed.calendar.recurring] == ["good"]
    assert parsed.skipped_event_ids == {"bad-time", "bad-many"}
    assert parsed.unidentified_skips == 1
    messages = [str(i) for i in parsed.errors]
    expected = [
        "recurring[1] (bad-time).start: got '25:00', which is not a time of day",
        "recurring[2] (bad-many).colour: unknown key; accepted in recurring: weekdays, id",
        "recurring[2] (bad-many).weekdays: got 'XYZ' in ['XYZ']; accepted",
        "recurring[2] (bad-many).multiplier: got -1; accepted: a number above 0",
        "recurring[2] (bad-many).targets: got ['gpu']; accepted: a non-empty list of distinct "
        "names from ['llm', 'intent']",
        "recurring[2] (bad-many).lead_time_min: got 5000; accepted: an integer from 0 to 1440",
        "dated[0].id: got 'Bad Id'; accepted: 1-48 lower-case letters",
        "dated[0].date: got '2026-13-01'; accepted: a calendar date 'YYYY-MM-DD'",
    ]
    for fragment in expected:
        assert any(fragment in message for message in messages), (fragment, messages)


def test_unquoted_time_gets_a_hint(calendar_yaml: Callable[..., str]) -> None:
    text = calendar_yaml(recurring=[{"id": "jump", "weekdays": ["MON"], "start": "18:00"}])
    text = text.replace("'18:00'", "18:00")
    parsed = parse_calendar(text)
    assert "got the number 1080: unquoted, YAML reads 18:00 as a base-60 number; accepted: a " \
           "quoted 24-hour local time such as '18:00'" in str(parsed.errors[0])


@pytest.mark.parametrize(
    ("entry", "field", "fragment"),
    [({"month": 2, "day": 30}, "day", "February has no day 30"),
     ({"month": 2, "day": 29}, "day", "February 29 only exists in leap years"),
     ({"month": 13, "day": 1}, "month", "got 13; accepted: an integer from 1 to 12"),
     ({"month": 4, "day": 1, "min_capacity": 9, "max_capacity": 3}, "min_capacity",
      "9 is above max_capacity 3"),
     ({"month": 4, "day": 1, "duration_min": 0}, "duration_min", "got 0; accepted"),
     ({"month": 4, "day": 1, "priority": True}, "priority", "got True; accepted: an integer"),
     ({"day": 1}, "month", "is required")],
)
def test_seasonal_field_errors(calendar_yaml: Callable[..., str], entry: dict[str, object],
                               field: str, fragment: str) -> None:
    text = calendar_yaml(seasonal=[{"id": "season", "start": "11:00", **entry}])
    errors = parse_calendar(text).errors
    assert any(e.where == f"seasonal[0] (season).{field}" and fragment in e.message
               for e in errors), [str(e) for e in errors]
    assert all(e.event_id == "season" for e in errors)


def test_missing_required_fields_are_each_named(calendar_yaml: Callable[..., str]) -> None:
    text = 'version: 1\ntimezone: Asia/Tokyo\ndated:\n  - id: lonely\n'
    errors = {e.where: e.message for e in parse_calendar(text).errors}
    for field in ("start", "duration_min", "multiplier", "targets", "date"):
        assert errors[f"dated[0] (lonely).{field}"] == "is required"


def test_duplicate_ids_are_refused(calendar_yaml: Callable[..., str]) -> None:
    text = calendar_yaml(recurring=[{"id": "x", "weekdays": ["MON"], "start": "18:00"}],
                         dated=[{"id": "x", "date": "2026-12-06", "start": "20:00"}])
    parsed = parse_calendar(text)
    assert [e.event_id for e in parsed.calendar.events] == ["x"]
    assert "'x' is already used by recurring[0] (x)" in str(parsed.errors[0])


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("version: 1\ntimezone: Asia/Tokyo\nrecurring: [\n", "does not parse as YAML at line"),
     ("- just a list\n", "got list; accepted: a mapping with keys version, timezone"),
     ("version: 1\ntimezone: Mars/Olympus\n", "timezone: 'Mars/Olympus' is not an IANA time zone"),
     ("version: 2\ntimezone: Asia/Tokyo\n", "version: got 2; accepted: 1"),
     ("version: 1\ntimezone: Asia/Tokyo\nrecuring: []\n", "unknown key(s) ['recuring']"),
     ("version: 1\ntimezone: Asia/Tokyo\ndated: {}\n", "dated: got dict; accepted: a list")],
)
def test_document_level_problems_are_fatal(text: str, fragment: str) -> None:
    with pytest.raises(CalendarError) as caught:
        parse_calendar(text, source="cal.yaml")
    assert str(caught.value).startswith("cal.yaml: ")
    assert fragment in str(caught.value)


def test_all_fatal_problems_are_reported_together() -> None:
    with pytest.raises(CalendarError) as caught:
        parse_calendar("version: 3\ntimezone: Nowhere\nextra: 1\n")
    assert len(caught.value.issues) == 3


def test_zone_with_daylight_saving_is_a_warning(calendar_yaml: Callable[..., str]) -> None:
    parsed = parse_calendar(calendar_yaml(timezone="Europe/Berlin"))
    assert [i.severity for i in parsed.issues] == [Severity.WARNING]
    assert "Europe/Berlin changes its UTC offset" in parsed.issues[0].message


def test_json_copy_for_the_lambda_reads_without_pyyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    text = calendar_json(SHIPPED.read_text(encoding="utf-8"))
    assert json.loads(text)["dated"][0]["date"] == "2026-12-06"
    with_yaml = parse_calendar(SHIPPED.read_text(encoding="utf-8"))
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    assert parse_calendar(text) == with_yaml
    with pytest.raises(CalendarError, match="this runtime has no PyYAML, so upload the calendar"):
        parse_calendar(SHIPPED.read_text(encoding="utf-8"))


def test_json_copy_refuses_an_invalid_calendar(calendar_yaml: Callable[..., str]) -> None:
    with pytest.raises(CalendarError, match=r"recurring\[0\] \(x\)\.start"):
        calendar_json(calendar_yaml(recurring=[{"id": "x", "weekdays": ["MON"], "start": "9"}]))
