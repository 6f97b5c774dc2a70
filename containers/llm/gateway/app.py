"""The FastAPI application: SageMaker's /ping and /invocations, OpenAI's /v1/chat/completions.

:class:`GatewayRuntime` wires one process's parts together — the request path
(:class:`~gateway.service.ChatService`), the engine supervisor and what happens on its events
(:class:`~gateway.engine_events.EngineEvents`), the process lifecycle (engine start, warmup,
gauges, /ping: :class:`~gateway.lifecycle.GatewayLifecycle`) — and builds the HTTP app over them.
A route only chooses between the answer's two shapes (:mod:`gateway.responses`): every decision
is the service's, every outcome an OpenAI shape. Bad input never becomes a 5xx (400 naming the
field, 404, 413, 429/503 with Retry-After; an engine failure is a 200 fallback answer).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

import metrics_contract as mc
from gateway import __version__
from gateway.admission import AdmissionController, AdmissionLedger
from gateway.api_schema import (
    ChatCompletionRequest,
    InvocationBody,
    ModelList,
    PingResponse,
    SessionClosed,
    SessionOpened,
    SessionReport,
    SessionRequest,
)
from gateway.breaker import BreakerPolicy, CircuitBreaker
from gateway.chat_types import ApiError, ChatRun
from gateway.engine_events import EngineEvents, breaker_transition_publisher
from gateway.engines.base import InferenceEngine, SupportsFaultInjection
from gateway.health import CrashLoopDetector, EnginePhase, RestartPolicy
from gateway.http_edge import (
    ARRIVED_SCOPE_KEY,
    BODY_SCOPE_KEY,
    CHAT_RESPONSES,
    INVOCATION_RESPONSES,
    ArrivalScreen,
    BodyLimitMiddleware,
    publish_limits,
    validation_problem,
)
from gateway.lifecycle import FatalCallback, GatewayLifecycle, ProcessFailure
from gateway.request_errors import unparsable_body
from gateway.responses import STREAM_HEADERS, completion, error_response, headers, sse
from gateway.routing import AdapterRouter
from gateway.service import ChatService
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
from gateway.tokenizer import ChatTokenizer
from gateway.warmup import WARMUP_HEADER

JSON_MEDIA_TYPE = "application/json"
CHAT_PATHS = frozenset({"/invocations", "/v1/chat/completions"})
"""The paths a chat request arrives on (/invocations also takes session requests)."""
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
WARMUP_HEADER_BYTES = WARMUP_HEADER.encode("latin-1")
"""A streamed request, as far as the request line of one refused unparsed needs to know."""


class GatewayRuntime:
    """One gateway process's parts, wired together; ``app`` is its FastAPI application."""

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizer: ChatTokenizer,
        engine_factory: Callable[[], InferenceEngine],
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
        on_fatal: FatalCallback | None = None,
        watch_interval_s: float = 0.2,
    ) -> None:
        # Built in dependency order: each part gets what it calls at construction.
        gateway = settings.gateway
        self.settings = settings
        self.tokenizer = tokenizer
        self.telemetry = telemetry
        self.clock = clock
        self.started_at = int(time.time())
        self.crash_loop = CrashLoopDetector(deaths=gateway.crash_loop_deaths,
                                            window_s=gateway.crash_loop_window_s)
        self.admission = AdmissionController(
            AdmissionLedger.awaiting_engine(settings.engine.block_size,
                                            watermark=gateway.admission_watermark,
                                            bucket_caps=gateway.buckets.caps),
            ttft_slo_s=gateway.ttft_slo_s, max_running=settings.engine.max_num_seqs,
            clock=clock, step_tokens=settings.engine.max_num_batched_tokens,
        )
        self.breaker = CircuitBreaker(
            BreakerPolicy(open_s=gateway.breaker_open_s,
                          close_after_successes=gateway.breaker_close_after_successes,
                          half_open_max_inflight=gateway.breaker_half_open_max_inflight,
                          context_factor=gateway.breaker_context_factor),
            on_transition=breaker_transition_publisher(telemetry, self.admission),
        )
        self.failure = ProcessFailure(telemetry, on_fatal)
        self.events = EngineEvents(settings, admission=self.admission, breaker=self.breaker,
                                   tokenizer=tokenizer, crash_loop=self.crash_loop,
                                   telemetry=telemetry, clock=clock, on_fatal=self.failure.fatal)
        self.supervisor = EngineSupervisor(
            engine_factory,
            restart=RestartPolicy(max_attempts=gateway.engine_restart_max_attempts,
                                  backoff_s=gateway.engine_restart_backoff_s,
                                  backoff_max_s=gateway.engine_restart_backoff_max_s),
            crash_loop=self.crash_loop, on_death=self.events.on_death,
            on_ready=self.events.on_ready, log=telemetry.log, clock=clock,
            watch_interval_s=watch_interval_s,
        )
        self.router = AdapterRouter(
            served_model_name=gateway.served_model_name, adapters=gateway.adapters,
            adapters_dir=gateway.adapters_dir, routing_table=gateway.routing_table,
            locale_routes=gateway.locale_routes,
        )
        self.sessions = SessionTable(ttl_s=gateway.session_ttl_s,
                                     max_sessions=gateway.session_max)
        self.service = ChatService(settings, tokenizer=tokenizer, router=self.router,
                                   admission=self.admission, breaker=self.breaker,
                                   supervisor=self.supervisor, telemetry=telemetry, clock=clock)
        self.lifecycle = GatewayLifecycle(
            settings, supervisor=self.supervisor, breaker=self.breaker,
            crash_loop=self.crash_loop, admission=self.admission, tokenizer=tokenizer,
            events=self.events, telemetry=telemetry, clock=clock,
            served_names=self.router.served_names(), failure=self.failure)
        self.start_cache = "none"
        """/ping's ``start_cache``: what ``serve`` did with the GPU start cache."""
        self.app = build_app(self)

    # --- the routes' work ---
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

    def screen(self, scope: Scope, body: bytes) -> Response | None:
        """A chat request's answer before it is parsed, if it gets one
        (:meth:`ChatService.screen`), logged as the request's one line; None for anything else
        (sessions, other paths), which the app reads as usual. The request line is built only
        for a request answered here."""
        if scope["path"] not in CHAT_PATHS or b'"messages"' not in body:
            return None
        token = self.lifecycle.warmup_token.encode("latin-1")
        warmup = any(name == WARMUP_HEADER_BYTES and value == token
                     for name, value in scope.get("headers") or ())
        screened = self.service.screen(warmup=warmup)
        if screened is None:
            return None
        error, while_idle = screened
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}", path=scope["path"],
                               started=scope.get(ARRIVED_SCOPE_KEY, self.clock()),
                               stream=STREAM_TRUE.search(body) is not None)
        record.queue_wait_s = 0.0
        record.refused_while_idle = while_idle
        return self.error_response(record, error)

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


