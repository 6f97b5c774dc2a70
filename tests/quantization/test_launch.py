"""The quantization launcher: the real sagemaker SDK (v3, .venv-sagemaker) against a moto server,
for the ml.g5.4xlarge training instance the settings name, and the promotion after it.

moto stores CreateTrainingJob requests and marks every job Completed at once; it runs nothing.
The server here therefore gets a stand-in for the job's run (:class:`SimulatedQuantizeJob`): it
records the request as the SDK sent it, refuses what SageMaker refuses for the instance type
("Local storage volumes are encrypted using a hardware module on the instance. You can't request
a VolumeKmsKeyId when using an instance type with local storage", SageMaker API Reference,
ResourceConfig, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ResourceConfig.html),
walks the job through SageMaker's statuses over a few DescribeTrainingJob calls, and then does
to S3 what ``containers/quantize/quantize-job`` does (tests/quantization/test_quantize_cpu.py
runs that script): the gate reports to REPORT_S3_URI always; when the gate passes, the model as
a candidate at ARTIFACT_S3_URI (the run's own prefix, each object with its SHA-256, the
candidate's artifact-manifest.json last); and a Failed job with the failed checks as
FailureReason otherwise. The gate reports are real ones (quantization.gate). Then
``python -m tools.promote`` (``make promote``) makes the candidate the LLM's model data at a new
prefix, against the same server.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.sagemaker import models as sagemaker_models
from moto.sagemaker import responses as sagemaker_responses
from moto.sagemaker.exceptions import ValidationError
from moto.server import ThreadedMotoServer

from artifact_manifest import MANIFEST_FILE, artifact_files_from_json
from gpu_budget import instance_type as catalog_instance
from quantization import job_outputs
from quantization.adapters import ADAPTER_EVAL_SETS
from quantization.candidate import write_manifest
from quantization.evaluate import AdapterUnderTest, run_candidate_gate
from quantization.gate import (
    CandidateReport,
    GateReport,
    candidate_to_dict,
    render_candidate_markdown,
    render_markdown,
    report_to_dict,
)
from quantization.scoring import EvalItem, TitleCatalog
from stacks.settings import load_settings
from tests.quantization.test_adapter_gate import adapter_generator
from tests.quantization.test_gate import SMALLER, gate, good_answer
from tests.support.artifacts import write_adapters, write_model_dir
from tests.support.aws import FAKE_CREDENTIALS
from tests.support.network import free_port
from tools.publish.__main__ import main as publish
from tools.publish.upload import SHA256_METADATA

REPO_ROOT = Path(__file__).resolve().parents[2]
REGION = "ap-northeast-1"
ACCOUNT = "123456789012"
BUCKET = f"manga-assist-prod-models-{ACCOUNT}-{REGION}"
SERVED_PREFIX = "models/llama-3-8b-instruct-awq"
NEW_PREFIX = "models/llama-3-8b-instruct-awq-next"
BASE_PREFIX = "base-models/Meta-Llama-3-8B-Instruct"
IMAGE_URI = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/cdk-hnb659fds-container-assets:quantize"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/Prod-Serving-QuantizationJobRole"
SUBNETS = ("subnet-0aaa", "subnet-0bbb")
SECURITY_GROUP = "sg-0models"


def sagemaker_python() -> Path:
    path = Path(os.environ.get("MANGAASSIST_SAGEMAKER_PYTHON",
                               REPO_ROOT / ".venv-sagemaker" / "bin" / "python"))
    if not path.exists():
        if os.environ.get("MANGAASSIST_REQUIRE_SAGEMAKER_ENV"):
            pytest.fail(f"{path} is missing: make .venv-sagemaker/.installed")
        pytest.skip(f"{path} is missing (the launcher's own environment; make test builds it)")
    return path


@dataclass
class SimulatedQuantizeJob:
    """What the training job does, played by the moto server: statuses, then S3 writes."""

    endpoint_url: str
    gate_report: dict[str, Any] = field(default_factory=dict)
    gate_markdown: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    describes: dict[str, int] = field(default_factory=dict)
    served_keys: set[str] = field(default_factory=set)
    """What make publish left at the served prefix before any run."""

    STEPS = (("InProgress", "Starting", "Preparing the instances for training"),
             ("InProgress", "Downloading", "Downloading input data"),
             ("InProgress", "Training", "Training image download completed. Training in progress."))

    def on_create(self, body: dict[str, Any]) -> None:
        self.requests.append(body)
        resources = body.get("ResourceConfig", {})
        instance = resources.get("InstanceType", "")
        if "VolumeKmsKeyId" in resources and catalog_instance(instance).local_instance_storage:
            raise ValidationError(
                "Local storage volumes are encrypted using a hardware module on the instance. "
                f"You can't request a VolumeKmsKeyId when using an instance type with local "
                f"storage ({instance}).")

    def on_describe(self, job: Any) -> None:
        count = self.describes.get(job.training_job_name, 0)
        self.describes[job.training_job_name] = count + 1
        if count < len(self.STEPS):
            status, secondary, message = self.STEPS[count]
            job.training_job_status, job.secondary_status = status, secondary
            job.secondary_status_transitions = [
                {"Status": secondary, "StartTime": job.creation_time, "StatusMessage": message}]
            return
        if count == len(self.STEPS):
            self._finish(job)

    def _upload_candidate(self, s3: Any, uri: str, report_json: str,
                          kms: dict[str, str]) -> None:
        """What quantize-job uploads once the gate passed (quantization.candidate's manifest,
        each file with its SHA-256, the manifest last)."""
        bucket, prefix = uri[5:].split("/", 1)
        with tempfile.TemporaryDirectory() as scratch:
            directory = write_model_dir(Path(scratch) / "quantized", weights_bytes=4096)
            (directory / "quality_gate.json").write_text(report_json)
            (directory / "quality_gate.md").write_text(self.gate_markdown)
            manifest = write_manifest(directory)
            for name, digest in sorted(manifest.files.items()):
                s3.put_object(Bucket=bucket, Key=f"{prefix}{name}",
                              Body=(directory / name).read_bytes(),
                              Metadata={SHA256_METADATA: digest.sha256}, **kms)
            body = (directory / MANIFEST_FILE).read_bytes()
            s3.put_object(Bucket=bucket, Key=f"{prefix}{MANIFEST_FILE}", Body=body, **kms)

    def _finish(self, job: Any) -> None:
        request = next(r for r in self.requests if r["TrainingJobName"] == job.training_job_name)
        env = request["Environment"]
        kms = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": env["ARTIFACT_KMS_KEY_ID"]}
        s3 = boto3.client("s3", region_name=REGION, endpoint_url=self.endpoint_url,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        report_bucket, report_prefix = env["REPORT_S3_URI"][5:].split("/", 1)
        report_json = json.dumps(self.gate_report)
        for name, body in (("quality_gate.json", report_json),
                           ("quality_gate.md", self.gate_markdown)):
            s3.put_object(Bucket=report_bucket, Key=f"{report_prefix}{name}",
                          Body=body.encode(), **kms)
        if self.gate_report["passed"]:
            self._upload_candidate(s3, env["ARTIFACT_S3_URI"], report_json, kms)
            job.training_job_status, job.secondary_status = "Completed", "Completed"
        else:
            failed = " ".join(f"- **{name}**" for name in self.gate_report["failed_checks"])
            job.training_job_status, job.secondary_status = "Failed", "Failed"
            job.failure_reason = f"quality gate failed (exit 1): {failed}"
        job.secondary_status_transitions = [
            {"Status": job.secondary_status, "StartTime": job.creation_time,
             "StatusMessage": "Training job " + job.training_job_status.lower()}]


@pytest.fixture(scope="module")
def aws(eval_items: list[EvalItem], catalog: TitleCatalog,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedQuantizeJob]:
    """A moto server with the Prod stacks' outputs, the bucket, and the simulated job."""
    port = free_port()
    job = SimulatedQuantizeJob(endpoint_url=f"http://127.0.0.1:{port}")
    original_create = sagemaker_responses.SageMakerResponse.create_training_job
    original_describe = sagemaker_models.SageMakerModelBackend.describe_training_job

    def create(self: Any) -> Any:
        job.on_create(json.loads(self.body))
        return original_create(self)

    def describe(self: Any, training_job_name: str) -> dict[str, Any]:
        if training_job_name in self.training_jobs:
            job.on_describe(self.training_jobs[training_job_name])
            fake = self.training_jobs[training_job_name]
            response = original_describe(self, training_job_name)
            if getattr(fake, "failure_reason", None):
                response["FailureReason"] = fake.failure_reason
            return response
        return original_describe(self, training_job_name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sagemaker_responses.SageMakerResponse, "create_training_job", create)
        patch.setattr(sagemaker_models.SageMakerModelBackend, "describe_training_job", describe)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            _provision(job.endpoint_url, tmp_path_factory.mktemp("published"))
            job.served_keys = s3_keys(job, SERVED_PREFIX)
            yield job
        finally:
            server.stop()


