"""The GPU memory plan: static weights, reserve and the dynamic KV pool, and the refusals.

How vLLM spends a GPU (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``): it
loads the weights, runs one profiling forward pass of ``max_num_batched_tokens`` dummy tokens
followed by the sampler over ``max_num_seqs`` dummy requests, and then gives the KV cache

    gpu_memory_utilization × total − (weights + peak activation + non-torch memory)

where non-torch memory is what CUDA allocated outside PyTorch (NCCL, cuBLAS workspaces). CUDA
graphs are captured and the sampler warmed up *after* that, out of the ``1 − utilization``
share, which is why the per-SKU utilization keeps headroom back (:mod:`gpu_budget.instances`).

This module mirrors that accounting per GPU:

* **weights** — :func:`gpu_budget.weights.weights_bytes` for the checkpoint format;
* **LoRA slots** — :func:`gpu_budget.lora.lora_bytes`, allocated with the model;
* **reserve** — peak activation + non-torch memory. The peak is the larger of the forward pass
  (``max_num_batched_tokens`` × per-token activation bytes, growing with hidden size and MLP
  width) and the sampler (``max_num_seqs`` × vocabulary × 4-byte fp32 logits ×
  ``SAMPLER_LOGITS_COPIES``). The sampler term dominates at default settings; its multiplier is
  fitted to vLLM's own start-up logs on an H100 (llm-d-benchmark
  ``config_explorer/empirical-vllm-memory-results.md``: peak activation 4.76 GiB for
  Llama-3.1-8B, 5.56 GiB for Qwen3-0.6B, 7.38 GiB for gpt-oss-20b at 1,024 sequences — 9.6 to
  9.7 fp32 logit copies each; we use 10). Non-torch memory: 0.13 GiB measured on one GPU,
  0.55 GiB per GPU at tensor parallelism 2 (same source); we budget 0.15 and 0.6 GiB;
* **KV pool** — the rest, cut into ``block_size``-token blocks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_budget.engine_args import (
    BLOCK_SIZES,
    MAX_LORA_RANKS,
    as_env,
    checked_engine_args,
)
from gpu_budget.instances import (
    GIB,
    HOURS_PER_MONTH,
    INSTANCE_CATALOG,
    MAX_GPU_MEMORY_UTILIZATION,
    OUTSIDE_BUDGET_HEADROOM_BYTES,
    PRICE_REGION,
    PRICES_COMPILED_ON,
    InstanceType,
    gpu_memory_utilization_for,
    instance_type,
)
from gpu_budget.kv import KV_CACHE_DTYPES, kv_bytes_per_token, kv_heads_per_gpu
from gpu_budget.lengths import (
    RequestLengthDistribution,
    as_distribution,
    blocks_for_tokens,
)
from gpu_budget.lora import lora_bytes
from gpu_budget.model_spec import ModelSpec, load_model_spec
from gpu_budget.weights import (
    INT8,
    WeightFormat,
    awq,
    check_tensor_parallel,
    parse_quantization,
    w4a16,
    weights_bytes,
)
from request_buckets import RequestBucket, bucket_bounds

SAMPLER_LOGITS_COPIES = 10
"""fp32 ``[max_num_seqs, vocab]`` copies alive at the sampler's peak (fitted 9.6–9.7, see above)."""

NON_TORCH_BYTES_SINGLE_GPU = int(0.15 * GIB)
NON_TORCH_BYTES_TENSOR_PARALLEL = int(0.6 * GIB)

MIN_SANE_SEQUENCE_TOKENS = 256
"""A running sequence shorter than this is not a chat turn; max_num_seqs must fit this many."""

LARGE_GPU_BYTES = 70 * GIB
"""vLLM's defaults switch at 70 GiB: 256 seqs / 2,048 batched tokens below, 1,024 / 8,192 above
(A100s excepted)."""

EXPECTED_KV_TOKENS_ENV_VAR = "GATEWAY_EXPECTED_KV_TOKENS"


