"""What `make preflight` decides, given what it read from AWS and the synthesized templates.

Each function takes plain data and returns problems, one line each, naming the fix:

* the CDK bootstrap (the ``CDKToolkit`` stack and its version parameter) is present and at least
  the version the synthesized templates require: their ``CheckBootstrapVersion`` rule refuses
  listed older versions, and the cloud assembly states ``requiresBootstrapStackVersion``;
* the artifacts each endpoint reads are all there, each matching its artifact-manifest.json
  (size, SHA-256 in the object's metadata, encrypted with the project key the model role may
  decrypt), and nothing else is under the LLM's prefix (SageMaker would copy it too);
* the SageMaker service quotas ("<instance type> for endpoint usage") cover every variant at its
  maximum capacity plus a blue/green deployment's green fleet, which SageMaker provisions at the
  blue fleet's size before it removes the blue one — for every environment deployed to the same
  account and region together, since a quota is per account and region — and
  "<instance type> for training job usage" covers one quantization job per environment.

Pure module: no AWS calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from artifact_manifest import ArtifactFiles, ManifestError, artifact_files_from_json
from stacks.artifact_layout import ModelArtifact
from stacks.settings import EnvironmentSettings

BOOTSTRAP_RULE = "CheckBootstrapVersion"
BOOTSTRAP_PARAMETER = "BootstrapVersion"
DEFAULT_BOOTSTRAP_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
TOOLKIT_STACK = "CDKToolkit"
USABLE_STACK_STATUSES = frozenset({"CREATE_COMPLETE", "UPDATE_COMPLETE",
                                   "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE",
                                   "IMPORT_ROLLBACK_COMPLETE"})
"""A stack in any other state (failed, rolled back at creation, in progress) cannot be used."""


# --- CDK bootstrap ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapRequirement:
    """The bootstrap version the synthesized app needs, and where the deployed one is read."""

    version: int
    ssm_parameter: str


def _refused_versions(rule: Mapping[str, Any]) -> list[int]:
    """The versions a CheckBootstrapVersion rule lists as too old (Fn::Not / Fn::Contains)."""
    refused: list[int] = []
    for assertion in rule.get("Assertions", []):
        negation = assertion.get("Assert", {}).get("Fn::Not", [])
        for condition in negation:
            contains = condition.get("Fn::Contains") if isinstance(condition, dict) else None
            if contains and isinstance(contains[0], list):
                refused += [int(value) for value in contains[0]]
    return refused


def bootstrap_requirement(templates: Iterable[Mapping[str, Any]],
                          assembly_versions: Iterable[int] = ()) -> BootstrapRequirement:
    """The highest version any template's rule or the assembly manifest requires."""
    required = max([0, *assembly_versions])
    parameter = DEFAULT_BOOTSTRAP_PARAMETER
    for template in templates:
        rule = template.get("Rules", {}).get(BOOTSTRAP_RULE)
        if rule:
            refused = _refused_versions(rule)
            if refused:
                required = max(required, max(refused) + 1)
        default = template.get("Parameters", {}).get(BOOTSTRAP_PARAMETER, {}).get("Default")
        if isinstance(default, str):
            parameter = default
    return BootstrapRequirement(version=required, ssm_parameter=parameter)


def bootstrap_problem(requirement: BootstrapRequirement, *, deployed_version: str | None,
                      toolkit_status: str | None, account: str, region: str) -> str | None:
    """One line when the environment is not bootstrapped, broken, or bootstrapped too old."""
    bootstrap = f"npx cdk bootstrap aws://{account}/{region}"
    if toolkit_status is not None and toolkit_status not in USABLE_STACK_STATUSES:
        return (f"CDK bootstrap stack {TOOLKIT_STACK} in {account}/{region} is {toolkit_status}: "
                f"fix or delete it, then run {bootstrap}")
    if deployed_version is None:
        return (f"{account}/{region} is not bootstrapped for the CDK (no SSM parameter "
                f"{requirement.ssm_parameter}): run {bootstrap}")
    try:
        version = int(deployed_version)
    except ValueError:
        return (f"SSM parameter {requirement.ssm_parameter} holds {deployed_version!r}, not a "
                f"bootstrap version: run {bootstrap}")
    if version < requirement.version:
        return (f"CDK bootstrap version {version} in {account}/{region} is older than the "
                f"{requirement.version} these templates require: run {bootstrap}")
    return None


# --- artifacts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectHead:
    """What preflight needs of one S3 object (head-object)."""

    size: int
    sha256: str | None
    kms_key_id: str | None
    encryption: str | None


@dataclass(frozen=True)
class ArtifactListing:
    """One artifact as found in S3."""

    artifact: ModelArtifact
    manifest_text: str | None
    heads: Mapping[str, ObjectHead | None]
    """Key -> head of every file the manifest lists (None when missing)."""
    keys_under_prefix: Sequence[str] = field(default_factory=tuple)


def _same_key(found: str | None, project_key: str) -> bool:
    return found is not None and found.rsplit("/", 1)[-1] == project_key.rsplit("/", 1)[-1]


