"""cdk-nag on every synth, cfn-lint on every template, clean errors from app.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks

from stacks.nag import acknowledge, summarize_validation_report

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_nag_ran_and_found_nothing_unacknowledged(synthesized) -> None:  # type: ignore[no-untyped-def]
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    assert {p["pluginName"] for p in report["pluginReports"]} == {
        "AwsSolutions", "cdk-validator-cfnguard"}
    violations = [
        v for plugin in report.get("pluginReports", []) for v in plugin.get("violations", [])
    ]
    assert violations == []


def acknowledgements(outdir: Path) -> list[tuple[str, str, str]]:
    """(construct path, rule, reason) for every acknowledged finding in the assembly."""
    found: list[tuple[str, str, str]] = []
    for metadata_file in outdir.glob("assembly-*/*.metadata.json"):
        for path, entries in json.loads(metadata_file.read_text()).items():
            for entry in entries:
                if entry.get("type") == "aws:cdk:acknowledged-rules":
                    # aws-cdk-lib acknowledges some of its own cfn-lint rules; only ours count.
                    found.extend((path, rule, reason) for rule, reason in entry["data"].items()
                                 if rule.startswith("AwsSolutions::"))
    return found


def test_every_acknowledgement_is_on_one_resource_with_a_reason(synthesized) -> None:  # type: ignore[no-untyped-def]
    found = acknowledgements(synthesized.outdir)
    assert found, "the access-log bucket's S1 acknowledgement should be recorded"
    stack_paths = {f"/{name}" for name in synthesized.templates}
    for path, rule, reason in found:
        assert rule.startswith("AwsSolutions::AwsSolutions-"), rule
        assert "[" in rule or rule.split("::")[1] not in {"AwsSolutions-IAM4", "AwsSolutions-IAM5"}
        assert path not in stack_paths, f"{rule} is acknowledged for a whole stack ({path})"
        assert len(reason) >= 40, f"{rule} on {path}: reason too short: {reason!r}"


def unacknowledged_app(outdir: Path, *, with_ack: bool) -> cdk.App:
    app = cdk.App(outdir=str(outdir))
    stage = cdk.Stage(app, "Check")
    stack = cdk.Stack(stage, "Bare")
    bucket = s3.Bucket(stack, "NoLogs", enforce_ssl=True)
    if with_ack:
        acknowledge(bucket, "AwsSolutions-S1", "A scratch bucket in a test, deleted with the stack.")
    # cdk-nag alone: a bare bucket also fails a dozen Control Tower controls
    # (tests/stacks/test_control_tower.py covers those).
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def test_an_unacknowledged_finding_fails_synth(tmp_path: Path) -> None:
    app = unacknowledged_app(tmp_path, with_ack=False)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    summary = summarize_validation_report(tmp_path)
    assert "AwsSolutions-S1: Check/Bare/NoLogs/Resource" in summary
    assert "server access logs disabled" in summary


def test_acknowledging_with_a_reason_lets_synth_pass(tmp_path: Path) -> None:
    unacknowledged_app(tmp_path, with_ack=True).synth()


def test_acknowledgement_needs_a_real_reason_and_a_rule_id() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    bucket = s3.Bucket(stack, "B")
    with pytest.raises(ValueError, match="must explain the exception"):
        acknowledge(bucket, "AwsSolutions-S1", "ok")
    with pytest.raises(ValueError, match="not an AwsSolutions rule id"):
        acknowledge(bucket, "S1", "A long enough reason that would otherwise be accepted.")


def test_cfn_lint_passes_on_every_template(synthesized) -> None:  # type: ignore[no-untyped-def]
    paths = [str(p) for p in synthesized.template_paths.values()]
    assert len(paths) >= 2
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--ignore-checks", "W3005", "--", *paths],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_config_fails_app_py_with_a_one_line_error(tmp_path: Path) -> None:
    for name in ("dev", "prod"):
        text = (REPO_ROOT / "config" / f"{name}.yaml").read_text()
        if name == "prod":
            text = text.replace("noncurrent_version_expiration_days: 90",
                                "noncurrent_version_expiration_days: -5")
        (tmp_path / f"{name}.yaml").write_text(text)
    env = {**os.environ, "MANGAASSIST_CONFIG_DIR": str(tmp_path),
           "CDK_OUTDIR": str(tmp_path / "out")}
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: {tmp_path / 'prod.yaml'}: artifacts.noncurrent_version_expiration_days: -5 is not accepted: "
        "Input should be greater than or equal to 1"
    ], result.stderr
    assert "Traceback" not in result.stderr
