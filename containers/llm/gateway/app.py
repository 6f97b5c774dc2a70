"""The FastAPI application: SageMaker's /ping and /invocations, OpenAI's /v1/chat/completions.

A thin shell over :mod:`gateway.service`: it parses HTTP, turns every outcome into an OpenAI
shape (JSON, Server-Sent Events, or an error object naming the field) and owns the process-level
pieces: the engine supervisor, the circuit breaker, warmup and the periodic gauge line.

Nothing here may turn bad input into a 5xx: validation errors are 400, oversized bodies 413,
unknown models 404, shedding 429/503 with Retry-After, and an engine failure is a 200 fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import metrics_contract as mc
from gateway import __version__
from gateway.admission import AdmissionController, AdmissionLedger, blocks_for_tokens
from gateway.api_schema import (
    STREAM_DESCRIPTION,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    ModelList,
    PingResponse,
    error_body,
)
from gateway.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from gateway.engines.base import (
    EngineDead,
    EngineOutOfMemory,
    InferenceEngine,
    KvCapacity,
    SupportsAdapterStatus,
    SupportsChatRendering,
    SupportsFaultInjection,
)
from gateway.health import CrashLoopDetector, EnginePhase, RestartPolicy, ping_answer
from gateway.rendering import PromptRendering, apply_rendering, check_rendering
from gateway.routing import AdapterRouter
from gateway.service import (
    ApiError,
    ChatService,
    FinishEvent,
    PreparedChat,
    TextEvent,
)
from gateway.settings import Settings
from gateway.supervisor import EngineStartFailed, EngineSupervisor
from gateway.telemetry import RequestRecord, Telemetry
from gateway.tokenizer import ChatTokenizer
from gateway.warmup import WARMUP_HEADER, run_warmup
from gpu_budget import compare_engine_report

JSON_MEDIA_TYPE = "application/json"
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
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
_CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ChatCompletionResponse,
          "description": "The answer (a fallback answer is marked in mangaassist.fallback).",
          # OpenAPI 3.1: for text/event-stream the schema describes one event.
          "content": {"text/event-stream": {"schema": {
              "type": "object", "description": STREAM_DESCRIPTION, "required": ["data"],
              "properties": {"data": {"type": "string",
                                      "description": "a chat.completion.chunk as JSON, or "
                                                     "[DONE]"},
                             "event": {"type": "string"}}}}}},
    **_ERROR_RESPONSES,
}


def _dumps(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [part for part in loc if part != "body"]
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
        return f"{param}: unknown or unsupported field (not accepted by this gateway)", param
    if kind == "missing":
        return f"{param}: field required", param
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if message.startswith(f"{param}:"):
        return message, param
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


class GatewayRuntime:
    """Everything one gateway process holds; builds the FastAPI app (see :func:`create_app`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizer: ChatTokenizer,
        engine_factory: Callable[[], InferenceEngine],
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
        on_fatal: Callable[[str, bool], None] | None = None,
        watch_interval_s: float = 0.2,
    ) -> None:
        gateway = settings.gateway
        self.settings = settings
        self.tokenizer = tokenizer
        self.telemetry = telemetry
        self.clock = clock
        self.on_fatal = on_fatal
        self.started_at = int(time.time())
        self.breaker = CircuitBreaker(
            BreakerPolicy(open_s=gateway.breaker_open_s,
                          close_after_successes=gateway.breaker_close_after_successes,
                          half_open_max_inflight=gateway.breaker_half_open_max_inflight,
                          context_factor=gateway.breaker_context_factor),
            on_transition=self._on_breaker_transition,
        )
        self.crash_loop = CrashLoopDetector(deaths=gateway.crash_loop_deaths,
                                            window_s=gateway.crash_loop_window_s)
        self.supervisor = EngineSupervisor(
            engine_factory,
            restart=RestartPolicy(max_attempts=gateway.engine_restart_max_attempts,
                                  backoff_s=gateway.engine_restart_backoff_s,
                                  backoff_max_s=gateway.engine_restart_backoff_max_s),
            crash_loop=self.crash_loop,
            on_death=self._on_engine_death,
            on_ready=self._on_engine_ready,
            log=telemetry.log,
            clock=clock,
            watch_interval_s=watch_interval_s,
        )
        # Sized from the engine's real pool once it has started (_on_engine_ready).
        self.admission = AdmissionController(
            AdmissionLedger(KvCapacity(num_blocks=1, block_size=settings.engine.block_size),
                            watermark=gateway.admission_watermark,
                            bucket_caps=gateway.buckets.caps),
            clock=clock,
        )
        self.router = AdapterRouter(
            served_model_name=gateway.served_model_name, adapters=gateway.adapters,
            adapters_dir=gateway.adapters_dir, routing_table=gateway.routing_table,
            locale_routes=gateway.locale_routes,
        )
        self.service = ChatService(settings, tokenizer=tokenizer, router=self.router,
                                   admission=self.admission, breaker=self.breaker,
                                   supervisor=self.supervisor, telemetry=telemetry, clock=clock)
        self.warmup_token = secrets.token_hex(16)
        self.warmed_up = False
        self.warmup_progress = "not started"
        self.draining = False
        self.failure_reason: str | None = None
        initial = (PromptRendering.ASSEMBLED if tokenizer.segmented
                   else PromptRendering.WHOLE_TEXT)
        self.rendering: dict[str, Any] = {
            "mode": initial.value, "verified": False,
            "detail": "not yet checked against the engine tokenizer"}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_preemptions: tuple[int, int] = (-1, 0)
        self.app = self._build_app()

    # --- engine and breaker events ---
    def _on_engine_ready(self, generation: int, engine: InferenceEngine) -> None:
        capacity = engine.kv_capacity()
        max_model_len = self.settings.engine.max_model_len
        ledger = self.admission.ledger
        ledger.set_capacity(capacity)
        needed = blocks_for_tokens(max_model_len, capacity.block_size)
        self.telemetry.log(
            "engine_ready", engine=engine.name, engine_generation=generation,
            kv_blocks=capacity.num_blocks, block_size=capacity.block_size,
            kv_tokens=capacity.num_tokens, admission_limit_blocks=ledger.limit_blocks,
            max_concurrency_at_max_model_len=round(capacity.num_tokens / max_model_len, 2),
        )
        expected = self.settings.gateway.expected_kv_tokens
        if expected is not None:
            # The GPU budget's prediction vs what the engine really got (vLLM's profile run):
            # admission always uses the engine's figure; a gap beyond the budget's tolerance
            # means the plan's constants need another look on this GPU.
            report = compare_engine_report(expected, capacity.num_blocks, capacity.block_size)
            self.telemetry.log(
                "kv_capacity_vs_plan", level="info" if report.within_tolerance else "warning",
                planned_kv_tokens=report.planned_kv_tokens,
                engine_kv_tokens=report.engine_kv_tokens,
                relative_difference=round(report.relative_difference, 4),
                message=report.message,
            )
        self._check_chat_rendering(engine)
        if needed > ledger.limit_blocks:
            self._fatal(
                f"KV capacity check failed: the engine has {capacity.num_blocks} blocks of "
                f"{capacity.block_size} tokens; with GATEWAY_ADMISSION_WATERMARK="
                f"{ledger.watermark:g} admission may use {ledger.limit_blocks}, fewer than the "
                f"{needed} one ENGINE_MAX_MODEL_LEN={max_model_len} request needs; lower "
                "ENGINE_MAX_MODEL_LEN or give the engine more KV memory"
            )
        if generation > 0:
            self.telemetry.emit({mc.ENGINE_RESTARTS: 1}, event="engine_restarted",
                                engine_generation=generation,
                                restarts=self.supervisor.restarts)
        self.admission.notify()

    def _on_engine_death(self, generation: int, error: EngineDead) -> None:
        cause = "out_of_memory" if isinstance(error, EngineOutOfMemory) else "engine_dead"
        self.breaker.record_trip(self.clock(), why=f"{cause}: {error}")
        self.telemetry.emit({mc.OOM_CIRCUIT_TRIPS: 1}, event="engine_death", level="error",
                            cause=cause, engine_generation=generation, error=str(error)[:500],
                            deaths_in_window=self.crash_loop.deaths_in_window(self.clock()))
        self.admission.notify()

    def _on_breaker_transition(self, old: BreakerState, new: BreakerState, why: str) -> None:
        self.telemetry.emit({mc.BREAKER_STATE: new.metric_value}, event="breaker_transition",
                            from_state=old.value, to_state=new.value, why=why[:300])
        self.admission.notify()  # the half-open probe limit may have changed

    def _fatal(self, reason: str, *, config_error: bool = False) -> None:
        self.failure_reason = reason
        self.telemetry.log("fatal", level="error", reason=reason, config_error=config_error)
        if self.on_fatal is not None:
            self.on_fatal(reason, config_error)

    # --- lifecycle ---
    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        """Start the engine and warmup in the background (/ping answers meanwhile)."""
        self.telemetry.log("gateway_starting", version=__version__,
                           engine=self.settings.gateway.engine,
                           max_model_len=self.settings.engine.max_model_len,
                           tokenizer_template=self.tokenizer.template_source,
                           tokenizer_segmented=self.tokenizer.segmented,
                           template_overhead=dict(self.tokenizer.overhead.per_message_tokens),
                           test_mode=self.settings.gateway.test_mode)
        self._spawn(self._startup(), "gateway-startup")
        self._spawn(self._gauges(), "gateway-gauges")
        try:
            yield
        finally:
            self.draining = True
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.supervisor.close()
            self.telemetry.log("gateway_stopped")

    async def _startup(self) -> None:
        try:
            await self.supervisor.start()
        except EngineStartFailed as error:
            self._fatal(str(error), config_error=error.config_error is not None)
            return
        if self.failure_reason is not None:
            return
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmup",
                                     timeout=self.settings.gateway.request_deadline_s) as client:
            deadline = self.clock() + self.settings.gateway.warmup_timeout_s
            while not self.warmed_up and not self.draining:
                ok = await run_warmup(client, self, progress=self._set_warmup_progress)
                if ok:
                    self.warmed_up = True
                    self.telemetry.log("warmup_complete", progress=self.warmup_progress)
                    return
                if self.supervisor.phase is EnginePhase.FAILED:
                    return
                if self.clock() >= deadline:
                    self._fatal(
                        f"warmup did not succeed within GATEWAY_WARMUP_TIMEOUT_S="
                        f"{self.settings.gateway.warmup_timeout_s:g} s (last: "
                        f"{self.warmup_progress}); see the warmup_failed log lines"
                    )
                    return
                await asyncio.sleep(0.5)

    def _set_warmup_progress(self, text: str) -> None:
        self.warmup_progress = text

    async def _gauges(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gateway.metrics_interval_s)
            self.emit_gauges()

    def emit_gauges(self) -> None:
        """Write one gauge line (KV usage, running/waiting, preemptions, breaker state)."""
        engine = self.supervisor.engine
        usage, running, waiting, preempted_total = 0.0, 0, 0, 0
        generation = self.supervisor.generation
        if engine is not None and self.supervisor.phase is EnginePhase.READY:
            with contextlib.suppress(Exception):
                stats = engine.stats()
                usage, running = stats.kv_cache_usage, stats.num_running
                waiting, preempted_total = stats.num_waiting, stats.num_preemptions_total
        last_generation, last_total = self._last_preemptions
        delta = preempted_total - last_total if last_generation == generation else preempted_total
        self._last_preemptions = (generation, preempted_total)
        now = self.clock()
        self.telemetry.gauges(
            kv_cache_usage=usage, running=running, waiting=waiting + self.admission.waiting,
            preemptions=max(0, delta), breaker_value=self.breaker.state(now).metric_value,
            kv_reserved_share=round(self.admission.ledger.reserved_share, 4),
            engine_phase=self.supervisor.phase.value, engine_generation=generation,
            token_cache_tokens=self.tokenizer.cache.cached_tokens,
            token_cache_entries=len(self.tokenizer.cache),
        )

    def _check_chat_rendering(self, engine: InferenceEngine) -> None:
        """The gateway renders prompts itself (it must count them): check once per engine that
        the engine tokenizer's own chat template gives the same token ids, and switch to a
        rendering that does when it does not (:mod:`gateway.rendering`)."""
        if not isinstance(engine, SupportsChatRendering):
            return
        try:
            reference = engine.chat_renderer()
            check = check_rendering(self.tokenizer, reference)
        except Exception as error:  # the check could not run: serve, but say it is unverified
            self.rendering = {"mode": self.rendering["mode"], "verified": False,
                              "detail": f"check failed: {type(error).__name__}: {error}"[:300]}
            self.telemetry.log("chat_template_check_failed", level="warning",
                               error=f"{type(error).__name__}: {error}"[:500])
            return
        apply_rendering(self.tokenizer, check, reference)
        self.rendering = {"mode": check.mode.value, "verified": True, "detail": check.detail}
        if check.matches:
            self.telemetry.log("chat_template_check", matches=True, mode=check.mode.value,
                               detail=check.detail)
            return
        self.telemetry.log(
            "chat_template_check", level="warning", matches=False, mode=check.mode.value,
            probe=check.probe, first_difference_at=check.position,
            gateway_tokens=check.gateway_tokens, engine_tokens=check.engine_tokens,
            message=f"the gateway's chat rendering differs from the engine tokenizer's: "
                    f"{check.detail}",
        )

    # --- /ping ---
    def adapter_status(self) -> dict[str, str]:
        """Each served adapter's state: what the engine reports, else "configured"."""
        status = dict.fromkeys(self.settings.adapter_names(), "configured")
        engine = self.supervisor.engine
        if isinstance(engine, SupportsAdapterStatus):
            status.update(engine.adapter_status())
        return status

    def ping(self) -> JSONResponse:
        """Answer from state only (never waits on the engine)."""
        now = self.clock()
        phase = EnginePhase.FAILED if self.failure_reason else self.supervisor.phase
        answer = ping_answer(
            phase=phase, warmed_up=self.warmed_up, draining=self.draining,
            crash_loop=self.crash_loop.is_crash_loop(now),
            deaths_in_window=self.crash_loop.deaths_in_window(now),
            crash_loop_window_s=self.crash_loop.window_s,
            recovering_since=self.supervisor.recovering_since, now=now,
            recovery_grace_s=self.settings.gateway.recovery_grace_s,
            failure_reason=self.failure_reason or self.supervisor.failure_reason,
            warmup_progress=self.warmup_progress,
            last_start_error=self.supervisor.last_start_error,
        )
        body = {"status": answer.status, "reason": answer.reason, "engine": phase.value,
                "breaker": self.breaker.state(now).value,
                "engine_generation": self.supervisor.generation,
                "engine_restarts": self.supervisor.restarts, "warmup": self.warmup_progress,
                "adapters": self.adapter_status(), "prompt_rendering": self.rendering}
        return JSONResponse(body, status_code=answer.http_status)

    # --- chat ---
    async def chat(self, request: Request, body: ChatCompletionRequest) -> Response:
        """POST /invocations and /v1/chat/completions."""
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}",
                               path=request.scope["path"], started=self.clock(),
                               stream=bool(body.stream))
        record.warmup = request.headers.get(WARMUP_HEADER) == self.warmup_token
        try:
            prepared = self.service.prepare(body, record)
            if self.service.refuses_as_xl(prepared):
                refusal = self.service.xl_fallback(prepared)
                if body.stream:
                    return self._stream(prepared, None, self._single(refusal))
                return self._complete(prepared, [], refusal)
            admission = await self.service.admit(prepared)
        except ApiError as error:
            return self.error_response(record, error)
        events = self.service.run(prepared, admission)
        if body.stream:
            try:
                first = await events.__anext__()
            except ApiError as error:
                await events.aclose()
                return self.error_response(record, error)
            return self._stream(prepared, first, events)
        texts: list[str] = []
        finish: FinishEvent | None = None
        try:
            async for event in events:
                if isinstance(event, TextEvent):
                    texts.append(event.text)
                else:
                    finish = event
        except ApiError as error:
            return self.error_response(record, error)
        finally:
            await events.aclose()
        return self._complete(prepared, texts, finish or FinishEvent("stop"))

    @staticmethod
    async def _single(finish: FinishEvent) -> AsyncIterator[TextEvent | FinishEvent]:
        yield finish

    def _complete(self, prepared: PreparedChat, texts: list[str],
                  finish: FinishEvent) -> Response:
        record = prepared.record
        extension = self._final_extension(prepared, finish)
        content = finish.fallback_text if finish.fallback else "".join(texts)
        record.finish_reason = finish.finish_reason
        document = {
            "id": record.request_id, "object": "chat.completion", "created": int(time.time()),
            "model": prepared.route.served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": finish.finish_reason}],
            "usage": {"prompt_tokens": record.prompt_tokens if record.reached_engine else 0,
                      "completion_tokens": record.completion_tokens,
                      "total_tokens": (record.prompt_tokens if record.reached_engine else 0)
                      + record.completion_tokens},
            "system_fingerprint": None,
            "mangaassist": extension,
        }
        self.telemetry.request(record)
        return Response(_dumps(document), media_type=JSON_MEDIA_TYPE,
                        headers=self._headers(prepared, finish))

    @staticmethod
    def _final_extension(prepared: PreparedChat, finish: FinishEvent) -> dict[str, Any]:
        extension = dict(prepared.extension)
        extension["fallback"] = finish.fallback
        extension["deadline_exceeded"] = finish.deadline_exceeded
        return extension

    @staticmethod
    def _headers(prepared: PreparedChat, finish: FinishEvent | None) -> dict[str, str]:
        headers: dict[str, str] = {}  # the body says it all; each header costs on every answer
        if finish is not None and finish.fallback:
            headers["X-MangaAssist-Fallback"] = finish.fallback["reason"]
        return headers

    def _stream(self, prepared: PreparedChat, first: TextEvent | FinishEvent | None,
                events: AsyncIterator[TextEvent | FinishEvent]) -> StreamingResponse:
        headers = {**self._headers(prepared, first if isinstance(first, FinishEvent) else None),
                   "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(self._sse(prepared, first, events),
                                 media_type="text/event-stream", headers=headers)

    async def _sse(self, prepared: PreparedChat, first: TextEvent | FinishEvent | None,
                   events: AsyncIterator[TextEvent | FinishEvent]) -> AsyncIterator[bytes]:
        record = prepared.record
        created = int(time.time())
        request = prepared.request
        include_usage = bool(request.stream_options and request.stream_options.include_usage)

        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  **extra: Any) -> bytes:
            document = {"id": record.request_id, "object": "chat.completion.chunk",
                        "created": created, "model": prepared.route.served_name,
                        "system_fingerprint": None,
                        "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish_reason}], **extra}
            return b"data: " + _dumps(document) + b"\n\n"

        completed = False
        sent_text = False
        try:
            yield chunk({"role": "assistant", "content": ""}, mangaassist=prepared.extension)
            pending: list[TextEvent | FinishEvent] = [first] if first is not None else []
            finish: FinishEvent | None = None
            while finish is None:
                event = pending.pop() if pending else await events.__anext__()
                if isinstance(event, TextEvent):
                    sent_text = True
                    yield chunk({"content": event.text})
                else:
                    finish = event
            if finish.fallback_text:
                prefix = "\n\n" if sent_text else ""
                yield chunk({"content": prefix + finish.fallback_text})
            record.finish_reason = finish.finish_reason
            yield chunk({}, finish.finish_reason,
                        mangaassist=self._final_extension(prepared, finish))
            if include_usage:
                prompt_tokens = record.prompt_tokens if record.reached_engine else 0
                usage = {"prompt_tokens": prompt_tokens,
                         "completion_tokens": record.completion_tokens,
                         "total_tokens": prompt_tokens + record.completion_tokens}
                document = {"id": record.request_id, "object": "chat.completion.chunk",
                            "created": created, "model": prepared.route.served_name,
                            "system_fingerprint": None, "choices": [], "usage": usage}
                yield b"data: " + _dumps(document) + b"\n\n"
            yield b"data: [DONE]\n\n"
            completed = True
        except ApiError as error:  # the engine refused the request after the stream started
            record.status = error.status
            record.outcome = "client_error"
            record.error_code = error.code
            record.error_message = error.message[:300]
            yield b"data: " + _dumps(error_body(error.message, type_=error.type_,
                                                param=error.param, code=error.code)) + b"\n\n"
            yield b"data: [DONE]\n\n"
            completed = True
        except StopAsyncIteration:
            completed = True  # defensive: run() always ends with a FinishEvent
            yield b"data: [DONE]\n\n"
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if not completed:
                record.outcome = "aborted"
                record.status = 499  # client closed the stream (nginx's convention, logs only)
            self.telemetry.request(record)

    def error_response(self, record: RequestRecord, error: ApiError) -> JSONResponse:
        """The OpenAI-style error for ``error``, logged as the request's one line."""
        record.status = error.status
        record.outcome = "rejected" if error.status in (429, 503) else "client_error"
        record.error_code = error.code
        record.error_param = error.param
        record.error_message = error.message[:300]
        self.telemetry.request(record)
        return JSONResponse(error_body(error.message, type_=error.type_, param=error.param,
                                       code=error.code),
                            status_code=error.status, headers=error.headers)

    def client_error(self, path: str, status: int, message: str, *, param: str | None = None,
                     code: str | None = None) -> JSONResponse:
        """An error raised before the chat handler ran (validation, unknown path, body size)."""
        record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}", path=path,
                               started=self.clock())
        return self.error_response(record, ApiError(status, message, param=param, code=code))

    # --- admin (test mode only) ---
    async def inject_oom(self) -> JSONResponse:
        """Kill the running engine with a simulated OOM (GATEWAY_TEST_MODE only)."""
        engine = self.supervisor.engine
        if engine is None or self.supervisor.phase is not EnginePhase.READY:
            return JSONResponse(error_body("no running engine to inject into",
                                           type_="invalid_request_error", code="engine_not_ready"),
                                status_code=409)
        if not isinstance(engine, SupportsFaultInjection):
            return JSONResponse(error_body(f"engine {engine.name!r} does not support fault "
                                           "injection", type_="invalid_request_error",
                                           code="not_supported"), status_code=409)
        engine.inject_oom("injected through /admin/engine/oom")
        self.telemetry.log("oom_injected", engine_generation=self.supervisor.generation)
        return JSONResponse({"injected": True, "engine_generation": self.supervisor.generation})

    # --- the app ---
    def _build_app(self) -> FastAPI:
        gateway = self.settings.gateway
        app = FastAPI(
            title="MangaAssist LLM gateway",
            version=__version__,
            description=(
                "OpenAI-compatible chat completions for the MangaAssist GPU tier: adapter "
                "routing, sliding-window context budget, KV-aware admission and an OOM circuit "
                "breaker in front of the inference engine. Extension fields live in the "
                "`mangaassist` object."),
            lifespan=self.lifespan,
        )
        runtime = self

        @app.exception_handler(RequestValidationError)
        async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
            message, param = validation_message(list(exc.errors()))
            return runtime.client_error(request.url.path, 400, message, param=param,
                                        code="invalid_value")

        @app.exception_handler(StarletteHTTPException)
        async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
            message = f"{request.method} {request.url.path}: {exc.detail}"
            response = runtime.client_error(request.url.path, exc.status_code, message,
                                            code=code)
            if exc.headers:
                response.headers.update(exc.headers)
            return response

        @app.exception_handler(Exception)
        async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
            runtime.telemetry.log("unhandled_error", level="error", path=request.url.path,
                                  error=repr(exc)[:500])
            return JSONResponse(error_body("internal error in the gateway; the request was not "
                                           "processed", type_="server_error",
                                           code="internal_error"), status_code=500)

        @app.get("/ping", response_model=PingResponse, tags=["health"],
                 responses={503: {"model": PingResponse,
                                  "description": "Warming up, crash loop, failed or draining."}})
        async def ping() -> JSONResponse:
            """SageMaker health check: answers from state in well under 2 s."""
            return runtime.ping()

        @app.post("/invocations", tags=["chat"], responses=_CHAT_RESPONSES,
                  response_model=None, summary="SageMaker invoke: OpenAI chat completion")
        async def invocations(request: Request, body: ChatCompletionRequest) -> Response:
            return await runtime.chat(request, body)

        @app.post("/v1/chat/completions", tags=["chat"], responses=_CHAT_RESPONSES,
                  response_model=None, summary="OpenAI chat completion")
        async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
            return await runtime.chat(request, body)

        @app.get("/v1/models", response_model=ModelList, tags=["chat"])
        async def models() -> dict[str, Any]:
            """The base model and the served LoRA adapters."""
            return {"object": "list", "data": [
                {"id": name, "object": "model", "created": runtime.started_at,
                 "owned_by": "mangaassist"} for name in runtime.router.served_names()]}

        if gateway.test_mode:
            @app.post("/admin/engine/oom", include_in_schema=False)
            async def inject_oom() -> JSONResponse:
                return await runtime.inject_oom()

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
                # The served names are known at start: document them (404 for any other).
                model = components["ChatCompletionRequest"]["properties"]["model"]
                model["anyOf"] = [{"type": "string",
                                   "enum": [*runtime.router.served_names(), "auto"]},
                                  {"type": "null"}]
                app.openapi_schema = schema
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]

        def on_reject(scope: Scope, status: int, message: str) -> None:
            code = "request_too_large" if status == 413 else "invalid_content_length"
            record = RequestRecord(request_id=f"chatcmpl-{uuid.uuid4().hex}",
                                   path=str(scope.get("path", "")), started=runtime.clock(),
                                   status=status, outcome="client_error", error_code=code,
                                   error_message=message[:300])
            runtime.telemetry.request(record)

        app.add_middleware(BodyLimitMiddleware, max_bytes=gateway.max_body_bytes,
                           on_reject=on_reject)
        return app


def create_app(
    settings: Settings,
    *,
    tokenizer: ChatTokenizer,
    engine_factory: Callable[[], InferenceEngine],
    telemetry: Telemetry | None = None,
    on_fatal: Callable[[str, bool], None] | None = None,
) -> FastAPI:
    """Build the gateway app (the runtime is at ``app.state.runtime``)."""
    runtime = GatewayRuntime(
        settings, tokenizer=tokenizer, engine_factory=engine_factory,
        telemetry=telemetry or Telemetry(endpoint_name=settings.gateway.metrics_endpoint_name,
                                         variant_name=settings.gateway.metrics_variant_name),
        on_fatal=on_fatal,
    )
    runtime.app.state.runtime = runtime
    return runtime.app

