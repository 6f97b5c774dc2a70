"""Engine supervision: bounded retries with backoff, one trip per death, rebuilds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.engines.base import EngineDead, EngineError, EngineOutOfMemory, InferenceEngine
from gateway.health import CrashLoopDetector, EnginePhase, RestartPolicy
from gateway.supervisor import EngineStartFailed, EngineSupervisor
from tests.support.sim_engine import SimEngine


class FlakyFactory:
    """Builds simulators whose start() fails the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.built: list[SimEngine] = []

    def __call__(self) -> InferenceEngine:
        engine = SimEngine(num_gpu_blocks=64, max_model_len=512)
        if len(self.built) < self.failures:
            async def broken_start() -> None:
                raise EngineError("CUDA error: out of memory while loading weights")
            engine.start = broken_start  # type: ignore[method-assign]
        self.built.append(engine)
        return engine


def supervisor(factory: Any, *, attempts: int = 4, events: list[Any] | None = None,
               sleeps: list[float] | None = None) -> EngineSupervisor:
    log = events if events is not None else []

    async def fake_sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        await asyncio.sleep(0)

    return EngineSupervisor(
        factory,
        restart=RestartPolicy(max_attempts=attempts, backoff_s=0.5, backoff_max_s=4.0),
        crash_loop=CrashLoopDetector(deaths=3, window_s=60.0),
        on_death=lambda generation, error: log.append(("death", generation, type(error))),
        on_ready=lambda generation, engine: log.append(("ready", generation)),
        log=lambda event, **fields: log.append((event, fields.get("attempt"))),
        sleep=fake_sleep,
        watch_interval_s=0.01,
    )


def test_start_retries_with_backoff_then_succeeds() -> None:
    sleeps: list[float] = []
    events: list[Any] = []

    async def scenario() -> EngineSupervisor:
        sup = supervisor(FlakyFactory(failures=2), events=events, sleeps=sleeps)
        await sup.start()
        await sup.close()
        return sup

    sup = asyncio.run(scenario())
    assert sleeps == [1.0, 2.0]  # before attempts 2 and 3
    assert ("engine_start_failed", 1) in events
    assert ("engine_start_failed", 2) in events
    assert ("ready", 0) in events
    assert sup.generation == 0


def test_start_gives_up_after_the_bounded_attempts() -> None:
    async def scenario() -> EngineSupervisor:
        sup = supervisor(FlakyFactory(failures=10), attempts=3)
        with pytest.raises(EngineStartFailed, match="engine start failed 3 times"):
            await sup.start()
        return sup

    sup = asyncio.run(scenario())
    assert sup.phase is EnginePhase.FAILED
    assert "CUDA error" in (sup.failure_reason or "")


def test_a_death_is_one_trip_and_the_engine_is_rebuilt() -> None:
    events: list[Any] = []
    sleeps: list[float] = []

    async def scenario() -> EngineSupervisor:
        factory = FlakyFactory(failures=0)
        sup = supervisor(factory, events=events, sleeps=sleeps)
        await sup.start()
        error = EngineDead("boom")
        assert sup.report_death(0, error) is True
        assert sup.report_death(0, error) is False  # the 63 other in-flight requests
        assert sup.phase is EnginePhase.RECOVERING
        engine = await sup.wait_ready(5.0)
        assert engine is factory.built[1]
        assert sup.report_death(0, error) is False  # a stale report about the old engine
        await sup.close()
        return sup

    sup = asyncio.run(scenario())
    assert sup.generation == 1
    assert sup.restarts == 1
    assert [e for e in events if e[0] in ("death", "ready")] == [
        ("ready", 0), ("death", 0, EngineDead), ("ready", 1)]
    assert sleeps == [0.5]  # backoff before the first rebuild attempt


