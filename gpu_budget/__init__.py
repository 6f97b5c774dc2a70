"""The GPU memory budget: one model of weights, KV cache and headroom for vLLM on SageMaker.

The stacks call :func:`plan` at synth time (an impossible configuration fails
the synth with :class:`BudgetError`), pass :meth:`MemoryPlan.engine_args` to the serving
container, and the container checks the engine's real KV pool with
:func:`compare_engine_report`. Every engine argument's name, type, bounds and default is one row
of :data:`ENGINE_ARGS` (:mod:`gpu_budget.engine_args`), which the plan, the container's settings,
the vLLM adapter and the stack's settings all read. ``python -m tools.budget plan ...`` prints the
same plan.

Pure package: no AWS, CDK, torch or matplotlib imports (the plots and the text report are the
operator command's: ``tools/budget``).
"""

from gpu_budget.engine_args import (
    BLOCK_SIZES,
    ENGINE_ARG,
    ENGINE_ARGS,
    ENGINE_ENV_PREFIX,
    EngineArg,
    EngineArgError,
    engine_env_var,
)
from gpu_budget.engine_report import EngineKvComparison, compare_engine_report
from gpu_budget.instances import (
    INSTANCE_CATALOG,
    MAX_GPU_MEMORY_UTILIZATION,
    PRICE_REGION,
    PRICES_COMPILED_ON,
    InstanceType,
    UnknownInstanceTypeError,
    gpu_memory_utilization_for,
    instance_type,
)
from gpu_budget.kv import kv_block_bytes, kv_bytes_per_token, kv_dtype_bytes, kv_pool_tokens
from gpu_budget.lengths import (
    SEED_EXAMPLE_REQUEST_TOKENS,
    RequestLengthDistribution,
    blocks_for_tokens,
)
from gpu_budget.lora import ALLOWED_LORA_RANKS, lora_bytes
from gpu_budget.model_spec import ModelSpec, ModelSpecError, load_model_spec
from gpu_budget.planner import (
    EXPECTED_KV_TOKENS_ENV_VAR,
    BucketConcurrency,
    BudgetError,
    MemoryPlan,
    plan,
    vllm_quantization_for,
)
from gpu_budget.static_paged import StaticVsPaged, static_vs_paged
from gpu_budget.weights import (
    QUANTIZATION_CHOICES,
    WeightFormat,
    parse_quantization,
    weights_bytes,
)

__all__ = [
    "ALLOWED_LORA_RANKS",
    "BLOCK_SIZES",
    "ENGINE_ARG",
    "ENGINE_ARGS",
    "ENGINE_ENV_PREFIX",
    "EXPECTED_KV_TOKENS_ENV_VAR",
    "INSTANCE_CATALOG",
    "MAX_GPU_MEMORY_UTILIZATION",
    "PRICES_COMPILED_ON",
    "PRICE_REGION",
    "QUANTIZATION_CHOICES",
    "SEED_EXAMPLE_REQUEST_TOKENS",
    "BucketConcurrency",
    "BudgetError",
    "EngineArg",
    "EngineArgError",
    "EngineKvComparison",
    "InstanceType",
    "MemoryPlan",
    "ModelSpec",
    "ModelSpecError",
    "RequestLengthDistribution",
    "StaticVsPaged",
    "UnknownInstanceTypeError",
    "WeightFormat",
    "blocks_for_tokens",
    "compare_engine_report",
    "engine_env_var",
    "gpu_memory_utilization_for",
    "instance_type",
    "kv_block_bytes",
    "kv_bytes_per_token",
    "kv_dtype_bytes",
    "kv_pool_tokens",
    "load_model_spec",
    "lora_bytes",
    "parse_quantization",
    "plan",
    "static_vs_paged",
    "vllm_quantization_for",
    "weights_bytes",
]
