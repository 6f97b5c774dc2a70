"""The GPU budget's result: :class:`MemoryPlan` (with the engine arguments and environment it
carries to the container), per-bucket concurrency, and :class:`BudgetError`.

Engine arguments are written through the engine-argument table (:mod:`gpu_budget.engine_args`):
every value is checked against its row and every variable named by it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_budget.engine_args import as_env, checked_engine_args
from gpu_budget.instances import GIB
from gpu_budget.lengths import blocks_for_tokens
from serving_contract.environment import GATEWAY_EXPECTED_KV_TOKENS

EXPECTED_KV_TOKENS_ENV_VAR = GATEWAY_EXPECTED_KV_TOKENS
"""The container's variable for the KV pool the plan predicts (:meth:`MemoryPlan.engine_env`)."""


class BudgetError(ValueError):
    """A configuration that cannot fit, or a setting outside its safe bound.

    ``str(error)`` is one paragraph naming the numbers (GiB with one decimal, tokens) and the
    fixes. ``kind`` says which check failed: ``invalid-setting``, ``weights``, ``no-kv-room``,
    ``max-model-len``, ``max-num-seqs`` or ``max-num-batched-tokens``.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def gib(n_bytes: float) -> str:
    """Bytes as GiB with one decimal, the unit of every message."""
    return f"{n_bytes / GIB:.1f} GiB"


def tokens_text(n: int) -> str:
    """A token count with thousands separators."""
    return f"{n:,} tokens"


@dataclass(frozen=True)
class BucketConcurrency:
    """How many requests of one length bucket the KV pool holds at once."""

    bucket: str
    max_tokens: int | None
    sized_tokens: int
    reachable: bool
    blocks_per_sequence: int
    max_concurrency: int
    effective_concurrency: int
    share: float | None


@dataclass(frozen=True)
class MemoryPlan:
    """A sized vLLM configuration for one model on one instance type.

    Every ``*_bytes`` figure is per GPU unless the name ends in ``_total``. JSON field names
    (``to_dict``) are stable: the stacks and the container read them.
    """

    model_name: str
    parameter_count: int
    quantization: str
    vllm_quantization: str | None
    dtype: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    compute_capability: str
    tensor_parallel_size: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    gpu_memory_utilization_source: str
    budget_bytes: int
    headroom_bytes: int
    weights_bytes: int
    weights_bytes_total: int
    lora_bytes: int
    forward_activation_bytes: int
    sampler_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    reserve_bytes: int
    kv_cache_dtype: str
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    kv_pool_bytes: int
    kv_pool_blocks: int
    kv_pool_tokens: int
    max_model_len: int
    model_max_position_embeddings: int
    max_num_seqs: int
    max_num_seqs_source: str
    max_num_batched_tokens: int
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    max_concurrency_at_max_len: int
    effective_concurrency_at_max_len: int
    largest_max_model_len: int
    mean_request_tokens: float | None
    max_concurrency_at_mean: int | None
    buckets: tuple[BucketConcurrency, ...]
    cost_per_hour_usd: float
    cost_per_month_usd: float
    price_region: str
    prices_compiled_on: str
    warnings: tuple[str, ...] = field(default=())

    # ------------------------------------------------------------------ derived views
    def concurrency_at(self, tokens: int) -> int:
        """Sequences of ``tokens`` the KV pool holds at once (paged, block-rounded)."""
        blocks = blocks_for_tokens(tokens, self.block_size)
        return self.kv_pool_blocks // blocks if blocks else 0

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready mapping with stable field names."""
        data = asdict(self)
        data["buckets"] = [asdict(bucket) for bucket in self.buckets]
        data["warnings"] = list(self.warnings)
        data["engine_args"] = self.engine_args()
        return data

    def to_json(self) -> str:
        """``to_dict`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for vLLM 0.33 ``EngineArgs`` / ``AsyncEngineArgs``.

        ``quantization`` is ``awq_marlin`` for an AutoAWQ checkpoint on compute capability ≥ 8.0
        (vLLM's fast Marlin kernel; naming plain ``awq`` forces the slow kernel), ``awq`` on a
        T4, ``compressed-tensors`` for llm-compressor output, and None for 16-bit weights.
        """
        args: dict[str, Any] = {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "quantization": self.vllm_quantization,
            "dtype": self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_lora": self.max_loras > 0,
        }
        if self.max_loras > 0:
            args["max_loras"] = self.max_loras
            args["max_lora_rank"] = self.max_lora_rank
            args["max_cpu_loras"] = self.max_cpu_loras
        return checked_engine_args(args)

    def engine_env(self, extra_args: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Environment variables that carry this plan to the serving container.

        One ``ENGINE_<NAME>`` variable per :meth:`engine_args` entry (named by its row of
        :mod:`gpu_budget.engine_args`), plus ``extra_args`` the plan does not size (prefix
        caching, eager mode); None values are left out, booleans are ``true``/``false``.
        ``GATEWAY_EXPECTED_KV_TOKENS`` carries the predicted KV pool, which the container
        compares with the engine's report through :func:`compare_engine_report`. One variable
        per setting keeps a change to one engine argument a one-line diff in ``cdk synth``.
        """
        env = as_env(checked_engine_args({**self.engine_args(), **(extra_args or {})}))
        env[EXPECTED_KV_TOKENS_ENV_VAR] = str(self.kv_pool_tokens)
        return env
