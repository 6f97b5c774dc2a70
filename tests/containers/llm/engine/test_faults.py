"""Real faults on a real engine: the engine-core process killed with SIGKILL under load (what a
CUDA OOM in a step does to vLLM on a GPU), and SIGTERM with a stream in flight.

On a GPU an out-of-memory error inside an engine step kills vLLM's engine-core child process and
every in-flight ``generate`` gets EngineDeadError; killing that process here does exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import metrics_contract as mc
from tests.containers.llm.engine.conftest import Servers, emf_values
from tests.support.cpu_engine import EngineConfig, ServerProcess, engine_core_pid

pytestmark = pytest.mark.engine
CONCURRENT = 32
PING_BUDGET_S = 1.0
"""The slowest /ping across the death, the rebuild and its warmup, timed from another process:
the event loop never waits on the rebuild (tens of seconds here) and answers well inside
SageMaker's 2 s ping timeout. Wall-clock time on two cores the suite shares: a CI run measured
140 ms once in 1,146 polls (7-20 ms when the test runs alone), so the bound is not the place
to catch a pause of a few hundred milliseconds; GC_PAUSE_BUDGET_MS is."""
GC_PAUSE_BUDGET_MS = 100.0
"""The longest collection the gateway timed itself (its gauge lines' ``gc_pause_max_ms``) from
the kill on: the start's frozen heap is never walked again, so the rebuild's collections take
a few milliseconds (none over 5 ms alone); an unfrozen heap's oldest-generation collection takes
240-310 ms (docs/gateway.md, Garbage collector)."""


@pytest.fixture(scope="module")
def gateway(servers: Servers) -> ServerProcess:
    server = servers.gateway(EngineConfig(), GATEWAY_ENGINE_RESTART_BACKOFF_S="0.5",
                             GATEWAY_DRAIN_TIMEOUT_S="20")
    server.wait_healthy("/ping")
    return server


MESSAGES = [
    {"role": "system", "content": "You are MangaAssist, a manga shop assistant."},
    {"role": "user", "content": "鬼滅の刃に似たマンガを5つ教えてください。"},
    {"role": "assistant", "content": "『呪術廻戦』『チェンソーマン』などがおすすめです。"},
    {"role": "user", "content": "Which of them has an English edition with color pages?"},
]


@dataclass
class Outcome:
    """How one request ended."""

    kind: str  # "complete", "fallback", "shed", or what went wrong
    status: int | None = None
    detail: str = ""
    chunks: list[dict[str, Any]] = field(default_factory=list)


def classify_json(response: httpx.Response) -> Outcome:
    if response.status_code in (429, 503):  # admission's refusal, or the rebuild's
        return Outcome("shed" if response.headers.get("Retry-After") else
                       f"{response.status_code} without Retry-After", response.status_code,
                       response.text[:200])
    if response.status_code != 200:
        return Outcome(f"status {response.status_code}", response.status_code,
                       response.text[:200])
    body = response.json()
    extension = body["mangaassist"]
    if extension["fallback"]:
        return Outcome("fallback", 200, extension["fallback"]["reason"])
    finish = body["choices"][0]["finish_reason"]
    return Outcome("complete" if finish in ("stop", "length") else f"finish {finish}", 200)


async def send(client: httpx.AsyncClient, index: int, streaming: bool,
               first_tokens: asyncio.Event) -> Outcome:
    body = {"model": "manga" if index % 2 else "tiny-llama3", "messages": MESSAGES,
            "max_tokens": 160, "temperature": 0.8}
    try:
        if not streaming:
            return classify_json(await client.post("/invocations", json=body))
        async with client.stream("POST", "/invocations", json={**body, "stream": True}) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return classify_json(reply)
            payloads: list[str] = []
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    payloads.append(line.removeprefix("data: "))
                    if len(payloads) == 3:
                        first_tokens.set()
        if not payloads or payloads[-1] != "[DONE]":
            return Outcome("stream without [DONE]", 200, repr(payloads[-2:]))
        chunks = [json.loads(p) for p in payloads[:-1]]
        final = chunks[-1]
        if "error" in final:
            return Outcome("stream error", 200, json.dumps(final)[:200])
        reason = final["choices"][0]["finish_reason"]
        if reason not in ("stop", "length"):
            return Outcome("stream without final chunk", 200, json.dumps(final)[:200])
        fallback = final["mangaassist"]["fallback"]
        return Outcome("fallback" if fallback else "complete", 200,
                       fallback["reason"] if fallback else "", chunks)
    except httpx.HTTPError as error:
        return Outcome(f"transport error {type(error).__name__}", None, str(error))


POLLER = Path(__file__).with_name("ping_poller.py")


class PingPoller:
    """Polls /ping every 20 ms from its own process and connection: the test's own event loop
    is busy with 32 streams, and timing /ping there would measure the client, not the gateway."""

    def __init__(self, port: int, work: Path) -> None:
        self.out = work / "pings.jsonl"
        self.stop_file = work / "stop"
        self.process = subprocess.Popen([sys.executable, str(POLLER), str(port), str(self.out),
                                         str(self.stop_file)])

    def samples(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    @property
    def statuses(self) -> list[dict[str, Any]]:
        return [sample["ping"] for sample in self.samples()]

    def stop(self) -> None:
        self.stop_file.touch()
        self.process.wait(timeout=30)


@dataclass
class Probe:
    """A short request sent every 0.1 s across the rebuild: when it left, how it ended."""

    sent: float
    status: int
    seconds: float
    retry_after: str | None


async def probe_until_served(client: httpx.AsyncClient, probes: list[Probe],
                             stop_at: float) -> None:
    """Short requests 0.1 s apart until one is served or ``stop_at`` passes."""
    while time.monotonic() < stop_at:
        sent, started = time.time(), time.perf_counter()
        response = await client.post("/invocations", json={
            "messages": [{"role": "user", "content": "Recommend one manga."}], "max_tokens": 4})
        probes.append(Probe(sent, response.status_code, time.perf_counter() - started,
                            response.headers.get("Retry-After")))
        if response.status_code == 200:
            return
        await asyncio.sleep(0.1)


def gc_pauses_since(lines: list[dict[str, Any]], since: float) -> list[float]:
    """The longest collection (ms) of each gauge line the gateway wrote after ``since``."""
    return [line["gc_pause_max_ms"] for line in lines if "gc_pause_max_ms" in line
            and line["_aws"]["Timestamp"] / 1000 > since]


def held(pid: int, *, samples: int = 5, gap_s: float = 0.1) -> dict[str, int]:
    """What the gateway process holds: open descriptors, threads, its shared-memory files —
    each the least of ``samples`` looks ``gap_s`` apart. A request just answered can leave its
    connection's socket open for a moment (the client's close still on its way): one look
    counted it on one side of a comparison and not the other (32 before, 37 after: a +5 that
    was a +4 and a closing socket)."""
    looks = []
    for index in range(samples):
        if index:
            time.sleep(gap_s)
        shm = sum(1 for entry in Path("/dev/shm").iterdir() if str(pid) in entry.name) \
            if Path("/dev/shm").is_dir() else 0
        looks.append({"fds": len(os.listdir(f"/proc/{pid}/fd")),
                      "threads": len(os.listdir(f"/proc/{pid}/task")), "shm": shm})
    return {key: min(look[key] for look in looks) for key in looks[0]}


@pytest.mark.budget(reason="the module's engine start lands in its setup, then three engine rebuilds, each warmed up before it serves, the first under 32 concurrent requests (about 90 s on the quiet machine, 130 s beside the rest of the suite)")
def test_sigkill_of_the_engine_core_under_load_loses_no_request(gateway: ServerProcess,
                                                               tmp_path: Path) -> None:
    """A SIGKILL of the engine core under 32 requests: each in flight ends (fallback or
    answer), requests meanwhile get a 503 at once, the rebuilt engine runs the start's warmup
    before a live request reaches it, then serves 10 of 10, and the process holds no more than
    before the death."""
    core = engine_core_pid(gateway.process.pid)
    warm = [httpx.post(f"{gateway.url}/invocations", timeout=60.0, json={
        "model": "manga", "messages": MESSAGES, "max_tokens": 8}).status_code for _ in range(3)]
    assert warm == [200] * 3  # the first traffic's connections and buffers, before counting
    before = held(gateway.process.pid)
    poller = PingPoller(gateway.port, tmp_path)
    probes: list[Probe] = []

    async def scenario() -> list[Outcome]:
        first_tokens = asyncio.Event()
        limits = httpx.Limits(max_connections=CONCURRENT + 4)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60.0, limits=limits) as client:
            requests = [asyncio.create_task(send(client, index, index % 2 == 0, first_tokens))
                        for index in range(CONCURRENT)]
            await asyncio.wait_for(first_tokens.wait(), timeout=60)
            nonlocal killed_at
            killed_at = time.time()
            os.kill(core, signal.SIGKILL)
            outcomes = await asyncio.gather(*requests)
            await probe_until_served(client, probes, time.monotonic() + 240)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # keep polling until the engine is back
            if poller.statuses and poller.statuses[-1]["engine_generation"] >= 1 and \
                    poller.statuses[-1]["engine"] == "ready":
                break
            await asyncio.sleep(0.2)
        return outcomes

    killed_at = 0.0
    try:
        outcomes = asyncio.run(scenario())
    finally:
        poller.stop()
    samples = poller.samples()
    latencies = [sample["s"] for sample in samples]
    statuses = [sample["ping"] for sample in samples]
    slowest = max(samples, key=lambda sample: sample["s"])
    kinds = [outcome.kind for outcome in outcomes]
    summary = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
    print(f"\n{CONCURRENT} requests across the SIGKILL: {summary}; /ping p50 "
          f"{statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms "
          f"({slowest['t'] - killed_at:+.1f} s after the kill, {slowest['ping']['status']}) over "
          f"{len(latencies)} polls")
    bad = [outcome for outcome in outcomes if outcome.kind not in ("complete", "fallback", "shed")]
    assert not bad, bad
    assert summary.get("fallback", 0) >= 1, "the kill must have hit requests in flight"
    assert max(latencies) < PING_BUDGET_S, (
        f"/ping took {slowest['s'] * 1000:.0f} ms, {slowest['t'] - killed_at:+.1f} s after the "
        f"kill, while {slowest['ping']['status']} / engine {slowest['ping']['engine']}")
    assert all(status["status"] in ("healthy", "recovering") for status in statuses), \
        {status["status"] for status in statuses}

    ping = httpx.get(f"{gateway.url}/ping", timeout=2.0).json()
    assert ping["status"] == "healthy"
    assert (ping["engine_generation"], ping["engine_restarts"]) == (1, 1)
    assert ping["adapters"] == {"manga": "loaded", "support": "loaded"}
    new_core = engine_core_pid(gateway.process.pid)
    assert new_core != core, "a new engine core was started in the same gateway process"

    answer = httpx.post(f"{gateway.url}/invocations", timeout=60.0, json={
        "model": "manga", "messages": MESSAGES, "max_tokens": 8}).json()
    assert answer["mangaassist"]["fallback"] is None
    lines = gateway.json_lines()
    assert sum(emf_values(lines, mc.ENGINE_RESTARTS.name)) == 1
    assert len(emf_values(lines, mc.OOM_CIRCUIT_TRIPS.name)) == 1
    (death,) = gateway.events("engine_death")
    assert death["cause"] == "engine_dead"
    assert_rebuilt_engine_warmed_before_it_served(gateway, samples, probes, killed_at)
    served = [httpx.post(f"{gateway.url}/invocations", timeout=60.0, json={
        "model": "manga", "messages": MESSAGES, "max_tokens": 8}).status_code
        for _ in range(10)]
    assert served == [200] * 10
    after = [held(gateway.process.pid)]
    for generation in (2, 3):  # two more deaths, idle: what a rebuild leaves must not add up
        os.kill(engine_core_pid(gateway.process.pid), signal.SIGKILL)
        wait_until_serving(gateway, generation)
        after.append(held(gateway.process.pid))
    print(f"held before the first death {before}, after each of 3 rebuilds {after}")
    # The first rebuild adds one thread and two descriptors for good: the stderr tee of the
    # first engine's start (engines/start_failure.py), which multiprocessing's resource tracker,
    # started with that engine, keeps open. Nothing more, and nothing per rebuild.
    assert after[0]["fds"] <= before["fds"] + 4, (before, after)
    assert after[0]["threads"] <= before["threads"] + 1, (before, after)
    assert after[-1]["fds"] <= after[0]["fds"] + 1, (before, after)
    assert after[-1]["threads"] <= after[0]["threads"], (before, after)
    assert after[-1]["shm"] <= before["shm"], (before, after)
    settled = time.time()  # a gauge line (one a second) after this covers the last rebuild
    while not gc_pauses_since(gateway.json_lines(), settled) and time.time() < settled + 10:
        time.sleep(0.1)
    pauses = gc_pauses_since(gateway.json_lines(), killed_at)
    print(f"longest collection in each of the {len(pauses)} gauge lines since the first kill: "
          f"max {max(pauses, default=0):g} ms")
    assert pauses and max(pauses) < GC_PAUSE_BUDGET_MS, pauses


def wait_until_serving(gateway: ServerProcess, generation: int) -> None:
    """Until /ping shows engine ``generation`` ready (rebuilt and warmed up)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            ping = httpx.get(f"{gateway.url}/ping", timeout=2.0).json()
            if (ping["engine_generation"], ping["engine"]) == (generation, "ready"):
                return
        time.sleep(0.2)
    raise AssertionError(f"engine {generation} not serving within 240 s")


