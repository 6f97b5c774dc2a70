"""The OpenAI request shapes on the real engine, next to vLLM's own server on the same model and
engine arguments: for each shape the gateway accepts, at temperature 0, the same text (the same
logprob tokens, the same JSON for a schema); the openai SDK sending them as a client does; and
LoRA adapters that never bleed into each other in a mixed batch."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.containers.llm.engine.conftest import Servers
from tools.cpu_engine import EngineConfig, ServerProcess

pytestmark = pytest.mark.engine
ENGINE = EngineConfig()
QUESTION = "Recommend a dark fantasy manga and say how many volumes it has."
CARD_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40},
                   "volumes": {"type": "integer", "minimum": 1, "maximum": 200},
                   "in_stock": {"type": "boolean"}},
    "required": ["title", "volumes", "in_stock"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pair(servers: Servers) -> tuple[ServerProcess, ServerProcess]:
    gateway = servers.gateway(ENGINE)
    vllm = servers.vllm(ENGINE)
    gateway.wait_healthy("/ping")
    vllm.wait_healthy("/health")
    return gateway, vllm


def chat(server: ServerProcess, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=120.0,
                          json={"model": "tiny-llama3", "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return dict(response.json())


def both(pair: tuple[ServerProcess, ServerProcess], **body: Any
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    gateway, vllm = pair
    return chat(gateway, **body), chat(vllm, **body)


def texts(answer: dict[str, Any]) -> list[str]:
    return [choice["message"]["content"] for choice in answer["choices"]]


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are MangaAssist, a manga shop assistant."},
            {"role": "user", "content": content}]


def test_text_parts_render_the_prompt_vllm_renders(pair: tuple[ServerProcess, ServerProcess]
                                                   ) -> None:
    parts = [{"type": "text", "text": "I liked Berserk."}, {"type": "text", "text": QUESTION}]
    ours, theirs = both(pair, messages=user(parts), max_tokens=16)
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert texts(ours) == texts(theirs)


@pytest.mark.parametrize("response_format", [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "product_card", "schema": CARD_SCHEMA}},
], ids=["json_object", "json_schema"])
def test_structured_outputs_give_the_same_json(pair: tuple[ServerProcess, ServerProcess],
                                               response_format: dict[str, Any]) -> None:
    ours, theirs = both(pair, messages=user(QUESTION), max_tokens=64,
                        response_format=response_format)
    assert texts(ours) == texts(theirs)
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    if ours["choices"][0]["finish_reason"] == "stop":  # a finished answer parses
        document = json.loads(texts(ours)[0])
        assert isinstance(document, dict)
        if response_format["type"] == "json_schema":
            assert set(document) == {"title", "volumes", "in_stock"}
            assert isinstance(document["volumes"], int)


def test_a_schema_the_engine_cannot_compile_is_a_400_naming_it(
        pair: tuple[ServerProcess, ServerProcess]) -> None:
    gateway, _ = pair
    response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60.0, json={
        "model": "tiny-llama3", "messages": user(QUESTION), "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "broken", "schema": {"type": "object", "properties": {
                "x": {"type": "no-such-type"}}}}}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format"
    assert "cannot build a grammar from this JSON schema" in error["message"]
    assert "no-such-type" in error["message"]
    assert httpx.get(f"{gateway.url}/ping", timeout=2.0).status_code == 200


def test_logprobs_name_the_same_tokens(pair: tuple[ServerProcess, ServerProcess]) -> None:
    ours, theirs = both(pair, messages=user(QUESTION), max_tokens=12, logprobs=True,
                        top_logprobs=3)
    assert texts(ours) == texts(theirs)
    mine = ours["choices"][0]["logprobs"]["content"]
    reference = theirs["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in mine] == [t["token"] for t in reference]
    assert [t["bytes"] for t in mine] == [t["bytes"] for t in reference]
    for ours_token, their_token in zip(mine, reference, strict=True):
        assert math.isclose(ours_token["logprob"], their_token["logprob"], abs_tol=0.05)
        assert [t["token"] for t in ours_token["top_logprobs"]] == [
            t["token"] for t in their_token["top_logprobs"]]


def test_n_choices_and_the_sampling_extensions(pair: tuple[ServerProcess, ServerProcess]
                                               ) -> None:
    ours, theirs = both(pair, messages=user(QUESTION), max_tokens=12, n=2, temperature=0.8,
                        seed=11)
    assert len(ours["choices"]) == len(theirs["choices"]) == 2
    assert texts(ours) == texts(theirs)
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"]
    # vLLM refuses n > 1 with greedy sampling; through its own conversion, so does the gateway.
    gateway = pair[0]
    for server in pair:
        response = httpx.post(f"{server.url}/v1/chat/completions", timeout=60.0, json={
            "model": "tiny-llama3", "messages": user(QUESTION), "max_tokens": 4, "n": 2,
            "temperature": 0})
        assert response.status_code == 400, response.text
        assert "n must be 1 when using greedy sampling" in response.text
    assert httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60.0, json={
        "model": "tiny-llama3", "messages": user(QUESTION), "max_tokens": 4, "n": 2,
        "temperature": 0}).json()["error"]["param"] == "n"
    extensions = {"stop": [" the"], "presence_penalty": 0.5, "frequency_penalty": 0.3,
                  "repetition_penalty": 1.2, "top_k": 5, "min_p": 0.05, "min_tokens": 4,
                  "ignore_eos": True, "max_completion_tokens": 10}
    ours, theirs = both(pair, messages=user(QUESTION), **extensions)
    assert texts(ours) == texts(theirs)
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]


def test_the_openai_client_sends_parts_a_schema_and_logprobs(
        pair: tuple[ServerProcess, ServerProcess]) -> None:
    gateway, vllm = pair
    answers = []
    for server in (gateway, vllm):
        client = OpenAI(base_url=f"{server.url}/v1", api_key="not-used", max_retries=0)
        completion = client.chat.completions.create(
            model="tiny-llama3", temperature=0, max_tokens=24, logprobs=True, top_logprobs=2,
            messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "product_card", "schema": CARD_SCHEMA}})
        choice = completion.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content
        answers.append((choice.message.content,
                        [token.token for token in choice.logprobs.content]))
    assert answers[0] == answers[1]


def test_adapters_stay_apart_in_a_mixed_batch(pair: tuple[ServerProcess, ServerProcess]
                                              ) -> None:
    """The base model and two adapters interleaved in one concurrent batch: every request gets
    the greedy answer it gets alone. (vLLM's own server on this CPU build fails this for the
    base model — its LoRA ops give base-model tokens the last adapter's weights,
    vllm-project/vllm#48421 — which the gateway works around: gateway.engines.vllm.)"""
    models = ["tiny-llama3", "manga", "support"]
    questions = [f"{QUESTION} ({index})" for index in range(4)]
    cases = [(model, question) for question in questions for model in models]

    def body(model: str, question: str) -> dict[str, Any]:
        return {"model": model, "messages": user(question), "max_tokens": 16, "temperature": 0}

    async def batch(server: ServerProcess) -> dict[tuple[str, str], str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as client:
            replies = await asyncio.gather(*(client.post("/v1/chat/completions",
                                                         json=body(*case)) for case in cases))
        return {case: reply.json()["choices"][0]["message"]["content"]
                for case, reply in zip(cases, replies, strict=True)}

    gateway, vllm = pair
    results = {}
    for server in (gateway, vllm):
        alone = {case: texts(chat(server, **body(*case)))[0] for case in cases}
        assert len({alone[(model, questions[0])] for model in models}) == 3, \
            "the adapters answer differently from the base model (else this proves nothing)"
        results[server.url] = (alone, asyncio.run(batch(server)))
    alone, mixed = results[gateway.url]
    assert mixed == alone
    # The bug the gateway works around is still in this vLLM build: its own server gives the
    # base model's requests other answers in the mixed batch. When this fails, vLLM fixed
    # vllm-project/vllm#48421: drop "cpu" from ZERO_ADAPTER_PLATFORMS.
    their_alone, their_mixed = results[vllm.url]
    assert {case: their_mixed[case] == their_alone[case] for case in cases
            if case[0] != "tiny-llama3"} == {case: True for case in cases
                                             if case[0] != "tiny-llama3"}
    assert any(their_mixed[case] != their_alone[case] for case in cases
               if case[0] == "tiny-llama3")