def parse_listing_manifest(listing: ArtifactListing, bucket: str) -> ArtifactFiles | None:
    if listing.manifest_text is None:
        return None
    return artifact_files_from_json(listing.manifest_text,
                                    source=f"s3://{bucket}/{listing.artifact.manifest_key}")


def artifact_problems(listing: ArtifactListing, *, bucket: str, project_key_arn: str,
                      environment: str, fix: str | None = None,
                      check_stray: bool = True) -> list[str]:
    """Missing, different or stray objects of one artifact (an endpoint's, or a quantization
    candidate's); ``fix`` is what each problem tells to run (default: make publish).
    ``check_stray`` False checks only the listed files (part of a prefix)."""
    artifact = listing.artifact
    publish = fix or f"make publish ENV={environment}"
    root = f"s3://{bucket}"
    try:
        manifest = parse_listing_manifest(listing, bucket)
    except ManifestError as error:
        return [f"{error}: run {publish} again"]
    if manifest is None:
        return [f"{root}/{artifact.manifest_key}: missing, so the {artifact.endpoint} endpoint's "
                f"artifacts were never published (completely): run {publish}"]
    problems: list[str] = []
    for relative, expected in sorted(manifest.all_files.items()):
        key = artifact.key(relative)
        head = listing.heads.get(key)
        if head is None:
            problems.append(f"{root}/{key}: missing (listed in {artifact.manifest_key}): "
                            f"run {publish}")
        elif head.size != expected.size or head.sha256 != expected.sha256:
            problems.append(f"{root}/{key}: {head.size} bytes, SHA-256 {head.sha256 or 'unknown'}"
                            f" does not match its manifest ({expected.size} bytes, "
                            f"{expected.sha256}): run {publish}")
        elif head.encryption != "aws:kms" or not _same_key(head.kms_key_id, project_key_arn):
            problems.append(f"{root}/{key}: not encrypted with the project key, the only key "
                            f"the model role may decrypt: run {publish}")
    if artifact.is_prefix and check_stray:
        listed = {artifact.key(relative) for relative in manifest.all_files}
        listed.add(artifact.manifest_key)
        problems += [f"{root}/{key}: not in {artifact.manifest_key}, but SageMaker copies "
                     f"everything under {artifact.model_data_key} into the model directory: "
                     f"aws s3 rm {root}/{key}"
                     for key in sorted(listing.keys_under_prefix) if key not in listed]
    return problems


# --- service quotas ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaNeed:
    """Instances of one type the environments of one account and region may run at once, and
    why."""

    instance_type: str
    instances: int
    reasons: tuple[str, ...]
    usage: str = "endpoint"
    """``endpoint`` or ``training job``: SageMaker has one quota per instance type and use."""

    @property
    def quota_name(self) -> str:
        """The SageMaker quota's name in Service Quotas."""
        return f"{self.instance_type} for {self.usage} usage"


def quota_needs(settings: EnvironmentSettings,
                environments: Sequence[EnvironmentSettings] = ()) -> list[QuotaNeed]:
    """What the quotas of ``settings``' account and region must hold for every environment
    deployed there (``environments``: all of them; ``settings`` is always counted).

    Per instance type: each variant's max capacity plus a green fleet of the same size — a
    blue/green update provisions the green fleet at the blue fleet's instance count (the
    endpoint keeps the count autoscaling chose), so at peak both fleets exist together — summed
    over the environments that share the account and region (a quota is per account and
    region). And one training instance per environment for ``make quantize``, whose
    ``<type> for training job usage`` quota is separate.
    """
    sharing = [settings, *(e for e in environments if e.name != settings.name
                           and (e.account, e.region) == (settings.account, settings.region))]
    by_quota: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for env in sorted(sharing, key=lambda e: e.name):
        for name, endpoint in (("llm", env.llm), ("intent", env.intent)):
            maximum = endpoint.scaling.max_capacity
            by_quota.setdefault((endpoint.instance_type, "endpoint"), []).append((
                2 * maximum, f"{env.name} {name}: max_capacity {maximum} + a blue/green green "
                f"fleet of {maximum}"))
        by_quota.setdefault((env.quantization.instance_type, "training job"), []).append((
            1, f"{env.name}: make quantize"))
    return [QuotaNeed(instance_type, sum(n for n, _ in items), tuple(r for _, r in items), usage)
            for (instance_type, usage), items in sorted(by_quota.items())]


def quota_problems(needs: Sequence[QuotaNeed], quotas: Mapping[str, tuple[float, str] | None],
                   *, region: str) -> list[str]:
    """``quotas`` maps a quota name to (value, quota code), None when Service Quotas has none."""
    problems: list[str] = []
    for need in needs:
        found = quotas.get(need.quota_name)
        why = "; ".join(need.reasons)
        if found is None:
            problems.append(f"SageMaker quota {need.quota_name!r} not found in {region}: "
                            f"{need.instance_type} may not be offered there ({why})")
            continue
        value, code = found
        if value < need.instances:
            problems.append(
                f"SageMaker quota {need.quota_name!r} is {math.floor(value)} in {region}, "
                f"{need.instances} needed ({why}): aws service-quotas "
                f"request-service-quota-increase --service-code sagemaker --quota-code {code} "
                f"--desired-value {need.instances} --region {region}")
    return problems
