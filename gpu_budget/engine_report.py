"""Cross-check the plan against the KV capacity vLLM reports after start-up.

vLLM logs "GPU KV cache size: N tokens" and exposes ``engine.vllm_config.cache_config
.num_gpu_blocks``; the container compares that with the plan and warns (and emits a metric)
when they differ by more than 10 %: then the engine's own figure is what admission control must
trust, and the plan's constants need re-checking on that GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpu_budget.planner import MemoryPlan

ENGINE_REPORT_TOLERANCE = 0.10
"""Relative difference between planned and engine-reported KV tokens that warrants a warning."""


@dataclass(frozen=True)
class EngineKvComparison:
    """Planned KV capacity vs what the engine reports after start-up."""

    planned_kv_tokens: int
    engine_kv_tokens: int
    engine_num_gpu_blocks: int
    engine_block_size: int
    relative_difference: float
    tolerance: float
    within_tolerance: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)


def compare_engine_report(
    plan_or_tokens: MemoryPlan | int,
    num_gpu_blocks: int,
    block_size: int,
    *,
    tolerance: float = ENGINE_REPORT_TOLERANCE,
) -> EngineKvComparison:
    """Compare the plan with vLLM's ``cache_config.num_gpu_blocks`` × ``block_size``.

    ``relative_difference`` is (engine − planned) / planned; ``within_tolerance`` is False when
    its magnitude exceeds ``tolerance`` (10 %), which the container turns into a warning and a
    metric. ``plan_or_tokens`` may be the plan or its ``kv_pool_tokens``.
    """
    planned = (
        plan_or_tokens.kv_pool_tokens
        if isinstance(plan_or_tokens, MemoryPlan)
        else plan_or_tokens
    )
    for name, value in (("planned KV tokens", planned), ("num_gpu_blocks", num_gpu_blocks),
                        ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    engine_tokens = num_gpu_blocks * block_size
    difference = (engine_tokens - planned) / planned
    within = abs(difference) <= tolerance
    direction = "more" if difference > 0 else "fewer"
    verdict = "within" if within else "outside"
    message = (
        f"engine KV cache holds {engine_tokens:,} tokens ({num_gpu_blocks:,} blocks × "
        f"{block_size}); the plan expected {planned:,}: {abs(difference):.1%} {direction}, "
        f"{verdict} the {tolerance:.0%} tolerance"
    )
    if not within:
        message += (
            "; admission control should use the engine's figure and the plan's constants "
            "(reserve, headroom) should be re-checked against this GPU"
        )
    return EngineKvComparison(
        planned_kv_tokens=planned,
        engine_kv_tokens=engine_tokens,
        engine_num_gpu_blocks=num_gpu_blocks,
        engine_block_size=block_size,
        relative_difference=round(difference, 6),
        tolerance=tolerance,
        within_tolerance=within,
        message=message,
    )
