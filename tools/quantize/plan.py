"""What a quantization training job must look like, decided before anything calls AWS.

``tools.quantize`` is a thin shell: it reads the settings and the stack outputs, asks this
module for a :class:`JobPlan`, hands the plan to the sagemaker SDK, polls, and asks this module
what the gate report says. Everything here is pure (no boto3, no SDK) and unit-tested.

Where things go (all in the environment's artifact bucket, all encrypted with the project key):

* ``<base_model_root>/<name>/`` — the base model the ``model`` channel reads;
* ``<candidates_prefix>/<run id>/`` — the gated model, a candidate: the job uploads it only when
  the gate passes, with ``quality_gate.md/json`` beside the weights, each object carrying its
  SHA-256, and ``artifact-manifest.json`` last. Nothing serves it from there, and the job never
  writes the served prefix: ``make promote`` (tools/promote) copies a candidate, checked, to
  ``llm.model.artifact_prefix``;
* ``<reports_prefix>/<run id>/quality_gate.{md,json}`` — every run's verdict, pass or fail;
* ``<reports_prefix>/<run id>/sagemaker/`` — SageMaker's own output (``output.tar.gz``).

The training volume: an instance type with local NVMe storage (every GPU type the catalog has:
g4dn, g5, g6, g6e, p4d, p5) gets neither a ``VolumeKmsKeyId`` nor a ``VolumeSizeInGB`` —
"You can't request a VolumeKmsKeyId when using an instance type with local storage" and its
storage "is fixed to the NVMe-type instance's storage capacity" (SageMaker API Reference,
``ResourceConfig``); the hardware encrypts it. Only an EBS-backed type gets the settings' size
and the project key.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_budget import instance_type as catalog_instance_type
from gpu_budget import parse_quantization
from quantization import job_outputs
from stacks.settings import EnvironmentSettings

AWQ_BACKENDS = {"compressed-tensors": "llm-compressor", "awq": "autoawq"}
"""Checkpoint format the endpoint expects (``llm.model.quantization``) → the job's backend."""
GROUP_SIZES = (128, 64)
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
RUN_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}[a-z0-9]$")


class LaunchError(ValueError):
    """The job cannot be launched as asked; the message names what to change."""


@dataclass(frozen=True)
class StackOutputs:
    """The outputs the launcher reads from the environment's Foundation and Serving stacks."""

    bucket: str
    kms_key_arn: str
    role_arn: str
    image_uri: str
    subnet_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]

    @classmethod
    def from_describe_stacks(
        cls, stage_name: str, outputs: Mapping[str, Mapping[str, str]]
    ) -> StackOutputs:
        """``outputs`` maps a stack name (``Prod-Serving``) to its OutputKey → OutputValue."""
        found: dict[str, str] = {}
        for stack, keys in job_outputs.REQUIRED.items():
            name = job_outputs.stack_name(stage_name, stack)
            values = outputs.get(name)
            if values is None:
                raise LaunchError(f"stack {name} not found: deploy the environment first "
                                  f"(make deploy)")
            missing = [key for key in keys if not values.get(key)]
            if missing:
                raise LaunchError(f"stack {name} has no output {', '.join(missing)}: deploy the "
                                  "current version of the stacks (make deploy)")
            found.update({key: values[key] for key in keys})
        subnets = tuple(s for s in found[job_outputs.JOB_SUBNET_IDS].split(",") if s)
        return cls(
            bucket=found[job_outputs.ARTIFACT_BUCKET],
            kms_key_arn=found[job_outputs.PROJECT_KEY_ARN],
            role_arn=found[job_outputs.JOB_ROLE_ARN],
            image_uri=found[job_outputs.JOB_IMAGE_URI],
            subnet_ids=subnets,
            security_group_ids=(found[job_outputs.JOB_SECURITY_GROUP_ID],),
        )


