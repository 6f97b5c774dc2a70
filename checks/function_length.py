"""The length gate: no function outside tests/ longer than 80 lines.

    python -m checks.function_length                 # every Python file git knows, tests/ excepted
    python -m checks.function_length stacks tools    # only these files or folders
    # [--max 80]

A function's length is counted from its ``def`` line to its last line, docstring, comments and
blank lines inside it included (decorators above the ``def`` are not). Every function is measured:
top-level functions, methods, nested functions and the methods of nested classes, each named by
its qualified name (``Class.method``, ``outer.inner``). A nested function counts inside its outer
function's length too, so moving a block into a closure does not shorten anything.

Why 80: the complexity gate (``checks/complexity.py``, radon) counts branches, not lines, so a
straight-line constructor of 200 lines passes it. The longest functions that read well here stay
near 60 lines of body; 80 leaves room for that body plus a signature over several lines and a
docstring. There is no allow-list: a function over the limit is split, not listed.

Output: one line per offender, ``file:line qualified.name N lines``, by file and line.
Exit status: 0 clean, 1 functions over the limit, 2 a file that does not parse.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from checks.complexity import REPO_ROOT, measure_files, python_files

MAX_LINES = 80
"""A body near 60 lines, a signature over a few lines and a docstring."""


@dataclass(frozen=True)
class Length:
    """One function's length. ``name`` is qualified: ``Class.method``, ``outer.inner``."""

    path: str
    line: int
    name: str
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} {self.lines} lines"


def measure_source(source: str, path: str) -> list[Length]:
    """Every function in ``source`` (methods, nested functions and classes included), in source
    order; SyntaxError when it does not parse."""
    found: list[Length] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                found.append(Length(path, child.lineno, name, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:  # functions defined under if/try/with blocks
                visit(child, prefix)

    visit(ast.parse(source, filename=path), "")
    return found


def offenders(measured: Sequence[Length], *, limit: int = MAX_LINES) -> list[Length]:
    """The functions longer than ``limit`` lines, by file and line."""
    return sorted((m for m in measured if m.lines > limit), key=lambda m: (m.path, m.line))


def main(argv: Sequence[str] | None = None, *, root: Path = REPO_ROOT) -> int:
    """Measure, print one line per offender (or a summary); return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m checks.function_length",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: the whole tree)")
    parser.add_argument("--max", type=int, default=MAX_LINES, dest="limit")
    args = parser.parse_args(argv)
    files = python_files(root, args.paths)
    measured = measure_files(root, files, measure_source, tool="function_length")
    if measured is None:
        return 2
    over = offenders(measured, limit=args.limit)
    for item in over:
        print(item)
    if over:
        print(f"function_length: {len(over)} function(s) longer than {args.limit} lines; split "
              "them into smaller ones (see docs/design-decisions.md#length-gate)",
              file=sys.stderr)
        return 1
    print(f"function_length: {len(measured)} functions in {len(files)} files, none longer "
          f"than {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
