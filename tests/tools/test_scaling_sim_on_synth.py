"""The scaling simulator on the policies as this app synthesizes them for production."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_release_calendar_absorbs_the_one_piece_spike(synthesized, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    template = synthesized.template_paths["Prod/Serving"]
    targets = [k for k, r in synthesized.template("Prod/Serving")["Resources"].items()
               if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
               and "-llm/" in r["Properties"]["ResourceId"]]
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "tools.scaling_sim", "--template", str(template),
         "--scalable-target", targets[0], "--trace",
         str(REPO_ROOT / "tools/scaling_sim/traces/one-piece.csv"),
         "--provisioning-delay-min", "5", "8", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = {(f["scenario"], f["provisioning_delay_s"]): f for f in json.loads(out.read_text())}
    for delay_s in (300, 480):
        with_calendar = figures[("with calendar", delay_s)]
        without = figures[("without calendar", delay_s)]
        assert with_calendar["dropped"] == 0
        assert with_calendar["seconds_over_capacity"] == 0
        assert without["dropped"] > 0, "the reactive policies alone lag the spike"
        # The calendar buys zero drops with pre-provisioned capacity: more instance-hours.
        assert with_calendar["instance_hours"] > without["instance_hours"]
