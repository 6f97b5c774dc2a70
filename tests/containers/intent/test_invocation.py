"""intent_server.invocation: the request body forms, the media type, the size limits."""

from __future__ import annotations

import pytest

from intent_server.invocation import InvocationError, Limits, media_type, parse_invocation

LIMITS = Limits(max_body_bytes=1000, max_text_chars=50, max_batch_texts=3)


def test_media_type_normalizes_and_defaults_to_json() -> None:
    assert media_type("Application/JSON; charset=UTF-8") == "application/json"
    assert media_type(None) == "application/json"
    parsed = parse_invocation(b'{"text": "hi"}', None, LIMITS)
    assert parsed.texts == ("hi",)
    assert not parsed.batch


def test_batch_and_limits() -> None:
    assert parse_invocation(b'{"texts": ["a", "b"]}', "application/json", LIMITS).batch
    with pytest.raises(InvocationError) as too_many:
        parse_invocation(b'{"texts": ["a", "b", "c", "d"]}', "application/json", LIMITS)
    assert too_many.value.status == 413
    assert "limit is 3" in too_many.value.message
    with pytest.raises(InvocationError) as too_big:
        parse_invocation(b"x" * 1001, "text/plain", LIMITS)
    assert too_big.value.status == 413
