"""What `make promote` decides before it copies a byte: is this run's candidate fit to serve?

A quantization run that passes its gate leaves a candidate at
``<quantization.candidates_prefix>/<run id>/`` (the weights, tokenizer, config, the gate's
reports, every object carrying its SHA-256, and ``artifact-manifest.json`` last). Promotion makes
it the LLM's model data at ``llm.model.artifact_prefix`` together with the LoRA adapters the
endpoint serves now, under one new manifest. It refuses, one line per problem, when:

* the target is the prefix the deployed Serving stack serves — a model is never written over
  what is being served (a new instance would load a mix; there would be no blue/green and no
  rollback): point ``llm.model.artifact_prefix`` at a new prefix, promote, then ``make deploy``;
* the run's gate report (``<reports_prefix>/<run id>/quality_gate.json``) is missing or says
  FAILED, or the candidate's copy of it is not the same report;
* the report has no passing section for an adapter ``llm.adapters`` serves, or the candidate's
  manifest does not name it: every served adapter must have been gated on this quantized model;
* an adapter in the prefix the adapters come from is not the one the run gated (its checksum
  differs from the one the candidate's manifest names);
* the candidate is incomplete or differs from its manifest (size, SHA-256, the project key);
* its ``config.json`` is not the architecture the GPU budget planned or not the quantization
  ``llm.model.quantization`` names;
* a configured adapter is missing from, or differs in, the prefix the adapters come from;
* the target holds anything else (another model, stray files): it must be empty, or hold exactly
  a previous, interrupted run of this same promotion (which it then finishes).

Pure module: it reads what the CLI fetched from S3 (tools/promote/__main__.py); no AWS calls.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from artifact_manifest import (
    MANIFEST_FILE,
    ArtifactFiles,
    FileDigest,
    ManifestError,
    NamedAdapter,
    adapter_checksum_in,
)
from stacks.artifact_layout import ADAPTERS_DIR, ModelArtifact
from stacks.settings import EnvironmentSettings
from tools.preflight.checks import ArtifactListing, ObjectHead, artifact_problems
from tools.publish.checks import check_model_config

GATE_REPORT = "quality_gate.json"


def prefix_artifact(label: str, prefix: str) -> ModelArtifact:
    """A model-data prefix (a candidate, the served model, the target) as a ModelArtifact."""
    return ModelArtifact(endpoint=label, model_data_key=f"{prefix}/", read_prefix=prefix,
                         manifest_key=f"{prefix}/{MANIFEST_FILE}")


@dataclass(frozen=True)
class Copy:
    """One object promotion copies: from a source key to a target key, with its digest."""

    source_key: str
    target_key: str
    digest: FileDigest


@dataclass(frozen=True)
class PromotionPlan:
    """What promotion writes: the copies (those already in place skipped) and the manifest."""

    target_prefix: str
    copies: tuple[Copy, ...]
    manifest: ArtifactFiles
    already_there: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_bytes(self) -> int:
        """Bytes still to copy."""
        return sum(copy.digest.size for copy in self.copies)

    @property
    def manifest_key(self) -> str:
        """The target's artifact-manifest.json (written last)."""
        return f"{self.target_prefix}/{MANIFEST_FILE}"


@dataclass(frozen=True)
class PromotionInputs:
    """What the CLI read from S3 and CloudFormation for one promotion."""

    run_id: str
    candidate: ArtifactListing
    gate_report: str | None
    """The run's quality_gate.json from the reports prefix (None: not there)."""
    candidate_config: str | None
    """The candidate's config.json (None: not there)."""
    adapters: ArtifactListing
    """The prefix the adapters are copied from (the served one, or --adapters-from)."""
    target: ArtifactListing
    """The target prefix as it is now (its manifest, if any, and every key under it)."""
    target_heads: Mapping[str, ObjectHead | None]
    """Head of every key under the target (to resume an interrupted promotion)."""
    served_prefix: str | None
    """What the deployed Serving stack serves (None: no Serving stack deployed)."""


def _manifest(listing: ArtifactListing) -> ArtifactFiles | None:
    from artifact_manifest import artifact_files_from_json

    if listing.manifest_text is None:
        return None
    return artifact_files_from_json(listing.manifest_text, source=listing.artifact.manifest_key)


def target_problems(settings: EnvironmentSettings, served_prefix: str | None) -> list[str]:
    """Refuse a target that is being served (the one check that needs nothing from S3)."""
    target = settings.llm.model.artifact_prefix
    if served_prefix is not None and served_prefix == target:
        return [f"llm.model.artifact_prefix {target!r} is what {settings.serving_stack_name} "
                "serves now: a model is never promoted over the served prefix (a new instance "
                "would load a mix, with no blue/green and no rollback); set "
                f"llm.model.artifact_prefix in config/{settings.name}.yaml to a new prefix (e.g. "
                f"{target}-<run date>), promote, then make deploy ENV={settings.name}"]
    return []


