"""`make promote` against moto: a quantization run's candidate becomes the LLM's model data only
through this checked step, and never over the prefix the endpoint serves.

The candidate is laid out as containers/quantize/quantize-job uploads it (quantization.candidate's
manifest, each object with its SHA-256 in its metadata, SSE-KMS with the project key; the job
script itself is run in tests/quantization/test_quantize_cpu.py). The served prefix is what
`make publish` writes. After a promotion, `make preflight`'s artifact check passes on the new
prefix: the endpoint's next instance would pass its manifest check; run with the deploy role's
key against a recording moto server (tests/tools/aws_calls.py), its calls are allowed by the role
policy attached before the promotion.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from artifact_manifest import MANIFEST_FILE, adapter_dir_checksum, artifact_files_from_json
from quantization import job_outputs
from quantization.candidate import write_manifest
from stacks.artifact_layout import artifact_layout
from stacks.settings import CONFIG_DIR, EnvironmentSettings, load_settings
from tests.support.artifacts import write_adapters, write_intent_archive, write_model_dir
from tests.support.aws import AwsEnvironment, aws_environment, fake_credentials
from tests.support.network import free_port
from tests.tools.aws_calls import Permission, RecordingMotoServer, evaluate, unauthorized
from tools.deploy_role import deploy_role_policy
from tools.preflight.__main__ import check_artifacts
from tools.promote.__main__ import main as promote
from tools.publish.__main__ import main as publish
from tools.publish.upload import SHA256_METADATA, human_bytes

RUN = "awq-dev-20261124-101500"
SERVED = "models/llama-3-8b-instruct-awq"
NEW = "models/llama-3-8b-instruct-awq-20261124"
CANDIDATE = f"quantization/models/{RUN}"
REPORT_KEY = f"quantization/runs/{RUN}/quality_gate.json"


def passed_report(*, without: str | None = None) -> str:
    """A passing gate report with a passing section for each of dev's adapters (as
    write_adapters writes them, which make publish serves), but ``without``."""
    with tempfile.TemporaryDirectory() as scratch:
        adapters = write_adapters(Path(scratch))
        sections = {adapter.name: {"directory": adapter.folder, "passed": True,
                                   "failed_checks": [],
                                   "sha256": adapter_dir_checksum(adapters / adapter.folder)}
                    for adapter in load_settings("dev").llm.adapters if adapter.name != without}
    return json.dumps({"passed": True, "failed_checks": [], "checks": [], "adapters": sections})


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_credentials(monkeypatch)


def config_dir(tmp_path: Path, artifact_prefix: str) -> Path:
    """config/ with dev's llm.model.artifact_prefix set to ``artifact_prefix``."""
    target = tmp_path / "config"
    target.mkdir(exist_ok=True)
    for name in ("dev.yaml", "prod.yaml"):
        text = (CONFIG_DIR / name).read_text()
        (target / name).write_text(text.replace(f"artifact_prefix: {SERVED}\n",
                                                f"artifact_prefix: {artifact_prefix}\n"))
    return target


def upload_candidate(aws: AwsEnvironment, directory: Path, prefix: str, *,
                     report: str | None = None) -> None:
    """What the job does once its gate passed: the reports, each file with its SHA-256, the
    manifest last (naming the adapters the report gated)."""
    report = passed_report() if report is None else report
    s3 = aws.session.client("s3")
    kms = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": aws.key_arn}
    (directory / "quality_gate.json").write_text(report)
    (directory / "quality_gate.md").write_text("# quality gate: PASSED\n")
    s3.put_object(Bucket=aws.bucket, Key=f"quantization/runs/{RUN}/quality_gate.json",
                  Body=report.encode(), **kms)
    manifest = write_manifest(directory)
    for name, digest in sorted(manifest.files.items()):
        s3.put_object(Bucket=aws.bucket, Key=f"{prefix}/{name}",
                      Body=(directory / name).read_bytes(),
                      Metadata={SHA256_METADATA: digest.sha256}, **kms)
    body = (directory / MANIFEST_FILE).read_bytes()
    s3.put_object(Bucket=aws.bucket, Key=f"{prefix}/{MANIFEST_FILE}", Body=body,
                  Metadata={SHA256_METADATA: hashlib.sha256(body).hexdigest()}, **kms)


