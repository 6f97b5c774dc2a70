"""`make preflight` against moto (STS, SSM, CloudFormation, S3, KMS) and, because moto's Service
Quotas knows only VPC quotas, botocore's Stubber for SageMaker's quotas.

AWS's rules behind the checks:

* the synthesized templates carry CDK's ``CheckBootstrapVersion`` rule ("CDK bootstrap stack
  version 6 required. Please run 'cdk bootstrap' ...") reading the SSM parameter
  ``/cdk-bootstrap/hnb659fds/version``: a template deployed into an older or missing bootstrap
  fails there;
* SageMaker Developer Guide, Blue/Green Deployments
  (https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-blue-green.html):
  "SageMaker AI provisions a new fleet with the updates (the green fleet). Then, SageMaker AI
  shifts traffic from the old fleet (the blue fleet) to the green fleet" — both fleets exist
  during an update, so the "<type> for endpoint usage" quota must hold twice the maximum;
* Service Quotas: "quotas ... are Region-specific" and apply per account ("What is Service
  Quotas?", https://docs.aws.amazon.com/servicequotas/latest/userguide/intro.html): the embedded
  dev and prod share account 123456789012 and ap-northeast-1, so their needs add up; the
  quantization job's instance draws on "<type> for training job usage", a quota of its own
  (SageMaker's ResourceLimitExceeded names it: "The account-level service limit
  'ml.g5.4xlarge for training job usage' is 0 Instances").
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from stacks.artifact_layout import artifact_layout
from stacks.settings import load_settings
from tests.support.artifacts import write_adapters, write_intent_archive, write_model_dir
from tests.support.aws import aws_environment, fake_credentials
from tools.preflight.__main__ import main as preflight
from tools.preflight.checks import bootstrap_requirement, quota_needs
from tools.publish.__main__ import main as publish

DEV = load_settings("dev")
LAYOUT = artifact_layout(DEV)
QUOTA_CODES = {"ml.g5.xlarge for endpoint usage": "L-1928E07B",
               "ml.inf1.xlarge for endpoint usage": "L-A5F0F5E1",
               "ml.g5.4xlarge for training job usage": "L-TRAINING-G54XL"}


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_credentials(monkeypatch, DEV.region)


class StubbedQuotas:
    """A session whose service-quotas client answers from a Stubber; the rest is moto."""

    def __init__(self, session: Any, quotas: dict[str, float]) -> None:
        self.session = session
        self.quotas_client = session.client("service-quotas")
        self.stubber = Stubber(self.quotas_client)
        self.stubber.add_response("list_service_quotas", {"Quotas": [
            {"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": QUOTA_CODES[name],
             "Value": value, "Adjustable": True, "GlobalQuota": False}
            for name, value in quotas.items()]}, {"ServiceCode": "sagemaker"})
        if set(quotas) != set(QUOTA_CODES):
            self.stubber.add_response("list_aws_default_service_quotas", {"Quotas": []},
                                      {"ServiceCode": "sagemaker"})
        self.stubber.activate()

    def client(self, name: str) -> Any:
        return self.quotas_client if name == "service-quotas" else self.session.client(name)


def bootstrap(session: Any, version: str = "28") -> None:
    """What `cdk bootstrap` leaves: the CDKToolkit stack and its version parameter."""
    session.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value=version,
                                        Type="String")
    template = {"Resources": {"StagingBucket": {"Type": "AWS::SNS::Topic"}}}
    session.client("cloudformation").create_stack(StackName="CDKToolkit",
                                                  TemplateBody=json.dumps(template))


def publish_all(tmp_path: Path, session: Any) -> None:
    code = publish(["--env", "dev", "--model", str(write_model_dir(tmp_path / "model")),
                    "--adapters", str(write_adapters(tmp_path / "lora")),
                    "--intent", str(write_intent_archive(tmp_path / "intent"))],
                   session=session, out=io.StringIO())
    assert code == 0


def run(session: Any, assembly: Path, quotas: dict[str, float] | None = None
        ) -> tuple[int, list[str]]:
    stubbed = StubbedQuotas(session, quotas if quotas is not None else dict.fromkeys(
        QUOTA_CODES, 100.0))
    out = io.StringIO()
    code = preflight(["--env", "dev", "--assembly", str(assembly)], session=stubbed, out=out)
    stubbed.stubber.assert_no_pending_responses()
    return code, out.getvalue().strip().splitlines()


def problems(lines: list[str]) -> list[str]:
    return [line.removeprefix("preflight: ") for line in lines
            if line.startswith("preflight: ") and "problem(s)" not in line]


@pytest.fixture
def ready(tmp_path: Path) -> Iterator[Any]:
    with aws_environment(DEV) as aws:
        bootstrap(aws.session)
        publish_all(tmp_path, aws.session)
        yield aws


def test_a_ready_account_passes(ready: Any, synthesized: Any) -> None:
    code, lines = run(ready.session, synthesized.outdir)
    assert code == 0, lines
    assert lines[-1] == "preflight: ready to deploy Dev-Serving"
    assert "ok: CDK bootstrap version 28 (the templates need 6)" in lines
    assert "ok: llm artifacts match s3://manga-assist-dev-models-123456789012-ap-northeast-1/" \
           "models/llama-3-8b-instruct-awq/artifact-manifest.json" in lines


def test_an_empty_account_gets_one_line_per_fix(synthesized: Any) -> None:
    with aws_environment(DEV, foundation=False, bucket=False) as aws:
        code, lines = run(aws.session, synthesized.outdir,
                          {"ml.g5.xlarge for endpoint usage": 0.0,
                           "ml.inf1.xlarge for endpoint usage": 2.0,
                           "ml.g5.4xlarge for training job usage": 0.0})
    assert code == 1
    assert problems(lines) == [
        "123456789012/ap-northeast-1 is not bootstrapped for the CDK (no SSM parameter "
        "/cdk-bootstrap/hnb659fds/version): run npx cdk bootstrap aws://123456789012/"
        "ap-northeast-1",
        "stack Dev-Foundation is not deployed: make deploy ENV=dev deploys it first",
        "SageMaker quota 'ml.g5.4xlarge for training job usage' is 0 in ap-northeast-1, 2 "
        "needed (dev: make quantize; prod: make quantize): aws service-quotas "
        "request-service-quota-increase --service-code sagemaker --quota-code L-TRAINING-G54XL "
        "--desired-value 2 --region ap-northeast-1",
        "SageMaker quota 'ml.g5.xlarge for endpoint usage' is 0 in ap-northeast-1, 64 needed "
        "(dev llm: max_capacity 2 + a blue/green green fleet of 2; prod llm: max_capacity 30 + "
        "a blue/green green fleet of 30): aws service-quotas request-service-quota-increase "
        "--service-code sagemaker --quota-code L-1928E07B --desired-value 64 "
        "--region ap-northeast-1",
        "SageMaker quota 'ml.inf1.xlarge for endpoint usage' is 2 in ap-northeast-1, 20 needed "
        "(dev intent: max_capacity 2 + a blue/green green fleet of 2; prod intent: max_capacity "
        "8 + a blue/green green fleet of 8): aws service-quotas request-service-quota-increase "
        "--service-code sagemaker --quota-code L-A5F0F5E1 --desired-value 20 "
        "--region ap-northeast-1",
    ]


def test_an_old_bootstrap_is_refused(synthesized: Any, tmp_path: Path) -> None:
    with aws_environment(DEV) as aws:
        bootstrap(aws.session, version="5")
        publish_all(tmp_path, aws.session)
        code, lines = run(aws.session, synthesized.outdir)
    assert code == 1
    assert problems(lines) == [
        "CDK bootstrap version 5 in 123456789012/ap-northeast-1 is older than the 6 these "
        "templates require: run npx cdk bootstrap aws://123456789012/ap-northeast-1"]


def test_unpublished_artifacts_are_named(synthesized: Any) -> None:
    with aws_environment(DEV) as aws:
        bootstrap(aws.session)
        code, lines = run(aws.session, synthesized.outdir)
    assert code == 1
    bucket = LAYOUT.bucket
    assert problems(lines) == [
        f"s3://{bucket}/{LAYOUT.llm.manifest_key}: missing, so the llm endpoint's artifacts "
        "were never published (completely): run make publish ENV=dev",
        f"s3://{bucket}/{LAYOUT.intent.manifest_key}: missing, so the intent endpoint's "
        "artifacts were never published (completely): run make publish ENV=dev",
    ]


def test_a_replaced_missing_or_stray_object_is_named(ready: Any, synthesized: Any) -> None:
    s3 = ready.session.client("s3")
    bucket = LAYOUT.bucket
    config = LAYOUT.llm.key("config.json")
    s3.put_object(Bucket=bucket, Key=config, Body=b"{}", ServerSideEncryption="aws:kms",
                  SSEKMSKeyId=ready.key_arn)  # replaced by hand: no digest, other bytes
    s3.delete_object(Bucket=bucket, Key=LAYOUT.intent.model_data_key)
    stray = LAYOUT.llm.key("adapters/old_adapter/adapter_config.json")
    s3.put_object(Bucket=bucket, Key=stray, Body=b"{}")
    code, lines = run(ready.session, synthesized.outdir)
    assert code == 1
    found = problems(lines)
    assert len(found) == 3, found
    assert found[0].startswith(f"s3://{bucket}/{config}: 2 bytes, SHA-256 unknown does not "
                               "match its manifest (")
    assert found[1] == (f"s3://{bucket}/{stray}: not in {LAYOUT.llm.manifest_key}, but "
                        f"SageMaker copies everything under {LAYOUT.llm.model_data_key} into "
                        f"the model directory: aws s3 rm s3://{bucket}/{stray}")
    assert found[2] == (f"s3://{bucket}/{LAYOUT.intent.model_data_key}: missing (listed in "
                        f"{LAYOUT.intent.manifest_key}): run make publish ENV=dev")


def test_an_object_under_another_key_is_refused(ready: Any, synthesized: Any) -> None:
    s3 = ready.session.client("s3")
    other = ready.session.client("kms").create_key()["KeyMetadata"]["Arn"]
    key = LAYOUT.intent.model_data_key
    body = s3.get_object(Bucket=LAYOUT.bucket, Key=key)
    s3.put_object(Bucket=LAYOUT.bucket, Key=key, Body=body["Body"].read(),
                  Metadata=body["Metadata"], ServerSideEncryption="aws:kms", SSEKMSKeyId=other)
    code, lines = run(ready.session, synthesized.outdir)
    assert code == 1
    assert problems(lines) == [
        f"s3://{LAYOUT.bucket}/{key}: not encrypted with the project key, the only key the "
        "model role may decrypt: run make publish ENV=dev"]


def test_credentials_of_another_account_stop_everything(
        synthesized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTO_ACCOUNT_ID", "210987654321")
    with aws_environment(DEV, foundation=False, bucket=False) as aws:
        out = io.StringIO()
        code = preflight(["--env", "dev", "--assembly", str(synthesized.outdir)],
                         session=aws.session, out=out)
    assert code == 1
    assert out.getvalue().splitlines()[0] == (
        "preflight: the credentials are for account 210987654321, but config/dev.yaml deploys "
        "to 123456789012: switch credentials (AWS_PROFILE) or fix `account`")


def test_without_templates_it_says_to_synthesize(tmp_path: Path) -> None:
    with aws_environment(DEV) as aws:
        out = io.StringIO()
        code = preflight(["--env", "dev", "--assembly", str(tmp_path / "cdk.out")],
                         session=aws.session, out=out)
    assert code == 2
    assert "run make synth first" in out.getvalue()


def test_the_required_version_is_read_from_the_templates(synthesized: Any) -> None:
    serving = synthesized.template("Prod/Serving")
    requirement = bootstrap_requirement([serving])
    assert requirement.version == 6
    assert requirement.ssm_parameter == "/cdk-bootstrap/hnb659fds/version"
    newer = copy.deepcopy(serving)
    listed = newer["Rules"]["CheckBootstrapVersion"]["Assertions"][0]["Assert"]["Fn::Not"][0]
    listed["Fn::Contains"][0] = [str(v) for v in range(1, 21)]
    assert bootstrap_requirement([serving, newer]).version == 21
    assert bootstrap_requirement([serving], assembly_versions=[8]).version == 8


def test_quota_needs_of_production() -> None:
    needs = {need.quota_name: need.instances for need in quota_needs(load_settings("prod"))}
    assert needs == {"ml.g5.xlarge for endpoint usage": 60,     # max 30, twice
                     "ml.inf1.xlarge for endpoint usage": 16,   # max 8, twice
                     "ml.g5.4xlarge for training job usage": 1}


def test_environments_sharing_an_account_and_region_add_up() -> None:
    prod, dev = load_settings("prod"), load_settings("dev")
    shared = {n.quota_name: n.instances for n in quota_needs(prod, [prod, dev])}
    assert shared == {"ml.g5.xlarge for endpoint usage": 60 + 4,
                      "ml.inf1.xlarge for endpoint usage": 16 + 4,
                      "ml.g5.4xlarge for training job usage": 2}
    elsewhere = dev.model_copy(update={"account": "210987654321"})
    assert {n.quota_name: n.instances for n in quota_needs(prod, [elsewhere])} == {
        "ml.g5.xlarge for endpoint usage": 60, "ml.inf1.xlarge for endpoint usage": 16,
        "ml.g5.4xlarge for training job usage": 1}
    other_region = dev.model_copy(update={"region": "us-east-1"})
    assert quota_needs(prod, [other_region]) == quota_needs(prod)


def test_the_stack_names_the_tools_use_are_the_synthesized_ones(synthesized: Any) -> None:
    from tests.stacks.policy_model import load_stacks

    names = {stack.display_name: stack.stack_name for stack in load_stacks(synthesized.outdir)}
    for env in ("dev", "prod"):
        settings = load_settings(env)
        assert names[f"{settings.stage_name}/Foundation"] == settings.foundation_stack_name
        assert names[f"{settings.stage_name}/Serving"] == settings.serving_stack_name
