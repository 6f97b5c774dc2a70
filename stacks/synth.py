"""Synthesize the app, turning configuration errors and nag findings into short messages."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import aws_cdk as cdk

from release_calendar import CalendarError
from stacks.nag import add_nag_checks, summarize_validation_report
from stacks.settings import (
    CONFIG_DIR,
    DEFAULT_ENVIRONMENTS,
    SettingsError,
    load_planned_environments,
)
from stacks.stage import MangaAssistStage

CONFIG_ERRORS: tuple[type[Exception], ...] = (SettingsError, CalendarError)
"""Errors that mean "the configuration cannot be deployed": reported in one message, no trace."""

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def feature_flags() -> dict[str, Any]:
    """The feature flags in cdk.json (the recommended set for a new app at this CDK version).

    The CLI passes them to the app itself; tests and the synth-diff script run the app without
    the CLI, so the app applies them too and every path synthesizes the same templates.
    """
    return dict(json.loads(CDK_JSON.read_text(encoding="utf-8")).get("context", {}))


def environment_names(app: cdk.App) -> list[str]:
    """Environments chosen with ``-c environments=dev,prod``; default: DEFAULT_ENVIRONMENTS."""
    chosen = app.node.try_get_context("environments")
    if not chosen:
        return list(DEFAULT_ENVIRONMENTS)
    if isinstance(chosen, str):
        return [name.strip() for name in chosen.split(",") if name.strip()]
    return [str(name) for name in chosen]


def synthesize(
    environments: Sequence[str] | None = None,
    *,
    outdir: str | None = None,
    stderr: TextIO = sys.stderr,
    context: Mapping[str, Any] | None = None,
) -> int:
    """Build and synthesize the app; return a process exit code.

    ``context`` adds context values, as cdk.context.json gives the CLI's synth its lookups.
    """
    app = cdk.App(outdir=outdir, context={**feature_flags(), **(context or {})})
    names = list(environments) if environments else environment_names(app)
    config_dir = Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))
    try:
        for environment in load_planned_environments(names, config_dir=config_dir):
            MangaAssistStage(app, settings=environment.settings, plans=environment.plans)
    except CONFIG_ERRORS as exc:
        print(f"error: {exc}", file=stderr)
        return 1
    add_nag_checks(app)
    try:
        app.synth()
    except RuntimeError as exc:
        if "ValidationFailed" not in str(exc):
            raise
        print(f"error: {summarize_validation_report(app.outdir)}", file=stderr)
        return 1
    return 0
