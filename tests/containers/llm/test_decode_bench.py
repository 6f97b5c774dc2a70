"""tools/decode_bench.py against the real gateway (simulated engine) on a real socket.

The benchmark ``tools/gpu_smoke.sh`` runs on a GPU is exercised here end to end: the
simulated engine takes ``SIM_STEP_TIME_S`` per step plus ``SIM_TOKEN_TIME_S`` per
batched token, so the measured time per output token is at least the step time and grows with
the batch, and the profile written back is one the capacity model reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from capacity_model import parse_decode_table
from stacks.settings import REPO_ROOT
from tests.containers.llm.harness import GatewayProcess
from tools.decode_bench import main, percentile

KEY = "Test GPU|demo-model|bf16|auto"


def test_measures_ttft_and_tpot_by_batch_and_writes_the_profile_back(
        start_gateway: Any, tmp_path: Path) -> None:
    gateway: GatewayProcess = start_gateway({
        "SIM_STEP_TIME_S": "0.01", "SIM_TOKEN_TIME_S": "0.0005",
        "SIM_EOS_PROBABILITY": "0",
    })
    gateway.wait_ready()
    table = tmp_path / "decode_speed.json"
    shutil.copy(REPO_ROOT / "config" / "decode_speed.json", table)
    before = parse_decode_table(table.read_text())
    assert main(["--url", gateway.url, "--key", KEY, "--batch-sizes", "1,6", "--rounds", "2",
                 "--prompt-tokens", "120", "--output-tokens", "20", "--write", str(table)]) == 0
    after = parse_decode_table(table.read_text())
    assert len(after.profiles) == len(before.profiles) + 1  # the estimates are kept
    profile = after.lookup("Test GPU", "demo-model", "bf16", "auto")
    assert profile.status == "measured"
    assert (profile.prompt_tokens, profile.output_tokens) == (120, 20)
    one, six = profile.points
    assert (one.batch_size, six.batch_size) == (1, 6)
    assert one.tpot.p50_ms >= 10  # never faster than an engine step
    assert six.tpot.p50_ms > one.tpot.p50_ms  # six sequences make each step longer
    assert one.ttft.p99_ms >= one.ttft.p50_ms > 0
    assert "measured" in one.source and "tools/decode_bench.py" in one.source
    assert "through the gateway" in one.source  # the default target


def test_the_source_names_the_server_it_measured(
        start_gateway: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at something else, the profile must not claim "through the gateway"."""
    gateway: GatewayProcess = start_gateway({"SIM_STEP_TIME_S": "0.005",
                                             "SIM_EOS_PROBABILITY": "0"})
    gateway.wait_ready()
    assert main(["--url", gateway.url, "--key", KEY, "--batch-sizes", "1", "--rounds", "1",
                 "--prompt-tokens", "60", "--output-tokens", "4",
                 "--target", "a test server"]) == 0
    printed = json.loads(capsys.readouterr().out)
    source = printed["points"][0]["source"]
    assert "through a test server" in source and "gateway" not in source


def test_a_bad_key_or_an_unreachable_gateway_fail_cleanly(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--url", "http://127.0.0.1:9", "--key", "only-two|parts"])
    assert info.value.code == 2
    assert main(["--url", "http://127.0.0.1:9", "--key", KEY, "--batch-sizes", "1",
                 "--timeout-s", "2"]) == 1


def test_nearest_rank_percentiles() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7.0], 0.99) == 7.0
