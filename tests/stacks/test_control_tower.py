"""AWS Control Tower's proactive controls on every synth (cfn-guard, ``cdklabs.cdk-validator-cfnguard``).

The plugin runs Control Tower's own CloudFormation Guard rules ("AWS Control Tower proactive
controls", https://docs.aws.amazon.com/controltower/latest/userguide/proactive-controls.html)
over the synthesized templates inside the synthesis, next to cdk-nag. What it found on this app,
and what became of each:

* fixed — CT.KMS.PR.3 (a key-policy statement that denies CreateGrant unless an AWS service asks:
  "kms:GrantIsForAWSResource allows principals to call CreateGrant ... only when an AWS service
  that is integrated with AWS KMS sends the request on the principal's behalf", AWS KMS Developer
  Guide, "Controlling access to grants",
  https://docs.aws.amazon.com/kms/latest/developerguide/grant-authorization.html);
  CT.CLOUDWATCH.PR.2 (every log group keeps a year); CT.S3.PR.4 on the artifact bucket
  (EventBridge notifications);
* passed by stating a default, in effect an acknowledgement — CT.SQS.PR.1 on the failed-runs
  queue, which is itself a dead-letter store (the reconciler's on-failure destination and its
  EventBridge rules' DLQ) and has none of its own. The rule skips a queue whose
  RedriveAllowPolicy says ``allowAll`` or ``byQueue``; the queue states ``allowAll``, SQS's
  default ("allowAll (Default) – Any source queues in this AWS account in the same Region can
  specify this queue as the dead-letter queue", CloudFormation template reference,
  AWS::SQS::Queue,
  https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-sqs-queue.html),
  so SQS behaves exactly as without it. ``denyAll`` (no queue redrives into it) would be the
  truthful setting, but the rule fails it; ``byQueue`` needs source queues it has none of;
* acknowledged on their resources with a reason — the rest (tests below check each reason's
  claim where a template can show it).
"""

from __future__ import annotations

import json
import re
import tarfile
from importlib.metadata import files
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_logs as logs

from checks.validation_summary import GUARD_DISTRIBUTION, guard_release, main, summary_line
from stacks.nag import acknowledge_guard, add_nag_checks, summarize_validation_report
from stacks.validation_rules import GUARD_CONTROLS, GUARD_PLUGIN, UNREADABLE_VALUE

FIXED_CONTROLS = {"CT.KMS.PR.3", "CT.CLOUDWATCH.PR.2"}
STATED_DEFAULT_CONTROLS = {"CT.SQS.PR.1"}
"""Passed by stating the AWS default the rule looks for: nothing changes in AWS (an
acknowledgement in effect, not a fix), and they are not acknowledgeable either."""


def guard_report(outdir: Path) -> dict[str, Any]:
    report = json.loads((outdir / "validation-report.json").read_text())
    [plugin] = [p for p in report["pluginReports"] if p["pluginName"] == GUARD_PLUGIN]
    return dict(plugin)


def suppressed(outdir: Path) -> list[tuple[str, str, dict[str, Any], str]]:
    """(control, rule, violating construct, reason) per acknowledged finding."""
    found = []
    for violation in guard_report(outdir)["suppressedViolations"]:
        control = violation["description"].split("]")[0].lstrip("[")
        for construct in violation["violatingConstructs"]:
            found.append((control, violation["ruleName"], construct, violation["reason"]))
    return found


def test_control_tower_rules_ran_and_left_nothing_unacknowledged(synthesized: Any) -> None:
    plugin = guard_report(synthesized.outdir)
    assert plugin["conclusion"] == "success"
    assert plugin["violations"] == []
    version, rules = guard_release()
    assert version == "3.1.1" and rules == 237  # docs/design-decisions.md#control-tower-controls


def test_each_acknowledgement_names_its_control_on_one_resource_with_a_reason(
    synthesized: Any,
) -> None:
    found = suppressed(synthesized.outdir)
    assert found
    for control, rule, construct, reason in found:
        assert GUARD_CONTROLS.get(control) == rule, (control, rule)
        assert reason.startswith(f"[{control}] "), reason
        assert len(reason) > 60, reason
        path = construct["constructPath"]
        assert path.count("/") >= 2, f"{control} acknowledged for a whole stack: {path}"
        assert construct["cloudFormationResource"]["logicalId"], path


def test_what_was_a_defect_is_fixed_not_acknowledged(synthesized: Any) -> None:
    acknowledged = {control for control, *_ in suppressed(synthesized.outdir)}
    assert not acknowledged & (FIXED_CONTROLS | STATED_DEFAULT_CONTROLS)
    assert not (FIXED_CONTROLS | STATED_DEFAULT_CONTROLS) & set(GUARD_CONTROLS), \
        "a fixed control must not be acknowledgeable"
    assert acknowledged == set(GUARD_CONTROLS)
    for name, template in synthesized.templates.items():
        for logical_id, resource in template["Resources"].items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::Logs::LogGroup":
                # CT.CLOUDWATCH.PR.2: "retained for at least one year".
                assert props["RetentionInDays"] >= 365, (name, logical_id)


