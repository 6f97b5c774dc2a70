"""The GitHub deploy role's documented policy allows every AWS call `make deploy`, `make publish`
and `make preflight` make with its credentials — recorded, not listed by hand.

IAM: "By default, all requests are implicitly denied"; a request is allowed only when a policy
statement allows it and none denies it ("Policy evaluation logic", IAM User Guide,
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html). The
previous documented policy allowed only sts:AssumeRole on the cdk roles and endpoint invoke; the
preflight's first SSM read would have stopped the pipeline with "AWS refused a read".

The README's first deploy runs here, as the pipeline would, against a moto server that records
every signed request (tests/tools/aws_calls.py), with the real Makefile, the real tools and the
real CDK CLI (its JavaScript SDK reaches the server through ``AWS_ENDPOINT_URL``), all signing as
the deploy role's session: ``make deploy`` (Foundation, then the preflight stops it: nothing
published), ``make publish`` (a weights file above the multipart threshold), ``make preflight``,
``make deploy`` again (Foundation unchanged, preflight, the Serving stack's assets — the images
already in ECR, so no Docker build — the image check, the instance switch, which deregisters an
intent variant deployed on inf2 while dev configures inf1, and the Serving stack). Every call
signed with the role's key is turned into the IAM permissions it needs
(``required_permissions``: action, resource ARN, condition keys, and what S3 asks KMS for on the
caller's behalf) and decided against ``tools.deploy_role.deploy_role_policy`` — the policy
docs/delivery.md shows. Calls the CLI makes with the bootstrap roles it assumes are theirs.

What moto cannot do here: create the Serving stack (its CloudFormation refuses the template's IAM
policies, "MalformedPolicyDocument"; custom resources would need Docker), so the last step fails
inside moto after the CLI's own calls; and two gaps of its change sets are closed in
tests/tools/moto_fixes.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stacks.settings import REPO_ROOT, load_settings
from tests.support.artifacts import write_adapters, write_intent_archive, write_model_dir
from tests.support.network import free_port
from tests.tools.aws_calls import (
    Call,
    Permission,
    RecordingMotoServer,
    evaluate,
    required_permissions,
    unauthorized,
)
from tests.tools.moto_fixes import patched
from tools.deploy_role import deploy_role_policy

DEV = load_settings("dev")
ACCOUNT, REGION = DEV.account, DEV.region
ROLE_KEY = "ASIADEPLOYROLESESSION0"
"""The access key of the deploy role's session (what configure-aws-credentials exports)."""
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
INTENT = f"endpoint/{DEV.resource_prefix}-intent/variant/AllTraffic"
RESOURCE_CONTEXT = {"kms:ResourceAliases": [f"alias/{DEV.resource_prefix}"],
                    "aws:ResourceTag/Environment": DEV.tags["Environment"]}
