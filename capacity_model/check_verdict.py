"""How ``benchmarks/capacity_check.py`` judges the capacity model against a running engine.

Every figure the check prints — per load: requests in flight, throughput, TTFT p50/p99, TPOT
p50/p99, failed requests, and at the predicted limit whether the TTFT p99 met its SLO — has a
stated tolerance here, as the band the ratio *predicted ÷ measured* must fall in (or, for the
counts, a ceiling). A figure outside its band fails the check, and the check exits non-zero.

The bands are what the model claims for an engine it was *not fitted to*: the check fits the
roofline's rates on one set of request shapes and loads (:data:`FIT_LOADS`) and judges them on
others — production's four buckets at their own sizes, at loads the fit never ran. They are
this project's statement of the model's accuracy, not a measurement:

* **throughput, TTFT p50** within ±25 % (ratio 0.8–1.25): the rates the fleet is sized by;
* **in flight** (open loops: what Little's law and the queue predict) 0.67–1.5;
* **TTFT p99, TPOT p50** 0.67–1.5: the queue's tail and the step with prefill chunks in it;
* **TPOT p99** 0.4–2.5: on a CPU engine the client times streamed chunks on the same two busy
  cores, so the per-token tail is the host's more than the scheduler's (docs/capacity.md);
* **failed requests** at most 1 % of those sent; **TTFT p99 within the SLO at the limit**:
  must hold.

:func:`parse_table` reads the check's own Markdown table back, so a committed output can be
judged again (the fast test does) and a changed tolerance re-judges it.

Pure module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FIT_LOADS = ("closed loops of 1, 2, 8 and 24 at 1.5 x the mix's mean prompt and twice its answer,"
             " and that prompt at 1/3, 1 and 2 x alone")
"""What the rates are fitted on; no judged load is one of these."""


@dataclass(frozen=True)
class Band:
    """The ratio predicted ÷ measured a figure must fall in."""

    low: float
    high: float

    def holds(self, value: float) -> bool:
        """Inside the band (inclusive)."""
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:g}–{self.high:g}"


TOLERANCES: dict[str, Band] = {
    "in flight": Band(0.67, 1.5),
    "throughput /min": Band(0.8, 1.25),
    "TTFT p50 ms": Band(0.8, 1.25),
    "TTFT p99 ms": Band(0.67, 1.5),
    "TPOT p50 ms": Band(0.67, 1.5),
    "TPOT p99 ms": Band(0.4, 2.5),
}
FAILED_SHARE_MAX = 0.01


class VerdictError(ValueError):
    """A row the judge does not know how to judge (names the figure)."""


@dataclass(frozen=True)
class Row:
    """One printed figure of one load."""

    load: str
    figure: str
    predicted: str
    measured: str

    def ratio(self) -> float | None:
        """predicted ÷ measured, None when either is not a number."""
        try:
            predicted, measured = _number(self.predicted), _number(self.measured)
        except ValueError:
            return None
        if measured == 0:
            return float("inf") if predicted else 1.0
        return predicted / measured


@dataclass(frozen=True)
class Judged:
    """A row, its ratio, the tolerance it is held to and whether it holds."""

    row: Row
    ratio: float | None
    tolerance: str
    holds: bool

    def line(self) -> str:
        """The printed table row: figure, predicted, measured, ratio, tolerance, verdict."""
        shown = "-" if self.ratio is None else f"{self.ratio:.2f}"
        verdict = "ok" if self.holds else "OUT"
        return (f"| {self.row.load} | {self.row.figure} | {self.row.predicted} | "
                f"{self.row.measured} | {shown} | {self.tolerance} | {verdict} |")


def _number(text: str) -> float:
    return float(text.replace(",", "").rstrip("%"))


def judge(row: Row, sent: int | None = None) -> Judged:
    """Hold ``row`` to its tolerance; ``sent`` (requests of the load) bounds failed requests."""
    if row.figure in TOLERANCES:
        band = TOLERANCES[row.figure]
        value = row.ratio()
        return Judged(row, value, str(band), value is not None and band.holds(value))
    if row.figure == "failed requests":
        failed = _number(row.measured)
        allowed = FAILED_SHARE_MAX * sent if sent else 0.0
        return Judged(row, None, f"<= {FAILED_SHARE_MAX:.0%} of sent", failed <= allowed)
    if row.figure == "TTFT p99 within SLO":
        return Judged(row, None, "yes", row.measured == "yes")
    raise VerdictError(f"figure {row.figure!r} has no tolerance; accepted: "
                       f"{[*sorted(TOLERANCES), 'failed requests', 'TTFT p99 within SLO']}")


def judge_all(rows: Iterable[Row], sent: dict[str, int] | None = None) -> list[Judged]:
    """Every row judged (``sent``: requests sent per load)."""
    return [judge(row, (sent or {}).get(row.load)) for row in rows]


def failures(judged: Sequence[Judged]) -> list[Judged]:
    """The rows out of tolerance."""
    return [j for j in judged if not j.holds]


_ROW = re.compile(r"^\| (?P<load>[^|]+?) \| (?P<figure>[^|]+?) \| (?P<predicted>[^|]+?) \| "
                  r"(?P<measured>[^|]+?) \|")


def parse_table(text: str) -> list[Row]:
    """The check's table rows back from its output (header and rule rows skipped)."""
    rows = []
    for line in text.splitlines():
        match = _ROW.match(line)
        if not match or match["load"] in ("load", "---"):
            continue
        rows.append(Row(match["load"], match["figure"], match["predicted"].strip(),
                        match["measured"].strip()))
    return rows


def parse_sent(text: str) -> dict[str, int]:
    """The ``sent: <load> = N`` lines the check prints (requests sent per load)."""
    return {m["load"]: int(m["n"]) for m in re.finditer(r"^sent: (?P<load>.+?) = (?P<n>\d+)$",
                                                        text, re.MULTILINE)}
