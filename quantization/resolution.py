"""What an evaluation set of n prompts can resolve against the gate's 2 % regression threshold.

    python -m quantization.resolution [--eval-set FILE.jsonl ...]

Without ``--eval-set``: the base model's set and each adapter's (quantization/adapters.py), each
with what its verdict can resolve.

The gate compares the quantized model's mean answer score with the baseline's on the same
prompts: the regression is ``mean(baseline − quantized) / mean(baseline)``. Two limits bound what
a set of n prompts can tell apart:

* **granularity** — an answer's score moves in steps: one required item of k is 5/k points, one
  invented title 1.25 points. One prompt losing one item moves the mean by 5/(k·n), which as a
  share of a baseline near 4.5 is the smallest regression the set can register at all;
* **noise** — which answers change under quantization is not a constant: over the per-prompt
  differences d = baseline − quantized (paired: both models answer every prompt), the mean has
  standard error sd(d)/√n, so a 95 % interval around a measured regression is
  ± t(0.975, n−1)·sd(d)/(√n·mean(baseline)), and a regression is detected with 80 % power only
  from (t(0.975, n−1) + z(0.80))·sd(d)/(√n·mean(baseline)) upwards.

The gate applies this to each run's own differences (:func:`regression_interval`) and says when
its interval is wider than the threshold; the table this module prints, for plausible sd(d), is
the one docs/design-decisions.md#gate-resolution quotes.

Pure module: standard library only (the t quantile from its Cornish–Fisher expansion, within
0.001 of the exact value for n − 1 ≥ 10).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Z_975 = 1.959964
"""The standard normal's 97.5 % quantile (a two-sided 95 % interval)."""
Z_80 = 0.841621
"""The standard normal's 80 % quantile (80 % power)."""
SCORE_SCALE = 5.0
HALLUCINATION_PENALTY = 1.25
"""0.25 of the 0–5 scale per invented title (quantization/scoring.py)."""
SETS = (25, 50, 250, 500)
"""Prompts per language and overall: now (25 / 50), and the sizes the requirements ask for
(250 / 500; docs/design-decisions.md#gate-resolution)."""
SPREADS = (0.5, 0.75, 1.0)
"""sd(d) in points: from one answer in ten changing by about 1.6 points (0.5) to one in three
changing by about 1.7 (1.0)."""
BASELINE_SCORE = 4.5


def t_975(degrees_of_freedom: int) -> float:
    """Student's t 97.5 % quantile (Cornish–Fisher expansion in 1/ν)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom {degrees_of_freedom}: at least 1")
    z, nu = Z_975, float(degrees_of_freedom)
    return (z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3))


def half_width(n: int, sd_points: float, baseline_score: float) -> float:
    """The 95 % interval's half-width around a measured regression, as a share of the
    baseline."""
    return t_975(n - 1) * sd_points / (math.sqrt(n) * baseline_score)


def detectable(n: int, sd_points: float, baseline_score: float) -> float:
    """The smallest regression detected with 80 % power (two-sided 5 % test), as a share."""
    return (t_975(n - 1) + Z_80) * sd_points / (math.sqrt(n) * baseline_score)


def smallest_step(n: int, required_items: int, baseline_score: float) -> float:
    """One prompt losing one of ``required_items`` items, as a share of the baseline mean."""
    return SCORE_SCALE / required_items / n / baseline_score


@dataclass(frozen=True)
class RegressionInterval:
    """A run's measured regression with its 95 % interval (shares of the baseline)."""

    regression: float
    half_width: float
    prompts: int

    @property
    def low(self) -> float:
        """The interval's lower end."""
        return self.regression - self.half_width

    @property
    def high(self) -> float:
        """The interval's upper end."""
        return self.regression + self.half_width


