"""``python -m tools.capacity``: the plan an environment gets, and the estimate it reproduces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capacity_model import LlmCapacity, parse_decode_table
from stacks.settings import REPO_ROOT, load_environment, load_settings
from tools.capacity.cli import main


def test_plan_prints_every_derived_number(capsys: pytest.CaptureFixture[str],
                                          prod_capacity: LlmCapacity) -> None:
    assert main(["plan", "--env", "prod"]) == 0
    out = capsys.readouterr().out
    capacity = prod_capacity
    fleet = capacity.fleet
    for fragment in (
        "Gateway admission caps per instance (GATEWAY_BUCKET_CAPS)",
        f"sustainable                   {capacity.instance.sustainable_invocations_per_min:,.1f}",
        f"target tracking               {fleet.target_invocations_per_instance_per_min:,.1f}",
        f"min {fleet.off_peak.min_capacity}, max {fleet.off_peak.max_capacity}",
        "Long conversations per GPU (30 turns × 100 tokens",
        "is an assumption (not measured)",
        "prefill 2,239 / 3,611 / 4,012 tokens/s",
        f"counted                       {capacity.reuse.history_reuse:.1%}",
        f"session TTL                   {capacity.reuse.session_ttl_s} s",
        f"XL {capacity.instance.latency_of('XL').time_to_first_token_p50_ms:,.0f} / "
        f"{capacity.instance.latency_of('XL').time_to_first_token_p99_ms:,.0f} ms",
        "tails from                    simulated: the mix's own buckets",
        "Across the ranges (config/decode_speed.json: LoRA step-time factor",
        "LoRA step × 1.31 (high)",
        "decode efficiency 0.29 (low)",
        "Seed 001's final fleet",
        f"{capacity.conversation_load.in_flight} turn",
        "in flight within the SLOs",
        "Seed 001's criteria, as written",
        "update-cost-allocation-tags-status --cost-allocation-tags-status "
        "TagKey=Environment,Status=Active TagKey=Owner,Status=Active",
    ):
        assert fragment in out, fragment


def test_pools_prints_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pools", "--env", "prod"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| option | pools")
    assert "| one pool (as configured) | all on ml.g5.xlarge:" in out
    assert "| one pool on ml.g6e.xlarge | all on ml.g6e.xlarge:" in out


def test_plan_as_json_carries_the_gateway_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--env", "dev", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    capacity = load_environment("dev").plans.llm_capacity
    assert data["gateway_environment"]["GATEWAY_BUCKET_CAPS"] == (
        capacity.instance.gateway_bucket_caps())
    assert data["fleet"]["target_invocations_per_instance_per_min"] == (
        capacity.fleet.target_invocations_per_instance_per_min)


@pytest.mark.parametrize("instance", ["ml.g5.xlarge", "ml.g6e.xlarge"])
def test_estimate_reproduces_the_shipped_profile(instance: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped estimates (A10G, L40S) are exactly what ``estimate`` prints from the table's
    central rates — and from the same rates given as flags."""
    table = parse_decode_table((REPO_ROOT / "config" / "decode_speed.json").read_text())
    plan = load_settings("prod").llm.memory_plan(instance=instance)
    shipped = table.lookup(plan.gpu_model, plan.model_name, plan.quantization, "auto")
    inputs = shipped.estimated_from
    shape = ["--prompt-tokens", str(int(inputs["prompt_tokens"])),
             "--output-tokens", str(int(inputs["output_tokens"])),
             "--batch-sizes", ",".join(str(p.batch_size) for p in shipped.points)]
    assert main(["estimate", "--env", "prod", "--instance", instance, *shape]) == 0
    assert json.loads(capsys.readouterr().out) == shipped.to_dict()
    flags = [f"--{name.replace('_', '-')}" for name in (
        "memory_bandwidth_gb_s", "bandwidth_efficiency", "prefill_tokens_per_s",
        "decode_compute_tokens_per_s")]
    given = [item for flag in flags for item in (
        flag, str(inputs[flag[2:].replace("-", "_")]))]
    assert main(["estimate", "--env", "prod", "--instance", instance, *given, *shape]) == 0
    assert json.loads(capsys.readouterr().out) == shipped.to_dict()


def test_estimate_takes_the_scenario_from_the_rates(capsys: pytest.CaptureFixture[str]) -> None:
    table = parse_decode_table((REPO_ROOT / "config" / "decode_speed.json").read_text())
    rates = table.rates_for("NVIDIA A10G", "llama-3-8b-instruct", "w4a16 int4 g128")
    assert main(["estimate", "--env", "prod", "--scenario", "pessimistic", "--prompt-tokens",
                 "900", "--output-tokens", "190", "--batch-sizes", "1"]) == 0
    used = json.loads(capsys.readouterr().out)["estimated_from"]
    assert used["prefill_tokens_per_s"] == round(rates.prefill_tokens_per_s("pessimistic"), 1)
    assert used["bandwidth_efficiency"] == rates.bandwidth_efficiency.low


def test_estimate_writes_into_a_copy_of_the_table(tmp_path: Path) -> None:
    """``--write`` replaces the profile of the same key; run in a scratch copy of the repo's
    config so the real table is untouched."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "config", copy / "config")
    script = ("import sys; import stacks.settings as s; from pathlib import Path; "
              f"s.REPO_ROOT = Path({str(copy)!r}); s.CONFIG_DIR = s.REPO_ROOT / 'config'; "
              "from tools.capacity.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run(
        [sys.executable, "-c", script, "estimate", "--env", "dev", "--kv-cache-dtype",
         "fp8_e5m2", "--memory-bandwidth-gb-s", "600", "--prefill-tokens-per-s", "3000",
         "--prompt-tokens", "800", "--output-tokens", "150", "--batch-sizes", "1,8,64",
         "--write"], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "wrote decode profile NVIDIA A10G / llama-3-8b-instruct / w4a16 int4 g128 / kv " \
           "fp8_e5m2 (3 points, assumption)" in result.stderr
    written = parse_decode_table((copy / "config" / "decode_speed.json").read_text())
    fp8 = written.lookup("NVIDIA A10G", "llama-3-8b-instruct", "w4a16 int4 g128", "fp8_e5m2")
    assert [p.batch_size for p in fp8.points] == [1, 8, 64]
    assert fp8.estimated_from["prefill_tokens_per_s"] == 3000
    assert len(written.profiles) == 3  # replaced, not added
    assert written.rates == parse_decode_table(
        (REPO_ROOT / "config" / "decode_speed.json").read_text()).rates  # kept


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["estimate", "--env", "prod", "--memory-bandwidth-gb-s", "-5",
              "--prefill-tokens-per-s", "1", "--prompt-tokens", "1", "--output-tokens", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "'-5' must be above 0" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--env", "staging"]) == 2
    assert "no such environment file" in capsys.readouterr().err
