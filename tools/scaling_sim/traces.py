"""Traffic traces: invocations per minute on one endpoint, one row per minute.

File format (CSV, UTF-8): ``#`` comment lines describing the trace, then a header
``minute_start,invocations_per_min`` and one row per consecutive minute, the time in ISO 8601
with its UTC offset (``2026-12-06T20:00:00+09:00``).

The shipped traces are generated here, deterministically, from the seeds' numbers (see
docs/scaling.md for the assumptions); ``python -m tools.scaling_sim.traces`` rewrites them.

* ``one-piece`` — Sunday 2026-12-06 17:00-24:00 JST, the One Piece chapter 1,100 incident of seed
  001 (story 7): an evening base of ~600 invocations/min climbs to 3× in the 15 minutes after the
  20:00 release, holds for 30 minutes and settles back over an hour.
* ``weekday`` — Wednesday 2026-12-09, a whole day: the off-peak trough (≈500/min at 03:00-05:00,
  seed story 4), the business-hours day, and the Shonen Magazine release at 18:00 (×1.8).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TRACE_DIR = Path(__file__).resolve().parent / "traces"
HEADER = ("minute_start", "invocations_per_min")
JST = dt.timezone(dt.timedelta(hours=9), "JST")


@dataclass(frozen=True)
class Trace:
    """Offered load, one value per minute from ``start``."""

    name: str
    description: str
    start: dt.datetime
    invocations_per_min: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError(f"trace {self.name}: start must carry a UTC offset")
        if not self.invocations_per_min:
            raise ValueError(f"trace {self.name}: no minutes")
        bad = [i for i, v in enumerate(self.invocations_per_min) if not (math.isfinite(v)
                                                                         and v >= 0)]
        if bad:
            raise ValueError(f"trace {self.name}: minute {bad[0]} has "
                             f"{self.invocations_per_min[bad[0]]!r}; accepted: a number >= 0")

    @property
    def minutes(self) -> int:
        """Length of the trace in minutes."""
        return len(self.invocations_per_min)

    @property
    def end(self) -> dt.datetime:
        """The end of the last minute."""
        return self.start + dt.timedelta(minutes=self.minutes)

    @property
    def total_invocations(self) -> float:
        """Requests offered over the whole trace."""
        return sum(self.invocations_per_min)

    def to_csv(self) -> str:
        """The file form of the trace."""
        out = io.StringIO()
        for line in self.description.splitlines():
            out.write(f"# {line}\n".replace("# \n", "#\n"))
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(HEADER)
        for index, value in enumerate(self.invocations_per_min):
            moment = self.start + dt.timedelta(minutes=index)
            writer.writerow((moment.isoformat(), f"{value:.1f}"))
        return out.getvalue()


def load_trace(path: Path) -> Trace:
    """Read a trace file; ValueError names the file, the line and what is accepted."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror})") from None
    description: list[str] = []
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            description.append(line[2:] if line.startswith("# ") else line[1:])
        elif line.strip():
            rows.append((number, next(csv.reader([line]))))
    if not rows or tuple(rows[0][1]) != HEADER:
        raise ValueError(f"{path}: the first non-comment line must be {','.join(HEADER)}")
    start: dt.datetime | None = None
    values: list[float] = []
    for number, row in rows[1:]:
        if len(row) != 2:
            raise ValueError(f"{path}:{number}: expected 2 columns, got {len(row)}")
        try:
            moment = dt.datetime.fromisoformat(row[0])
            value = float(row[1])
        except ValueError:
            raise ValueError(f"{path}:{number}: {row!r}; accepted: an ISO time with offset and "
                             "a number") from None
        if moment.tzinfo is None:
            raise ValueError(f"{path}:{number}: {row[0]} has no UTC offset")
        if start is None:
            start = moment
        elif moment != start + dt.timedelta(minutes=len(values)):
            raise ValueError(f"{path}:{number}: {row[0]} is not the minute after the previous "
                             "row; accepted: one row per consecutive minute")
        values.append(value)
    if start is None:
        raise ValueError(f"{path}: no rows")
    try:
        return Trace(name=path.stem, description="\n".join(description), start=start,
                     invocations_per_min=tuple(values))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _piecewise(points: Sequence[tuple[float, float]], hour: float) -> float:
    """Linear interpolation through ``(hour, value)`` points."""
    for (h0, v0), (h1, v1) in itertools.pairwise(points):
        if h0 <= hour <= h1:
            return v0 + (v1 - v0) * (hour - h0) / (h1 - h0)
    raise ValueError(f"hour {hour} outside the curve")


