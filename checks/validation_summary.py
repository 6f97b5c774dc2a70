#!/usr/bin/env python3
"""The policy-validation part of `make synth`'s summary line: cdk-nag and cfn-guard (Control Tower).

    python -m checks.validation_summary cdk.out

Both plugins run inside the synthesis (``stacks.nag.add_nag_checks``); an unacknowledged finding
has already failed it. This reads what they left in ``cdk.out/validation-report.json`` —
``violations`` (unacknowledged) and ``suppressedViolations`` (acknowledged on a construct with a
reason) per plugin — and prints one line (the README's first lines show the current counts):

    cdk-nag: 0 unacknowledged, <N> acknowledged with a reason; cfn-guard <version> (Control Tower
    proactive controls, <rules> rules): 0 unacknowledged, <M> acknowledged with a reason
    (<controls> controls)

``<N>`` and ``<M>`` count acknowledged findings (one per construct), ``<controls>`` the distinct
Control Tower controls their reasons name; ``<version>`` and ``<rules>`` are the installed
plugin's cfn-guard and its bundled rules. Any unacknowledged finding, or an acknowledgement
without a reason (``, <K> WITHOUT a reason``), makes the line unclean.

Exit status 0 when nothing is unacknowledged and every acknowledgement has a reason, 1
otherwise, 2 when there is no report to read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacks.validation_rules import GUARD_PLUGIN, MIN_REASON_CHARS, NAG_PACK

GUARD_DISTRIBUTION = "cdklabs.cdk-validator-cfnguard"
CONTROL_ID = re.compile(r"\[(CT\.[A-Z0-9]+\.PR\.[0-9]+)\]")
"""A Control Tower control id at the start of an acknowledgement's reason or a rule's text."""


@dataclass(frozen=True)
class PluginCounts:
    """What one plugin found: unacknowledged findings and acknowledged ones (per construct)."""

    unacknowledged: int
    acknowledged: int
    without_reason: int
    controls: frozenset[str]


def count(plugin: Mapping[str, Any]) -> PluginCounts:
    """Count one plugin report's findings, one per violating construct."""
    open_findings = sum(len(v.get("violatingConstructs", [])) for v in plugin.get("violations", []))
    acknowledged = 0
    without_reason = 0
    controls: set[str] = set()
    for violation in plugin.get("suppressedViolations", []):
        constructs = len(violation.get("violatingConstructs", [])) or 1
        acknowledged += constructs
        reason = str(violation.get("reason") or "")
        if len(reason.strip()) < MIN_REASON_CHARS:
            without_reason += constructs
        controls.update(CONTROL_ID.findall(reason))
    return PluginCounts(open_findings, acknowledged, without_reason, frozenset(controls))


def guard_release() -> tuple[str, int]:
    """(cfn-guard version, number of bundled Control Tower rules) of the installed plugin.

    Read from the plugin's jsii bundle on disk (importing the package would start jsii)."""
    from importlib.metadata import files

    bundles = [f for f in files(GUARD_DISTRIBUTION) or () if str(f).endswith(".jsii.tgz")]
    if not bundles:
        return "?", 0
    with tarfile.open(Path(str(bundles[0].locate()))) as tar:
        member = tar.extractfile("package/guard-version.json")
        version = json.loads(member.read())["version"] if member else "?"
        rules = sum(1 for name in tar.getnames()
                    if name.startswith("package/rules/control-tower/") and name.endswith(".guard"))
    return str(version), rules


def summary_line(report: Mapping[str, Any]) -> tuple[str, bool]:
    """The summary line and whether it is clean."""
    plugins = {p.get("pluginName"): count(p) for p in report.get("pluginReports", [])}
    parts: list[str] = []
    clean = True
    for name, label in ((NAG_PACK, "cdk-nag"), (GUARD_PLUGIN, None)):
        # A plugin with nothing to report, acknowledged or not, may leave no report at all.
        counts = plugins.get(name, PluginCounts(0, 0, 0, frozenset()))
        if label is None:
            version, rules = guard_release()
            label = f"cfn-guard {version} (Control Tower proactive controls, {rules} rules)"
        text = (f"{label}: {counts.unacknowledged} unacknowledged, {counts.acknowledged} "
                "acknowledged with a reason")
        if counts.controls:
            text += f" ({len(counts.controls)} controls)"
        if counts.without_reason:
            text += f", {counts.without_reason} WITHOUT a reason"
        clean = clean and counts.unacknowledged == 0 and counts.without_reason == 0
        parts.append(text)
    return "; ".join(parts), clean


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.validation_summary",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("assembly", type=Path, help="the cloud assembly (cdk.out)")
    args = parser.parse_args(argv)
    path = args.assembly / "validation-report.json"
    if not path.is_file():
        print(f"error: no {path}: synthesize first (make synth)", file=sys.stderr)
        return 2
    line, clean = summary_line(json.loads(path.read_text(encoding="utf-8")))
    print(line)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
