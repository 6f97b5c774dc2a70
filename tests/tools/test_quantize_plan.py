"""The launcher's pure decisions: stack outputs, the job plan, the verdict and the exit code."""

from __future__ import annotations

import pytest

from quantization import job_outputs
from stacks.settings import load_settings
from tools.quantize.plan import (
    GateVerdict,
    LaunchError,
    StackOutputs,
    decide_outcome,
    plan_job,
    progress_line,
)

OUTPUTS = {
    "Prod-Foundation": {job_outputs.ARTIFACT_BUCKET: "bucket",
                        job_outputs.PROJECT_KEY_ARN: "arn:aws:kms:ap-northeast-1:1:key/k"},
    "Prod-Serving": {job_outputs.JOB_ROLE_ARN: "arn:aws:iam::1:role/r",
                     job_outputs.JOB_IMAGE_URI: "img", job_outputs.JOB_SUBNET_IDS: "s-1,s-2",
                     job_outputs.JOB_SECURITY_GROUP_ID: "sg-1"},
}
MODEL = "s3://bucket/quantization/models/awq-1/"


def test_stack_outputs_name_the_missing_stack_or_output() -> None:
    outputs = StackOutputs.from_describe_stacks("Prod", OUTPUTS)
    assert outputs.subnet_ids == ("s-1", "s-2")
    with pytest.raises(LaunchError, match="stack Prod-Serving not found: deploy"):
        StackOutputs.from_describe_stacks("Prod", {"Prod-Foundation": OUTPUTS["Prod-Foundation"]})
    partial = {**OUTPUTS, "Prod-Serving": {job_outputs.JOB_ROLE_ARN: "r"}}
    with pytest.raises(LaunchError, match="has no output QuantizationJobImageUri, "
                                          "QuantizationJobSubnetIds"):
        StackOutputs.from_describe_stacks("Prod", partial)


def test_the_plan_writes_only_where_the_role_may_and_follows_the_served_format() -> None:
    settings = load_settings("prod")
    outputs = StackOutputs.from_describe_stacks("Prod", OUTPUTS)
    plan = plan_job(settings, outputs, base_model_prefix="base-models/llama/", run_id="awq-1")
    assert plan.base_model_uri == "s3://bucket/base-models/llama/"
    assert plan.model_uri == MODEL  # the run's candidate prefix, never the served one
    assert plan.environment["ARTIFACT_S3_URI"] == MODEL
    # ml.g5.4xlarge has local NVMe storage: no volume key and no volume size.
    assert (plan.volume_kms_key_arn, plan.volume_size_gb) == (None, None)
    assert plan.report_uri == "s3://bucket/quantization/runs/awq-1/"
    assert plan.environment["AWQ_BACKEND"] == "llm-compressor"
    # The job gates every adapter prod serves, from <base model>/adapters/<folder>/.
    assert plan.environment["GATE_ADAPTERS"] == (
        "manga=manga_domain,support=general_support,manga-ja=jp_translation")
    g64 = settings.model_copy(update={"llm": settings.llm.model_copy(update={
        "model": settings.llm.model.model_copy(update={"quantization": "awq-g64"})})})
    plan64 = plan_job(g64, outputs, base_model_prefix="base-models/llama", run_id="awq-1")
    assert (plan64.environment["AWQ_BACKEND"], plan64.environment["AWQ_GROUP_SIZE"]) == (
        "autoawq", "64")
    with pytest.raises(LaunchError, match=r"--instance-type: 'ml\.inf2\.xlarge' is not accepted"):
        plan_job(settings, outputs, base_model_prefix="base-models/x", run_id="awq-1",
                 instance_type="ml.inf2.xlarge")
    with pytest.raises(LaunchError, match="--group-size: 32 is not accepted; use one of 128, 64"):
        plan_job(settings, outputs, base_model_prefix="base-models/x", run_id="awq-1",
                 group_size=32)


def test_progress_line_shows_elapsed_status_and_message() -> None:
    line = progress_line(125.4, {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
                                 "SecondaryStatusTransitions": [{"StatusMessage": "going"}]})
    assert line == "[  2m05s] InProgress Training: going"


def verdict(passed: bool) -> GateVerdict:
    checks = [{"name": "score_ja", "passed": passed, "measured": 4.5 if passed else 2.0,
               "threshold": 4.0, "comparison": ">="}]
    import json
    return GateVerdict.from_report(json.dumps(
        {"passed": passed, "failed_checks": [] if passed else ["score_ja"], "checks": checks}))


@pytest.mark.parametrize(("status", "reason", "passed", "keys", "code", "message"), [
    ("Completed", None, True, {"config.json", "quality_gate.json", "artifact-manifest.json"}, 0,
     f"quality gate: PASSED; candidate uploaded to {MODEL}"),
    ("Failed", "quality gate failed", False, set(), 1,
     f"quality gate: FAILED (score_ja); nothing was uploaded to {MODEL}"),
    ("Failed", "OutOfMemory", None, set(), 2, "job Failed: OutOfMemory; no gate report was written"),
    ("Completed", None, True, {"quality_gate.json", "config.json"}, 2,
     f"the gate passed but artifact-manifest.json is missing at {MODEL}"),
    ("Stopped", "MaxRuntimeExceeded", True, set(), 2,
     f"the gate passed but the job Stopped: MaxRuntimeExceeded; {MODEL} may be incomplete (make "
     "promote refuses a candidate without its manifest)"),
])
def test_exit_code_is_0_only_for_a_completed_passing_uploaded_model(
    status: str, reason: str | None, passed: bool | None, keys: set[str], code: int, message: str,
) -> None:
    outcome = decide_outcome(status, reason, None if passed is None else verdict(passed),
                             frozenset(keys), MODEL)
    assert (outcome.exit_code, outcome.message) == (code, message)


def test_a_malformed_report_is_an_error_not_a_pass() -> None:
    with pytest.raises(LaunchError, match=r"quality_gate\.json is not a gate report"):
        GateVerdict.from_report('{"passed": "yes", "checks": []}')
    with pytest.raises(LaunchError, match=r"quality_gate\.json is not a gate report"):
        GateVerdict.from_report("<html>")


def test_an_ebs_backed_training_instance_gets_the_key_only_if_the_role_can_grant_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every GPU type in the catalog has local storage today; a future EBS-backed one (ml.p3
    here) gets the settings' volume size and the project key, and is refused as an override
    while quantization.instance_type has local storage (the role then holds no kms:CreateGrant
    for a volume)."""
    import dataclasses

    from gpu_budget import instance_type as real
    from tools.quantize import plan as launch_plan

    ebs = dataclasses.replace(real("ml.g5.4xlarge"), name="ml.p3.2xlarge")
    monkeypatch.setattr(launch_plan, "catalog_instance_type",
                        lambda name: ebs if name == "ml.p3.2xlarge" else real(name))
    settings = load_settings("prod")
    outputs = StackOutputs.from_describe_stacks("Prod", OUTPUTS)
    with pytest.raises(LaunchError, match=r"--instance-type: 'ml\.p3\.2xlarge' is not accepted: "
                                          "its training volume is EBS"):
        plan_job(settings, outputs, base_model_prefix="base-models/x", run_id="awq-1",
                 instance_type="ml.p3.2xlarge")
    configured = settings.model_copy(update={"quantization": settings.quantization.model_copy(
        update={"instance_type": "ml.p3.2xlarge"})})
    plan = plan_job(configured, outputs, base_model_prefix="base-models/x", run_id="awq-1")
    assert (plan.volume_size_gb, plan.volume_kms_key_arn) == (
        100, "arn:aws:kms:ap-northeast-1:1:key/k")