def bundled_rule(name: str) -> str:
    """The text of one bundled Control Tower rule file (``ct-sqs-pr-1.guard``)."""
    bundles = [f for f in files(GUARD_DISTRIBUTION) or () if str(f).endswith(".jsii.tgz")]
    with tarfile.open(Path(str(bundles[0].locate()))) as tar:
        [member] = [m for m in tar.getmembers() if m.name.endswith(f"/{name}")]
        return tar.extractfile(member).read().decode()  # type: ignore[union-attr]


def test_ct_sqs_pr_1_passes_on_sqs_default_stated_not_on_a_fix(synthesized: Any) -> None:
    """The failed-runs queue is a dead-letter store with no dead-letter queue of its own; it
    states allowAll, SQS's default, which is what the rule skips — denyAll would fail it."""
    rule = bundled_rule("ct-sqs-pr-1.guard")
    assert 'let DLQ_REDRIVE_PERMISSION = ["allowAll", "byQueue"]' in rule
    assert "redrivePermission not in %DLQ_REDRIVE_PERMISSION" in rule
    queues = {(name, logical_id): resource["Properties"]
              for name, template in synthesized.templates.items()
              for logical_id, resource in template["Resources"].items()
              if resource["Type"] == "AWS::SQS::Queue"}
    assert queues, "not vacuous: the release-calendar stack's failed-runs queue"
    for where, props in queues.items():
        assert "failed-runs" in props["QueueName"], where
        assert props["RedriveAllowPolicy"] == {"redrivePermission": "allowAll"}, where
        # No dead-letter queue of its own, and no queue redrives into it: only the Lambda's
        # on-failure destination and the EventBridge rules' dead-letter config send to it.
        assert "RedrivePolicy" not in props, where


def test_the_key_hands_out_grants_only_to_aws_services(synthesized: Any) -> None:
    """CT.KMS.PR.3, and KMS's rule for it ("Controlling access to grants")."""
    for name in ("Dev/Foundation", "Prod/Foundation"):
        [key] = [r for r in synthesized.template(name)["Resources"].values()
                 if r["Type"] == "AWS::KMS::Key"]
        [deny] = [s for s in key["Properties"]["KeyPolicy"]["Statement"]
                  if s.get("Sid") == "CreateGrantOnlyForAwsServices"]
        assert deny == {
            "Sid": "CreateGrantOnlyForAwsServices", "Effect": "Deny",
            "Principal": {"AWS": "*"}, "Action": "kms:CreateGrant", "Resource": "*",
            "Condition": {"BoolIfExists": {"kms:GrantIsForAWSResource": "false",
                                           "aws:PrincipalIsAWSService": "false"}}}


def test_the_artifact_bucket_sends_its_object_events_to_eventbridge(synthesized: Any) -> None:
    """CT.S3.PR.4 on the artifact bucket: CloudFormation's EventBridgeConfiguration, no
    custom-resource Lambda."""
    template = synthesized.template("Prod/Foundation")
    buckets = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"}
    [artifacts] = [r for k, r in buckets.items() if k.startswith("ModelArtifactsBucket")]
    assert artifacts["Properties"]["NotificationConfiguration"] == {
        "EventBridgeConfiguration": {"EventBridgeEnabled": True}}
    assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]


def test_a_rule_that_cannot_read_a_value_is_acknowledged_only_where_the_value_is_set(
    synthesized: Any,
) -> None:
    """The encryption rules do not resolve Fn::GetStackOutput (the plugin's README: the rules
    "accept a limited subset of CloudFormation syntax"); each such acknowledgement names the
    property, and the property is the project key from the Foundation stack's output."""
    unreadable = [(c, construct, reason) for c, _, construct, reason
                  in suppressed(synthesized.outdir) if UNREADABLE_VALUE in reason]
    assert {c for c, _, _ in unreadable} == {"CT.CLOUDWATCH.PR.3", "CT.SQS.PR.2"}
    for control, construct, reason in unreadable:
        resource_ref = construct["cloudFormationResource"]
        template = json.loads((synthesized.outdir / resource_ref["templatePath"]).read_text())
        resource = template["Resources"][resource_ref["logicalId"]]
        prop = reason.split(f"{UNREADABLE_VALUE} (")[1].split(":")[0]
        value = resource["Properties"][prop]
        assert set(value) == {"Fn::GetStackOutput"}, (control, value)
        output = value["Fn::GetStackOutput"]
        stage = construct["constructPath"].split("/")[0]
        assert output["StackName"] == f"{stage}-Foundation"
        assert "ProjectKey" in output["OutputName"], output