def release_multiplier(hour: float, *, release: float, peak: float, rise_min: float,
                       hold_min: float, fall_min: float) -> float:
    """1 before ``release``, rising linearly to ``peak`` over ``rise_min``, holding, falling."""
    minutes = (hour - release) * 60
    if minutes < 0:
        return 1.0
    if minutes < rise_min:
        return 1 + (peak - 1) * minutes / rise_min
    if minutes < rise_min + hold_min:
        return peak
    if minutes < rise_min + hold_min + fall_min:
        return peak - (peak - 1) * (minutes - rise_min - hold_min) / fall_min
    return 1.0


def one_piece_trace() -> Trace:
    """Seed 001 story 7: One Piece chapter 1,100, 3× in 15 minutes from 20:00 JST."""
    start = dt.datetime(2026, 12, 6, 17, 0, tzinfo=JST)
    base = [(17.0, 560.0), (20.0, 600.0), (22.0, 600.0), (24.0, 520.0)]
    values = []
    for minute in range(7 * 60):
        hour = 17 + minute / 60
        spike = release_multiplier(hour, release=20.0, peak=3.0, rise_min=15, hold_min=30,
                                   fall_min=60)
        values.append(round(_piecewise(base, hour) * spike, 1))
    return Trace(
        name="one-piece",
        description=(
            "One Piece chapter 1,100 release, Sunday 2026-12-06 17:00-24:00 JST (seed 001, "
            "story 7).\nInvocations per minute on the LLM endpoint: evening base ~600/min, "
            "3x within 15 min of the 20:00 release,\nheld 30 min, back to base over 60 min. "
            "Generated by tools/scaling_sim/traces.py."),
        start=start, invocations_per_min=tuple(values))


def weekday_trace() -> Trace:
    """A Wednesday: off-peak trough, business hours, the Shonen Magazine release at 18:00."""
    start = dt.datetime(2026, 12, 9, 0, 0, tzinfo=JST)
    base = [(0.0, 780.0), (1.0, 680.0), (2.0, 560.0), (3.0, 500.0), (5.0, 480.0), (6.0, 520.0),
            (7.0, 620.0), (8.0, 700.0), (10.0, 760.0), (12.0, 900.0), (13.0, 850.0),
            (15.0, 760.0), (17.0, 720.0), (19.0, 800.0), (21.0, 850.0), (22.0, 820.0),
            (23.0, 760.0), (24.0, 700.0)]
    values = []
    for minute in range(24 * 60):
        hour = minute / 60
        bump = release_multiplier(hour, release=18.0, peak=1.8, rise_min=15, hold_min=45,
                                  fall_min=60)
        values.append(round(_piecewise(base, hour) * bump, 1))
    return Trace(
        name="weekday",
        description=(
            "A Wednesday on the LLM endpoint, 2026-12-09 00:00-24:00 JST.\nOff-peak trough "
            "~500/min from 03:00 to 05:00 (seed 001, story 4), business-hours day up to "
            "900/min,\nShonen Magazine release at 18:00: x1.8 within 15 min, held 45 min, back "
            "over 60 min.\nGenerated by tools/scaling_sim/traces.py."),
        start=start, invocations_per_min=tuple(values))


SHIPPED_TRACES = {"one-piece": one_piece_trace, "weekday": weekday_trace}


def main() -> None:
    """Rewrite the shipped trace files."""
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    for name, build in SHIPPED_TRACES.items():
        path = TRACE_DIR / f"{name}.csv"
        path.write_text(build().to_csv(), encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