def test_the_watcher_notices_an_idle_death() -> None:
    async def scenario() -> EngineSupervisor:
        factory = FlakyFactory(failures=0)
        sup = supervisor(factory)
        engine = await sup.start()
        assert isinstance(engine, SimEngine)
        engine.inject_oom("idle test")
        for _ in range(200):
            if sup.generation == 1:
                break
            await asyncio.sleep(0.01)
        await sup.close()
        return sup

    sup = asyncio.run(scenario())
    assert sup.generation == 1
    assert sup.crash_loop.deaths_in_window(sup.recovering_since or 0.0) <= 1


def test_a_death_is_counted_with_what_killed_the_engine_not_what_the_first_reporter_saw() -> None:
    """The OOM reaches the requests in flight as EngineOutOfMemory; a request that arrives just
    after sees only "engine is dead" and may report first. The trip carries the engine's own
    cause."""
    events: list[Any] = []

    async def scenario() -> None:
        factory = FlakyFactory(failures=0)
        sup = supervisor(factory, events=events)
        engine = await sup.start()
        assert isinstance(engine, SimEngine)
        sup._watch_interval_s = 60.0  # the report below comes first, not the watcher's
        engine.inject_oom("mid-step")
        for _ in range(200):
            if engine.is_dead:
                break
            await asyncio.sleep(0.001)
        assert sup.report_death(0, EngineDead("engine is dead")) is True
        await sup.wait_ready(5.0)
        await sup.close()

    asyncio.run(scenario())
    assert [e for e in events if e[0] == "death"] == [("death", 0, EngineOutOfMemory)]


def test_a_rebuilt_engine_serves_warmup_only_until_its_warmup_succeeds() -> None:
    """The rebuilt engine is installed WARMING: live requests get no engine (the service
    answers 503 at once), warmup requests get it; READY only once ``rewarm`` says so. The
    Retry-After meanwhile is the last start's duration less the rebuild's time so far."""
    seen: dict[str, Any] = {}

    async def scenario() -> EngineSupervisor:
        factory = FlakyFactory(failures=0)
        sup = supervisor(factory)
        await sup.start()
        sup.started_in(40.0)
        warming = asyncio.Event()
        release = asyncio.Event()

        async def rewarm(generation: int) -> bool:
            seen["generation"] = generation
            seen["phase"] = sup.phase
            seen["live"] = sup.serving()
            seen["warmup"] = sup.serving(warmup=True)
            warming.set()
            await release.wait()
            return True

        sup.rewarm = rewarm
        assert sup.report_death(0, EngineDead("boom"))
        assert sup.serving() is None and sup.serving(warmup=True) is None  # rebuilding
        remaining = sup.rebuild_remaining_s(sup.recovering_since or 0.0)
        seen["remaining"] = remaining
        await asyncio.wait_for(warming.wait(), 5.0)
        seen["still"] = sup.serving()
        release.set()
        engine = await sup.wait_ready(5.0)
        seen["ready"] = engine is factory.built[1] and sup.serving() is engine
        await sup.close()
        return sup

    sup = asyncio.run(scenario())
    assert seen["generation"] == 1 and seen["phase"] is EnginePhase.WARMING
    assert seen["live"] is None and seen["warmup"] is not None and seen["still"] is None
    assert seen["remaining"] == 40.0
    assert seen["ready"] and sup.recovering_since is None
    assert sup.rebuild_remaining_s(0.0) is None  # no rebuild under way


def test_a_rebuilt_engine_that_dies_while_warming_is_rebuilt_again() -> None:
    async def scenario() -> EngineSupervisor:
        factory = FlakyFactory(failures=0)
        sup = supervisor(factory)
        await sup.start()
        calls: list[int] = []

        async def rewarm(generation: int) -> bool:
            calls.append(generation)
            if generation == 1:  # dies during its warmup
                assert sup.report_death(1, EngineDead("again"))
                return False
            return True

        sup.rewarm = rewarm
        assert sup.report_death(0, EngineDead("boom"))
        for _ in range(200):
            if sup.phase is EnginePhase.READY and sup.generation == 2:
                break
            await asyncio.sleep(0.01)
        assert calls == [1, 2]
        await sup.close()
        return sup

    sup = asyncio.run(scenario())
    assert sup.generation == 2 and sup.restarts == 2