class ServerSession:
    """A boto3 session whose clients talk to the moto server (what tools.publish is given)."""

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url

    def client(self, name: str) -> Any:
        return boto3.client(name, region_name=REGION, endpoint_url=self.endpoint_url,
                            aws_access_key_id="testing", aws_secret_access_key="testing")


def _provision(endpoint_url: str, tmp: Path) -> None:
    kwargs = {"region_name": REGION, "endpoint_url": endpoint_url,
              "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    key_arn = boto3.client("kms", **kwargs).create_key()["KeyMetadata"]["Arn"]
    s3 = boto3.client("s3", **kwargs)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=BUCKET, Key=f"{BASE_PREFIX}/config.json", Body=b"{}")
    outputs = {
        job_outputs.FOUNDATION_STACK: {job_outputs.ARTIFACT_BUCKET: BUCKET,
                                       job_outputs.PROJECT_KEY_ARN: key_arn},
        job_outputs.SERVING_STACK: {job_outputs.JOB_ROLE_ARN: ROLE_ARN,
                                    job_outputs.JOB_IMAGE_URI: IMAGE_URI,
                                    job_outputs.JOB_SUBNET_IDS: ",".join(SUBNETS),
                                    job_outputs.JOB_SECURITY_GROUP_ID: SECURITY_GROUP,
                                    job_outputs.LLM_MODEL_PREFIX: SERVED_PREFIX},
    }
    cloudformation = boto3.client("cloudformation", **kwargs)
    for stack, values in outputs.items():
        template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                    "Outputs": {key: {"Value": value} for key, value in values.items()}}
        cloudformation.create_stack(StackName=job_outputs.stack_name("Prod", stack),
                                    TemplateBody=json.dumps(template))
    # What serves now: make publish's model and adapters at the served prefix.
    code = publish(["--env", "prod", "--model", str(write_model_dir(tmp / "served")),
                    "--adapters", str(write_adapters(tmp / "lora"))],
                   session=ServerSession(endpoint_url), out=io.StringIO())
    assert code == 0