def build_app(runtime: GatewayRuntime) -> FastAPI:
    """The FastAPI app: routes, error handlers, the body limit and the OpenAPI document."""
    app = FastAPI(
        title="MangaAssist LLM gateway",
        version=__version__,
        description=(
            "OpenAI-compatible chat completions for the MangaAssist GPU tier: adapter routing, "
            "sliding-window context budget, KV-aware admission and an OOM circuit breaker in "
            "front of the inference engine. Extension fields live in the `mangaassist` object."),
        lifespan=runtime.lifecycle.lifespan,
    )
    _add_error_handlers(app, runtime)
    _add_routes(app, runtime)
    app.openapi = _openapi_document(app, runtime)  # type: ignore[method-assign]
    _add_body_limit(app, runtime)
    app.state.runtime = runtime
    return app


def _add_error_handlers(app: FastAPI, runtime: GatewayRuntime) -> None:
    """Validation errors are 400 naming the field, unknown paths 404/405, anything unexpected a
    500 that says the request was not processed: each one OpenAI-shaped, built in one place
    (:func:`gateway.responses.error_response`) and logged as the request's line."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problem = validation_problem(list(exc.errors()))
        return runtime.refuse(request.scope, ApiError.bad_request(problem))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(request.scope.get(BODY_SCOPE_KEY), bytes):
            # FastAPI's "error parsing the body": not UTF-8, or nested beyond the parser.
            problem = unparsable_body(request.scope[BODY_SCOPE_KEY])
            return runtime.refuse(request.scope, ApiError.bad_request(problem))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        error = ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {}))
        return runtime.refuse(request.scope, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        runtime.telemetry.log("unhandled_error", level="error", path=request.url.path,
                              error=repr(exc)[:500])
        return runtime.refuse(request.scope, ApiError(
            500, "internal error in the gateway; the request was not processed",
            type_="server_error", code="internal_error"))


def _add_routes(app: FastAPI, runtime: GatewayRuntime) -> None:
    """SageMaker's /ping and /invocations, OpenAI's chat completions and model list, and in
    test mode the OOM injection."""

    @app.get("/ping", response_model=PingResponse, tags=["health"],
             responses={503: {"model": PingResponse,
                              "description": "Warming up, crash loop, failed or draining."}})
    async def ping() -> JSONResponse:
        """SageMaker health check: answers from state in well under 2 s."""
        return runtime.ping()

    @app.post("/invocations", tags=["chat"], responses=INVOCATION_RESPONSES, response_model=None,
              summary="SageMaker invoke: OpenAI chat completion, or a stateful-session request")
    async def invocations(request: Request, body: InvocationBody) -> Response:
        """A chat completion (as /v1/chat/completions), or ``{"requestType": "NEW_SESSION"}`` /
        ``{"requestType": "CLOSE"}`` (SageMaker stateful sessions: the id travels in the
        X-Amzn-SageMaker-Session-Id / -New-Session-Id / -Closed-Session-Id headers)."""
        if isinstance(body, SessionRequest):
            return runtime.session_request(request, body)
        return await runtime.chat(request, body)

    @app.post("/v1/chat/completions", tags=["chat"], responses=CHAT_RESPONSES,
              response_model=None, summary="OpenAI chat completion")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        return await runtime.chat(request, body)

    @app.get("/v1/models", response_model=ModelList, tags=["chat"])
    async def models() -> dict[str, Any]:
        """The base model and the served LoRA adapters."""
        return runtime.model_list()

    if runtime.settings.gateway.test_mode:
        @app.post("/admin/engine/oom", include_in_schema=False)
        async def inject_oom() -> JSONResponse:
            return runtime.inject_oom()


def _openapi_document(app: FastAPI, runtime: GatewayRuntime) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's document without the 422s (we answer 400) and with this
    instance's limits (:func:`gateway.http_edge.publish_limits`), built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    operation.get("responses", {}).pop("422", None)  # we answer 400
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            settings = runtime.settings
            publish_limits(schema, served_names=runtime.router.served_names(),
                           max_n=min(settings.gateway.max_n, settings.engine.max_num_seqs),
                           max_messages=settings.gateway.max_messages,
                           max_output_tokens=settings.engine.max_model_len - 1)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def _add_body_limit(app: FastAPI, runtime: GatewayRuntime) -> None:
    """Bodies over GATEWAY_MAX_BODY_BYTES are 413 before they are read (logged as the request);
    inside that, the arrival screen answers what admission refuses before it is parsed."""
    app.add_middleware(ArrivalScreen, screen=runtime.screen)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.gateway.max_body_bytes,
                       refuse=runtime.refuse, clock=runtime.clock)


def create_app(
    settings: Settings,
    *,
    tokenizer: ChatTokenizer,
    engine_factory: Callable[[], InferenceEngine],
    telemetry: Telemetry | None = None,
    on_fatal: FatalCallback | None = None,
) -> FastAPI:
    """Build the gateway app (the runtime is at ``app.state.runtime``)."""
    runtime = GatewayRuntime(
        settings, tokenizer=tokenizer, engine_factory=engine_factory,
        telemetry=telemetry or Telemetry(endpoint_name=settings.gateway.metrics_endpoint_name,
                                         variant_name=settings.gateway.metrics_variant_name),
        on_fatal=on_fatal,
    )
    return runtime.app
