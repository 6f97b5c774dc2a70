"""How many long manga conversations one GPU serves at once, and what would raise it.

Seed 001 asks for at least 60 concurrent conversations per GPU (story 1) and 30+ turns within
the SLA (story 5). A 30-turn conversation with retrieved context fills the gateway's whole window
(the system prompt, the retrieved context and the newest turns up to their shares, plus the
default ``max_tokens``), and at its end it holds all of it in the KV pool. This module counts
such conversations per GPU for the configuration as it is and for the three levers the issue
names, alone and together:

* **an 8-bit KV cache** — half the bytes per token, so twice the tokens in the same pool. On an
  A10G (Ampere, sm86) only ``fp8_e5m2`` is usable: vLLM's FlashAttention takes an fp8 KV cache
  only on Hopper/Blackwell (``flash_attn_supports_kv_cache_dtype`` in
  ``vllm/v1/attention/backends/fa_utils.py``), so the engine falls back to FlashInfer or Triton
  attention (``vllm/platforms/cuda.py``), and Triton has no e4m3 type before sm89 ("type fp8e4nv
  not supported in this architecture", vllm-project/vllm#26431, open);
* **a shorter default** ``max_tokens`` — the output share of the window halved;
* **a smaller window** — the history share halved (fewer turns kept, more behind the truncation
  marker);

and, when even all three together fall short, the cheapest single-GPU instance of the catalog
whose KV pool holds the wanted number with nothing else changed. Each option carries its cost in
quality, latency or money, so docs/capacity.md can say what 60 would take.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from capacity_model.decode_speed import DecodeSpeedTable, DecodeTableError
from capacity_model.demand import (
    ContextWindow,
    Conversation,
    ConversationRequest,
    RequestMix,
    size_conversation,
)
from gpu_budget import INSTANCE_CATALOG, BudgetError, MemoryPlan
from gpu_budget.lengths import blocks_for_tokens
from request_buckets import bucket_bounds

AMPERE_FP8_KV = "fp8_e5m2"
"""The 8-bit KV dtype an sm86 GPU can run in vLLM (see the module docstring)."""


@dataclass(frozen=True)
class ConversationOption:
    """One configuration and how many conversations it holds per GPU."""

    name: str
    instance_type: str
    usd_per_hour: float
    kv_cache_dtype: str
    window: ContextWindow
    request: ConversationRequest
    kv_pool_tokens: int
    concurrent: int
    limited_by: str
    time_per_output_token_p50_ms: float | None
    costs: tuple[str, ...]

    def meets(self, wanted: int) -> bool:
        """Whether it holds at least ``wanted`` conversations."""
        return self.concurrent >= wanted


def _concurrent(plan: MemoryPlan, request: ConversationRequest,
                watermark: float) -> tuple[int, str]:
    admissible = math.floor(watermark * plan.kv_pool_blocks)
    by_kv = admissible // blocks_for_tokens(request.reserved_tokens, plan.block_size)
    if by_kv <= plan.max_num_seqs:
        return by_kv, "KV pool"
    return plan.max_num_seqs, "max_num_seqs"


def _tpot(table: DecodeSpeedTable, plan: MemoryPlan, batch: int) -> tuple[float | None, str]:
    try:
        profile = table.lookup(plan.gpu_model, plan.model_name, plan.quantization,
                               plan.kv_cache_dtype)
    except DecodeTableError:
        return None, "no decode profile"
    if batch > profile.max_batch_size:
        return None, f"the decode profile ends at batch {profile.max_batch_size}"
    return profile.at(batch).tpot.p50_ms, profile.status


def conversation_options(
    *,
    plan: MemoryPlan,
    replan: Callable[..., MemoryPlan],
    conversation: Conversation,
    window: ContextWindow,
    mix: RequestMix,
    table: DecodeSpeedTable,
    admission_watermark: float,
    wanted: int,
) -> tuple[ConversationOption, ...]:
    """The configuration as it is, each lever alone, all of them together, and (when those fall
    short of ``wanted``) the cheapest larger GPU that holds ``wanted`` as configured.

    ``replan(kv_cache_dtype=..., instance=...)`` is the GPU budget's plan for the same settings
    with another KV dtype or instance type (either may be omitted).
    """
    bounds = bucket_bounds(plan.max_model_len)
    shorter_output = replace(window, output=window.output / 2)
    smaller_history = replace(window, history=window.history / 2)
    both_windows = replace(window, output=window.output / 2, history=window.history / 2)
    base_request = size_conversation(conversation, window, bounds)
    fp8 = plan.kv_cache_dtype.startswith("fp8")
    eight_bit = plan if fp8 else replan(kv_cache_dtype=AMPERE_FP8_KV)
    longest_answer = max(d.output_tokens for d in mix.demands)

    def costs_of(option_window: ContextWindow, option_plan: MemoryPlan,
                 request: ConversationRequest) -> tuple[str, ...]:
        notes: list[str] = []
        if option_plan.instance_type != plan.instance_type:
            price = INSTANCE_CATALOG[option_plan.instance_type].on_demand_usd_per_hour
            base = INSTANCE_CATALOG[plan.instance_type].on_demand_usd_per_hour
            notes.append(f"{option_plan.instance_type} ({option_plan.gpu_model}) at "
                         f"${price:,.3f}/h instead of ${base:,.3f}/h ({price / base:.2f}×)")
        if option_plan.kv_cache_dtype != plan.kv_cache_dtype:
            notes.append(f"{option_plan.kv_cache_dtype} KV (2 mantissa bits instead of bf16's "
                         "7): re-run the quality gate (ja and en >= 4.0) before serving it; on "
                         "sm86 attention leaves FlashAttention for FlashInfer/Triton")
        if option_window.output != window.output:
            cut = request.max_tokens
            notes.append(f"answers stop at {cut} tokens (finish_reason length) instead of "
                         f"{base_request.max_tokens}; the mix's longest typical answer is "
                         f"{longest_answer} tokens")
        if option_window.history != window.history:
            notes.append(f"{request.turns_kept} of {conversation.turns} turns kept instead of "
                         f"{base_request.turns_kept} (the rest behind the truncation marker)")
        return tuple(notes)

    candidates = (
        ("as configured", plan, window),
        (f"{AMPERE_FP8_KV} KV cache", eight_bit, window),
        ("max_tokens halved", plan, shorter_output),
        ("history halved", plan, smaller_history),
        (f"{AMPERE_FP8_KV} + max_tokens and history halved", eight_bit, both_windows),
    )
    options: list[ConversationOption] = []
    for name, option_plan, option_window in (*candidates, *_larger_gpu(
            plan, replan, size_conversation(conversation, window, bounds), window,
            admission_watermark, wanted)):
        request = size_conversation(conversation, option_window, bounds)
        concurrent, limited_by = _concurrent(option_plan, request, admission_watermark)
        tpot, status = _tpot(table, option_plan, concurrent)
        costs = list(costs_of(option_window, option_plan, request))
        if tpot is not None:
            costs.append(f"TPOT p50 {tpot:.0f} ms at {concurrent} in flight ({status})")
        else:
            costs.append(f"TPOT unknown: {status} (kv {option_plan.kv_cache_dtype})")
        options.append(ConversationOption(
            name=name, instance_type=option_plan.instance_type,
            usd_per_hour=INSTANCE_CATALOG[option_plan.instance_type].on_demand_usd_per_hour,
            kv_cache_dtype=option_plan.kv_cache_dtype, window=option_window,
            request=request, kv_pool_tokens=option_plan.kv_pool_tokens, concurrent=concurrent,
            limited_by=limited_by, time_per_output_token_p50_ms=tpot, costs=tuple(costs)))
    return tuple(options)


def _larger_gpu(plan: MemoryPlan, replan: Callable[..., MemoryPlan],
                request: ConversationRequest, window: ContextWindow, watermark: float,
                wanted: int) -> list[tuple[str, MemoryPlan, ContextWindow]]:
    """The cheapest single-GPU catalog instance with more GPU memory that holds ``wanted``
    conversations as configured (empty when the current one already does, or none does)."""
    if _concurrent(plan, request, watermark)[0] >= wanted:
        return []
    current = INSTANCE_CATALOG[plan.instance_type]
    candidates = sorted(
        (inst for inst in INSTANCE_CATALOG.values()
         if inst.accelerator_kind == "gpu" and inst.gpu_count == 1
         and inst.memory_per_accelerator_bytes > current.memory_per_accelerator_bytes),
        key=lambda inst: inst.on_demand_usd_per_hour)
    for inst in candidates:
        try:
            bigger = replan(instance=inst.name)
        except BudgetError:
            continue
        if _concurrent(bigger, request, watermark)[0] >= wanted:
            return [(f"{inst.name} ({inst.accelerator_model})", bigger, window)]
    return []
