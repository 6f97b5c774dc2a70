"""Only product code in the product images: each image's files, from its Dockerfile and its
Dockerfile.dockerignore, hold nothing only tests use.

For the LLM, intent and quantize images the test builds the file list the way ``docker build``
does with the repository root as context (``tests/support/images.py``): the repository's files (tracked and new), kept or
dropped by the Dockerfile's ``.dockerignore`` (last matching pattern wins, a pattern on a folder
covers what is under it), then taken by the ``COPY`` lines' sources. A file is test-only when it
lies under tests/, or when it is a Python module that only tests/, benchmarks/, tools/ or checks/
import. The simulated engine, the demo model and the simulator's settings are named explicitly.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import PurePosixPath

import pytest

from tests.support.images import REPO_ROOT as REPO
from tests.support.images import context_files, image_files, repo_files

IMAGES = {
    "llm": REPO / "containers/llm/Dockerfile",
    "intent": REPO / "containers/intent/Dockerfile",
    "quantize": REPO / "containers/quantize/Dockerfile",
}
IMPORT_ROOTS = ("containers/llm", "containers/intent", "")
"""Where modules are imported from (pyproject's pytest pythonpath; the images copy each package
to the same name under their own root)."""
TEST_SIDE = ("tests/", "benchmarks/", "tools/", "checks/")
SIM_SETTING = re.compile(r"\bsim_(seed|oom_at_step|oom_batched_tokens|step_time_s|token_time_s|"
                         r"startup_s|eos_probability)\b|\bSIM_[A-Z_]+\b")


def module_name(path: str) -> str | None:
    """The dotted module a repository .py file is imported as, None for other files."""
    if not path.endswith(".py"):
        return None
    for root in IMPORT_ROOTS:
        if not root or path.startswith(f"{root}/"):
            relative = path[len(root) + 1:] if root else path
            parts = list(PurePosixPath(relative[:-3]).parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    return None


def _imports(path: str) -> set[str]:
    """Every module name ``path`` imports (``from a import b`` counts a and a.b)."""
    try:
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"), filename=path)
    except (SyntaxError, UnicodeDecodeError):
        return set()
    own = (module_name(path) or "").split(".")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # A module's package is its name less one part; an __init__'s is its own name.
                depth = len(own) - node.level + path.endswith("__init__.py")
                base = ".".join([*own[:depth], *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@cache
def importers() -> dict[str, frozenset[str]]:
    """Module name → the repository files that import it."""
    found: dict[str, set[str]] = {}
    for path in repo_files():
        if path.endswith(".py"):
            for name in _imports(path):
                found.setdefault(name, set()).add(path)
    return {name: frozenset(paths) for name, paths in found.items()}


DYNAMIC_TARGET = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")
"""``"module:function"`` strings: builders imported by name (the gateway's engine registry)."""
SHELL_MODULE = re.compile(r"python3?\s+-m\s+([A-Za-z_][\w.]*)")


def _entry_modules(path: str) -> set[str]:
    """What an entry script (``serve``, ``quantize-job``) runs: its imports, or its ``-m``s."""
    text = (REPO / path).read_text(encoding="utf-8")
    if text.startswith("#!") and "python" in text.splitlines()[0]:
        return _imports(path)
    return set(SHELL_MODULE.findall(text))


def _dynamic_targets(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"), filename=path)
    return {match.group(1) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (match := DYNAMIC_TARGET.match(node.value))}


def reachable(files: Iterable[str]) -> set[str]:
    """The image's .py files its entry scripts load, following imports (and registry strings)."""
    by_module = {name: path for path in files if (name := module_name(path))}
    entries = [path for path in files if not path.endswith(".py")
               and (REPO / path).stat().st_mode & 0o111]
    pending = [name for path in entries for name in _entry_modules(path)]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        # importing a.b.c runs a/__init__ and a/b/__init__ too
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            path = by_module.get(".".join(parts[:depth]))
            if path and path not in seen:
                seen.add(path)
                pending.extend(_imports(path) | _dynamic_targets(path))
    return seen


def find_test_only(files: Iterable[str]) -> list[str]:
    """``path: why`` for each file of an image that only tests need: under tests/, or a module
    the image's entry points never load that only tests/, benchmarks/, tools/ or checks/ import,
    or one carrying a simulator setting."""
    files = list(files)
    loaded = reachable(files)
    problems = []
    for path in files:
        if path.startswith("tests/") or "/tests/" in path:
            problems.append(f"{path}: under tests/")
            continue
        name = module_name(path)
        users = {user for user in importers().get(name or "", frozenset()) if user != path}
        if name and path not in loaded and users and all(u.startswith(TEST_SIDE) for u in users):
            problems.append(f"{path}: only {', '.join(sorted(users))} import {name}")
        if path.endswith(".py") and SIM_SETTING.search((REPO / path).read_text(encoding="utf-8")):
            problems.append(f"{path}: carries a simulator setting")
    return problems


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_image_holds_no_test_only_file(image: str) -> None:
    files = image_files(IMAGES[image])
    assert files, f"{image}: no files found from its Dockerfile's COPY lines"
    problems = find_test_only(files)
    assert not problems, f"{image} image:\n" + "\n".join(problems)


def test_llm_image_has_the_gateway_and_no_simulator() -> None:
    files = set(image_files(IMAGES["llm"]))
    assert {"containers/llm/gateway/main.py", "containers/llm/gateway/engines/vllm.py",
            "serving_contract/environment.py", "containers/llm/serve"} <= files
    assert not {path for path in files
                if path.endswith(("engines/sim.py", "demo_model.py", "run_local.py"))}


def test_the_check_sees_a_test_only_module() -> None:
    # tests/support/sim_engine.py is imported by tests only: were it copied, it would be named.
    problems = find_test_only(["tests/support/sim_engine.py", "tests/support/demo_model.py"])
    assert len(problems) >= 2 and all("under tests/" in problem for problem in problems[:2])
    pattern_files = context_files(REPO / "containers/llm/Dockerfile.dockerignore")
    assert "containers/llm/gateway/app.py" in pattern_files
    assert not any(path.startswith("stacks/") for path in pattern_files)
