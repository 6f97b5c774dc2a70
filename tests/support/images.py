"""What ``docker build`` sees of this repository, read without a Docker engine: a Dockerfile's
``COPY`` sources and what its ``.dockerignore`` keeps of the repository root as build context.

One reading of Docker's rules for every image test (the LLM, intent and quantize images):
continuation lines joined, comments dropped, ``--from=`` stages not context; in the ignore file
the last matching pattern wins and a pattern on a folder covers what is under it (Go's
``filepath.Match`` plus ``**``, https://docs.docker.com/build/concepts/context/#dockerignore-files).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path, PurePosixPath

REPO_ROOT = Path(__file__).resolve().parents[2]


def copy_sources(dockerfile: Path) -> list[str]:
    """The build-context sources of every ``COPY`` line, without a trailing slash."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    sources: list[str] = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        if any(word.startswith("--from") for word in words[1:]):
            continue
        arguments = [word for word in words[1:] if not word.startswith("--")]
        sources.extend(source.rstrip("/") for source in arguments[:-1])
    return sources


def ignore_patterns(dockerignore: Path) -> list[str]:
    """The ignore file's patterns, in order (blank lines and comments dropped)."""
    lines = (line.strip() for line in dockerignore.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@cache
def _pattern(text: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regex on a relative path."""
    out, index = [], 0
    while index < len(text):
        if text.startswith("**", index):
            out.append(".*")
            index += 2
            if text.startswith("/", index):
                out[-1] = "(?:.*/)?"
                index += 1
            continue
        char = text[index]
        out.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
        index += 1
    return re.compile("".join(out))


def dockerignore_excludes(path: str, patterns: Sequence[str]) -> bool:
    """Whether the context leaves ``path`` out: the last pattern matching it or one of its
    folders decides (``!pattern`` takes it back in)."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        if any(_pattern(raw.lstrip("!").strip("/")).fullmatch(p) for p in prefixes):
            excluded = not negated
    return excluded


@cache
def repo_files() -> tuple[str, ...]:
    """The files a build context of the repository root can hold (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout.split("\n")
    return tuple(sorted(path for path in listed if path and (REPO_ROOT / path).is_file()))


def context_files(dockerignore: Path) -> list[str]:
    """The repository files ``docker build`` sends with this ignore file."""
    patterns = ignore_patterns(dockerignore)
    return [path for path in repo_files() if not dockerignore_excludes(path, patterns)]


def image_files(dockerfile: Path) -> list[str]:
    """What an image copies from its build context (its Dockerfile's ``.dockerignore`` beside)."""
    context = context_files(dockerfile.with_name("Dockerfile.dockerignore"))
    sources = copy_sources(dockerfile)
    return [path for path in context
            if any(path == source or path.startswith(f"{source}/") for source in sources)]
