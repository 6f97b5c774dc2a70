"""Benchmark: the intent classifier traced (TorchScript, as the cpu target serves) vs eager.

    python benchmarks/intent_traced_vs_eager.py [--size base|tiny] [--iterations 30]

Builds a random DistilBERT with DistilBERT-base's shapes (6 layers, 768 wide, 12 heads; random
weights, so latency is representative and answers are not), tokenizes sample manga queries to the
served shape (batch × 128 tokens, padded), and times the same module run eagerly and as
``torch.jit.trace`` output, at batch 1 and batch 8. The two are measured interleaved in one run
(eager, traced, traced, eager, ...) so background load hits both alike, and the table reports
p50 / p99 and the eager ÷ traced ratio (> 1: tracing is faster). It says nothing about
Inferentia, which needs an inf1/inf2 instance (see docs/intent.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from neuron.latency import LatencyStats
from neuron.random_model import SIZES, build_random_distilbert
from neuron.samples import texts_for_batch
from neuron.tokenization import encode_fixed, load_fixed_length_tokenizer
from neuron.tracing import logits_module


def _time_ms(model: Any, inputs: tuple[Any, Any]) -> float:
    started = time.perf_counter()
    model(*inputs)
    return (time.perf_counter() - started) * 1000.0


def measure(eager: Any, traced: Any, inputs: tuple[Any, Any], *, batch_size: int,
            warmup: int, iterations: int) -> tuple[LatencyStats, LatencyStats, float]:
    """Interleaved timings of both models; also the max |Δlogit| between them."""
    import torch

    eager_ms: list[float] = []
    traced_ms: list[float] = []
    with torch.no_grad():
        for _ in range(warmup):
            eager(*inputs)
            traced(*inputs)
        for index in range(iterations):
            if index % 2 == 0:
                eager_ms.append(_time_ms(eager, inputs))
                traced_ms.append(_time_ms(traced, inputs))
            else:
                traced_ms.append(_time_ms(traced, inputs))
                eager_ms.append(_time_ms(eager, inputs))
            if (index + 1) % max(1, iterations // 5) == 0:
                print(f"  batch {batch_size}: {index + 1}/{iterations}", file=sys.stderr,
                      flush=True)
        max_diff = float((eager(*inputs) - traced(*inputs)).abs().max())
    return (LatencyStats.from_samples_ms(eager_ms, batch_size=batch_size),
            LatencyStats.from_samples_ms(traced_ms, batch_size=batch_size), max_diff)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    import torch
    from transformers import AutoModelForSequenceClassification

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="intent-bench-") as tmp:
        print(f"building a random {args.size} DistilBERT ...", file=sys.stderr, flush=True)
        model_dir = build_random_distilbert(Path(tmp), size=args.size)
        hf_model = AutoModelForSequenceClassification.from_pretrained(
            str(model_dir), attn_implementation="eager").float().eval()
        eager = logits_module(hf_model)
        tokenizer = load_fixed_length_tokenizer(model_dir / "tokenizer.json",
                                                max_length=args.seq_length, pad_id=0)
        rows = []
        for batch_size in batch_sizes:
            batch = encode_fixed(tokenizer, texts_for_batch(batch_size))
            inputs = (torch.tensor(batch.input_ids), torch.tensor(batch.attention_mask))
            print(f"tracing batch {batch_size} × {args.seq_length} ...", file=sys.stderr,
                  flush=True)
            with torch.no_grad():
                traced = torch.jit.trace(eager, inputs)
            rows.append(measure(eager, traced, inputs, batch_size=batch_size,
                                warmup=args.warmup, iterations=args.iterations))

    params_m = sum(p.numel() for p in hf_model.parameters()) / 1e6
    print(f"\nDistilBERT {args.size} ({params_m:.1f} M parameters, random weights), "
          f"{args.seq_length} tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"{args.iterations} interleaved iterations each")
    print(f"{'batch':>5} | {'eager p50':>10} {'traced p50':>11} {'ratio':>6} | "
          f"{'eager p99':>10} {'traced p99':>11} {'ratio':>6} | {'max |Δlogit|':>12}")
    for eager_stats, traced_stats, max_diff in rows:
        print(f"{eager_stats.batch_size:>5} | {eager_stats.p50_ms:>8.2f}ms "
              f"{traced_stats.p50_ms:>9.2f}ms {eager_stats.p50_ms / traced_stats.p50_ms:>6.2f} | "
              f"{eager_stats.p99_ms:>8.2f}ms {traced_stats.p99_ms:>9.2f}ms "
              f"{eager_stats.p99_ms / traced_stats.p99_ms:>6.2f} | {max_diff:>12.2e}")
    print("ratio = eager ÷ traced (above 1: the traced model is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
