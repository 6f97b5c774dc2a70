"""The GPU memory planner: :func:`plan`, which the stacks call at synth.

It normalizes and checks the request (:mod:`gpu_budget.plan_request`, a table of setting
checks), sizes weights, reserve and KV pool the way vLLM spends a GPU (:mod:`gpu_budget.sizing`),
and returns the :class:`MemoryPlan` (:mod:`gpu_budget.memory_plan`) or raises a
:class:`BudgetError` whose message names the numbers and the fixes (:mod:`gpu_budget.refusals`).
The names those modules define that callers use are importable from here too.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_budget.instances import InstanceType
from gpu_budget.kv import DEFAULT_BLOCK_SIZE
from gpu_budget.lengths import RequestLengthDistribution
from gpu_budget.memory_plan import (
    EXPECTED_KV_TOKENS_ENV_VAR,
    BucketConcurrency,
    BudgetError,
    MemoryPlan,
)
from gpu_budget.model_spec import ModelSpec
from gpu_budget.plan_request import SETTING_CHECKS, normalize
from gpu_budget.refusals import refusal_message
from gpu_budget.sizing import (
    LARGE_GPU_BYTES,
    MIN_SANE_SEQUENCE_TOKENS,
    NON_TORCH_BYTES_SINGLE_GPU,
    NON_TORCH_BYTES_TENSOR_PARALLEL,
    SAMPLER_LOGITS_COPIES,
    evaluate,
    vllm_quantization_for,
)
from gpu_budget.weights import WeightFormat

__all__ = [
    "EXPECTED_KV_TOKENS_ENV_VAR",
    "LARGE_GPU_BYTES",
    "MIN_SANE_SEQUENCE_TOKENS",
    "NON_TORCH_BYTES_SINGLE_GPU",
    "NON_TORCH_BYTES_TENSOR_PARALLEL",
    "SAMPLER_LOGITS_COPIES",
    "SETTING_CHECKS",
    "BucketConcurrency",
    "BudgetError",
    "MemoryPlan",
    "plan",
    "vllm_quantization_for",
]


def plan(
    model: ModelSpec | str,
    *,
    quantization: str | WeightFormat | None,
    instance: InstanceType | str,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_loras: int = 0,
    max_lora_rank: int = 0,
    max_cpu_loras: int | None = None,
    request_lengths: RequestLengthDistribution | Sequence[int] | None = None,
) -> MemoryPlan:
    """Size vLLM for ``model`` on ``instance`` and return the :class:`MemoryPlan`.

    ``model`` is a :class:`ModelSpec` or a path to ``config.json``; ``instance`` an
    :class:`InstanceType` or a catalog name. ``gpu_memory_utilization=None`` applies the SKU rule;
    ``max_num_seqs=None`` / ``max_num_batched_tokens=None`` are sized by the plan (the most
    sequences of the typical length the pool holds, capped at vLLM's default for the GPU size).
    ``request_lengths`` (token counts of observed requests) adds mean and per-bucket shares.

    Raises :class:`BudgetError` with the numbers and the fixes when the configuration cannot fit
    or a setting is outside its safe bound.
    """
    req = normalize(**locals())  # exactly this function's arguments, by name
    result = evaluate(req)
    if isinstance(result, MemoryPlan):
        return result
    raise BudgetError(refusal_message(req, result), kind=result.kind)