def gate_problems(inputs: PromotionInputs, bucket: str, reports_key: str,
                  candidate: ArtifactFiles) -> list[str]:
    """The run's verdict passed, and the candidate carries that very report."""
    where = f"s3://{bucket}/{reports_key}"
    if inputs.gate_report is None:
        return [f"{where}: missing: run {inputs.run_id} has no gate verdict (not a run of "
                "make quantize, or it failed before its gate)"]
    try:
        report = json.loads(inputs.gate_report)
        passed = report["passed"]
    except (ValueError, KeyError, TypeError) as error:
        return [f"{where}: not a gate report ({error})"]
    if passed is not True:
        failed = ", ".join(report.get("failed_checks", [])) or "see the report"
        return [f"{where}: the quality gate FAILED ({failed}): a failed run is never promoted"]
    digest = hashlib.sha256(inputs.gate_report.encode("utf-8")).hexdigest()
    carried = candidate.files.get(GATE_REPORT)
    if carried is None or carried.sha256 != digest:
        return [f"the candidate's {GATE_REPORT} is not the run's report at {where}: the "
                "candidate was not written by this run"]
    return []


def report_adapter_problems(inputs: PromotionInputs, settings: EnvironmentSettings,
                            where: str) -> list[str]:
    """Every adapter the configuration serves has a passing section in the run's report."""
    try:
        report = json.loads(inputs.gate_report or "{}")
    except ValueError:
        return []  # gate_problems reports an unreadable report
    sections = report.get("adapters") if isinstance(report, dict) else None
    sections = sections if isinstance(sections, dict) else {}
    problems = []
    for adapter in settings.llm.adapters:
        section = sections.get(adapter.name)
        if not isinstance(section, dict):
            problems.append(
                f"{where}: no section for adapter {adapter.name!r} (llm.adapters): the run's "
                "gate did not evaluate it on this quantized model (it gated: "
                f"{', '.join(sections) or 'no adapter'}); re-run make quantize "
                f"ENV={settings.name} with the served adapters")
        elif section.get("passed") is not True:
            problems.append(f"{where}: adapter {adapter.name!r} FAILED its gate "
                            f"({', '.join(section.get('failed_checks', [])) or 'see the report'})")
    return problems


def gated_adapter_problems(settings: EnvironmentSettings, candidate: ArtifactFiles,
                           source: ArtifactListing, bucket: str
                           ) -> tuple[dict[str, NamedAdapter], list[str]]:
    """The served adapters as the candidate's manifest names them, each checked against the
    adapter files promotion copies (same folder, same checksum)."""
    root = f"s3://{bucket}/{source.artifact.read_prefix}/"
    try:
        source_manifest = _manifest(source)
    except ManifestError as error:
        return {}, [str(error)]
    named: dict[str, NamedAdapter] = {}
    problems: list[str] = []
    for adapter in settings.llm.adapters:
        gated = candidate.adapters.get(adapter.name)
        if gated is None or gated.directory != adapter.folder:
            problems.append(f"the candidate's {MANIFEST_FILE} names no adapter {adapter.name!r} "
                            f"in folder {adapter.folder!r}: the run was not gated with it")
            continue
        copied = (None if source_manifest is None
                  else adapter_checksum_in(source_manifest, adapter.folder, ADAPTERS_DIR))
        if copied is not None and copied != gated.sha256:
            problems.append(f"{root}{ADAPTERS_DIR}/{adapter.folder}/: checksum {copied[:12]}… "
                            f"is not the {gated.sha256[:12]}… adapter {adapter.name!r} was gated "
                            "with: publish the gated one, or re-run make quantize with this one")
        named[adapter.name] = gated
    return named, problems


def config_problems(inputs: PromotionInputs, settings: EnvironmentSettings,
                    where: str) -> list[str]:
    """The candidate's config.json against the architecture and quantization configured."""
    if inputs.candidate_config is None:
        return [f"{where}: missing"]
    try:
        config: Any = json.loads(inputs.candidate_config)
    except ValueError as error:
        return [f"{where}: not valid JSON ({error})"]
    if not isinstance(config, dict):
        return [f"{where}: expected a JSON object"]
    return check_model_config(config, settings.llm, where=where)


def adapter_files(settings: EnvironmentSettings, source: ArtifactListing,
                  bucket: str) -> tuple[dict[str, FileDigest], list[str]]:
    """The configured adapters' files in the source manifest (relative path -> digest)."""
    manifest = _manifest(source)
    root = f"s3://{bucket}/{source.artifact.read_prefix}/"
    if manifest is None:
        return {}, [f"{root}{MANIFEST_FILE}: missing: the adapters are taken from a prefix "
                    "make publish wrote (the served one, or --adapters-from)"]
    files: dict[str, FileDigest] = {}
    problems: list[str] = []
    for adapter in settings.llm.adapters:
        folder = f"{ADAPTERS_DIR}/{adapter.folder}/"
        found = {path: digest for path, digest in manifest.files.items()
                 if path.startswith(folder)}
        if not found:
            problems.append(f"{root}{folder}: not in {MANIFEST_FILE}: adapter {adapter.name!r} "
                            f"of llm.adapters is not published there (make publish ADAPTERS=...)")
        files.update(found)
    return files, problems


