"""Soak: 10,000 requests with ever-new message contents against the real server on a
zero-latency engine. Resident memory stays bounded (the token cache evicts, nothing leaks), every
request is answered, and the engine ends with no KV block held."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA
from tests.containers.llm.harness import GatewayProcess

REQUESTS = 10_000
CONCURRENCY = 32
CACHE_TOKENS = 20_000


def body(index: int) -> bytes:
    """A unique 1-5 turn conversation (every message new: the cache must evict)."""
    turns = 1 + index % 5
    messages = []
    for turn in range(turns):
        pool = MANGA_CORPUS_JA if (index + turn) % 2 else MANGA_CORPUS_EN
        role = "user" if (turns - 1 - turn) % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"#{index}-{turn} {pool[(index + turn) % len(pool)]}"})
    return json.dumps({"model": "auto", "messages": messages, "max_tokens": 4,
                       "mangaassist": {"intent": "faq"}}, ensure_ascii=False).encode()


async def drive(gateway: GatewayProcess) -> tuple[dict[int, int], dict[int, int]]:
    statuses: dict[int, int] = {}
    rss_kb: dict[int, int] = {}
    next_index = 0
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60.0, limits=limits) as client:
        async def worker() -> None:
            nonlocal next_index
            while next_index < REQUESTS:
                index = next_index
                next_index += 1
                response = await client.post("/invocations", content=body(index),
                                             headers={"content-type": "application/json"})
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if index % 1000 == 0:
                    rss_kb[index] = gateway.rss_kb()

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return statuses, rss_kb


@pytest.mark.budget(reason="10,000 requests through a real gateway at 32 concurrent, its client and server on the two cores the engine tier shares: 24 s alone, 34-46 s beside the suite on the quiet machine, 64 s in CI beside an engine start")
def test_ten_thousand_requests_keep_memory_bounded(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({
        "GATEWAY_TOKEN_CACHE_MAX_TOKENS": str(CACHE_TOKENS),
        "SIM_EOS_PROBABILITY": "0",
        "GATEWAY_METRICS_INTERVAL_S": "0.5",
        # Memory is the subject, not admission: a shared CI machine may stall the event loop
        # for a second, which the prefill valve would rightly answer with a few 429s.
        "GATEWAY_TTFT_SLO_S": "30", "GATEWAY_ADMISSION_WAIT_S": "30",
        "GATEWAY_REQUEST_DEADLINE_S": "59",
    })
    gateway.wait_ready()
    started = time.perf_counter()
    statuses, rss_kb = asyncio.run(drive(gateway))
    elapsed = time.perf_counter() - started
    print(f"{REQUESTS} requests in {elapsed:.1f} s; RSS (KiB) by request: {rss_kb}")

    assert statuses == {200: REQUESTS}
    warm = rss_kb[2000]
    assert max(rss_kb[index] for index in rss_kb if index >= 2000) - warm < 10 * 1024
    assert rss_kb[9000] - rss_kb[5000] < 5 * 1024  # no steady growth in the second half

    time.sleep(1.2)  # let a gauge line be written after the last request
    gauges = [line for line in gateway.emf() if line.get("event") == "gauges"]
    assert gauges[-1]["KVCacheUsage"] == 0.0  # every block came back
    assert gauges[-1]["kv_reserved_share"] == 0.0  # and every admission reservation
    assert max(line["token_cache_tokens"] for line in gauges) <= CACHE_TOKENS
    requests = [line for line in gateway.emf() if line.get("event") == "request"]
    assert sum(line.get("Requests", 0) for line in requests) == REQUESTS
    assert gateway.process.poll() is None
