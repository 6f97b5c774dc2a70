"""The release-calendar Lambda against moto: S3/SSM for the calendar, Application Auto Scaling
(sagemaker namespace, scheduled actions with Timezone) for the actions it reconciles."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from lambdas.release_calendar import handler as calendar_lambda
from release_calendar import (
    CalendarError,
    CapacityModel,
    DailyFloor,
    calendar_json,
    capacity_models_to_json,
)
from tests.support.aws import fake_credentials

SHIPPED = Path(__file__).resolve().parents[3] / "config" / "release_calendar.yaml"
LLM = "endpoint/mangaassist-llm-dev/variant/AllTraffic"
INTENT = "endpoint/mangaassist-intent-dev/variant/AllTraffic"
BUCKET, KEY = "mangaassist-artifacts-dev", "config/release_calendar.yaml"
JST = dt.timezone(dt.timedelta(hours=9))
NOW = dt.datetime(2026, 11, 30, 3, 0, tzinfo=JST)  # One Piece (2026-12-06) is 6 days ahead


def model(base: float, per_instance: float, max_capacity: int,
          business_min: int) -> CapacityModel:
    return CapacityModel(
        base_invocations_per_min=base, per_instance_invocations_per_min=per_instance,
        headroom=0.3, min_capacity=2, max_capacity=max_capacity, timezone="Asia/Tokyo",
        off_peak=DailyFloor("off-peak", dt.time(1), 2, min(6, max_capacity)),
        business_hours=DailyFloor("business-hours", dt.time(8), business_min, max_capacity))


MODELS = {"llm": model(600, 200, 20, 4), "intent": model(600, 1200, 8, 2)}


def calendar_document(**changes: Any) -> dict[str, Any]:
    document = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    document["dated"].append({"id": "jjk-finale", "date": "2026-12-03", "start": "19:00",
                              "duration_min": 90, "multiplier": 2.5, "targets": ["llm"]})
    for event_id, fields in changes.items():
        entry = next(e for e in document["dated"] if e.get("id") == event_id)
        entry.update(fields)
    return document


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    fake_credentials(monkeypatch, CALENDAR_BUCKET=BUCKET, CALENDAR_KEY=KEY,
                     CALENDAR_CAPACITY_MODELS=capacity_models_to_json(MODELS),
                     SCALABLE_TARGET_LLM=LLM, SCALABLE_TARGET_INTENT=INTENT,
                     HORIZON_DAYS="14", ENVIRONMENT="dev")
    monkeypatch.delenv("DRY_RUN", raising=False)
    monkeypatch.delenv("CALENDAR_PARAMETER", raising=False)
    monkeypatch.setattr(calendar_lambda, "utc_now", lambda: NOW.astimezone(dt.UTC))
    with mock_aws():
        aas = boto3.client("application-autoscaling")
        for resource_id in (LLM, INTENT):
            aas.register_scalable_target(
                ServiceNamespace="sagemaker", ResourceId=resource_id,
                ScalableDimension="sagemaker:variant:DesiredInstanceCount",
                MinCapacity=2, MaxCapacity=20)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": "ap-northeast-1"})
        yield {"aas": aas, "s3": s3}


def upload(aws: dict[str, Any], document: dict[str, Any] | str) -> None:
    body = document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False)
    aws["s3"].put_object(Bucket=BUCKET, Key=KEY, Body=body.encode("utf-8"))


def actions(aws: dict[str, Any], resource_id: str) -> dict[str, tuple[str, str, int, int]]:
    response = aws["aas"].describe_scheduled_actions(
        ServiceNamespace="sagemaker", ResourceId=resource_id,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount")
    return {a["ScheduledActionName"]: (a["Schedule"], a["Timezone"],
                                       a["ScalableTargetAction"]["MinCapacity"],
                                       a["ScalableTargetAction"]["MaxCapacity"])
            for a in response["ScheduledActions"]}


def put(aws: dict[str, Any], resource_id: str, name: str, schedule: str, low: int,
        high: int) -> None:
    aws["aas"].put_scheduled_action(
        ServiceNamespace="sagemaker", ResourceId=resource_id,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount", ScheduledActionName=name,
        Schedule=schedule, Timezone="Asia/Tokyo",
        ScalableTargetAction={"MinCapacity": low, "MaxCapacity": high})


def log_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


EXPECTED_LLM = {
    "calendar-dated-jjk-finale-prescale": ("at(2026-12-03T17:00:00)", "Asia/Tokyo", 10, 20),
    "calendar-dated-jjk-finale-restore": ("at(2026-12-03T20:30:00)", "Asia/Tokyo", 4, 20),
    "calendar-dated-one-piece-ch1100-prescale": ("at(2026-12-06T18:00:00)", "Asia/Tokyo", 12, 20),
    "calendar-dated-one-piece-ch1100-restore": ("at(2026-12-06T22:00:00)", "Asia/Tokyo", 4, 20),
}
EXPECTED_INTENT = {  # 600 × 3 / 1200 × 1.3 = 1.95 -> 2, the business-hours floor is 2 here
    "calendar-dated-one-piece-ch1100-prescale": ("at(2026-12-06T18:00:00)", "Asia/Tokyo", 2, 8),
    "calendar-dated-one-piece-ch1100-restore": ("at(2026-12-06T22:00:00)", "Asia/Tokyo", 2, 8),
}


def test_creates_the_dated_actions_and_reports_them(aws: dict[str, Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    upload(aws, calendar_document())
    summary = calendar_lambda.handler({}, None)
    assert actions(aws, LLM) == EXPECTED_LLM
    assert actions(aws, INTENT) == EXPECTED_INTENT
    assert summary["counts"] == {"created": 6, "updated": 0, "deleted": 0, "unchanged": 0,
                                 "failed": 0, "skipped_entries": 0}
    summary_line, metrics_line = log_lines(capsys)
    assert summary_line["message"] == "release calendar reconciled"
    assert summary_line["level"] == "INFO"
    assert [t["resource_id"] for t in summary_line["targets"]] == [INTENT, LLM]
    assert metrics_line["CalendarActionsCreated"] == 6
    assert metrics_line["CalendarEntriesSkipped"] == 0
    assert metrics_line["Environment"] == "dev"
    assert metrics_line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "MangaAssist/Inference"
    assert metrics_line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Environment"]]


def test_second_run_changes_nothing(aws: dict[str, Any]) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    second = calendar_lambda.handler({}, None)
    assert second["counts"] == {"created": 0, "updated": 0, "deleted": 0, "unchanged": 6,
                                "failed": 0, "skipped_entries": 0}
    assert actions(aws, LLM) == EXPECTED_LLM


def test_changed_event_is_updated(aws: dict[str, Any]) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    upload(aws, calendar_document(**{"one-piece-ch1100": {"multiplier": 4.0, "start": "21:00"}}))
    summary = calendar_lambda.handler({}, None)
    llm = actions(aws, LLM)
    assert llm["calendar-dated-one-piece-ch1100-prescale"] == (
        "at(2026-12-06T19:00:00)", "Asia/Tokyo", 16, 20)
    assert llm["calendar-dated-one-piece-ch1100-restore"] == (
        "at(2026-12-06T23:00:00)", "Asia/Tokyo", 4, 20)
    assert summary["counts"]["updated"] == 4
    assert summary["counts"]["created"] == 0


def test_deletes_only_its_own_removed_or_expired_actions(aws: dict[str, Any]) -> None:
    put(aws, LLM, "floor-off-peak", "cron(0 1 * * ? *)", 2, 6)  # the stack's
    put(aws, LLM, "manual-hotfix", "at(2026-12-01T10:00:00)", 6, 20)  # an operator's
    put(aws, LLM, "calendar-dated-cancelled-prescale", "at(2026-12-05T18:00:00)", 9, 20)
    put(aws, LLM, "calendar-dated-last-week-restore", "at(2026-11-25T22:00:00)", 4, 20)
    upload(aws, calendar_document())
    summary = calendar_lambda.handler({}, None)
    remaining = actions(aws, LLM)
    assert set(remaining) == {"floor-off-peak", "manual-hotfix", *EXPECTED_LLM}
    assert remaining["floor-off-peak"] == ("cron(0 1 * * ? *)", "Asia/Tokyo", 2, 6)
    assert summary["counts"]["deleted"] == 2
    llm_record = next(t for t in summary["targets"] if t["resource_id"] == LLM)
    assert llm_record["foreign_actions"] == 2


def test_past_actions_are_dropped_once_they_fired(aws: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    during = dt.datetime(2026, 12, 6, 19, 0, tzinfo=JST)
    monkeypatch.setattr(calendar_lambda, "utc_now", lambda: during.astimezone(dt.UTC))
    summary = calendar_lambda.handler({}, None)
    assert set(actions(aws, LLM)) == {"calendar-dated-one-piece-ch1100-restore"}
    assert summary["counts"]["deleted"] == 4  # jjk pair and one-piece pre-scale on llm, + intent


@pytest.mark.parametrize("how", ["event", "environment"])
def test_dry_run_reports_the_plan_and_changes_nothing(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        how: str) -> None:
    put(aws, LLM, "calendar-dated-cancelled-prescale", "at(2026-12-05T18:00:00)", 9, 20)
    upload(aws, calendar_document())
    event: dict[str, Any] = {}
    if how == "event":
        event = {"dry_run": True}
    else:
        monkeypatch.setenv("DRY_RUN", "true")
    before = actions(aws, LLM)
    summary = calendar_lambda.handler(event, None)
    assert actions(aws, LLM) == before
    assert actions(aws, INTENT) == {}
    assert summary["dry_run"] is True
    assert summary["planned"] == {"create": 6, "update": 0, "delete": 1}
    assert summary["counts"]["created"] == summary["counts"]["deleted"] == 0
    llm_record = next(t for t in summary["targets"] if t["resource_id"] == LLM)
    assert {a["name"] for a in llm_record["create"]} == set(EXPECTED_LLM)
    assert [a["name"] for a in llm_record["delete"]] == ["calendar-dated-cancelled-prescale"]
    summary_line, metrics_line = log_lines(capsys)
    assert summary_line["message"] == "release calendar dry run"
    assert metrics_line["CalendarActionsCreated"] == 0
    assert metrics_line["planned"]["create"] == 6


def test_broken_entry_is_skipped_and_its_actions_kept(aws: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    capsys.readouterr()
    document = calendar_document(**{"one-piece-ch1100": {"multiplier": "lots"}})
    document["dated"].append({"id": "chainsaw-man", "date": "2026-12-04", "start": "12:00",
                              "duration_min": 60, "multiplier": 2.0, "targets": ["llm"]})
    upload(aws, document)
    summary = calendar_lambda.handler({}, None)
    llm = actions(aws, LLM)
    for name, value in EXPECTED_LLM.items():
        assert llm[name] == value  # one-piece untouched, jjk unchanged
    assert llm["calendar-dated-chainsaw-man-prescale"] == (
        "at(2026-12-04T10:00:00)", "Asia/Tokyo", 8, 20)
    assert actions(aws, INTENT) == EXPECTED_INTENT
    assert summary["counts"]["skipped_entries"] == 1
    [skipped] = summary["skipped_entries"]
    assert skipped["event_id"] == "one-piece-ch1100"
    assert skipped["where"] == "dated[0] (one-piece-ch1100).multiplier"
    assert "got 'lots'; accepted: a number above 0" in skipped["message"]
    summary_line, metrics_line = log_lines(capsys)
    assert summary_line["level"] == "WARNING"
    assert metrics_line["CalendarEntriesSkipped"] == 1
    llm_record = next(t for t in summary["targets"] if t["resource_id"] == LLM)
    assert set(llm_record["protected"]) == {"calendar-dated-one-piece-ch1100-prescale",
                                            "calendar-dated-one-piece-ch1100-restore"}


def test_entry_without_an_id_holds_back_every_deletion(aws: dict[str, Any]) -> None:
    put(aws, LLM, "calendar-dated-cancelled-prescale", "at(2026-12-05T18:00:00)", 9, 20)
    document = calendar_document()
    document["dated"].append({"date": "2026-12-02", "start": "12:00"})
    upload(aws, document)
    summary = calendar_lambda.handler({}, None)
    assert "calendar-dated-cancelled-prescale" in actions(aws, LLM)
    assert summary["deletions_held_back"] is True
    assert summary["counts"]["skipped_entries"] == 1
    assert set(EXPECTED_LLM) <= set(actions(aws, LLM))


def test_unparseable_calendar_changes_nothing_and_fails(
        aws: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    capsys.readouterr()
    upload(aws, "version: 1\ntimezone: Asia/Tokyo\ndated: [\n  - id: x\n")
    with pytest.raises(CalendarError, match="does not parse as YAML"):
        calendar_lambda.handler({}, None)
    assert actions(aws, LLM) == EXPECTED_LLM
    [line] = log_lines(capsys)
    assert line["level"] == "ERROR"
    assert line["message"].endswith("nothing changed")


def test_time_zone_mismatch_with_settings_changes_nothing(aws: dict[str, Any]) -> None:
    upload(aws, calendar_document())
    calendar_lambda.handler({}, None)
    document = calendar_document()
    document["timezone"] = "Asia/Seoul"
    upload(aws, document)
    with pytest.raises(CalendarError, match="differs from target"):
        calendar_lambda.handler({}, None)
    assert actions(aws, LLM) == EXPECTED_LLM


def test_reads_json_from_ssm_without_pyyaml(aws: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    text = calendar_json(yaml.safe_dump(calendar_document()))
    boto3.client("ssm").put_parameter(Name="/mangaassist/dev/release-calendar", Value=text,
                                      Type="String")
    monkeypatch.delenv("CALENDAR_BUCKET")
    monkeypatch.delenv("CALENDAR_KEY")
    monkeypatch.setenv("CALENDAR_PARAMETER", "/mangaassist/dev/release-calendar")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as in the Lambda runtime
    summary = calendar_lambda.handler({}, None)
    assert summary["source"] == "ssm:/mangaassist/dev/release-calendar"
    assert actions(aws, LLM) == EXPECTED_LLM


def test_unregistered_target_is_reported_and_the_other_still_applied(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALABLE_TARGET_INTENT", "endpoint/not-there/variant/AllTraffic")
    upload(aws, calendar_document())
    with pytest.raises(RuntimeError, match="1 scheduled-action call"):
        calendar_lambda.handler({}, None)
    assert actions(aws, LLM) == EXPECTED_LLM


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [({"CALENDAR_BUCKET": None}, "CALENDAR_BUCKET and CALENDAR_KEY (or CALENDAR_PARAMETER) are "
                                 "required"),
     ({"CALENDAR_PARAMETER": "/x"}, "not both"),
     ({"SCALABLE_TARGET_LLM": "llm-endpoint"}, "SCALABLE_TARGET_LLM='llm-endpoint': accepted: "
                                               "'endpoint/<endpoint-name>/variant/<variant-name>'"),
     ({"HORIZON_DAYS": "400"}, "HORIZON_DAYS='400': accepted: 1-90"),
     ({"DRY_RUN": "maybe"}, "DRY_RUN='maybe': accepted: true or false"),
     ({"ENVIRONMENT": None}, "ENVIRONMENT='': accepted"),
     ({"CALENDAR_CAPACITY_MODELS": '{"llm": {}}'}, "CALENDAR_CAPACITY_MODELS.llm: missing"),
     ({"CALENDAR_CAPACITY_MODELS": capacity_models_to_json({"llm": MODELS["llm"]})},
      "SCALABLE_TARGET_INTENT is set but CALENDAR_CAPACITY_MODELS has no model for 'intent'")],
)
def test_misconfiguration_names_the_variable(changes: dict[str, str | None],
                                             fragment: str) -> None:
    env = {"CALENDAR_BUCKET": BUCKET, "CALENDAR_KEY": KEY,
           "CALENDAR_CAPACITY_MODELS": capacity_models_to_json(MODELS),
           "SCALABLE_TARGET_LLM": LLM, "SCALABLE_TARGET_INTENT": INTENT, "ENVIRONMENT": "dev"}
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(calendar_lambda.ConfigurationError) as caught:
        calendar_lambda.ReconcilerConfig.from_env(env)
    assert fragment in str(caught.value)


class RacingClient:
    """The moto client, except that one action was deleted by an overlapping run meanwhile
    (moto itself does not raise for a missing action; the real API raises
    ObjectNotFoundException), and one delete is refused."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def delete_scheduled_action(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        name = kwargs["ScheduledActionName"]
        if "already-deleted" in name:
            raise ClientError({"Error": {"Code": "ObjectNotFoundException",
                                         "Message": "No scheduled action found"}},
                              "DeleteScheduledAction")
        if "refused" in name:
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "no"}},
                              "DeleteScheduledAction")
        return self.real.delete_scheduled_action(**kwargs)


def test_deleting_an_action_an_overlapping_run_already_removed_is_not_a_failure(
    aws: dict[str, Any],
) -> None:
    from release_calendar import ExistingScheduledAction, ReconcilePlan

    def existing(name: str) -> ExistingScheduledAction:
        return ExistingScheduledAction(name=name, schedule="at(2026-12-01T10:00:00)",
                                       timezone="Asia/Tokyo", min_capacity=4, max_capacity=20)

    put(aws, LLM, "calendar-dated-gone-prescale", "at(2026-12-01T10:00:00)", 4, 20)
    plan = ReconcilePlan(target="llm", delete=(
        existing("calendar-dated-already-deleted-prescale"),
        existing("calendar-dated-gone-prescale"),
        existing("calendar-dated-refused-prescale")))
    failures = calendar_lambda.apply_plan(RacingClient(aws["aas"]), LLM, plan)
    assert [f["action"] for f in failures] == ["calendar-dated-refused-prescale"]
    assert "calendar-dated-gone-prescale" not in actions(aws, LLM)
