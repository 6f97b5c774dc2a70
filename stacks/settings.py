"""Per-environment settings: one YAML file per environment, one typed, validated model.

``config/<env>.yaml`` is read here and nowhere else; every stack and construct receives the
validated :class:`EnvironmentSettings`. Unknown keys are errors (a typo must not silently fall back
to a default), and a bad value stops synth with :class:`SettingsError`, whose message names the
file, the field path, the value and what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "config"
DEFAULT_ENVIRONMENTS: tuple[str, ...] = ("dev", "prod")
"""Environments ``app.py`` synthesizes when none is chosen (the embedded default)."""

# Regions with SageMaker real-time inference on GPU instances we use; extend as the platform moves.
KNOWN_REGIONS: frozenset[str] = frozenset(
    {
        "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
        "ap-south-1", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2",
        "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
    }
)

AccountId = Annotated[str, StringConstraints(pattern=r"^\d{12}$")]
EnvironmentName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,15}$")]
Email = Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")]
TagValue = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class SettingsError(ValueError):
    """A configuration file is missing, unreadable or invalid. The message is for a person."""


class _Strict(BaseModel):
    """Base for every settings model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class AlertSettings(_Strict):
    """Who hears the alarms: the encrypted SNS topic's subscribers."""

    email_subscribers: list[Email] = Field(
        default_factory=list,
        description="Addresses subscribed to the alarm topic (each must confirm by email).",
    )


class ArtifactBucketSettings(_Strict):
    """The model-artifact bucket (AWQ weights, LoRA adapters, compiled Neuron models)."""

    removal_policy: Literal["retain", "destroy"] = Field(
        "retain",
        description="What CloudFormation does with the bucket when the stack is deleted. "
        "'destroy' only works on an empty bucket.",
    )
    noncurrent_version_expiration_days: int = Field(
        90, ge=1, le=3650, description="Days a replaced object version is kept."
    )
    access_log_retention_days: int = Field(
        365, ge=1, le=3650, description="Days server access logs are kept."
    )


class EnvironmentSettings(_Strict):
    """Everything that differs between environments. Read by every stack, validated once."""

    name: EnvironmentName = Field(description="Short environment name: dev, prod, ...")
    stage_name: Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Za-z0-9]{1,15}$")] = Field(
        description="CDK Stage id, e.g. Dev or Prod; `cdk deploy \"Prod/*\"` selects it."
    )
    account: AccountId = Field(description="12-digit AWS account id.")
    region: str = Field(description="AWS region, e.g. ap-northeast-1.")
    tags: dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 _.:/=+\-@]{1,128}$")], TagValue
    ] = Field(default_factory=dict, description="Tags applied to every resource.")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    artifacts: ArtifactBucketSettings = Field(default_factory=ArtifactBucketSettings)

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", value):
            raise ValueError("must look like ap-northeast-1")
        if value not in KNOWN_REGIONS:
            raise ValueError(f"must be one of {', '.join(sorted(KNOWN_REGIONS))}")
        return value

    @property
    def resource_prefix(self) -> str:
        """Prefix for physical names that must be stable per environment."""
        return f"manga-assist-{self.name}"


# --- loading and error reporting -------------------------------------------------------------


def _describe_location(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """Render a pydantic error location as a dotted field path: ``llm.adapters[1].rank``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _accepted_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str] | None:
    """The field names accepted at ``loc``'s parent, for 'unknown key' messages."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _model_in_annotation(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return None


def _model_in_annotation(annotation: Any) -> Any:
    """Find a BaseModel class inside ``list[Model]``, ``Model | None`` and similar annotations."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def _format_error(source: str, model: type[BaseModel], error: ErrorDetails) -> str:
    location = _describe_location(model, error["loc"])
    if error["type"] == "extra_forbidden":
        accepted = _accepted_keys(model, error["loc"])
        hint = f"; accepted keys here: {', '.join(accepted)}" if accepted else ""
        return f"{source}: {location}: unknown key (typo?){hint}"
    if error["type"] == "missing":
        return f"{source}: {location}: required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    return f"{source}: {location}: {error['input']!r} is not accepted: {message}"


def format_validation_error(source: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One line per problem: file, field path, value, what is accepted."""
    return "\n".join(_format_error(source, model, error) for error in exc.errors())


def parse_settings(data: Mapping[str, Any], *, source: str) -> EnvironmentSettings:
    """Validate an already-parsed mapping; ``source`` names it in errors (usually the file)."""
    try:
        return EnvironmentSettings.model_validate(dict(data))
    except ValidationError as exc:
        raise SettingsError(format_validation_error(source, EnvironmentSettings, exc)) from None


def load_settings(name: str, *, config_dir: Path = CONFIG_DIR) -> EnvironmentSettings:
    """Load and validate ``config/<name>.yaml``."""
    path = config_dir / f"{name}.yaml"
    source = _display_path(path)
    if not path.is_file():
        available = sorted(
            p.stem for p in config_dir.glob("*.yaml") if p.stem != "release_calendar"
        )
        raise SettingsError(
            f"{source}: no such environment file; available environments: {', '.join(available)}"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SettingsError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: must be a mapping of settings, got {type(data).__name__}")
    settings = parse_settings(data, source=source)
    if settings.name != name:
        raise SettingsError(
            f"{source}: name: {settings.name!r} is not accepted: must equal the file name {name!r}"
        )
    return settings


def load_environments(
    names: Sequence[str] = DEFAULT_ENVIRONMENTS, *, config_dir: Path = CONFIG_DIR
) -> list[EnvironmentSettings]:
    """Load several environments, reporting every broken file at once."""
    loaded: list[EnvironmentSettings] = []
    problems: list[str] = []
    for name in names:
        try:
            loaded.append(load_settings(name, config_dir=config_dir))
        except SettingsError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingsError("\n".join(problems))
    stage_names = [s.stage_name for s in loaded]
    duplicates = sorted({n for n in stage_names if stage_names.count(n) > 1})
    if duplicates:
        raise SettingsError(f"stage_name {duplicates[0]!r} is used by more than one environment")
    return loaded


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
