"""``python -m tools.budget``: tables, JSON, the plot, and one-line errors with exit codes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_budget import plan
from stacks.settings import load_environment
from tools.budget.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = "config/models/llama-3-8b-instruct.json"
LLAMA_70B = "config/models/llama-3-70b-instruct.json"
README_ARGS = ["plan", "--model", str(REPO_ROOT / LLAMA_8B), "--quantization", "awq",
               "--instance", "ml.g5.xlarge", "--max-model-len", "4096"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(README_ARGS, capsys)
    assert code == 0
    assert err == ""
    assert "llama-3-8b-instruct (8.03 B parameters), awq int4 g128 -> vLLM quantization=awq_marlin" in out
    assert "ml.g5.xlarge: 1 x NVIDIA A10G (22.5 GiB, compute capability 8.6)" in out
    assert "pool                   6,628 blocks = 106,048 tokens" in out
    assert "at max_model_len 4,096: 25 (effective 25)" in out
    assert "bytes per token        131,072 (auto)" in out
    assert "quantization = 'awq_marlin'" in out
    assert "gpu_memory_utilization = 0.84" in out


def test_plan_json_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*README_ARGS, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    expected = plan(str(REPO_ROOT / LLAMA_8B), quantization="awq", instance="ml.g5.xlarge",
                    max_model_len=4096).to_dict()
    assert data == json.loads(json.dumps(expected))
    assert data["kv_bytes_per_token"] == 131_072
    assert data["weights_bytes"] == 5_727_854_592


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "plots" / "plan.png"
    code, _, err = _run([*README_ARGS, "--plot", str(target)], capsys)
    assert code == 0
    assert "plot written to" in err
    header = target.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1440, 624)  # 12 × 5.2 inches at 120 dpi
    assert target.stat().st_size > 20_000


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["plan", "--model", LLAMA_8B, "--instance", "ml.g5.xlarge", "--max-model-len", "abc"],
         "argument --max-model-len: 'abc' is not an integer"),
        (["plan", "--model", LLAMA_8B, "--instance", "ml.g5.xlarge"],
         "the following arguments are required: --max-model-len"),
        (["plan", "--model", LLAMA_8B, "--instance", "ml.g5.xlarge", "--max-model-len", "4096",
          "--quantization", "gptq"], "argument --quantization: invalid choice: 'gptq'"),
        ([*README_ARGS, "--plot", "plan.svg"], "--plot must name a .png file"),
        (["plan", "--model", "missing.json", "--instance", "ml.g5.xlarge", "--max-model-len",
          "4096"], "model config 'missing.json' does not exist"),
        (["plan", "--model", LLAMA_8B, "--instance", "ml.g9.xlarge", "--max-model-len", "4096"],
         "instance type 'ml.g9.xlarge' is not in the catalog; known: ml.g4dn.xlarge"),
        ([*README_ARGS, "--gpu-memory-utilization", "0.99"], "outside the safe range (0, 0.95]"),
        ([*README_ARGS, "--max-loras", "2", "--max-lora-rank", "12"],
         "max_lora_rank 12 is not one vLLM accepts"),
        (["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("tools.budget: error: "), err
    assert fragment in err


def test_impossible_configuration_is_refused_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["plan", "--model", str(REPO_ROOT / LLAMA_70B), "--quantization",
                           "bf16", "--instance", "ml.g5.xlarge", "--max-model-len", "4096"], capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("tools.budget: refused: llama-3-70b-instruct")
    assert "131.4 GiB per GPU" in err
    assert "Fixes: quantize to AWQ int4" in err


def test_request_lengths_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# tokens per request\n300\n1500  # a long one\n\n6000\n")
    code, out, _ = _run([*README_ARGS, "--request-lengths-file", str(lengths), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["mean_request_tokens"] == 2600.0
    assert any("1 of 3 sampled requests exceed" in w for w in data["warnings"])
    bad = tmp_path / "bad.txt"
    bad.write_text("300\nlots\n")
    code, _, err = _run([*README_ARGS, "--request-lengths-file", str(bad)], capsys)
    assert code == 2
    assert f"{bad}:2: 'lots' is not an integer token count" in err


def test_static_vs_paged(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["static-vs-paged", "--model", str(REPO_ROOT / LLAMA_8B), "--quantization", "awq",
            "--instance", "ml.g5.xlarge", "--max-model-len", "2048"]
    code, out, _ = _run(args, capsys)
    assert code == 0
    assert "static (pre-allocate)" in out
    assert "72.0 %" in out
    assert "Assumptions" in out
    code, out, _ = _run([*args, "--json"], capsys)
    data = json.loads(out)
    assert data["mean_request_tokens"] == 573.0
    assert data["static_waste_fraction"] == 0.7202
    code, out, _ = _run([*args, "--request-lengths", "100,200", "--json"], capsys)
    assert json.loads(out)["request_count"] == 2


def test_instances_listing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["instances"], capsys)
    assert code == 0
    assert "ml.g5.xlarge" in out
    assert "NVIDIA A10G" in out
    assert "0.84" in out
    code, out, _ = _run(["instances", "--json"], capsys)
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["ml.inf1.xlarge"]["neuron_cores"] == 4
    assert rows["ml.p5.48xlarge"]["compute_capability"] == "9.0"


def test_module_entry_point_and_import_purity() -> None:
    """Run the CLI as a person would, and check the package pulls in no heavy dependency."""
    result = subprocess.run(
        [sys.executable, "-m", "tools.budget", *README_ARGS[:1], "--model", LLAMA_8B,
         "--quantization", "awq", "--instance", "ml.g5.xlarge", "--max-model-len", "4096",
         "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kv_pool_tokens"] == 106_048
    probe = (
        "import sys, gpu_budget, tools.budget.cli; "
        "heavy = [m for m in ('torch', 'matplotlib', 'boto3', 'aws_cdk', 'transformers') "
        "if m in sys.modules]; print(heavy)"
    )
    imported = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60, check=True)
    assert imported.stdout.strip() == "[]"


def test_an_environment_prints_the_plan_its_endpoint_gets(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """``make budget ENV=prod``: the plan made when prod's settings loaded."""
    code, out, _ = _run(["env", "--env", "prod", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == json.loads(load_environment("prod").plans.llm_memory.to_json())
    code, _, err = _run(["env", "--env", "nowhere"], capsys)
    assert code == 2
    assert err.startswith("tools.budget: error: config/nowhere.yaml: no such environment file")
