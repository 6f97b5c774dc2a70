"""Both endpoints' execution roles carry what SageMaker documents for hosting, each scoped.

SageMaker Developer Guide, "How to use SageMaker AI execution roles", section "CreateModel API:
Execution Role Permissions"
(https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html#sagemaker-roles-createmodel-perms):
the policy a role passed to CreateModel needs lists cloudwatch:PutMetricData,
logs:CreateLogStream, logs:PutLogEvents, logs:CreateLogGroup, logs:DescribeLogStreams,
s3:GetObject, s3:ListBucket, ecr:GetAuthorizationToken, ecr:BatchCheckLayerAvailability,
ecr:GetDownloadUrlForLayer and ecr:BatchGetImage; "Scope S3 permissions to objects that you
specify in the PrimaryContainer.ModelDataUrl", "Scope Amazon ECR permissions to a specific
registry path"; "The cloudwatch and logs actions are applicable for "*" resources". And: "If you
plan to use the SageMaker deployment guardrails feature [...] ensure that your execution role has
permission to perform the cloudwatch:DescribeAlarms action on your auto-rollback alarms."

Without cloudwatch:PutMetricData the endpoint-instance metrics (/aws/sagemaker/Endpoints:
GPUMemoryUtilization, which an alarm and the dashboard read) may never appear; main lacked it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.artifact_layout import artifact_layout
from stacks.settings import load_settings
from tests.stacks.policy_model import _glob

CREATE_MODEL_EXECUTION_ROLE_ACTIONS: tuple[str, ...] = (
    "cloudwatch:PutMetricData",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:CreateLogGroup",
    "logs:DescribeLogStreams",
    "s3:GetObject",
    "s3:ListBucket",
    "ecr:GetAuthorizationToken",
    "ecr:BatchCheckLayerAvailability",
    "ecr:GetDownloadUrlForLayer",
    "ecr:BatchGetImage",
)
"""The documented list, in the page's order."""

ENDPOINTS = ("llm", "intent")


def role_statements(template: dict[str, Any], endpoint: str) -> list[dict[str, Any]]:
    prefix = {"llm": "LlmEndpointExecutionRole", "intent": "IntentEndpointExecutionRole"}[endpoint]
    found = [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
             and any(ref["Ref"].startswith(prefix) for ref in r["Properties"]["Roles"])
             for s in r["Properties"]["PolicyDocument"]["Statement"]]
    assert found, f"no policy on {prefix}"
    return found


def granting(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    """The Allow statements whose Action covers ``action``."""
    return [s for s in statements if s["Effect"] == "Allow" and any(
        _glob(a, action, ignore_case=True)
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))]


def resources(statement: dict[str, Any]) -> list[str]:
    value = statement["Resource"]
    return [json.dumps(r) if not isinstance(r, str) else r
            for r in (value if isinstance(value, list) else [value])]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_documented_hosting_permission_is_granted(synthesized, stage: str,  # type: ignore[no-untyped-def]
                                                        endpoint: str) -> None:
    statements = role_statements(synthesized.template(f"{stage}/Serving"), endpoint)
    missing = [a for a in CREATE_MODEL_EXECUTION_ROLE_ACTIONS if not granting(statements, a)]
    assert missing == [], f"{stage} {endpoint} role lacks {missing}"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_each_permission_is_scoped_as_tightly_as_the_service_allows(
        synthesized, stage: str, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings(stage.lower())
    layout = artifact_layout(settings)
    artifact = layout.llm if endpoint == "llm" else layout.intent
    endpoint_name = f"manga-assist-{stage.lower()}-{endpoint}"
    statements = role_statements(synthesized.template(f"{stage}/Serving"), endpoint)

    (metrics,) = granting(statements, "cloudwatch:PutMetricData")
    assert metrics["Resource"] == "*"  # PutMetricData has no resource types
    assert metrics["Condition"] == {"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}}
    for action in ("logs:CreateLogStream", "logs:PutLogEvents", "logs:CreateLogGroup",
                   "logs:DescribeLogStreams"):
        for statement in granting(statements, action):
            assert all(f"log-group:/aws/sagemaker/Endpoints/{endpoint_name}" in r
                       for r in resources(statement)), statement
    (read,) = granting(statements, "s3:GetObject")
    assert read["Resource"] == f"arn:aws:s3:::{layout.bucket}/{artifact.read_prefix}/*"
    (listing,) = granting(statements, "s3:ListBucket")
    assert listing["Resource"] == f"arn:aws:s3:::{layout.bucket}"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{artifact.read_prefix}/*"]}}
    (token,) = granting(statements, "ecr:GetAuthorizationToken")
    assert token["Resource"] == "*"  # no resource types: the token is account-wide
    for action in ("ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
                   "ecr:BatchGetImage"):
        (pull,) = granting(statements, action)
        assert all(r.startswith("arn:aws:ecr:ap-northeast-1:123456789012:repository/")
                   for r in resources(pull)), pull


def test_the_llm_role_reads_its_rollback_alarms_and_the_inf1_role_has_none(
        synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    template = synthesized.template(f"{stage}/Serving")
    assert granting(role_statements(template, "llm"), "cloudwatch:DescribeAlarms")
    # Inf1 has no deployment guardrails, hence no auto-rollback alarms to read.
    assert not granting(role_statements(template, "intent"), "cloudwatch:DescribeAlarms")


LOG_STREAM_ACTIONS = ("logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams")


def test_every_log_permission_names_the_log_group_in_the_form_iam_needs(
        synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    """CloudWatch Logs User Guide, "Overview of managing access permissions to your CloudWatch
    Logs resources"
    (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/iam-access-control-overview-cwl.html):
    a log group has two ARNs, ``arn:aws:logs:region:account-id:log-group:log_group_name`` and the
    same with ``:*``; "Use the second version, with the trailing :*, to refer to the ARN when
    specifying permissions in IAM policies for all other API actions" than tagging. A statement
    that names only ``log-group:NAME`` and ``…:log-stream:*`` leaves SageMaker's log shipping to
    chance, and with it every EMF metric and the alarms on them.

    Every statement of either Serving stack that grants a log-stream action on a named log group
    (the endpoints' execution roles, the quantization job's role) includes ``log-group:NAME:*``.
    """
    template = synthesized.template(f"{stage}/Serving")
    named: list[tuple[str, list[str]]] = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) \
                else [statement["Action"]]
            literal = [r for r in resources(statement) if ":log-group:/aws/sagemaker/" in r]
            if statement["Effect"] == "Allow" and set(actions) & set(LOG_STREAM_ACTIONS) \
                    and literal:
                named.append((statement.get("Sid", "?"), literal))
    assert sorted(sid for sid, _ in named) == ["EndpointLogs", "EndpointLogs", "TrainingLogs"]
    for sid, arns in named:
        groups = {arn.split(":log-group:")[1].split(":")[0] for arn in arns}
        assert len(groups) == 1, (sid, arns)
        (group,) = groups
        prefix = f"arn:aws:logs:ap-northeast-1:123456789012:log-group:{group}"
        assert sorted(arns) == [prefix, f"{prefix}:*"], (sid, arns)
        stream = f"{prefix}:log-stream:AllTraffic/i-0123456789abcdef0"
        assert any(_glob(arn, stream, ignore_case=False) for arn in arns), (sid, arns)
