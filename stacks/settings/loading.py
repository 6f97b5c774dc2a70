"""Reading ``config/<env>.yaml``: YAML, validation, the planners, and errors a person can read.

``config/<env>.yaml`` is read here and nowhere else. Unknown keys are errors (a typo must not
silently fall back to a default), and a bad value stops synth with :class:`SettingsError`, whose
message names the file, the field path, the value and what is accepted. Once the settings have
validated, the environment's plans are made (:func:`stacks.settings.plans.plan_environment`):
a section its planner refuses is reported like any other bad value of that section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from stacks.settings.base import CONFIG_DIR, REPO_ROOT
from stacks.settings.environment import EnvironmentSettings
from stacks.settings.plans import (
    PLANNED_SECTIONS,
    EnvironmentPlans,
    PlanRefused,
    PlansRefused,
    plan_environment,
    refusal_of,
)

DEFAULT_ENVIRONMENTS: tuple[str, ...] = ("dev", "prod")
"""Environments ``app.py`` synthesizes when none is chosen (the embedded default)."""


class SettingsError(ValueError):
    """A configuration file is missing, unreadable or invalid. The message is for a person."""


@dataclass(frozen=True)
class Environment:
    """One environment as the stacks receive it: its validated settings and the plans made from
    them once, when they loaded."""

    settings: EnvironmentSettings
    plans: EnvironmentPlans


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
    if isinstance(error["input"], dict | list):  # a whole section: its repr would drown the message
        return f"{source}: {location}: {message}"
    return f"{source}: {location}: {error['input']!r} is not accepted: {message}"


def format_validation_error(source: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One line per problem: file, field path, value, what is accepted."""
    return "\n".join(_format_error(source, model, error) for error in exc.errors())


def _format_errors(source: str, errors: Sequence[ErrorDetails]) -> str:
    return "\n".join(_format_error(source, EnvironmentSettings, error) for error in errors)


def _refusal_error(refused: PlanRefused, data: Mapping[str, Any]) -> ErrorDetails:
    """A planner's refusal as the error a validator of its section would have raised."""
    return ErrorDetails(type="value_error", loc=(refused.section,),
                        msg=f"Value error, {refused}", input=data.get(refused.section))


def _with_refusals(data: Mapping[str, Any], errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """``errors`` plus the refusal of each planned section that validated, in field order.

    A refused section is an invalid field, so the environment-wide checks (which run only once
    every field is valid) are dropped from the list then.
    """
    failed = {error["loc"][0] for error in errors if error["loc"]}
    refusals: list[PlanRefused] = []
    for section, model in PLANNED_SECTIONS.items():
        if section in failed or not isinstance(data.get(section), dict):
            continue
        try:
            refused = refusal_of(section, model.model_validate(data[section]))
        except ValidationError:
            continue
        if refused is not None:
            refusals.append(refused)
    if not refusals:
        return errors
    order = {name: index for index, name in enumerate(EnvironmentSettings.model_fields)}
    merged = [error for error in errors if error["loc"]]
    merged += [_refusal_error(refused, data) for refused in refusals]
    return sorted(merged, key=lambda error: order.get(str(error["loc"][0]), len(order)))


def parse_environment(data: Mapping[str, Any], *, source: str) -> Environment:
    """Validate an already-parsed mapping and make its plans; ``source`` names it in errors
    (usually the file)."""
    try:
        settings = EnvironmentSettings.model_validate(dict(data))
    except ValidationError as exc:
        errors = _with_refusals(data, list(exc.errors()))
        raise SettingsError(_format_errors(source, errors)) from None
    try:
        plans = plan_environment(settings)
    except PlansRefused as refused:
        errors = [_refusal_error(refusal, data) for refusal in refused.refusals]
        raise SettingsError(_format_errors(source, errors)) from None
    return Environment(settings, plans)


def parse_settings(data: Mapping[str, Any], *, source: str) -> EnvironmentSettings:
    """Validate an already-parsed mapping (its plans are made, to check them, and dropped)."""
    return parse_environment(data, source=source).settings


def load_environment(name: str, *, config_dir: Path = CONFIG_DIR) -> Environment:
    """Load and validate ``config/<name>.yaml`` and make its plans."""
    path = config_dir / f"{name}.yaml"
    source = _display_path(path)
    if not path.is_file():
        available = available_environments(config_dir)
        raise SettingsError(
            f"{source}: no such environment file; available environments: {', '.join(available)}"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SettingsError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: must be a mapping of settings, got {type(data).__name__}")
    environment = parse_environment(data, source=source)
    if environment.settings.name != name:
        raise SettingsError(
            f"{source}: name: {environment.settings.name!r} is not accepted: must equal the file "
            f"name {name!r}"
        )
    return environment


def load_settings(name: str, *, config_dir: Path = CONFIG_DIR) -> EnvironmentSettings:
    """Load and validate ``config/<name>.yaml`` (its plans are made, to check them, and
    dropped: the stacks get them from :func:`load_environment`)."""
    return load_environment(name, config_dir=config_dir).settings


def available_environments(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The environments ``config_dir`` defines: every ``<name>.yaml`` but the release calendar."""
    return sorted(p.stem for p in config_dir.glob("*.yaml") if p.stem != "release_calendar")


def load_planned_environments(
    names: Sequence[str] = DEFAULT_ENVIRONMENTS, *, config_dir: Path = CONFIG_DIR
) -> list[Environment]:
    """Load several environments with their plans, reporting every broken file at once."""
    loaded: list[Environment] = []
    problems: list[str] = []
    for name in names:
        try:
            loaded.append(load_environment(name, config_dir=config_dir))
        except SettingsError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingsError("\n".join(problems))
    stage_names = [e.settings.stage_name for e in loaded]
    duplicates = sorted({n for n in stage_names if stage_names.count(n) > 1})
    if duplicates:
        raise SettingsError(f"stage_name {duplicates[0]!r} is used by more than one environment")
    return loaded


def load_environments(
    names: Sequence[str] = DEFAULT_ENVIRONMENTS, *, config_dir: Path = CONFIG_DIR
) -> list[EnvironmentSettings]:
    """Load several environments' settings, reporting every broken file at once."""
    return [e.settings for e in load_planned_environments(names, config_dir=config_dir)]


def _display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it (how errors name a file)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
