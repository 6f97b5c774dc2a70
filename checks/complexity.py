"""The complexity gate: no function outside tests/ above cyclomatic complexity 20 (radon).

    python -m checks.complexity                 # every Python file git knows, tests/ excepted
    python -m checks.complexity stacks tools    # only these files or folders
    # [--max 20] [--allowlist checks/complexity_allowlist.txt]

Cyclomatic complexity is radon's count (1 + each branch: if/elif, loop, except, boolean operator,
comprehension clause, ...), measured for every function, method, nested function and method of a
nested class. A function above ``--max`` fails the gate, printed as ``file:line name complexity``,
unless the allow-list names it: ``path::qualified.name complexity`` tolerates that function up to
that complexity while its owner splits it. A listed function that grows fails; one that drops to
the limit or disappears fails too, until its line is deleted — so the list only shrinks.

Exit status: 0 clean, 1 functions over the limit or stale allow-list lines, 2 a bad allow-list or
a file that does not parse.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from radon.complexity import cc_visit
from radon.visitors import Class, Function

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_COMPLEXITY = 20
"""radon's rank D starts at 21: 'more than moderate risk, a complex block'."""
ALLOWLIST = REPO_ROOT / "checks" / "complexity_allowlist.txt"
EXCLUDED_FOLDERS = frozenset({"tests", "node_modules", "cdk.out", "build", "dist",
                              "__pycache__"})
"""Never measured (tests, installed or generated code); folders starting with '.' neither."""


MeasuredT = TypeVar("MeasuredT")
"""What one gate measures per function (:class:`Measured` here, a length in function_length)."""


class AllowlistError(ValueError):
    """A line of the allow-list cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Measured:
    """One function's complexity. ``name`` is qualified: ``Class.method``, ``outer.inner``."""

    path: str
    line: int
    name: str
    complexity: int

    @property
    def key(self) -> tuple[str, str]:
        """How the allow-list names it: repo-relative path and qualified name."""
        return self.path, self.name


@dataclass(frozen=True)
class Allowance:
    """One allow-list line: the function may stay at most this complex for now."""

    path: str
    name: str
    complexity: int
    line: int


@dataclass
class Verdict:
    """What the gate found: offenders fail, stale allow-list lines fail, the rest is tolerated."""

    offenders: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    tolerated: list[Measured] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No function over the limit that the list does not cover, and no stale line."""
        return not self.offenders and not self.stale


def measure_source(source: str, path: str) -> list[Measured]:
    """Every function in ``source`` (methods, nested functions and classes included)."""
    found: list[Measured] = []

    def function(block: Function, name: str) -> None:
        found.append(Measured(path, block.lineno, name, block.complexity))
        for closure in block.closures:
            function(closure, f"{name}.{closure.name}")

    def nested_class(block: Class, name: str) -> None:
        for method in block.methods:
            function(method, f"{name}.{method.name}")
        for inner in block.inner_classes:
            nested_class(inner, f"{name}.{inner.name}")

    for block in cc_visit(source):
        if isinstance(block, Function):  # top-level functions and top-level classes' methods
            function(block, block.fullname)
        else:
            for inner in block.inner_classes:
                nested_class(inner, f"{block.name}.{inner.name}")
    return found


def read_allowlist(text: str, *, source: str, limit: int = MAX_COMPLEXITY
                   ) -> dict[tuple[str, str], Allowance]:
    """Parse ``path::name complexity`` lines ('#' starts a comment); AllowlistError names the
    line when it is malformed, repeated, or lists a complexity the limit already allows."""
    allowed: dict[tuple[str, str], Allowance] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue
        where = f"{source}:{number}"
        parts = content.split()
        if len(parts) != 2 or "::" not in parts[0] or not parts[1].isdigit():
            raise AllowlistError(f"{where}: {content!r}; accepted: 'path::qualified.name "
                                 "complexity', e.g. 'stacks/dashboard.py::Dashboard.__init__ 24'")
        path, _, name = parts[0].partition("::")
        complexity = int(parts[1])
        if complexity <= limit:
            raise AllowlistError(f"{where}: {parts[0]} at {complexity} is within the limit "
                                 f"{limit} already; accepted: a complexity above {limit}")
        if (path, name) in allowed:
            raise AllowlistError(f"{where}: {parts[0]} is listed twice (first on line "
                                 f"{allowed[(path, name)].line})")
        allowed[(path, name)] = Allowance(path, name, complexity, number)
    return allowed


def judge(measured: Iterable[Measured], allowed: Mapping[tuple[str, str], Allowance], *,
          limit: int = MAX_COMPLEXITY, scanned: Iterable[str] | None = None,
          allowlist_name: str = "allow-list") -> Verdict:
    """Offenders: over the limit and not listed, or listed and now more complex than listed.
    Stale: a listed function (in a scanned file) now within the limit, or gone."""
    worst: dict[tuple[str, str], Measured] = {}
    for item in measured:  # a name defined twice in one file counts at its worst
        if item.key not in worst or item.complexity > worst[item.key].complexity:
            worst[item.key] = item
    verdict = Verdict()
    for item in sorted(worst.values(), key=lambda m: (m.path, m.line)):
        if item.complexity <= limit:
            continue
        allowance = allowed.get(item.key)
        where = f"{item.path}:{item.line} {item.name} {item.complexity}"
        if allowance is None:
            verdict.offenders.append(f"{where} (limit {limit})")
        elif item.complexity > allowance.complexity:
            verdict.offenders.append(f"{where} (allow-listed at {allowance.complexity}: it got "
                                     "more complex; split it instead)")
        else:
            verdict.tolerated.append(item)
    in_scope = None if scanned is None else set(scanned)
    for key, allowance in sorted(allowed.items(), key=lambda kv: kv[1].line):
        if in_scope is not None and allowance.path not in in_scope:
            continue
        current = worst.get(key)
        if current is None or current.complexity <= limit:
            now = "no longer exists" if current is None else f"is now {current.complexity}"
            verdict.stale.append(f"{allowlist_name}:{allowance.line} {allowance.path}::"
                                 f"{allowance.name} {now}, within the limit {limit}: delete "
                                 "the line")
    return verdict


def python_files(root: Path, paths: Sequence[str] = ()) -> list[str]:
    """Repo-relative Python files to measure: what git tracks or would add (ignored files such
    as virtualenvs left out), under ``paths`` when given, never under an excluded folder."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"],
            cwd=root, check=True, capture_output=True, text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        listed = sorted(str(p.relative_to(root).as_posix()) for p in _walk(root))
    prefixes = tuple(p.rstrip("/") for p in paths)
    return sorted({
        name for name in listed
        if (root / name).is_file() and not _excluded(name)
        and (not prefixes or any(name == p or name.startswith(f"{p}/") for p in prefixes))})


