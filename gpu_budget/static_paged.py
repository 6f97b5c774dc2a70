"""Static (pre-allocated) versus paged KV allocation on the same KV pool.

Naive Transformers generation pre-allocates a cache of the maximum length for every request;
vLLM's PagedAttention hands out 16-token blocks as the sequence grows. Measured on one pool, the
ratio of the two concurrencies is the allocation policy's effect alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpu_budget.instances import GIB
from gpu_budget.lengths import RequestLengthDistribution, as_distribution
from gpu_budget.planner import MemoryPlan


@dataclass(frozen=True)
class StaticVsPaged:
    """KV waste and concurrency: pre-allocating max_model_len per request vs 16-token pages."""

    max_model_len: int
    block_size: int
    kv_pool_tokens: int
    request_count: int
    mean_request_tokens: float
    static_reserved_tokens_per_request: int
    paged_reserved_tokens_per_request: float
    static_waste_fraction: float
    paged_waste_fraction: float
    static_concurrency: int
    paged_concurrency: int
    paged_effective_concurrency: int
    concurrency_ratio: float
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        data = asdict(self)
        data["assumptions"] = list(self.assumptions)
        return data


def static_vs_paged(
    memory_plan: MemoryPlan,
    request_lengths: RequestLengthDistribution | Sequence[int],
) -> StaticVsPaged:
    """Compare static (naive Transformers) and paged (vLLM) KV allocation on one KV pool.

    Static: every request reserves ``max_model_len`` tokens of KV for its whole life, as a
    pre-allocated cache of maximum length does; waste = 1 − mean length / max_model_len.
    Paged: a request holds ``ceil(length / block_size)`` blocks; waste is only the unused tail of
    its last block. Both are measured against the same pool (the plan's), so the ratio isolates
    the allocation policy. Raises ``ValueError`` if a request is longer than max_model_len.
    """
    lengths = as_distribution(request_lengths)
    assert lengths is not None
    too_long = lengths.count_longer_than(memory_plan.max_model_len)
    if too_long:
        raise ValueError(
            f"{too_long} request length(s) exceed max_model_len {memory_plan.max_model_len:,}; "
            "a static cache of that length cannot hold them"
        )
    mean_tokens = lengths.mean_tokens
    mean_blocks = lengths.mean_blocks(memory_plan.block_size)
    paged_reserved = mean_blocks * memory_plan.block_size
    static_concurrency = memory_plan.kv_pool_tokens // memory_plan.max_model_len
    paged_concurrency = int(memory_plan.kv_pool_blocks // mean_blocks)
    effective = min(paged_concurrency, memory_plan.max_num_seqs)
    assumptions = (
        f"same KV pool for both: {memory_plan.kv_pool_tokens:,} tokens "
        f"({memory_plan.kv_pool_bytes / GIB:.1f} GiB) left after {memory_plan.quantization} "
        f"weights and reserve on {memory_plan.instance_type}",
        f"static allocation reserves max_model_len ({memory_plan.max_model_len:,} tokens) per "
        "request for its whole life",
        f"paged allocation reserves whole {memory_plan.block_size}-token blocks; "
        "prefix sharing is ignored (it would only favour paging further)",
        f"request lengths are prompt + generated tokens of {lengths.count} sampled requests "
        f"(mean {mean_tokens:,.0f})",
        f"paged concurrency is KV-bound; vLLM also caps it at max_num_seqs "
        f"({memory_plan.max_num_seqs})",
    )
    return StaticVsPaged(
        max_model_len=memory_plan.max_model_len,
        block_size=memory_plan.block_size,
        kv_pool_tokens=memory_plan.kv_pool_tokens,
        request_count=lengths.count,
        mean_request_tokens=round(mean_tokens, 1),
        static_reserved_tokens_per_request=memory_plan.max_model_len,
        paged_reserved_tokens_per_request=round(paged_reserved, 1),
        static_waste_fraction=round(1 - mean_tokens / memory_plan.max_model_len, 4),
        paged_waste_fraction=round(1 - mean_tokens / paged_reserved, 4),
        static_concurrency=static_concurrency,
        paged_concurrency=paged_concurrency,
        paged_effective_concurrency=effective,
        concurrency_ratio=round(paged_concurrency / static_concurrency, 2)
        if static_concurrency
        else math.inf,
        assumptions=assumptions,
    )
