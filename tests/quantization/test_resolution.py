"""What the evaluation set can resolve against the 2 % threshold, and the gate saying so.

The statistics (quantization/resolution.py): a mean over n paired prompts has standard error
sd(d)/√n; its 95 % interval uses Student's t with n − 1 degrees of freedom; a difference is
detected with 80 % power from (t + z(0.80))·sd/√n (the normal-approximation sample-size formula
for a paired mean, e.g. NIST/SEMATECH e-Handbook of Statistical Methods, 7.2.2.2 "Sample sizes
required", https://www.itl.nist.gov/div898/handbook/prc/section2/prc222.htm).
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from quantization.gate import GateThresholds, decide, resolution_warnings
from quantization.resolution import (
    detectable,
    half_width,
    regression_interval,
    smallest_step,
    t_975,
    table,
)
from quantization.scoring import EvalItem, TitleCatalog
from tests.quantization.test_gate import SMALLER, gate, good_answer

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("degrees", "exact"), [(24, 2.063899), (49, 2.009575),
                                                (249, 1.969537), (499, 1.964729)])
def test_the_t_quantile_is_students(degrees: int, exact: float) -> None:
    assert t_975(degrees) == pytest.approx(exact, abs=1e-5)


def test_what_50_prompts_can_and_cannot_tell_apart() -> None:
    # One Japanese prompt (of 25) losing one of its two required items is already 2.2 %.
    assert smallest_step(25, 2, 4.5) == pytest.approx(5 / 2 / 25 / 4.5)
    assert smallest_step(25, 2, 4.5) > 0.02
    # With answers varying by sd 0.75 points, 50 prompts pin a regression to ± 4.7 % and
    # detect one of 6.7 %; 500 prompts to ± 1.5 % and 2.1 %.
    assert half_width(50, 0.75, 4.5) == pytest.approx(2.009575 * 0.75 / (50 ** 0.5 * 4.5))
    assert round(half_width(50, 0.75, 4.5) * 100, 1) == 4.7
    assert round(detectable(50, 0.75, 4.5) * 100, 1) == 6.7
    assert round(half_width(500, 0.75, 4.5) * 100, 1) == 1.5
    assert half_width(500, 0.5, 4.5) < 0.02 < half_width(50, 0.5, 4.5)


def test_a_runs_own_interval_from_its_paired_scores() -> None:
    same = regression_interval([5.0, 4.0, 5.0], [5.0, 4.0, 5.0])
    assert same is not None and (same.regression, same.half_width) == (0.0, 0.0)
    interval = regression_interval([5.0] * 10, [5.0] * 8 + [2.5, 2.5])
    assert interval is not None
    assert interval.regression == pytest.approx(0.1)
    differences_sd = statistics.stdev([0.0] * 8 + [2.5, 2.5])
    assert interval.half_width == pytest.approx(t_975(9) * differences_sd / (10 ** 0.5 * 5.0))
    assert interval.low < interval.regression < interval.high
    assert regression_interval([5.0], [4.0]) is None
    with pytest.raises(ValueError, match="2 baseline scores but 1 quantized"):
        regression_interval([5.0, 5.0], [5.0])


def test_the_gate_says_when_its_set_cannot_resolve_the_threshold(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def drops_some(item: EvalItem) -> str:
        return "わかりません。" if item.item_id in {"ev-ja-01", "ev-ja-09"} else good_answer(item)

    report = gate(eval_items, catalog, drops_some)
    warned = [w for w in report.warnings if "cannot resolve" in w]
    assert [w.split(":")[0] for w in warned] == ["regression_overall", "regression_ja"]
    assert warned[1].endswith("(95 % interval over 25 paired prompts): this set cannot "
                              "resolve the 2 % threshold (docs/design-decisions.md"
                              "#gate-resolution)")
    # Identical answers: nothing to resolve, no warning.
    same = gate(eval_items, catalog, good_answer)
    assert not [w for w in same.warnings if "cannot resolve" in w]
    # A wider threshold this set can resolve: no warning either.
    wide = decide(report.baseline, report.quantized, SMALLER, GateThresholds(max_regression=0.5))
    assert not [w for w in wide.warnings if "cannot resolve" in w]
    assert resolution_warnings(report.baseline, report.quantized, 0.02) == warned
    assert dataclasses.asdict(report.thresholds)["max_regression"] == 0.02


def test_the_numbers_in_the_design_decisions_are_the_modules() -> None:
    page = (REPO_ROOT / "docs" / "design-decisions.md").read_text(encoding="utf-8")
    entry = page.split('<a id="gate-resolution"></a>', 1)[1].split("<a id=", 1)[0]
    printed = subprocess.run([sys.executable, "-m", "quantization.resolution"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True, timeout=60).stdout
    for line in printed.splitlines():
        assert line in entry, line
    assert "\n".join(table()) in printed
