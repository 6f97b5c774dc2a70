"""/invocations request bodies → the texts to classify, or a 4xx with a clear message.

Accepted bodies:

- ``application/json`` ``{"text": "..."}``         → one prediction object
- ``application/json`` ``{"texts": ["...", ...]}`` → ``{"predictions": [...]}``
- ``text/plain`` (UTF-8) raw text                   → one prediction object

Everything else is refused before it reaches the tokenizer: a body over the size limit (413),
a content type other than those (415), invalid UTF-8 or JSON (400), a JSON value that is not an
object, unknown keys, both or neither of text/texts, a text that is not a string, empty or
whitespace-only, longer than the character limit (413), or too many texts (413).

Pure module (no web framework), Python 3.10-compatible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

JSON_TYPES = ("application/json",)
TEXT_TYPES = ("text/plain",)
ACCEPTED_CONTENT_TYPES = (*JSON_TYPES, *TEXT_TYPES)
ALLOWED_KEYS = frozenset({"text", "texts"})


class InvocationError(ValueError):
    """A request the server refuses, with the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class InvocationRequest:
    """Validated texts, and whether the caller sent one text or a batch."""

    texts: tuple[str, ...]
    batch: bool


@dataclass(frozen=True)
class Limits:
    """Size limits (from the settings)."""

    max_body_bytes: int
    max_text_chars: int
    max_batch_texts: int


def media_type(content_type: str | None) -> str:
    """``"Application/JSON; charset=utf-8"`` → ``"application/json"``; missing → JSON."""
    if not content_type or not content_type.strip():
        return "application/json"
    return content_type.split(";", 1)[0].strip().lower()


def _charset(content_type: str | None) -> str | None:
    for part in (content_type or "").split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def _check_text(value: object, where: str, limits: Limits) -> str:
    if not isinstance(value, str):
        raise InvocationError(400, f"{where}: expected a string, got {_json_type(value)}")
    if not value.strip():
        raise InvocationError(400, f"{where}: is empty; send the customer's message text")
    if len(value) > limits.max_text_chars:
        raise InvocationError(413, f"{where}: {len(value)} characters; the limit is "
                                   f"{limits.max_text_chars} (the model reads at most 128 "
                                   "tokens anyway)")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def parse_invocation(body: bytes, content_type: str | None, limits: Limits) -> InvocationRequest:
    """Validate an /invocations body; raise InvocationError with the status and message."""
    if len(body) > limits.max_body_bytes:
        raise InvocationError(413, f"body: {len(body)} bytes; the limit is "
                                   f"{limits.max_body_bytes}")
    kind = media_type(content_type)
    if kind not in ACCEPTED_CONTENT_TYPES:
        raise InvocationError(415, f"Content-Type: {kind!r} is not accepted; accepted: "
                                   f"{', '.join(ACCEPTED_CONTENT_TYPES)}")
    charset = _charset(content_type)
    if charset not in (None, "utf-8", "utf8"):
        raise InvocationError(415, f"Content-Type charset {charset!r}: only utf-8 is accepted")
    try:
        decoded = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvocationError(400, f"body: not valid UTF-8 (byte {error.start})") from None

    if kind in TEXT_TYPES:
        return InvocationRequest(texts=(_check_text(decoded, "body", limits),), batch=False)

    if not decoded.strip():
        raise InvocationError(400, 'body: empty; send {"text": "..."} or {"texts": [...]}')
    try:
        payload = json.loads(decoded)
    except (json.JSONDecodeError, RecursionError) as error:
        detail = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply"
        raise InvocationError(400, f"body: not valid JSON ({detail})") from None
    if not isinstance(payload, dict):
        raise InvocationError(400, f"body: expected a JSON object with \"text\" or \"texts\", "
                                   f"got {_json_type(payload)}")
    unknown = sorted(set(payload) - ALLOWED_KEYS)
    if unknown:
        raise InvocationError(400, f"body: unknown field(s) {unknown}; accepted: "
                                   '"text" (one string) or "texts" (a list of strings)')
    if ("text" in payload) == ("texts" in payload):
        raise InvocationError(400, 'body: send exactly one of "text" (one string) or '
                                   '"texts" (a list of strings)')
    if "text" in payload:
        return InvocationRequest(texts=(_check_text(payload["text"], "text", limits),),
                                 batch=False)
    texts = payload["texts"]
    if not isinstance(texts, list):
        raise InvocationError(400, f"texts: expected a list of strings, got {_json_type(texts)}")
    if not texts:
        raise InvocationError(400, "texts: is empty; send at least one text")
    if len(texts) > limits.max_batch_texts:
        raise InvocationError(413, f"texts: {len(texts)} texts; the limit is "
                                   f"{limits.max_batch_texts} per request")
    checked = tuple(_check_text(value, f"texts[{i}]", limits) for i, value in enumerate(texts))
    return InvocationRequest(texts=checked, batch=True)


def error_body(status: int, message: str) -> dict[str, object]:
    """The JSON body of every refusal."""
    return {"error": {"status": status, "message": message}}
