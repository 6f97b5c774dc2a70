"""The unmodified ``serve --engine vllm`` on a real vLLM engine, next to vLLM's own OpenAI server
on the same model and engine arguments: start-up checks, parity (same text, same prompt tokens,
temperature 0, base model and adapter), streaming, intent routing and the KV pool against the GPU
budget's prediction."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gpu_budget import compare_engine_report
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA
from tests.containers.llm.engine.conftest import ADAPTERS, DEFAULT_ENGINE, predicted_kv_tokens
from tests.support.cpu_engine import Served, ServerProcess

pytestmark = pytest.mark.engine
ENGINE = DEFAULT_ENGINE


@pytest.fixture(scope="module")
def gateway(engine_pair: tuple[ServerProcess, ServerProcess]) -> ServerProcess:
    """The run's shared gateway (conftest.engine_pair), started with the budget's KV prediction."""
    return engine_pair[0]


@pytest.fixture(scope="module")
def vllm(engine_pair: tuple[ServerProcess, ServerProcess]) -> ServerProcess:
    return engine_pair[1]


def conversation(turns: int, *, system: str = "You are MangaAssist, a manga shop assistant."
                 ) -> list[dict[str, str]]:
    """``turns`` alternating messages ending with the user's, Japanese and English mixed."""
    messages = [{"role": "system", "content": system}]
    for index in range(turns):
        pool = MANGA_CORPUS_JA if index % 3 == 0 else MANGA_CORPUS_EN
        role = "user" if (turns - 1 - index) % 2 == 0 else "assistant"
        messages.append({"role": role, "content": pool[index % len(pool)]})
    return messages


def chat(server: ServerProcess, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_gateway_starts_checked_against_the_engine(gateway: ServerProcess) -> None:
    ping = httpx.get(f"{gateway.url}/ping", timeout=2.0).json()
    assert ping["status"] == "healthy"
    assert ping["adapters"] == {"manga": "loaded", "support": "loaded"}
    assert ping["prompt_rendering"]["mode"] == "assembled"
    assert ping["prompt_rendering"]["verified"] is True
    (check,) = gateway.events("chat_template_check")
    assert check["matches"] is True, check
    (ready,) = gateway.events("engine_ready")
    assert ready["engine"] == "vllm"
    assert ready["block_size"] == ENGINE.block_size
    assert gateway.events("warmup_complete")


def test_the_kv_pool_vllm_allocated_is_the_budgets_prediction(gateway: ServerProcess,
                                                              served: Served) -> None:
    """vLLM's own report (num_gpu_blocks × block_size) against the budget's bytes-per-token
    arithmetic for the model's config.json: within 2 %."""
    (ready,) = gateway.events("engine_ready")
    (report,) = gateway.events("kv_capacity_vs_plan")
    predicted = predicted_kv_tokens(served)
    comparison = compare_engine_report(predicted, ready["kv_blocks"], ready["block_size"])
    print(f"KV pool: budget {predicted:,} tokens, vLLM {comparison.engine_kv_tokens:,} tokens, "
          f"difference {comparison.relative_difference:+.3%}")
    assert report["planned_kv_tokens"] == predicted
    assert abs(comparison.relative_difference) <= 0.02
    assert abs(report["relative_difference"]) <= 0.02


@pytest.mark.parametrize("model", ["tiny-llama3", "manga"])
@pytest.mark.parametrize("turns", [1, 9])
def test_the_gateway_answers_what_vllms_own_server_answers(
        gateway: ServerProcess, vllm: ServerProcess, model: str, turns: int) -> None:
    body = {"model": model, "messages": conversation(turns), "max_tokens": 24,
            "temperature": 0}
    ours, theirs = chat(gateway, **body), chat(vllm, **body)
    assert ours["mangaassist"]["context"]["truncated"] is False
    assert ours["mangaassist"]["fallback"] is None
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"]
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]


def test_an_adapter_changes_the_answer(gateway: ServerProcess) -> None:
    body = {"messages": conversation(3), "max_tokens": 24, "temperature": 0}
    base = chat(gateway, model="tiny-llama3", **body)
    adapted = chat(gateway, model="manga", **body)
    assert base["choices"][0]["message"]["content"] != adapted["choices"][0]["message"][
        "content"], "a random rank-8 adapter must change a greedy answer"
    assert adapted["mangaassist"]["adapter"] == "manga"


