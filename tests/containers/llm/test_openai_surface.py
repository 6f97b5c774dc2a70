"""The OpenAI request shapes on a real socket, on the simulated engine: content as text parts,
``n`` choices (streamed too), logprobs with alternatives, vLLM's sampling extensions. Parity with
vLLM's own server on the real engine is in engine/test_openai_parity.py."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.containers.llm.harness import GatewayProcess

QUESTION = "Which volume of Frieren is out next?"


def post(gateway: GatewayProcess, **body: Any) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30)


def chunks(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: {")]


def test_text_parts_are_the_same_prompt_as_the_joined_string(gateway: GatewayProcess) -> None:
    parts = [{"type": "text", "text": "Which volume of Frieren"},
             {"type": "text", "text": "is out next?"}]
    as_parts = post(gateway, messages=[{"role": "user", "content": parts}], max_tokens=4,
                    seed=3).json()
    as_string = post(gateway, messages=[{"role": "user", "content":
                                         "Which volume of Frieren\nis out next?"}],
                     max_tokens=4, seed=3).json()
    assert as_parts["usage"]["prompt_tokens"] == as_string["usage"]["prompt_tokens"]
    assert as_parts["choices"][0]["message"] == as_string["choices"][0]["message"]


def test_n_choices_each_with_its_own_answer(gateway: GatewayProcess) -> None:
    body = post(gateway, messages=[{"role": "user", "content": QUESTION}], max_tokens=6, n=3,
                ignore_eos=True).json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    texts = [choice["message"]["content"] for choice in body["choices"]]
    assert len(set(texts)) == 3  # three sequences, not one copied
    assert all(choice["finish_reason"] == "length" for choice in body["choices"])
    assert body["usage"]["completion_tokens"] == 3 * 6


def test_n_choices_stream_with_their_indexes(gateway: GatewayProcess) -> None:
    response = post(gateway, messages=[{"role": "user", "content": QUESTION}], max_tokens=5,
                    n=2, stream=True, ignore_eos=True, stream_options={"include_usage": True})
    events = chunks(response)
    roles = [c["choices"][0]["index"] for c in events
             if c["choices"] and c["choices"][0]["delta"].get("role")]
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in events
                if c["choices"] and c["choices"][0]["finish_reason"]}
    assert roles == [0, 1]
    assert finishes == {0: "length", 1: "length"}
    texts = {index: "".join(c["choices"][0]["delta"].get("content") or "" for c in events
                            if c["choices"] and c["choices"][0]["index"] == index)
             for index in (0, 1)}
    assert all(texts.values()) and texts[0] != texts[1]
    assert events[-1]["usage"]["completion_tokens"] == 10


def test_logprobs_report_each_token_and_its_alternatives(gateway: GatewayProcess) -> None:
    body = post(gateway, messages=[{"role": "user", "content": QUESTION}], max_tokens=5,
                logprobs=True, top_logprobs=2, ignore_eos=True).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    assert "".join(token["token"] for token in content) == body["choices"][0]["message"][
        "content"]
    for token in content:
        assert token["logprob"] < 0
        assert token["bytes"] == list(token["token"].encode())
        assert len(token["top_logprobs"]) == 2
        assert token["top_logprobs"][0]["token"] == token["token"]
    plain = post(gateway, messages=[{"role": "user", "content": QUESTION}], max_tokens=2).json()
    assert plain["choices"][0]["logprobs"] is None


def test_streamed_logprobs_add_up_to_the_answer(gateway: GatewayProcess) -> None:
    response = post(gateway, messages=[{"role": "user", "content": QUESTION}], max_tokens=6,
                    logprobs=True, stream=True, ignore_eos=True)
    tokens = [token for c in chunks(response) if c["choices"] and c["choices"][0]["logprobs"]
              for token in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks(response)
                   if c["choices"])
    assert len(tokens) == 6
    assert "".join(token["token"] for token in tokens) == text
    assert all(token["top_logprobs"] == [] for token in tokens)  # none asked for


def test_min_tokens_and_ignore_eos_hold_the_answer_open(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({"SIM_EOS_PROBABILITY": "1.0"})
    gateway.wait_ready()
    ask = {"role": "user", "content": QUESTION}
    eager = post(gateway, messages=[ask], max_tokens=8).json()
    held = post(gateway, messages=[ask], max_tokens=8, min_tokens=5).json()
    forced = post(gateway, messages=[ask], max_tokens=8, ignore_eos=True).json()
    assert eager["usage"]["completion_tokens"] == 1  # the end of sequence came at once
    assert held["usage"]["completion_tokens"] == 6  # not before the 5th token
    assert forced["usage"]["completion_tokens"] == 8
    assert forced["choices"][0]["finish_reason"] == "length"
