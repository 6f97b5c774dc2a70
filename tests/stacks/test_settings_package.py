"""The settings package: no import cycle with the planners, every public name at the package's
top, and the plans made once when the settings load, never again by the stacks."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
import yaml

import stacks.settings
from stacks.settings import (
    IntentEndpointSettings,
    LlmEndpointSettings,
    SettingsError,
    load_environment,
    parse_settings,
    plans,
)
from stacks.stage import MangaAssistStage
from stacks.synth import feature_flags

REPO_ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("capacity_model", "gpu_budget", "request_buckets")
"""Packages the settings import; none of them may import the stacks (or the operator tools)."""
PLANNERS = ("capacity_model", "gpu_budget")


def _imported_modules(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, inside a function) of every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.lineno, child.module, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def _settings_modules() -> list[str]:
    return sorted(f"stacks.settings.{info.name}"
                  for info in pkgutil.iter_modules(stacks.settings.__path__))


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_the_pure_packages_never_import_the_stacks_or_the_tools(package: str) -> None:
    offenders = [f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
                 for path in sorted((REPO_ROOT / package).rglob("*.py"))
                 for line, module, _ in _imported_modules(path)
                 if module.split(".")[0] in ("stacks", "tools")]
    assert not offenders, offenders


def test_the_settings_models_import_the_planners_at_the_top() -> None:
    """No planner import hides inside a function (where a cycle would go unnoticed)."""
    offenders = [f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
                 for path in sorted((REPO_ROOT / "stacks" / "settings").glob("*.py"))
                 for line, module, in_function in _imported_modules(path)
                 if in_function and module.split(".")[0] in PLANNERS]
    assert not offenders, offenders


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """Each settings module imported first (an import cycle fails there), then every module of
    the planners in one more interpreter."""
    planner_modules = sorted(
        f"{package}.{info.name}" for package in PLANNERS
        for info in pkgutil.iter_modules([str(REPO_ROOT / package)]))
    runs = [[module] for module in _settings_modules()] + [[*PLANNERS, *planner_modules]]
    processes = [subprocess.Popen(
        [sys.executable, "-c", "import importlib, sys\n"
         "for name in sys.argv[1:]:\n    importlib.import_module(name)", *modules],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for modules in runs]
    failures = []
    for modules, process in zip(runs, processes, strict=True):
        output, _ = process.communicate(timeout=120)
        if process.returncode:
            failures.append(f"{modules[0]}: {output.strip().splitlines()[-1]}")
    assert not failures, failures


def _top_level_names(path: Path) -> list[str]:
    """Public classes, functions and assignments at the top of ``path``."""
    names: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("_")]


def test_every_public_name_is_importable_from_the_package() -> None:
    """``from stacks.settings import X`` works for every public name of every module."""
    exported = set(stacks.settings.__all__)
    missing = [f"{path.stem}.{name}"
               for path in sorted((REPO_ROOT / "stacks" / "settings").glob("*.py"))
               if path.name != "__init__.py"
               for name in _top_level_names(path) if name not in exported]
    assert not missing, missing
    assert all(hasattr(stacks.settings, name) for name in exported)


def test_the_stacks_build_from_the_plans_made_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans are made once, when the settings load; building the stacks plans nothing."""
    calls: list[str] = []
    original = plans.plan_llm

    def counted(llm: LlmEndpointSettings) -> plans.LlmPlans:
        calls.append("llm")
        return original(llm)

    monkeypatch.setattr(plans, "plan_llm", counted)
    environment = load_environment("dev")
    assert calls == ["llm"]

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a stack planned again")

    for model, method in ((LlmEndpointSettings, "capacity_plan"),
                          (LlmEndpointSettings, "memory_plan"),
                          (IntentEndpointSettings, "fleet_plan")):
        monkeypatch.setattr(model, method, refuse)
    stage = MangaAssistStage(cdk.App(context=feature_flags()), settings=environment.settings,
                             plans=environment.plans)
    assert stage.plans is environment.plans
    assert stage.serving.llm.endpoint.capacity is environment.plans.llm_capacity


def _dev_with(**changes: dict[str, object]) -> dict[str, object]:
    data = yaml.safe_load((REPO_ROOT / "config" / "dev.yaml").read_text(encoding="utf-8"))
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return data


def test_a_refusal_is_reported_in_field_order_beside_the_other_errors() -> None:
    """A planner's refusal reads as that section's error did when a validator planned: in the
    settings' field order among the other errors, and with no environment-wide check (those
    run only once every section is valid)."""
    too_large = {"model": {**_dev_with()["llm"]["model"],  # type: ignore[index]
                           "config": "config/models/llama-3-70b-instruct.json"}}
    data = _dev_with(llm=too_large, smoke={"max_tokens": 0})
    data["region"] = "tokyo"
    lines = _error_lines(data)
    assert [line.split(": ")[1] for line in lines] == ["region", "llm", "smoke.max_tokens"]
    assert lines[1].startswith("config/dev.yaml: llm: the GPU memory budget refuses this "
                               "configuration: ")
    overlapping = _dev_with(llm=too_large, quantization={"base_model_root": "models"})
    assert [line.split(": ")[1] for line in _error_lines(overlapping)] == ["llm"]


def _error_lines(data: dict[str, object]) -> list[str]:
    with pytest.raises(SettingsError) as info:
        parse_settings(data, source="config/dev.yaml")
    return str(info.value).splitlines()
