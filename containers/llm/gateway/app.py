"""The gateway process wired: its parts built in dependency order, and the HTTP app over them.

:class:`GatewayRuntime` builds one process's parts — the serving handler
(:class:`~gateway.api.serving.ChatService`), the engine supervisor and what happens on its events
(:class:`~gateway.engine_events.EngineEvents`), the process lifecycle (engine start, warmup,
gauges, /ping: :class:`~gateway.lifecycle.GatewayLifecycle`) — and the HTTP layer over them
(:mod:`gateway.api`: routes, protocol models, errors, the body-size edge). It holds no route.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gateway.admission import AdmissionController, AdmissionLedger
from gateway.api.handlers import Handlers
from gateway.api.routes import build_app
from gateway.api.serving import ChatService
from gateway.breaker import BreakerPolicy, CircuitBreaker
from gateway.engine_events import EngineEvents, breaker_transition_publisher
from gateway.engines.base import InferenceEngine
from gateway.gc_heap import ProcessHeap
from gateway.health import CrashLoopDetector, RestartPolicy
from gateway.lifecycle import FatalCallback, GatewayLifecycle, ProcessFailure
from gateway.routing import AdapterRouter
from gateway.sessions import SessionTable
from gateway.settings import Settings
from gateway.supervisor import EngineSupervisor
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer


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
        heap: ProcessHeap | None = None,
    ) -> None:
        # Built in dependency order: each part gets what it calls at construction.
        gateway = settings.gateway
        self.settings = settings
        self.tokenizer = tokenizer
        self.telemetry = telemetry
        self.clock = clock
        self.crash_loop = CrashLoopDetector(deaths=gateway.crash_loop_deaths,
                                            window_s=gateway.crash_loop_window_s)
        self.admission = AdmissionController(
            AdmissionLedger.awaiting_engine(settings.engine.block_size,
                                            watermark=gateway.admission_watermark,
                                            bucket_caps=gateway.buckets.caps,
                                            bounds=gateway.buckets.bounds),
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
            served_names=self.router.served_names(), failure=self.failure, heap=heap)
        self.http = Handlers(settings, service=self.service, lifecycle=self.lifecycle,
                             supervisor=self.supervisor, router=self.router,
                             sessions=self.sessions, telemetry=telemetry, clock=clock)
        self.app = build_app(self.http, lifespan=self.lifecycle.lifespan)
        self.app.state.runtime = self

    def ping(self) -> JSONResponse:
        """GET /ping's answer (:meth:`gateway.api.handlers.Handlers.ping`)."""
        return self.http.ping()


def create_app(
    settings: Settings,
    *,
    tokenizer: ChatTokenizer,
    engine_factory: Callable[[], InferenceEngine],
    telemetry: Telemetry | None = None,
    on_fatal: FatalCallback | None = None,
    heap: ProcessHeap | None = None,
) -> FastAPI:
    """Build the gateway app (the runtime is at ``app.state.runtime``); ``heap``: the
    process's garbage collector (:mod:`gateway.gc_heap`), which the app freezes once an engine
    has warmed up (None: left alone)."""
    runtime = GatewayRuntime(
        settings, tokenizer=tokenizer, engine_factory=engine_factory,
        telemetry=telemetry or Telemetry(endpoint_name=settings.gateway.metrics_endpoint_name,
                                         variant_name=settings.gateway.metrics_variant_name),
        on_fatal=on_fatal, heap=heap,
    )
    return runtime.app
