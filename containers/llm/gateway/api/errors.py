"""What a refused request is told: the field's public path, one sentence, OpenAI's error code.

Every 4xx the gateway answers is an :class:`ApiError` (this module's, the HTTP layer's one
error base), and every :class:`ApiError` becomes a body in one place
(:func:`gateway.api.responses.error_document`). This module turns what pydantic, FastAPI and
the JSON parser report into that error's three parts, without their internals: ``param`` is the
field as a client names it (``messages[0].role``, ``stop``,
``response_format.json_schema.name``) — never a validator chain, a union member or a memory
address —, the message says the rule and the value (any value the client sent is shown
truncated, :func:`shown`), and the code is one of :data:`CODES` (OpenAI's names where OpenAI
has one).

Pure module (no I/O).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.api.openai_fields import refusal

CODES: Mapping[str, str] = {
    "invalid_json": "the body is not JSON: malformed, not UTF-8, nested too deeply, or empty",
    "invalid_content_type": "the body was not sent as application/json",
    "invalid_type": "a field has the wrong JSON type (a string where a number goes ...)",
    "invalid_value": "a field's value is out of its range or breaks a rule",
    "missing_required_parameter": "a required field is absent",
    "unknown_parameter": "a field this API does not have",
    "unsupported_parameter": "a field of OpenAI's or vLLM's API this gateway refuses, with why",
    "unsupported_value": "a value this gateway refuses, with why (a tool role, an image part)",
    "context_length_exceeded": "the conversation cannot fit the context window",
    "model_not_found": "`model` names nothing served here",
    "not_found": "no such path",
    "method_not_allowed": "the path does not take that method",
    "request_too_large": "the body is over GATEWAY_MAX_BODY_BYTES",
    "invalid_session_id": "a session request without a valid session id",
}
"""Every ``code`` a 4xx (other than shedding) can carry, and when."""

STATUS_CODES: Mapping[int, str] = {
    400: "invalid_value", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
    429: "rate_limit_exceeded", 500: "internal_error", 503: "service_unavailable",
}
"""The code of an error raised without one, by its HTTP status (never null)."""

SHOWN_CHARS = 80
"""How much of a value the client sent an error message repeats."""
MESSAGE_CHARS = 600
"""The longest error message (the rule and the truncated value fit well inside)."""
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_TYPE_ERRORS = frozenset({"model_type", "model_attributes_type", "dataclass_type",
                          "none_required", "content_type", "int_from_float"})


@dataclass(frozen=True)
class RequestProblem:
    """One refused request's error: its message, the field's public path, OpenAI's code."""

    message: str
    param: str | None
    code: str


def shown(value: Any) -> str:
    """A value the client sent, as an error message repeats it: at most :data:`SHOWN_CHARS`."""
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def sentence(message: str) -> str:
    """``message`` cut to :data:`MESSAGE_CHARS`."""
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS - 3] + "..."