def deploy_serving(aws: AwsEnvironment, served_prefix: str) -> None:
    """A deployed Dev-Serving stack whose output names the prefix it serves."""
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {job_outputs.LLM_MODEL_PREFIX: {"Value": served_prefix}}}
    aws.session.client("cloudformation").create_stack(StackName="Dev-Serving",
                                                      TemplateBody=json.dumps(template))


@dataclass
class Account:
    aws: AwsEnvironment
    tmp_path: Path
    candidate_dir: Path

    def promote(self, *args: str, artifact_prefix: str = NEW) -> tuple[int, list[str]]:
        out = io.StringIO()
        directory = config_dir(self.tmp_path, artifact_prefix)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MANGAASSIST_CONFIG_DIR", str(directory))
            code = promote(["--env", "dev", "--run", RUN, *args], session=self.aws.session,
                           out=out)
        return code, out.getvalue().strip().splitlines()

    def keys(self, prefix: str) -> set[str]:
        listing = self.aws.session.client("s3").list_objects_v2(Bucket=self.aws.bucket,
                                                                 Prefix=f"{prefix}/")
        return {item["Key"] for item in listing.get("Contents", [])}

    def settings(self, artifact_prefix: str = NEW) -> EnvironmentSettings:
        return load_settings("dev", config_dir=config_dir(self.tmp_path, artifact_prefix))


@pytest.fixture
def account(tmp_path: Path) -> Iterator[Account]:
    """The served model (make publish), a deployed Serving stack, and a passing run's
    candidate."""
    with aws_environment(load_settings("dev")) as aws:
        code = publish(["--env", "dev", "--model", str(write_model_dir(tmp_path / "served")),
                        "--adapters", str(write_adapters(tmp_path / "lora")),
                        "--intent", str(write_intent_archive(tmp_path / "intent"))],
                       session=aws.session, out=io.StringIO())
        assert code == 0
        deploy_serving(aws, SERVED)
        candidate = write_model_dir(tmp_path / "candidate", weights_bytes=3000)
        upload_candidate(aws, candidate, CANDIDATE)
        yield Account(aws, tmp_path, candidate)


def test_a_passing_run_is_promoted_to_a_new_prefix_and_passes_the_preflight(
    account: Account,
) -> None:
    code, lines = account.promote()
    assert code == 0, lines
    candidate = artifact_files_from_json((account.candidate_dir / MANIFEST_FILE).read_text())
    served = artifact_files_from_json(account.aws.session.client("s3").get_object(
        Bucket=account.aws.bucket, Key=f"{SERVED}/{MANIFEST_FILE}")["Body"].read().decode())
    adapter_bytes = sum(d.size for p, d in served.files.items() if p.startswith("adapters/"))
    copied = human_bytes(candidate.total_bytes + adapter_bytes)
    assert lines[0] == (f"promote: run {RUN} -> s3://{account.aws.bucket}/{NEW}/: "
                        f"{len(candidate.files) + 6} to copy ({copied}), 0 already there")
    assert lines[-1].startswith(f"promote: done; s3://{account.aws.bucket}/{NEW}/ holds run {RUN}")
    s3 = account.aws.session.client("s3")
    manifest = artifact_files_from_json(s3.get_object(
        Bucket=account.aws.bucket, Key=f"{NEW}/{MANIFEST_FILE}")["Body"].read().decode())
    adapters = {p for p in manifest.files if p.startswith("adapters/")}
    assert {p.split("/")[1] for p in adapters} == {"manga_domain", "general_support",
                                                   "jp_translation"}
    assert {p: d for p, d in manifest.files.items() if p not in adapters} == candidate.files
    # The served model's manifest names the adapters the run gated: the container serves no
    # other with it (artifact_manifest.check_named_adapters).
    assert manifest.adapters == candidate.adapters
    assert sorted(manifest.adapters) == ["manga", "manga-ja", "support"]
    assert account.keys(NEW) == {f"{NEW}/{p}" for p in manifest.files} | {f"{NEW}/{MANIFEST_FILE}"}
    head = s3.head_object(Bucket=account.aws.bucket, Key=f"{NEW}/model.safetensors")
    assert head["ContentLength"] == 3000 and head["ServerSideEncryption"] == "aws:kms"
    assert head["Metadata"][SHA256_METADATA] == candidate.files["model.safetensors"].sha256
    # The served prefix is untouched, and preflight finds the new prefix complete.
    assert f"{SERVED}/model.safetensors" in account.keys(SERVED)
    settings = account.settings()
    problems = check_artifacts(settings, artifact_layout(settings), account.aws.session,
                               account.aws.key_arn, io.StringIO())
    assert problems == []
    # A second run has nothing to do.
    assert account.promote() == (0, [f"promote: run {RUN} is already promoted to "
                                     f"s3://{account.aws.bucket}/{NEW}/"])


