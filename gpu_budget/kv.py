"""KV-cache arithmetic: bytes per token, per block, and paged rounding.

Per token, every decoder layer stores one key and one value vector per KV head:
``layers × kv_heads × 2 × head_dim × kv-dtype bytes``. Under tensor parallelism each GPU holds
``kv_heads // tp`` heads (at least one: vLLM replicates KV heads when tp exceeds them), so the
figure is per GPU. Llama-3-8B in bf16: 32 × 8 × 2 × 128 × 2 = 131,072 B.

vLLM's paged KV cache allocates whole blocks (``block_size`` tokens, 16 by default): a block of
one layer is ``2 × block_size × kv_heads × head_dim × dtype bytes`` and the engine divides the
memory left for the cache by (that × layers) — the same as ``block_size × kv_bytes_per_token``.
"""

from __future__ import annotations

from gpu_budget.model_spec import ModelSpec

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default block size on CUDA, and ours (``ENGINE_BLOCK_SIZE``'s default: the row of
:data:`gpu_budget.engine_args.ENGINE_ARGS` reads it from here)."""

KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,  # the model's activation dtype (2 bytes for bf16/fp16)
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""vLLM ``kv_cache_dtype`` values this budget understands, with bytes per element."""


def kv_dtype_bytes(kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element for a vLLM ``kv_cache_dtype`` (``auto`` = 2, the 16-bit model dtype)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not supported; accepted: "
            + ", ".join(KV_CACHE_DTYPES)
        )
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    return 2 if size is None else size


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads one GPU stores: ``kv_heads // tp``, at least 1 (replicated beyond)."""
    return max(1, model.num_key_value_heads // tensor_parallel_size)


def kv_bytes_per_token(
    model: ModelSpec, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
) -> int:
    """KV-cache bytes one token costs on one GPU."""
    return (
        model.num_hidden_layers
        * kv_heads_per_gpu(model, tensor_parallel_size)
        * 2
        * model.head_dim
        * kv_dtype_bytes(kv_cache_dtype)
    )


def kv_block_bytes(
    model: ModelSpec,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """Bytes of one KV block (all layers) on one GPU."""
    return block_size * kv_bytes_per_token(model, kv_cache_dtype, tensor_parallel_size)


def kv_pool_tokens(
    model: ModelSpec,
    pool_bytes: int,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> int:
    """Tokens a KV pool of ``pool_bytes`` holds: whole blocks only, as vLLM allocates them.

    This is the prediction the engine's own report (``num_gpu_blocks × block_size``) is compared
    with; on vLLM's CPU build with an explicit pool (``VLLM_CPU_KVCACHE_SPACE``) the test tier
    checks the two agree.
    """
    if pool_bytes < 0:
        raise ValueError(f"pool_bytes must be >= 0, got {pool_bytes}")
    block_bytes = kv_block_bytes(model, kv_cache_dtype, tensor_parallel_size, block_size)
    return (pool_bytes // block_bytes) * block_size
