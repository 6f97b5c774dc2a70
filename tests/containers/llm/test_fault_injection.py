"""Fault injection: 64 concurrent 30-turn sessions against the real server; an OOM kills the
engine mid-run. The process never exits, every request gets an answer (generated, a fallback,
or a 429/503 with Retry-After), /ping keeps answering fast, the breaker opens and closes, the
engine is rebuilt, and the OOM trip is in the EMF output."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA, SYSTEM_PROMPT_EN
from tests.containers.llm.harness import GatewayProcess
from tests.containers.llm.test_telemetry import assert_valid_emf

SESSIONS = 64
TURNS = 30
INJECT_AFTER = SESSIONS * TURNS * 3 // 10  # turns completed before the OOM

RETRY_FOR_S = 30.0
"""How long a session keeps sending a refused turn again before it counts as never served."""
FAULT_ENV = {
    "GATEWAY_TEST_MODE": "true",
    "ENGINE_MAX_MODEL_LEN": "2048",
    "ENGINE_NUM_GPU_BLOCKS": "1024",
    "SIM_STEP_TIME_S": "0.002",
    "SIM_EOS_PROBABILITY": "0",
    "GATEWAY_BUCKET_CAPS": "S=64,M=64,L=64,XL=64",
    "GATEWAY_ADMISSION_WAIT_S": "2",
    "GATEWAY_RETRY_AFTER_S": "1",
    "GATEWAY_BREAKER_OPEN_S": "0.5",
    "GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES": "10",
    "GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT": "4",
    "GATEWAY_ENGINE_RESTART_BACKOFF_S": "0.1",
    "GATEWAY_RECOVERY_GRACE_S": "30",
    "GATEWAY_METRICS_INTERVAL_S": "0.5",
}


@dataclass
class Observations:
    statuses: dict[int, int] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    missing_retry_after: int = 0
    unexpected: list[str] = field(default_factory=list)
    turns_done: int = 0
    pings: list[tuple[float, int, str, str]] = field(default_factory=list)
    injected_at: float | None = None


async def session(client: httpx.AsyncClient, index: int, seen: Observations,
                  inject: asyncio.Event) -> None:
    rng = random.Random(index)
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT_EN}]
    locale = "ja-JP" if index % 2 else "en-US"
    for turn in range(TURNS):
        pool = MANGA_CORPUS_JA if locale == "ja-JP" else MANGA_CORPUS_EN
        question = f"({index}.{turn}) " + " ".join(rng.sample(pool, 3))
        body = {"model": "auto", "max_tokens": 12,
                "messages": [*messages, {"role": "user", "content": question}],
                "mangaassist": {"intent": rng.choice(["recommendation", "order_tracking", "faq"]),
                                "locale": locale, "pinned_messages": []}}
        # A refused turn is sent again every 50 ms for up to 30 s: a 503 during the rebuild now
        # comes at once (it used to wait for the engine), so a count of tries would measure
        # how fast the gateway refuses, not whether the turn is served once the engine is back.
        retry_until = asyncio.get_running_loop().time() + RETRY_FOR_S
        while asyncio.get_running_loop().time() < retry_until:
            response = await client.post("/invocations", json=body)
            seen.statuses[response.status_code] = seen.statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                break
            if response.status_code in (429, 503):
                if "retry-after" not in response.headers:
                    seen.missing_retry_after += 1
                await asyncio.sleep(0.05)
                continue
            seen.unexpected.append(f"{response.status_code}: {response.text[:300]}")
            return
        else:
            seen.unexpected.append(f"session {index} turn {turn}: never served")
            return
        answer = response.json()
        fallback = answer["mangaassist"]["fallback"]
        if fallback is not None:
            seen.fallbacks.append(fallback["reason"])
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}]
        seen.turns_done += 1
        if seen.turns_done >= INJECT_AFTER:
            inject.set()


async def pinger(url: str, seen: Observations, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.get("/ping")
            body = response.json()
            seen.pings.append((time.perf_counter() - started, response.status_code,
                               body["status"], body["breaker"]))
            await asyncio.sleep(0.05)


async def injector(url: str, seen: Observations, inject: asyncio.Event) -> None:
    """The OOM, once the sessions are far enough in and the engine has requests running (on a
    starved machine the sessions' client can leave it a moment with none, and an OOM then has
    no request in flight to answer with its fallback: one `make test` run saw only a request
    that raced the death, answered `engine_dead`). It waits for that up to 5 s: a run beside the
    rest of the suite on a two-core machine without AVX-512 still saw only `engine_dead` with a
    1 s wait (issue 37, eighteenth round)."""
    await inject.wait()
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        for _ in range(500):
            admission = (await client.get("/ping")).json()["admission"]
            if admission["running_sequences"] >= 4:
                break
            await asyncio.sleep(0.01)
        response = await client.post("/admin/engine/oom")
        assert response.status_code == 200, response.text
        seen.injected_at = time.perf_counter()


async def run_sessions(url: str) -> Observations:
    seen = Observations()
    inject, stop = asyncio.Event(), asyncio.Event()
    limits = httpx.Limits(max_connections=SESSIONS, max_keepalive_connections=SESSIONS)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        ping_task = asyncio.create_task(pinger(url, seen, stop))
        inject_task = asyncio.create_task(injector(url, seen, inject))
        await asyncio.gather(*(session(client, i, seen, inject) for i in range(SESSIONS)))
        await inject_task
        stop.set()
        await ping_task
    return seen


def test_oom_mid_run_is_contained(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway(FAULT_ENV)
    gateway.wait_ready()
    started = time.perf_counter()
    seen = asyncio.run(run_sessions(gateway.url))
    print(f"{seen.turns_done} turns in {time.perf_counter() - started:.1f} s; statuses "
          f"{seen.statuses}; fallbacks {len(seen.fallbacks)}; pings {len(seen.pings)}")

    # The process lived and every request got an answer.
    assert gateway.process.poll() is None
    assert not seen.unexpected, seen.unexpected[:5]
    assert set(seen.statuses) <= {200, 429, 503}, seen.statuses
    assert seen.missing_retry_after == 0
    assert seen.turns_done == SESSIONS * TURNS
    assert seen.injected_at is not None

    # In-flight requests at the OOM got the controlled fallback instead of an error.
    assert "engine_out_of_memory" in seen.fallbacks, seen.fallbacks

    # /ping answered every time, fast, and never asked SageMaker to replace the instance.
    assert len(seen.pings) > 20
    assert max(latency for latency, *_ in seen.pings) < 2.0
    assert {status for _, status, *_ in seen.pings} == {200}
    assert {state for *_, state, _ in seen.pings} <= {"healthy", "recovering"}
    breaker_seen = {breaker for *_, breaker in seen.pings}
    assert "open" in breaker_seen or "half_open" in breaker_seen, seen.pings[-5:]

    # After the run: healthy again, breaker closed, engine rebuilt once.
    final = gateway.ping().json()
    assert final["status"] == "healthy"
    assert final["breaker"] == "closed"
    assert final["engine_generation"] == 1
    assert final["engine_restarts"] == 1

    # The EMF output tells the story: one trip, open → half-open → closed, one restart.
    documents = gateway.emf()
    for document in documents:
        assert_valid_emf(document)
    trips = [d for d in documents if "OOMCircuitTrips" in d]
    assert len(trips) == 1
    assert trips[0]["cause"] == "out_of_memory"
    transitions = [(d["from_state"], d["to_state"]) for d in documents
                   if d.get("event") == "breaker_transition"]
    assert transitions[:3] == [("closed", "open"), ("open", "half_open"),
                               ("half_open", "closed")], transitions
    assert len([d for d in documents if "EngineRestarts" in d]) == 1
    fallback_lines = [d for d in documents if d.get("Fallbacks") == 1.0]
    assert len(fallback_lines) == seen.fallbacks.count("engine_out_of_memory") + len(
        [reason for reason in seen.fallbacks if reason != "engine_out_of_memory"])
    assert any(d.get("event") == "gauges" and d["BreakerState"] == 2.0 for d in documents) or (
        "open" in breaker_seen)
