"""Hostile input over a real socket: no request the client controls gets a 5xx, and every refusal
is OpenAI's error shape naming a public field with a non-null code.

* Schemathesis' coverage phase (boundary and wrong-type values for every field, positive and
  negative) and its fuzzing phase (positive and negative generation) on both chat paths.
* The schema is the contract: requests generated only from ``/openapi.json``'s positive space are
  accepted (at least 95 %), the rest refused for a documented reason.
* Hand-written cases the generators do not reach: headers, content types, sizes, nesting,
  encodings, numbers, ranges, huge ``stop`` lists and schemas.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.generation.drivers import CoverageGenerator
from schemathesis.generation.feedback import FeedbackSources
from schemathesis.generation.overrides import Override
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.containers.llm.error_shape import assert_error_shape, error_shape_problems
from tests.containers.llm.harness import GatewayProcess

CHAT_PATHS = ("/invocations", "/v1/chat/completions")
FUZZ_CASES = 600
FUZZ_RANDOM = os.environ.get("MANGAASSIST_FUZZ_RANDOM") == "1"
"""The fuzzing phase draws the same 600 cases on every run (a CI run meets what a local run
met); MANGAASSIST_FUZZ_RANDOM=1 explores new ones."""
SCHEMA_VALID_CASES = 300
USER = {"role": "user", "content": "Is One Piece volume 1 available in English?"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]


def _schema(gateway: GatewayProcess) -> Any:
    return schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")


def test_the_coverage_phase_finds_no_server_error(gateway: GatewayProcess) -> None:
    """Schemathesis' coverage phase: every field at its boundaries and with each wrong JSON type
    (an object or a list where a string goes ...), positive and negative, on both paths."""
    schema = _schema(gateway)
    session = requests.Session()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    shapes: Counter[str] = Counter()
    for path in CHAT_PATHS:
        operation = schema[path]["POST"]
        generator = CoverageGenerator(
            operation=operation,
            generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            generation_config=schema.config.generation_for(operation=operation,
                                                           phase="coverage"),
            auth_storage=None, override=Override(), feedback=FeedbackSources())
        for case in generator:
            response = case.call(base_url=gateway.url, session=session, timeout=30)
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                failures.append(f"{path} {response.status_code} {json.dumps(case.body)[:300]} "
                                f"-> {response.text[:200]}")
            elif response.status_code >= 400:
                for problem in error_shape_problems(response, case.body):
                    shapes[problem.split(":")[0][:60]] += 1
    print(f"coverage phase: {sum(statuses.values())} requests; statuses {sorted(statuses.items())}"
          f"; error-shape problems {dict(shapes)}")
    assert not failures, "\n".join(failures[:10])
    assert not shapes, shapes
    assert sum(statuses.values()) >= 600
    assert gateway.process.poll() is None


def test_a_value_the_caller_sent_is_not_taken_for_an_internal() -> None:
    """The leak check reads the message less what the caller sent: a fuzzer's string "0x"
    quoted back ("got ['0x']") is the caller's, a ``<function ... at 0x7f...>`` is not."""
    quoting = httpx.Response(400, json={"error": {
        "message": "messages[0].tool_calls: not accepted by this gateway; got ['0x']",
        "type": "invalid_request_error", "param": "messages[0].tool_calls",
        "code": "unsupported_parameter"}})
    assert error_shape_problems(quoting, {"messages": [{"tool_calls": ["0x"]}]}) == []
    assert error_shape_problems(quoting) != []
    internal = httpx.Response(400, json={"error": {
        "message": "messages: <function check at 0x7f3a> failed", "type": "invalid_request_error",
        "param": "messages", "code": "invalid_value"}})
    assert error_shape_problems(internal, {"messages": [{"content": "0x"}]}) == [
        "message leaks ['<function']: 'messages: <function check at 0x7f3a> failed'"]


