"""The README's layout matches the tree and keeps its audiences apart.

The "## Layout" section has one block per audience: product, operator commands, CI and checks,
test support (and documentation). Checked here: every top-level folder the repository tracks has
a row and every row names something that exists (issue 16); each folder sits in its audience's
block; every command in ``tools/`` is run by a make target that its row names, and every other
module there serves a command; nothing invokes a package's module as a script (``python
tools/x.py``); product code imports nothing from ``tools/``, ``checks/``, ``tests/`` or
``benchmarks/``, and ``tools/`` nothing from ``checks/`` (issue 25) nor from the containers'
packages (``gateway``, ``intent_server``): what an operator command shares with a container lives
in a top-level package both import, or the command belongs to the container (issue 41).
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = REPO_ROOT / "tools"
UNLISTED = frozenset({".ci"})
""".ci/ holds only CI's entry point, which runs the README's test command."""

BLOCKS = ("Product", "Operator commands", "CI and checks", "Test support", "Documentation")
"""The layout's blocks, in order: the bold label that opens each."""

ROOTS = {"Operator commands": ("tools/",), "CI and checks": ("checks/", ".github/"),
         "Test support": ("tests/", "benchmarks/"), "Documentation": ("docs/",)}
"""Where each non-product block's rows live; the product block is the rest."""

NOT_FOR_PRODUCT = frozenset({"tools", "checks", "tests", "benchmarks"})
"""Top-level packages product code must not import: operators', CI's, the tests'."""
CONTAINER_PACKAGES = frozenset({"gateway", "intent_server"})
"""The containers' own packages (containers/llm/gateway, containers/intent/intent_server)."""


def layout_blocks() -> dict[str, list[str]]:
    """Bold label → the rows (first word of each unindented line) of the text block below it."""
    readme = REPO_ROOT.joinpath("README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    blocks = {}
    for match in re.finditer(r"^\*\*(?P<label>[^*]+)\*\*[^\n]*\n(?:[^\n]+\n)*?\n```text\n"
                             r"(?P<body>.*?)\n```", section, re.DOTALL | re.MULTILINE):
        blocks[match["label"]] = [line.split()[0] for line in match["body"].splitlines()
                                  if line.strip() and not line.startswith(" ")]
    return blocks


def layout_rows() -> list[str]:
    return [row for rows in layout_blocks().values() for row in rows]


def row_text(row: str) -> str:
    """The row's whole text, continuation lines included, in one line."""
    readme = REPO_ROOT.joinpath("README.md").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(row)} (.*(?:\n {{10,}}.*)*)", readme, re.MULTILINE)
    assert match is not None, f"no layout row for {row}"
    return " ".join(match[1].split())


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, check=True, capture_output=True,
                          text=True).stdout.splitlines()


def tracked_top_level() -> tuple[set[str], set[str]]:
    listed = tracked_files()
    folders = {name.split("/", 1)[0] + "/" for name in listed if "/" in name}
    files = {name for name in listed if "/" not in name}
    return folders, files


def test_the_layout_has_one_block_per_audience() -> None:
    assert tuple(layout_blocks()) == BLOCKS


def test_every_top_level_folder_has_a_row() -> None:
    rows = set(layout_rows())
    folders, _ = tracked_top_level()
    assert len(folders) > 15, "not vacuous"
    missing = sorted(folder for folder in folders
                     if folder.rstrip("/") not in UNLISTED
                     and not any(row.startswith(folder) for row in rows))
    assert missing == [], f"README's layout table has no row for {missing}"


def test_every_row_names_something_in_the_tree() -> None:
    rows = layout_rows()
    assert len(rows) > 20, "not vacuous"
    absent = [row for row in rows if not (REPO_ROOT / row).exists()]
    assert absent == [], f"README's layout table names {absent}, which the tree does not have"


def test_each_folder_sits_in_its_audience_block() -> None:
    blocks = layout_blocks()
    for label, roots in ROOTS.items():
        strays = [row for row in blocks[label] if not row.startswith(roots)]
        assert strays == [], f"{label}: {strays} belong to another block"
    every_root = tuple(root for roots in ROOTS.values() for root in roots)
    strays = [row for row in blocks["Product"] if row.startswith(every_root)]
    assert strays == [], f"Product lists {strays}, which is not product code"