"""What the resources carry: the Foundation stack's key alias (checked below, as moto created
it) and the stage's Environment tag on every scalable target (checked over the template)."""
AZ_CONTEXT = {f"availability-zones:account={ACCOUNT}:region={REGION}":
              ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"]}
"""What `cdk synth` looks up with credentials and writes to cdk.context.json; given here so the
assembly needs no lookup."""


@dataclass
class Recorded:
    calls: list[Call]
    runs: dict[str, subprocess.CompletedProcess[str]]
    docker_log: Path
    key_aliases: list[str]

    @property
    def role_calls(self) -> list[Call]:
        return [call for call in self.calls if call.access_key == ROLE_KEY]


def _quotas(self: Any) -> str:
    """moto's Service Quotas knows only VPC quotas; SageMaker's, as an account has them."""
    names = {"ml.g5.xlarge for endpoint usage": "L-1928E07B",
             "ml.inf1.xlarge for endpoint usage": "L-A5F0F5E1",
             "ml.g5.4xlarge for training job usage": "L-TRAINING"}
    return json.dumps({"Quotas": [{"ServiceCode": "sagemaker", "QuotaName": name,
                                   "QuotaCode": code, "Value": 100.0}
                                  for name, code in names.items()]})


def _bootstrap(url: str) -> Any:
    """What `cdk bootstrap` leaves (the toolkit stack, its version, staging bucket and image
    repository), made as an administrator."""
    import boto3

    kwargs = {"region_name": REGION, "endpoint_url": url, "aws_access_key_id": "admin",
              "aws_secret_access_key": "x"}
    boto3.client("s3", **kwargs).create_bucket(
        Bucket=f"cdk-hnb659fds-assets-{ACCOUNT}-{REGION}",
        CreateBucketConfiguration={"LocationConstraint": REGION})
    boto3.client("ssm", **kwargs).put_parameter(Name="/cdk-bootstrap/hnb659fds/version",
                                                Value="28", Type="String")
    boto3.client("cloudformation", **kwargs).create_stack(
        StackName="CDKToolkit", TemplateBody=json.dumps(
            {"Resources": {"Staging": {"Type": "AWS::SNS::Topic"}}}))
    boto3.client("ecr", **kwargs).create_repository(
        repositoryName=f"cdk-hnb659fds-container-assets-{ACCOUNT}-{REGION}")
    return kwargs


def _images_pushed(kwargs: dict[str, Any], assembly: Path) -> None:
    """The three images, as an earlier run of this commit pushed them (nothing builds here)."""
    import boto3

    ecr = boto3.client("ecr", **kwargs)
    assets = json.loads(next((assembly / "assembly-Dev").glob("DevServing*.assets.json"))
                        .read_text())
    for image in assets["dockerImages"].values():
        for destination in image["destinations"].values():
            ecr.put_image(repositoryName=destination["repositoryName"],
                          imageTag=destination["imageTag"], imageManifestMediaType=DOCKER_V2,
                          imageManifest=json.dumps({
                              "schemaVersion": 2, "mediaType": DOCKER_V2, "layers": [],
                              "config": {"mediaType": "application/vnd.docker.container.image"
                                                      ".v1+json", "size": 1,
                                         "digest": "sha256:" + "a" * 64}}))


def _intent_deployed_on_inf2(kwargs: dict[str, Any]) -> None:
    """A dev intent endpoint running ml.inf2.xlarge while config/dev.yaml says inf1, registered
    with a policy and tagged as the stage tags it: what the instance switch deregisters."""
    import boto3

    sagemaker = boto3.client("sagemaker", **kwargs)
    sagemaker.create_model(ModelName="intent", ExecutionRoleArn=f"arn:aws:iam::{ACCOUNT}:role/r",
                           PrimaryContainer={"Image": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/i"})
    sagemaker.create_endpoint_config(EndpointConfigName="IntentEndpointConfig-1",
                                     ProductionVariants=[{
                                         "VariantName": "AllTraffic", "ModelName": "intent",
                                         "InitialInstanceCount": 1,
                                         "InstanceType": "ml.inf2.xlarge"}])
    sagemaker.create_endpoint(EndpointName=f"{DEV.resource_prefix}-intent",
                              EndpointConfigName="IntentEndpointConfig-1")
    autoscaling = boto3.client("application-autoscaling", **kwargs)
    key = {"ServiceNamespace": "sagemaker", "ResourceId": INTENT,
           "ScalableDimension": "sagemaker:variant:DesiredInstanceCount"}
    autoscaling.register_scalable_target(MinCapacity=1, MaxCapacity=2, Tags=dict(DEV.tags), **key)
    autoscaling.put_scaling_policy(
        PolicyName="tracking", PolicyType="TargetTrackingScaling", **key,
        TargetTrackingScalingPolicyConfiguration={"TargetValue": 100.0,
                                                  "PredefinedMetricSpecification": {
                                                      "PredefinedMetricType":
                                                      "SageMakerVariantInvocationsPerInstance"}})


def _assembly(tmp: Path) -> Path:
    from stacks.synth import synthesize

    out = tmp / "cdk.out"
    assert synthesize(["dev"], outdir=str(out), context=AZ_CONTEXT) == 0
    assert "missing" not in json.loads((out / "assembly-Dev" / "manifest.json").read_text())
    return out


def _make(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-o", "synth", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    import moto.sagemaker.models as sagemaker
    import moto.servicequotas.responses as quotas
    from moto.moto_api._internal.models import moto_api_backend

    tmp = tmp_path_factory.mktemp("first-deploy")
    assembly = _assembly(tmp)
    context_file = REPO_ROOT / "cdk.context.json"
    context_before = context_file.read_bytes()
    server = RecordingMotoServer(free_port())
    with patched(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(quotas.ServiceQuotasResponse, "list_service_quotas", _quotas,
                      raising=False)
        # moto's instance-type list predates ml.g5 and ml.inf2 (docs/design-decisions.md#moto-limits).
        patch.setattr(sagemaker.FakeEndpointConfig, "validate_instance_type",
                      lambda self, instance_type: None)
        # moto's backends are this process's: a module run before on the same xdist worker may
        # have left the README's stacks in them, and the first deploy would then update, not create
        moto_api_backend.reset()
        server.start()
        try:
            kwargs = _bootstrap(server.endpoint_url)
            _images_pushed(kwargs, assembly)
            _intent_deployed_on_inf2(kwargs)
            docker_log = tmp / "docker.log"
            docker = tmp / "docker"
            docker.write_text(f'#!/bin/sh\necho "docker $*" >> {docker_log}\nexit 1\n')
            docker.chmod(0o755)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
            env.update(AWS_ENDPOINT_URL=server.endpoint_url, AWS_ACCESS_KEY_ID=ROLE_KEY,
                       AWS_SECRET_ACCESS_KEY="x", AWS_SESSION_TOKEN="token", AWS_REGION=REGION,
                       AWS_DEFAULT_REGION=REGION, CDK_DOCKER=str(docker), HOME=str(tmp),
                       CDK_DISABLE_CLI_TELEMETRY="1")
            deploy = ("deploy", "ENV=dev", f"ASSEMBLY={assembly}",
                      f"CDK={REPO_ROOT / 'node_modules/.bin/cdk'}",
                      "DEPLOY_ARGS=--require-approval never")
            runs = {"deploy (nothing published)": _make(env, *deploy)}
            model = write_model_dir(tmp / "model", weights_bytes=65 * 1024 * 1024)
            runs["publish"] = _make(env, "publish", "ENV=dev", f"MODEL={model}",
                                    f"ADAPTERS={write_adapters(tmp / 'lora')}",
                                    f"INTENT={write_intent_archive(tmp / 'intent')}")
            runs["preflight"] = _make(env, "preflight", "ENV=dev", f"ASSEMBLY={assembly}")
            runs["deploy"] = _make(env, *deploy)
            import boto3

            aliases = [a["AliasName"] for a in boto3.client("kms", **kwargs).list_aliases()[
                "Aliases"]]
            yield Recorded(list(server.calls), runs, docker_log, aliases)
        finally:
            server.stop()
            moto_api_backend.reset()  # and leaves nothing for the modules after it on the worker
            if context_file.read_bytes() != context_before:
                context_file.write_bytes(context_before)
                pytest.fail("the CDK CLI wrote cdk.context.json (a lookup): restored it")


@pytest.mark.budget(reason="the module's recorded fixture runs the README's deploy sequence in its setup: make deploy, make publish, make preflight, make deploy against moto, each make deploy a synthesis through the CDK CLI (38-45 s on the quiet machine)")
def test_the_readme_first_deploy_runs_as_the_deploy_role(recorded: Recorded) -> None:
    first = recorded.runs["deploy (nothing published)"]
    assert first.returncode != 0
    assert "✅  Dev/Foundation (Dev-Foundation)" in first.stdout + first.stderr
    assert "artifact-manifest.json: missing, so the llm endpoint's artifacts were never " \
           "published" in first.stderr
    publish = recorded.runs["publish"]
    assert publish.returncode == 0, publish.stderr[-2000:]
    assert "publish: done" in publish.stderr
    preflight = recorded.runs["preflight"]
    assert preflight.returncode == 0, preflight.stderr[-2000:]
    assert "preflight: ready to deploy Dev-Serving" in preflight.stderr
    deploy = recorded.runs["deploy"]
    output = deploy.stdout + deploy.stderr
    for line in ("preflight: ready to deploy Dev-Serving", "Assets published successfully",
                 f"ok: LlmEndpoint/Image: {DOCKER_V2}", f"deregistered {INTENT}: ",
                 "Dev-Serving: creating CloudFormation changeset..."):
        assert line in output, line
    # The images were in ECR: the CLI built none (the Docker stand-in fails every call).
    assert not recorded.docker_log.exists()
    # moto's CloudFormation cannot create the Serving stack: the last step fails there.
    assert deploy.returncode != 0
    assert "MalformedPolicyDocument" in output


def test_every_call_the_role_makes_is_allowed_by_the_documented_policy(
    recorded: Recorded,
) -> None:
    calls = recorded.role_calls
    made = Counter((call.service, call.operation) for call in calls)
    # Not vacuous: the three targets' calls, including a multipart upload and a deregistration.
    for operation in [("sts", "AssumeRole"), ("ssm", "GetParameter"),
                      ("cloudformation", "DescribeStacks"), ("s3", "HeadObject"),
                      ("s3", "GetObject"), ("s3", "PutObject"), ("s3", "ListObjectsV2"),
                      ("s3", "CreateMultipartUpload"), ("s3", "UploadPart"),
                      ("s3", "CompleteMultipartUpload"), ("servicequotas", "ListServiceQuotas"),
                      ("ecr", "DescribeImages"), ("sagemaker", "DescribeEndpoint"),
                      ("sagemaker", "DescribeEndpointConfig"),
                      ("application-autoscaling", "DeregisterScalableTarget")]:
        assert made[operation], operation
    assert unauthorized(calls, deploy_role_policy(DEV), ACCOUNT, RESOURCE_CONTEXT) == []
    assert RESOURCE_CONTEXT["kms:ResourceAliases"][0] in recorded.key_aliases


def test_every_statement_is_used_but_the_smoke_tests(recorded: Recorded) -> None:
    policy = deploy_role_policy(DEV)
    used: set[str] = set()
    for call in recorded.role_calls:
        for permission in required_permissions(call, ACCOUNT, RESOURCE_CONTEXT):
            allowed, why = evaluate(policy, permission)
            used.update(re.findall(r"'([A-Za-z0-9]+)'", why) if allowed else [])
    # make smoke is not one of the three targets (it invokes the endpoints, tools/smoke.py).
    assert used == {s["Sid"] for s in policy["Statement"]} - {"SmokeTestEndpoints"}


def test_the_role_assumes_only_the_bootstrap_roles(recorded: Recorded) -> None:
    roles = {call.params["RoleArn"] for call in recorded.role_calls
             if call.operation == "AssumeRole"}
    prefix = f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-"
    assert {role.removeprefix(prefix).removesuffix(f"-{ACCOUNT}-{REGION}") for role in roles} \
        >= {"deploy-role", "file-publishing-role", "image-publishing-role"}
    assert all(role.startswith(prefix) for role in roles)


def test_a_policy_without_a_statement_the_tools_need_is_caught(recorded: Recorded) -> None:
    policy = deploy_role_policy(DEV)
    narrowed = {**policy, "Statement": [s for s in policy["Statement"]
                                        if s["Sid"] != "ReadBootstrapVersion"]}
    refused = unauthorized(recorded.role_calls, narrowed, ACCOUNT, RESOURCE_CONTEXT)
    assert refused and all(line.startswith("ssm:GetParameter needs ssm:GetParameter on "
                                           f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/"
                                           "cdk-bootstrap/hnb659fds/version") for line in refused)
    # The policy the docs had before: AssumeRole and invoke only.
    before = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "sts:AssumeRole",
         "Resource": f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-*-{ACCOUNT}-{REGION}"}]}
    missing = {line.split(" needs ")[1].split(" on ")[0]
               for line in unauthorized(recorded.role_calls, before, ACCOUNT, RESOURCE_CONTEXT)}
    assert {"ssm:GetParameter", "cloudformation:DescribeStacks", "s3:GetObject",
            "kms:Decrypt", "servicequotas:ListServiceQuotas"} <= missing


def test_iam_evaluation_as_modelled() -> None:
    policy = {"Statement": [
        {"Sid": "All", "Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Sid": "NotLogs", "Effect": "Deny", "Action": "s3:PutObject",
         "Resource": "arn:aws:s3:::b/logs/*"},
        {"Sid": "ViaS3", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*",
         "Condition": {"StringEquals": {"kms:ViaService": "s3.ap-northeast-1.amazonaws.com"}}}]}
    assert evaluate(policy, Permission("s3:PutObject", "arn:aws:s3:::b/x"))[0]
    assert evaluate(policy, Permission("s3:PutObject", "arn:aws:s3:::b/logs/x")) == (
        False, "explicitly denied by ['NotLogs']")
    assert not evaluate(policy, Permission("kms:Decrypt", "arn:aws:kms:x"))[0]  # no ViaService
    assert evaluate(policy, Permission("kms:Decrypt", "arn:aws:kms:x", {
        "kms:ViaService": "s3.ap-northeast-1.amazonaws.com"}))[0]
    with pytest.raises(ValueError, match="NumericLessThan is not modelled"):
        evaluate({"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*",
                                 "Condition": {"NumericLessThan": {"k": "1"}}}]},
                 Permission("s3:GetObject", "*", {"k": "0"}))


def test_the_documented_policy_is_the_one_the_tool_prints() -> None:
    """docs/delivery.md shows Prod's policy; `python -m tools.pipeline_settings --env prod
    --deploy-role-policy` prints the same, and tools/deploy_role.py builds it."""
    docs = (REPO_ROOT / "docs" / "delivery.md").read_text(encoding="utf-8")
    start = docs.index("<!-- deploy-role-policy: prod -->")
    block = docs[start:].split("```json\n", 1)[1].split("```", 1)[0]
    printed = subprocess.run(
        [str(REPO_ROOT / ".venv/bin/python"), "-m", "tools.pipeline_settings", "--env", "prod",
         "--deploy-role-policy"], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        timeout=60).stdout
    expected = json.dumps(deploy_role_policy(load_settings("prod")), indent=2) + "\n"
    assert printed == expected
    assert block == expected