@pytest.mark.budget(reason="schemathesis's positive and negative generation against a real gateway, one request per case (30-42 s on the quiet machine, 62 s once the host slowed by half)")
def test_the_fuzzing_phase_finds_no_server_error(gateway: GatewayProcess) -> None:
    """Positive and negative generation on every operation: no 5xx, every status documented,
    every JSON answer matching its schema, negative bodies refused with a documented 4xx."""
    schema = _schema(gateway)
    operations = [schema[path]["POST"] for path in CHAT_PATHS]
    strategies = [operation.as_strategy(generation_mode=mode) for operation in operations
                  for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    strategies += [schema[path]["GET"].as_strategy() for path in ("/ping", "/v1/models")]
    session = requests.Session()
    statuses: Counter[int] = Counter()

    @settings(max_examples=FUZZ_CASES, deadline=None, database=None,
              derandomize=not FUZZ_RANDOM, suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*strategies))
    def check(case: schemathesis.Case) -> None:
        response = case.call(base_url=gateway.url, session=session, timeout=30)
        statuses[response.status_code] += 1
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
        if response.status_code >= 400 and case.operation.method.upper() == "POST":
            assert_error_shape(response, sent=case.body)
        case.validate_response(response, checks=CHECKS)

    check()
    print(f"fuzzing phase: {sum(statuses.values())} requests; statuses {sorted(statuses.items())}")
    assert sum(statuses.values()) >= FUZZ_CASES
    assert sum(count for status, count in statuses.items() if 400 <= status < 500) > 20
    assert gateway.process.poll() is None
    assert gateway.ping().status_code == 200


ENGINE_LIMITATION = "the simulator cannot constrain output to JSON (vLLM can)"
BUDGET_REFUSAL = "the conversation cannot fit the window"
DOCUMENTED_REFUSALS: dict[str, tuple[str, str]] = {
    "min_tokens above max_tokens": ("invalid_value", "min_tokens"),
    "both max_tokens and max_completion_tokens": ("invalid_value", "max_completion_tokens"),
    "a pin beyond the conversation": ("invalid_value", "mangaassist.pinned_messages["),
    BUDGET_REFUSAL: ("context_length_exceeded", ""),
    "greedy sampling of several choices (vLLM's rule)": ("invalid_value", "n"),
    ENGINE_LIMITATION: ("invalid_value", "response_format"),
    "closing a session without its id header": ("invalid_session_id", ""),
}
"""Why a request valid by /openapi.json may still be refused: what JSON Schema cannot state
(docs/gateway.md, "The published schema is the contract") — (code, start of ``param``)."""
CROSS_FIELD = ("min_tokens above max_tokens", "a pin beyond the conversation")
"""Rules between two fields (a value against another, an index against the list's length) that
JSON Schema cannot state; the generator breaks them at random."""


def _refusal_reason(error: dict[str, Any]) -> str | None:
    for reason, (code, param) in DOCUMENTED_REFUSALS.items():
        if error["code"] == code and (error["param"] or "").startswith(param):
            return reason
    return None


def _body_validator(document: dict[str, Any], path: str) -> Draft202012Validator:
    """An independent JSON Schema validator for ``path``'s request body."""
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return Draft202012Validator({**body["schema"], "components": document["components"]})


