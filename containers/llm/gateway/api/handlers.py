"""The routes' work: what each HTTP request of the gateway is answered, and its one log line.

A route (:mod:`gateway.api.routes`) hands its request here; :class:`Handlers` asks the serving
handler (:class:`~gateway.api.serving.ChatService`) for the decision and picks the answer's shape
(:mod:`gateway.api.responses`): a completion, a stream, a session document or an OpenAI-style
error. Requests refused before the chat handler ran (validation, unknown path, body size, the
arrival screen) are answered by :meth:`Handlers.refuse` and :meth:`Handlers.screen`.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Scope

import metrics_contract as mc
from gateway.admission import ScreenPass
from gateway.api.chat_run import ChatRun
from gateway.api.edge import ARRIVED_SCOPE_KEY, SCREENED_SCOPE_KEY
from gateway.api.errors import ApiError
from gateway.api.protocol import (
    ChatCompletionRequest,
    SessionClosed,
    SessionOpened,
    SessionReport,
    SessionRequest,
)
from gateway.api.responses import STREAM_HEADERS, completion, error_response, headers, sse
from gateway.api.serving import ChatService
from gateway.engines.base import SupportsFaultInjection
from gateway.health import EnginePhase
from gateway.lifecycle import GatewayLifecycle
from gateway.routing import AdapterRouter
from gateway.sessions import (
    CLOSED_SESSION_ID_HEADER,
    NEW_SESSION,
    NEW_SESSION_ID_HEADER,
    SESSION_ID_HEADER,
    SESSION_ID_PATTERN,
    SessionState,
    SessionTable,
    is_session_id,
)
from gateway.settings import Settings
from gateway.supervisor import EngineSupervisor
from gateway.telemetry import RequestRecord, Telemetry
from gateway.warmup import WARMUP_HEADER

JSON_MEDIA_TYPE = "application/json"
CHAT_PATHS = frozenset({"/invocations", "/v1/chat/completions"})
"""The paths a chat request arrives on (/invocations also takes session requests)."""
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
"""A streamed request, as far as the request line of one refused unparsed needs to know."""
WARMUP_HEADER_BYTES = WARMUP_HEADER.encode("latin-1")


class Handlers:
    """The work of the gateway's routes, over the runtime's parts (:mod:`gateway.app`)."""

    def __init__(self, settings: Settings, *, service: ChatService, lifecycle: GatewayLifecycle,
                 supervisor: EngineSupervisor, router: AdapterRouter, sessions: SessionTable,
                 telemetry: Telemetry, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.service = service
        self.lifecycle = lifecycle
        self.supervisor = supervisor
        self.router = router
        self.sessions = sessions
        self.telemetry = telemetry
        self.clock = clock
        self.started_at = int(time.time())
        self.start_cache = "none"
        """/ping's ``start_cache``: what ``serve`` did with the GPU start cache."""

    def ping(self) -> JSONResponse:
        """GET /ping, from state only (never waits on the engine)."""
        answer, body = self.lifecycle.ping()
        body["start_cache"] = self.start_cache
        return JSONResponse(body, status_code=answer.http_status)

    async def chat(self, request: Request, body: ChatCompletionRequest) -> Response:
        """POST /invocations and /v1/chat/completions."""
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}",
                               path=request.scope["path"],
                               started=request.scope.get(ARRIVED_SCOPE_KEY, self.clock()),
                               stream=bool(body.stream))
        record.warmup = request.headers.get(WARMUP_HEADER) == self.lifecycle.warmup_token
        record.screened_tokens = request.scope.get(SCREENED_SCOPE_KEY)
        session_headers = self._session_of(request, record)
        try:
            run = await self.service.start(body, record)
            self._report_session(run, record)
            if body.stream:
                return StreamingResponse(sse(run, on_done=self.telemetry.request),
                                         media_type="text/event-stream",
                                         headers={**headers(run.early_finish), **STREAM_HEADERS,
                                                  **session_headers})
            answer = await run.collect()
        except ApiError as error:
            return self.error_response(record, error, extra_headers=session_headers)
        response = completion(run, answer)
        self.telemetry.request(record)
        return Response(response.model_dump_json(), media_type=JSON_MEDIA_TYPE,
                        headers={**headers(answer.finish), **session_headers})

    # --- SageMaker stateful sessions (gateway.sessions) ---
    def _session_of(self, request: Request, record: RequestRecord) -> dict[str, str]:
        """Read the request's session header into ``record``; a ``NEW_SESSION`` value opens
        one (its id goes back in the response header). Never refuses: a session is a hint."""
        value = request.headers.get(SESSION_ID_HEADER)
        if value is None:
            return {}
        if value == NEW_SESSION:
            session = self.sessions.open()
            record.session_id, record.session_state = session.session_id, SessionState.OPENED
            self._session_opened(session.session_id)
            return {NEW_SESSION_ID_HEADER: session.new_session_header()}
        state = self.sessions.state(value) if is_session_id(value) else SessionState.UNKNOWN
        record.session_id, record.session_state = value[:256], state
        return {}

    @staticmethod
    def _report_session(run: ChatRun, record: RequestRecord) -> None:
        if record.session_id is not None and record.session_state is not None:
            prepared = run.prepared
            prepared.extension = prepared.extension.model_copy(update={
                "session": SessionReport(id=record.session_id, state=record.session_state)})

    def _session_opened(self, session_id: str) -> None:
        self.telemetry.emit({mc.SESSIONS_OPENED: 1}, event="session_opened",
                            session_id=session_id, open_sessions=len(self.sessions))

    def session_request(self, request: Request, body: SessionRequest) -> JSONResponse:
        """POST /invocations with ``{"requestType": "NEW_SESSION" | "CLOSE"}``."""
        if body.requestType == "NEW_SESSION":
            session = self.sessions.open()
            self._session_opened(session.session_id)
            return JSONResponse(SessionOpened(session_id=session.session_id,
                                              expires_at=session.expires_iso).model_dump(),
                                headers={NEW_SESSION_ID_HEADER: session.new_session_header()})
        value = request.headers.get(SESSION_ID_HEADER)
        if value is None or not is_session_id(value):
            shown = "no header" if value is None else repr(value[:80])
            return self.client_error(
                request.url.path, 400,
                f"{SESSION_ID_HEADER}: {shown}; closing a session needs its id there "
                f"(InvokeEndpoint SessionId), matching {SESSION_ID_PATTERN.pattern}",
                param=SESSION_ID_HEADER, code="invalid_session_id")
        was_open = self.sessions.close(value)
        self.telemetry.log("session_closed", session_id=value, was_open=was_open,
                           open_sessions=len(self.sessions))
        return JSONResponse(SessionClosed(session_id=value, was_open=was_open).model_dump(),
                            headers={CLOSED_SESSION_ID_HEADER: value})

    def error_response(self, record: RequestRecord, error: ApiError,
                       extra_headers: dict[str, str] | None = None) -> JSONResponse:
        """The OpenAI-style error for ``error``, logged as the request's one line."""
        response = error_response(record, error, extra_headers)
        self.telemetry.request(record)
        return response

    def client_error(self, path: str, status: int, message: str, *, param: str | None = None,
                     code: str | None = None) -> JSONResponse:
        """An error raised before the chat handler ran (a session request without its id)."""
        return self.refuse({"path": path}, ApiError(status, message, param=param, code=code))

    def refuse(self, scope: Scope, error: ApiError) -> JSONResponse:
        """The answer to a request refused before (or instead of) the chat handler: validation,
        unknown path, body size, an unexpected failure — logged as the request's one line."""
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}",
                               path=str(scope.get("path", "")), started=self.clock())
        return self.error_response(record, error)

    def screen(self, scope: Scope, body: bytes) -> Response | ScreenPass | None:
        """A chat request's answer before it is parsed, if it gets one
        (:meth:`ChatService.screen`), its one line written by the response's background task
        (after the answer, once the burst is screened: :class:`~gateway.api.edge.
        ArrivalScreen`); the valve's pass for a chat request it lets through (it starts in its
        turn, :class:`~gateway.api.edge.StartGate`); None for anything else (sessions, other
        paths, warmup), which the app reads at once. The request line is built only for a
        request answered here."""
        if scope["path"] not in CHAT_PATHS or b'"messages"' not in body:
            return None
        token = self.lifecycle.warmup_token.encode("latin-1")
        warmup = any(name == WARMUP_HEADER_BYTES and value == token
                     for name, value in scope.get("headers") or ())
        screened = self.service.screen(warmup=warmup)
        if screened is None or isinstance(screened, ScreenPass):
            return screened
        error, while_idle = screened
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}", path=scope["path"],
                               started=scope.get(ARRIVED_SCOPE_KEY, self.clock()),
                               stream=STREAM_TRUE.search(body) is not None)
        record.queue_wait_s = 0.0
        record.refused_while_idle = while_idle
        response = error_response(record, error)
        # its line is written after the answer, once the burst it came in is screened
        # (gateway.api.edge.ArrivalScreen); its latency ends now
        response.background = BackgroundTask(self._log_request, record,
                                             self.telemetry.monotonic())
        return response

    async def _log_request(self, record: RequestRecord, ended: float) -> None:
        """The request's line, written after its answer (a coroutine: Starlette would run a
        plain function in its thread pool)."""
        self.telemetry.request(record, ended=ended)

    def inject_oom(self) -> JSONResponse:
        """Kill the running engine with a simulated OOM (GATEWAY_TEST_MODE only)."""
        engine = self.supervisor.engine
        if engine is None or self.supervisor.phase is not EnginePhase.READY:
            return self.client_error("/admin/engine/oom", 409, "no running engine to inject into",
                                     code="engine_not_ready")
        if not isinstance(engine, SupportsFaultInjection):
            return self.client_error("/admin/engine/oom", 409, f"engine {engine.name!r} does not "
                                     "support fault injection", code="not_supported")
        engine.inject_oom("injected through /admin/engine/oom")
        self.telemetry.log("oom_injected", engine_generation=self.supervisor.generation)
        return JSONResponse({"injected": True, "engine_generation": self.supervisor.generation})

    def model_list(self) -> dict[str, Any]:
        """GET /v1/models: the base model and the served LoRA adapters."""
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.started_at,
             "owned_by": "mangaassist"} for name in self.router.served_names()]}
