"""The GPUs' rates: each a sourced range, the prefill rate derived from the tensor peak, the
model's FLOPs and an efficiency — and the shipped figures recomputed from their inputs."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from capacity_model import LlmCapacity, parse_decode_table
from capacity_model.decode_speed import DecodeTableError
from capacity_model.rates import RateRange, RatesError
from gpu_budget.model_spec import load_model_spec
from stacks.settings import REPO_ROOT, load_settings

SHIPPED = REPO_ROOT / "config" / "decode_speed.json"


def shipped() -> dict[str, Any]:
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def test_a_scenario_takes_one_end_of_every_range() -> None:
    rates = RateRange(1, 2, 3)
    assert [rates.pick(s) for s in ("pessimistic", "central", "optimistic")] == [1, 2, 3]
    with pytest.raises(RatesError, match="accepted: low <= central <= high"):
        RateRange(2, 1, 3)
    with pytest.raises(RatesError, match="scenario 'median'"):
        rates.pick("median")  # type: ignore[arg-type]


def test_the_a10gs_prefill_rate_is_its_tensor_peak_at_the_stated_efficiency() -> None:
    """70 TFLOPS × 0.72 ÷ (2 × 6,979,321,856 FLOPs) = 3,611 prompt tokens a second: llmperf's
    FP16 run (>= 4,000 a second, 80 % of the peak) less Marlin's ~10 % at prefill; the range
    spans 2,239 (62.5 TFLOPS × 0.5) to 4,012 (the FP16 figure itself)."""
    table = parse_decode_table(SHIPPED.read_text(encoding="utf-8"))
    plan = load_settings("prod").llm.memory_plan()
    rates = table.rates_for(plan.gpu_model, plan.model_name, plan.quantization)
    assert rates.prefill_tokens_per_s() == pytest.approx(70e12 * 0.72 / 13_958_643_712)
    assert [round(rates.prefill_tokens_per_s(s)) for s in
            ("pessimistic", "central", "optimistic")] == [2239, 3611, 4012]
    assert rates.prefill_tokens_per_s("optimistic") == pytest.approx(4000, rel=0.01)
    assert rates.status == "assumption"
    assert all(any(source in text for text in rates.sources) for source in (
        "baseten.co", "johnmusgrave.com", "arXiv:2408.11743", "llm-price-compass/issues/6",
        "Llama 3 8b Instruct on NVIDIA A10G", "137.29 ms"))


def test_the_flops_per_token_are_the_models_linear_layers() -> None:
    spec = load_model_spec(REPO_ROOT / "config" / "models" / "llama-3-8b-instruct.json")
    output_projection = spec.embedding_parameters // 2  # untied: embedding + lm_head
    for entry in parse_decode_table(SHIPPED.read_text(encoding="utf-8")).rates:
        assert entry.prefill_flops_per_token == 2 * spec.linear_parameters
        assert entry.decode_flops_per_token == 2 * (spec.linear_parameters + output_projection)


def test_every_gpu_the_model_prices_has_rates() -> None:
    """The production A10G and the L40S the conversation options and the pool evaluation
    price."""
    table = parse_decode_table(SHIPPED.read_text(encoding="utf-8"))
    settings = load_settings("prod").llm
    for instance in ("ml.g5.xlarge", "ml.g6e.xlarge"):
        plan = settings.memory_plan(instance=instance)
        assert table.rates_for(plan.gpu_model, plan.model_name, plan.quantization)
        assert table.lookup(plan.gpu_model, plan.model_name, plan.quantization, "auto")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.pop("sources"), "missing ['sources']"),
    (lambda r: r.update(sources=[]), "sources: accepted: a non-empty list"),
    (lambda r: r.update(status="guess"), "status: 'guess'; accepted: assumption, measured"),
    (lambda r: r["compute_efficiency"].update(high=1.2),
     "compute_efficiency.high: 1.2; accepted: at most 1"),
    (lambda r: r["bandwidth_efficiency"].update(low=0.9),
     "bandwidth_efficiency: range low 0.9 / central 0.77"),
    (lambda r: r.update(memory_bandwidth_gb_s=0), "memory_bandwidth_gb_s: 0; accepted"),
    (lambda r: r.update(tensor_peak_tflops=[1, 2, 3]), "accepted: an object with low"),
])
def test_bad_rates_name_the_field(edit: Any, message: str) -> None:
    document = copy.deepcopy(shipped())
    edit(document["rates"][0])
    with pytest.raises(DecodeTableError) as info:
        parse_decode_table(json.dumps(document), source="t.json")
    assert "t.json.rates[0]" in str(info.value) and message in str(info.value)


def test_rates_round_trip_and_are_unique() -> None:
    table = parse_decode_table(SHIPPED.read_text(encoding="utf-8"))
    assert parse_decode_table(table.to_json()).rates == table.rates
    document = shipped()
    document["rates"].append(document["rates"][0])
    with pytest.raises(DecodeTableError, match="two rates entries for NVIDIA A10G"):
        parse_decode_table(json.dumps(document))
    with pytest.raises(DecodeTableError, match="no rates for NVIDIA L4 "):
        table.rates_for("NVIDIA L4", "llama-3-8b-instruct", "w4a16 int4 g128")


def test_lora_and_decode_efficiency_have_their_own_ranges(prod: LlmCapacity) -> None:
    """The table's A10G entry carries a LoRA step factor (>= 1, the pessimistic scenario at the
    slow end) and a decode efficiency of its own; both enter the roofline's step."""
    from capacity_model.latency import RequestShape, roofline_inputs
    from capacity_model.roofline import step_seconds
    capacity = prod
    rates = capacity.rates
    assert rates is not None and rates.lora_step_factor and rates.decode_compute_efficiency
    assert rates.lora_factor("pessimistic") == rates.lora_step_factor.high > 1
    assert rates.lora_factor("optimistic") == rates.lora_step_factor.low >= 1
    assert (rates.decode_compute_tokens_per_s("pessimistic")
            < rates.decode_compute_tokens_per_s("central"))
    shape = RequestShape(900.0, 0.0, 190.0)
    plan = capacity.memory_plan
    with_lora = roofline_inputs(rates, "central", plan, shape, ttft_p99_over_p50=1.0,
                                tpot_p99_over_p50=1.0)
    without = roofline_inputs(rates, "central", plan, shape, ttft_p99_over_p50=1.0,
                              tpot_p99_over_p50=1.0, lora_step_factor=1.0)
    assert with_lora.lora_step_factor == rates.lora_factor("central")
    assert step_seconds(with_lora, 40) == pytest.approx(
        step_seconds(without, 40) * with_lora.lora_step_factor)


def test_a_lora_factor_below_one_names_the_field() -> None:
    import json

    from capacity_model.rates import RatesError, parse_rates

    entry = json.loads((REPO_ROOT / "config" / "decode_speed.json").read_text())["rates"][0]
    entry["lora_step_factor"] = {"low": 0.9, "central": 1.1, "high": 1.2}
    with pytest.raises(RatesError, match=r"lora_step_factor\.low: 0\.9"):
        parse_rates(entry, "rates[0]")