class BudgetError(ValueError):
    """A configuration that cannot fit, or a setting outside its safe bound.

    ``str(error)`` is one paragraph naming the numbers (GiB with one decimal, tokens) and the
    fixes. ``kind`` says which check failed: ``invalid-setting``, ``weights``, ``no-kv-room``,
    ``max-model-len``, ``max-num-seqs`` or ``max-num-batched-tokens``.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n:,} tokens"


# ================================================================================== the plan
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


# ================================================================================= internals
@dataclass(frozen=True)
class _Request:
    """Normalized inputs of one evaluation."""

    model: ModelSpec
    fmt: WeightFormat
    instance: InstanceType
    max_model_len: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    block_size: int
    gpu_memory_utilization: float | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None
    lengths: RequestLengthDistribution | None


@dataclass(frozen=True)
class _Failure:
    kind: str
    problem: str
    detail: dict[str, int]


def vllm_quantization_for(fmt: WeightFormat, compute_capability: tuple[int, int]) -> str | None:
    """The ``quantization`` engine argument for a checkpoint format on a GPU.

    vLLM upgrades an AutoAWQ checkpoint to the Marlin kernel (``awq_marlin``) when the GPU has
    compute capability ≥ 8.0 and the group size is one Marlin supports; an explicit ``awq``
    forces the older, slower kernel, so the plan names ``awq_marlin`` itself. Turing (7.5) has
    no Marlin kernel and keeps ``awq``. llm-compressor output is ``compressed-tensors``.
    """
    if fmt.bits == 16:
        return None
    if fmt.checkpoint_quant_method == "awq":
        return "awq_marlin" if compute_capability >= (8, 0) else "awq"
    return fmt.checkpoint_quant_method


def _engine_dtype(fmt: WeightFormat, vllm_quantization: str | None,
                  compute_capability: tuple[int, int]) -> str:
    if compute_capability < (8, 0) or vllm_quantization == "awq" or fmt.dtype == "float16":
        # No bfloat16 before Ampere; vLLM's plain AWQ kernel runs in float16 only.
        return "float16"
    return "auto"


def _forward_activation_bytes(model: ModelSpec, tp: int, tokens: int) -> int:
    """Peak forward-pass activations for ``tokens`` tokens (2-byte activations)."""
    kv_width = kv_heads_per_gpu(model, tp) * model.head_dim
    per_token = 2 * (
        4 * model.hidden_size
        + 3 * model.intermediate_size // tp
        + 2 * model.q_size // tp
        + 2 * kv_width
    )
    return tokens * per_token


def _dequant_bytes(model: ModelSpec, tp: int, vllm_quantization: str | None) -> int:
    """vLLM's plain ``awq`` kernel dequantizes a whole projection to fp16 for large batches."""
    if vllm_quantization != "awq":
        return 0
    gate_up = model.hidden_size * 2 * model.intermediate_size // tp
    return 2 * gate_up


def _sampler_bytes(model: ModelSpec, max_num_seqs: int) -> int:
    return max_num_seqs * model.vocab_size * 4 * SAMPLER_LOGITS_COPIES


def _default_caps(instance: InstanceType) -> tuple[int, int]:
    """vLLM's own defaults for the OpenAI server: (max_num_seqs, max_num_batched_tokens).

    ``vllm/engine/arg_utils.py`` (``get_batch_defaults``): 1,024 / 8,192 on GPUs of at least
    70 GiB except the A100 ("large max_num_batched_tokens for A100 reduces throughput", vLLM PR
    #17885), 256 / 2,048 otherwise.
    """
    large = instance.memory_per_accelerator_bytes >= LARGE_GPU_BYTES
    if large and "a100" not in instance.accelerator_model.lower():
        return 1024, 8192
    return 256, 2048


@dataclass(frozen=True)
class _Sizing:
    budget: int
    weights: int
    weights_total: int
    lora: int
    forward: int
    sampler: int
    non_torch: int
    kv_per_token: int
    block_bytes: int

    @property
    def activation(self) -> int:
        return max(self.forward, self.sampler)

    @property
    def reserve(self) -> int:
        return self.activation + self.non_torch

    @property
    def pool_bytes(self) -> int:
        return self.budget - self.weights - self.lora - self.reserve

    @property
    def pool_blocks(self) -> int:
        return max(0, self.pool_bytes) // self.block_bytes


