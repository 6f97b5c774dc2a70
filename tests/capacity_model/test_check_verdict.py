"""The capacity check can fail (capacity_model/check_verdict.py, benchmarks/capacity_check.py):
every printed figure has a tolerance, a figure outside it fails, and the committed last output
judges as it says it does — re-judged here, fast, without starting an engine."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from capacity_model.check_verdict import (
    TOLERANCES,
    Row,
    VerdictError,
    failures,
    judge,
    judge_all,
    parse_sent,
    parse_table,
)
from stacks.settings import REPO_ROOT

LAST = REPO_ROOT / "docs" / "capacity_check_last.txt"


def _check_module() -> object:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("capacity_check",
                                                      REPO_ROOT / "benchmarks" / "capacity_check.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["capacity_check"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


def test_every_figure_has_a_tolerance_and_an_outlier_fails() -> None:
    for figure, band in TOLERANCES.items():
        assert band.low < 1 < band.high, figure
        inside = judge(Row("closed 4", figure, "100.0", "100.0"))
        outside = judge(Row("closed 4", figure, f"{100 * band.high * 1.01:.1f}", "100.0"))
        assert inside.holds and not outside.holds, figure
    assert not judge(Row("open 1×", "failed requests", "0", "5"), sent=100).holds
    assert judge(Row("open 1×", "failed requests", "0", "1"), sent=100).holds
    assert not judge(Row("closed 9", "TTFT p99 within SLO", "yes (limit)", "no")).holds
    with pytest.raises(VerdictError, match="'queue depth' has no tolerance"):
        judge(Row("closed 4", "queue depth", "1", "1"))


def test_a_table_round_trips_through_its_printed_form() -> None:
    text = ("sent: closed 4 = 120\n"
            "| load | figure | predicted | measured | ratio | tolerance | verdict |\n"
            "|---|---|---|---|---|---|---|\n"
            "| closed 4 | throughput /min | 400.0 | 360.0 | 1.11 | 0.8–1.25 | ok |\n"
            "| closed 4 | TPOT p99 ms | 11.0 | 224.6 | 0.05 | 0.4–2.5 | OUT |\n"
            "| closed 4 | failed requests | 0 | 0 | - | <= 1% of sent | ok |\n")
    rows = parse_table(text)
    assert [r.figure for r in rows] == ["throughput /min", "TPOT p99 ms", "failed requests"]
    assert parse_sent(text) == {"closed 4": 120}
    judged = judge_all(rows, parse_sent(text))
    assert [j.row.figure for j in failures(judged)] == ["TPOT p99 ms"]
    assert [j.line() for j in judged] == text.splitlines()[3:]


def test_the_committed_last_output_judges_as_it_says() -> None:
    """docs/capacity_check_last.txt, re-judged with today's tolerances, reaches the verdict it
    printed (a changed tolerance that flips it fails here until the output is re-run)."""
    text = LAST.read_text(encoding="utf-8")
    module = _check_module()
    lines, holds = module.rejudge(text)  # type: ignore[attr-defined]
    printed = next(line for line in text.splitlines() if line.startswith("verdict: "))
    assert lines[-1] == printed
    assert holds == printed.endswith("PASS")
    assert len(parse_table(text)) >= 20, "not vacuous: every load's figures are there"