def test_it_never_promotes_over_the_served_prefix(account: Account) -> None:
    before = account.keys(SERVED)
    code, lines = account.promote(artifact_prefix=SERVED)
    assert code == 2
    assert lines == [
        f"promote: refused: llm.model.artifact_prefix {SERVED!r} is what Dev-Serving serves now: "
        "a model is never promoted over the served prefix (a new instance would load a mix, with "
        "no blue/green and no rollback); set llm.model.artifact_prefix in config/dev.yaml to a "
        f"new prefix (e.g. {SERVED}-<run date>), promote, then make deploy ENV=dev"]
    assert account.keys(SERVED) == before


def test_a_failed_gate_is_never_promoted(account: Account) -> None:
    failed = json.dumps({"passed": False, "failed_checks": ["score_ja"], "checks": []})
    upload_candidate(account.aws, account.candidate_dir, CANDIDATE, report=failed)
    code, lines = account.promote()
    assert code == 2
    assert (f"promote: refused: s3://{account.aws.bucket}/{REPORT_KEY}: the quality gate FAILED "
            "(score_ja): a failed run is never promoted") in lines
    assert account.keys(NEW) == set()


def test_a_report_without_a_served_adapter_is_refused(account: Account) -> None:
    upload_candidate(account.aws, account.candidate_dir, CANDIDATE,
                     report=passed_report(without="manga-ja"))
    code, lines = account.promote()
    assert code == 2
    assert (f"promote: refused: s3://{account.aws.bucket}/{REPORT_KEY}: no section for adapter "
            "'manga-ja' (llm.adapters): the run's gate did not evaluate it on this quantized "
            "model (it gated: manga, support); re-run make quantize ENV=dev with the served "
            "adapters") in lines
    assert ("promote: refused: the candidate's artifact-manifest.json names no adapter "
            "'manga-ja' in folder 'jp_translation': the run was not gated with it") in lines
    assert account.keys(NEW) == set()


def test_an_adapter_other_than_the_gated_one_is_refused(account: Account) -> None:
    """The served prefix holds an adapter the run was not gated with (published since)."""
    report = json.loads(passed_report())
    report["adapters"]["support"]["sha256"] = "0" * 64
    upload_candidate(account.aws, account.candidate_dir, CANDIDATE, report=json.dumps(report))
    code, lines = account.promote()
    assert code == 2
    assert (f"promote: refused: s3://{account.aws.bucket}/{SERVED}/adapters/general_support/: "
            "checksum ") in lines[0]
    assert lines[0].endswith("is not the 000000000000… adapter 'support' was gated with: "
                             "publish the gated one, or re-run make quantize with this one")


def test_a_candidate_that_differs_from_its_manifest_is_refused(account: Account) -> None:
    s3 = account.aws.session.client("s3")
    listed = json.loads((account.candidate_dir / MANIFEST_FILE).read_text())["files"]
    s3.put_object(Bucket=account.aws.bucket, Key=f"{CANDIDATE}/model.safetensors",
                  Body=b"truncated", ServerSideEncryption="aws:kms",
                  SSEKMSKeyId=account.aws.key_arn,
                  Metadata={SHA256_METADATA: listed["model.safetensors"]["sha256"]})
    code, lines = account.promote()
    assert code == 2
    bad = [line for line in lines if "model.safetensors" in line]
    assert bad and bad[0].startswith(
        f"promote: refused: s3://{account.aws.bucket}/{CANDIDATE}/model.safetensors: 9 bytes")
    assert bad[0].endswith("run make quantize ENV=dev (a new run)")


