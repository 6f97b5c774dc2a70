"""Create the LLM model, endpoint config and endpoint with boto3 from the synthesized properties.

moto's SageMaker checks each call's shape (boto3 validates every parameter against the service
model first) and the cross-references between calls; its instance-type list predates ml.g5, so
that one check is patched (docs/design-decisions.md#moto-limits). Intrinsics are resolved to resources created in moto first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.validate import ParamValidator

from tests.support.aws import fake_credentials
from tests.support.templates import only

moto = pytest.importorskip("moto")
from moto.sagemaker import models as sagemaker_models  # noqa: E402

REGION = "ap-northeast-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    fake_credentials(monkeypatch, REGION)
    monkeypatch.setattr(sagemaker_models.FakeEndpointConfig, "validate_instance_type",
                        lambda self, instance_type: None)
    with moto.mock_aws():
        yield


def resolve(value: Any, refs: dict[str, str]) -> Any:
    """Replace Ref / Fn::GetAtt / Fn::Sub / Fn::Join with the values created in moto."""
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            return refs[value["Ref"]]
        if set(value) == {"Fn::GetAtt"}:
            logical_id, attribute = value["Fn::GetAtt"]
            return refs[f"{logical_id}.{attribute}"]
        if set(value) == {"Fn::Sub"}:
            return value["Fn::Sub"].replace("${AWS::URLSuffix}", "amazonaws.com")
        if set(value) == {"Fn::Join"}:
            separator, parts = value["Fn::Join"]
            return separator.join(str(resolve(p, refs)) for p in parts)
        return {k: resolve(v, refs) for k, v in value.items() if k != "Tags"}
    if isinstance(value, list):
        return [resolve(v, refs) for v in value]
    return value


def test_endpoint_resources_are_accepted_by_the_sagemaker_api(synthesized, aws) -> None:  # type: ignore[no-untyped-def]
    template = synthesized.template("Prod/Serving")
    refs: dict[str, str] = {}

    ec2 = boto3.client("ec2", region_name=REGION)
    vpc_id = ec2.create_vpc(CidrBlock="10.40.0.0/20")["Vpc"]["VpcId"]
    for index, logical_id in enumerate(
        k for k, r in template["Resources"].items() if r["Type"] == "AWS::EC2::Subnet"
    ):
        subnet = ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.40.{index * 4}.0/22")
        refs[logical_id] = subnet["Subnet"]["SubnetId"]
    for logical_id, r in template["Resources"].items():
        if r["Type"] == "AWS::EC2::SecurityGroup":
            group = ec2.create_security_group(GroupName=logical_id, Description="t", VpcId=vpc_id)
            refs[f"{logical_id}.GroupId"] = group["GroupId"]

    iam = boto3.client("iam", region_name=REGION)
    role_id, role = next((k, r["Properties"]) for k, r in template["Resources"].items()
                         if r["Type"] == "AWS::IAM::Role" and k.startswith("LlmEndpointExecutionRole"))
    created_role = iam.create_role(
        RoleName="llm-execution", AssumeRolePolicyDocument=json.dumps(role["AssumeRolePolicyDocument"]))
    refs[f"{role_id}.Arn"] = created_role["Role"]["Arn"]

    sagemaker = boto3.client("sagemaker", region_name=REGION)
    model_id, model = only(template, "AWS::SageMaker::Model", "LlmEndpoint")
    model_props = resolve(model, refs)
    created_model = sagemaker.create_model(ModelName="llm-model", **model_props)
    assert created_model["ModelArn"].endswith("model/llm-model")
    refs[f"{model_id}.ModelName"] = "llm-model"

    config_id, config = only(template, "AWS::SageMaker::EndpointConfig", "LlmEndpoint")
    sagemaker.create_endpoint_config(EndpointConfigName="llm-config-1", **resolve(config, refs))
    refs[f"{config_id}.EndpointConfigName"] = "llm-config-1"

    for logical_id, r in template["Resources"].items():
        if r["Type"] == "AWS::CloudWatch::Alarm" and "AlarmName" in r["Properties"]:
            refs[logical_id] = r["Properties"]["AlarmName"]
    _, endpoint = only(template, "AWS::SageMaker::Endpoint", "LlmEndpoint")
    arguments = resolve(endpoint, refs)
    # CloudFormation sends the retention settings with UpdateEndpoint, not CreateEndpoint: check
    # them against that operation's input shape (moto does not implement update_endpoint).
    update_only = {k: arguments.pop(k) for k in
                   ("RetainAllVariantProperties", "ExcludeRetainedVariantProperties")}
    update_shape = sagemaker.meta.service_model.operation_model("UpdateEndpoint").input_shape
    report = ParamValidator().validate(
        {"EndpointName": arguments["EndpointName"],
         "EndpointConfigName": arguments["EndpointConfigName"],
         "DeploymentConfig": arguments["DeploymentConfig"], **update_only},
        update_shape)
    assert not report.has_errors(), report.generate_report()
    sagemaker.create_endpoint(**arguments)

    described = sagemaker.describe_endpoint(EndpointName="manga-assist-prod-llm")
    assert described["EndpointStatus"] == "InService"
    assert described["EndpointConfigName"] == "llm-config-1"
    variants = sagemaker.describe_endpoint_config(EndpointConfigName="llm-config-1")
    (variant,) = variants["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g5.xlarge"
    assert variant["InitialInstanceCount"] == 2
    described_model = sagemaker.describe_model(ModelName="llm-model")
    # moto 5.2.5 accepts EnableNetworkIsolation but always reports False; the template tests
    # assert it (test_llm_endpoint.py).
    assert described_model["PrimaryContainer"]["Environment"]["ENGINE_MAX_MODEL_LEN"] == "4096"
    assert described_model["VpcConfig"]["Subnets"] == [refs[k] for k in refs if k.startswith(
        "NetworkVpc")]