def tools_entries() -> list[Path]:
    """tools/'s modules, packages and scripts (caches and data files left out)."""
    return sorted(path for path in TOOLS.iterdir()
                  if path.suffix in (".py", ".sh") or (path / "__init__.py").exists())


def is_command(path: Path) -> bool:
    """A script, a package with __main__.py, or a module with a __main__ guard."""
    if path.suffix == ".sh" or (path / "__main__.py").exists():
        return True
    return path.suffix == ".py" and 'if __name__ == "__main__":' in path.read_text("utf-8")


def make_recipes() -> dict[str, str]:
    """Make target → its recipe, with the Makefile's own variables (PREFLIGHT, ...) expanded."""
    text = REPO_ROOT.joinpath("Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+) *[?:]?= *(.*)$", text, re.MULTILINE))
    recipes: dict[str, str] = {}
    for match in re.finditer(r"^([a-z][a-z-]*):.*\n((?:\t.*\n)*)", text, re.MULTILINE):
        recipe = match[2]
        for _ in range(3):
            recipe = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m[1], m[0]), recipe)
        recipes[match[1]] = recipe
    return recipes


def invocation(path: Path) -> str:
    """How a make recipe runs the command: its path for a script, `-m tools.<name>` else."""
    if path.suffix == ".sh":
        return re.escape(f"tools/{path.name}")
    return rf"-m tools\.{path.stem}(?![\w.])"


def test_every_operator_command_is_a_make_target_its_row_names() -> None:
    recipes = make_recipes()
    commands = [path for path in tools_entries() if is_command(path)]
    assert len(commands) > 10, "not vacuous"
    for path in commands:
        targets = sorted(target for target, recipe in recipes.items()
                         if re.search(invocation(path), recipe))
        assert targets, f"tools/{path.name}: no make target runs it"
        row = f"tools/{path.name}" + ("/" if path.is_dir() else "")
        named = set(re.findall(r"make ([a-z][a-z-]*)", row_text(row)))
        assert named & set(targets), (f"{row}: its layout row names make {sorted(named)}, "
                                      f"but {targets} run it")


PROGRAM_RUNNERS = ("Makefile", ".github/workflows/deliver.yml",
                   ".github/workflows/deploy-environment.yml", ".github/workflows/pull-request.yml",
                   "containers/quantize/quantize-job", "containers/llm/serve",
                   "containers/intent/serve")
"""Where a program of this repository may be started: a make target, a workflow, or an image's
entry script (the job and the servers, which SageMaker starts)."""
NOT_PROGRAMS = ("tests/", "benchmarks/", "app.py")
"""The tests and the benchmarks run by pytest and make bench; app.py by the CDK CLI (cdk.json)."""