def launch(job: SimulatedQuantizeJob, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ENDPOINT_URL": job.endpoint_url, **FAKE_CREDENTIALS,
                "PYTHONPATH": str(REPO_ROOT)})
    return subprocess.run(
        [str(sagemaker_python()), "-m", "tools.quantize", "--env", "prod", "--poll-s", "0",
         *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)


def s3_keys(job: SimulatedQuantizeJob, prefix: str) -> set[str]:
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=job.endpoint_url,
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {item["Key"] for item in listing.get("Contents", [])}


def use_gate(job: SimulatedQuantizeJob, report: GateReport | CandidateReport) -> None:
    if isinstance(report, CandidateReport):
        job.gate_report = candidate_to_dict(report)
        job.gate_markdown = render_candidate_markdown(report)
    else:
        job.gate_report = report_to_dict(report)
        job.gate_markdown = render_markdown(report)


def gate_with_adapters(eval_items: list[EvalItem], catalog: TitleCatalog,
                       adapters_dir: Path) -> CandidateReport:
    """A passing gate of the base and each adapter prod serves (the files make publish served,
    by checksum), as the job's report says."""
    adapters = [AdapterUnderTest.load(adapter.name, adapters_dir / adapter.folder,
                                      ADAPTER_EVAL_SETS[adapter.name], catalog)
                for adapter in load_settings("prod").llm.adapters]
    items = [*eval_items, *(item for adapter in adapters for item in adapter.items)]
    good = {adapter.name: good_answer for adapter in adapters}
    return run_candidate_gate(eval_items, catalog, memory=SMALLER, adapters=adapters,
                              baseline=adapter_generator(good_answer, good, items),
                              quantized=adapter_generator(good_answer, good, items),
                              progress=lambda _: None)


def test_a_passing_gate_uploads_the_model_and_exits_0(
    aws: SimulatedQuantizeJob, eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    use_gate(aws, gate(eval_items, catalog, good_answer))
    result = launch(aws, "--base-model-prefix", BASE_PREFIX)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]

    # The SDK's CreateTrainingJob request, as the server received it.
    request = aws.requests[-1]
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE_URI
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert request["RoleArn"] == ROLE_ARN
    assert request["VpcConfig"] == {"Subnets": list(SUBNETS),
                                    "SecurityGroupIds": [SECURITY_GROUP]}
    key = request["OutputDataConfig"]["KmsKeyId"]
    assert key.startswith(f"arn:aws:kms:{REGION}:{ACCOUNT}:key/")
    # g5 has local NVMe storage: no VolumeKmsKeyId (SageMaker refuses one); the launcher asks
    # for no volume size either, and the SDK sends its default 30 GB, which SageMaker ignores
    # there ("Available storage is fixed to the NVMe-type instance's storage capacity",
    # ResourceConfig.VolumeSizeInGB; g5.4xlarge has a 600 GB NVMe SSD).
    assert request["ResourceConfig"] == {"InstanceType": "ml.g5.4xlarge", "InstanceCount": 1,
                                         "VolumeSizeInGB": 30}
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 14400
    [channel] = request["InputDataConfig"]
    assert channel["ChannelName"] == "model"
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{BUCKET}/{BASE_PREFIX}/"
    run_id = request["Environment"]["REPORT_S3_URI"].rstrip("/").rsplit("/", 1)[1]
    assert request["Environment"] == {
        "ARTIFACT_S3_URI": f"s3://{BUCKET}/quantization/models/{run_id}/",
        "REPORT_S3_URI": f"s3://{BUCKET}/quantization/runs/{run_id}/",
        "ARTIFACT_KMS_KEY_ID": key,
        "AWQ_BACKEND": "llm-compressor",
        "AWQ_GROUP_SIZE": "128",
        "GATE_ADAPTERS": "manga=manga_domain,support=general_support,manga-ja=jp_translation",
    }
    assert request["OutputDataConfig"]["S3OutputPath"] == (
        f"s3://{BUCKET}/quantization/runs/{run_id}/sagemaker")
    assert request["TrainingJobName"].startswith(run_id)
    assert {"Key": "QuantizationRun", "Value": run_id} in request["Tags"]

    # Progress: one line per status change, then the verdict and where the model went.
    lines = result.stdout.splitlines()
    states = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    # The SDK's TrainingJob.create describes the job once itself (the "Starting" step).
    assert states == ["InProgress Downloading: Downloading input data",
                      "InProgress Training: Training image download completed. Training in "
                      "progress.",
                      "Completed  Completed: Training job completed"]
    assert "quality gate: PASSED" in lines
    assert "  volume      the instance's NVMe storage (hardware-encrypted; no VolumeKmsKeyId)" \
        in lines
    assert any(line.startswith("  ok   score_ja: measured 5") for line in lines)
    candidate = f"quantization/models/{run_id}"
    assert lines[-1] == (f"quality gate: PASSED; candidate uploaded to s3://{BUCKET}/{candidate}/"
                         f"; promote it with make promote ENV=prod RUN={run_id}")
    assert f"{candidate}/{MANIFEST_FILE}" in s3_keys(aws, candidate)
    # The served prefix is what make publish left: the job never writes it.
    assert aws.served_keys == s3_keys(aws, SERVED_PREFIX)


def test_the_launcher_and_the_sagemaker_sdk_agree_on_local_storage() -> None:
    """The catalog's local_instance_storage decides VolumeKmsKeyId; the sagemaker SDK's own
    instance_supports_kms() ("Returns True if SageMaker allows KMS keys to be attached to the
    instance") must say the opposite for every GPU type we could train on."""
    from gpu_budget.instances import _CATALOG_ROWS

    gpus = [name for name in _CATALOG_ROWS if catalog_instance(name).accelerator_kind == "gpu"]
    script = ("import json, sys\nfrom sagemaker.core.common_utils import instance_supports_kms\n"
              "print(json.dumps({t: instance_supports_kms(t) for t in json.load(sys.stdin)}))")
    result = subprocess.run([str(sagemaker_python()), "-c", script], input=json.dumps(gpus),
                            capture_output=True, text=True, timeout=120, check=True)
    sdk = json.loads(result.stdout)
    assert {t: not catalog_instance(t).local_instance_storage for t in gpus} == sdk


def test_a_volume_key_on_g5_is_what_sagemaker_refuses(aws: SimulatedQuantizeJob) -> None:
    """Not vacuous: the server refuses the request the launcher used to send."""
    sagemaker = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws.endpoint_url,
                             aws_access_key_id="testing", aws_secret_access_key="testing")
    with pytest.raises(sagemaker.exceptions.ClientError, match="You can't request a "
                       "VolumeKmsKeyId when using an instance type with local storage"):
        sagemaker.create_training_job(
            TrainingJobName="refused", RoleArn=ROLE_ARN,
            AlgorithmSpecification={"TrainingImage": IMAGE_URI, "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/x"},
            ResourceConfig={"InstanceType": "ml.g5.4xlarge", "InstanceCount": 1,
                            "VolumeSizeInGB": 100, "VolumeKmsKeyId": "arn:aws:kms:x"},
            StoppingCondition={"MaxRuntimeInSeconds": 600})


