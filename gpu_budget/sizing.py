"""Sizing one request: static weights, reserve and the dynamic KV pool, and the capacity checks.

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

import math
from dataclasses import dataclass

from gpu_budget.instances import (
    GIB,
    HOURS_PER_MONTH,
    OUTSIDE_BUDGET_HEADROOM_BYTES,
    PRICE_REGION,
    PRICES_COMPILED_ON,
    InstanceType,
    gpu_memory_utilization_for,
)
from gpu_budget.kv import kv_bytes_per_token, kv_heads_per_gpu
from gpu_budget.lengths import blocks_for_tokens
from gpu_budget.lora import lora_bytes
from gpu_budget.memory_plan import BucketConcurrency, MemoryPlan, gib, tokens_text
from gpu_budget.model_spec import ModelSpec
from gpu_budget.plan_request import PlanRequest, validate_settings
from gpu_budget.weights import WeightFormat, weights_bytes
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


@dataclass(frozen=True)
class CapacityFailure:
    """The first capacity check a request fails: its kind, the problem in words, its numbers."""

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


def engine_dtype(fmt: WeightFormat, vllm_quantization: str | None,
                  compute_capability: tuple[int, int]) -> str:
    """The ``dtype`` engine argument: float16 without bfloat16 or for the plain AWQ kernel."""
    if compute_capability < (8, 0) or vllm_quantization == "awq" or fmt.dtype == "float16":
        # No bfloat16 before Ampere; vLLM's plain AWQ kernel runs in float16 only.
        return "float16"
    return "auto"


def forward_activation_bytes(model: ModelSpec, tp: int, tokens: int) -> int:
    """Peak forward-pass activations for ``tokens`` tokens (2-byte activations)."""
    kv_width = kv_heads_per_gpu(model, tp) * model.head_dim
    per_token = 2 * (
        4 * model.hidden_size
        + 3 * model.intermediate_size // tp
        + 2 * model.q_size // tp
        + 2 * kv_width
    )
    return tokens * per_token


def dequant_bytes(model: ModelSpec, tp: int, vllm_quantization: str | None) -> int:
    """vLLM's plain ``awq`` kernel dequantizes a whole projection to fp16 for large batches."""
    if vllm_quantization != "awq":
        return 0
    gate_up = model.hidden_size * 2 * model.intermediate_size // tp
    return 2 * gate_up


def sampler_bytes(model: ModelSpec, max_num_seqs: int) -> int:
    """The sampler's peak: ``SAMPLER_LOGITS_COPIES`` fp32 ``[max_num_seqs, vocab]`` tensors."""
    return max_num_seqs * model.vocab_size * 4 * SAMPLER_LOGITS_COPIES


def default_caps(instance: InstanceType) -> tuple[int, int]:
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
class Sizing:
    """One GPU's bytes for a request at a utilization: what is static, reserved and left for KV."""

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



def size_request(req: PlanRequest, util: float, max_num_seqs: int, batched_tokens: int,
          vllm_quant: str | None) -> Sizing:
    """The :class:`Sizing` of ``req`` at ``util`` with these scheduler settings."""
    tp = req.tensor_parallel_size
    gpu_bytes = req.instance.memory_per_accelerator_bytes
    kv_per_token = kv_bytes_per_token(req.model, req.kv_cache_dtype, tp)
    return Sizing(
        budget=int(util * gpu_bytes),
        weights=weights_bytes(req.model, req.fmt, tensor_parallel_size=tp),
        weights_total=weights_bytes(req.model, req.fmt, tensor_parallel_size=1),
        lora=lora_bytes(req.model, req.max_loras, req.max_lora_rank, tp),
        forward=forward_activation_bytes(req.model, tp, batched_tokens)
        + dequant_bytes(req.model, tp, vllm_quant),
        sampler=sampler_bytes(req.model, max_num_seqs),
        non_torch=NON_TORCH_BYTES_TENSOR_PARALLEL if tp > 1 else NON_TORCH_BYTES_SINGLE_GPU,
        kv_per_token=kv_per_token,
        block_bytes=req.block_size * kv_per_token,
    )


