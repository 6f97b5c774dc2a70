"""SageMaker stateful sessions (gateway.sessions): the table alone, and the protocol over a real
socket — open with ``{"requestType": "NEW_SESSION"}``, use the id, close it — where a session is
only ever a routing hint: an unknown, expired or malformed id is served like no id at all."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import httpx
import pytest

from gateway.sessions import (
    CLOSED_SESSION_ID_HEADER,
    NEW_SESSION_ID_HEADER,
    SESSION_ID_HEADER,
    SessionState,
    SessionTable,
    is_session_id,
)
from tests.containers.llm.harness import GatewayProcess
from tests.containers.llm.test_telemetry import assert_valid_emf

QUESTION = {"role": "user", "content": "Is One Piece volume 1 available in English?"}
NEW_SESSION_VALUE = re.compile(r"^([0-9a-f-]{36}); Expires=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_lives_until_its_expiry_and_closing_is_idempotent() -> None:
    clock = Clock()
    table = SessionTable(ttl_s=600, max_sessions=10, clock=clock)
    session = table.open()
    assert is_session_id(session.session_id)
    assert session.new_session_header() == (
        f"{session.session_id}; Expires=2027-01-15T08:10:00Z")
    assert table.state(session.session_id) is SessionState.ACTIVE
    clock.now += 599
    assert table.state(session.session_id) is SessionState.ACTIVE
    clock.now += 1
    assert table.state(session.session_id) is SessionState.EXPIRED
    assert table.close(session.session_id) is True
    assert table.close(session.session_id) is False
    assert table.state(session.session_id) is SessionState.UNKNOWN


def test_the_table_is_bounded_and_forgets_the_oldest_and_the_expired() -> None:
    clock = Clock()
    table = SessionTable(ttl_s=100, max_sessions=3, clock=clock)
    first, *rest = [table.open() for _ in range(4)]
    assert len(table) == 3
    assert table.state(first.session_id) is SessionState.UNKNOWN
    assert all(table.state(s.session_id) is SessionState.ACTIVE for s in rest)
    clock.now += 100
    table.open()
    assert len(table) == 1  # the expired ones went when the next one opened
    assert table.opened_total == 5


@pytest.mark.parametrize(("value", "accepted"), [
    ("6f1c8a34-0b5e-4d3e-9b7a-2a1f3c4d5e6f", True), ("abc", True), ("a--b", True),
    ("-abc", False), ("abc-", False), ("NEW_SESSION", False), ("a b", False), ("", False),
    ("a" * 257, False)])
def test_session_ids_have_sagemakers_form(value: str, accepted: bool) -> None:
    assert is_session_id(value) is accepted


def open_session(gateway: GatewayProcess) -> tuple[str, datetime]:
    response = httpx.post(f"{gateway.url}/invocations", json={"requestType": "NEW_SESSION"},
                          headers={SESSION_ID_HEADER: "NEW_SESSION"}, timeout=10)
    assert response.status_code == 200, response.text
    match = NEW_SESSION_VALUE.match(response.headers[NEW_SESSION_ID_HEADER])
    assert match, response.headers[NEW_SESSION_ID_HEADER]
    expires = datetime.strptime(match[2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert response.json() == {"session_id": match[1], "expires_at": match[2]}
    return match[1], expires


def chat(gateway: GatewayProcess, session: str | None, **body: object) -> httpx.Response:
    headers = {SESSION_ID_HEADER: session} if session is not None else {}
    return httpx.post(f"{gateway.url}/invocations", headers=headers, timeout=30,
                      json={"messages": [QUESTION], "max_tokens": 6, **body})


def test_open_use_and_close_a_session(gateway: GatewayProcess) -> None:
    session, expires = open_session(gateway)
    remaining = (expires - datetime.now(UTC)).total_seconds()
    assert 1200 - 5 <= remaining <= 1200 + 1  # GATEWAY_SESSION_TTL_S
    for _ in range(2):
        answer = chat(gateway, session)
        assert answer.status_code == 200
        assert answer.json()["mangaassist"]["session"] == {"id": session, "state": "active"}
        assert NEW_SESSION_ID_HEADER not in answer.headers
    closed = httpx.post(f"{gateway.url}/invocations", json={"requestType": "CLOSE"},
                        headers={SESSION_ID_HEADER: session}, timeout=10)
    assert closed.status_code == 200
    assert closed.headers[CLOSED_SESSION_ID_HEADER] == session
    assert closed.json() == {"session_id": session, "was_open": True}
    after = chat(gateway, session)
    assert after.status_code == 200
    assert after.json()["mangaassist"]["session"] == {"id": session, "state": "unknown"}


def test_a_request_without_a_session_reports_none(gateway: GatewayProcess) -> None:
    assert "session" not in chat(gateway, None).json()["mangaassist"]


@pytest.mark.parametrize("session", ["0b3f5c1e-9d2a-4e77-8a1b-5c6d7e8f9a0b", "not a session id",
                                     "x" * 300])
def test_an_unknown_or_malformed_session_is_served_as_usual_and_counted(
        gateway: GatewayProcess, session: str) -> None:
    before = len(gateway.emf())
    answer = chat(gateway, session)
    assert answer.status_code == 200
    assert answer.json()["mangaassist"]["session"] == {"id": session[:256], "state": "unknown"}
    assert answer.json()["mangaassist"]["fallback"] is None
    misses = [d for d in gateway.emf()[before:] if "SessionMisses" in d]
    assert len(misses) == 1
    assert_valid_emf(misses[0])


def test_a_chat_sent_with_new_session_opens_one_and_answers(gateway: GatewayProcess) -> None:
    answer = chat(gateway, "NEW_SESSION")
    assert answer.status_code == 200
    match = NEW_SESSION_VALUE.match(answer.headers[NEW_SESSION_ID_HEADER])
    assert match
    assert answer.json()["mangaassist"]["session"] == {"id": match[1], "state": "opened"}
    streamed = chat(gateway, match[1], stream=True)
    first = next(line for line in streamed.text.splitlines() if line.startswith("data: {"))
    assert '"session":{"id":"' + match[1] + '","state":"active"}' in first


def test_closing_needs_the_session_header(gateway: GatewayProcess) -> None:
    response = httpx.post(f"{gateway.url}/invocations", json={"requestType": "CLOSE"}, timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == SESSION_ID_HEADER
    assert "closing a session needs its id" in error["message"]


@pytest.mark.parametrize(("body", "param"), [({"requestType": "OPEN"}, "requestType"),
                                             ({"requestType": "CLOSE", "x": 1}, "x"),
                                             ({"requestType": 1}, "requestType")])
def test_a_bad_session_request_is_a_400_naming_the_field(gateway: GatewayProcess,
                                                         body: dict[str, object],
                                                         param: str) -> None:
    response = httpx.post(f"{gateway.url}/invocations", json=body, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_the_openai_path_has_no_session_requests(gateway: GatewayProcess) -> None:
    """Sessions are SageMaker's: /v1/chat/completions takes chat requests only."""
    response = httpx.post(f"{gateway.url}/v1/chat/completions",
                          json={"requestType": "NEW_SESSION"}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"  # the first problem it names