def assert_rebuilt_engine_warmed_before_it_served(gateway: ServerProcess,
                                                  samples: list[dict[str, Any]],
                                                  probes: list[Probe], killed_at: float) -> None:
    """Warmup ran on engine 1 before /ping showed it ready; every probe sent before then was
    answered 503 at once with a Retry-After; the first 200 came after."""
    lines = gateway.json_lines()
    rewarm = [index for index, line in enumerate(lines) if line.get("event") == "rewarm_started"]
    healthy = [index for index, line in enumerate(lines) if line.get("event") == "start_phase"
               and line.get("phase") == "healthy" and line.get("engine_generation") == 1]
    assert rewarm and healthy and rewarm[0] < healthy[0], (rewarm, healthy)
    phases = [line["phase"] for line in lines[rewarm[0]:healthy[0] + 1]
              if line.get("event") == "start_phase"]
    assert phases == ["warmup_first_use", "warmup_measure", "gc_freeze", "healthy"], phases
    ready_at = min(sample["t"] for sample in samples
                   if sample["ping"]["engine_generation"] == 1
                   and sample["ping"]["engine"] == "ready")
    early = [probe for probe in probes if killed_at < probe.sent < ready_at - 0.05]
    assert early, "no request arrived during the rebuild"
    assert {probe.status for probe in early} == {503}, early
    assert all(probe.retry_after and int(probe.retry_after) >= 1 for probe in early), early
    slowest = max(probe.seconds for probe in early)
    print(f"{len(early)} requests during the rebuild: 503 each, slowest {slowest * 1000:.1f} ms")
    # At once, not held until the engine is back (the rebuild takes tens of seconds here). The
    # bound leaves room for what can hold the event loop meanwhile: the rebuilt engine's heap
    # freeze (0.30-0.34 s on this machine) on two cores the rest of the suite shares (a probe
    # took 0.88 s in a full run where 0.5 s had been the bound).
    assert slowest < 2.0, slowest
    assert probes[-1].status == 200 and probes[-1].sent > ready_at - 0.05, probes[-1]


def test_sigterm_lets_a_stream_finish_then_exits_0(gateway: ServerProcess) -> None:
    payloads: list[str] = []
    with httpx.stream("POST", f"{gateway.url}/invocations", timeout=60.0, json={
            "model": "tiny-llama3", "messages": MESSAGES, "max_tokens": 200, "temperature": 0,
            "stream": True}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                payloads.append(line.removeprefix("data: "))
                if len(payloads) == 2:
                    gateway.process.send_signal(signal.SIGTERM)
    assert payloads[-1] == "[DONE]"
    final = json.loads(payloads[-2])
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert final["mangaassist"]["fallback"] is None
    assert gateway.process.wait(timeout=60) == 0
    assert not gateway.events("fatal")
