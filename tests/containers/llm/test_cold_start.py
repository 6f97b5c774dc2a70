"""A cold host: the engine's first use of each shape is slow (a kernel compile), and a gateway
that learned that as its speed refused every request while /ping said healthy (issue 30).

The simulator's ``SIM_FIRST_USE_S`` makes the first prefill of each prompt-length class and of
each adapter that much slower, once. Warmup's first pass pays it and teaches admission nothing;
/ping turns healthy only once a short request on the idle engine would have its first token
within the SLO at the drain rate measured; after that an idle gateway serves, and a rate gone
wrong corrects itself (docs/design-decisions.md#admission-lock-out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.app import GatewayRuntime
from gateway.tokenizer import ChatTokenizer
from tests.containers.llm.harness import GatewayProcess
from tests.support.demo_model import synthetic_conversation

COLD = {"SIM_FIRST_USE_S": "1.0", "SIM_STEP_TIME_S": "0.005", "SIM_EOS_PROBABILITY": "0",
        "GATEWAY_TTFT_SLO_S": "0.5", "GATEWAY_WARMUP_TIMEOUT_S": "120"}
"""A first use of each shape takes 1 s, twice the TTFT SLO; a step 5 ms."""


def short_chat(index: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"({index}) Recommend a manga like "
                                                      "Frieren, please."}],
            "max_tokens": 8, "stream": False}


def test_a_cold_host_serves_ten_requests_one_second_apart_after_warmup(
        start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway(COLD)
    ping = gateway.wait_ready(timeout_s=120)
    assert ping["status"] == "healthy"
    statuses, ttfts = [], []
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        for index in range(10):
            started = time.monotonic()
            response = client.post("/v1/chat/completions", json=short_chat(index))
            statuses.append(response.status_code)
            ttfts.append(time.monotonic() - started)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        admission = client.get("/ping").json()["admission"]
    assert statuses == [200] * 10, statuses
    assert max(ttfts) < 0.5, ttfts
    assert admission["refused_by_valve"] == 0 and admission["refused_while_idle"] == 0
    phases = {line["phase"]: line for line in gateway.lines() if line.get("event") == "start_phase"}
    assert list(phases) == ["start_cache", "engine_start", "warmup_first_use", "warmup_measure",
                            "gc_freeze", "healthy"]
    # The first pass paid the compiles (several shapes at 1 s each), the second did not.
    assert phases["warmup_first_use"]["seconds"] > 3.0
    assert phases["warmup_measure"]["seconds"] < phases["warmup_first_use"]["seconds"] / 2


@contextlib.asynccontextmanager
async def running(runtime: GatewayRuntime) -> AsyncIterator[httpx.AsyncClient]:
    """The runtime's lifespan (engine start, warmup) and a client on its app, once healthy."""
    async with runtime.lifecycle.lifespan(runtime.app):
        deadline = time.monotonic() + 60
        while not runtime.lifecycle.warmed_up:
            assert time.monotonic() < deadline, runtime.lifecycle.warmup_progress
            assert runtime.lifecycle.failure_reason is None, runtime.lifecycle.failure_reason
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=runtime.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway",
                                     timeout=30.0) as client:
            yield client


def test_a_rate_learned_from_one_off_costs_does_not_lock_an_idle_gateway_out(
        make_runtime: Any) -> None:
    """The lock-out itself, forced: after warmup the valve is set to believe the engine drains
    5 prompt tokens a second (a first use's compile, learned). An idle engine still serves every
    request (the floor admits a request when nothing waits), and their first tokens bring the
    rate back: a short request on the idle engine is within the SLO again."""
    runtime, _ = make_runtime(**COLD)

    async def scenario() -> tuple[list[int], float]:
        async with running(runtime) as client:
            runtime.admission.valve.reset(5.0)
            statuses = []
            for index in range(10):
                statuses.append((await client.post("/invocations",
                                                   json=short_chat(index))).status_code)
                await asyncio.sleep(0.05)
            return statuses, runtime.admission.idle_first_token_s(100)

    statuses, first_token_s = asyncio.run(scenario())
    assert statuses == [200] * 10
    assert first_token_s < 0.5


