"""Owns the engine: starts it, notices its death, rebuilds it with bounded retries and backoff.

vLLM's engine is fail-stop: after a CUDA OOM its engine-core process is gone and nothing in vLLM
restarts it (docs/design-decisions.md#vllm-engine-death). The gateway therefore keeps the
engine in a slot it supervises. A death
is noticed either by a request (its generate raised EngineDead) or by a light watcher that polls
``engine.is_dead``; the first report for an engine generation wins, later ones are ignored, so
a death that fails 64 in-flight requests counts as one trip. The rebuild shuts the dead engine
down, waits ``backoff × 2^(attempt-1)``, builds a fresh engine and starts it; after
``max_attempts`` failures the slot is FAILED and /ping turns red. Only a failure that may heal
is retried: an :class:`~gateway.engines.base.EngineConfigError` (the engine's verdict that no
attempt can succeed: settings, image, a configuration its core refused) fails the slot at once.

A rebuilt engine is a cold engine: it is installed WARMING, its warmup (``rewarm``, the same
passes as at start, :mod:`gateway.lifecycle`) runs on it, and only then is it READY for live
requests; until then :meth:`wait_ready` gives it to warmup requests only. How long a start took
(engine and warmup) is what the next rebuild is expected to take (:meth:`rebuild_remaining_s`,
the Retry-After of the 503s meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from gateway.engines.base import (
    EngineConfigError,
    EngineDead,
    InferenceEngine,
    SupportsStartPhases,
)
from gateway.health import CrashLoopDetector, EnginePhase, RestartPolicy

EngineFactory = Callable[[], InferenceEngine]
DeathCallback = Callable[[int, EngineDead], None]
ReadyCallback = Callable[[int, InferenceEngine], None]
LogCallback = Callable[..., None]
RewarmCallback = Callable[[int], Awaitable[bool]]
"""Warms up the rebuilt engine of a generation; True when it may serve."""


class EngineStartFailed(RuntimeError):
    """The engine could not be started within the bounded attempts, or cannot start at all.

    ``config_error`` is set when the settings themselves were refused (EngineConfigError): the
    process should exit with the configuration exit code rather than the engine one.
    """

    def __init__(self, reason: str, *, config_error: EngineConfigError | None = None) -> None:
        super().__init__(reason)
        self.config_error = config_error


class EngineSupervisor:
    """The engine slot (see the module docstring)."""

    def __init__(
        self,
        factory: EngineFactory,
        *,
        restart: RestartPolicy,
        crash_loop: CrashLoopDetector,
        on_death: DeathCallback,
        on_ready: ReadyCallback,
        log: LogCallback,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        watch_interval_s: float = 0.2,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self._factory = factory
        self.restart = restart
        self.crash_loop = crash_loop
        self._on_death = on_death
        self._on_ready = on_ready
        self._log = log
        self._clock = clock
        self._sleep = sleep
        self._watch_interval_s = watch_interval_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self.phase = EnginePhase.STARTING
        self.engine: InferenceEngine | None = None
        self.generation = 0
        self.restarts = 0
        self.recovering_since: float | None = None
        self.failure_reason: str | None = None
        self.last_start_error: str | None = None
        """The last failed (re)build attempt, shown by /ping while the next one runs."""
        self.rewarm: RewarmCallback | None = None
        """Warms a rebuilt engine before it serves (set by the lifecycle); None: it serves at
        once."""
        self.expected_start_s: float | None = None
        """How long the last start took, engine and warmup (:meth:`started_in`): what a rebuild
        is expected to take."""
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    # --- lifecycle ---
    async def start(self) -> InferenceEngine:
        """Start the first engine (same bounded retries as a rebuild) and the death watcher."""
        engine = await self._build_with_retries("start")
        self._install(engine)
        self._spawn(self._watch(), "engine-watcher")
        return engine

    async def close(self) -> None:
        """Stop watching and shut the engine down (on SIGTERM, after draining)."""
        self._closing = True
        self.phase = EnginePhase.STOPPING
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.engine is not None:
            await self._shutdown_engine(self.engine)

    def start_phases(self) -> dict[str, float]:
        """Seconds each phase of the current engine's start took, as the engine reports them
        (:class:`~gateway.engines.base.SupportsStartPhases`; empty for an engine that does
        not)."""
        engine = self.engine
        if isinstance(engine, SupportsStartPhases):
            return dict(engine.start_phases())
        return {}

    def started_in(self, seconds: float) -> None:
        """The start just finished (engine and warmup) took ``seconds``."""
        self.expected_start_s = seconds

    def rebuild_remaining_s(self, now: float) -> float | None:
        """Seconds the rebuild under way is still expected to take (the last start's duration
        less the time it has run; at least 0); None when no rebuild runs or none is known."""
        if self.recovering_since is None or self.expected_start_s is None:
            return None
        return max(0.0, self.expected_start_s - (now - self.recovering_since))

    def serving(self, *, warmup: bool = False) -> InferenceEngine | None:
        """The engine a request may use now: READY for any request; WARMING (a rebuilt engine
        warming up) for warmup requests only."""
        if self.engine is None:
            return None
        if self.phase is EnginePhase.READY or (warmup and self.phase is EnginePhase.WARMING):
            return self.engine
        return None

    async def wait_ready(self, timeout_s: float) -> InferenceEngine | None:
        """The engine once READY (waiting up to ``timeout_s``); None if not ready in time."""
        if self.phase is EnginePhase.READY and self.engine is not None:
            return self.engine
        if self.phase in (EnginePhase.FAILED, EnginePhase.STOPPING) or timeout_s <= 0:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout=timeout_s)
        if self.phase is EnginePhase.READY:
            return self.engine
        return None

    def report_death(self, generation: int, error: EngineDead) -> bool:
        """Report that engine ``generation`` died; True for the first report (a new trip)."""
        if (generation != self.generation or self._closing
                or self.phase not in (EnginePhase.READY, EnginePhase.WARMING)):
            return False
        now = self._clock()
        self.phase = EnginePhase.RECOVERING
        self.recovering_since = now
        self._ready.clear()
        self.crash_loop.record(now)
        # What killed the engine, as it recorded it: the first report may come from a request
        # that only saw "engine is dead" while another held the out-of-memory error.
        recorded = self.engine.dead_error if self.engine is not None else None
        self._on_death(generation, recorded or error)
        self._spawn(self._rebuild(), "engine-rebuild")
        return True

    # --- internals ---
    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _install(self, engine: InferenceEngine, *, warming: bool = False) -> None:
        self.engine = engine
        self.last_start_error = None
        if warming:
            self.phase = EnginePhase.WARMING
        else:
            self._serve()
        self._on_ready(self.generation, engine)

    def _serve(self) -> None:
        self.phase = EnginePhase.READY
        self.recovering_since = None
        self._ready.set()

    async def _build_with_retries(self, purpose: str) -> InferenceEngine:
        last_error: BaseException | None = None
        for attempt in range(1, self.restart.max_attempts + 1):
            if attempt > 1 or purpose == "rebuild":
                await self._sleep(self.restart.delay_before(attempt))
            if self._closing:
                raise EngineStartFailed("shutting down")
            engine: InferenceEngine | None = None
            try:
                engine = self._factory()
                await engine.start()
                return engine
            except asyncio.CancelledError:
                raise
            except EngineConfigError as error:  # the settings are wrong: no attempt can succeed
                if engine is not None:
                    await self._shutdown_engine(engine)
                self._log("engine_config_refused", level="error", purpose=purpose,
                          setting=error.setting, error=str(error))
                self.phase = EnginePhase.FAILED
                self.failure_reason = str(error)
                raise EngineStartFailed(str(error), config_error=error) from error
            except Exception as error:  # any other build failure counts as one failed attempt
                last_error = error
                self.last_start_error = (f"attempt {attempt}/{self.restart.max_attempts} "
                                         f"failed: {type(error).__name__}: {error}")[:300]
                self._log("engine_start_failed", level="error", purpose=purpose, attempt=attempt,
                          max_attempts=self.restart.max_attempts, error=repr(error))
                if engine is not None:
                    await self._shutdown_engine(engine)
        reason = (f"engine {purpose} failed {self.restart.max_attempts} times; last error: "
                  f"{last_error!r}")
        self.phase = EnginePhase.FAILED
        self.failure_reason = reason
        raise EngineStartFailed(reason)

    async def _rebuild(self) -> None:
        dead = self.engine
        if dead is not None:
            await self._shutdown_engine(dead)
        started = self._clock()
        try:
            engine = await self._build_with_retries("rebuild")
        except EngineStartFailed:
            return
        self.generation += 1
        self.restarts += 1
        if self.rewarm is None:
            self._install(engine)
            return
        generation = self.generation
        self._install(engine, warming=True)
        warmed = await self.rewarm(generation)
        if generation != self.generation or self.phase is not EnginePhase.WARMING:
            return  # it died while warming (another rebuild runs), or the process is stopping
        if warmed:
            self.started_in(self._clock() - started)
            self._serve()

    async def _shutdown_engine(self, engine: InferenceEngine) -> None:
        try:
            await asyncio.wait_for(engine.shutdown(), timeout=self._shutdown_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a dead engine may fail to shut down cleanly; carry on
            self._log("engine_shutdown_failed", level="warning", error=repr(error))

    async def _watch(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._watch_interval_s)
            engine = self.engine
            if (self.phase in (EnginePhase.READY, EnginePhase.WARMING) and engine is not None
                    and engine.is_dead):
                error = engine.dead_error or EngineDead("engine reported dead")
                self.report_death(self.generation, error)
