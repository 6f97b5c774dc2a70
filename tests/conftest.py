"""Fixtures shared by the whole suite. The CDK app is synthesized once per test session."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import budget_guard
from tests.support.run_shared import exclusive, shared_tmp

if TYPE_CHECKING:
    from capacity_model import LlmCapacity
    from stacks.settings import Environment

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    budget_guard.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(budget_guard.BudgetGuard(config), "budget-guard")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(budget_guard.XdistScheduling(), "module-scheduling")


@dataclass(frozen=True)
class SynthesizedApp:
    """The cloud assembly of every environment, read back from disk."""

    outdir: Path
    templates: dict[str, dict]  # display name ("Dev/Foundation") -> template
    template_paths: dict[str, Path]

    def template(self, stack: str) -> dict:
        try:
            return self.templates[stack]
        except KeyError:
            raise KeyError(f"no stack {stack!r}; synthesized: {sorted(self.templates)}") from None


def read_assembly(outdir: Path) -> SynthesizedApp:
    """Collect every stack template of a cloud assembly, nested stage assemblies included."""
    templates: dict[str, dict] = {}
    paths: dict[str, Path] = {}

    def walk(directory: Path) -> None:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        for artifact in manifest.get("artifacts", {}).values():
            props = artifact.get("properties", {})
            if artifact.get("type") == "aws:cloudformation:stack":
                path = directory / props["templateFile"]
                paths[artifact["displayName"]] = path
                templates[artifact["displayName"]] = json.loads(path.read_text(encoding="utf-8"))
            elif artifact.get("type") == "cdk:cloud-assembly":
                walk(directory / props["directoryName"])

    walk(outdir)
    return SynthesizedApp(outdir=outdir, templates=templates, template_paths=paths)


@pytest.fixture(scope="session")
def prod_environment() -> Environment:
    """config/prod.yaml loaded once per session: its settings and the plans made from them."""
    from stacks.settings import load_environment

    return load_environment("prod")


@pytest.fixture(scope="session")
def prod_capacity(prod_environment: Environment) -> LlmCapacity:
    """Production's capacity plan as config/prod.yaml configures it (made when it loaded)."""
    return prod_environment.plans.llm_capacity


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedApp:
    """Synthesize dev and prod from the embedded default configuration, in process, once per
    run: the first xdist worker to need it synthesizes, the other reads the same assembly."""
    from stacks.synth import synthesize

    root = shared_tmp(tmp_path_factory)
    outdir = root / "cdk.out.shared"
    with exclusive(root / "cdk.out.shared.lock"):
        if not (outdir / ".complete").is_file():
            exit_code = synthesize(["dev", "prod"], outdir=str(outdir))
            assert exit_code == 0, "the default configuration must synthesize (see stderr)"
            (outdir / ".complete").touch()
    return read_assembly(outdir)