def field_path(parts: Sequence[str | int]) -> str | None:
    """``("messages", 0, "role")`` → ``messages[0].role``; None for the body itself."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else ("." if text else "") + part
    return text or None


def public_parts(loc: Sequence[Any], *, union_tags: Mapping[str, frozenset[str]],
                 body_tags: frozenset[str]) -> list[str | int]:
    """The field path in pydantic's error location, without what is not a field: ``body``,
    /invocations' body kind (``body_tags``), a tagged union's tag after its field
    (``union_tags``) and anything that is not a field name or an index (a union member's
    validator chain)."""
    parts = [part for part in loc if part != "body"]
    if parts and parts[0] in body_tags:
        parts = parts[1:]
    kept: list[str | int] = []
    for index, part in enumerate(parts):
        if isinstance(part, int) or (isinstance(part, str) and _FIELD_NAME.match(part)
              and not (index > 0 and part in union_tags.get(str(parts[index - 1]), ()))):
            kept.append(part)
    return kept


def _unknown_field(parent_parts: list[str | int], key: Any) -> RequestProblem:
    """A key the object at ``parent_parts`` does not have: named as ``param`` when it reads as a
    field name, else shown truncated with the object as ``param``."""
    parent = field_path(parent_parts)
    name = key if isinstance(key, str) and _FIELD_NAME.match(key) else None
    where = f"{parent}: " if parent else ""
    if name is None:
        return RequestProblem(f"{where}unknown field {shown(key)} (not accepted by this gateway)",
                              parent, "unknown_parameter")
    param = field_path([*parent_parts, name])
    reason = refusal(name) if parent is None else None
    if reason is not None:
        return RequestProblem(f"{param}: not accepted by this gateway: {reason}", param,
                              "unsupported_parameter")
    return RequestProblem(f"{param}: unknown field (not accepted by this gateway)", param,
                          "unknown_parameter")


def _body_problem(kind: str, received: Any) -> RequestProblem:
    """An error about the body as a whole (no field to name)."""
    if kind == "missing":
        return RequestProblem("request body is required: a JSON object with `messages`", None,
                              "invalid_json")
    if isinstance(received, bytes | bytearray | str):
        return RequestProblem("request body must be JSON sent with Content-Type: "
                              "application/json", None, "invalid_content_type")
    return RequestProblem(f"request body must be a JSON object, got {shown(received)}", None,
                          "invalid_type")


def _code(kind: str) -> str:
    if kind in ("unsupported_parameter", "unsupported_value"):
        return kind
    if kind.endswith(("_type", "_parsing")) or kind in _TYPE_ERRORS:
        return "invalid_type"
    return "invalid_value"


def _rule(error: Mapping[str, Any]) -> str:
    """Pydantic's sentence for the rule, without its prefixes and without the value (shown
    truncated by the caller)."""
    kind = str(error.get("type", ""))
    context = error.get("ctx") or {}
    if kind == "union_tag_invalid":
        return f"accepted: {context.get('expected_tags', '?')}"
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message


def validation_problem(errors: Sequence[Mapping[str, Any]], *,
                       union_tags: Mapping[str, frozenset[str]],
                       body_tags: frozenset[str]) -> RequestProblem:
    """Pydantic's (or FastAPI's) errors as one :class:`RequestProblem`, naming the first."""
    first = errors[0]
    kind = str(first.get("type", ""))
    loc = tuple(first.get("loc", ()))
    received = first.get("input")
    if kind == "json_invalid":
        position = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
        return RequestProblem(f"request body is not valid JSON (error at byte {position})", None,
                              "invalid_json")
    if kind == "extra_forbidden" and loc:
        parent = public_parts(loc[:-1], union_tags=union_tags, body_tags=body_tags)
        return _unknown_field(parent, loc[-1])
    parts = public_parts(loc, union_tags=union_tags, body_tags=body_tags)
    if kind == "union_tag_invalid":
        parts = [*parts, str((first.get("ctx") or {}).get("discriminator", "type")).strip("'")]
    param = field_path(parts)
    if param is None:
        return _body_problem(kind, received)
    if kind == "missing":
        return RequestProblem(f"{param}: field required", param, "missing_required_parameter")
    rule = _rule(first)
    element = re.match(r"^(\[\d+\](?:\.[A-Za-z_]+)?): ", rule)
    if element:  # a validator naming an element of the field: "[1].type: ..."
        param += element.group(1)
        rule = rule[element.end():]
    extra = f" ({len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return RequestProblem(sentence(f"{param}: {rule}; got {shown(received)}{extra}"), param,
                          _code(kind))


def unparsable_body(body: bytes) -> RequestProblem:
    """Why ``body``, which the JSON parser refused without a position, is not JSON: not UTF-8,
    or nested deeper than the parser goes (about 1,000 levels in CPython)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        return RequestProblem(f"request body is not valid UTF-8 (byte {error.start}); JSON "
                              "must be UTF-8", None, "invalid_json")
    try:
        json.loads(text)
    except RecursionError:
        return RequestProblem("request body is JSON nested too deeply to parse", None,
                              "invalid_json")
    except ValueError as error:
        return RequestProblem(sentence(f"request body is not valid JSON ({error})"), None,
                              "invalid_json")
    return RequestProblem("request body could not be read as JSON", None, "invalid_json")


class ApiError(Exception):
    """A request the gateway answers with an OpenAI-style error (never 5xx for bad input).

    The code is never null: without one, the status's (:data:`gateway.api.errors.STATUS_CODES`);
    the message is cut to :data:`gateway.api.errors.MESSAGE_CHARS`.
    """

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = sentence(message)
        self.type_ = type_
        self.param = param
        self.code = code or STATUS_CODES.get(status, "invalid_value")
        self.headers = headers or {}

    @classmethod
    def bad_request(cls, problem: RequestProblem) -> ApiError:
        """The 400 for ``problem``."""
        return cls(400, problem.message, param=problem.param, code=problem.code)
