"""Draw a plan: the per-GPU memory stack and concurrency against context length.

matplotlib is imported inside :func:`plot_plan` only, so the package stays importable (by the
stacks at synth, by the container) without it.
"""

from __future__ import annotations

from pathlib import Path

from gpu_budget.instances import GIB
from gpu_budget.planner import MemoryPlan


def concurrency_curve(memory_plan: MemoryPlan, points: int = 64) -> list[tuple[int, int]]:
    """(context length, concurrent sequences) pairs from one block up to the largest length.

    Lengths are spaced geometrically and rounded to whole blocks; concurrency is what the KV
    pool holds at that length (not capped by max_num_seqs).
    """
    block = memory_plan.block_size
    top = max(block, memory_plan.largest_max_model_len)
    lengths: list[int] = []
    ratio = (top / block) ** (1 / max(1, points - 1))
    value = float(block)
    for _ in range(points):
        rounded = max(block, round(value / block) * block)
        if not lengths or rounded > lengths[-1]:
            lengths.append(min(rounded, top))
        value *= ratio
    if lengths[-1] != top:
        lengths.append(top)
    return [(length, memory_plan.concurrency_at(length)) for length in lengths]


def plot_plan(memory_plan: MemoryPlan, path: str | Path) -> Path:
    """Write a PNG with the memory stack (left) and concurrency vs context length (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    fig, (stack_ax, curve_ax) = plt.subplots(
        1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 2.2]}
    )
    layers = [
        ("weights (static)", memory_plan.weights_bytes, "#4C72B0"),
        ("LoRA slots (static)", memory_plan.lora_bytes, "#8172B2"),
        ("max(activation, sampler) + non-torch reserve", memory_plan.reserve_bytes, "#DD8452"),
        ("KV cache pool (dynamic)", memory_plan.kv_pool_bytes, "#55A868"),
        (
            "unused remainder of budget",
            memory_plan.budget_bytes
            - memory_plan.weights_bytes
            - memory_plan.lora_bytes
            - memory_plan.reserve_bytes
            - memory_plan.kv_pool_bytes,
            "#CCCCCC",
        ),
        (
            f"outside vLLM budget (1 − {memory_plan.gpu_memory_utilization:.2f})",
            memory_plan.headroom_bytes,
            "#C44E52",
        ),
    ]
    bottom = 0.0
    for label, n_bytes, color in layers:
        if n_bytes < GIB // 20:  # invisible at this scale, e.g. the sub-block remainder
            continue
        height = n_bytes / GIB
        stack_ax.bar(
            0, height, bottom=bottom, color=color, width=0.6, label=f"{label}: {height:.1f} GiB"
        )
        bottom += height
    stack_ax.set_xlim(-0.6, 0.6)
    stack_ax.set_xticks([0])
    stack_ax.set_xticklabels([f"{memory_plan.gpu_model}\n(one GPU)"])
    stack_ax.set_ylabel("GiB")
    stack_ax.set_title(f"Memory per GPU — {memory_plan.gpu_memory_bytes / GIB:.1f} GiB")
    stack_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, frameon=False)

    curve = concurrency_curve(memory_plan)
    curve_ax.step([x for x, _ in curve], [y for _, y in curve], where="post", color="#4C72B0",
                  label="sequences the KV pool holds")
    curve_ax.axhline(memory_plan.max_num_seqs, color="#DD8452", linestyle="--",
                     label=f"max_num_seqs = {memory_plan.max_num_seqs}")
    curve_ax.axvline(memory_plan.max_model_len, color="#C44E52", linestyle=":",
                     label=f"max_model_len = {memory_plan.max_model_len:,} → "
                           f"{memory_plan.max_concurrency_at_max_len} concurrent")
    for bucket in memory_plan.buckets:
        if bucket.reachable and bucket.max_concurrency:
            curve_ax.plot(bucket.sized_tokens, bucket.max_concurrency, "o", color="#55A868")
            curve_ax.annotate(f"{bucket.bucket}: {bucket.max_concurrency}",
                              (bucket.sized_tokens, bucket.max_concurrency),
                              textcoords="offset points", xytext=(6, 6), fontsize=8)
    curve_ax.set_xscale("log", base=2)
    curve_ax.set_yscale("log")
    curve_ax.set_xlabel("tokens per sequence (prompt + generated)")
    curve_ax.set_ylabel("concurrent sequences")
    curve_ax.set_title(
        f"{memory_plan.model_name} · {memory_plan.quantization} · {memory_plan.instance_type} · "
        f"KV pool {memory_plan.kv_pool_tokens:,} tokens"
    )
    curve_ax.grid(True, which="both", alpha=0.3)
    curve_ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
