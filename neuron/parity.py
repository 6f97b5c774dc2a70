"""Parity of a compiled classifier against the eager model it was compiled from.

The compiler runs the same padded sample queries through the eager fp32 model and through the
compiled (and saved, then reloaded) TorchScript, and bounds the largest absolute logit
difference. Top-1 disagreements are counted too: they are what a user would notice, and a flip
between two nearly tied intents is reported with its margin so a reviewer can judge it.

Pure module (plain floats in, a report out), Python 3.10-compatible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ParityReport:
    """How far a compiled model's logits are from the eager model's on the same inputs."""

    samples: int
    """Texts compared (each one row of logits)."""
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    top1_disagreements: int
    """Rows whose arg-max differs between the two models."""
    smallest_disagreeing_margin: float | None
    """Eager top-1 minus runner-up logit on the closest flipped row (None: no flip)."""
    bound: float
    """Largest accepted max |Δlogit|."""

    @property
    def passed(self) -> bool:
        """True when every logit is finite and within the bound."""
        return math.isfinite(self.max_abs_logit_diff) and self.max_abs_logit_diff <= self.bound

    def describe(self) -> str:
        """One line for the compile log and error messages."""
        flips = (f", {self.top1_disagreements} top-1 flip(s), closest eager margin "
                 f"{self.smallest_disagreeing_margin:.3g}"
                 if self.top1_disagreements else ", top-1 identical")
        verdict = "within" if self.passed else "OVER"
        return (f"max |Δlogit| {self.max_abs_logit_diff:.3g} {verdict} bound {self.bound:g} "
                f"(mean {self.mean_abs_logit_diff:.3g}, {self.samples} samples{flips})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``passed`` spelled out for readers of manifest.json."""
        data = asdict(self)
        data["passed"] = self.passed
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "parity") -> ParityReport:
        """Read the form :meth:`to_dict` writes; raise ValueError naming the bad field."""
        def number(name: str) -> float:
            raw = data.get(name)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ValueError(f"{where}.{name}: expected a number, got {raw!r}")
            return float(raw)

        def count(name: str) -> int:
            raw = data.get(name)
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                raise ValueError(f"{where}.{name}: expected an integer >= 0, got {raw!r}")
            return raw

        samples = count("samples")
        flips = count("top1_disagreements")
        margin_raw = data.get("smallest_disagreeing_margin")
        margin = None if margin_raw is None else number("smallest_disagreeing_margin")
        return cls(samples=samples, max_abs_logit_diff=number("max_abs_logit_diff"),
                   mean_abs_logit_diff=number("mean_abs_logit_diff"),
                   top1_disagreements=flips, smallest_disagreeing_margin=margin,
                   bound=number("bound"))


def _argmax(row: Sequence[float]) -> int:
    return max(range(len(row)), key=lambda index: row[index])


def compare_logits(
    reference: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    *,
    bound: float,
) -> ParityReport:
    """Compare ``candidate`` logits (compiled model) with ``reference`` (eager), row by row.

    Both must have the same number of rows and of labels per row. A NaN or infinity in either
    makes ``max_abs_logit_diff`` infinite, so the report fails whatever the bound.
    """
    if not bound > 0 or not math.isfinite(bound):
        raise ValueError(f"bound: {bound!r} must be a finite number > 0")
    if not reference:
        raise ValueError("reference: no rows to compare")
    if len(reference) != len(candidate):
        raise ValueError(f"candidate has {len(candidate)} rows, reference {len(reference)}")
    diffs: list[float] = []
    flips = 0
    closest_margin: float | None = None
    for index, (ref_row, cand_row) in enumerate(zip(reference, candidate, strict=True)):
        if len(ref_row) != len(cand_row) or not ref_row:
            raise ValueError(f"row {index}: candidate has {len(cand_row)} logits, "
                             f"reference {len(ref_row)}")
        for ref_value, cand_value in zip(ref_row, cand_row, strict=True):
            both_finite = math.isfinite(ref_value) and math.isfinite(cand_value)
            diffs.append(abs(ref_value - cand_value) if both_finite else math.inf)
        ref_top = _argmax(ref_row)
        if all(math.isfinite(v) for v in cand_row) and _argmax(cand_row) != ref_top:
            flips += 1
            runner_up = max(v for i, v in enumerate(ref_row) if i != ref_top)
            margin = ref_row[ref_top] - runner_up
            closest_margin = margin if closest_margin is None else min(closest_margin, margin)
    max_diff = max(diffs)
    mean_diff = math.fsum(diffs) / len(diffs) if math.isfinite(max_diff) else math.inf
    return ParityReport(samples=len(reference), max_abs_logit_diff=max_diff,
                        mean_abs_logit_diff=mean_diff, top1_disagreements=flips,
                        smallest_disagreeing_margin=closest_margin, bound=bound)


def worst_of(reports: Sequence[ParityReport]) -> ParityReport:
    """The report with the largest max |Δlogit| (one per compiled batch size → one verdict)."""
    if not reports:
        raise ValueError("worst_of: no reports")
    worst = max(reports, key=lambda r: (r.max_abs_logit_diff, r.top1_disagreements))
    total_flips = max(r.top1_disagreements for r in reports)
    margins = [r.smallest_disagreeing_margin for r in reports
               if r.smallest_disagreeing_margin is not None]
    return ParityReport(samples=worst.samples, max_abs_logit_diff=worst.max_abs_logit_diff,
                        mean_abs_logit_diff=max(r.mean_abs_logit_diff for r in reports),
                        top1_disagreements=total_flips,
                        smallest_disagreeing_margin=min(margins) if margins else None,
                        bound=worst.bound)
