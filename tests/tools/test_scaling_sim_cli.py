"""``python -m tools.scaling_sim`` end to end on the fixture template and the shipped traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.scaling_sim.__main__ import main
from tools.scaling_sim.traces import TRACE_DIR

FIXTURE = Path(__file__).resolve().parent / "scaling_sim_fixtures" / "scaling.template.json"


def test_one_piece_with_and_without_the_calendar(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    figures_path = tmp_path / "figures.json"
    # The hand-written fixture predates the capacity model: its per-instance figure (the seed's
    # incident threshold, 300/min) and its price are given on the command line.
    code = main(["--template", str(FIXTURE), "--trace", str(TRACE_DIR / "one-piece.csv"),
                 "--provisioning-delay-min", "8", "--usd-per-hour", "1.90",
                 "--instance-capacity-per-min", "300",
                 "--plot-dir", str(tmp_path), "--json", str(figures_path)])
    assert code == 0
    out, err = capsys.readouterr()
    assert "| with calendar | 8 min | 0 | 0.00 |" in out
    assert "scalable target LlmScalingTarget (calendar target llm)" in err
    assert "simulating one-piece (420 min), provisioning delay 8 min" in err
    figures = {f["scenario"]: f for f in json.loads(figures_path.read_text())}
    with_calendar, without = figures["with calendar"], figures["without calendar"]
    # The dated pre-scale (12 instances from 18:00; target tracking adds one at the peak)
    # absorbs the spike; reacting does not.
    assert with_calendar["dropped"] == 0
    assert with_calendar["peak_instances"] in (12, 13)
    assert without["dropped"] > 0
    assert without["worst_minute_dropped_percent"] > 10
    assert with_calendar["instance_hours"] > without["instance_hours"]
    image = tmp_path / "scaling-one-piece.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.stat().st_size > 20_000


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--template", str(tmp_path / "missing.json"), "--usd-per-hour", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "cannot read a JSON CloudFormation template" in err
    assert len(err.strip().splitlines()) == 1


def test_a_template_without_capacity_figures_needs_them_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--template", str(FIXTURE), "--usd-per-hour", "1"]) == 2
    err = capsys.readouterr().err
    assert "carries no capacity-model figures (Metadata MangaAssist::Capacity); pass " \
           "--instance-capacity-per-min" in err
