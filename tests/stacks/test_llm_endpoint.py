"""The LLM endpoint as synthesized: sized by the GPU budget, isolated, least privilege, blue/green."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from gpu_budget import instance_type
from stacks.llm_endpoint import CUDA13_INFERENCE_AMI, LLM_IMAGE_SOURCES, container_environment
from stacks.settings import load_environment, load_settings
from tests.support.templates import only


def llm_resource(template: dict[str, Any], resource_type: str) -> dict[str, Any]:
    """The LLM endpoint's one resource of this type (the intent endpoint has its own)."""
    return only(template, resource_type, "LlmEndpoint")[1]


@pytest.fixture(scope="module")
def serving(synthesized, stage: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return synthesized.template(f"{stage}/Serving")


def test_container_environment_is_the_budget_plan(serving: dict[str, Any], stage: str) -> None:
    environment = load_environment(stage.lower())
    settings, plan = environment.settings, environment.plans.llm_memory
    env = llm_resource(serving, "AWS::SageMaker::Model")["PrimaryContainer"]["Environment"]
    expected = container_environment(
        settings.llm, environment.plans.llm_capacity, endpoint_name=f"manga-assist-{stage.lower()}-llm",
        variant_name="AllTraffic",
    )
    assert env == expected
    assert env["ENGINE_MAX_MODEL_LEN"] == str(settings.llm.max_model_len)
    assert env["ENGINE_GPU_MEMORY_UTILIZATION"] == str(plan.gpu_memory_utilization)
    assert env["ENGINE_MAX_NUM_SEQS"] == str(plan.max_num_seqs)
    assert env["ENGINE_MAX_NUM_BATCHED_TOKENS"] == str(plan.max_num_batched_tokens)
    assert env["ENGINE_QUANTIZATION"] == "compressed-tensors"
    assert env["ENGINE_ENABLE_LORA"] == "true"
    assert env["ENGINE_MAX_LORAS"] == "3"
    assert env["ENGINE_MAX_LORA_RANK"] == "64"
    assert env["GATEWAY_EXPECTED_KV_TOKENS"] == str(plan.kv_pool_tokens)
    assert env["GATEWAY_ADAPTERS"] == "manga=manga_domain,support=general_support,manga-ja=jp_translation"
    assert env["GATEWAY_LOCALE_ROUTES"] == "ja-JP:manga=manga-ja"
    assert not [k for k in env if k.startswith("VLLM_")], "VLLM_* variables are vLLM's own"


def test_the_gateways_admission_is_the_capacity_models(serving: dict[str, Any],
                                                        stage: str) -> None:
    """The bucket caps, the KV watermark and the context window in the synthesized environment
    are the capacity model's, and the gateway reads back exactly those numbers — not its
    built-in defaults (S=128, M=64, L=32, XL=8)."""
    from gateway import settings as gateway_settings
    from request_buckets import RequestBucket

    environment = load_environment(stage.lower())
    llm, capacity = environment.settings.llm, environment.plans.llm_capacity
    env = llm_resource(serving, "AWS::SageMaker::Model")["PrimaryContainer"]["Environment"]
    assert env["GATEWAY_BUCKET_CAPS"] == capacity.instance.gateway_bucket_caps()
    loaded = gateway_settings.load_settings(env).gateway
    caps = {bucket.value: capacity.instance.cap_of(bucket) for bucket in RequestBucket}
    assert dict(loaded.buckets.caps) == caps
    assert loaded.admission_watermark == llm.capacity.admission_watermark
    window = llm.context_window
    split = loaded.context_split
    assert (split.system, split.rag, split.history, split.output) == (
        window.system, window.rag, window.history, window.output)
    # Each cap is what the KV pool holds of the bucket's largest request under the watermark,
    # bounded by max_num_seqs: XL is the pool's 4,096-token share. (The latency SLO is the
    # prefill valve's, GATEWAY_TTFT_SLO_S, not a cap.)
    plan = capacity.memory_plan
    admissible = int(llm.capacity.admission_watermark * plan.kv_pool_blocks)
    assert caps["XL"] == min(admissible // (plan.max_model_len // plan.block_size),
                             plan.max_num_seqs)
    assert loaded.ttft_slo_s * 1000 == capacity.slo.time_to_first_token_p99_ms
    assert caps != {"S": 128, "M": 64, "L": 32, "XL": 8}
    assert caps["XL"] > 8, "a long conversation is no longer capped below what the pool holds"


def test_the_gateway_accepts_every_variable_the_stack_sets(serving: dict[str, Any]) -> None:
    from gateway import settings as gateway_settings
    env = llm_resource(serving, "AWS::SageMaker::Model")["PrimaryContainer"]["Environment"]
    # Parses without error and reads back the values the stack chose.
    loaded = gateway_settings.load_settings(env)
    assert loaded.engine.max_model_len == int(env["ENGINE_MAX_MODEL_LEN"])
    assert loaded.engine.max_num_seqs == int(env["ENGINE_MAX_NUM_SEQS"])


def test_model_is_network_isolated_in_the_isolated_subnets(serving: dict[str, Any]) -> None:
    model = llm_resource(serving, "AWS::SageMaker::Model")
    assert model["EnableNetworkIsolation"] is True
    subnets = [s["Ref"] for s in model["VpcConfig"]["Subnets"]]
    assert len(subnets) == 2
    for subnet in subnets:
        props = serving["Resources"][subnet]["Properties"]
        assert props["MapPublicIpOnLaunch"] is False
        assert "Fn::GetAZs" in json.dumps(props["AvailabilityZone"])
    template = Template.from_json(serving)
    template.resource_count_is("AWS::EC2::InternetGateway", 0)
    template.resource_count_is("AWS::EC2::NatGateway", 0)
    services = sorted(json.dumps(r["Properties"]["ServiceName"]) for r in
                      template.find_resources("AWS::EC2::VPCEndpoint").values())
    assert [s for s in services if "s3" in s], services
    assert any("ecr.dkr" in s for s in services) and any("ecr.api" in s for s in services)
    assert any("logs" in s for s in services)


def test_model_data_is_an_uncompressed_s3_prefix(serving: dict[str, Any], stage: str) -> None:
    settings = load_settings(stage.lower())
    source = llm_resource(serving, "AWS::SageMaker::Model")["PrimaryContainer"]["ModelDataSource"]
    assert source["S3DataSource"] == {
        "S3Uri": f"s3://{settings.artifact_bucket_name}/{settings.llm.model.artifact_prefix}/",
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }


def test_image_is_built_from_the_llm_dockerfile_for_amd64(synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    assembly = synthesized.outdir / f"assembly-{stage}"
    assets = json.loads(next(assembly.glob(f"{stage}Serving*.assets.json")).read_text())
    (source,) = [a["source"] for a in assets["dockerImages"].values()
                 if a["source"]["dockerFile"] == "containers/llm/Dockerfile"]
    assert source["dockerFile"] == "containers/llm/Dockerfile"
    assert source["platform"] == "linux/amd64"
    staged = assembly / source["directory"]
    top_level = sorted(p.name for p in staged.iterdir())
    assert top_level == sorted({s.split("/")[0] for s in LLM_IMAGE_SOURCES})
    assert not list(staged.rglob("__pycache__"))
    assert (staged / "containers" / "llm" / "Dockerfile").is_file()


def test_endpoint_config(serving: dict[str, Any], stage: str) -> None:
    settings = load_settings(stage.lower())
    config = llm_resource(serving, "AWS::SageMaker::EndpointConfig")
    assert "EndpointConfigName" not in config, "a fixed name would block replacement"
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g5.xlarge"
    assert variant["InferenceAmiVersion"] == CUDA13_INFERENCE_AMI
    assert variant["InitialInstanceCount"] == settings.llm.scaling.min_capacity
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == (
        settings.llm.health.container_startup_health_check_timeout_s)
    assert variant["ModelDataDownloadTimeoutInSeconds"] == (
        settings.llm.health.model_data_download_timeout_s)
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    # g5 has hardware-encrypted local NVMe storage: SageMaker rejects a KmsKeyId for it.
    assert instance_type("ml.g5.xlarge").local_instance_storage
    assert "KmsKeyId" not in config


def test_production_keeps_two_warm_instances(synthesized) -> None:  # type: ignore[no-untyped-def]
    config = llm_resource(synthesized.template("Prod/Serving"), "AWS::SageMaker::EndpointConfig")
    assert config["ProductionVariants"][0]["InitialInstanceCount"] == 2


EXPECTED_TRAFFIC_ROUTING = {
    # One instance: a canary would be the whole fleet, so Dev shifts all at once and bakes.
    "Dev": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 300},
    # Two instances at least: a 10 % canary is one instance (≤ 50 %), baked 10 minutes.
    "Prod": {"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 10},
             "WaitIntervalInSeconds": 600},
}


def test_endpoint_is_blue_green_with_alarm_rollback(serving: dict[str, Any], stage: str) -> None:
    """SageMaker API Reference, TrafficRoutingConfig
    (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TrafficRoutingConfig.html):
    "ALL_AT_ONCE: Endpoint traffic shifts to the new fleet in a single step", "CanarySize ...
    Value must be less than or equal to 50% of the variant's total instance count",
    WaitIntervalInSeconds "The waiting time (in seconds) between incremental steps"."""
    settings = load_settings(stage.lower()).llm.deployment
    endpoint = llm_resource(serving, "AWS::SageMaker::Endpoint")
    assert endpoint["EndpointName"] == f"manga-assist-{stage.lower()}-llm"
    assert endpoint["RetainAllVariantProperties"] is True
    deployment = endpoint["DeploymentConfig"]
    policy = deployment["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == EXPECTED_TRAFFIC_ROUTING[stage]
    assert policy["TerminationWaitInSeconds"] == settings.termination_wait_s
    rollback = [a["AlarmName"]["Ref"] for a in deployment["AutoRollbackConfiguration"]["Alarms"]]
    names = {serving["Resources"][ref]["Properties"]["AlarmName"] for ref in rollback}
    prefix = f"manga-assist-{stage.lower()}-llm"
    assert names == {f"{prefix}-invocation-5xx", f"{prefix}-oom-circuit-trips",
                     f"{prefix}-time-to-first-token-p99", f"{prefix}-time-per-output-token-p99"}


def test_endpoint_name_is_exported(serving: dict[str, Any], stage: str) -> None:
    outputs = serving["Outputs"]
    exported = [o for o in outputs.values() if o.get("Export")]
    assert any(o["Value"] == f"manga-assist-{stage.lower()}-llm" for o in exported)


def statements(template: dict[str, Any], role_logical_prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and any(
            ref["Ref"].startswith(role_logical_prefix) for ref in resource["Properties"]["Roles"]
        ):
            out.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    assert out, f"no policy attached to a role named {role_logical_prefix}*"
    return out


def test_execution_role_is_least_privilege(serving: dict[str, Any], stage: str) -> None:
    settings = load_settings(stage.lower())
    found = statements(serving, "LlmEndpointExecutionRole")
    by_sid = {s.get("Sid"): s for s in found}
    bucket = f"arn:aws:s3:::{settings.artifact_bucket_name}"
    prefix = settings.llm.model.artifact_prefix
    assert by_sid["ReadModelData"]["Action"] == "s3:GetObject"
    assert by_sid["ReadModelData"]["Resource"] == f"{bucket}/{prefix}/*"
    assert by_sid["ListModelData"]["Resource"] == bucket
    assert by_sid["ListModelData"]["Condition"] == {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}
    assert by_sid["DecryptModelData"]["Condition"]["StringEquals"]["kms:ViaService"] == (
        "s3.ap-northeast-1.amazonaws.com")
    logs = by_sid["EndpointLogs"]["Resource"]
    assert all(f"/aws/sagemaker/Endpoints/manga-assist-{stage.lower()}-llm" in r for r in logs)
    ecr = [s for s in found if "ecr:BatchGetImage" in s.get("Action", [])]
    assert len(ecr) == 1 and "container-assets" in json.dumps(ecr[0]["Resource"])
    assert "ec2:Vpc" in json.dumps(by_sid["VpcNetworkInterfaces"]["Condition"])
    every_action = {a for s in found for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                 else s["Action"])}
    assert not [a for a in every_action if a.endswith(":*") or a == "*"], every_action
    assert not [a for a in every_action if a.startswith(("s3:Put", "s3:Delete", "sagemaker:"))]


def test_s3_gateway_endpoint_reaches_only_the_artifact_bucket_and_ecr_layers(
    serving: dict[str, Any], stage: str
) -> None:
    settings = load_settings(stage.lower())
    template = Template.from_json(serving)
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {
        "VpcEndpointType": "Gateway",
        "PolicyDocument": {"Statement": Match.array_with([
            Match.object_like({"Sid": "ModelArtifactsOnly", "Resource": [
                f"arn:aws:s3:::{settings.artifact_bucket_name}",
                f"arn:aws:s3:::{settings.artifact_bucket_name}/*"]}),
            Match.object_like({"Sid": "EcrImageLayers"}),
        ])},
    })


def test_model_security_group_has_no_ingress(serving: dict[str, Any]) -> None:
    groups = [r["Properties"] for r in serving["Resources"].values()
              if r["Type"] == "AWS::EC2::SecurityGroup"]
    model_group = next(g for g in groups if g["GroupDescription"].startswith("SageMaker models"))
    assert "SecurityGroupIngress" not in model_group
    assert [e["FromPort"] for e in model_group["SecurityGroupEgress"]] == [443]


def test_vpc_flow_logs_are_encrypted(serving: dict[str, Any]) -> None:
    Template.from_json(serving).has_resource_properties("AWS::Logs::LogGroup", {
        "KmsKeyId": Match.any_value(),
    })
    Template.from_json(serving).resource_count_is("AWS::EC2::FlowLog", 1)
