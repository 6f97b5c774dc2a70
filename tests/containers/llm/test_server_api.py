"""The HTTP contract over a real socket: /ping, OpenAPI, chat (JSON and SSE), validation errors
that name the field, routing, context reporting and the per-request EMF lines."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api.errors import CODES
from gateway.api.openai_fields import REFUSED
from gateway.tokenizer import ChatTokenizer
from prompts import SYSTEM_PROMPT_EN
from request_buckets import bucket_bounds
from tests.containers.llm.error_shape import assert_error_shape
from tests.containers.llm.harness import GatewayProcess
from tests.containers.llm.test_telemetry import assert_valid_emf
from tests.support.demo_model import synthetic_conversation

DOCS = Path(__file__).resolve().parents[3] / "docs" / "gateway.md"
USER = {"role": "user", "content": "Is One Piece volume 1 available in English?"}


def post(gateway: GatewayProcess, body: Any, *, path: str = "/invocations",
         **kwargs: Any) -> httpx.Response:
    if isinstance(body, bytes | str):
        kwargs.setdefault("headers", {"content-type": "application/json"})
        return httpx.post(gateway.url + path, content=body, timeout=30.0, **kwargs)
    return httpx.post(gateway.url + path, json=body, timeout=30.0, **kwargs)


def sse_events(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_ping_is_healthy_after_warmup_and_fast(gateway: GatewayProcess) -> None:
    started = time.perf_counter()
    response = gateway.ping()
    assert time.perf_counter() - started < 0.5
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "healthy"
    assert body["breaker"] == "closed"
    assert body["warmup"].endswith("requests done (measuring)")  # the second pass
    warmup_lines = [line for line in gateway.lines() if line.get("warmup")]
    models = {line["model"] for line in warmup_lines}
    assert models == {"mangaassist-base", "manga", "support", "manga-ja"}  # every adapter
    assert any(line.get("truncated") for line in warmup_lines)  # the long one was windowed
    assert all("_aws" not in line for line in warmup_lines)


def test_openapi_schema_is_served(gateway: GatewayProcess) -> None:
    schema = httpx.get(gateway.url + "/openapi.json").json()
    assert {"/invocations", "/v1/chat/completions", "/ping", "/v1/models"} <= set(schema["paths"])
    responses = schema["paths"]["/invocations"]["post"]["responses"]
    assert {"200", "400", "404", "413", "429", "503"} <= set(responses)
    assert "422" not in responses
    assert "text/event-stream" in responses["200"]["content"]
    components = schema["components"]["schemas"]
    assert "MangaAssistExtension" in components
    assert "mangaassist" in components["ChatCompletionRequest"]["properties"]
    assert "/admin/engine/oom" not in schema["paths"]


def test_openapi_states_this_instances_limits(gateway: GatewayProcess) -> None:
    """The published schema is what the gateway accepts: n up to GATEWAY_MAX_N (4), output
    limits below the window (4096), at most GATEWAY_MAX_MESSAGES (512) messages and pins below
    it, integers as integers, the cross-field rules JSON Schema can state, a non-null code."""
    components = httpx.get(gateway.url + "/openapi.json").json()["components"]["schemas"]
    request = components["ChatCompletionRequest"]
    properties = request["properties"]

    def integer(name: str) -> dict[str, Any]:
        return next(branch for branch in properties[name]["anyOf"] if branch.get("type")
                    == "integer")

    assert (integer("n")["minimum"], integer("n")["maximum"]) == (1, 4)
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        assert integer(name)["maximum"] == 4095, name
    assert properties["messages"]["maxItems"] == 512
    pins = components["MangaAssistExtension"]["properties"]["pinned_messages"]["items"]
    assert (pins["type"], pins["minimum"], pins["maximum"]) == ("integer", 0, 511)
    conditions = [set(rule["if"]["properties"]) for rule in request["allOf"]]
    assert conditions == [{"top_logprobs"}, {"n"}, {"max_tokens"}]
    assert components["ChatMessage"]["additionalProperties"] is False
    assert components["ErrorDetail"]["properties"]["code"] == {"title": "Code", "type": "string"}


def test_chat_completion_shape(gateway: GatewayProcess) -> None:
    response = post(gateway, {"model": "manga", "messages": [USER], "max_tokens": 12})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "manga"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    extension = body["mangaassist"]
    assert extension["adapter"] == "manga"
    assert extension["fallback"] is None
    assert extension["context"]["prompt_tokens"] == usage["prompt_tokens"]
    assert extension["bucket"] == "S"


def test_openai_path_and_sagemaker_path_agree(gateway: GatewayProcess) -> None:
    body = {"messages": [USER], "max_tokens": 5, "seed": 3, "model": "support"}
    first = post(gateway, body, path="/v1/chat/completions").json()
    second = post(gateway, body).json()
    assert first["choices"][0]["message"] == second["choices"][0]["message"]


def test_streaming_sse_format(gateway: GatewayProcess) -> None:
    response = post(gateway, {"messages": [USER], "max_tokens": 10, "stream": True,
                              "stream_options": {"include_usage": True},
                              "mangaassist": {"intent": "recommendation", "locale": "ja-JP"}})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["mangaassist"]["adapter"] == "manga-ja"
    assert chunks[0]["model"] == "manga-ja"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1
    assert finish[0]["mangaassist"]["fallback"] is None
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] <= 10
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}


def test_long_conversation_reports_what_the_window_kept(gateway: GatewayProcess,
                                                        chat_tokenizer: ChatTokenizer) -> None:
    history = synthetic_conversation(chat_tokenizer.tokenizer, turns=41, tokens_per_turn=100)
    messages = [{"role": "system", "content": SYSTEM_PROMPT_EN}, *history]
    response = post(gateway, {"messages": messages, "max_tokens": 32,
                              "mangaassist": {"pinned_messages": [2], "intent": "discovery"}})
    assert response.status_code == 200
    context = response.json()["mangaassist"]["context"]
    assert context["truncated"]
    assert context["kept_messages"][:2] == [0, 2]
    assert context["kept_messages"][-1] == 41
    assert context["dropped_messages"][0] == 1
    assert context["dropped_turns"] == len(context["dropped_messages"])
    assert context["truncation_notice"] == (
        f"Earlier conversation truncated — {context['dropped_turns']} turns not shown.")
    assert context["prompt_tokens"] + 32 <= 4096
    bucket = bucket_bounds(4096).classify(context["prompt_tokens"] + 32)
    assert response.json()["mangaassist"]["bucket"] == bucket.value


def test_the_next_turn_reports_its_cached_prompt_tokens(gateway: GatewayProcess,
                                                       chat_tokenizer: ChatTokenizer) -> None:
    """The engine's prefix-cache hits reach OpenAI's usage field, streamed and not: the second
    turn of a conversation finds the first turn's prompt cached."""
    history = synthetic_conversation(chat_tokenizer.tokenizer, turns=9, tokens_per_turn=60,
                                     seed=23)
    first = post(gateway, {"messages": history, "max_tokens": 8}).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    answer = first["choices"][0]["message"]["content"]
    turn = [*history, {"role": "assistant", "content": answer},
            {"role": "user", "content": "And the second volume?"}]
    second = post(gateway, {"messages": turn, "max_tokens": 8}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] - 16 <= cached < second["usage"]["prompt_tokens"]
    assert cached % 16 == 0  # whole KV blocks
    streamed = post(gateway, {"messages": turn, "max_tokens": 8, "stream": True,
                              "stream_options": {"include_usage": True}})
    usage = sse_events(streamed.text)[-2]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= cached