def test_a_candidate_of_another_quantization_is_refused(account: Account) -> None:
    eight_bit = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                 "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                     "num_bits": 8, "group_size": 128, "symmetric": False,
                     "strategy": "group"}}}}
    shutil.rmtree(account.candidate_dir)
    upload_candidate(account.aws, write_model_dir(account.candidate_dir, quantization=eight_bit),
                     CANDIDATE)
    code, lines = account.promote()
    assert code == 2
    assert any(line.endswith("config.json: 8-bit weights but llm.model.quantization is 'w4a16' "
                             "(4-bit)") for line in lines), lines


def test_an_interrupted_promotion_resumes_and_stray_files_are_refused(account: Account) -> None:
    s3 = account.aws.session.client("s3")
    kms = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": account.aws.key_arn}
    digest = json.loads((account.candidate_dir / MANIFEST_FILE).read_text())["files"][
        "config.json"]["sha256"]
    s3.put_object(Bucket=account.aws.bucket, Key=f"{NEW}/config.json",
                  Body=(account.candidate_dir / "config.json").read_bytes(),
                  Metadata={SHA256_METADATA: digest}, **kms)
    code, lines = account.promote("--dry-run")
    assert code == 0
    assert lines[0].endswith(" already there") and ", 1 already there" in lines[0]
    to_copy = int(lines[0].split("/: ")[1].split(" to copy")[0])
    assert to_copy > 10
    assert all(line.startswith("would copy ") for line in lines[1:])
    assert len(lines) == 1 + to_copy
    assert account.keys(NEW) == {f"{NEW}/config.json"}  # a dry run copies nothing
    s3.put_object(Bucket=account.aws.bucket, Key=f"{NEW}/old-shard.safetensors", Body=b"x", **kms)
    code, lines = account.promote()
    assert code == 2
    assert lines == [f"promote: refused: s3://{account.aws.bucket}/{NEW}/old-shard.safetensors: "
                     "not part of this promotion, but SageMaker would copy it into the model "
                     f"directory: aws s3 rm s3://{account.aws.bucket}/{NEW}/old-shard.safetensors"]


def test_without_a_deployed_endpoint_the_adapters_source_must_be_named(
    tmp_path: Path,
) -> None:
    with aws_environment(load_settings("dev")) as aws:
        code = publish(["--env", "dev", "--model", str(write_model_dir(tmp_path / "served")),
                        "--adapters", str(write_adapters(tmp_path / "lora"))],
                       session=aws.session, out=io.StringIO())
        assert code == 0
        upload_candidate(aws, write_model_dir(tmp_path / "candidate"), CANDIDATE)
        account = Account(aws, tmp_path, tmp_path / "candidate")
        code, lines = account.promote()
        assert (code, lines) == (1, [
            "promote: Dev-Serving is not deployed, so no endpoint serves adapters to copy: give "
            "--adapters-from <prefix> (one make publish wrote)"])
        code, lines = account.promote("--adapters-from", SERVED)
        assert code == 0, lines


def test_a_run_id_that_is_not_one_is_refused_before_any_call() -> None:
    out = io.StringIO()
    assert promote(["--env", "dev", "--run", "../models"], session=object(), out=out) == 2
    assert out.getvalue().startswith("promote: refused: --run '../models' is not accepted")


def test_make_promote_passes_its_arguments_through() -> None:
    import subprocess

    from stacks.settings import REPO_ROOT

    result = subprocess.run(["make", "-n", "--no-print-directory", "promote", "ENV=prod",
                             f"RUN={RUN}", "ADAPTERS_FROM=models/x"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True, timeout=60)
    assert f'-m tools.promote --env prod --run "{RUN}" --adapters-from "models/x"' \
        in result.stdout


ROLE_KEY = "ASIADEPLOYROLESESSION0"
"""The deploy role's session key, as in tests/tools/test_deploy_role.py."""


def _foundation(session: Any, settings: EnvironmentSettings) -> AwsEnvironment:
    """What `cdk deploy` of the Foundation stack leaves: the key (with its alias), the
    versioned bucket, the outputs."""
    kms = session.client("kms")
    key_arn = kms.create_key(Description="project key")["KeyMetadata"]["Arn"]
    kms.create_alias(AliasName=f"alias/{settings.resource_prefix}", TargetKeyId=key_arn)
    s3 = session.client("s3")
    name = settings.artifact_bucket_name
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={
        "LocationConstraint": settings.region})
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {"ProjectKeyArn": {"Value": key_arn},
                            "ModelArtifactBucketName": {"Value": name}}}
    session.client("cloudformation").create_stack(StackName=settings.foundation_stack_name,
                                                  TemplateBody=json.dumps(template))
    return AwsEnvironment(session, name, key_arn)


