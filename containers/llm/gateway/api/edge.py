"""The HTTP edge: request-validation messages, the body-size limit and the documented errors.

Nothing here may turn bad input into a 5xx: validation errors are 400 with one sentence naming the
field, the value and the rule; bodies over ``GATEWAY_MAX_BODY_BYTES`` are 413 before they are
read whole; the OpenAPI document lists every error answer with its shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import ApiError, RequestProblem
from gateway.api.errors import validation_problem as problem_of
from gateway.api.protocol import (
    INVOCATION_TAGS,
    STREAM_DESCRIPTION,
    UNION_TAGS,
    ChatCompletionResponse,
    ErrorResponse,
    SessionClosed,
    SessionOpened,
)

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


def validation_problem(errors: Sequence[Mapping[str, Any]]) -> RequestProblem:
    """Pydantic's errors for a request body as the 400 it gets (:mod:`gateway.api.errors`)."""
    return problem_of(errors, union_tags=UNION_TAGS, body_tags=INVOCATION_TAGS)


Refuse = Callable[[Scope, ApiError], Response]
"""Builds (and logs) the answer to a request refused before the app read it."""

DRAIN_FACTOR = 8
"""How much of an oversized body is read (and dropped) before its 413, in multiples of the
limit: a client still sending when the connection closes would get a reset instead of the 413."""
DRAIN_TIMEOUT_S = 10.0
"""How long draining an oversized body may take (a client that stalls gets the 413 then)."""
BODY_SCOPE_KEY = "gateway.body"
"""Where the middleware leaves the body it read, for an error that needs it (an unparsable one)."""
ARRIVED_SCOPE_KEY = "gateway.arrived"
"""When the request's headers reached the gateway's code (the middleware's clock): a request's
start for its latency, its deadline and admission's first-token time, so that the time it waited
to be read and parsed under a burst counts as the caller feels it."""
SCREENED_SCOPE_KEY = "gateway.screened_tokens"
"""The prompt tokens the arrival screen counted a request at when it let it through (absent:
not screened): admission keeps the screen's decision for a prompt up to twice that
(``gateway.admission.controller.SCREENED_SPREAD``)."""


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with an OpenAI-style 413 (declared or streamed).

    The 413 goes out after the body is drained — read and dropped, up to ``DRAIN_FACTOR`` times
    the limit, within ``DRAIN_TIMEOUT_S`` — so that the client, still sending, reads it instead
    of a connection reset; a client that asked ``Expect: 100-continue`` sent nothing yet and is
    answered at once. The connection closes after a 413 either way.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, refuse: Refuse,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.refuse = refuse
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[ARRIVED_SCOPE_KEY] = self.clock()
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        size = _declared_size(headers.get(b"content-length"))
        if size is not None and size > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":
                await self._drain(receive, 0)
            await self._refuse(scope, receive, send, self._too_large(size))
            return
        body = await self._read(scope, receive, send)
        if body is None:
            return
        scope[BODY_SCOPE_KEY] = body
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None when it was refused (413) or the client went away."""
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # client went away before sending the body
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                more = message.get("more_body", False)
                if more:
                    await self._drain(receive, received)
                await self._refuse(scope, receive, send,
                                   self._too_large(received, "+" if more else ""))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _drain(self, receive: Receive, already: int) -> None:
        """Read and drop the rest of the body, up to the drain bound."""
        limit = self.max_bytes * DRAIN_FACTOR

        async def drain() -> None:
            drained = already
            while drained <= limit:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drain(), DRAIN_TIMEOUT_S)

    def _too_large(self, size: int, more: str = "") -> str:
        return (f"request body of {size}{more} bytes is larger than the {self.max_bytes} bytes "
                "accepted (GATEWAY_MAX_BODY_BYTES)")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, message: str) -> None:
        response = self.refuse(scope, ApiError(413, message, code="request_too_large",
                                               headers={"Connection": "close"}))
        await response(scope, receive, send)


class Pass(Protocol):
    """A request the screen let through, counted by it until :meth:`release`."""

    tokens: float
    """The prompt tokens it was counted at (admission keeps the screen's decision for a prompt up
    to twice that)."""

    def release(self) -> None:
        """It is about to be sized (or it ended): no longer counted."""


Screen = Callable[[Scope, bytes], Response | Pass | None]
"""Looks at a request whose body was read but not parsed: the answer to send at once; a
:class:`Pass` (the request waits for its turn to start, :class:`StartGate`); or None (the app
reads it at once)."""


START_YIELD_MAX_S = 0.05
"""How long a screened-in request's start may yield to the screens of the arrivals behind it:
as long as a refusal may take to reach the client (issue 37's 50 ms), 2.5 % of the 2 s
first-token SLO."""


SETTLE_MAX_S = 0.5
"""How long the work a refusal leaves for after its answer (its log line) may wait for the burst
it came in to be screened and started (:meth:`StartGate.settled`): under an endless flood the
lines go out in batches this far apart, and a process killed outright loses at most this much
of them."""


class StartGate:
    """Lets the screened requests start — be parsed, validated, rendered and tokenized — one per
    event-loop iteration, in arrival order, and not while a burst is still being screened.

    A request's start is a few milliseconds of work that never yields the loop, and the loop
    runs every callback that is ready in turn: a burst's first arrivals, started together, held
    the later ones' screens behind all of their starts (the refusals of a burst of 152 waited
    72 / 124 ms p50 / p99 at the client, 0.6 ms of it in the gateway). Let through one at a
    time, each next one only in a later iteration, an arrival's screen waits for at most one
    start, and the arrivals and screens of each iteration run between the starts (a request
    let through waits for the ones ahead of it).

    One start per iteration still took the loop for about half of a burst of 512 on the H200's
    shape (64 starts of 0.7 ms among 448 refusals of 0.14 ms, arriving over 60 ms), so the
    refusals queued behind them (p99 75–126 ms at the client). A waiting request therefore
    starts only in an iteration after one in which no arrival was screened (:meth:`screened`),
    or once it has waited :data:`START_YIELD_MAX_S`: a burst's refusals go first, and its
    admitted requests start when it has been screened, at most that much later. Without a
    burst an iteration has no screen and nothing waits longer than before.

    What a refusal does after its answer (its log line) waits in :meth:`settled` for the
    screens and the starts (issue 37's thirteenth round).
    """

    def __init__(self, *, yield_max_s: float = START_YIELD_MAX_S,
                 settle_max_s: float = SETTLE_MAX_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.yield_max_s = yield_max_s
        self.settle_max_s = settle_max_s
        self.clock = clock
        self._waiting: deque[tuple[float, asyncio.Future[None]]] = deque()
        self._taken = False  # a start was let through in this iteration or the last
        self._released = False  # _next let a waiting request through (it starts next iteration)
        self._screened = False  # an arrival was screened since _next last ran
        self._settling: deque[tuple[float, asyncio.Future[None]]] = deque()
        self._screened_settle = False  # an arrival was screened since _settle last looked

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._waiting)

    def screened(self) -> None:
        """An arrival was screened (refused or let through) in this iteration: the waiting
        requests keep yielding to the arrivals for one more iteration."""
        self._screened = self._screened_settle = True

    async def settled(self) -> None:
        """Return once the arrivals are screened and the waiting requests started: in the
        iteration after one in which no arrival was screened and no request waited for its
        turn, or once it has waited :attr:`settle_max_s`. What a refusal does after its answer
        (its log line: about 40 us of the 140 a refusal held the event loop for in a burst of
        512 on the H200's shape) waits for it, after the refusals behind it and the starts.
        Without a burst it returns two iterations later (the first look still sees the
        refusal's own screen)."""
        loop = asyncio.get_running_loop()
        entry = (self.clock(), loop.create_future())
        if not self._settling:
            loop.call_soon(self._settle)
        self._settling.append(entry)
        await entry[1]

    def _settle(self) -> None:
        """The loop's next iteration: release the ones waiting in :meth:`settled` if it was
        quiet since the last look, else those that have waited their bound."""
        quiet = not self._screened_settle and not self._waiting
        self._screened_settle = False
        now = self.clock()
        while self._settling:
            since, future = self._settling[0]
            if not (quiet or future.done() or now - since >= self.settle_max_s):
                break
            self._settling.popleft()
            if not future.done():
                future.set_result(None)
        if self._settling:
            asyncio.get_running_loop().call_soon(self._settle)

    async def turn(self) -> None:
        """Return when it is this request's turn to start."""
        loop = asyncio.get_running_loop()
        if not self._taken and not self._waiting:
            self._taken = True
            loop.call_soon(self._next)
            return
        entry = (self.clock(), loop.create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._waiting.remove(entry)
            raise

    def _next(self) -> None:
        """The loop's next iteration: the next waiting request's turn — unless an arrival was
        screened since the last one and it has waited less than ``yield_max_s``, when it looks
        again in the iteration after — or, after an iteration in which none started, the gate
        opens (reopened in the iteration the last one starts in, an arrival screened after it
        would start in the same iteration)."""
        loop = asyncio.get_running_loop()
        screened, self._screened = self._screened, False
        while self._waiting:
            since, future = self._waiting[0]
            if future.done():
                self._waiting.popleft()
                continue
            if screened and self.clock() - since < self.yield_max_s:
                loop.call_soon(self._next)
                return
            self._waiting.popleft()
            future.set_result(None)
            self._released = True
            loop.call_soon(self._next)
            return
        if self._released:
            self._released = False
            loop.call_soon(self._next)
            return
        self._taken = False


class ArrivalScreen:
    """Answers a request before the app parses it when ``screen`` says so, and lets the ones it
    passes start one at a time (:class:`StartGate`).

    Sits inside :class:`BodyLimitMiddleware`, which has read the whole body (the client is not
    cut off mid-send) and left it in the scope: parsing, validating, rendering and tokenizing
    the body are the expensive part of a request the gateway is going to refuse anyway, and
    under a burst they hold the event loop that the admitted requests need
    (docs/design-decisions.md#surge-admission). An answer's background task (a refusal's log
    line) runs after the answer, once the burst is screened and started
    (:meth:`StartGate.settled`).
    """

    def __init__(self, app: ASGIApp, *, screen: Screen) -> None:
        self.app = app
        self.screen = screen
        self.gate = StartGate()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = scope.get(BODY_SCOPE_KEY) if scope["type"] == "http" else None
        decided = self.screen(scope, body) if isinstance(body, bytes) else None
        if decided is not None:
            self.gate.screened()
        if isinstance(decided, Response):
            after, decided.background = decided.background, None
            await decided(scope, receive, send)
            if after is not None:  # after the burst's other screens and starts
                await self.gate.settled()
                await after()
            return
        if decided is not None:
            try:
                await self.gate.turn()
            finally:
                decided.release()
            scope[SCREENED_SCOPE_KEY] = decided.tokens
        await self.app(scope, receive, send)


def _declared_size(value: bytes | None) -> int | None:
    """The Content-Length header's value (uvicorn's parser, h11, has refused a malformed one
    with its own 400 before the app runs; anything else here reads as undeclared)."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def publish_limits(schema: dict[str, Any], *, served_names: Sequence[str], max_n: int,
                   max_messages: int, max_output_tokens: int) -> None:
    """Write this instance's limits into the OpenAPI ``schema`` (in place), so that it states
    exactly what the gateway accepts: the served model names (404 for any other), ``n`` up to
    ``GATEWAY_MAX_N`` and ``ENGINE_MAX_NUM_SEQS``, at most ``GATEWAY_MAX_MESSAGES`` messages (and
    pins below it),
    output limits below the context window, and :data:`CROSS_FIELD_RULES`. (What JSON Schema
    cannot state — ``min_tokens`` at most ``max_tokens``, pins within the conversation, a
    conversation that fits — docs/gateway.md lists.)"""
    request = schema["components"]["schemas"]["ChatCompletionRequest"]
    properties = request["properties"]
    properties["model"]["anyOf"] = [{"type": "string", "enum": [*served_names, "auto"]},
                                    {"type": "null"}]
    _bound(properties["n"], max_n)
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        _bound(properties[name], max_output_tokens)
    properties["messages"]["maxItems"] = max_messages
    pins = schema["components"]["schemas"]["MangaAssistExtension"]["properties"]["pinned_messages"]
    _bound(pins["items"], max_messages - 1)
    request["allOf"] = [_when(field, rule) for field, rule in CROSS_FIELD_RULES]


CROSS_FIELD_RULES: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    # top_logprobs above 0 needs logprobs: true (OpenAI's and vLLM's rule)
    ({"top_logprobs": {"type": "integer", "minimum": 1}}, {"logprobs": {"const": True}}),
    # several choices need sampling: not greedy (vLLM's SamplingParams refuses n > 1 at 0)
    ({"n": {"type": "integer", "minimum": 2}},
     {"temperature": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]}}),
    # one output limit: max_completion_tokens (OpenAI's name now) or max_tokens
    ({"max_tokens": {"type": "integer"}}, {"max_completion_tokens": {"type": "null"}}),
)
"""What one field requires of another, as JSON Schema ``if``/``then`` pairs: (when this field has
this value, that field must be so). The gateway refuses a request breaking one with a 400."""


def _when(condition: dict[str, Any], requirement: dict[str, Any]) -> dict[str, Any]:
    """``if`` every field of ``condition`` is present and matches, ``then`` ``requirement``
    (a ``const`` requirement also makes its field required)."""
    required = [name for name, rule in requirement.items() if "const" in rule]
    then: dict[str, Any] = {"properties": requirement}
    if required:
        then["required"] = required
    return {"if": {"properties": condition, "required": list(condition)}, "then": then}


def _bound(field: dict[str, Any], maximum: int) -> None:
    """Set the integer branch's maximum of an optional integer field."""
    for branch in field.get("anyOf", [field]):
        if branch.get("type") == "integer":
            branch["maximum"] = min(maximum, branch.get("maximum", maximum))
