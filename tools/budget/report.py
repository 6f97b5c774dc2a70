"""Human-readable text for a plan and a static-vs-paged comparison (pure string building)."""

from __future__ import annotations

from gpu_budget.instances import GIB, MIB
from gpu_budget.planner import MemoryPlan
from gpu_budget.static_paged import StaticVsPaged


def _row(label: str, n_bytes: int, total: int | None = None) -> str:
    share = f"{100 * n_bytes / total:8.1f} %" if total else ""
    return f"  {label:<48}{n_bytes / GIB:>8.2f}{share}"


def format_plan(plan: MemoryPlan) -> str:
    """A multi-line table of the plan, its engine arguments and its warnings."""
    total = plan.gpu_memory_bytes
    lines = [
        f"GPU memory plan: {plan.model_name} ({plan.parameter_count / 1e9:.2f} B parameters), "
        f"{plan.quantization} -> vLLM quantization={plan.vllm_quantization}",
        f"Instance  {plan.instance_type}: {plan.gpu_count} x {plan.gpu_model} "
        f"({total / GIB:.1f} GiB, compute capability {plan.compute_capability}), "
        f"tensor_parallel_size {plan.tensor_parallel_size}",
        f"Cost      ${plan.cost_per_hour_usd:,.3f}/h, ${plan.cost_per_month_usd:,.2f}/month "
        f"({plan.price_region}, approximate, compiled {plan.prices_compiled_on})",
        "",
        f"{'Memory per GPU':<50}{'GiB':>8}{'share':>10}",
        _row("GPU total", total, total),
        _row(
            f"outside vLLM budget (1 - {plan.gpu_memory_utilization:.2f}, "
            f"{plan.gpu_memory_utilization_source})",
            plan.headroom_bytes,
            total,
        ),
        _row("static: weights", plan.weights_bytes, total),
        _row(f"static: LoRA slots ({plan.max_loras} x rank {plan.max_lora_rank})",
             plan.lora_bytes, total),
        _row("reserve: max(forward pass, sampler) + non-torch", plan.reserve_bytes, total),
        _row(f"  forward pass @ {plan.max_num_batched_tokens:,} batched tokens",
             plan.forward_activation_bytes),  # the two run at different times: the larger counts
        _row(f"  sampler @ {plan.max_num_seqs:,} sequences", plan.sampler_bytes),
        _row("  non-torch (NCCL, cuBLAS workspaces)", plan.non_torch_bytes),
        _row("dynamic: KV cache pool", plan.kv_pool_bytes, total),
        "",
        "KV cache",
        f"  bytes per token        {plan.kv_bytes_per_token:,} ({plan.kv_cache_dtype})",
        f"  block                  {plan.block_size} tokens = {plan.block_bytes / MIB:.2f} MiB",
        f"  pool                   {plan.kv_pool_blocks:,} blocks = {plan.kv_pool_tokens:,} tokens",
        "",
        "Concurrency (sequences the KV pool holds at once; effective = capped by max_num_seqs)",
        f"  at max_model_len {plan.max_model_len:,}: {plan.max_concurrency_at_max_len:,} "
        f"(effective {plan.effective_concurrency_at_max_len:,})",
    ]
    if plan.mean_request_tokens is not None:
        lines.append(
            f"  at the mean request ({plan.mean_request_tokens:,.0f} tokens): "
            f"{plan.max_concurrency_at_mean:,}"
        )
    lines.append(
        f"  largest max_model_len that fits one sequence: {plan.largest_max_model_len:,} "
        f"(model limit {plan.model_max_position_embeddings:,})"
    )
    lines.append("  bucket  tokens  blocks/seq  concurrent  effective  share")
    for bucket in plan.buckets:
        if not bucket.reachable:
            lines.append(f"  {bucket.bucket:<6}  beyond max_model_len")
            continue
        share = "" if bucket.share is None else f"{100 * bucket.share:5.1f} %"
        lines.append(
            f"  {bucket.bucket:<6}  {bucket.sized_tokens:>6,}  {bucket.blocks_per_sequence:>10,}  "
            f"{bucket.max_concurrency:>10,}  {bucket.effective_concurrency:>9,}  {share}"
        )
    lines += ["", "vLLM engine arguments"]
    for key, value in plan.engine_args().items():
        lines.append(f"  {key} = {value!r}")
    lines.append(
        f"  (max_num_seqs {plan.max_num_seqs_source}; "
        f"gpu_memory_utilization {plan.gpu_memory_utilization_source})"
    )
    if plan.warnings:
        lines += ["", "Warnings"] + [f"  - {note}" for note in plan.warnings]
    return "\n".join(lines)


def format_static_vs_paged(result: StaticVsPaged) -> str:
    """A short comparison table with its assumptions."""
    lines = [
        f"Static vs paged KV allocation ({result.request_count} requests, mean "
        f"{result.mean_request_tokens:,.0f} tokens, max_model_len {result.max_model_len:,}, "
        f"pool {result.kv_pool_tokens:,} tokens)",
        f"  {'':<24}{'reserved/request':>18}{'KV waste':>11}{'concurrent':>12}",
        f"  {'static (pre-allocate)':<24}"
        f"{result.static_reserved_tokens_per_request:>14,} tok"
        f"{100 * result.static_waste_fraction:>9.1f} %"
        f"{result.static_concurrency:>12,}",
        f"  {f'paged ({result.block_size}-token blocks)':<24}"
        f"{result.paged_reserved_tokens_per_request:>14,.1f} tok"
        f"{100 * result.paged_waste_fraction:>9.1f} %"
        f"{result.paged_concurrency:>12,}"
        f"  (effective {result.paged_effective_concurrency:,} at max_num_seqs)",
        f"  paged / static concurrency: {result.concurrency_ratio:.2f}x",
        "Assumptions",
    ]
    lines += [f"  - {item}" for item in result.assumptions]
    return "\n".join(lines)