def measure_files(root: Path, files: Sequence[str],
                  measure: Callable[[str, str], list[MeasuredT]], *, tool: str
                  ) -> list[MeasuredT] | None:
    """``measure(source, name)`` of every file, in order; None, after one line on stderr naming
    the file and line, when one does not parse (the gates' exit status 2)."""
    measured: list[MeasuredT] = []
    for name in files:
        try:
            measured += measure((root / name).read_text(encoding="utf-8"), name)
        except SyntaxError as error:
            print(f"{tool}: {name}:{error.lineno}: does not parse: {error.msg}", file=sys.stderr)
            return None
    return measured


def _excluded(name: str) -> bool:
    folders = name.split("/")[:-1]
    return any(part in EXCLUDED_FOLDERS or part.startswith(".") for part in folders)


def _walk(root: Path) -> Iterator[Path]:
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders
                         if d not in EXCLUDED_FOLDERS and not d.startswith(".")]
        yield from (Path(folder) / f for f in files if f.endswith(".py"))


def main(argv: Sequence[str] | None = None, *, root: Path = REPO_ROOT) -> int:
    """Measure, judge, print one line per problem (or a summary); return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m checks.complexity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: the whole tree)")
    parser.add_argument("--max", type=int, default=MAX_COMPLEXITY, dest="limit")
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    args = parser.parse_args(argv)
    allowlist_name = _display(args.allowlist, root)
    try:
        text = args.allowlist.read_text(encoding="utf-8") if args.allowlist.exists() else ""
        allowed = read_allowlist(text, source=allowlist_name, limit=args.limit)
    except AllowlistError as error:
        print(f"complexity: {error}", file=sys.stderr)
        return 2
    files = python_files(root, args.paths)
    measured = measure_files(root, files, measure_source, tool="complexity")
    if measured is None:
        return 2
    verdict = judge(measured, allowed, limit=args.limit,
                    scanned=files if args.paths else None, allowlist_name=allowlist_name)
    for line in (*verdict.offenders, *verdict.stale):
        print(line)
    if not verdict.passed:
        print(f"complexity: {len(verdict.offenders)} function(s) above {args.limit}, "
              f"{len(verdict.stale)} stale allow-list line(s); split the function into smaller "
              "ones (see docs/design-decisions.md#complexity-gate)", file=sys.stderr)
        return 1
    print(f"complexity: {len(measured)} functions in {len(files)} files, none above "
          f"{args.limit} ({len(verdict.tolerated)} allow-listed in {allowlist_name})")
    return 0


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