def test_every_acknowledged_control_is_a_bundled_rule() -> None:
    bundles = [f for f in files(GUARD_DISTRIBUTION) or () if str(f).endswith(".jsii.tgz")]
    with tarfile.open(Path(str(bundles[0].locate()))) as tar:
        texts = [tar.extractfile(m).read().decode() for m in tar.getmembers()  # type: ignore[union-attr]
                 if m.name.endswith(".guard")]
    for control, rule in GUARD_CONTROLS.items():
        assert any(f"rule {rule} when" in text and f"[{control}]:" in text for text in texts), \
            (control, rule)


def bare_app(outdir: Path, *, acknowledged: bool) -> cdk.App:
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(cdk.Stage(app, "Check"), "Bare")
    group = logs.LogGroup(stack, "Plain", retention=logs.RetentionDays.ONE_YEAR,
                          removal_policy=cdk.RemovalPolicy.DESTROY)
    if acknowledged:
        acknowledge_guard(group, "CT.CLOUDWATCH.PR.3",
                          "A scratch log group in a test, removed with the stack it belongs to.")
    add_nag_checks(app)
    return app


def test_an_unacknowledged_control_fails_synth_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        bare_app(tmp_path, acknowledged=False).synth()
    summary = summarize_validation_report(tmp_path)
    assert f"({GUARD_PLUGIN})" in summary
    assert "cloudwatch_log_group_encrypted_check: Check/Bare/Plain/Resource: [CT.CLOUDWATCH.PR.3]" \
        in summary
    assert main([str(tmp_path)]) == 1


def test_acknowledged_it_passes_and_the_summary_counts_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bare_app(tmp_path, acknowledged=True).synth()
    assert main([str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("cdk-nag: 0 unacknowledged, 0 acknowledged with a reason; "), line
    assert line.endswith("cfn-guard 3.1.1 (Control Tower proactive controls, 237 rules): "
                         "0 unacknowledged, 1 acknowledged with a reason (1 controls)"), line


def test_the_docstring_example_is_the_synthesized_apps_line_in_general_form(
    synthesized: Any,
) -> None:
    """checks/validation_summary.py's docstring shows the line with placeholders; filled with the
    synthesized app's counts it is the line the tool prints."""
    import checks.validation_summary as tool

    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    line, _ = summary_line(report)
    example = " ".join(tool.__doc__.split("prints one line", 1)[1].split("\n\n")[1].split())
    nag = int(line.split(", ", 1)[1].split(" ", 1)[0])
    version, rules = guard_release()
    filled = (example.replace("<N>", str(nag)).replace("<version>", version)
              .replace("<rules>", str(rules)).replace("<M>", str(len(suppressed(synthesized.outdir))))
              .replace("<controls>", str(len(GUARD_CONTROLS))))
    assert filled == line


def test_the_pipeline_diagram_names_every_check_make_synth_runs() -> None:
    """docs/delivery.md's pipeline diagram says what the Makefile's synth target runs."""
    root = Path(__file__).resolve().parents[2]
    makefile = (root / "Makefile").read_text()
    help_text = makefile.split("\nsynth:", 1)[1].split("\n", 1)[0]
    checks = help_text.split("offline (", 1)[1].split(")", 1)[0]
    assert checks == "cdk-nag, Control Tower's cfn-guard rules, cfn-lint, checkov"
    delivery = (root / "docs" / "delivery.md").read_text()
    assert f"make synth ({checks}) ─► make diff" in delivery


def test_acknowledging_needs_a_known_control_and_a_real_reason() -> None:
    group = logs.LogGroup(cdk.Stack(cdk.App(), "S"), "G")
    with pytest.raises(ValueError, match=re.escape("control 'CT.KMS.PR.3' is not accepted; accepted: ")):
        acknowledge_guard(group, "CT.KMS.PR.3", "A reason long enough to be accepted otherwise.")
    with pytest.raises(ValueError, match="must explain the exception"):
        acknowledge_guard(group, "CT.CLOUDWATCH.PR.3", "short")


def test_the_summary_line_of_the_synthesized_app(synthesized: Any) -> None:
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    line, clean = summary_line(report)
    assert clean
    guard = line.split("; ")[1]
    count = len(suppressed(synthesized.outdir))
    assert guard == (f"cfn-guard 3.1.1 (Control Tower proactive controls, 237 rules): "
                     f"0 unacknowledged, {count} acknowledged with a reason "
                     f"({len(GUARD_CONTROLS)} controls)")
    unexplained = {"pluginReports": [
        {"pluginName": "AwsSolutions", "violations": [], "suppressedViolations": []},
        {"pluginName": GUARD_PLUGIN, "violations": [], "suppressedViolations": [
            {"violatingConstructs": [{}], "reason": "[CT.S3.PR.9] ok"}]}]}
    line, clean = summary_line(unexplained)
    assert not clean and line.endswith("1 acknowledged with a reason (1 controls), "
                                       "1 WITHOUT a reason")
