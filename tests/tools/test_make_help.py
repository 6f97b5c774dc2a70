"""`make help` (tools/make_help.py): every documented target with the variables its recipe reads
and their defaults, and how long the long targets take (issue 33)."""

from __future__ import annotations

import re
import subprocess

from stacks.settings import REPO_ROOT
from tools.make_help import Target, render, targets

LONG = ("setup", "synth", "simulate", "cost", "capacity", "bench", "test", "test-engine", "diff",
        "preflight", "deploy", "quantize", "gpu-smoke", "start-cache")
"""Targets that take more than a minute on the development machine (or run against AWS or a GPU
for longer): each says roughly how long."""

SAMPLE = """\
PY := $(VENV)/bin/python
VENV := .venv
ENV ?= dev
HOOK ?= $(PY) -m hook
STAGE = $(PY) -c 'print("$(ENV)")'
all: setup ## the first ## about 3 min
\t$(HOOK) --env $(ENV) $(if $(MODEL),--model "$(MODEL)") \\
\t\t--url "$(or $(URL),http://x:1)"
\tstage=$$($(STAGE)); echo $$stage $(MAKEFILE_LIST)

quiet: ## the second
\t@true
undocumented:
\t$(SECRET)
"""


def test_variables_come_from_the_recipe_with_their_defaults() -> None:
    first, second = targets(SAMPLE)
    assert first == Target("all", "the first", "about 3 min",
                           (("ENV", "dev"), ("MODEL", ""), ("URL", "http://x:1")))
    assert second == Target("quiet", "the second", "", ())
    assert render([first, second]).splitlines() == [
        "  make all ENV=dev MODEL= URL=http://x:1   [about 3 min]",
        "      the first",
        "  make quiet",
        "      the second",
    ]


def make_help() -> str:
    return subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def usage_lines() -> dict[str, str]:
    found = {}
    for line in make_help().splitlines():
        match = re.match(r"^  make (?P<target>[a-z][a-z-]*)\b", line)
        if match:
            found[match["target"]] = line
    return found


def test_make_help_lists_every_documented_target() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    documented = re.findall(r"^([a-z][a-z-]*):[^=\n]*## ", makefile, re.M)
    assert len(documented) > 30, "not vacuous"
    assert sorted(usage_lines()) == sorted(documented)


def test_make_help_shows_the_variables_and_defaults() -> None:
    lines = usage_lines()
    for target in ("cost", "budget", "deploy", "publish", "smoke", "promote", "quantize"):
        assert " ENV=dev" in lines[target], lines[target]
    assert " BASE=origin/main" in lines["diff"]
    assert " ASSEMBLY=cdk.out" in lines["deploy"]
    assert " URL=http://127.0.0.1:8080" in lines["decode-bench"]
    assert re.search(r" MODEL= ADAPTERS= INTENT=", lines["publish"])
    assert " ENV=" not in lines["synth"]


def test_make_help_says_how_long_the_long_targets_take() -> None:
    lines = usage_lines()
    for target, line in lines.items():
        shown = re.search(r"   \[(?P<duration>[^\]]+)\]$", line)
        if target in LONG:
            assert shown, f"make help does not say how long make {target} takes"
        else:
            assert shown is None, f"make {target} says {shown['duration']!r} but is not long"
    # make help and the README quote the same measured durations (docs/develop.md#test-time).
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for target in ("synth", "test"):
        minutes = re.search(r"\[about (?P<minutes>[\d.]+) min", lines[target])
        assert minutes, lines[target]
        assert f"`make {target}` (about {minutes['minutes']} min" in readme, target
