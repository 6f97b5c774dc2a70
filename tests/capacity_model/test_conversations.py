"""Seed 001's "60 conversations per GPU": what prod holds and what each lever would give."""

from __future__ import annotations

import math

from capacity_model import AMPERE_FP8_KV, LlmCapacity, conversation_options
from gpu_budget import INSTANCE_CATALOG
from stacks.settings import load_settings


def by_name(capacity: LlmCapacity) -> dict[str, object]:
    return {option.name: option for option in capacity.conversation_options}


def test_as_configured_a_thirty_turn_chat_reserves_the_window_and_the_pool_holds_22(
    prod: LlmCapacity,
) -> None:
    option = prod.configured_conversations
    plan = prod.memory_plan
    # 512 system + 1,024 retrieved + 18 earlier turns and the question (1,900 of the 2,028
    # tokens beside them and the marker) + 512 max_tokens: the request before a step.
    assert option.request.reserved_tokens == 3948
    blocks = math.ceil(3948 / plan.block_size)
    assert option.concurrent == math.floor(0.9 * plan.kv_pool_blocks) // blocks == 22
    assert not option.meets(60)
    assert option.limited_by == "KV pool"


def test_each_lever_alone_and_together_and_what_it_costs(prod: LlmCapacity) -> None:
    options = {o.name: o for o in prod.conversation_options}
    base = options["as configured"]
    eight_bit = options[f"{AMPERE_FP8_KV} KV cache"]
    assert eight_bit.kv_cache_dtype == AMPERE_FP8_KV
    assert eight_bit.kv_pool_tokens > 1.9 * base.kv_pool_tokens  # half the bytes per token
    assert 2 * base.concurrent - 1 <= eight_bit.concurrent <= 2 * base.concurrent
    assert any("re-run the quality gate" in c for c in eight_bit.costs)
    shorter = options["max_tokens halved"]
    assert shorter.request.max_tokens == base.request.max_tokens // 2
    assert any("answers stop at 256 tokens" in c for c in shorter.costs)
    smaller = options["history halved"]
    assert smaller.request.turns_kept < base.request.turns_kept
    assert any(f"{smaller.request.turns_kept} of 30 turns kept" in c for c in smaller.costs)
    together = options[f"{AMPERE_FP8_KV} + max_tokens and history halved"]
    assert together.concurrent > max(o.concurrent for o in (eight_bit, shorter, smaller))
    # Every option says what its latency is at that batch (from the decode-speed table).
    assert all(o.time_per_output_token_p50_ms is not None
               for o in (base, eight_bit, shorter, smaller, together))
    assert together.time_per_output_token_p50_ms > base.time_per_output_token_p50_ms


def test_when_the_levers_fall_short_the_cheapest_larger_gpu_that_holds_60_is_named(
    prod: LlmCapacity,
) -> None:
    options = list(prod.conversation_options)
    if all(not o.meets(60) for o in options[:5]):
        bigger = options[5]
        assert bigger.meets(60)
        assert bigger.window == prod.window and bigger.kv_cache_dtype == "auto"
        price = INSTANCE_CATALOG[bigger.instance_type].on_demand_usd_per_hour
        blocks = math.ceil(bigger.request.reserved_tokens / prod.memory_plan.block_size)
        settings = load_settings("prod").llm
        cheaper_holding = []
        for inst in INSTANCE_CATALOG.values():
            if not (inst.accelerator_kind == "gpu" and inst.gpu_count == 1
                    and inst.on_demand_usd_per_hour < price
                    and inst.memory_per_accelerator_bytes > INSTANCE_CATALOG[
                        "ml.g5.xlarge"].memory_per_accelerator_bytes):
                continue
            plan = settings.memory_plan(instance=inst.name)
            if min(math.floor(0.9 * plan.kv_pool_blocks) // blocks, plan.max_num_seqs) >= 60:
                cheaper_holding.append(inst.name)
        assert cheaper_holding == [], "the cheapest larger single-GPU instance is named"
        assert any(f"${price:,.3f}/h instead of $1.901/h" in c for c in bigger.costs)


def test_no_larger_gpu_is_offered_when_the_configuration_already_meets_the_wish(
    prod: LlmCapacity,
) -> None:
    settings = load_settings("prod").llm
    options = conversation_options(
        plan=prod.memory_plan, replan=settings.memory_plan, conversation=prod.conversation,
        window=prod.window, mix=prod.mix, table=settings.decode_speed_table(),
        admission_watermark=0.9, wanted=20)
    assert [o.name for o in options][-1] == f"{AMPERE_FP8_KV} + max_tokens and history halved"
    assert options[0].meets(20)
