"""The gateway process around the request path: engine start, warmup, gauges, /ping, shutdown.

:class:`GatewayLifecycle` is the app's lifespan. On start it begins two background tasks and
returns at once, so that /ping answers (``warming_up``) while the engine loads:

* **startup** — the supervisor starts the engine (bounded retries; a refused configuration or
  an engine that cannot be imported is fatal at once), then warmup pushes representative
  requests through the app's own ASGI stack (:mod:`gateway.warmup`) in two passes: the first
  pays the engine's one-off costs (kernel compiles, the first LoRA loads) and teaches admission
  nothing; the second, from admission's prior, measures the rate the engine drains prompt
  tokens at (the prefill valve's). /ping turns healthy only when the second pass succeeded and a
  short request on the idle engine would have its first token within the TTFT SLO at that rate;
  otherwise it says why and measures again, until
  ``GATEWAY_WARMUP_TIMEOUT_S`` passes. Just before it turns healthy, the process's heap is
  collected once and frozen (:mod:`gateway.gc_heap`; a rebuilt engine's warmup does the same),
  so that no later collection walks the 600,000 objects the start left. Each start phase is
  logged with its duration (``start_phase`` lines; docs/gateway.md#cold-start);
* **gauges** — every ``GATEWAY_METRICS_INTERVAL_S`` one line with the KV usage, running and
  waiting requests, preemptions since the last line, the breaker state and the longest
  garbage-collector pause since the last line.

/ping is computed from this state alone (:func:`gateway.health.ping_answer`). On SIGTERM the
server stops accepting connections and ``draining`` turns /ping 503; once in-flight requests have
finished (uvicorn's graceful shutdown) the lifespan stops the tasks and shuts the engine down.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx
from starlette.types import ASGIApp

from gateway import __version__
from gateway.admission import AdmissionController
from gateway.breaker import CircuitBreaker
from gateway.engine_events import EngineEvents
from gateway.engines.base import SupportsAdapterStatus
from gateway.gc_heap import ProcessHeap
from gateway.health import CrashLoopDetector, EnginePhase, PingAnswer, ping_answer
from gateway.settings import Settings
from gateway.supervisor import EngineStartFailed, EngineSupervisor
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer, ChatTurn
from gateway.warmup import (
    WARMUP_HEADER,
    calibration_batch,
    run_warmup,
    salted,
    short_request,
    warmup_requests,
)

FatalCallback = Callable[[str, bool], None]
"""Told once when the process should stop: the reason, and whether the settings caused it."""


class ProcessFailure:
    """Why the gateway cannot serve, once known: /ping turns red and the process is told.

    Built before the parts that can find a fatal condition (the engine events' KV check, the
    lifecycle's start and warmup), which are each handed :meth:`fatal`.
    """

    def __init__(self, telemetry: Telemetry, on_fatal: FatalCallback | None = None) -> None:
        self.telemetry = telemetry
        self.on_fatal = on_fatal
        self.reason: str | None = None

    def fatal(self, reason: str, *, config_error: bool = False) -> None:
        """Record why the gateway cannot serve (/ping turns red) and tell the process."""
        self.reason = reason
        self.telemetry.log("fatal", level="error", reason=reason, config_error=config_error)
        if self.on_fatal is not None:
            self.on_fatal(reason, config_error)


class GatewayLifecycle:
    """Engine start and warmup, gauges, /ping and shutdown (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        supervisor: EngineSupervisor,
        breaker: CircuitBreaker,
        crash_loop: CrashLoopDetector,
        admission: AdmissionController,
        tokenizer: ChatTokenizer,
        events: EngineEvents,
        telemetry: Telemetry,
        clock: Callable[[], float],
        served_names: Sequence[str],
        failure: ProcessFailure,
        heap: ProcessHeap | None = None,
    ) -> None:
        self.settings = settings
        self.heap = heap
        self.supervisor = supervisor
        self.breaker = breaker
        self.crash_loop = crash_loop
        self.admission = admission
        self.tokenizer = tokenizer
        self.events = events
        self.telemetry = telemetry
        self.clock = clock
        self.served_names = list(served_names)
        self.failure = failure
        self.warmup_token = secrets.token_hex(16)
        """Marks the process's own warmup requests (logged, not counted in metrics)."""
        self.warmed_up = False
        self.warmup_progress = "not started"
        self.warmup_passes = 0
        """Warmup passes run in this process: each pass's messages begin with ``#<its number>``
        (:func:`gateway.warmup.salted`), so that none is served from an earlier pass's prefix
        cache."""
        self.draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._app: ASGIApp | None = None
        self._last_preemptions: tuple[int, int] = (-1, 0)

    @property
    def failure_reason(self) -> str | None:
        """Why the gateway cannot serve, if it cannot (:class:`ProcessFailure`)."""
        return self.failure.reason

    def fatal(self, reason: str, *, config_error: bool = False) -> None:
        """Record why the gateway cannot serve (/ping turns red) and tell the process."""
        self.failure.fatal(reason, config_error=config_error)

    # --- lifespan ---
    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: ASGIApp) -> AsyncIterator[None]:
        """Start the engine and warmup in the background (/ping answers meanwhile)."""
        self.telemetry.log("gateway_starting", version=__version__,
                           engine=self.settings.gateway.engine,
                           max_model_len=self.settings.engine.max_model_len,
                           tokenizer_template=self.tokenizer.template_source,
                           tokenizer_segmented=self.tokenizer.segmented,
                           template_overhead=dict(self.tokenizer.overhead.per_message_tokens),
                           test_mode=self.settings.gateway.test_mode)
        if self.heap is not None:
            self.heap.start()
        self._spawn(self.startup(app), "gateway-startup")
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
            if self.heap is not None:
                self.heap.stop()
            self.telemetry.log("gateway_stopped")

    async def startup(self, app: ASGIApp) -> None:
        """Start the engine, then warm up through ``app`` until it succeeds or times out."""
        started = self.clock()
        self._app = app
        try:
            await self.supervisor.start()
        except EngineStartFailed as error:
            self.fatal(str(error), config_error=error.config_error is not None)
            return
        self.log_phase("engine_start", self.clock() - started,
                       parts=self.supervisor.start_phases())
        if self.failure_reason is not None:
            return
        self.supervisor.rewarm = self.rewarm
        if await self._warm_up(app, started):
            self.warmed_up = True
            self.supervisor.started_in(self.clock() - started)
            self.telemetry.log("warmup_complete", progress=self.warmup_progress)

    async def rewarm(self, generation: int) -> bool:
        """Warm up engine ``generation``, just rebuilt, before it serves (the supervisor's
        ``rewarm``): the same passes as at start, through the same app; admission starts again
        from its prior (the events' ``on_ready``). False when it did not succeed in time (the
        process is then told, as at start) or the process is stopping."""
        if self._app is None:
            return True
        self.telemetry.log("rewarm_started", engine_generation=generation)
        if not await self._warm_up(self._app, self.clock(), generation=generation):
            return False
        self.warmed_up = True
        self.telemetry.log("warmup_complete", progress=self.warmup_progress,
                           engine_generation=generation)
        return True

    def _superseded(self, generation: int) -> bool:
        """Whether warming engine ``generation`` is moot: the slot failed, or that engine died
        (the next one's rebuild warms it) or was replaced."""
        supervisor = self.supervisor
        return (supervisor.phase in (EnginePhase.FAILED, EnginePhase.RECOVERING)
                or supervisor.generation != generation)

    async def _warm_up(self, app: ASGIApp, started: float, *, generation: int = 0) -> bool:
        """The two warmup passes through ``app`` (see the module docstring), until the valve
        says a short request starts within the SLO; False on timeout (fatal), a failed engine
        or draining."""
        gateway = self.settings.gateway
        requests = warmup_requests(self.settings, served_names=self.served_names,
                                   count=lambda text: self.tokenizer.count([text])[0],
                                   log=self.telemetry.log)
        short_tokens = self._prompt_tokens(short_request(requests))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmup",
                                     timeout=gateway.request_deadline_s) as client:
            deadline = self.clock() + gateway.warmup_timeout_s
            first_use = True
            while not self.draining:
                phase_started = self.clock()
                if first_use:
                    first_use = not await self._warm(client, requests, learning=False)
                    if not first_use:
                        self.log_phase("warmup_first_use", self.clock() - phase_started,
                                       generation=generation)
                        continue
                elif await self._warm(client, requests, learning=True):
                    self.log_phase("warmup_measure", self.clock() - phase_started,
                                   generation=generation)
                    if self._valve_ready(short_tokens):
                        self._freeze_heap(generation)
                        self.log_phase("healthy", self.clock() - started, generation=generation)
                        return True
                if self._superseded(generation):
                    return False
                if self.clock() >= deadline:
                    self.fatal(
                        f"warmup did not succeed within GATEWAY_WARMUP_TIMEOUT_S="
                        f"{gateway.warmup_timeout_s:g} s (last: {self.warmup_progress}); see the "
                        "warmup_failed and warmup_first_token_over_slo log lines"
                    )
                    return False
                await asyncio.sleep(0.5)
        return False

    async def _warm(self, client: httpx.AsyncClient,
                    requests: Sequence[tuple[str, dict[str, Any]]], *, learning: bool) -> bool:
        """One warmup pass. ``learning`` off: the engine's first use of each shape (compiles,
        LoRA loads) teaches admission nothing. On: admission starts again from its prior and
        learns the steady state from this pass."""
        admission = self.admission
        if learning:
            admission.reset_learning()
        admission.learning = learning
        label = "measuring" if learning else "first use"
        self.warmup_passes += 1
        salt = f"#{self.warmup_passes} "  # two tokens: the passes' prompts keep their lengths
        try:
            return await run_warmup(
                client, salted(requests, salt), headers={WARMUP_HEADER: self.warmup_token},
                progress=lambda text: self._set_warmup_progress(f"{text} ({label})"),
                log=self.telemetry.log, batch=calibration_batch(self.settings, salt=salt))
        finally:
            admission.learning = True

    def _freeze_heap(self, generation: int) -> None:
        """Before engine ``generation`` serves: collect once and freeze what survives, so
        that later collections skip the start's 600,000 objects (:mod:`gateway.gc_heap`)."""
        if self.heap is None:
            return
        frozen = self.heap.freeze()
        self.log_phase("gc_freeze", frozen.seconds, generation=generation,
                       parts={"collected": frozen.collected})

    def _valve_ready(self, short_tokens: int) -> bool:
        """True when a short request on the idle engine has its first token within the SLO at
        the drain rate warmup measured; else /ping's reason and a log line say what it would
        take."""
        slo_s = self.admission.ttft_slo_s
        first_token_s = self.admission.idle_first_token_s(short_tokens)
        if first_token_s <= slo_s:
            return True
        self._set_warmup_progress(
            f"a short request ({short_tokens} prompt tokens) on the idle engine would have its "
            f"first token in {first_token_s:.3f} s at the measured drain rate, later than "
            f"GATEWAY_TTFT_SLO_S={slo_s:g} s: measuring again")
        self.telemetry.log("warmup_first_token_over_slo", level="warning",
                           prompt_tokens=short_tokens, first_token_s=round(first_token_s, 4),
                           ttft_slo_s=slo_s, **self.admission_model())
        return False

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        """Prompt tokens of a warmup request's messages as the engine would get them."""
        turns = [ChatTurn(message["role"], message["content"]) for message in body["messages"]]
        return self.tokenizer.render_prompt(turns).num_tokens

    def log_phase(self, phase: str, seconds: float, *, generation: int = 0,
                  parts: Mapping[str, float] | None = None) -> None:
        """One ``start_phase`` line: a start phase and how long it took (``parts``: its own
        phases, in seconds), for engine ``generation`` (0: the process's start; a rebuilt
        engine's lines say which)."""
        rounded: dict[str, Any] = {name: round(value, 3)
                                   for name, value in (parts or {}).items()}
        if generation:
            rounded["engine_generation"] = generation
        self.telemetry.log("start_phase", phase=phase, seconds=round(seconds, 3), **rounded)

    def _set_warmup_progress(self, text: str) -> None:
        self.warmup_progress = text

    # --- gauges ---
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
            **(self.heap.pauses.take().fields() if self.heap is not None else {}),
            **self.admission_model(),
        )

    def admission_model(self) -> dict[str, Any]:
        """What admission has learned of the engine (on the gauge line, for operators)."""
        return {"typical_answer_tokens": self.admission.lengths.typical(),
                **self.admission_decisions(self.clock())}

    def admission_decisions(self, now: float) -> dict[str, Any]:
        """The prefill valve at ``now`` and what it decided (the gauge line and /ping's
        ``admission`` block)."""
        admission = self.admission
        valve = admission.valve
        arrivals = admission.arrivals
        return {
            "drain_tokens_per_s": round(valve.rate, 1),
            "valve_backlog_tokens": valve.backlog,
            "valve_cap_tokens": round(valve.cap(now), 1),
            "valve_target_s": round(valve.target_s, 3),
            "refused_by_valve": arrivals.refused_by_valve,
            "refused_while_idle": arrivals.refused_while_idle,
            "floor_admits": arrivals.floor_admits,
            "turnover_admits": arrivals.turnover_admits,
            "turnover_refusals": arrivals.turnover_refusals,
            "prefill_tokens_per_s": round(admission.prefill_rate(admission.decode.step_s, now),
                                          1),
            "prefill_token_us": (None if admission.prefill_cost.token_s is None
                                 else round(admission.prefill_cost.token_s * 1e6, 2)),
            "decode_step_ms": (None if admission.decode.step_s is None
                               else round(admission.decode.step_s * 1000, 2)),
        }

    # --- /ping ---
    def adapter_status(self) -> dict[str, str]:
        """Each served adapter's state: what the engine reports, else "configured"."""
        status = dict.fromkeys(self.settings.adapter_names(), "configured")
        engine = self.supervisor.engine
        if isinstance(engine, SupportsAdapterStatus):
            status.update(engine.adapter_status())
        return status

    def ping(self) -> tuple[PingAnswer, dict[str, Any]]:
        """The /ping answer and body, from state only (never waits on the engine)."""
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
                "adapters": self.adapter_status(), "prompt_rendering": self.events.rendering,
                "admission": self.admission_ping(now)}
        return answer, body

    def admission_ping(self, now: float) -> dict[str, Any]:
        """/ping's view of admission: how often the valve refused, and how often while the
        engine was nearly idle (a lock-out when it lasts; it also pages, docs/runbooks)."""
        admission = self.admission
        last = admission.arrivals.last_refused_while_idle_at
        return {
            "running_sequences": admission.running_sequences,
            "waiting": admission.waiting,
            **self.admission_decisions(now),
            "last_refused_while_idle_s_ago": None if last is None else round(now - last, 1),
        }
