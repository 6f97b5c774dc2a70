"""Admission and containment over a real socket: KV shedding with 429 + Retry-After, the request
deadline, and the open breaker answering XL requests with the fresh-context fallback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from gateway.tokenizer import ChatTokenizer
from tests.containers.llm.harness import GatewayProcess
from tests.containers.llm.test_telemetry import assert_valid_emf
from tests.support.demo_model import synthetic_conversation


def long_messages(tokenizer: ChatTokenizer, turns: int, seed: int) -> list[dict[str, str]]:
    return synthetic_conversation(tokenizer.tokenizer, turns=turns, tokens_per_turn=100,
                                  seed=seed)


def test_a_burst_beyond_the_pool_is_served_within_the_slo_and_the_rest_refused_at_once(
        start_gateway: Any, chat_tokenizer: ChatTokenizer) -> None:
    """80 blocks × 16 tokens; each request's ~500-token prompt holds ~32 blocks and grows by 7
    as it answers, so two run at a time, 100 tokens × 5 ms ≈ 0.55 s a wave. A first burst of ten
    teaches admission how long the engine takes a token when the pool is full (the KV
    turnover's decode step); in the second, with a 1.2 s TTFT SLO, what would not start in time
    is refused on arrival with 429 and a Retry-After, and what is admitted starts within the
    SLO."""
    gateway: GatewayProcess = start_gateway({
        "ENGINE_MAX_MODEL_LEN": "1024", "ENGINE_NUM_GPU_BLOCKS": "80",
        "SIM_STEP_TIME_S": "0.005", "SIM_EOS_PROBABILITY": "0",
        "GATEWAY_TTFT_SLO_S": "1.2", "GATEWAY_RETRY_AFTER_S": "1",
    })
    gateway.wait_ready()

    async def burst(first_seed: int) -> list[httpx.Response]:
        bodies = [{"messages": long_messages(chat_tokenizer, 7, seed), "max_tokens": 100}
                  for seed in range(first_seed, first_seed + 10)]
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as client:
            return list(await asyncio.gather(*(client.post("/invocations", json=body)
                                               for body in bodies)))

    asyncio.run(burst(0))
    assert gateway.ping().json()["admission"]["decode_step_ms"] is not None
    before, before_emf = len(gateway.lines()), len(gateway.emf())
    responses = asyncio.run(burst(100))
    statuses = sorted(response.status_code for response in responses)
    shed = [response for response in responses if response.status_code == 429]
    assert set(statuses) == {200, 429}, statuses
    assert 2 <= statuses.count(200) <= 7, statuses
    for response in shed:
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["code"] == "ttft_slo"
        assert "prompt tokens are waiting for their first token" in error["message"]
    lines = [line for line in gateway.lines()[before:] if line.get("event") == "request"]
    rejections = [line for line in gateway.emf()[before_emf:] if "AdmissionRejections" in line]
    assert len(rejections) == len(shed)
    for document in rejections:
        assert_valid_emf(document)
        assert document["Bucket"] in ("L", "XL", "Unsized")
        assert document["queue_wait_ms"] < 50  # refused on arrival, not after a wait
    served = [line for line in lines if line["status"] == 200]
    assert sum(1 for line in served if line.get("admitted_by") == "floor") <= 1
    for line in served:
        assert line["queue_wait_ms"] + line["ttft_ms"] <= 1200 + 300


def test_a_fresh_gateways_first_burst_admits_only_what_starts_within_the_slo(
        start_gateway: Any, chat_tokenizer: ChatTokenizer) -> None:
    """The burst above, as the first traffic a fresh gateway sees (an instance added in a
    surge): warmup's answers taught the engine's decode step (their lengths teach nothing), so
    the KV turnover already knows that the requests behind the first wave wait for room past
    the SLO, and refuses them on arrival (4 admitted, first tokens by 0.56 s, 6 refused).
    Warmup's answers once taught neither: no decode step, no replay, and the valve alone
    admitted all ten; eight waited for room, four of them past 1.5 s (the last 2.19 s)."""
    gateway: GatewayProcess = start_gateway({
        "ENGINE_MAX_MODEL_LEN": "1024", "ENGINE_NUM_GPU_BLOCKS": "80",
        "SIM_STEP_TIME_S": "0.005", "SIM_EOS_PROBABILITY": "0",
        "GATEWAY_TTFT_SLO_S": "1.2", "GATEWAY_RETRY_AFTER_S": "1",
    })
    gateway.wait_ready()
    assert gateway.ping().json()["admission"]["decode_step_ms"] is not None

    async def burst() -> list[httpx.Response]:
        bodies = [{"messages": long_messages(chat_tokenizer, 7, seed), "max_tokens": 100}
                  for seed in range(10)]
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as client:
            return list(await asyncio.gather(*(client.post("/invocations", json=body)
                                               for body in bodies)))

    before = len(gateway.lines())
    statuses = sorted(response.status_code for response in asyncio.run(burst()))
    assert set(statuses) == {200, 429}, statuses
    served = [line for line in gateway.lines()[before:]
              if line.get("event") == "request" and line["status"] == 200]
    assert served and len(served) == statuses.count(200)
    for line in served:
        assert line["queue_wait_ms"] + line["ttft_ms"] <= 1200 + 300, served


def test_no_request_outlives_the_deadline(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({
        "SIM_STEP_TIME_S": "0.005", "SIM_EOS_PROBABILITY": "0",
        "GATEWAY_REQUEST_DEADLINE_S": "1.5", "GATEWAY_ADMISSION_WAIT_S": "1",
    })
    gateway.wait_ready()
    started = time.perf_counter()
    response = httpx.post(f"{gateway.url}/invocations", timeout=30.0, json={
        "messages": [{"role": "user", "content": "Tell me everything about Berserk."}],
        "max_tokens": 3000})  # 3000 steps x 5 ms = 15 s without the deadline
    elapsed = time.perf_counter() - started
    assert response.status_code == 200
    body = response.json()
    assert elapsed < 3.0
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["mangaassist"]["deadline_exceeded"] is True
    assert 0 < body["usage"]["completion_tokens"] < 3000


def test_open_breaker_answers_xl_with_a_fresh_context(start_gateway: Any,
                                                      chat_tokenizer: ChatTokenizer) -> None:
    gateway: GatewayProcess = start_gateway({
        "GATEWAY_TEST_MODE": "true", "GATEWAY_BREAKER_OPEN_S": "120",
        "GATEWAY_ENGINE_RESTART_BACKOFF_S": "0.05",
    })
    gateway.wait_ready()
    assert httpx.post(f"{gateway.url}/admin/engine/oom").status_code == 200
    deadline = time.monotonic() + 30
    ping = gateway.ping().json()
    while (ping["engine_generation"], ping["engine"]) != (1, "ready") \
            and time.monotonic() < deadline:  # rebuilt, then warmed up before it serves
        time.sleep(0.05)
        ping = gateway.ping().json()
    assert ping["breaker"] == "open"
    assert ping["status"] == "healthy"

    xl = {"messages": long_messages(chat_tokenizer, 45, seed=5), "max_tokens": 1500,
          "mangaassist": {"locale": "ja-JP"}}
    response = httpx.post(f"{gateway.url}/invocations", json=xl, timeout=30.0)
    assert response.status_code == 200
    body = response.json()
    assert body["mangaassist"]["bucket"] == "XL"
    assert body["mangaassist"]["fallback"]["reason"] == "breaker_open_xl"
    assert response.headers["x-mangaassist-fallback"] == "breaker_open_xl"
    assert body["choices"][0]["message"]["content"].startswith("会話が長くなったため")
    assert body["usage"]["completion_tokens"] == 0

    streamed = httpx.post(f"{gateway.url}/invocations", json={**xl, "stream": True},
                          timeout=30.0)
    assert streamed.status_code == 200
    assert '"reason":"breaker_open_xl"' in streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")

    small = httpx.post(f"{gateway.url}/invocations", timeout=30.0, json={
        "messages": long_messages(chat_tokenizer, 45, seed=5), "max_tokens": 32})
    context = small.json()["mangaassist"]
    assert context["fallback"] is None
    assert context["context"]["context_factor"] == 0.5  # tightened while open
    assert context["context"]["history_budget_tokens"] == 1024

    fallbacks = [line for line in gateway.emf() if line.get("fallback_reason") == "breaker_open_xl"]
    assert len(fallbacks) == 2
    for document in fallbacks:
        assert document["Fallbacks"] == 1.0
        assert "Requests" not in document  # never reached the engine