def _planned_files(candidate: ArtifactFiles, adapters: Mapping[str, FileDigest]
                   ) -> dict[str, FileDigest]:
    base = {path: digest for path, digest in candidate.files.items()
            if not path.startswith(f"{ADAPTERS_DIR}/")}
    return {**base, **adapters}


def _copies(plan_files: Mapping[str, FileDigest], inputs: PromotionInputs, target: str,
            project_key_arn: str) -> tuple[list[Copy], list[str]]:
    copies: list[Copy] = []
    in_place: list[str] = []
    for path, digest in sorted(plan_files.items()):
        source_root = (inputs.adapters if path.startswith(f"{ADAPTERS_DIR}/")
                       else inputs.candidate).artifact
        target_key = f"{target}/{path}"
        head = inputs.target_heads.get(target_key)
        if head is not None and head.size == digest.size and head.sha256 == digest.sha256 \
                and head.encryption == "aws:kms" and head.kms_key_id is not None \
                and head.kms_key_id.rsplit("/", 1)[-1] == project_key_arn.rsplit("/", 1)[-1]:
            in_place.append(target_key)
            continue
        copies.append(Copy(source_root.key(path), target_key, digest))
    return copies, in_place


def _existing_target_problems(inputs: PromotionInputs, planned: ArtifactFiles, bucket: str
                              ) -> tuple[list[str], bool]:
    """(problems, already promoted) for what the target holds now."""
    target = inputs.target.artifact
    root = f"s3://{bucket}"
    try:
        existing = _manifest(inputs.target)
    except ManifestError as error:
        return [f"{error}: the target holds an unreadable manifest"], False
    if existing is not None:
        if existing.to_json() == planned.to_json():
            return [], True
        return [f"{root}/{target.manifest_key}: the target already holds another model; "
                "promote to a new llm.model.artifact_prefix"], False
    planned_keys = {target.key(path) for path in planned.files}
    stray = sorted(key for key in inputs.target.keys_under_prefix if key not in planned_keys)
    return [f"{root}/{key}: not part of this promotion, but SageMaker would copy it into the "
            f"model directory: aws s3 rm {root}/{key}" for key in stray], False


def plan_promotion(settings: EnvironmentSettings, inputs: PromotionInputs, *, bucket: str,
                   project_key_arn: str, reports_key: str) -> tuple[PromotionPlan | None,
                                                                    list[str]]:
    """The plan, or every problem that stops it (one line each)."""
    problems = target_problems(settings, inputs.served_prefix)
    if problems:
        return None, problems
    candidate_root = f"s3://{bucket}/{inputs.candidate.artifact.read_prefix}/"
    rerun = f"make quantize ENV={settings.name} (a new run)"
    try:
        candidate = _manifest(inputs.candidate)
    except ManifestError as error:
        return None, [f"{error}: {rerun}"]
    if candidate is None:
        return None, [f"{candidate_root}{MANIFEST_FILE}: missing: run {inputs.run_id} left no "
                      f"complete candidate (its gate failed or its upload did not finish): "
                      f"{rerun}"]
    problems += artifact_problems(inputs.candidate, bucket=bucket,
                                  project_key_arn=project_key_arn, environment=settings.name,
                                  fix=rerun)
    gate = gate_problems(inputs, bucket, reports_key, candidate)
    problems += gate or report_adapter_problems(inputs, settings, f"s3://{bucket}/{reports_key}")
    problems += config_problems(inputs, settings, f"{candidate_root}config.json")
    adapters, adapter_problems = adapter_files(settings, inputs.adapters, bucket)
    problems += adapter_problems
    if not adapter_problems:
        problems += artifact_problems(
            _only(inputs.adapters, adapters), bucket=bucket, project_key_arn=project_key_arn,
            environment=settings.name, check_stray=False)
    named, gated_problems = gated_adapter_problems(settings, candidate, inputs.adapters, bucket)
    problems += gated_problems
    planned = ArtifactFiles(files=_planned_files(candidate, adapters), adapters=named)
    target_issues, done = _existing_target_problems(inputs, planned, bucket)
    problems += target_issues
    if problems:
        return None, problems
    target = settings.llm.model.artifact_prefix
    if done:
        return PromotionPlan(target, (), planned, tuple(sorted(
            inputs.target.artifact.key(p) for p in planned.files))), []
    copies, in_place = _copies(planned.files, inputs, target, project_key_arn)
    return PromotionPlan(target, tuple(copies), planned, tuple(in_place)), []


def _only(listing: ArtifactListing, files: Mapping[str, FileDigest]) -> ArtifactListing:
    """The listing reduced to ``files`` (the adapters), as a manifest of their own."""
    return ArtifactListing(listing.artifact, ArtifactFiles(files=dict(files)).to_json(),
                           listing.heads)


def describe_plan(plan: PromotionPlan, bucket: str) -> Sequence[str]:
    """One line per copy, for --dry-run and the progress display."""
    return [f"copy s3://{bucket}/{c.source_key} -> s3://{bucket}/{c.target_key} "
            f"({c.digest.size} bytes)" for c in plan.copies]
