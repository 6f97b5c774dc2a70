"""The intent classifier endpoint on Inferentia, as synthesized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
import yaml

from stacks.intent_endpoint import INTENT_IMAGE_SOURCES
from stacks.settings import (
    REPO_ROOT,
    Environment,
    load_settings,
    parse_environment,
    parse_settings,
)
from stacks.stage import MangaAssistStage
from stacks.synth import feature_flags
from tests.support.templates import only


def test_model_is_the_compiled_archive_network_isolated(prod: dict[str, Any]) -> None:
    settings = load_settings("prod")
    model = only(prod, "AWS::SageMaker::Model", "IntentEndpointModel")[1]
    assert model["EnableNetworkIsolation"] is True
    container = model["PrimaryContainer"]
    assert container["ModelDataUrl"] == (
        f"s3://{settings.artifact_bucket_name}/{settings.intent.artifact_key}")
    assert "ModelDataSource" not in container
    assert container["Environment"] == {
        "INTENT_MODEL_DIR": "/opt/ml/model",
        "INTENT_TARGET": "inf1",
        "INTENT_METRICS_ENDPOINT_NAME": "manga-assist-prod-intent",
        "INTENT_METRICS_VARIANT_NAME": "AllTraffic",
    }
    assert len(model["VpcConfig"]["Subnets"]) == 2


def test_endpoint_config_on_inf1_with_the_project_key(prod: dict[str, Any]) -> None:
    config = only(prod, "AWS::SageMaker::EndpointConfig", "IntentEndpoint")[1]
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == "ml.inf1.xlarge"
    assert variant["InitialInstanceCount"] == 2  # docs/design-decisions.md#intent-on-inferentia
    assert "InferenceAmiVersion" not in variant
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 300
    # inf1 is EBS-backed: its volume is encrypted with the customer-managed project key.
    assert "ProjectKey" in json.dumps(config["KmsKeyId"])


def test_inf1_endpoint_updates_all_at_once_without_guardrails(prod: dict[str, Any]) -> None:
    """SageMaker Developer Guide, Deployment guardrails, Exclusions
    (https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html):
    "If your endpoint uses any of the following features, you cannot use deployment guardrails
    on your endpoint, and your endpoint will fall back to using a blue/green deployment with all
    at once traffic shifting and no final baking period: [...] Endpoints that use Inf1
    (Inferentia-based) instances". The template says exactly that: all at once, no bake, and no
    auto-rollback alarms that SageMaker would not act on."""
    endpoint = only(prod, "AWS::SageMaker::Endpoint", "IntentEndpoint")[1]
    assert endpoint["EndpointName"] == "manga-assist-prod-intent"
    deployment = endpoint["DeploymentConfig"]
    assert deployment["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"] == {
        "Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}
    assert "AutoRollbackConfiguration" not in deployment
    role = [s for r in prod["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
            and any(ref["Ref"].startswith("IntentEndpointExecutionRole")
                    for ref in r["Properties"]["Roles"])
            for s in r["Properties"]["PolicyDocument"]["Statement"]]
    assert not [s for s in role if "cloudwatch:DescribeAlarms" in json.dumps(s)]


def test_role_reads_only_the_archive_folder(prod: dict[str, Any]) -> None:
    settings = load_settings("prod")
    statements = [s for r in prod["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  and any(ref["Ref"].startswith("IntentEndpointExecutionRole")
                          for ref in r["Properties"]["Roles"])
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    read = next(s for s in statements if s.get("Sid") == "ReadModelData")
    folder = settings.intent.artifact_key.rsplit("/", 1)[0]
    assert read["Resource"] == f"arn:aws:s3:::{settings.artifact_bucket_name}/{folder}/*"


def test_scaling_keeps_two_instances_off_peak_and_follows_the_calendar(
    prod: dict[str, Any], prod_environment: Environment,
) -> None:
    target = only(prod, "AWS::ApplicationAutoScaling::ScalableTarget", "IntentScaling")[1]
    assert target["ResourceId"] == "endpoint/manga-assist-prod-intent/variant/AllTraffic"
    actions = {a["ScheduledActionName"]: a for a in target["ScheduledActions"]}
    fleet = prod_environment.plans.intent_fleet
    # Two warm instances at night (docs/design-decisions.md#intent-on-inferentia): the night's traffic needs fewer.
    assert fleet.off_peak.min_capacity == 2
    assert actions["floor-off-peak"]["ScalableTargetAction"] == {
        "MinCapacity": 2, "MaxCapacity": fleet.off_peak.max_capacity}
    assert "calendar-weekly-shonen-jump-prescale" in actions
    # The calendar Lambda reconciles both targets.
    (function,) = [r["Properties"] for r in prod["Resources"].values()
                   if r["Type"] == "AWS::Lambda::Function"
                   and r["Properties"].get("Handler") == "lambdas/release_calendar/handler.handler"]
    assert function["Environment"]["Variables"]["SCALABLE_TARGET_INTENT"] == (
        "endpoint/manga-assist-prod-intent/variant/AllTraffic")


def test_image_builds_for_the_target_with_only_its_sources(synthesized) -> None:  # type: ignore[no-untyped-def]
    assembly = synthesized.outdir / "assembly-Prod"
    assets = json.loads(next(assembly.glob("ProdServing*.assets.json")).read_text())
    (intent,) = [a["source"] for a in assets["dockerImages"].values()
                 if a["source"]["dockerFile"] == "containers/intent/Dockerfile"]
    assert intent["dockerBuildArgs"] == {"TARGET": "inf1"}
    assert intent["platform"] == "linux/amd64"
    staged = assembly / intent["directory"]
    files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    neuron_files = {f for f in files if f.startswith("neuron/")}
    assert neuron_files == {s for s in INTENT_IMAGE_SOURCES if s.startswith("neuron/")}
    assert not [f for f in files if f.startswith(("stacks/", "tests/", "gpu_budget/"))]
    ignore = (REPO_ROOT / "containers/intent/Dockerfile.dockerignore").read_text()
    allowed = [line[1:].strip().rstrip("/") for line in ignore.splitlines()
               if line.startswith("!")]

    def kept(entries: list[str] | tuple[str, ...]) -> set[str]:
        return {f for f in files if any(f == e or f.startswith(f"{e}/") for e in entries)}

    assert kept(allowed) == kept(INTENT_IMAGE_SOURCES) == files, \
        "the CDK asset and `docker build` (Dockerfile.dockerignore) must see the same context"


def test_inf2_selects_the_inf2_image_and_instance(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO_ROOT / "config" / "dev.yaml").read_text())
    data["intent"].update(target="inf2", instance_type="ml.inf2.xlarge",
                          artifact_key="models/intent/distilbert-manga-intent-inf2/model.tar.gz")
    environment = parse_environment(data, source="dev (inf2)")
    app = cdk.App(outdir=str(tmp_path), context=feature_flags())
    stage = MangaAssistStage(app, settings=environment.settings, plans=environment.plans)
    app.synth()
    template = json.loads(
        (tmp_path / "assembly-Dev" / stage.serving.template_file).read_text())
    config = only(template, "AWS::SageMaker::EndpointConfig", "IntentEndpoint")[1]
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.inf2.xlarge"
    # inf2 has deployment guardrails: the rollback alarms are back.
    endpoint = only(template, "AWS::SageMaker::Endpoint", "IntentEndpoint")[1]
    refs = [a["AlarmName"]["Ref"] for a in
            endpoint["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    names = {template["Resources"][r]["Properties"]["AlarmName"] for r in refs}
    assert names == {"manga-assist-dev-intent-invocation-5xx",
                     "manga-assist-dev-intent-model-latency-p99"}
    assets = json.loads(next(tmp_path.glob("assembly-Dev/DevServing*.assets.json")).read_text())
    build_args = [a["source"].get("dockerBuildArgs") for a in assets["dockerImages"].values()]
    assert {"TARGET": "inf2"} in build_args


def test_instance_must_match_the_target() -> None:
    data = yaml.safe_load((REPO_ROOT / "config" / "dev.yaml").read_text())
    data["intent"]["instance_type"] = "ml.inf2.xlarge"  # target stays inf1
    with pytest.raises(ValueError, match=r"'ml.inf2.xlarge' does not run inf1 models"):
        parse_settings(data, source="dev")
    data["intent"].update(instance_type="ml.inf1.xlarge", model_copies=9)
    with pytest.raises(ValueError, match="model_copies 9 exceeds the 4 NeuronCores"):
        parse_settings(data, source="dev")
