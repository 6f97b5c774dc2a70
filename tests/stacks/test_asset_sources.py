"""Every image and Lambda asset ships every first-party module its code imports, transitively.

The images and Lambda code are staged from the repository root with an allow-list of folders
(``*_SOURCES``); a shared module that starts importing another (``metrics_contract`` now reads
``request_buckets``) must travel with it everywhere, or the container or function fails at import
time in AWS, where no test runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stacks.intent_endpoint import INTENT_IMAGE_SOURCES
from stacks.llm_endpoint import LLM_IMAGE_SOURCES
from stacks.release_calendar_reconciler import LAMBDA_SOURCES as CALENDAR_SOURCES
from stacks.scaling_limits_publisher import LAMBDA_SOURCES as SCALING_LIMITS_SOURCES

REPO_ROOT = Path(__file__).resolve().parents[2]
ROOT_MODULES = {p.name if p.is_dir() else p.stem for p in REPO_ROOT.iterdir()
                if (p.is_dir() and any(p.glob("*.py"))) or p.suffix == ".py"}
"""Top-level first-party modules: an import of one of these must be staged."""

ASSETS: dict[str, tuple[str, ...]] = {
    "llm image": LLM_IMAGE_SOURCES,
    "intent image": INTENT_IMAGE_SOURCES,
    "release-calendar Lambda": CALENDAR_SOURCES,
    "scaling-limits Lambda": SCALING_LIMITS_SOURCES,
}
DOCKERFILES = {"llm image": "containers/llm/Dockerfile",
               "intent image": "containers/intent/Dockerfile"}


def staged_python(sources: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        path = REPO_ROOT / source
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else
                     [path] if path.suffix == ".py" else [])
    return files


def imported_root_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found & ROOT_MODULES


@pytest.mark.parametrize("asset", sorted(ASSETS))
def test_every_first_party_import_is_staged(asset: str) -> None:
    sources = ASSETS[asset]
    staged_roots = {source.split("/")[0] for source in sources}
    missing = sorted(f"{path.relative_to(REPO_ROOT)} imports {module}"
                     for path in staged_python(sources)
                     for module in imported_root_modules(path) - staged_roots)
    assert missing == [], f"{asset}: add the module to its *_SOURCES (and Dockerfile COPY)"


@pytest.mark.parametrize("asset", sorted(DOCKERFILES))
def test_every_staged_shared_module_is_copied_into_the_image(asset: str) -> None:
    dockerfile = (REPO_ROOT / DOCKERFILES[asset]).read_text(encoding="utf-8")
    instructions = re.sub(r"\\\n", " ", dockerfile).splitlines()  # join continued lines
    copied = {source.rstrip("/") for line in instructions if line.startswith("COPY ")
              for source in line.split()[1:-1] if not source.startswith("--")}
    shared = [s for s in ASSETS[asset] if s.split("/")[0] in ROOT_MODULES
              and not s.startswith("containers/")]
    assert [s for s in shared if s not in copied and f"{s}/" not in copied] == []


def test_the_shared_module_everyone_reads_travels_with_the_contract() -> None:
    for asset, sources in ASSETS.items():
        if "metrics_contract" in sources:
            assert "request_buckets" in sources, asset
