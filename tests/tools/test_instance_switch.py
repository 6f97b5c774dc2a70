"""Switching intent.target from inf1 to inf2 changes the instance type of an autoscaled variant.

SageMaker Developer Guide, "Update endpoints that use auto scaling"
(https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html): "If the update
would change the instance type for any model that is a target for auto scaling, the update fails
... Before you update the endpoint, delete any scaling policies configured for it and deregister
the variant as a scalable target ... After you update the endpoint, you can register the updated
variant as a scalable target and attach a scaling policy."

Handled in two parts, both tested here: ``make deploy`` deregisters a variant whose deployed
instance type differs from the configured one (tools/instance_switch.py, against moto), and the
template gives the variant of another instance type a scalable target of its own, created after
the endpoint, while the old one is retained rather than deleted (deleting it would deregister the
same variant again; "Delete endpoints configured for auto scaling": deleting an endpoint
deregisters its targets, so a stack deletion leaves none behind).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.settings import CONFIG_DIR, load_settings
from stacks.variant_scaling import scalable_target_id
from tests.support.aws import fake_credentials
from tools.instance_switch import SCALABLE_DIMENSION, main

PROD = load_settings("prod")
INTENT = "manga-assist-prod-intent"
LLM = "manga-assist-prod-llm"
RESOURCE_ID = f"endpoint/{INTENT}/variant/AllTraffic"


@pytest.fixture
def account(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto with the intent endpoint on ml.inf1.xlarge, registered with a target-tracking
    policy (moto's CloudFormation skips scaling resources, so they are made directly)."""
    import boto3
    from moto import mock_aws

    fake_credentials(monkeypatch, PROD.region)
    with mock_aws():
        session = boto3.Session(region_name=PROD.region)
        sagemaker = session.client("sagemaker")
        sagemaker.create_model(
            ModelName="intent", ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
            PrimaryContainer={"Image": "123456789012.dkr.ecr.ap-northeast-1.amazonaws.com/i:1"})
        sagemaker.create_endpoint_config(EndpointConfigName="intent-config", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": "intent", "InitialInstanceCount": 2,
            "InstanceType": "ml.inf1.xlarge"}])
        sagemaker.create_endpoint(EndpointName=INTENT, EndpointConfigName="intent-config")
        autoscaling = session.client("application-autoscaling")
        autoscaling.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=RESOURCE_ID,
            ScalableDimension=SCALABLE_DIMENSION, MinCapacity=2, MaxCapacity=8)
        autoscaling.put_scheduled_action(
            ServiceNamespace="sagemaker", ResourceId=RESOURCE_ID,
            ScalableDimension=SCALABLE_DIMENSION, ScheduledActionName="off-peak",
            Schedule="cron(0 1 * * ? *)", Timezone="Asia/Tokyo",
            ScalableTargetAction={"MinCapacity": 2, "MaxCapacity": 4})
        autoscaling.put_scaling_policy(
            PolicyName="tracking", ServiceNamespace="sagemaker", ResourceId=RESOURCE_ID,
            ScalableDimension=SCALABLE_DIMENSION, PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={"TargetValue": 1500.0, "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}})
        yield session


def config_with_intent(tmp_path: Path, target: str) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(exist_ok=True)
    for name in ("dev.yaml", "prod.yaml"):
        text = (CONFIG_DIR / name).read_text()
        if name == "prod.yaml" and target == "inf2":
            text = text.replace("  target: inf1\n", "  target: inf2\n").replace(
                "instance_type: ml.inf1.xlarge", "instance_type: ml.inf2.xlarge").replace(
                "distilbert-manga-intent-inf1", "distilbert-manga-intent-inf2")
        (directory / name).write_text(text)
    return directory


def switch(session: Any, tmp_path: Path, target: str, *args: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MANGAASSIST_CONFIG_DIR", str(config_with_intent(tmp_path, target)))
        code = main(["--env", "prod", *args], session=session, out=out)
    return code, out.getvalue().strip().splitlines()


def registered(session: Any) -> list[Any]:
    return list(session.client("application-autoscaling").describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[RESOURCE_ID])["ScalableTargets"])


def test_the_configured_instance_type_is_what_the_switch_reads(tmp_path: Path) -> None:
    settings = load_settings("prod", config_dir=config_with_intent(tmp_path, "inf2"))
    assert (settings.intent.target, settings.intent.instance_type) == ("inf2", "ml.inf2.xlarge")


def test_an_inf1_to_inf2_switch_deregisters_the_variant_first(account: Any,
                                                              tmp_path: Path) -> None:
    code, lines = switch(account, tmp_path, "inf2", "--dry-run")
    assert code == 0
    assert lines == [f"ok: {LLM}: not deployed yet",
                     f"would deregister {RESOURCE_ID}: {INTENT}/AllTraffic runs ml.inf1.xlarge "
                     "and is configured for ml.inf2.xlarge: SageMaker refuses that update while "
                     "the variant is registered with Application Auto Scaling"]
    assert registered(account)
    code, lines = switch(account, tmp_path, "inf2")
    assert code == 0
    assert lines[1].startswith(f"deregistered {RESOURCE_ID}: ")
    assert lines[1].endswith("the Serving stack registers it again on ml.inf2.xlarge (until "
                             "then it keeps its instance count and does not scale)")
    assert registered(account) == []
    policies = account.client("application-autoscaling").describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=RESOURCE_ID)["ScalingPolicies"]
    assert policies == []
    actions = account.client("application-autoscaling").describe_scheduled_actions(
        ServiceNamespace="sagemaker", ResourceId=RESOURCE_ID)["ScheduledActions"]
    assert actions == []
    # Run again (a retried deploy): the variant is no longer registered, nothing to do.
    assert switch(account, tmp_path, "inf2") == (0, [f"ok: {LLM}: not deployed yet",
                                                     f"ok: {INTENT}: ml.inf1.xlarge -> "
                                                     "ml.inf2.xlarge, not registered (nothing "
                                                     "to deregister)"])


def test_no_instance_type_change_leaves_scaling_alone(account: Any, tmp_path: Path) -> None:
    code, lines = switch(account, tmp_path, "inf1")
    assert code == 0
    assert lines == [f"ok: {LLM}: not deployed yet", f"ok: {INTENT}: ml.inf1.xlarge, no change"]
    assert registered(account)


def test_after_a_rolled_back_switch_only_the_switch_itself_restores_scaling(
    account: Any, tmp_path: Path,
) -> None:
    """docs/design-decisions.md#instance-type-switch: the switch deregistered the variant, the
    Serving update failed and rolled back, so the endpoint still runs inf1, unregistered. Re-run
    with inf2 configured, the switch lets the deploy through (the stack then creates the inf2
    target, test below); with inf1 configured it sees no change and registers nothing, and the
    inf1 template's scaling resources are those CloudFormation believes deployed: no deploy
    brings autoscaling back on the old type."""
    assert switch(account, tmp_path, "inf2")[0] == 0
    assert registered(account) == []  # the rollback leaves the endpoint on inf1, unregistered
    assert switch(account, tmp_path, "inf2")[1][1] == (
        f"ok: {INTENT}: ml.inf1.xlarge -> ml.inf2.xlarge, not registered (nothing to deregister)")
    assert switch(account, tmp_path, "inf1") == (0, [f"ok: {LLM}: not deployed yet",
                                                     f"ok: {INTENT}: ml.inf1.xlarge, no change"])
    assert registered(account) == []
    assert scalable_target_id("ml.inf1.xlarge") == "Target"  # the id deployed before the switch


def intent_targets(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items()
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
            and r["Properties"]["ResourceId"] == RESOURCE_ID}


def test_the_template_retains_the_target_and_names_it_per_instance_type(
    synthesized: Any,
) -> None:
    for stage in ("Dev", "Prod"):
        for logical_id, target in intent_targets(synthesized.template(f"{stage}/Serving")).items():
            assert target["DeletionPolicy"] == "Retain", logical_id
            assert target["UpdateReplacePolicy"] == "Retain", logical_id
            assert logical_id.startswith("IntentScalingTarget")
    # inf1 keeps the id the variant was first deployed with; inf2 gets its own resource.
    assert scalable_target_id("ml.inf1.xlarge") == "Target"
    assert scalable_target_id("ml.g5.xlarge") == "Target"
    assert scalable_target_id("ml.inf2.xlarge") == "TargetMlInf2Xlarge"


def test_with_inf2_the_template_has_another_target_created_after_the_endpoint(
    tmp_path: Path,
) -> None:
    from stacks.synth import synthesize
    from tests.conftest import read_assembly

    out = tmp_path / "cdk.out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MANGAASSIST_CONFIG_DIR", str(config_with_intent(tmp_path, "inf2")))
        assert synthesize(["prod"], outdir=str(out)) == 0
    template = read_assembly(out).template("Prod/Serving")
    [(logical_id, target)] = intent_targets(template).items()
    assert logical_id.startswith("IntentScalingTargetMlInf2Xlarge")
    endpoint = next(k for k, r in template["Resources"].items()
                    if r["Type"] == "AWS::SageMaker::Endpoint"
                    and r["Properties"]["EndpointName"] == INTENT)
    assert endpoint in target["DependsOn"]
    policies = [r for r in template["Resources"].values()
                if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
                and r["Properties"].get("ScalingTargetId") == {"Ref": logical_id}]
    assert policies, "the new target carries the variant's policies"
    assert json.dumps(target).count("ScheduledActions") == 1