def typical_tokens(req: PlanRequest) -> int:
    """Length that sizes max_num_seqs: the distribution's mean, else a quarter of max_model_len."""
    if req.lengths is not None:
        return max(1, min(req.max_model_len, math.ceil(req.lengths.mean_tokens)))
    return max(1, req.max_model_len // 4)


def recommend_max_num_seqs(req: PlanRequest, util: float, batched: int, cap: int,
                            vllm_quant: str | None) -> int:
    """Largest s ≤ cap whose sampler reserve still leaves room for s typical requests (and for
    one request of max_model_len).

    The pool shrinks as s grows (the sampler reserve is per sequence), so the predicate is
    monotone and a binary search finds the largest fitting s. Rounded down to a multiple of 8.
    """
    typical_blocks = blocks_for_tokens(typical_tokens(req), req.block_size)
    longest_blocks = blocks_for_tokens(req.max_model_len, req.block_size)

    def fits(seqs: int) -> bool:
        pool = size_request(req, util, seqs, max(batched, seqs), vllm_quant).pool_blocks
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


def evaluate(req: PlanRequest) -> MemoryPlan | CapacityFailure:
    """Size ``req``; return the plan or the first capacity check it fails."""
    validate_settings(req)
    inst = req.instance
    assert inst.compute_capability is not None  # checked by validate_settings
    cc = inst.compute_capability
    vllm_quant = vllm_quantization_for(req.fmt, cc)
    util_source = "explicit" if req.gpu_memory_utilization is not None else "sku-rule"
    util = (
        req.gpu_memory_utilization
        if req.gpu_memory_utilization is not None
        else gpu_memory_utilization_for(inst.memory_per_accelerator_bytes)
    )
    seq_cap, batched_default = default_caps(inst)

    # Capacity checks that do not depend on the scheduler settings come first.
    floor_sizing = size_request(req, util, 1, 1, vllm_quant)
    if floor_sizing.weights > floor_sizing.budget:
        return CapacityFailure(
            "weights",
            f"its weights need {gib(floor_sizing.weights)} per GPU but vLLM's budget is "
            f"{gib(floor_sizing.budget)} ({util:.2f} × {gib(inst.memory_per_accelerator_bytes)} "
            f"{inst.accelerator_model})",
            {"weights": floor_sizing.weights, "budget": floor_sizing.budget},
        )

    if req.max_num_seqs is not None:
        max_num_seqs, seqs_source = req.max_num_seqs, "explicit"
    else:
        batched_guess = req.max_num_batched_tokens or batched_default
        max_num_seqs = recommend_max_num_seqs(req, util, batched_guess, seq_cap, vllm_quant)
        seqs_source = "recommended"
    batched = req.max_num_batched_tokens or max(batched_default, max_num_seqs)
    sizing = size_request(req, util, max_num_seqs, batched, vllm_quant)

    if sizing.pool_blocks < 1:
        static = sizing.weights + sizing.lora + sizing.reserve
        lora_part = f" + {gib(sizing.lora)} LoRA slots" if sizing.lora else ""
        return CapacityFailure(
            "no-kv-room",
            f"weights ({gib(sizing.weights)}){lora_part} + activation/sampler reserve "
            f"({gib(sizing.reserve)}) = {gib(static)} per GPU leave no KV cache in vLLM's "
            f"{gib(sizing.budget)} budget ({util:.2f} × "
            f"{gib(inst.memory_per_accelerator_bytes)} {inst.accelerator_model})",
            {"static": static, "budget": sizing.budget},
        )
    pool_tokens = sizing.pool_blocks * req.block_size
    needed_blocks = blocks_for_tokens(req.max_model_len, req.block_size)
    if sizing.pool_blocks < needed_blocks:
        return CapacityFailure(
            "max-model-len",
            f"one {req.max_model_len:,}-token sequence needs "
            f"{gib(needed_blocks * sizing.block_bytes)} of KV cache "
            f"({sizing.kv_per_token:,} B/token) but the pool left after weights "
            f"({gib(sizing.weights)}) and reserve ({gib(sizing.reserve)}) is "
            f"{gib(sizing.pool_blocks * sizing.block_bytes)}, {tokens_text(pool_tokens)}",
            {"pool_tokens": pool_tokens},
        )
    if req.max_num_seqs is not None:
        sane_tokens = min(MIN_SANE_SEQUENCE_TOKENS, req.max_model_len)
        sane_blocks = blocks_for_tokens(sane_tokens, req.block_size)
        holdable = sizing.pool_blocks // sane_blocks
        if req.max_num_seqs > holdable:
            return CapacityFailure(
                "max-num-seqs",
                f"max_num_seqs {req.max_num_seqs:,} exceeds what the KV pool "
                f"({tokens_text(pool_tokens)}, {gib(sizing.pool_blocks * sizing.block_bytes)}) "
                f"holds even at {sane_tokens:,} tokens per sequence: {holdable:,} sequences",
                {"holdable": holdable},
            )
    if req.max_num_batched_tokens is not None and req.max_num_batched_tokens > pool_tokens:
        return CapacityFailure(
            "max-num-batched-tokens",
            f"max_num_batched_tokens {req.max_num_batched_tokens:,} exceeds the whole KV pool "
            f"({tokens_text(pool_tokens)}); one scheduler step could never be served",
            {"pool_tokens": pool_tokens},
        )
    return assemble(req, util, util_source, max_num_seqs, seqs_source, batched, sizing,
                     vllm_quant)


def assemble(req: PlanRequest, util: float, util_source: str, max_num_seqs: int, seqs_source: str,
              batched: int, sizing: Sizing, vllm_quant: str | None) -> MemoryPlan:
    """The :class:`MemoryPlan` of a request that passed every check."""
    inst = req.instance
    assert inst.compute_capability is not None
    cc = inst.compute_capability
    pool_blocks = sizing.pool_blocks
    pool_tokens = pool_blocks * req.block_size
    at_max = pool_blocks // blocks_for_tokens(req.max_model_len, req.block_size)
    buckets = bucket_concurrency(req, pool_blocks, max_num_seqs)
    mean_tokens = req.lengths.mean_tokens if req.lengths is not None else None
    at_mean = (
        int(pool_blocks // req.lengths.mean_blocks(req.block_size))
        if req.lengths is not None
        else None
    )
    warnings = plan_warnings(req, util, util_source, max_num_seqs, at_max, sizing)
    max_cpu_loras = (
        req.max_cpu_loras if req.max_cpu_loras is not None else 2 * req.max_loras
    )
    return MemoryPlan(
        model_name=req.model.name,
        parameter_count=req.model.parameter_count,
        quantization=req.fmt.label(),
        vllm_quantization=vllm_quant,
        dtype=engine_dtype(req.fmt, vllm_quant, cc),
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
        buckets=buckets,
        cost_per_hour_usd=inst.on_demand_usd_per_hour,
        cost_per_month_usd=round(inst.on_demand_usd_per_hour * HOURS_PER_MONTH, 2),
        price_region=PRICE_REGION,
        prices_compiled_on=PRICES_COMPILED_ON,
        warnings=tuple(warnings),
    )


def bucket_concurrency(req: PlanRequest, pool_blocks: int,
                       max_num_seqs: int) -> tuple[BucketConcurrency, ...]:
    """Each request bucket's concurrency in a pool of ``pool_blocks`` blocks."""
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
    return tuple(buckets)


def plan_warnings(req: PlanRequest, util: float, util_source: str, max_num_seqs: int, at_max: int,
              sizing: Sizing) -> list[str]:
    """Notes on a plan that fits but deserves a second look (printed, never a refusal)."""
    inst = req.instance
    notes: list[str] = []
    sku_util = gpu_memory_utilization_for(inst.memory_per_accelerator_bytes)
    headroom = inst.memory_per_accelerator_bytes - sizing.budget
    if util_source == "explicit" and util > sku_util:
        notes.append(
            f"gpu_memory_utilization {util:.2f} is above the {inst.accelerator_model} rule "
            f"({sku_util:.2f}): it leaves {gib(headroom)} outside vLLM's budget where "
            f"{gib(OUTSIDE_BUDGET_HEADROOM_BYTES)} is wanted for the CUDA context, allocator "
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