def test_models_are_listed(gateway: GatewayProcess) -> None:
    body = httpx.get(gateway.url + "/v1/models").json()
    assert [model["id"] for model in body["data"]] == [
        "mangaassist-base", "manga", "support", "manga-ja"]


BAD_REQUESTS: list[tuple[str, Any, int, str | None, str, str]] = [
    ("malformed JSON", b'{"messages": [', 400, None, "invalid_json",
     "not valid JSON"),
    ("no body", b"", 400, None, "invalid_json",
     "request body is required"),
    ("array body", b"[1, 2]", 400, None, "invalid_type",
     "must be a JSON object"),
    ("form body", "messages=hi", 400, None, "invalid_content_type",
     "Content-Type: application/json"),
    ("missing messages", {"model": "manga"}, 400, "messages", "missing_required_parameter",
     "field required"),
    ("empty messages", {"messages": []}, 400, "messages", "invalid_value",
     "at least 1 item"),
    ("unknown role", {"messages": [{"role": "critic", "content": "x"}]}, 400,
     "messages[0].role", "invalid_value",
     "'system', 'developer', 'user' or 'assistant'"),
    ("number content", {"messages": [{"role": "user", "content": 42}]}, 400,
     "messages[0].content", "invalid_type",
     "a string or a list of text parts"),
    ("image part", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Is this volume 3?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cover.jpg"}}]}]},
     400, "messages[0].content[1].type", "unsupported_value",
     "'image_url' parts are not accepted"),
    ("audio part", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
     400, "messages[0].content[0].type", "unsupported_value",
     "accepted part type: 'text'"),
    ("text part without text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     400, "messages[0].content[0].text", "missing_required_parameter",
     "field required"),
    ("null content", {"messages": [{"role": "assistant", "content": None}, USER]}, 400,
     "messages[0].content", "invalid_type",
     "a string or a list of text parts"),
    ("negative max_tokens", {"messages": [USER], "max_tokens": -5}, 400, "max_tokens", "invalid_value",
     "greater than or equal to 1"),
    ("absurd max_tokens", {"messages": [USER], "max_tokens": 10**9}, 400, "max_tokens", "invalid_value",
     "must be below the context window"),
    ("string max_tokens", {"messages": [USER], "max_tokens": "5"}, 400, "max_tokens", "invalid_type",
     "valid integer"),
    ("disagreeing limits", {"messages": [USER], "max_tokens": 5, "max_completion_tokens": 6},
     400, "max_completion_tokens", "invalid_value",
     "send one of them"),
    ("both limits, equal", {"messages": [USER], "max_tokens": 5, "max_completion_tokens": 5},
     400, "max_completion_tokens", "invalid_value", "send one of them"),
    ("tools", {"messages": [USER], "tools": []}, 400, "tools", "unsupported_parameter",
     "not accepted by this gateway: tool calls are not served"),
    ("a tool message", {"messages": [USER, {"role": "tool", "content": "{\"stock\": 3}",
                                            "tool_call_id": "call_1"}, USER]}, 400,
     "messages[1].role", "unsupported_value",
     "'tool' messages are not accepted by this gateway: " + REFUSED["tools"]),
    ("an assistant's tool calls", {"messages": [USER, {
        "role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "stock", "arguments": "{}"}}]}, USER]}, 400,
     "messages[1].tool_calls", "unsupported_parameter",
     "not accepted by this gateway: " + REFUSED["tools"]),
    ("a tool_call_id", {"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]},
     400, "messages[0].tool_call_id", "unsupported_parameter",
     "not accepted by this gateway: " + REFUSED["tools"]),
    ("a function_call", {"messages": [USER, {"role": "assistant", "content": "x",
                                             "function_call": {"name": "f"}}, USER]}, 400,
     "messages[1].function_call", "unsupported_parameter",
     "not accepted by this gateway: " + REFUSED["tools"]),
    ("a vLLM prompt control", {"messages": [USER], "chat_template": "{{x}}"}, 400,
     "chat_template", "unsupported_parameter",
     "renders and counts every prompt itself"),
    ("unknown field", {"messages": [USER], "frobnicate": 1}, 400, "frobnicate", "unknown_parameter",
     "unknown field"),
    ("n above GATEWAY_MAX_N", {"messages": [USER], "n": 5}, 400, "n", "invalid_value",
     "at most 4 are accepted"),
    ("top_logprobs without logprobs", {"messages": [USER], "top_logprobs": 2}, 400,
     "top_logprobs", "invalid_value",
     "needs logprobs: true"),
    ("json_schema without a schema", {"messages": [USER], "response_format": {
        "type": "json_schema", "json_schema": {"name": "card"}}}, 400,
     "response_format.json_schema.schema", "missing_required_parameter",
     "field required"),
    ("JSON on the simulator", {"messages": [USER], "response_format": {"type": "json_object"}},
     400, "response_format", "invalid_value",
     "cannot constrain its output to JSON"),
    ("greedy n on the simulator, as on vLLM", {"messages": [USER], "n": 2, "temperature": 0},
     400, "n", "invalid_value",
     "n must be 1 when using greedy sampling"),
    ("five stops", {"messages": [USER], "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value",
     "at most 4 stop sequences"),
    ("temperature", {"messages": [USER], "temperature": 9}, 400, "temperature", "invalid_value",
     "less than"),
    ("unknown adapter", {"messages": [USER], "model": "anime-lora"}, 404, "model", "model_not_found",
     "is not served here"),
    ("unknown intent", {"messages": [USER], "mangaassist": {"intent": "shopping"}}, 400,
     "mangaassist.intent", "invalid_value",
     "unknown intent 'shopping'"),
    ("bad locale", {"messages": [USER], "mangaassist": {"locale": "ja_JP!"}}, 400,
     "mangaassist.locale", "invalid_value",
     "should match pattern"),
    ("unknown extension field", {"messages": [USER], "mangaassist": {"user_id": 1}}, 400,
     "mangaassist.user_id", "unknown_parameter",
     "unknown field"),
    ("pin beyond the conversation", {"messages": [USER], "mangaassist": {"pinned_messages": [0, 1]}},
     400, "mangaassist.pinned_messages[1]", "invalid_value",
     "1 is not the index of a message (0..0)"),
    ("lone surrogate", b'{"messages":[{"role":"user","content":"\\ud800 x"}]}', 400,
     "messages[0].content", "invalid_value",
     "lone surrogate"),
    ("too many messages", {"messages": [USER] * 600}, 400, "messages", "invalid_value",
     "at most 512"),
    ("a role that is an object", {"messages": [{"role": {}, "content": "hi"}]}, 400,
     "messages[0].role", "invalid_value", "'system', 'developer', 'user' or 'assistant'"),
    ("a role that is a list", {"messages": [{"role": ["user"], "content": "hi"}]}, 400,
     "messages[0].role", "invalid_value", "'system', 'developer', 'user' or 'assistant'"),
    ("an unknown key in a message", {"messages": [{**USER, "mood": "happy"}]}, 400,
     "messages[0].mood", "unknown_parameter", "unknown field"),
    ("an unknown key in a text part", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "lang": "en"}]}]}, 400,
     "messages[0].content[0].lang", "unknown_parameter", "unknown field"),
    ("a refusal echoed with text", {"messages": [USER, {"role": "assistant", "content": "no",
                                                        "refusal": "I cannot"}, USER]}, 400,
     "messages[1].refusal", "unsupported_parameter", "only null (or an empty list) is accepted"),
    ("an unknown key with an unreadable name", {"messages": [USER], "a b" * 50_000: 1}, 400,
     None, "unknown_parameter", "unknown field 'a ba ba b"),
    ("min_tokens above max_tokens", {"messages": [USER], "max_tokens": 8, "min_tokens": 9}, 400,
     "min_tokens", "invalid_value", "refuses min_tokens > max_tokens"),
    ("min_tokens beyond the window", {"messages": [USER], "min_tokens": 37 * 10**15}, 400,
     "min_tokens", "invalid_value", "must be below the context window"),
    ("an empty stop", {"messages": [USER], "stop": ""}, 400, "stop", "invalid_value",
     "1 to 64 characters, got 0"),
    ("a 65-character stop", {"messages": [USER], "stop": ["ok", "x" * 65]}, 400, "stop[1]",
     "invalid_value", "1 to 64 characters, got 65"),
    ("a stop that is a number", {"messages": [USER], "stop": [7]}, 400, "stop[0]",
     "invalid_type", "a stop sequence is a string"),
    ("a stop that is an object", {"messages": [USER], "stop": {"a": 1}}, 400, "stop",
     "invalid_type", "a string, a list of strings or null"),
    ("a lone surrogate in a stop", b'{"messages":[{"role":"user","content":"x"}],"stop":"\\ud800"}',
     400, "stop", "invalid_value", "lone surrogate"),
    ("a 100,000-item stop list", {"messages": [USER], "stop": ["x"] * 100_000}, 400, "stop",
     "invalid_value", "at most 4 stop sequences, got 100000"),
    ("a response_format type that is an object", {"messages": [USER],
                                                  "response_format": {"type": {}}}, 400,
     "response_format.type", "invalid_value", "'text', 'json_object', 'json_schema'"),
    ("n with a fraction", {"messages": [USER], "n": 1.5}, 400, "n", "invalid_type",
     "valid integer; got 1.5"),
    ("n as a boolean", {"messages": [USER], "n": True}, 400, "n", "invalid_type",
     "valid integer"),
    ("not UTF-8", b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', 400, None,
     "invalid_json", "not valid UTF-8 (byte 39)"),
    ("nested 100,000 deep", b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     None, "invalid_json", "nested too deeply"),
    ("a json_schema nested 65 deep", {"messages": [USER], "response_format": {
        "type": "json_schema", "json_schema": {"name": "deep", "schema": json.loads(
            '{"a":' * 65 + "1" + "}" * 65)}}}, 400, "response_format.json_schema.schema",
     "invalid_value", "more than 64 levels deep"),
    ("truncated JSON", b'{"messages":[{"role":"user","content":"x"}', 400, None,
     "invalid_json", "not valid JSON (error at byte"),
]


