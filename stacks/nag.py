"""cdk-nag and AWS Control Tower's proactive controls on every synth, and the one way this app
acknowledges a finding (cdk-nag's, cfn-guard's or checkov's).

cdk-nag 3.x and ``cdklabs.cdk-validator-cfnguard`` (cfn-guard with the Control Tower proactive
controls' rules, bundled and run offline) are CDK policy-validation plugins: an unacknowledged
finding of either fails synthesis, and both write into the cloud assembly's
``validation-report.json`` (what was found, and what was acknowledged with which reason).
checkov scans the synthesized templates afterwards (``make synth``, ``checks/checkov_scan.py``);
it reads its acknowledgements from each resource's ``Metadata: checkov: skip:`` list, which
:func:`acknowledge_checkov` writes. Every kind of finding is acknowledged on one resource at a
time, with a reason a reviewer can judge; there are no stack- or app-wide suppressions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from cdklabs.cdk_validator_cfnguard import CfnGuardValidator
from constructs import IConstruct

from stacks.validation_rules import (
    GUARD_CONTROLS,
    GUARD_PLUGIN,
    MIN_REASON_CHARS,
    NAG_PACK,
    UNREADABLE_VALUE,
)

GRANULAR_RULES = frozenset({"AwsSolutions-IAM4", "AwsSolutions-IAM5"})
CHECKOV_CHECK_ID = re.compile(r"^CKV2?_AWS_[0-9]+$")
"""checkov's ids for AWS CloudFormation checks (CKV_AWS_116, CKV2_AWS_5)."""


def add_nag_checks(app: cdk.App) -> None:
    """Register the AwsSolutions pack and Control Tower's proactive controls on the whole app."""
    validations = cdk.Validations.of(app)
    validations.add_plugins(AwsSolutionsChecks(app))
    # The guard plugin implements the Beta1 interface, which add_plugins accepts at run time
    # (jsii checks the shape, not the name); its type hints say IPolicyValidationPlugin.
    guard = CfnGuardValidator(control_tower_rules_enabled=True)
    validations.add_plugins(cast(cdk.IPolicyValidationPlugin, guard))


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


def acknowledge_guard(construct: IConstruct, control: str, reason: str, *,
                      unreadable_value: str | None = None) -> None:
    """Acknowledge one Control Tower proactive control (cfn-guard) on one construct, with a reason.

    ``control`` is the control's id as Control Tower names it (``CT.LAMBDA.PR.3``).
    ``unreadable_value`` names the property a rule cannot read (its value is an intrinsic the
    rule does not resolve); the reason then says so first, and a test checks that the property
    is really set on the resource.
    """
    rule = GUARD_CONTROLS.get(control)
    if rule is None:
        raise ValueError(f"acknowledge_guard: control {control!r} is not accepted; accepted: "
                         f"{', '.join(sorted(GUARD_CONTROLS))} (add its rule to GUARD_CONTROLS)")
    text = reason.strip()
    if len(text) < MIN_REASON_CHARS:
        raise ValueError(
            f"acknowledge_guard: the reason for {control} on {construct.node.path} must explain "
            f"the exception to a reviewer (at least {MIN_REASON_CHARS} characters)")
    if unreadable_value is not None:
        text = f"{UNREADABLE_VALUE} ({unreadable_value}): {text}"
    cdk.Validations.of(construct).acknowledge(
        cdk.Acknowledgment(id=f"{GUARD_PLUGIN}::{rule}", reason=f"[{control}] {text}"))


def acknowledge_checkov(construct: IConstruct, check_id: str, reason: str) -> None:
    """Acknowledge one checkov finding on one CloudFormation resource, with a reason.

    ``construct`` is the resource (a ``CfnResource``) or an L2 construct whose default child is
    one. The acknowledgement is the resource's ``Metadata.checkov.skip`` entry
    ``{"id": check_id, "comment": reason}``, which checkov reports as a skipped check with that
    comment; acknowledging the same check twice on a resource is refused.
    """
    if not CHECKOV_CHECK_ID.match(check_id):
        raise ValueError(
            f"acknowledge_checkov: check id {check_id!r} is not accepted; accepted: checkov's AWS "
            "ids such as CKV_AWS_116 or CKV2_AWS_5"
        )
    resource = construct if isinstance(construct, cdk.CfnResource) else construct.node.default_child
    if not isinstance(resource, cdk.CfnResource):
        raise ValueError(
            f"acknowledge_checkov: {construct.node.path} is not a CloudFormation resource and has "
            "no default child that is one; pass the resource itself"
        )
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(
            f"acknowledge_checkov: the reason for {check_id} on {resource.node.path} must explain "
            f"the exception to a reviewer (at least {MIN_REASON_CHARS} characters)"
        )
    existing = resource.get_metadata("checkov") or {}
    skips = list(existing.get("skip", []))
    if any(entry.get("id") == check_id for entry in skips):
        raise ValueError(f"acknowledge_checkov: {check_id} is already acknowledged on "
                         f"{resource.node.path}")
    skips.append({"id": check_id, "comment": reason.strip()})
    resource.add_metadata("checkov", {**existing, "skip": skips})


def summarize_validation_report(outdir: str | Path) -> str:
    """Render the validation report (cdk-nag, cfn-guard) as one line per finding, for a failed
    synth."""
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
    plugins = sorted({plugin.get("pluginName", "?") for plugin in report.get("pluginReports", [])
                      if plugin.get("violations")})
    return (
        f"policy validation ({', '.join(plugins)}) found {len(lines)} unacknowledged "
        f"finding(s) (report: {report_path}):\n" + "\n".join(f"  {line}" for line in lines)
    )
