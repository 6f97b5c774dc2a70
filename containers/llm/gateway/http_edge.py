"""The HTTP edge: request-validation messages, the body-size limit and the documented errors.

Nothing here may turn bad input into a 5xx: validation errors are 400 with one sentence naming the
field, the value and the rule; bodies over ``GATEWAY_MAX_BODY_BYTES`` are 413 before they are
read whole; the OpenAPI document lists every error answer with its shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api_schema import (
    INVOCATION_TAGS,
    STREAM_DESCRIPTION,
    UNION_TAGS,
    ChatCompletionResponse,
    ErrorResponse,
    SessionClosed,
    SessionOpened,
    error_body,
)
from gateway.openai_fields import refusal

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request; `error.param` names the field."},
    404: {"model": ErrorResponse, "description": "Unknown model (adapter) or path."},
    413: {"model": ErrorResponse, "description": "Request body too large."},
    429: {"model": ErrorResponse, "description": "Shed by KV-aware admission; see Retry-After.",
          "headers": {"Retry-After": {"schema": {"type": "integer"},
                                      "description": "Seconds to wait."}}},
    503: {"model": ErrorResponse, "description": "Engine unavailable or recovering; see "
                                                 "Retry-After.",
          "headers": {"Retry-After": {"schema": {"type": "integer"},
                                      "description": "Seconds to wait."}}},
}
CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ChatCompletionResponse,
          "description": "The answer (a fallback answer is marked in mangaassist.fallback).",
          # OpenAPI 3.1: for text/event-stream the schema describes one event.
          "content": {"text/event-stream": {"schema": {
              "type": "object", "description": STREAM_DESCRIPTION, "required": ["data"],
              "properties": {"data": {"type": "string",
                                      "description": "a chat.completion.chunk as JSON, or "
                                                     "[DONE]"},
                             "event": {"type": "string"}}}}}},
    **ERROR_RESPONSES,
}
INVOCATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **CHAT_RESPONSES,
    200: {**CHAT_RESPONSES[200],
          "model": ChatCompletionResponse | SessionOpened | SessionClosed,
          "description": "The answer (a fallback answer is marked in mangaassist.fallback), or "
                         "the session opened or closed (its id is also in the "
                         "X-Amzn-SageMaker-New-Session-Id / -Closed-Session-Id header)."},
}


def _param(loc: tuple[Any, ...]) -> str | None:
    # Without the body, /invocations' body kind and a tagged union's tag: not fields.
    parts = [part for part in loc if part != "body"]
    if parts and parts[0] in INVOCATION_TAGS:
        parts = parts[1:]
    parts = [part for index, part in enumerate(parts)
             if not (index > 0 and part in UNION_TAGS.get(parts[index - 1], ()))]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or None


def _shown(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validation_message(errors: list[Mapping[str, Any]]) -> tuple[str, str | None]:
    """Turn pydantic/FastAPI errors into one sentence naming the field, the value and the rule."""
    first = errors[0]
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    param = _param(loc)
    received = first.get("input")
    if kind == "json_invalid":
        position = loc[1] if len(loc) > 1 else 0
        return f"request body is not valid JSON (error at byte {position})", None
    if param is None:
        if kind == "missing":
            return "request body is required: a JSON object with `messages`", None
        if isinstance(received, bytes | bytearray | str):
            return ("request body must be JSON sent with Content-Type: application/json"), None
        return f"request body must be a JSON object, got {_shown(received)}", None
    if kind == "extra_forbidden":
        top_level = "." not in param and "[" not in param
        reason = refusal(param) if top_level else None
        if reason is not None:
            return f"{param}: not accepted by this gateway: {reason}", param
        return f"{param}: unknown or unsupported field (not accepted by this gateway)", param
    if kind == "missing":
        return f"{param}: field required", param
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if message.startswith(f"{param}:"):
        return message, param
    if message.startswith("[") and "]" in message:  # a validator naming an element: "[1].type:"
        where, _, rest = message.partition(":")
        return f"{param}{where}: {rest.strip()}", f"{param}{where}"
    extra = f" ({len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{param}: {message}; got {_shown(received)}{extra}", param


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with an OpenAI-style 413 (declared or streamed)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int,
                 on_reject: Callable[[Scope, int, str], None]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await self._refuse(scope, receive, send, 400,
                                   f"Content-Length {declared[:32]!r} is not a number")
                return
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, 413, self._too_large(size))
                return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # client went away before sending the body
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._refuse(scope, receive, send, 413, self._too_large(received, "+"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self, size: int, more: str = "") -> str:
        return (f"request body of {size}{more} bytes is larger than the {self.max_bytes} bytes "
                "accepted (GATEWAY_MAX_BODY_BYTES)")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int,
                      message: str) -> None:
        code = "request_too_large" if status == 413 else "invalid_content_length"
        self.on_reject(scope, status, message)
        response = JSONResponse(error_body(message, type_="invalid_request_error", code=code),
                                status_code=status, headers={"Connection": "close"})
        await response(scope, receive, send)