def make_on_server(aws: SimulatedQuantizeJob, *args: str, config: Path | None = None
                   ) -> subprocess.CompletedProcess[str]:
    """A make target of the README, against the moto server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ENDPOINT_URL": aws.endpoint_url, **FAKE_CREDENTIALS})
    if config is not None:
        env["MANGAASSIST_CONFIG_DIR"] = str(config)
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def promote_on_server(aws: SimulatedQuantizeJob, run_id: str, config: Path
                      ) -> subprocess.CompletedProcess[str]:
    return make_on_server(aws, "promote", "ENV=prod", f"RUN={run_id}", config=config)


def test_a_passing_run_is_promoted_to_a_new_prefix_the_preflight_accepts(
    aws: SimulatedQuantizeJob, eval_items: list[EvalItem], catalog: TitleCatalog,
    tmp_path: Path,
) -> None:
    """make quantize (ml.g5.4xlarge), then make promote, on the moto server: the candidate and
    the served adapters under one manifest at the new llm.model.artifact_prefix, which names the
    adapters the run gated."""
    # The adapters make publish served (_provision), gated with the base.
    use_gate(aws, gate_with_adapters(eval_items, catalog, write_adapters(tmp_path / "lora")))
    sagemaker_python()  # make quantize runs in .venv-sagemaker
    quantized = make_on_server(aws, "quantize", "ENV=prod", f"BASE_MODEL={BASE_PREFIX}",
                               "QUANTIZE_FLAGS=--poll-s 0")
    assert quantized.returncode == 0, quantized.stdout[-2000:] + quantized.stderr[-2000:]
    assert aws.requests[-1]["ResourceConfig"]["InstanceType"] == "ml.g5.4xlarge"
    assert "VolumeKmsKeyId" not in aws.requests[-1]["ResourceConfig"]
    run_id = aws.requests[-1]["Environment"]["REPORT_S3_URI"].rstrip("/").rsplit("/", 1)[1]
    config = tmp_path / "config"
    config.mkdir()
    for name in ("dev.yaml", "prod.yaml"):
        text = (REPO_ROOT / "config" / name).read_text()
        (config / name).write_text(text.replace(f"artifact_prefix: {SERVED_PREFIX}\n",
                                                f"artifact_prefix: {NEW_PREFIX}\n"))
    result = promote_on_server(aws, run_id, config)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"promote: done; s3://{BUCKET}/{NEW_PREFIX}/ holds run {run_id}")
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws.endpoint_url,
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    manifest = artifact_files_from_json(s3.get_object(
        Bucket=BUCKET, Key=f"{NEW_PREFIX}/{MANIFEST_FILE}")["Body"].read().decode())
    assert {"config.json", "model.safetensors", "quality_gate.json",
            "adapters/manga_domain/adapter_config.json"} <= set(manifest.files)
    assert sorted(manifest.adapters) == ["manga", "manga-ja", "support"]
    assert s3_keys(aws, NEW_PREFIX) == {f"{NEW_PREFIX}/{name}" for name in manifest.files} | {
        f"{NEW_PREFIX}/{MANIFEST_FILE}"}
    # Promoting again over the prefix that serves is refused (the config unchanged).
    refused = promote_on_server(aws, run_id, REPO_ROOT / "config")
    assert refused.returncode == 2
    assert "is what Prod-Serving serves now" in refused.stderr


def test_a_failing_gate_exits_1_says_why_and_uploads_no_model(
    aws: SimulatedQuantizeJob, eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def forgets_japanese_titles(item: EvalItem) -> str:
        return "わかりません。" if item.language == "ja" else good_answer(item)

    use_gate(aws, gate(eval_items, catalog, forgets_japanese_titles))
    before = s3_keys(aws, SERVED_PREFIX)
    result = launch(aws, "--base-model-prefix", BASE_PREFIX)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert "Failed     Failed: Training job failed" in result.stdout
    headline = next(line for line in result.stdout.splitlines()
                    if line.startswith("quality gate:"))
    assert headline.startswith("quality gate: FAILED (")
    assert "score_ja" in headline and "score_en" not in headline
    assert any(line.startswith("  FAIL score_ja: measured 0") for line in result.stdout.splitlines())
    run_id = aws.requests[-1]["Environment"]["REPORT_S3_URI"].rstrip("/").rsplit("/", 1)[1]
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"nothing was uploaded to s3://{BUCKET}/quantization/models/{run_id}/")
    assert s3_keys(aws, f"quantization/models/{run_id}") == set()
    assert s3_keys(aws, f"quantization/runs/{run_id}/") == {
        f"quantization/runs/{run_id}/quality_gate.json",
        f"quantization/runs/{run_id}/quality_gate.md"}
    assert s3_keys(aws, SERVED_PREFIX) == before


def test_refuses_a_base_model_outside_what_the_role_may_read(aws: SimulatedQuantizeJob) -> None:
    created = len(aws.requests)
    result = launch(aws, "--base-model-prefix", "models/llama-3-8b-instruct-awq")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --base-model-prefix: 'models/llama-3-8b-instruct-awq' is not accepted: the job's "
        "role reads only under quantization.base_model_root; use base-models/<model name>")
    assert len(aws.requests) == created


def test_refuses_a_group_size_the_endpoint_is_not_configured_for(
    aws: SimulatedQuantizeJob,
) -> None:
    result = launch(aws, "--base-model-prefix", BASE_PREFIX, "--group-size", "64")
    assert result.returncode == 2
    assert "--group-size: 64 is not accepted: the endpoint is configured for 'w4a16' (group 128)" \
        in result.stderr
