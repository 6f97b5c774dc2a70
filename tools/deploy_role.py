"""The GitHub deploy role's permissions: exactly the AWS calls the pipeline's make targets make.

The pipeline (``.github/workflows/deploy-environment.yml``) runs ``make deploy`` and ``make smoke``
with the role it assumes by OIDC, and the role may run ``make publish`` and ``make preflight`` too.
IAM denies whatever no statement allows ("IAM policy evaluation logic": "By default, all requests
are implicitly denied"), so the role must allow every call those targets make with its own
credentials — the CDK CLI's own calls go through the bootstrap roles it assumes:

* ``make deploy``: the CDK CLI assumes the bootstrap roles (``cdk-hnb659fds-*``); the preflight
  reads the bootstrap version (SSM), the stacks (CloudFormation), the artifacts (S3 and, through
  S3, the project key) and the SageMaker quotas (Service Quotas); the image check reads the
  pushed images (ECR); the instance switch reads the endpoints (SageMaker) and their scaling and,
  only for an instance-type change, deregisters a variant (Application Auto Scaling);
* ``make publish``: reads the Foundation stack's outputs, then heads, lists and writes the
  artifacts under the two endpoints' prefixes (inside ``artifacts.models_prefix``), with the
  project key through S3;
* ``make smoke``: invokes the two endpoints.

The S3 statements cover ``artifacts.models_prefix`` (``models/``), not the two prefixes the
endpoints serve now: ``make promote`` serves a quantization run only from a *new*
``llm.model.artifact_prefix``, and a policy scoped to the old one — attached by hand — would
refuse the next pipeline deploy's preflight there. The settings keep every served model under
``artifacts.models_prefix`` and quantization's base models, candidates and reports outside it,
so the role still reads nothing the quantization job reads or writes, and the policy does not
change when a model is promoted (``tests/tools/test_promote.py`` records the preflight after a
promotion and decides its calls against the policy built before it).

:func:`deploy_role_policy` is the policy for one environment; ``python -m tools.pipeline_settings
--env <env> --deploy-role-policy`` prints it, docs/delivery.md shows Prod's, and
``tests/tools/test_deploy_role.py`` runs the three targets against moto, records every call the
role's credentials make and checks each against this policy.

Pure module: settings in, a policy document out.
"""

from __future__ import annotations

from typing import Any

from stacks.artifact_layout import artifact_layout
from stacks.settings import EnvironmentSettings

BOOTSTRAP_QUALIFIER = "hnb659fds"
"""The CDK's default bootstrap qualifier (the synthesized templates' BootstrapVersion parameter)."""


class DeployRoleError(ValueError):
    """The settings cannot give the role a least-privilege policy; the message says why."""


def _statement(sid: str, actions: list[str], resources: list[str] | str,
               condition: dict[str, Any] | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": actions,
                                 "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def _environment_tag(settings: EnvironmentSettings) -> str:
    tag = settings.tags.get("Environment")
    if not tag:
        raise DeployRoleError(
            f"config/{settings.name}.yaml: tags.Environment is missing: the deploy role may "
            "deregister only this environment's scalable targets, which it tells by that tag")
    return tag


def deploy_role_policy(settings: EnvironmentSettings) -> dict[str, Any]:
    """The deploy role's identity policy for ``settings``' environment."""
    account, region = settings.account, settings.region
    bucket, models = artifact_layout(settings).bucket, settings.artifacts.models_prefix

    def arn(service: str, resource: str) -> str:
        return f"arn:aws:{service}:{region}:{account}:{resource}"

    endpoints = [f"{settings.resource_prefix}-{tier}" for tier in ("llm", "intent")]
    stacks = ["CDKToolkit", settings.foundation_stack_name, settings.serving_stack_name]
    via_s3 = {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"},
              "ForAnyValue:StringEquals": {
                  "kms:ResourceAliases": [f"alias/{settings.resource_prefix}"]}}
    return {"Version": "2012-10-17", "Statement": [
        _statement("AssumeCdkBootstrapRoles", ["sts:AssumeRole"],
                   f"arn:aws:iam::{account}:role/cdk-{BOOTSTRAP_QUALIFIER}-*-{account}-{region}"),
        _statement("ReadStacks", ["cloudformation:DescribeStacks"],
                   [arn("cloudformation", f"stack/{name}/*") for name in stacks]),
        _statement("ReadBootstrapVersion", ["ssm:GetParameter"],
                   arn("ssm", f"parameter/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version")),
        _statement("ReadSageMakerQuotas", ["servicequotas:ListServiceQuotas",
                                           "servicequotas:ListAWSDefaultServiceQuotas"], "*"),
        _statement("ListArtifacts", ["s3:ListBucket"], f"arn:aws:s3:::{bucket}",
                   {"StringLike": {"s3:prefix": [f"{models}/*"]}}),
        _statement("ReadAndPublishArtifacts",
                   ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                   f"arn:aws:s3:::{bucket}/{models}/*"),
        _statement("ProjectKeyThroughS3", ["kms:Decrypt", "kms:GenerateDataKey"],
                   arn("kms", "key/*"), via_s3),
        _statement("CheckPublishedImages", ["ecr:DescribeImages"], arn(
            "ecr", f"repository/cdk-{BOOTSTRAP_QUALIFIER}-container-assets-{account}-{region}")),
        _statement("ReadEndpoints", ["sagemaker:DescribeEndpoint"],
                   [arn("sagemaker", f"endpoint/{name}") for name in endpoints]),
        _statement("ReadEndpointConfigs", ["sagemaker:DescribeEndpointConfig"],
                   arn("sagemaker", "endpoint-config/*")),
        _statement("ReadScaling", ["application-autoscaling:DescribeScalableTargets",
                                   "application-autoscaling:DescribeScalingPolicies",
                                   "application-autoscaling:DescribeScheduledActions"], "*"),
        _statement("DeregisterForAnInstanceTypeChange",
                   ["application-autoscaling:DeregisterScalableTarget",
                    "application-autoscaling:DeleteScalingPolicy",
                    "application-autoscaling:DeleteScheduledAction"],
                   arn("application-autoscaling", "scalable-target/*"),
                   {"StringEquals": {"aws:ResourceTag/Environment": _environment_tag(settings)}}),
        _statement("SmokeTestEndpoints", ["sagemaker:InvokeEndpoint",
                                          "sagemaker:InvokeEndpointWithResponseStream"],
                   [arn("sagemaker", f"endpoint/{name}") for name in endpoints]),
    ]}