def test_schema_valid_requests_are_accepted(gateway: GatewayProcess) -> None:
    """Requests generated only from the schema's positive space: every one answered 200 or
    refused for a documented reason, and at least 95 % of those the engine and the context
    budget can serve, and that break none of the two cross-field rules JSON Schema cannot state
    (CROSS_FIELD), answered 200 (the simulated engine refuses a JSON response_format, which
    vLLM serves, and a conversation that cannot fit is the budget's refusal). The cross-field
    refusals are printed, and stay under a tenth of all."""
    schema = _schema(gateway)
    strategies = [schema[path]["POST"].as_strategy(generation_mode=GenerationMode.POSITIVE)
                  for path in CHAT_PATHS]
    document = requests.get(f"{gateway.url}/openapi.json", timeout=10).json()
    validators = {path: _body_validator(document, path) for path in CHAT_PATHS}
    session = requests.Session()
    outcomes: Counter[str] = Counter()
    undocumented: list[str] = []

    @settings(max_examples=SCHEMA_VALID_CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*strategies))
    def send(case: schemathesis.Case) -> None:
        if not validators[case.operation.path].is_valid(case.body):
            outcomes["not schema-valid (generator's float rounding): skipped"] += 1
            return
        response = case.call(base_url=gateway.url, session=session, timeout=30)
        if response.status_code == 200:
            outcomes["accepted"] += 1
            return
        error = assert_error_shape(response, sent=case.body)
        reason = _refusal_reason(error)
        outcomes[reason or "undocumented"] += 1
        if reason is None:
            undocumented.append(f"{json.dumps(case.body)[:300]} -> {error}")

    send()
    total = sum(count for outcome, count in outcomes.items() if "skipped" not in outcome)
    cross_field = sum(outcomes[reason] for reason in CROSS_FIELD)
    servable = total - outcomes[ENGINE_LIMITATION] - outcomes[BUDGET_REFUSAL] - cross_field
    print(f"schema-valid: {total} requests, {servable} the engine and the budget can serve; "
          f"{dict(outcomes)}; "
          f"accepted {outcomes['accepted'] / total:.1%} of all, "
          f"{outcomes['accepted'] / servable:.1%} of the servable, "
          f"{outcomes['accepted'] / (servable + cross_field):.1%} counting the cross-field rules")
    assert not undocumented, "\n".join(undocumented[:10])
    assert outcomes["accepted"] >= 0.95 * servable, outcomes
    assert cross_field <= 0.1 * total, outcomes


OVERSIZED = 2_000_000
OVERSIZED_REQUESTS = 100


