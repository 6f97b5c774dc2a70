"""The refusal message: what did not fit, with numbers, and every fix that would (each one
planned before it is suggested, so it is known to fit)."""

from __future__ import annotations

from typing import Any

from gpu_budget.instances import INSTANCE_CATALOG, InstanceType, gpu_memory_utilization_for
from gpu_budget.memory_plan import BudgetError, MemoryPlan, gib
from gpu_budget.plan_request import PlanRequest
from gpu_budget.sizing import CapacityFailure, evaluate
from gpu_budget.weights import WeightFormat, awq, weights_bytes


def replace_request(req: PlanRequest, **changes: Any) -> PlanRequest:
    """``req`` with ``changes``: a fix to try."""
    data = {name: getattr(req, name) for name in req.__dataclass_fields__}
    data.update(changes)
    return PlanRequest(**data)


def try_plan(req: PlanRequest) -> MemoryPlan | None:
    """The plan of ``req`` if it fits, else None (a fix is only suggested once it is planned)."""
    try:
        result = evaluate(req)
    except BudgetError:
        return None
    return result if isinstance(result, MemoryPlan) else None


def power_of_two_tps(gpu_count: int) -> list[int]:
    """Tensor-parallel sizes to try on ``gpu_count`` GPUs: 1, 2, 4, ... up to it."""
    sizes, tp = [], 1
    while tp <= gpu_count:
        sizes.append(tp)
        tp *= 2
    return sizes


def total_accelerator_bytes(inst: InstanceType) -> int:
    """Accelerator memory of the whole instance."""
    return inst.accelerator_count * inst.memory_per_accelerator_bytes


def cheapest_fit(
    req: PlanRequest, fmt: WeightFormat, *, larger_only: bool
) -> tuple[InstanceType, MemoryPlan] | None:
    """Cheapest catalog GPU instance (and smallest tp) where the same request fits.

    With ``larger_only`` only instances with more GPU memory in total than the current one are
    considered. Every other setting (an explicit utilization too) is kept as requested.
    """
    current = total_accelerator_bytes(req.instance)
    candidates = sorted(
        (
            inst
            for inst in INSTANCE_CATALOG.values()
            if inst.accelerator_kind == "gpu"
            and (not larger_only or total_accelerator_bytes(inst) > current)
        ),
        key=lambda inst: inst.on_demand_usd_per_hour,
    )
    for inst in candidates:
        if inst.name == req.instance.name and fmt == req.fmt:
            continue
        for tp in power_of_two_tps(inst.gpu_count):
            fitted = try_plan(replace_request(req, instance=inst, fmt=fmt, tensor_parallel_size=tp))
            if fitted is not None:
                return inst, fitted
    return None


def quantize_fix(req: PlanRequest) -> str:
    """The 'quantize' fix with its numbers: here if AWQ fits, else the cheapest AWQ fit."""
    quantized = awq(128)
    try:
        awq_weights = weights_bytes(req.model, quantized,
                                    tensor_parallel_size=req.tensor_parallel_size)
    except ValueError:
        return "quantize to AWQ int4 (not possible at this tensor_parallel_size: group split)"
    on_same = try_plan(replace_request(req, fmt=quantized))
    if on_same is not None:
        return (
            f"quantize to AWQ int4 (weights {gib(awq_weights)} per GPU; then "
            f"{on_same.kv_pool_tokens:,} KV tokens fit here)"
        )
    cheapest = cheapest_fit(req, quantized, larger_only=False)
    where = (
        f"; the cheapest AWQ fit is {cheapest[0].name} with tensor_parallel_size "
        f"{cheapest[1].tensor_parallel_size} at ≈${cheapest[0].on_demand_usd_per_hour:,.2f}/h"
        if cheapest is not None
        else ""
    )
    return (
        f"quantize to AWQ int4 (weights {gib(awq_weights)} per GPU, not enough on its own "
        f"here{where})"
    )


def refusal_message(req: PlanRequest, failure: CapacityFailure) -> str:
    """One paragraph: what did not fit, with its numbers, then every fix that would."""
    inst = req.instance
    head = (
        f"{req.model.name} ({req.fmt.label()}, max_model_len {req.max_model_len:,}) does not fit "
        f"{inst.name} ({inst.gpu_count} × {inst.accelerator_model}, tensor_parallel_size "
        f"{req.tensor_parallel_size}): {failure.problem}."
    )
    fixes: list[str] = []
    if failure.kind == "max-num-seqs":
        fixes.append(f"lower max_num_seqs to at most {failure.detail['holdable']:,}")
    if failure.kind == "max-num-batched-tokens":
        fixes.append(
            f"lower max_num_batched_tokens below {failure.detail['pool_tokens']:,} (2,048 is "
            "vLLM's default on GPUs under 70 GiB)"
        )
    if failure.kind == "max-model-len":
        largest = min(failure.detail["pool_tokens"], req.model.max_position_embeddings)
        fixes.append(f"lower max_model_len to at most {largest:,} tokens")
    if failure.kind == "no-kv-room" and (
        req.max_num_seqs is not None or req.max_num_batched_tokens is not None or req.max_loras
    ):
        fixes.append(
            "lower max_num_seqs, max_num_batched_tokens or max_loras (each grows the reserve)"
        )
    if req.gpu_memory_utilization is not None:
        sku_util = gpu_memory_utilization_for(inst.memory_per_accelerator_bytes)
        at_rule = (
            try_plan(replace_request(req, gpu_memory_utilization=None))
            if req.gpu_memory_utilization < sku_util
            else None
        )
        if at_rule is not None:
            fixes.append(
                f"raise gpu_memory_utilization to the {inst.accelerator_model} rule's "
                f"{sku_util:.2f} (then {at_rule.kv_pool_tokens:,} KV tokens fit)"
            )
    if req.fmt.bits > 4:
        fixes.append(quantize_fix(req))
    more_tp = [
        tp for tp in power_of_two_tps(inst.gpu_count) if tp > req.tensor_parallel_size
    ]
    tp_fit = next(
        (
            (tp, fitted)
            for tp in more_tp
            if (fitted := try_plan(replace_request(req, tensor_parallel_size=tp))) is not None
        ),
        None,
    )
    if tp_fit is not None:
        fixes.append(
            f"use more tensor parallelism: tensor_parallel_size {tp_fit[0]} on this instance "
            f"({gib(tp_fit[1].weights_bytes)} of weights per GPU)"
        )
    elif inst.gpu_count == 1:
        fixes.append("more tensor parallelism needs a multi-GPU instance")
    bigger = cheapest_fit(req, req.fmt, larger_only=True)
    if bigger is not None:
        inst_fit, fitted = bigger
        fixes.append(
            f"use a larger instance: {inst_fit.name} ({inst_fit.gpu_count} × "
            f"{inst_fit.accelerator_model}) with tensor_parallel_size "
            f"{fitted.tensor_parallel_size} fits with {fitted.kv_pool_tokens:,} KV tokens "
            f"per GPU at ≈${inst_fit.on_demand_usd_per_hour:,.2f}/h"
        )
    if not fixes:
        fixes.append("no instance in the catalog fits this model at this max_model_len")
    return f"{head} Fixes: {'; '.join(fixes)}."