def _validate_settings(req: _Request) -> None:
    """Raise BudgetError(kind='invalid-setting') for arguments outside their accepted values."""

    def refuse(message: str) -> BudgetError:
        return BudgetError(message, kind="invalid-setting")

    inst = req.instance
    if inst.accelerator_kind != "gpu" or inst.compute_capability is None:
        raise refuse(
            f"{inst.name} is an Inferentia instance ({inst.accelerator_count} × "
            f"{inst.accelerator_model}, {inst.neuron_cores} NeuronCores): it has no CUDA GPU, so "
            "vLLM's GPU memory budget does not apply. Choose a GPU instance (ml.g5, ml.g6, "
            "ml.g6e, ml.g4dn, ml.p4d, ml.p4de, ml.p5) for the LLM, or compile for Neuron instead."
        )
    if req.max_model_len < 1:
        raise refuse(f"max_model_len must be a positive token count, got {req.max_model_len}.")
    if req.max_model_len > req.model.max_position_embeddings:
        raise refuse(
            f"max_model_len {req.max_model_len:,} exceeds {req.model.name}'s "
            f"max_position_embeddings ({req.model.max_position_embeddings:,}); vLLM refuses a "
            "context the model was not trained for. Lower max_model_len to at most "
            f"{req.model.max_position_embeddings:,}."
        )
    if req.block_size not in BLOCK_SIZES:
        raise refuse(
            f"block_size {req.block_size} is not one vLLM's CUDA attention backends accept; "
            f"use one of {', '.join(map(str, BLOCK_SIZES))} (16 is the default)."
        )
    if req.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise refuse(
            f"kv_cache_dtype {req.kv_cache_dtype!r} is not supported; use one of "
            f"{', '.join(KV_CACHE_DTYPES)}."
        )
    util = req.gpu_memory_utilization
    if util is not None and not 0 < util <= MAX_GPU_MEMORY_UTILIZATION:
        raise refuse(
            f"gpu_memory_utilization {util} is outside the safe range (0, "
            f"{MAX_GPU_MEMORY_UTILIZATION}]: above {MAX_GPU_MEMORY_UTILIZATION} nothing is left "
            "for the CUDA context, allocator fragmentation and the CUDA graphs vLLM captures after "
            "sizing its cache. Leave it unset to use the SKU rule "
            f"({gpu_memory_utilization_for(inst.memory_per_accelerator_bytes):.2f} on "
            f"{inst.accelerator_model})."
        )
    tp = req.tensor_parallel_size
    if tp < 1:
        raise refuse(f"tensor_parallel_size must be at least 1, got {tp}.")
    if tp > inst.gpu_count:
        raise refuse(
            f"tensor_parallel_size {tp} needs {tp} GPUs but {inst.name} has {inst.gpu_count}; "
            "choose a larger instance or a smaller tensor_parallel_size."
        )
    split_problem = check_tensor_parallel(req.model, tp, req.fmt)
    if split_problem:
        raise refuse(f"{split_problem}.")
    if req.fmt.bits == 16 and req.fmt.dtype == "bfloat16" and inst.compute_capability < (8, 0):
        raise refuse(
            f"{inst.accelerator_model} (compute capability "
            f"{inst.compute_capability[0]}.{inst.compute_capability[1]}) has no bfloat16; serve "
            "fp16 weights (quantization 'fp16') or an AWQ checkpoint instead."
        )
    if req.max_loras < 0:
        raise refuse(f"max_loras must be 0 (LoRA off) or more, got {req.max_loras}.")
    if req.max_loras > 0 and req.max_lora_rank not in MAX_LORA_RANKS:
        raise refuse(
            f"max_lora_rank {req.max_lora_rank} is not one vLLM accepts; use one of "
            f"{', '.join(map(str, MAX_LORA_RANKS))}."
        )
    if req.max_loras == 0 and req.max_lora_rank:
        raise refuse(
            f"max_lora_rank {req.max_lora_rank} is set but max_loras is 0; set max_loras (the "
            "adapter slots on the GPU) or drop the rank."
        )
    if req.max_cpu_loras is not None and req.max_cpu_loras < req.max_loras:
        raise refuse(
            f"max_cpu_loras ({req.max_cpu_loras}) must be at least max_loras ({req.max_loras})."
        )
    if req.max_num_seqs is not None and req.max_num_seqs < 1:
        raise refuse(f"max_num_seqs must be at least 1, got {req.max_num_seqs}.")
    if req.max_num_batched_tokens is not None:
        if req.max_num_batched_tokens < 1:
            raise refuse(
                f"max_num_batched_tokens must be at least 1, got {req.max_num_batched_tokens}."
            )
        seqs = req.max_num_seqs if req.max_num_seqs is not None else 1
        if req.max_num_batched_tokens < seqs:
            raise refuse(
                f"max_num_batched_tokens ({req.max_num_batched_tokens:,}) must be at least "
                f"max_num_seqs ({seqs:,}); vLLM refuses to start otherwise."
            )