def programs() -> list[str]:
    """Dotted names of the tracked modules that run as programs: a ``__main__.py`` package or a
    ``if __name__ == "__main__"`` guard (tests, benchmarks and the CDK app left out)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    found = []
    for path in listed:
        if path.startswith(NOT_PROGRAMS) or not (REPO_ROOT / path).is_file():
            continue
        if path.endswith("/__main__.py"):
            found.append(path.removesuffix("/__main__.py").replace("/", "."))
        elif '__name__ == "__main__"' in (REPO_ROOT / path).read_text(encoding="utf-8"):
            found.append(path.removesuffix(".py").replace("/", "."))
    return sorted(found)


def test_every_program_is_started_by_make_a_workflow_or_an_image() -> None:
    """Each command is run one way and from one place: ``python -m <module>`` (or its import by
    an image's entry script), never a module a person must know to call by hand."""
    runners = "\n".join([*make_recipes().values(),
                         *(REPO_ROOT.joinpath(path).read_text(encoding="utf-8")
                           for path in PROGRAM_RUNNERS[1:])])
    found = programs()
    assert len(found) > 20, "not vacuous"
    unstarted = []
    for module in found:
        image_import = module.split(".", 2)[-1] if module.startswith("containers.") else None
        if re.search(rf"-m {re.escape(module)}(?![\w.])", runners):
            continue
        if image_import and re.search(rf"from {re.escape(image_import.rsplit('.', 1)[0])}\b",
                                      runners):
            continue
        unstarted.append(module)
    assert unstarted == [], (f"{unstarted} run as programs but no make target, workflow or image "
                             "entry script starts them")


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute import of a Python file, dotted."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def python_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix == ".py" else []
    return sorted(file for file in path.rglob("*.py") if "__pycache__" not in file.parts)


def test_every_other_module_of_tools_serves_a_command() -> None:
    entries = tools_entries()
    used = {module for path in entries if is_command(path) for file in python_files(path)
            for module in imported_modules(file)}
    # A script's Python steps (`python -c 'from tools.x import main; ...'`) import them too.
    used |= {f"tools.{name}" for path in entries if path.suffix == ".sh"
             for name in re.findall(r"from tools\.(\w+) import", path.read_text("utf-8"))}
    helpers = [path for path in entries if not is_command(path)]
    orphans = [path.name for path in helpers if f"tools.{path.stem}" not in used]
    assert orphans == [], f"tools/ holds {orphans}, which no operator command imports"


def test_every_entry_of_tools_has_a_row() -> None:
    rows = set(layout_blocks()["Operator commands"])
    missing = [path.name for path in tools_entries()
               if f"tools/{path.name}" + ("/" if path.is_dir() else "") not in rows]
    assert missing == [], f"README's operator block has no row for {missing}"


SCRIPT_RUN = re.compile(r"(?:\bpython3?|\$\(PY\)|/bin/python)\s+([\w.-]+)/[\w/]*\w\.py\b")
"""`python <folder>/.../x.py`: a module run by its path."""


def test_no_module_of_a_package_runs_as_a_script() -> None:
    packages = {"tools", "checks"} | {path.parent.name for path in REPO_ROOT.glob("*/__init__.py")}
    documents = [REPO_ROOT / "Makefile", REPO_ROOT / "README.md",
                 *REPO_ROOT.glob(".github/workflows/*.yml"), *REPO_ROOT.glob("docs/**/*.md")]
    found = [f"{path.relative_to(REPO_ROOT)}: {match[0]}" for path in documents
             for match in SCRIPT_RUN.finditer(path.read_text(encoding="utf-8"))
             if match[1] in packages]
    assert found == [], f"run these as `python -m <package>.<module>`: {found}"


def product_paths() -> list[Path]:
    return [REPO_ROOT / row for row in layout_blocks()["Product"]]


@pytest.mark.parametrize(("forbidden", "importers"), [
    (NOT_FOR_PRODUCT, "product"),
    (frozenset({"checks"}) | CONTAINER_PACKAGES, "tools"),
])
def test_code_imports_only_its_own_audience_or_below(forbidden: frozenset[str],
                                                     importers: str) -> None:
    roots = product_paths() if importers == "product" else [TOOLS]
    files = [file for root in roots for file in python_files(root)]
    assert len(files) > 20, "not vacuous"
    found = sorted({f"{file.relative_to(REPO_ROOT)} imports {module}" for file in files
                    for module in imported_modules(file)
                    if module.split(".", 1)[0] in forbidden})
    assert found == [], f"{importers} code must not import {sorted(forbidden)}: {found}"


def test_no_operator_script_reaches_into_a_container_package() -> None:
    """tools/'s shell scripts neither import nor ``-m``-run a container's package: they start
    the container's own entry script (``containers/llm/serve``) instead."""
    scripts = sorted(TOOLS.glob("*.sh"))
    assert scripts, "not vacuous"
    pattern = re.compile(rf"(?:from|import|-m)\s+(?:{'|'.join(CONTAINER_PACKAGES)})\b")
    found = [f"{path.name}: {match[0]}" for path in scripts
             for match in pattern.finditer(path.read_text(encoding="utf-8"))]
    assert found == [], f"tools/ scripts reach into a container package: {found}"
