"""checkov on every synthesized template: no failed check, and every skip acknowledged on its
resource with a reason (stacks.nag.acknowledge_checkov), as ``make synth`` runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from checks.checkov_scan import (
    DEFAULT_CHECKOV,
    MIN_REASON_CHARS,
    CheckovError,
    main,
    parse_report,
    run_checkov,
)
from stacks.nag import acknowledge_checkov


@pytest.fixture(scope="session")
def checkov() -> Path:
    if DEFAULT_CHECKOV.is_file():
        return DEFAULT_CHECKOV
    message = (f"checkov is not installed at {DEFAULT_CHECKOV}: "
               "`make .venv-checkov/.installed` (make test builds it)")
    if os.environ.get("MANGAASSIST_REQUIRE_CHECKOV") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def report(synthesized: Any, checkov: Path) -> Any:
    return run_checkov(sorted(synthesized.template_paths.values()), checkov=checkov)


def test_checkov_finds_nothing_unacknowledged_on_every_template(synthesized: Any,
                                                                report: Any) -> None:
    assert report.templates == len(synthesized.template_paths) == 4
    assert report.resources > 100 and report.passed > 200, report.summary_line()
    assert [str(f) for f in report.failed] == []


def test_every_checkov_skip_has_a_reason(report: Any) -> None:
    assert report.skipped, "the access-log bucket and CDK's provider are acknowledged"
    assert report.unexplained_skips == ()
    assert all(len(s.comment) >= MIN_REASON_CHARS for s in report.skipped)


def test_what_was_real_is_fixed_not_skipped(report: Any) -> None:
    skipped = {(s.check_id, s.resource.split(".")[1]) for s in report.skipped}
    for check in ("CKV_AWS_173", "CKV_AWS_111"):  # env encryption, IAM writes unconstrained
        assert not [r for c, r in skipped if c == check], check
    calendar = {c for c, r in skipped if r.startswith("ReleaseCalendarFunction")}
    # DLQ: kept in an on-failure destination checkov does not recognise, said so in the reason.
    assert calendar == {"CKV_AWS_116", "CKV_AWS_117", "CKV_AWS_115"}
    assert {r for c, r in skipped if c == "CKV_AWS_18"} == {"ModelArtifactsAccessLogs261D498C"}


def test_the_summary_line_is_what_make_synth_prints(report: Any) -> None:
    line = report.summary_line()
    assert line.startswith("checkov 3.3.30: ") and ", 0 failed, " in line
    assert line.endswith(f"{len(report.skipped)} skipped ({len(report.skipped)} with a reason)")


# --- the wrapper on checkov's own output, findings and skips included ------------------------
def check(check_id: str, resource: str, comment: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"result": "SKIPPED" if comment is not None else "FAILED"}
    if comment is not None:
        result["suppress_comment"] = comment
    return {"check_id": check_id, "check_name": f"name of {check_id}", "resource": resource,
            "file_abs_path": "/x/Prod.template.json", "check_result": result}


def test_a_failed_check_or_an_unexplained_skip_fails_the_scan() -> None:
    output = json.dumps({"check_type": "cloudformation", "summary": {
        "passed": 5, "failed": 1, "skipped": 2, "resource_count": 3, "checkov_version": "3.3.30"},
        "results": {"failed_checks": [check("CKV_AWS_116", "AWS::Lambda::Function.Fn")],
                    "skipped_checks": [check("CKV_AWS_18", "AWS::S3::Bucket.Logs", "ok"),
                                       check("CKV_AWS_117", "AWS::Lambda::Function.Fn",
                                             "x" * MIN_REASON_CHARS)]}})
    report = parse_report(output, templates=1)
    assert not report.clean
    assert report.problems() == [
        "failed: CKV_AWS_116 AWS::Lambda::Function.Fn (Prod.template.json): name of CKV_AWS_116",
        f"skipped without a reason of {MIN_REASON_CHARS}+ characters: CKV_AWS_18 "
        "AWS::S3::Bucket.Logs (Prod.template.json): name of CKV_AWS_18 (comment 'ok')"]
    assert report.summary_line() == ("checkov 3.3.30: 3 resources in 1 templates, 5 passed, "
                                     "1 failed, 2 skipped (1 with a reason)")


def test_output_that_is_not_a_report_is_an_error() -> None:
    with pytest.raises(CheckovError, match="printed no JSON report"):
        parse_report("Traceback (most recent call last): ...", templates=1)


def test_the_cli_exits_1_on_a_finding(tmp_path: Path, checkov: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Bare")
    s3.Bucket(stack, "NoLogs", enforce_ssl=True)
    acknowledged = s3.Bucket(stack, "Acknowledged", enforce_ssl=True)
    acknowledge_checkov(acknowledged, "CKV_AWS_18",
                        "A scratch bucket in a test, deleted with the stack it lives in.")
    app.synth()
    template = tmp_path / "Bare.template.json"
    assert main(["--checkov", str(checkov), str(template)]) == 1
    captured = capsys.readouterr()
    assert "failed: CKV_AWS_18 AWS::S3::Bucket.NoLogs" in captured.err
    assert "CKV_AWS_18 AWS::S3::Bucket.Acknowledged" not in captured.err
    assert "1 skipped (1 with a reason)" in captured.out


# --- the acknowledgement helper ------------------------------------------------------------
def test_acknowledge_checkov_writes_the_resource_metadata_checkov_reads() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    bucket = s3.Bucket(stack, "B")
    acknowledge_checkov(bucket, "CKV_AWS_18", "A reason long enough to explain it to a reviewer.")
    acknowledge_checkov(bucket, "CKV_AWS_21", "Another reason long enough to explain it as well.")
    resource = bucket.node.default_child
    assert isinstance(resource, cdk.CfnResource)
    assert resource.get_metadata("checkov") == {"skip": [
        {"id": "CKV_AWS_18", "comment": "A reason long enough to explain it to a reviewer."},
        {"id": "CKV_AWS_21", "comment": "Another reason long enough to explain it as well."}]}


@pytest.mark.parametrize(("check_id", "reason", "message"), [
    ("CKV_AWS_18", "too short", "must explain the exception"),
    ("AwsSolutions-S1", "A reason long enough to explain it to a reviewer.",
     "check id 'AwsSolutions-S1' is not accepted"),
])
def test_acknowledge_checkov_needs_a_check_id_and_a_reason(check_id: str, reason: str,
                                                           message: str) -> None:
    bucket = s3.Bucket(cdk.Stack(cdk.App(), "S"), "B")
    with pytest.raises(ValueError, match=message):
        acknowledge_checkov(bucket, check_id, reason)


def test_acknowledge_checkov_refuses_a_second_skip_of_the_same_check() -> None:
    bucket = s3.Bucket(cdk.Stack(cdk.App(), "S"), "B")
    acknowledge_checkov(bucket, "CKV_AWS_18", "A reason long enough to explain it to a reviewer.")
    with pytest.raises(ValueError, match="already acknowledged"):
        acknowledge_checkov(bucket, "CKV_AWS_18", "A second reason, just as long as the first.")