def _size(req: _Request, util: float, max_num_seqs: int, batched_tokens: int,
          vllm_quant: str | None) -> _Sizing:
    tp = req.tensor_parallel_size
    gpu_bytes = req.instance.memory_per_accelerator_bytes
    kv_per_token = kv_bytes_per_token(req.model, req.kv_cache_dtype, tp)
    return _Sizing(
        budget=int(util * gpu_bytes),
        weights=weights_bytes(req.model, req.fmt, tensor_parallel_size=tp),
        weights_total=weights_bytes(req.model, req.fmt, tensor_parallel_size=1),
        lora=lora_bytes(req.model, req.max_loras, req.max_lora_rank, tp),
        forward=_forward_activation_bytes(req.model, tp, batched_tokens)
        + _dequant_bytes(req.model, tp, vllm_quant),
        sampler=_sampler_bytes(req.model, max_num_seqs),
        non_torch=NON_TORCH_BYTES_TENSOR_PARALLEL if tp > 1 else NON_TORCH_BYTES_SINGLE_GPU,
        kv_per_token=kv_per_token,
        block_bytes=req.block_size * kv_per_token,
    )


def _typical_tokens(req: _Request) -> int:
    """Length that sizes max_num_seqs: the distribution's mean, else a quarter of max_model_len."""
    if req.lengths is not None:
        return max(1, min(req.max_model_len, math.ceil(req.lengths.mean_tokens)))
    return max(1, req.max_model_len // 4)


def _recommend_max_num_seqs(req: _Request, util: float, batched: int, cap: int,
                            vllm_quant: str | None) -> int:
    """Largest s ≤ cap whose sampler reserve still leaves room for s typical requests (and for
    one request of max_model_len).

    The pool shrinks as s grows (the sampler reserve is per sequence), so the predicate is
    monotone and a binary search finds the largest fitting s. Rounded down to a multiple of 8.
    """
    typical_blocks = blocks_for_tokens(_typical_tokens(req), req.block_size)
    longest_blocks = blocks_for_tokens(req.max_model_len, req.block_size)

    def fits(seqs: int) -> bool:
        pool = _size(req, util, seqs, max(batched, seqs), vllm_quant).pool_blocks
        return seqs * typical_blocks <= pool and longest_blocks <= pool

    if not fits(1):
        return 1
    low, high = 1, cap
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low - low % 8 if low >= 8 else low


def _evaluate(req: _Request) -> MemoryPlan | _Failure:
    """Size ``req``; return the plan or the first capacity check it fails."""
    _validate_settings(req)
    inst = req.instance
    assert inst.compute_capability is not None  # checked by _validate_settings
    cc = inst.compute_capability
    vllm_quant = vllm_quantization_for(req.fmt, cc)
    util_source = "explicit" if req.gpu_memory_utilization is not None else "sku-rule"
    util = (
        req.gpu_memory_utilization
        if req.gpu_memory_utilization is not None
        else gpu_memory_utilization_for(inst.memory_per_accelerator_bytes)
    )
    seq_cap, batched_default = _default_caps(inst)

    # Capacity checks that do not depend on the scheduler settings come first.
    floor_sizing = _size(req, util, 1, 1, vllm_quant)
    if floor_sizing.weights > floor_sizing.budget:
        return _Failure(
            "weights",
            f"its weights need {_gib(floor_sizing.weights)} per GPU but vLLM's budget is "
            f"{_gib(floor_sizing.budget)} ({util:.2f} × {_gib(inst.memory_per_accelerator_bytes)} "
            f"{inst.accelerator_model})",
            {"weights": floor_sizing.weights, "budget": floor_sizing.budget},
        )

    if req.max_num_seqs is not None:
        max_num_seqs, seqs_source = req.max_num_seqs, "explicit"
    else:
        batched_guess = req.max_num_batched_tokens or batched_default
        max_num_seqs = _recommend_max_num_seqs(req, util, batched_guess, seq_cap, vllm_quant)
        seqs_source = "recommended"
    batched = req.max_num_batched_tokens or max(batched_default, max_num_seqs)
    sizing = _size(req, util, max_num_seqs, batched, vllm_quant)

    if sizing.pool_blocks < 1:
        static = sizing.weights + sizing.lora + sizing.reserve
        lora_part = f" + {_gib(sizing.lora)} LoRA slots" if sizing.lora else ""
        return _Failure(
            "no-kv-room",
            f"weights ({_gib(sizing.weights)}){lora_part} + activation/sampler reserve "
            f"({_gib(sizing.reserve)}) = {_gib(static)} per GPU leave no KV cache in vLLM's "
            f"{_gib(sizing.budget)} budget ({util:.2f} × "
            f"{_gib(inst.memory_per_accelerator_bytes)} {inst.accelerator_model})",
            {"static": static, "budget": sizing.budget},
        )
    pool_tokens = sizing.pool_blocks * req.block_size
    needed_blocks = blocks_for_tokens(req.max_model_len, req.block_size)
    if sizing.pool_blocks < needed_blocks:
        return _Failure(
            "max-model-len",
            f"one {req.max_model_len:,}-token sequence needs "
            f"{_gib(needed_blocks * sizing.block_bytes)} of KV cache "
            f"({sizing.kv_per_token:,} B/token) but the pool left after weights "
            f"({_gib(sizing.weights)}) and reserve ({_gib(sizing.reserve)}) is "
            f"{_gib(sizing.pool_blocks * sizing.block_bytes)}, {_tokens(pool_tokens)}",
            {"pool_tokens": pool_tokens},
        )
    if req.max_num_seqs is not None:
        sane_tokens = min(MIN_SANE_SEQUENCE_TOKENS, req.max_model_len)
        sane_blocks = blocks_for_tokens(sane_tokens, req.block_size)
        holdable = sizing.pool_blocks // sane_blocks
        if req.max_num_seqs > holdable:
            return _Failure(
                "max-num-seqs",
                f"max_num_seqs {req.max_num_seqs:,} exceeds what the KV pool "
                f"({_tokens(pool_tokens)}, {_gib(sizing.pool_blocks * sizing.block_bytes)}) holds "
                f"even at {sane_tokens:,} tokens per sequence: {holdable:,} sequences",
                {"holdable": holdable},
            )
    if req.max_num_batched_tokens is not None and req.max_num_batched_tokens > pool_tokens:
        return _Failure(
            "max-num-batched-tokens",
            f"max_num_batched_tokens {req.max_num_batched_tokens:,} exceeds the whole KV pool "
            f"({_tokens(pool_tokens)}); one scheduler step could never be served",
            {"pool_tokens": pool_tokens},
        )
    return _assemble(req, util, util_source, max_num_seqs, seqs_source, batched, sizing,
                     vllm_quant)


def _assemble(req: _Request, util: float, util_source: str, max_num_seqs: int, seqs_source: str,
              batched: int, sizing: _Sizing, vllm_quant: str | None) -> MemoryPlan:
    inst = req.instance
    assert inst.compute_capability is not None
    cc = inst.compute_capability
    pool_blocks = sizing.pool_blocks
    pool_tokens = pool_blocks * req.block_size
    at_max = pool_blocks // blocks_for_tokens(req.max_model_len, req.block_size)
    bounds = bucket_bounds(req.max_model_len)
    shares = req.lengths.bucket_shares(bounds) if req.lengths is not None else None
    buckets: list[BucketConcurrency] = []
    for bucket in RequestBucket:
        # Sized at the bucket's largest request: the concurrency every request in it can get.
        sized = bounds.upper(bucket)
        reachable = sized > bounds.lower_exclusive(bucket)
        blocks = blocks_for_tokens(sized, req.block_size)
        kv_bound = pool_blocks // blocks if blocks else 0
        buckets.append(
            BucketConcurrency(
                bucket=bucket.value,
                max_tokens=None if bucket is RequestBucket.XL else sized,
                sized_tokens=sized,
                reachable=reachable,
                blocks_per_sequence=blocks,
                max_concurrency=kv_bound,
                effective_concurrency=min(kv_bound, max_num_seqs),
                share=None if shares is None else round(shares[bucket.value], 4),
            )
        )
    mean_tokens = req.lengths.mean_tokens if req.lengths is not None else None
    at_mean = (
        int(pool_blocks // req.lengths.mean_blocks(req.block_size))
        if req.lengths is not None
        else None
    )
    warnings = _warnings(req, util, util_source, max_num_seqs, at_max, sizing)
    max_cpu_loras = (
        req.max_cpu_loras if req.max_cpu_loras is not None else 2 * req.max_loras
    )
    return MemoryPlan(
        model_name=req.model.name,
        parameter_count=req.model.parameter_count,
        quantization=req.fmt.label(),
        vllm_quantization=vllm_quant,
        dtype=_engine_dtype(req.fmt, vllm_quant, cc),
        instance_type=inst.name,
        gpu_model=inst.accelerator_model,
        gpu_count=inst.gpu_count,
        compute_capability=f"{cc[0]}.{cc[1]}",
        tensor_parallel_size=req.tensor_parallel_size,
        gpu_memory_bytes=inst.memory_per_accelerator_bytes,
        gpu_memory_utilization=util,
        gpu_memory_utilization_source=util_source,
        budget_bytes=sizing.budget,
        headroom_bytes=inst.memory_per_accelerator_bytes - sizing.budget,
        weights_bytes=sizing.weights,
        weights_bytes_total=sizing.weights_total,
        lora_bytes=sizing.lora,
        forward_activation_bytes=sizing.forward,
        sampler_bytes=sizing.sampler,
        activation_bytes=sizing.activation,
        non_torch_bytes=sizing.non_torch,
        reserve_bytes=sizing.reserve,
        kv_cache_dtype=req.kv_cache_dtype,
        kv_bytes_per_token=sizing.kv_per_token,
        block_size=req.block_size,
        block_bytes=sizing.block_bytes,
        kv_pool_bytes=pool_blocks * sizing.block_bytes,
        kv_pool_blocks=pool_blocks,
        kv_pool_tokens=pool_tokens,
        max_model_len=req.max_model_len,
        model_max_position_embeddings=req.model.max_position_embeddings,
        max_num_seqs=max_num_seqs,
        max_num_seqs_source=seqs_source,
        max_num_batched_tokens=batched,
        max_loras=req.max_loras,
        max_lora_rank=req.max_lora_rank if req.max_loras else 0,
        max_cpu_loras=max_cpu_loras if req.max_loras else 0,
        max_concurrency_at_max_len=at_max,
        effective_concurrency_at_max_len=min(at_max, max_num_seqs),
        largest_max_model_len=min(pool_tokens, req.model.max_position_embeddings),
        mean_request_tokens=None if mean_tokens is None else round(mean_tokens, 1),
        max_concurrency_at_mean=at_mean,
        buckets=tuple(buckets),
        cost_per_hour_usd=inst.on_demand_usd_per_hour,
        cost_per_month_usd=round(inst.on_demand_usd_per_hour * HOURS_PER_MONTH, 2),
        price_region=PRICE_REGION,
        prices_compiled_on=PRICES_COMPILED_ON,
        warnings=tuple(warnings),
    )


def _warnings(req: _Request, util: float, util_source: str, max_num_seqs: int, at_max: int,
              sizing: _Sizing) -> list[str]:
    inst = req.instance
    notes: list[str] = []
    sku_util = gpu_memory_utilization_for(inst.memory_per_accelerator_bytes)
    headroom = inst.memory_per_accelerator_bytes - sizing.budget
    if util_source == "explicit" and util > sku_util:
        notes.append(
            f"gpu_memory_utilization {util:.2f} is above the {inst.accelerator_model} rule "
            f"({sku_util:.2f}): it leaves {_gib(headroom)} outside vLLM's budget where "
            f"{_gib(OUTSIDE_BUDGET_HEADROOM_BYTES)} is wanted for the CUDA context, allocator "
            "fragmentation and CUDA-graph warm-up."
        )
    if req.tensor_parallel_size < inst.gpu_count:
        notes.append(
            f"the engine uses {req.tensor_parallel_size} of {inst.name}'s {inst.gpu_count} GPUs; "
            "the others stay idle unless another replica runs on them."
        )
    if at_max < min(max_num_seqs, 4):
        notes.append(
            f"only {at_max} sequence(s) of max_model_len fit at once; long requests will queue."
        )
    if req.kv_cache_dtype.startswith("fp8") and inst.compute_capability is not None \
            and inst.compute_capability < (8, 9):
        notes.append(
            "an fp8 KV cache on a GPU older than Ada (8.9) depends on the attention backend; "
            "check vLLM's start-up log before relying on it."
        )
    if req.fmt.checkpoint_quant_method == "compressed-tensors" and req.fmt.bits == 4 \
            and inst.compute_capability is not None and inst.compute_capability < (8, 0):
        notes.append(
            "W4A16 (compressed-tensors) runs on vLLM's Marlin kernels, which need compute "
            "capability 8.0; on this GPU prefer an AutoAWQ checkpoint."
        )
    if req.lengths is not None:
        too_long = req.lengths.count_longer_than(req.max_model_len)
        if too_long:
            notes.append(
                f"{too_long} of {req.lengths.count} sampled requests exceed max_model_len "
                f"{req.max_model_len:,} and would be rejected."
            )
    return notes


# ================================================================================ public API
def _weight_format(spec: ModelSpec, quantization: str | WeightFormat | None) -> WeightFormat:
    """The format to size: as given, or read from the checkpoint's quantization_config.

    ``quantization=None`` takes the checkpoint's own format (16-bit when it has none). A format
    that contradicts the checkpoint's ``quant_method`` is refused: sizing AWQ weights as bf16, or
    the reverse, would be wrong by a factor of three.
    """
    method = spec.checkpoint_quant_method
    from_checkpoint: WeightFormat | None = None
    if method == "awq":
        from_checkpoint = awq(spec.checkpoint_quant_group_size or 128)
    elif method == "compressed-tensors" and spec.checkpoint_quant_bits == 4:
        from_checkpoint = w4a16(spec.checkpoint_quant_group_size or 128)
    elif method == "compressed-tensors" and spec.checkpoint_quant_bits == 8:
        from_checkpoint = INT8
    if quantization is None:
        return from_checkpoint or parse_quantization(None)
    fmt = parse_quantization(quantization)
    if method and fmt.checkpoint_quant_method != method:
        raise ValueError(
            f"quantization {fmt.name!r} contradicts {spec.name}'s config.json, whose "
            f"quantization_config says quant_method {method!r}; pass quantization="
            f"{(from_checkpoint.name if from_checkpoint else method)!r} or leave it unset"
        )
    return fmt


def _normalize(
    model: ModelSpec | str,
    *,
    quantization: str | WeightFormat | None,
    instance: InstanceType | str,
    max_model_len: int,
    kv_cache_dtype: str,
    tensor_parallel_size: int,
    block_size: int,
    gpu_memory_utilization: float | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_loras: int,
    max_lora_rank: int,
    max_cpu_loras: int | None,
    request_lengths: RequestLengthDistribution | Sequence[int] | None,
) -> _Request:
    def refuse(message: str) -> BudgetError:
        return BudgetError(message, kind="invalid-setting")

    try:
        spec = model if isinstance(model, ModelSpec) else load_model_spec(model)
        fmt = _weight_format(spec, quantization)
        inst = instance if isinstance(instance, InstanceType) else instance_type(instance)
        lengths = as_distribution(request_lengths)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    for name, value in (
        ("max_model_len", max_model_len),
        ("tensor_parallel_size", tensor_parallel_size),
        ("block_size", block_size),
        ("max_loras", max_loras),
        ("max_lora_rank", max_lora_rank),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse(f"{name} must be an integer, got {value!r}.")
    return _Request(
        model=spec,
        fmt=fmt,
        instance=inst,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        max_cpu_loras=max_cpu_loras,
        lengths=lengths,
    )


def plan(
    model: ModelSpec | str,
    *,
    quantization: str | WeightFormat | None,
    instance: InstanceType | str,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    block_size: int = 16,
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
    req = _normalize(
        model,
        quantization=quantization,
        instance=instance,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        max_cpu_loras=max_cpu_loras,
        request_lengths=request_lengths,
    )
    result = _evaluate(req)
    if isinstance(result, MemoryPlan):
        return result
    raise BudgetError(_refusal_message(req, result), kind=result.kind)


validate = plan
"""``validate(...)`` is :func:`plan` under the name the stacks call at synth: same arguments,
returns the plan, raises :class:`BudgetError`."""


# ================================================================================= refusals
def _replace(req: _Request, **changes: Any) -> _Request:
    data = {name: getattr(req, name) for name in req.__dataclass_fields__}
    data.update(changes)
    return _Request(**data)


def _try(req: _Request) -> MemoryPlan | None:
    try:
        result = _evaluate(req)
    except BudgetError:
        return None
    return result if isinstance(result, MemoryPlan) else None


def _power_of_two_tps(gpu_count: int) -> list[int]:
    sizes, tp = [], 1
    while tp <= gpu_count:
        sizes.append(tp)
        tp *= 2
    return sizes


def _total_accelerator_bytes(inst: InstanceType) -> int:
    return inst.accelerator_count * inst.memory_per_accelerator_bytes


def _cheapest_fit(
    req: _Request, fmt: WeightFormat, *, larger_only: bool
) -> tuple[InstanceType, MemoryPlan] | None:
    """Cheapest catalog GPU instance (and smallest tp) where the same request fits.

    With ``larger_only`` only instances with more GPU memory in total than the current one are
    considered. Every other setting (an explicit utilization too) is kept as requested.
    """
    current = _total_accelerator_bytes(req.instance)
    candidates = sorted(
        (
            inst
            for inst in INSTANCE_CATALOG.values()
            if inst.accelerator_kind == "gpu"
            and (not larger_only or _total_accelerator_bytes(inst) > current)
        ),
        key=lambda inst: inst.on_demand_usd_per_hour,
    )
    for inst in candidates:
        if inst.name == req.instance.name and fmt == req.fmt:
            continue
        for tp in _power_of_two_tps(inst.gpu_count):
            fitted = _try(_replace(req, instance=inst, fmt=fmt, tensor_parallel_size=tp))
            if fitted is not None:
                return inst, fitted
    return None


def _quantize_fix(req: _Request) -> str:
    """The 'quantize' fix with its numbers: here if AWQ fits, else the cheapest AWQ fit."""
    quantized = awq(128)
    try:
        awq_weights = weights_bytes(req.model, quantized,
                                    tensor_parallel_size=req.tensor_parallel_size)
    except ValueError:
        return "quantize to AWQ int4 (not possible at this tensor_parallel_size: group split)"
    on_same = _try(_replace(req, fmt=quantized))
    if on_same is not None:
        return (
            f"quantize to AWQ int4 (weights {_gib(awq_weights)} per GPU; then "
            f"{on_same.kv_pool_tokens:,} KV tokens fit here)"
        )
    cheapest = _cheapest_fit(req, quantized, larger_only=False)
    where = (
        f"; the cheapest AWQ fit is {cheapest[0].name} with tensor_parallel_size "
        f"{cheapest[1].tensor_parallel_size} at ≈${cheapest[0].on_demand_usd_per_hour:,.2f}/h"
        if cheapest is not None
        else ""
    )
    return (
        f"quantize to AWQ int4 (weights {_gib(awq_weights)} per GPU, not enough on its own "
        f"here{where})"
    )


def _refusal_message(req: _Request, failure: _Failure) -> str:
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
            _try(_replace(req, gpu_memory_utilization=None))
            if req.gpu_memory_utilization < sku_util
            else None
        )
        if at_rule is not None:
            fixes.append(
                f"raise gpu_memory_utilization to the {inst.accelerator_model} rule's "
                f"{sku_util:.2f} (then {at_rule.kv_pool_tokens:,} KV tokens fit)"
            )
    if req.fmt.bits > 4:
        fixes.append(_quantize_fix(req))
    more_tp = [
        tp for tp in _power_of_two_tps(inst.gpu_count) if tp > req.tensor_parallel_size
    ]
    tp_fit = next(
        (
            (tp, fitted)
            for tp in more_tp
            if (fitted := _try(_replace(req, tensor_parallel_size=tp))) is not None
        ),
        None,
    )
    if tp_fit is not None:
        fixes.append(
            f"use more tensor parallelism: tensor_parallel_size {tp_fit[0]} on this instance "
            f"({_gib(tp_fit[1].weights_bytes)} of weights per GPU)"
        )
    elif inst.gpu_count == 1:
        fixes.append("more tensor parallelism needs a multi-GPU instance")
    bigger = _cheapest_fit(req, req.fmt, larger_only=True)
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