def _raw_exchange(port: int, head: bytes, body: bytes | list[bytes]) -> str:
    """Send ``head`` and ``body`` (a list: chunked) on a fresh socket, read the answer to its
    end; the status line, or the exception the client saw instead."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head)
            for chunk in body if isinstance(body, list) else [body]:
                sock.sendall(chunk)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError as error:
        return type(error).__name__
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def _oversized(port: int, index: int) -> str:
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * OVERSIZED + b'"}]}'
    if index % 4 == 3:  # no Content-Length: found while reading
        chunks = [b"%x\r\n%s\r\n" % (len(part), part)
                  for part in (body[i:i + 65536] for i in range(0, len(body), 65536))]
        head = (b"POST /invocations HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json"
                b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        return _raw_exchange(port, head, [*chunks, b"0\r\n\r\n"])
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    return _raw_exchange(port, head, body)


def test_an_oversized_body_gets_its_413_every_time(gateway: GatewayProcess) -> None:
    """100 requests with a 2 MB body over real sockets (three in four declaring it, one in four
    chunked), 8 at a time, beside normal traffic: every one reads its 413, none a reset."""
    normal: Counter[int] = Counter()
    done = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            while not done.is_set():
                response = client.post("/invocations", json={"messages": [USER],
                                                             "max_tokens": 4})
                normal[response.status_code] += 1

    background = [threading.Thread(target=traffic) for _ in range(2)]
    for thread in background:
        thread.start()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = Counter(pool.map(lambda index: _oversized(gateway.port, index),
                                       range(OVERSIZED_REQUESTS)))
    finally:
        done.set()
        for thread in background:
            thread.join()
    print(f"oversized: {dict(answers)}; normal traffic beside it: {dict(normal)}")
    assert answers == {"HTTP/1.1 413 Request Entity Too Large": OVERSIZED_REQUESTS}, answers
    assert set(normal) == {200} and sum(normal.values()) > 0, normal


def test_expect_continue_gets_its_413_before_sending(gateway: GatewayProcess) -> None:
    """A client that asks first (``Expect: 100-continue``) is answered without sending."""
    head = (b"POST /invocations HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % OVERSIZED)
    assert _raw_exchange(gateway.port, head, b"") == "HTTP/1.1 413 Request Entity Too Large"


def _chat(extra: str = "") -> bytes:
    return ('{"messages": [{"role": "user", "content": "Is volume 3 out?"}]' + extra
            + "}").encode()


JSON = {"content-type": "application/json"}
HOSTILE: list[tuple[str, dict[str, str], bytes, int, str | None]] = [
    # --- content types and headers
    ("JSON with a charset", {"content-type": "application/json; charset=utf-8"}, _chat(), 200,
     None),
    ("a +json media type", {"content-type": "application/vnd.api+json"}, _chat(), 200, None),
    ("text/plain", {"content-type": "text/plain"}, _chat(), 400, "invalid_content_type"),
    ("no content type", {}, _chat(), 400, "invalid_content_type"),
    ("multipart", {"content-type": "multipart/form-data; boundary=x"}, b"--x--", 400,
     "invalid_content_type"),
    ("a 4 KB content-type parameter", {"content-type": "application/json; x=" + "a" * 4096},
     _chat(), 200, None),
    ("a 4 KB session header", {**JSON, "X-Amzn-SageMaker-Session-Id": "s" * 4096}, _chat(),
     200, None),
    ("a 100 KB header", {**JSON, "X-Padding": "p" * 100_000}, _chat(), 200, None),
    # --- sizes
    ("an empty body", JSON, b"", 400, "invalid_json"),
    ("a body of spaces", JSON, b" " * 100_000, 400, "invalid_json"),
    ("1,000 text parts", JSON, json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "巻"}] * 1_000}], "max_tokens": 4}).encode(), 200, None),
    ("65 pins", JSON, _chat(', "mangaassist": {"pinned_messages": ' + str([0] * 65) + "}"),
     400, "invalid_value"),
    ("a 900 KB question", JSON, _chat().replace(b"Is volume 3 out?", b"x " * 450_000), 400,
     "context_length_exceeded"),
    # --- nesting
    ("a schema nested 500 deep", JSON, _chat(', "response_format": {"type": "json_schema", '
                                             '"json_schema": {"name": "n", "schema": '
                                             + '{"a":' * 500 + "1" + "}" * 500 + "}}"),
     400, "invalid_value"),
    ("a schema nested 64 deep", JSON, _chat(', "max_tokens": 4, "response_format": {"type": '
                                            '"json_schema", "json_schema": {"name": "n", "schema": '
                                            + '{"a":' * 64 + "1" + "}" * 64 + "}}"),
     400, "invalid_value"),
    ("content nested in lists", JSON, b'{"messages": [{"role": "user", "content": '
     + b"[" * 300 + b"]" * 300 + b"}]}", 400, "invalid_type"),
    # --- encodings
    ("UTF-16 (read as Python's json reads it)", JSON, _chat().decode().encode("utf-16"), 200,
     None),
    ("a byte-order mark (RFC 8259 lets a parser ignore it)", JSON, b"\xef\xbb\xbf" + _chat(),
     200, None),
    ("Latin-1 bytes", JSON, _chat().replace(b"volume", b"vol\xfcme"), 400, "invalid_json"),
    ("NUL and control characters", JSON, _chat().replace(b"volume", b"vol\\u0000\\u001bme"), 200,
     None),
    ("an escaped emoji pair", JSON, _chat().replace(b"volume", b"\\ud83d\\ude00"), 200, None),
    # --- numbers
    ("NaN", JSON, _chat(', "temperature": NaN'), 400, "invalid_value"),
    ("Infinity", JSON, _chat(', "top_p": Infinity'), 400, "invalid_value"),
    ("1e400", JSON, _chat(', "max_tokens": 1e400'), 400, "invalid_type"),
    ("a 5,000-digit integer", JSON, _chat(', "seed": ' + "9" * 5000), 400, "invalid_json"),
    ("-0.0", JSON, _chat(', "temperature": -0.0, "max_tokens": 4'), 200, None),
    ("4.0 choices", JSON, _chat(', "n": 4.0, "temperature": 1, "max_tokens": 4'), 200, None),
    ("a seed of 2**64", JSON, _chat(', "seed": 18446744073709551616'), 400, "invalid_value"),
    ("a duplicated key", JSON, _chat(', "messages": 5'), 400, "invalid_type"),
    # --- ranges
    ("n of 0", JSON, _chat(', "n": 0'), 400, "invalid_value"),
    ("n of 5", JSON, _chat(', "n": 5, "temperature": 1'), 400, "invalid_value"),
    ("top_k of -2", JSON, _chat(', "top_k": -2'), 400, "invalid_value"),
    ("top_logprobs of 21", JSON, _chat(', "logprobs": true, "top_logprobs": 21'), 400,
     "invalid_value"),
    ("max_tokens of the window", JSON, _chat(', "max_tokens": 4096'), 400, "invalid_value"),
    ("min_tokens of 3.7e16", JSON, _chat(', "min_tokens": 37000000000000000'), 400,
     "invalid_value"),
    # --- huge stop lists and schemas
    ("a 200,000-item stop list", JSON, _chat(', "stop": ' + json.dumps(["x"] * 200_000)), 400,
     "invalid_value"),
    ("a stop list of objects", JSON, _chat(', "stop": ' + json.dumps([{}] * 1000)), 400,
     "invalid_value"),
    ("a 700 KB schema", JSON, _chat(', "response_format": {"type": "json_schema", '
                                    '"json_schema": {"name": "big", "schema": '
                                    + json.dumps({f"p{i}": {"type": "string"}
                                                  for i in range(30_000)}) + "}}"),
     400, "invalid_value"),
]


@pytest.mark.parametrize(("label", "headers", "body", "status", "code"), HOSTILE,
                         ids=[case[0] for case in HOSTILE])
@pytest.mark.parametrize("path", CHAT_PATHS)
def test_hand_written_hostile_requests(gateway: GatewayProcess, path: str, label: str,
                                       headers: dict[str, str], body: bytes, status: int,
                                       code: str | None) -> None:
    response = httpx.post(gateway.url + path, content=body, headers=headers, timeout=60)
    assert response.status_code == status, response.text[:500]
    if status >= 400:
        assert assert_error_shape(response)["code"] == code


@pytest.mark.parametrize(("label", "head", "status"), [
    ("a Content-Length that is not a number", b"Content-Length: 12x\r\n", 400),
    ("two different Content-Lengths", b"Content-Length: 5\r\nContent-Length: 6\r\n", 400),
    ("a header line without a colon", b"X-Padding\r\n", 400),
])
def test_what_the_http_parser_refuses_before_the_gateway(gateway: GatewayProcess, label: str,
                                                         head: bytes, status: int) -> None:
    """uvicorn's parser (h11) answers these itself, in text/plain, before the app runs
    (docs/gateway.md): never a 5xx, and the gateway keeps serving."""
    request = (b"POST /invocations HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
               b"Content-Type: application/json\r\n")
    answer = _raw_exchange(gateway.port, request + head + b"\r\n", b"{}")
    assert answer.startswith(f"HTTP/1.1 {status} "), answer
    assert gateway.ping().status_code == 200


def test_a_large_head_is_accepted_however_the_network_splits_it(gateway: GatewayProcess) -> None:
    """A 100 KB header sent in 2 KB pieces, so the server reads its head in many reads: h11's
    default (16 KiB buffered before the head's end) refused it with a reset client-side, which CI
    hit when the one-piece case above happened to arrive split; MAX_HEAD_BYTES accepts it."""
    body = json.dumps({"messages": [USER], "max_tokens": 4}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nX-Padding: " + b"p" * 100_000
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(head), 2048):
            sock.sendall(head[start:start + 2048])
            time.sleep(0.002)
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


def test_a_server_error_is_in_the_request_log_and_metrics(make_runtime: Any) -> None:
    """A fault in the gateway (here: the request path raising) is a 500 in OpenAI's shape, and
    the request's one line: status 500, outcome server_error, RequestLatency."""
    runtime, lines = make_runtime()

    async def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    runtime.service.start = broken

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=runtime.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post("/v1/chat/completions", json={"messages": [USER]})

    response = asyncio.run(call())
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    records = [json.loads(line) for line in lines if '"event":"request"' in line]
    assert len(records) == 1, lines
    assert (records[0]["status"], records[0]["outcome"]) == (500, "server_error")
    assert records[0]["error_code"] == "internal_error"
    assert "RequestLatency" in records[0] and "_aws" in records[0]
