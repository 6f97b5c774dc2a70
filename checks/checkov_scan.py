#!/usr/bin/env python3
"""checkov on the synthesized templates: fail on any finding, and on any skip without a reason.

    python -m checks.checkov_scan cdk.out/assembly-*/*.template.json   # [--checkov PATH]

checkov (a third-party IaC scanner, next to cdk-nag and cfn-lint in ``make synth``) lives in its
own environment, ``.venv-checkov``: it pins boto3, packaging and importlib-metadata versions the
main venv cannot take. This wrapper runs in the main venv, calls the checkov executable once on
every template (``--framework cloudformation``, JSON output, ``--skip-download`` so it never
calls the vendor's API) and prints one summary line. A finding this app accepts is acknowledged
on its resource with ``stacks.nag.acknowledge_checkov`` (``Metadata: checkov: skip:`` with a
comment); checkov reports it as skipped, and a skip whose comment is shorter than a real reason
counts as a problem too.

Exit status: 0 clean, 1 failed checks or unexplained skips, 2 checkov could not run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
MIN_REASON_CHARS = 40
"""Same bar as cdk-nag acknowledgements (stacks/nag.py)."""


class CheckovError(RuntimeError):
    """checkov did not run or its output could not be read."""


@dataclass(frozen=True)
class Finding:
    """One check result on one resource (failed, or skipped with its comment)."""

    check_id: str
    check_name: str
    resource: str
    file: str
    comment: str = ""

    def __str__(self) -> str:
        return f"{self.check_id} {self.resource} ({Path(self.file).name}): {self.check_name}"


@dataclass(frozen=True)
class CheckovReport:
    """What checkov found on a set of templates."""

    version: str
    templates: int
    resources: int
    passed: int
    failed: tuple[Finding, ...]
    skipped: tuple[Finding, ...]

    @property
    def unexplained_skips(self) -> tuple[Finding, ...]:
        """Skips whose comment is missing or too short to judge."""
        return tuple(s for s in self.skipped if len(s.comment.strip()) < MIN_REASON_CHARS)

    @property
    def clean(self) -> bool:
        """No failed check and every skip explained."""
        return not self.failed and not self.unexplained_skips

    def summary_line(self) -> str:
        """One line for ``make synth``, next to cdk-nag's and cfn-lint's."""
        return (f"checkov {self.version}: {self.resources} resources in {self.templates} "
                f"templates, {self.passed} passed, {len(self.failed)} failed, "
                f"{len(self.skipped)} skipped ({len(self.skipped) - len(self.unexplained_skips)} "
                "with a reason)")

    def problems(self) -> list[str]:
        """One line per failed check or unexplained skip."""
        lines = [f"failed: {finding}" for finding in self.failed]
        lines.extend(f"skipped without a reason of {MIN_REASON_CHARS}+ characters: {finding} "
                     f"(comment {finding.comment!r})" for finding in self.unexplained_skips)
        return lines


def _findings(entries: Iterable[Mapping[str, Any]]) -> tuple[Finding, ...]:
    found = []
    for entry in entries:
        result = entry.get("check_result") or {}
        found.append(Finding(
            check_id=str(entry.get("check_id")), check_name=str(entry.get("check_name", "")),
            resource=str(entry.get("resource")),
            file=str(entry.get("file_abs_path") or entry.get("file_path") or ""),
            comment=str(result.get("suppress_comment") or "")))
    return tuple(found)


def parse_report(output: str, *, templates: int) -> CheckovReport:
    """Read ``checkov -o json`` output (one report, or a list of them per framework)."""
    try:
        document = json.loads(output)
    except json.JSONDecodeError as error:
        raise CheckovError(f"checkov printed no JSON report ({error}): {output[:500]!r}") \
            from None
    reports = document if isinstance(document, list) else [document]
    version, resources, passed = "?", 0, 0
    failed: list[Finding] = []
    skipped: list[Finding] = []
    for report in reports:
        if not isinstance(report, Mapping) or "summary" not in report:
            raise CheckovError(f"unexpected checkov report: {str(report)[:300]}")
        if report.get("check_type", "cloudformation") != "cloudformation":
            continue
        summary = report["summary"]
        version = str(summary.get("checkov_version", version))
        resources += int(summary.get("resource_count", 0))
        passed += int(summary.get("passed", 0))
        results = report.get("results") or {}
        failed.extend(_findings(results.get("failed_checks", [])))
        skipped.extend(_findings(results.get("skipped_checks", [])))
    return CheckovReport(version=version, templates=templates, resources=resources,
                         passed=passed, failed=tuple(failed), skipped=tuple(skipped))


def run_checkov(templates: Sequence[Path], *, checkov: Path = DEFAULT_CHECKOV) -> CheckovReport:
    """Scan ``templates`` with the checkov executable and return its report."""
    if not templates:
        raise CheckovError("no templates to scan")
    missing = [str(path) for path in templates if not Path(path).is_file()]
    if missing:
        raise CheckovError(f"no such template(s): {', '.join(missing)}")
    if not Path(checkov).is_file():
        raise CheckovError(f"checkov is not installed at {checkov}; `make .venv-checkov/.installed`"
                           " builds it from requirements-checkov.txt")
    command = [str(checkov), "--framework", "cloudformation", "--output", "json",
               "--skip-download", "--compact"]
    for path in templates:
        command.extend(["--file", str(path)])
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            cwd=REPO_ROOT)
    if result.returncode not in (0, 1):  # 1 means "checks failed": the report says which
        raise CheckovError(f"checkov exited {result.returncode}: {result.stderr[-2000:]}")
    return parse_report(result.stdout, templates=len(templates))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.checkov_scan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("templates", nargs="+", type=Path, help="CloudFormation templates")
    parser.add_argument("--checkov", type=Path, default=DEFAULT_CHECKOV,
                        help="checkov executable (default: %(default)s)")
    args = parser.parse_args(argv)
    print(f"checkov: scanning {len(args.templates)} template(s) ...", file=sys.stderr)
    try:
        report = run_checkov(args.templates, checkov=args.checkov)
    except CheckovError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in report.problems():
        print(f"checkov: {line}", file=sys.stderr)
    print(report.summary_line())
    return 0 if report.clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
