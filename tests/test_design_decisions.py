"""docs/design-decisions.md is where code and docs send a reader for a fact or number they rely
on: every `docs/design-decisions.md#<anchor>` cited anywhere must exist, every entry must say where
its fact comes from, and no file outside docs/ may cite a source a reader cannot open (the
requirement documents or design notes that are not in the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "design-decisions.md"
ANCHOR = re.compile(r'<a id="([a-z0-9-]+)"></a>')
CITATION = re.compile(r"design-decisions\.md#([A-Za-z0-9_-]+)")
UNOPENABLE = "FACTS[.]md\\|seed[ ]00"
"""The issue's `git grep` for citations of documents that are not in the repository (the brackets
keep this line from matching itself)."""

def anchors() -> list[str]:
    return ANCHOR.findall(PAGE.read_text(encoding="utf-8"))


def repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    return [REPO_ROOT / name for name in listed.stdout.splitlines()
            if (REPO_ROOT / name).is_file()]


def test_anchors_are_unique() -> None:
    found = anchors()
    assert len(found) >= 30, "the page lost its entries"
    assert sorted(found) == sorted(set(found))


def test_every_entry_says_where_its_fact_comes_from() -> None:
    text = PAGE.read_text(encoding="utf-8")
    entries = ANCHOR.split(text)[1:]  # [anchor, body, anchor, body, ...]
    missing = [anchor for anchor, body in zip(entries[::2], entries[1::2], strict=True)
               if "Source" not in body]
    assert missing == []


def test_every_citation_names_an_existing_anchor() -> None:
    defined = set(anchors())
    cited: dict[str, set[str]] = {}
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for anchor in CITATION.findall(text):
            cited.setdefault(anchor, set()).add(str(path.relative_to(REPO_ROOT)))
    internal = re.findall(r"\]\(#([a-z0-9-]+)\)", PAGE.read_text(encoding="utf-8"))
    for anchor in internal:
        cited.setdefault(anchor, set()).add("docs/design-decisions.md")
    assert len(cited) >= 15, "not vacuous: code and docs cite the page"
    unknown = {anchor: sorted(files) for anchor, files in cited.items() if anchor not in defined}
    assert unknown == {}, f"citations of anchors the page does not define: {unknown}"


def test_no_file_outside_docs_cites_a_source_a_reader_cannot_open() -> None:
    grep = subprocess.run(["git", "grep", "-n", "--untracked", UNOPENABLE, "--", ".",
                           ":!docs/"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert grep.returncode in (0, 1), grep.stderr
    citing = grep.stdout.splitlines()
    assert citing == [], (f"{citing} cite the design notes or a requirement document: add the "
                          "fact to docs/design-decisions.md and cite its anchor instead")