def _exact_prefix_policy(policy: dict[str, Any], bucket: str, prefixes: list[str]
                         ) -> dict[str, Any]:
    """``policy`` with its S3 statements scoped to ``prefixes`` (what the policy was before)."""
    listed = {"StringLike": {"s3:prefix": [f"{prefix}/*" for prefix in prefixes]}}
    scoped: dict[str, dict[str, Any]] = {
        "ListArtifacts": {"Condition": listed},
        "ReadAndPublishArtifacts": {"Resource": [f"arn:aws:s3:::{bucket}/{prefix}/*"
                                                 for prefix in prefixes]}}
    return {**policy, "Statement": [{**s, **scoped.get(s["Sid"], {})}
                                    for s in policy["Statement"]]}


def test_after_a_promotion_the_attached_deploy_role_policy_allows_the_next_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deploy role's policy is attached by hand (docs/delivery.md), so the one built before a
    promotion must still allow the pipeline's next preflight on the new prefix: the S3
    statements cover artifacts.models_prefix, the settings keep every served prefix inside it
    and quantization's prefixes outside, and the policy is the same before and after.

    The AWS rules the calls are decided by: ListBucket is authorized on the bucket's ARN with
    the ``s3:prefix`` condition key, GetObject/PutObject on the object's ARN
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html,
    "Actions, resources, and condition keys for Amazon S3"); no allow is a deny
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html)."""
    server = RecordingMotoServer(free_port())
    server.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
        before = load_settings("dev")

        def session(key: str) -> Any:
            import boto3

            return boto3.Session(aws_access_key_id=key, aws_secret_access_key="x",
                                 aws_session_token="token", region_name=before.region)

        admin = _foundation(session("admin"), before)
        assert publish(["--env", "dev", "--model", str(write_model_dir(tmp_path / "served")),
                        "--adapters", str(write_adapters(tmp_path / "lora")),
                        "--intent", str(write_intent_archive(tmp_path / "intent"))],
                       session=admin.session, out=io.StringIO()) == 0
        deploy_serving(admin, SERVED)
        upload_candidate(admin, write_model_dir(tmp_path / "candidate", weights_bytes=3000),
                         CANDIDATE)
        account = Account(admin, tmp_path, tmp_path / "candidate")
        code, lines = account.promote()
        assert code == 0, lines
        after = account.settings()
        # The pipeline's next deploy: the preflight's artifact check, as the deploy role.
        assert check_artifacts(after, artifact_layout(after), session(ROLE_KEY), admin.key_arn,
                               io.StringIO()) == []
        calls = server.by(ROLE_KEY)
    finally:
        server.stop()
    listed = {c.params.get("Prefix") for c in calls if c.operation == "ListObjectsV2"}
    read = {c.params["Key"] for c in calls if c.operation == "GetObject"}
    assert f"{NEW}/" in listed and f"{NEW}/{MANIFEST_FILE}" in read  # not vacuous
    attached = deploy_role_policy(before)
    assert deploy_role_policy(after) == attached
    context = {"kms:ResourceAliases": [f"alias/{before.resource_prefix}"]}
    assert unauthorized(calls, attached, before.account, context) == []
    # Scoped to the prefixes served before the promotion, the policy refuses the preflight.
    layout = artifact_layout(before)
    old = _exact_prefix_policy(attached, layout.bucket,
                               [layout.llm.read_prefix, layout.intent.read_prefix])
    refused = unauthorized(calls, old, before.account, context)
    assert refused and all(f"{NEW}/" in line for line in refused)
    # It still reaches no candidate, base model or report.
    for key in (f"{CANDIDATE}/config.json", REPORT_KEY, "base-models/llama/config.json"):
        permission = Permission("s3:GetObject", f"arn:aws:s3:::{layout.bucket}/{key}")
        assert evaluate(attached, permission)[0] is False, key
    for prefix in ("quantization/", f"{CANDIDATE}/", "base-models/"):
        permission = Permission("s3:ListBucket", f"arn:aws:s3:::{layout.bucket}",
                                   {"s3:prefix": prefix})
        assert evaluate(attached, permission)[0] is False, prefix