def test_the_burst_after_a_slow_burst_is_decided_by_the_rate_it_measured(
        make_runtime: Any, chat_tokenizer: ChatTokenizer) -> None:
    """A burst of twice what the KV pool holds; then one of eight times; then the first burst
    again. The first is decided by the rate warmup measured on an idle engine and lets in more
    than start within the SLO; the slow one teaches the rate at which a full pool drains
    prompts, so the repeat refuses at once what would start late: its admitted requests start
    within the SLO (a client's slack aside), and it refuses no more than the slow burst did."""
    runtime, lines = make_runtime(ENGINE_MAX_MODEL_LEN="1024", ENGINE_NUM_GPU_BLOCKS="320",
                                  SIM_STEP_TIME_S="0.005", SIM_EOS_PROBABILITY="0",
                                  GATEWAY_TTFT_SLO_S="0.7", GATEWAY_RETRY_AFTER_S="1")
    bodies = [{"messages": synthetic_conversation(chat_tokenizer.tokenizer, turns=7,
                                                  tokens_per_turn=100, seed=seed),
               "max_tokens": 100} for seed in range(8 * POOL)]

    async def burst(client: httpx.AsyncClient, size: int) -> tuple[int, list[float]]:
        responses = await asyncio.gather(*(client.post("/invocations", json=body)
                                           for body in bodies[:size]))
        assert {response.status_code for response in responses} <= {200, 429}
        return sum(response.status_code == 429 for response in responses)

    def served_ms(since: int) -> list[float]:
        """Arrival to first token of the requests served since line ``since``."""
        records = [json.loads(line) for line in lines[since:]]
        return [record["queue_wait_ms"] + record["ttft_ms"] for record in records
                if record.get("event") == "request" and record.get("status") == 200]

    async def scenario() -> tuple[int, int, int, list[float]]:
        async with running(runtime) as client:
            first = await burst(client, 2 * POOL)
            await asyncio.sleep(1.0)
            slow = await burst(client, 8 * POOL)
            await asyncio.sleep(1.0)
            since = len(lines)
            repeat = await burst(client, 2 * POOL)
            return first, slow, repeat, served_ms(since)

    first, slow, repeat, served = asyncio.run(scenario())
    assert slow > first and slow > 4 * POOL, (first, slow, repeat)
    assert 0 < repeat < 2 * POOL, (first, slow, repeat)
    assert max(served) <= 700 + 300, served


POOL = 9
"""Requests the 320-block pool holds (each ~530 prompt tokens, ~630 at its end)."""


def test_warmups_measuring_pass_is_not_served_from_the_first_passs_prefix_cache(
        make_runtime: Any) -> None:
    """Warmup sends its set twice, and the second pass teaches admission the engine's prefill
    rate. Sent the same prompts, vLLM's prefix cache served that pass the first pass's blocks: on
    vLLM's CPU build a 470-token prompt came with 448 cached tokens, admission learned 20,995
    prompt tokens a second, and a fresh gateway's first burst of distinct chats, which prefilled
    at about 1,500, was predicted to start several times sooner than it did. Each pass's
    messages now begin with the pass's number: a measuring-pass prompt takes from the cache no
    more than the longest prefix the first pass's prompts of its model already shared with one
    another (the system prompt and the template, which real traffic shares too)."""
    runtime, lines = make_runtime(SIM_EOS_PROBABILITY="0")

    async def scenario() -> None:
        async with running(runtime):
            pass

    asyncio.run(scenario())
    passes: list[list[dict[str, Any]]] = [[]]
    for line in map(json.loads, lines):
        if line.get("event") == "start_phase" and line["phase"] == "warmup_first_use":
            passes.append([])
        elif line.get("event") == "start_phase" and line["phase"] == "warmup_measure":
            break
        elif line.get("event") == "request":
            passes[-1].append(line)
    first, measuring = passes
    assert len(first) == len(measuring) > 16
    shared: dict[str, int] = {}
    for line in first:
        shared[line["model"]] = max(shared.get(line["model"], 0), line["cached_tokens"])
    over = [(line["model"], line["prompt_tokens"], line["cached_tokens"]) for line in measuring
            if line["cached_tokens"] > shared[line["model"]]]
    assert not over, (shared, over)
    assert max(line["prompt_tokens"] for line in measuring) > 1_000  # long prompts were sent