@pytest.mark.parametrize(("label", "body", "status", "param", "code", "fragment"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
@pytest.mark.parametrize("path", ["/invocations", "/v1/chat/completions"])
def test_bad_input_is_a_4xx_naming_the_field(gateway: GatewayProcess, path: str, label: str,
                                              body: Any, status: int, param: str | None,
                                              code: str, fragment: str) -> None:
    headers = {"content-type": "application/x-www-form-urlencoded"} if label == "form body" else {}
    response = (post(gateway, body, path=path, headers=headers) if headers
                else post(gateway, body, path=path))
    assert response.status_code == status, response.text
    error = assert_error_shape(response)
    assert (error["param"], error["code"]) == (param, code), error
    assert fragment in error["message"], error["message"]
    assert error["type"] == "invalid_request_error"


def test_the_docs_table_of_refusals_matches_the_tests() -> None:
    """docs/gateway.md's table of 4xx codes lists exactly the codes this table and the
    gateway's code list use (the 404s, 413 and sessions' are tested beside)."""
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("<!-- error codes -->"):text.index("<!-- /error codes -->")]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert documented == set(CODES), (documented ^ set(CODES))
    assert {case[4] for case in BAD_REQUESTS} <= set(CODES)


@pytest.mark.parametrize("extra", [
    {"messages": [USER, {"role": "assistant", "content": "Which volume?"}]},
    {"messages": [{"role": "user", "content": "   "}]},
    {"messages": [USER, {"role": "assistant", "content": "yes", "refusal": None, "audio": None,
                         "annotations": [], "tool_calls": None, "function_call": None}, USER]},
    {"messages": [USER], "max_tokens": 8.0, "n": 2.0, "temperature": 1},
    {"messages": [USER], "min_tokens": 600},
    {"messages": [USER], "mangaassist": {"pinned_messages": [0]}},
    {"messages": [USER], "max_tokens": 8, "min_tokens": 8, "stop": ["\u3002", "x" * 64]},
])
def test_what_openai_and_vllm_accept_is_accepted(gateway: GatewayProcess,
                                                  extra: dict[str, Any]) -> None:
    """A conversation that ends with the assistant or with a blank message, an answer's message
    echoed back as the openai SDK dumps it, whole numbers written as 5.0, min_tokens above the
    default output limit (the limit rises to it), a pin of the current message (always kept) and
    stops at their bounds."""
    body = extra if "min_tokens" in extra else {"max_tokens": 4, **extra}
    response = post(gateway, body)
    assert response.status_code == 200, response.text
    if "min_tokens" in extra and "max_tokens" not in extra:
        assert response.json()["mangaassist"]["context"]["max_output_tokens"] == 600


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 2, "temperature": 0}, "n"),
])
def test_an_engine_refusal_of_a_stream_is_a_400_before_the_stream(
        gateway: GatewayProcess, extra: dict[str, Any], param: str) -> None:
    response = post(gateway, {"messages": [USER], "max_tokens": 8, "stream": True, **extra})
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["param"] == param


