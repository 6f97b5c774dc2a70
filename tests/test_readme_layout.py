"""The README's layout table matches the tree: every top-level folder the repository tracks has a
row, and every row names something that exists (issue 16: "the README's layout table matches the
tree")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
UNLISTED = frozenset({".ci"})
""".ci/ holds only CI's entry point, which runs the README's test command."""


def layout_rows() -> list[str]:
    readme = REPO_ROOT.joinpath("README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1]
    block = re.search(r"```text\n(.*?)\n```", section, re.DOTALL)
    assert block is not None, "the Layout section lost its table"
    return [line.split()[0] for line in block.group(1).splitlines()
            if line.strip() and not line.startswith(" ")]


def tracked_top_level() -> tuple[set[str], set[str]]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, check=True, capture_output=True,
                            text=True).stdout.splitlines()
    folders = {name.split("/", 1)[0] + "/" for name in listed if "/" in name}
    files = {name for name in listed if "/" not in name}
    return folders, files


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