def test_intent_routing_picks_the_adapter(gateway: ServerProcess, vllm: ServerProcess) -> None:
    messages = conversation(3)
    routed = chat(gateway, model="auto", messages=messages, max_tokens=16, temperature=0,
                  mangaassist={"intent": "order_tracking", "locale": "en-US"})
    direct = chat(vllm, model="support", messages=messages, max_tokens=16, temperature=0)
    assert routed["mangaassist"]["adapter"] == "support"
    assert routed["mangaassist"]["route"] == "intent"
    assert routed["choices"][0]["message"]["content"] == direct["choices"][0]["message"][
        "content"]


def stream(server: ServerProcess, **body: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The parsed chunks and the raw ``data:`` payloads of one streamed answer."""
    payloads: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60.0) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                payloads.append(line.removeprefix("data: "))
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    return chunks, payloads


def test_a_stream_carries_the_same_answer_and_ends_well(gateway: ServerProcess,
                                                        vllm: ServerProcess) -> None:
    body = {"model": "manga", "messages": conversation(5), "max_tokens": 32, "temperature": 0,
            "stream_options": {"include_usage": True}}
    chunks, payloads = stream(gateway, **body)
    their_chunks, _ = stream(vllm, **body)
    assert payloads[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    theirs = "".join(c["choices"][0]["delta"].get("content") or "" for c in their_chunks
                     if c["choices"])
    assert text == theirs
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1
    assert final[0]["mangaassist"]["fallback"] is None
    assert chunks[-1]["usage"]["prompt_tokens"] == their_chunks[-1]["usage"]["prompt_tokens"]


def test_a_truncated_conversation_sends_the_templates_rendering_of_what_it_kept(
        gateway: ServerProcess, vllm: ServerProcess) -> None:
    """Past the history budget the gateway drops the oldest turns and adds its marker: the
    prompt it sends is still exactly the model's template applied to what it kept."""
    messages = conversation(41)
    ours = chat(gateway, model="tiny-llama3", messages=messages, max_tokens=8, temperature=0)
    context = ours["mangaassist"]["context"]
    assert context["truncated"] is True
    kept = [messages[index] for index in context["kept_messages"]]
    marker = {"role": "system", "content": f"[earlier conversation truncated — "
                                           f"{context['dropped_turns']} turns not shown]"}
    first_dropped = context["dropped_messages"][0]
    position = next(i for i, index in enumerate(context["kept_messages"]) if index > first_dropped)
    sent = [*kept[:position], marker, *kept[position:]]
    theirs = chat(vllm, model="tiny-llama3", messages=sent, max_tokens=8, temperature=0)
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]


def test_the_served_models_are_listed(gateway: ServerProcess) -> None:
    listed = httpx.get(f"{gateway.url}/v1/models", timeout=5.0).json()
    assert {model["id"] for model in listed["data"]} == {"tiny-llama3", *ADAPTERS}


def test_cached_prompt_tokens_are_the_engines_own_count(gateway: ServerProcess,
                                                       vllm: ServerProcess) -> None:
    """The second turn of a conversation finds the first turn's prompt in the prefix cache; the
    gateway reports the same cached tokens as vLLM's server (each on its own engine, sent the
    same requests), in whole 32-token blocks."""
    first = conversation(7, system="You are MangaAssist (cache check), a manga shop assistant.")
    second = [*first, {"role": "assistant", "content": MANGA_CORPUS_EN[3]},
              {"role": "user", "content": MANGA_CORPUS_JA[4]}]
    reports = []
    for server in (gateway, vllm):
        before = chat(server, model="tiny-llama3", messages=first, max_tokens=4, temperature=0)
        after = chat(server, model="tiny-llama3", messages=second, max_tokens=4, temperature=0)
        reports.append((before["usage"], after["usage"]))
    (gateway_first, gateway_second), (vllm_first, vllm_second) = reports
    cached = gateway_second["prompt_tokens_details"]["cached_tokens"]
    assert gateway_first["prompt_tokens_details"]["cached_tokens"] == (
        vllm_first["prompt_tokens_details"]["cached_tokens"])
    assert cached == vllm_second["prompt_tokens_details"]["cached_tokens"]
    assert gateway_first["prompt_tokens"] - ENGINE.block_size < cached
    assert cached % ENGINE.block_size == 0