@dataclass(frozen=True)
class JobPlan:
    """Everything the training job is created with."""

    run_id: str
    image_uri: str
    role_arn: str
    instance_type: str
    volume_size_gb: int | None
    """EBS volume size; None on an instance type with local storage (fixed by the instance)."""
    volume_kms_key_arn: str | None
    """Key of the EBS volume; None on an instance type with local storage (SageMaker refuses
    a VolumeKmsKeyId there)."""
    max_runtime_s: int
    subnet_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]
    kms_key_arn: str
    base_model_uri: str
    model_uri: str
    """The run's candidate prefix, ``s3://<bucket>/<candidates_prefix>/<run id>/``."""
    report_uri: str
    output_path: str
    environment: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def report_bucket_and_prefix(self) -> tuple[str, str]:
        """Bucket and key prefix (with a trailing slash) of this run's gate reports."""
        return split_s3_uri(self.report_uri)

    @property
    def model_bucket_and_prefix(self) -> tuple[str, str]:
        """Bucket and key prefix (with a trailing slash) of the gated model."""
        return split_s3_uri(self.model_uri)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` → ``("bucket", "a/b/")``."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise LaunchError(f"{uri!r} is not an s3://bucket/prefix/ URI")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


def new_run_id(environment: str, now: dt.datetime) -> str:
    """``awq-prod-20261123-184729``: sortable, unique per second, valid in S3 and job names."""
    return f"awq-{environment}-{now.astimezone(dt.UTC):%Y%m%d-%H%M%S}"


def plan_job(
    settings: EnvironmentSettings,
    outputs: StackOutputs,
    *,
    base_model_prefix: str,
    run_id: str,
    group_size: int | None = None,
    instance_type: str | None = None,
) -> JobPlan:
    """The job for ``settings``' environment, or a LaunchError naming the bad argument."""
    quant = settings.quantization
    prefix = base_model_prefix.strip("/")
    if not prefix.startswith(f"{quant.base_model_root}/") or prefix == quant.base_model_root:
        raise LaunchError(
            f"--base-model-prefix: {base_model_prefix!r} is not accepted: the job's role reads "
            f"only under quantization.base_model_root; use {quant.base_model_root}/<model name>"
        )
    if not RUN_ID_PATTERN.match(run_id):
        raise LaunchError(f"run id {run_id!r} is not accepted: lowercase letters, digits and -")

    served = parse_quantization(settings.llm.model.quantization)
    backend = AWQ_BACKENDS.get(served.checkpoint_quant_method or "")
    if backend is None or served.bits != 4:
        raise LaunchError(
            f"llm.model.quantization: {settings.llm.model.quantization!r} is not an AWQ INT4 "
            "checkpoint; the job produces w4a16 (llm-compressor) or awq (AutoAWQ)"
        )
    expected_group = served.group_size or 128
    group = expected_group if group_size is None else group_size
    if group not in GROUP_SIZES:
        raise LaunchError(f"--group-size: {group} is not accepted; use one of "
                          f"{', '.join(map(str, GROUP_SIZES))}")
    if group != expected_group:
        raise LaunchError(
            f"--group-size: {group} is not accepted: the endpoint is configured for "
            f"{settings.llm.model.quantization!r} (group {expected_group}); change "
            "llm.model.quantization first so the GPU budget and the weights agree"
        )

    chosen_instance = instance_type or quant.instance_type
    local_storage = _training_instance_storage(chosen_instance, quant.instance_type)
    if not outputs.subnet_ids:
        raise LaunchError("stack output QuantizationJobSubnetIds is empty")

    bucket = outputs.bucket
    model_uri = f"s3://{bucket}/{candidate_prefix(settings, run_id)}/"
    report_uri = f"s3://{bucket}/{quant.reports_prefix}/{run_id}/"
    return JobPlan(
        run_id=run_id,
        image_uri=outputs.image_uri,
        role_arn=outputs.role_arn,
        instance_type=chosen_instance,
        volume_size_gb=None if local_storage else quant.volume_size_gb,
        volume_kms_key_arn=None if local_storage else outputs.kms_key_arn,
        max_runtime_s=quant.max_runtime_s,
        subnet_ids=outputs.subnet_ids,
        security_group_ids=outputs.security_group_ids,
        kms_key_arn=outputs.kms_key_arn,
        base_model_uri=f"s3://{bucket}/{prefix}/",
        model_uri=model_uri,
        report_uri=report_uri,
        output_path=f"{report_uri}sagemaker",
        environment={
            "ARTIFACT_S3_URI": model_uri,
            "REPORT_S3_URI": report_uri,
            "ARTIFACT_KMS_KEY_ID": outputs.kms_key_arn,
            "AWQ_BACKEND": backend,
            "AWQ_GROUP_SIZE": str(group),
            # Every served adapter is gated on the quantized base; their folders travel in the
            # model channel (<base model prefix>/adapters/<folder>/, what they were trained on).
            "GATE_ADAPTERS": ",".join(f"{adapter.name}={adapter.folder}"
                                      for adapter in settings.llm.adapters),
        },
        tags={"Project": "MangaAssist", "Environment": settings.name,
              "QuantizationRun": run_id},
    )


def candidate_prefix(settings: EnvironmentSettings, run_id: str) -> str:
    """Where run ``run_id``'s gated model goes: ``<quantization.candidates_prefix>/<run id>``."""
    return f"{settings.quantization.candidates_prefix}/{run_id}"


def _training_instance_storage(chosen: str, configured: str) -> bool:
    """Whether ``chosen`` has local NVMe storage; LaunchError for a type the job cannot use.

    The job's role grants the project key to an EBS training volume only when the configured
    type (``quantization.instance_type``) needs one, so an EBS-backed ``--instance-type`` is
    refused when the configured one has local storage.
    """
    try:
        chosen_type = catalog_instance_type(chosen)
    except ValueError as error:
        raise LaunchError(f"--instance-type: {error}") from None
    if chosen_type.accelerator_kind != "gpu":
        raise LaunchError(f"--instance-type: {chosen!r} is not accepted: AWQ calibration needs "
                          "a GPU instance (ml.g5.*, ml.g6.*, ...)")
    if not chosen_type.local_instance_storage and \
            catalog_instance_type(configured).local_instance_storage:
        raise LaunchError(
            f"--instance-type: {chosen!r} is not accepted: its training volume is EBS, which "
            f"needs the project key (VolumeKmsKeyId) that the job's role may grant only when "
            f"quantization.instance_type is EBS-backed too ({configured!r} has local storage); "
            "set quantization.instance_type and deploy first")
    return chosen_type.local_instance_storage


# --- while it runs ------------------------------------------------------------------------


def progress_line(elapsed_s: float, description: Mapping[str, Any]) -> str:
    """One line for the progress display: elapsed time, status, secondary status, message."""
    minutes, seconds = divmod(int(elapsed_s), 60)
    status = description.get("TrainingJobStatus", "?")
    secondary = description.get("SecondaryStatus", "?")
    transitions = description.get("SecondaryStatusTransitions") or []
    message = transitions[-1].get("StatusMessage", "") if transitions else ""
    line = f"[{minutes:3d}m{seconds:02d}s] {status:<10} {secondary}"
    return f"{line}: {message}" if message else line


# --- after it ran ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GateVerdict:
    """What quality_gate.json says, in the words the launcher prints."""

    passed: bool
    failed_checks: tuple[str, ...]
    lines: tuple[str, ...]

    @classmethod
    def from_report(cls, text: str) -> GateVerdict:
        """Parse quality_gate.json (quantization/gate.py's report_to_dict)."""
        try:
            report = json.loads(text)
            passed = report["passed"]
            checks = report["checks"]
        except (ValueError, KeyError, TypeError) as error:
            raise LaunchError(f"quality_gate.json is not a gate report: {error}") from None
        if not isinstance(passed, bool) or not isinstance(checks, list):
            raise LaunchError("quality_gate.json is not a gate report: passed/checks malformed")
        lines = []
        for check in checks:
            mark = "ok  " if check.get("passed") else "FAIL"
            lines.append(f"  {mark} {check.get('name')}: measured {check.get('measured'):g}, "
                         f"needs {check.get('comparison')} {check.get('threshold'):g}")
        failed = tuple(str(name) for name in report.get("failed_checks", []))
        return cls(passed=passed, failed_checks=failed, lines=tuple(lines))

    def headline(self) -> str:
        """``quality gate: PASSED`` or ``quality gate: FAILED (score_ja, ...)``."""
        if self.passed:
            return "quality gate: PASSED"
        return f"quality gate: FAILED ({', '.join(self.failed_checks) or 'see the report'})"


@dataclass(frozen=True)
class Outcome:
    """The launcher's exit code and the last line it prints."""

    exit_code: int
    message: str


CANDIDATE_FILES = frozenset({"config.json", "quality_gate.json", "artifact-manifest.json"})
"""What a passing run's candidate prefix holds at least (the manifest is written last)."""


def decide_outcome(
    status: str, failure_reason: str | None, verdict: GateVerdict | None,
    uploaded_keys: frozenset[str], model_uri: str, *, promote_hint: str = "",
) -> Outcome:
    """Exit 0 only when the job completed, its gate passed and the candidate is complete.

    1: the gate failed (nothing was uploaded to the model prefix). 2: anything else went wrong
    (the job failed before the gate, was stopped, or its outputs are not where they must be).
    """
    if verdict is None:
        reason = f": {failure_reason}" if failure_reason else ""
        return Outcome(2, f"job {status}{reason}; no gate report was written")
    if not verdict.passed:
        if status == "Completed":
            return Outcome(2, "the gate report says FAILED but the job completed: the job image "
                              "and the launcher disagree; nothing may be served from it")
        return Outcome(1, f"{verdict.headline()}; nothing was uploaded to {model_uri}")
    if status != "Completed":
        reason = f": {failure_reason}" if failure_reason else ""
        return Outcome(2, f"the gate passed but the job {status}{reason}; {model_uri} may be "
                          "incomplete (make promote refuses a candidate without its manifest)")
    missing = sorted(CANDIDATE_FILES - uploaded_keys)
    if missing:
        return Outcome(2, f"the gate passed but {', '.join(missing)} is missing at {model_uri}")
    hint = f"; promote it with {promote_hint}" if promote_hint else ""
    return Outcome(0, f"{verdict.headline()}; candidate uploaded to {model_uri}{hint}")
