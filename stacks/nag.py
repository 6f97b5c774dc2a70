"""cdk-nag on every synth, and the one way this app acknowledges a finding.

cdk-nag 3.x runs as a CDK policy-validation plugin: an unacknowledged finding fails synthesis and
writes ``validation-report.json`` into the cloud assembly. A finding is acknowledged on one
construct at a time, with a reason a reviewer can judge; there are no stack- or app-wide
suppressions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

NAG_PACK = "AwsSolutions"
MIN_REASON_CHARS = 40
GRANULAR_RULES = frozenset({"AwsSolutions-IAM4", "AwsSolutions-IAM5"})


def add_nag_checks(app: cdk.App) -> None:
    """Register the AwsSolutions pack on the whole app (every stage and stack)."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(
    construct: IConstruct, rule: str, reason: str, *, applies_to: Sequence[str] = ()
) -> None:
    """Acknowledge one AwsSolutions finding on one construct (and its children).

    ``rule`` is the rule id as cdk-nag prints it, e.g. ``AwsSolutions-S1``. Granular findings
    (IAM4/IAM5) are acknowledged one by one: ``applies_to`` lists their details as cdk-nag
    prints them between brackets (``Resource::*``, ``Action::s3:GetObject*``), and a blanket
    acknowledgement of a granular rule is refused.
    """
    if rule in GRANULAR_RULES and not applies_to:
        raise ValueError(f"acknowledge: {rule} is granular; name each finding in applies_to")
    if not rule.startswith(f"{NAG_PACK}-"):
        raise ValueError(f"acknowledge: rule {rule!r} is not an {NAG_PACK} rule id")
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(
            f"acknowledge: the reason for {rule} on {construct.node.path} must explain the "
            f"exception to a reviewer (at least {MIN_REASON_CHARS} characters)"
        )
    ids = [f"{rule}[{detail}]" for detail in applies_to] if applies_to else [rule]
    cdk.Validations.of(construct).acknowledge(
        *(cdk.Acknowledgment(id=f"{NAG_PACK}::{rule_id}", reason=reason.strip()) for rule_id in ids)
    )


def summarize_validation_report(outdir: str | Path) -> str:
    """Render cdk-nag's validation report as one line per finding, for a failed synth."""
    report_path = Path(outdir) / "validation-report.json"
    if not report_path.is_file():
        return f"policy validation failed; no report at {report_path}"
    report = json.loads(report_path.read_text(encoding="utf-8"))
    lines: list[str] = []
    for plugin in report.get("pluginReports", []):
        for violation in plugin.get("violations", []):
            for construct in violation.get("violatingConstructs", []):
                lines.append(
                    f"{violation['ruleName']}: {construct['constructPath']}: "
                    f"{violation['description']}"
                )
    if not lines:
        return f"policy validation failed; see {report_path}"
    return (
        f"cdk-nag found {len(lines)} unacknowledged finding(s) (report: {report_path}):\n"
        + "\n".join(f"  {line}" for line in lines)
    )