def test_oversized_bodies_are_413(gateway: GatewayProcess) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 1_100_000}]}).encode()
    declared = post(gateway, big)
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(40):
            yield b"x" * 50_000

    streamed = httpx.post(gateway.url + "/invocations", content=chunks(),
                          headers={"content-type": "application/json"}, timeout=30.0)
    assert streamed.status_code == 413
    assert "GATEWAY_MAX_BODY_BYTES" in streamed.json()["error"]["message"]


def test_unknown_paths_and_methods_are_openai_errors(gateway: GatewayProcess) -> None:
    missing = httpx.get(gateway.url + "/v1/embeddings")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = httpx.get(gateway.url + "/invocations")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_every_request_line_is_valid_emf(gateway: GatewayProcess) -> None:
    post(gateway, {"messages": [USER], "max_tokens": 3})
    post(gateway, {"messages": []})
    time.sleep(0.2)
    requests = [line for line in gateway.lines() if line.get("event") == "request"]
    counted = [line for line in requests if "_aws" in line]
    assert counted
    for document in counted:
        assert_valid_emf(document)
        assert document["EndpointName"] == "test-endpoint"
    assert any(line.get("Requests") == 1.0 for line in counted)
    assert any(line.get("ClientErrors") == 1.0 for line in counted)
    deadline = time.monotonic() + 5.0  # GATEWAY_METRICS_INTERVAL_S=1 in the harness
    gauges = [line for line in gateway.emf() if line.get("event") == "gauges"]
    while not gauges and time.monotonic() < deadline:
        time.sleep(0.1)
        gauges = [line for line in gateway.emf() if line.get("event") == "gauges"]
    assert gauges
    for document in gauges:
        assert_valid_emf(document)
        assert 0.0 <= document["KVCacheUsage"] <= 100.0
