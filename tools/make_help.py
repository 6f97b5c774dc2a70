"""`make help`: every documented target of the Makefile, the variables its recipe reads with their
defaults, and roughly how long it takes when that is more than a minute.

A target is documented by a comment on its rule line, ``target: prerequisites ## what it does``,
optionally followed by `` ## about N min`` (how long it takes on the 2-core development machine).
The variables are read from the recipe itself, so they cannot drift from it: every ``$(NAME)`` the
recipe uses, with the Makefile's own helper variables (``PY``, ``PREFLIGHT``, ...) expanded. A
variable set with ``?=`` to a plain value shows that default (``ENV=dev``), ``$(or $(URL),x)``
shows ``URL=x``, and a variable the Makefile never sets shows as ``NAME=`` (empty unless given).
Runs with the standard library only, before any set-up.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

RULE = re.compile(r"^(?P<target>[a-z][a-z-]*):[^=\n]*?## (?P<doc>.*)$")
ASSIGNMENT = re.compile(r"^(?P<name>[A-Z_]+) *(?P<op>\?=|:=|=) *(?P<value>.*)$")
REFERENCE = re.compile(r"\$\((?P<name>[A-Z_]+)\)")
OR_DEFAULT = re.compile(r"\$\(or \$\((?P<name>[A-Z_]+)\),(?P<default>[^)]*)\)")
BUILTINS = frozenset({"MAKEFILE_LIST", "CURDIR", "MAKE", "SHELL"})
"""Make's own variables: never a setting of a target."""


@dataclass(frozen=True)
class Assignment:
    op: str
    value: str

    @property
    def is_setting(self) -> bool:
        """A default the caller may override (``?=``) that is a value, not another command."""
        return self.op == "?=" and "$(" not in self.value


@dataclass(frozen=True)
class Target:
    name: str
    doc: str
    duration: str
    variables: tuple[tuple[str, str], ...]

    def usage(self) -> str:
        settings = " ".join(f"{name}={default}" for name, default in self.variables)
        return f"make {self.name}" + (f" {settings}" if settings else "")


def logical_lines(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def assignments(lines: list[str]) -> dict[str, Assignment]:
    found: dict[str, Assignment] = {}
    for line in lines:
        match = ASSIGNMENT.match(line)
        if match:
            found[match["name"]] = Assignment(match["op"], match["value"].strip())
    return found


def recipe(lines: list[str], start: int) -> str:
    """The tab-indented lines after the rule line at ``start``."""
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        body.append(line)
    return "\n".join(body)


def variables(text: str, defined: dict[str, Assignment]) -> tuple[tuple[str, str], ...]:
    """The settings ``text`` reads, in order of first use, each with its default."""
    found: dict[str, str] = {}
    defaults = {match["name"]: match["default"] for match in OR_DEFAULT.finditer(text)}

    def visit(fragment: str, seen: frozenset[str]) -> None:
        for match in REFERENCE.finditer(fragment):
            name = match["name"]
            if name in BUILTINS or name in seen or name in found:
                continue
            assignment = defined.get(name)
            if assignment is None:
                found[name] = defaults.get(name, "")
            elif assignment.is_setting:
                found[name] = assignment.value
            else:
                visit(assignment.value, seen | {name})

    visit(text, frozenset())
    return tuple(found.items())


def targets(makefile: str) -> list[Target]:
    lines = logical_lines(makefile)
    defined = assignments(lines)
    found = []
    for index, line in enumerate(lines):
        match = RULE.match(line)
        if match is None:
            continue
        doc, _, duration = match["doc"].partition(" ## ")
        found.append(Target(match["target"], doc.strip(), duration.strip(),
                            variables(recipe(lines, index), defined)))
    return found


def render(found: list[Target]) -> str:
    out = []
    for target in found:
        usage = target.usage()
        out.append(f"  {usage}" + (f"   [{target.duration}]" if target.duration else ""))
        out.append(f"      {target.doc}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "Makefile")
    print(render(targets(path.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
