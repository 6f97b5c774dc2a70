"""The quantization job's stack resources: outputs the launcher reads, a role scoped to its
prefixes, and an S3 gateway endpoint that lets the private subnets write only there.

Role permissions follow "CreateTrainingJob API: Execution Role Permissions"
(https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html#sagemaker-roles-createtrainingjob-perms);
VPC training needs an S3 VPC endpoint ("Give SageMaker AI Training Jobs Access to Resources in
Your Amazon VPC", https://docs.aws.amazon.com/sagemaker/latest/dg/train-vpc.html).
"""

from __future__ import annotations

import json
from typing import Any

from quantization import job_outputs

BUCKET = "manga-assist-prod-models-123456789012-ap-northeast-1"


def role_statements(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [role_id] = [key for key, value in template["Resources"].items()
                 if value["Type"] == "AWS::IAM::Role" and key.startswith("QuantizationJobRole")]
    statements: dict[str, dict[str, Any]] = {}
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in props.get("Roles", []):
            for statement in props["PolicyDocument"]["Statement"]:
                statements[statement.get("Sid", str(statement["Action"]))] = statement
    return statements


def test_every_output_the_launcher_reads_exists(synthesized) -> None:  # type: ignore[no-untyped-def]
    for stage in ("Dev", "Prod"):
        for stack, keys in job_outputs.REQUIRED.items():
            outputs = synthesized.template(f"{stage}/{stack}")["Outputs"]
            assert set(keys) <= set(outputs), (stage, stack)


def test_role_reads_base_models_and_writes_only_candidates_and_reports(
    prod: dict[str, Any],
) -> None:
    """The job never writes the served prefix: a run's model goes to its own versioned prefix
    under quantization.candidates_prefix, and `make promote` copies it, checked."""
    statements = role_statements(prod)
    assert statements["ReadBaseModels"]["Resource"] == f"arn:aws:s3:::{BUCKET}/base-models/*"
    assert statements["WriteModelAndReports"]["Resource"] == [
        f"arn:aws:s3:::{BUCKET}/quantization/models/*",
        f"arn:aws:s3:::{BUCKET}/quantization/runs/*"]
    assert "s3:DeleteObject" not in str(statements["WriteModelAndReports"]["Action"])
    served = f"arn:aws:s3:::{BUCKET}/models/llama-3-8b-instruct-awq/"
    assert served not in json.dumps(list(statements.values()))


def test_no_volume_key_grant_for_a_training_instance_with_local_storage(
    prod: dict[str, Any],
) -> None:
    """ml.g5.4xlarge has NVMe instance storage: "Local storage volumes are encrypted using a
    hardware module on the instance. You can't request a VolumeKmsKeyId when using an instance
    type with local storage" (SageMaker API Reference, ResourceConfig,
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ResourceConfig.html), so the
    role needs no kms:CreateGrant for a volume."""
    assert "VolumeKeyGrant" not in role_statements(prod)


def test_role_trusts_only_sagemaker_in_this_account(prod: dict[str, Any]) -> None:
    [role] = [value for key, value in prod["Resources"].items()
              if key.startswith("QuantizationJobRole") and value["Type"] == "AWS::IAM::Role"]
    [statement] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_the_s3_endpoint_lets_the_subnets_write_only_the_job_outputs(
    prod: dict[str, Any],
) -> None:
    [endpoint] = [value for value in prod["Resources"].values()
                  if value["Type"] == "AWS::EC2::VPCEndpoint"
                  and value["Properties"].get("VpcEndpointType", "Gateway") == "Gateway"]
    writes = [s for s in endpoint["Properties"]["PolicyDocument"]["Statement"]
              if "s3:PutObject" in s["Action"]]
    assert len(writes) == 1
    assert writes[0]["Resource"] == [
        f"arn:aws:s3:::{BUCKET}/quantization/models/*",
        f"arn:aws:s3:::{BUCKET}/quantization/runs/*"]