def regression_interval(baseline: Sequence[float], quantized: Sequence[float]
                        ) -> RegressionInterval | None:
    """The paired interval of one run's per-prompt scores (None: fewer than 2 prompts or a
    baseline of 0)."""
    if len(baseline) != len(quantized):
        raise ValueError(f"{len(baseline)} baseline scores but {len(quantized)} quantized")
    n = len(baseline)
    mean_baseline = statistics.fmean(baseline) if n else 0.0
    if n < 2 or mean_baseline <= 0:
        return None
    differences = [b - q for b, q in zip(baseline, quantized, strict=True)]
    return RegressionInterval(
        regression=statistics.fmean(differences) / mean_baseline,
        half_width=t_975(n - 1) * statistics.stdev(differences) / (math.sqrt(n) * mean_baseline),
        prompts=n)


def table(sizes: Sequence[int] = SETS, spreads: Sequence[float] = SPREADS,
          baseline_score: float = BASELINE_SCORE) -> list[str]:
    """The Markdown table docs/design-decisions.md#gate-resolution quotes."""
    header = ["| prompts | smallest step (1 of 2 items) | "
              + " | ".join(f"±95 % / detectable, sd {sd:g}" for sd in spreads) + " |",
              "|---|---|" + "---|" * len(spreads)]
    rows = []
    for n in sizes:
        cells = [f"{half_width(n, sd, baseline_score) * 100:.1f} % / "
                 f"{detectable(n, sd, baseline_score) * 100:.1f} %" for sd in spreads]
        rows.append(f"| {n} | {smallest_step(n, 2, baseline_score) * 100:.2f} % | "
                    + " | ".join(cells) + " |")
    return header + rows


def required_item_counts(eval_set: Path, language: str | None = None) -> list[int]:
    """Required items per prompt of an evaluation set (titles and terms), of one language or
    all."""
    counts = []
    for line in eval_set.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            if language is None or item.get("language") == language:
                counts.append(len(item.get("required_titles", [])) +
                              len(item.get("required_terms", [])))
    return counts


SET_SPREAD = 0.75
"""The sd(d) the per-set table assumes (the middle of SPREADS)."""


def set_row(name: str, eval_set: Path, max_regression: float = 0.02,
            baseline_score: float = BASELINE_SCORE) -> str:
    """One set's row: its prompts per language, one lost item's step and the 95 % interval
    (sd 0.75) for the set and each language, and whether the threshold is within reach."""
    cells = []
    resolvable = True
    for language in (None, "ja", "en"):
        counts = required_item_counts(eval_set, language)
        if not counts:
            continue
        n = len(counts)
        step = smallest_step(n, max(1, round(statistics.median(counts))), baseline_score)
        width = half_width(n, SET_SPREAD, baseline_score) if n > 1 else float("inf")
        resolvable = resolvable and step <= max_regression and width <= max_regression
        cells.append(f"{language or 'all'} {n}: {step * 100:.2f} % / ± {width * 100:.1f} %")
    verdict = ("resolves" if resolvable else "cannot resolve") + f" {max_regression * 100:g} %"
    return f"| {eval_set.name} | {name} | {'; '.join(cells)} | {verdict} |"


def set_table(sets: Sequence[tuple[str, Path]]) -> list[str]:
    """What each set's verdict can resolve (the second table of the design decision)."""
    return ["| set | gates | prompts: one lost item / ± 95 % (sd 0.75) | the 2 % threshold |",
            "|---|---|---|---|", *(set_row(name, path) for name, path in sets)]


def main(argv: Sequence[str] | None = None) -> int:
    from quantization.adapters import ADAPTER_EVAL_SETS, BASE_EVAL_SET

    parser = argparse.ArgumentParser(prog="python -m quantization.resolution",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--eval-set", type=Path, action="append",
                        help="a set to describe (repeatable; default: the base's and each "
                        "adapter's)")
    args = parser.parse_args(argv)
    sets = ([(path.stem, path) for path in args.eval_set] if args.eval_set else
            [("base model", BASE_EVAL_SET),
             *((f"adapter {name}", path) for name, path in ADAPTER_EVAL_SETS.items())])
    for _, path in sets:
        counts = required_item_counts(path)
        print(f"{path.name}: {len(counts)} prompts, {min(counts)}–{max(counts)} required "
              f"items each (median {statistics.median(counts):g}); baseline {BASELINE_SCORE}/5")
    print("\n".join(table()))
    print("\n".join(set_table(sets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
