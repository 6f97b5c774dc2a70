"""The README is a short entry point that reaches everything (issue 33).

* it has at most 250 lines;
* its table "Where to go for your task" reaches every guide under docs/ (a top-level guide by a
  link of its own, a runbook through the links of the guides it reaches) and names every
  documented make target once, in a row whose guides show that target;
* every command in its shell code blocks is a make target or a file of the repository;
* its Mermaid diagram parses with Mermaid's own parser (checks/mermaid.mjs) and draws what the
  settings deploy: the two stacks of each Stage, each endpoint's instance type and instance range
  per environment.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from stacks.settings import REPO_ROOT, load_settings
from tools.make_help import targets

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
TABLE_HEADING = "## Where to go for your task"
MAX_LINES = 250
SHELL_FENCES = ("bash", "sh", "shell", "console")
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)\s]*)?\)")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def table_rows(text: str) -> list[str]:
    """The body rows of the first Markdown table under the table heading."""
    section = text.split(f"\n{TABLE_HEADING}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, "the table has no rows"
    return rows[2:]


def links(text: str, base: Path) -> set[Path]:
    """The Markdown files ``text`` links to, resolved against ``base`` (its folder)."""
    found = set()
    for match in LINK.finditer(text):
        target = match["target"]
        if target.endswith(".md") and "://" not in target:
            found.add((base / target).resolve())
    return found


def row_guides(row: str) -> set[Path]:
    return links(row, REPO_ROOT)


def row_targets(row: str) -> list[str]:
    return re.findall(r"`make ([a-z][a-z-]*)`", row)


def guides() -> set[Path]:
    return {path.resolve() for path in DOCS.rglob("*.md")}


def reachable(start: set[Path]) -> set[Path]:
    """Every guide reached from ``start`` by following links between guides."""
    seen: set[Path] = set()
    todo = [path for path in start if path.is_file()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(linked for linked in links(path.read_text(encoding="utf-8"), path.parent)
                    if linked.is_file() and linked.is_relative_to(DOCS.resolve()))
    return seen


def documented_targets() -> list[str]:
    return [target.name for target in targets((REPO_ROOT / "Makefile").read_text("utf-8"))]


def test_the_readme_is_short() -> None:
    lines = readme().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, at most {MAX_LINES}"


def test_every_top_level_guide_has_a_link_in_the_table() -> None:
    linked = set().union(*(row_guides(row) for row in table_rows(readme())))
    top_level = {path.resolve() for path in DOCS.glob("*.md")} | {DOCS.resolve() / "runbooks"
                                                                  / "README.md"}
    assert len(top_level) > 8, "not vacuous"
    missing = sorted(str(path.relative_to(REPO_ROOT)) for path in top_level - linked)
    assert missing == [], f"the README's table does not link {missing}"
    absent = sorted(str(path) for path in linked if not path.is_file())
    assert absent == [], f"the README's table links guides that do not exist: {absent}"


def test_every_guide_is_reachable_from_the_table() -> None:
    start = set().union(*(row_guides(row) for row in table_rows(readme())))
    unreached = sorted(str(path.relative_to(REPO_ROOT)) for path in guides() - reachable(start))
    assert unreached == [], f"no link from the README's table leads to {unreached}"


def test_every_make_target_is_in_one_row() -> None:
    named = [target for row in table_rows(readme()) for target in row_targets(row)]
    documented = documented_targets()
    assert len(documented) > 30, "not vacuous"
    assert sorted(named) == sorted(set(named)), "a target is in two rows"
    assert sorted(set(documented) - set(named)) == [], "targets the table does not name"
    assert sorted(set(named) - set(documented)) == [], "the table names targets make lacks"


def test_each_rows_guides_show_its_targets() -> None:
    for row in table_rows(readme()):
        texts = [path.read_text(encoding="utf-8") for path in row_guides(row)]
        unshown = [target for target in row_targets(row)
                   if not any(re.search(rf"\bmake {target}\b", text) for text in texts)]
        assert unshown == [], f"no guide of the row {row[:40]!r}... shows make {unshown}"


def shell_commands(text: str) -> list[list[str]]:
    """The commands of the shell code blocks: continuations joined, comments dropped."""
    fences = "|".join(SHELL_FENCES)
    commands = []
    for block in re.findall(rf"^```(?:{fences})\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def command_problems(commands: list[list[str]], make_targets: set[str],
                     files: set[str]) -> list[str]:
    """Each command that is neither `make <target>` nor a file of the repository."""
    problems = []
    for words in commands:
        if words[0] == "make":
            named = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
            unknown = [word for word in named if word not in make_targets]
            if not named or unknown:
                problems.append(" ".join(words))
        elif words[0].removeprefix("./") not in files:
            problems.append(" ".join(words))
    return problems


def tracked_files() -> set[str]:
    return set(subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, check=True, capture_output=True,
                              text=True).stdout.splitlines())


def test_every_readme_command_is_a_make_target_or_a_file() -> None:
    commands = shell_commands(readme())
    assert len(commands) >= 6, "not vacuous"
    problems = command_problems(commands, set(documented_targets()), tracked_files())
    assert problems == [], f"README commands that are no make target or file: {problems}"


def test_the_command_check_refuses_what_is_neither() -> None:
    text = ("```bash\nmake synth ENV=prod\nnpx cdk bootstrap aws://1/r  # x\nmake nope\n"
            "tools/gpu_smoke.sh\n```\n```text\nnpx anything  # output, not a command\n```\n")
    problems = command_problems(shell_commands(text), set(documented_targets()), tracked_files())
    assert problems == ["npx cdk bootstrap aws://1/r", "make nope"]


def mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)^```", text, re.S | re.M)


def run_mermaid_check(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["node", "checks/mermaid.mjs", *map(str, files)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_readme_diagram_parses() -> None:
    assert len(mermaid_blocks(readme())) == 1
    result = run_mermaid_check(README.relative_to(REPO_ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^README\.md:\d+: flowchart", result.stdout, re.M), result.stdout
    assert "mermaid: 1 diagram(s) in 1 file(s), 0 not parsed" in result.stdout


def test_a_broken_diagram_fails_the_check(tmp_path: Path) -> None:
    (good, *_) = mermaid_blocks(readme())
    broken = tmp_path / "broken.md"
    broken.write_text(f"# x\n\n```mermaid\n{good}```\n\n```mermaid\n"
                      f"{good.replace(' --> llm', ' --> [llm', 1)}```\n", encoding="utf-8")
    result = run_mermaid_check(broken)
    assert result.returncode == 1, result.stdout + result.stderr
    first_line = 7 + good.count("\n")  # of the second diagram: after "# x", its fences, a blank
    assert f"{broken}:{first_line}: does not parse: Parse error" in result.stdout, result.stdout
    assert "2 diagram(s) in 1 file(s), 1 not parsed" in result.stdout


def node_label(diagram: str, node: str) -> str:
    match = re.search(rf"^\s*{node}\[\"(?P<label>[^\"]*)\"\]", diagram, re.M)
    assert match is not None, f"the diagram has no node {node}"
    return match["label"]


@pytest.mark.parametrize("endpoint", ["llm", "intent"])
def test_the_diagram_draws_what_the_settings_deploy(endpoint: str) -> None:
    (diagram,) = mermaid_blocks(readme())
    for stack in ("Foundation", "Serving"):
        assert f'["{stack} stack"]' in diagram
    dev, prod = load_settings("dev"), load_settings("prod")
    label = node_label(diagram, endpoint)
    dev_endpoint, prod_endpoint = getattr(dev, endpoint), getattr(prod, endpoint)
    assert dev_endpoint.instance_type == prod_endpoint.instance_type
    assert label.startswith(f"SageMaker endpoint ...-{endpoint}<br/>{dev_endpoint.instance_type}:")
    ranges = (f"Dev {dev_endpoint.scaling.min_capacity}-{dev_endpoint.scaling.max_capacity}, "
              f"Prod {prod_endpoint.scaling.min_capacity}-{prod_endpoint.scaling.max_capacity} "
              "instances")
    assert label.endswith(ranges), (label, ranges)
