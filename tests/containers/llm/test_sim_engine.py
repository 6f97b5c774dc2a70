"""The simulated PagedAttention engine: blocks, continuous batching, preemption, OOM death."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.engines.base import (
    AdapterRef,
    EngineDead,
    EngineOutOfMemory,
    EngineRequestError,
    GenerationDelta,
    InferenceEngine,
    RenderedPrompt,
    SamplingParams,
    SupportsFaultInjection,
)
from tests.support.sim_engine import SimEngine


def prompt(tokens: int) -> RenderedPrompt:
    return RenderedPrompt(text=f"prompt of {tokens}", token_ids=range(tokens))


async def collect(engine: SimEngine, request_id: str, tokens: int, max_tokens: int,
                  **params: Any) -> list[GenerationDelta]:
    return [delta async for delta in engine.generate(
        request_id, prompt(tokens), SamplingParams(max_tokens=max_tokens, **params))]


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


def engine(**overrides: Any) -> SimEngine:
    arguments: dict[str, Any] = {"num_gpu_blocks": 256, "max_model_len": 1024}
    arguments.update(overrides)
    return SimEngine(**arguments)


def test_implements_the_engine_interface() -> None:
    sim = engine()
    assert isinstance(sim, InferenceEngine)
    assert isinstance(sim, SupportsFaultInjection)
    assert sim.kv_capacity().num_tokens == 256 * 16


def test_generates_exactly_max_tokens_and_frees_every_block() -> None:
    async def scenario() -> tuple[list[GenerationDelta], SimEngine]:
        sim = engine()
        await sim.start()
        deltas = await collect(sim, "a", 100, 40)
        sim.check_invariants()
        return deltas, sim

    deltas, sim = run(scenario)
    assert sum(len(d.token_ids) for d in deltas) == 40
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas)
    assert sim.stats().kv_cache_usage == 0.0
    # 100 prompt + 39 computed outputs = 139 tokens -> 9 blocks at the peak
    assert sim.max_blocks_in_use == 9


def test_blocks_grow_one_block_per_16_tokens() -> None:
    async def scenario() -> list[int]:
        sim = engine(step_time_s=0.001)
        await sim.start()
        usage: list[int] = []
        async for _ in sim.generate("a", prompt(15), SamplingParams(max_tokens=40)):
            usage.append(sum(len(r.blocks) for r in sim._running))
        return usage

    usage = run(scenario)
    assert usage[0] == 1
    assert max(usage) == 4
    assert usage[:-1] == sorted(usage[:-1])
    assert usage[-1] == 0


def test_continuous_batching_short_request_overtakes_long_one() -> None:
    async def scenario() -> list[str]:
        sim = engine(step_time_s=0.002)
        await sim.start()
        finished: list[str] = []

        async def one(name: str, tokens: int) -> None:
            await collect(sim, name, 50, tokens)
            finished.append(name)

        long_task = asyncio.create_task(one("long", 60))
        await asyncio.sleep(0.02)  # the long request is mid-generation when the short one joins
        await one("short", 5)
        await long_task
        return finished

    assert run(scenario) == ["short", "long"]


def test_step_budget_and_max_num_seqs_are_respected() -> None:
    async def scenario() -> SimEngine:
        sim = engine(num_gpu_blocks=2048, max_model_len=2048, max_num_batched_tokens=256,
                     max_num_seqs=4, step_time_s=0.0005)
        await sim.start()
        peak_running = 0

        async def watch() -> None:
            nonlocal peak_running
            while True:
                peak_running = max(peak_running, sim.stats().num_running)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(collect(sim, f"r{i}", 700, 8) for i in range(10)))
        watcher.cancel()
        assert peak_running <= 4
        return sim

    sim = run(scenario)
    assert sim.max_batch_tokens_seen <= 256  # 700-token prompts were prefilled in chunks


def test_preemption_with_recompute_under_memory_pressure() -> None:
    async def scenario() -> tuple[list[list[GenerationDelta]], SimEngine]:
        # 40 blocks = 640 tokens for 8 requests that each grow to 120 + 100 = 220 tokens.
        sim = engine(num_gpu_blocks=40, max_model_len=512, max_num_batched_tokens=2048)
        await sim.start()
        results = await asyncio.gather(*(collect(sim, f"r{i}", 120, 100) for i in range(8)))
        sim.check_invariants()
        return list(results), sim

    results, sim = run(scenario)
    assert sim.num_preemptions > 0
    for deltas in results:  # every request still gets its full answer, exactly once
        assert sum(len(d.token_ids) for d in deltas) == 100
        assert deltas[-1].finish_reason == "length"
    assert sim.stats().kv_cache_usage == 0.0
    assert sim.max_blocks_in_use == 40


def test_oom_at_a_step_kills_in_flight_and_later_requests() -> None:
    async def scenario() -> tuple[list[BaseException | list[GenerationDelta]], SimEngine]:
        sim = engine(oom_at_step=5, step_time_s=0.001)
        await sim.start()
        results = await asyncio.gather(*(collect(sim, f"r{i}", 30, 50) for i in range(3)),
                                       return_exceptions=True)
        return list(results), sim

    results, sim = run(scenario)
    assert all(isinstance(result, EngineOutOfMemory) for result in results)
    assert sim.is_dead
    assert isinstance(sim.dead_error, EngineOutOfMemory)
    assert "CUDA out of memory (simulated) at step 5" in str(sim.dead_error)

    async def later() -> None:
        with pytest.raises(EngineDead, match="engine is dead"):
            await collect(sim, "after", 10, 5)

    run(later)


def test_oom_by_batched_token_threshold() -> None:
    async def scenario() -> BaseException | None:
        sim = engine(oom_batched_tokens=500)
        await sim.start()
        await collect(sim, "small", 100, 5)  # 100-token prefill: fine
        try:
            await collect(sim, "big", 600, 5)
        except EngineOutOfMemory as error:
            return error
        return None

    error = run(scenario)
    assert error is not None
    assert "passed the simulated activation limit of 500" in str(error)


def test_injected_oom_kills_an_idle_engine() -> None:
    async def scenario() -> SimEngine:
        sim = engine()
        await sim.start()
        sim.inject_oom("test")
        for _ in range(10):
            await asyncio.sleep(0)
        return sim

    assert run(scenario).is_dead


def test_abort_frees_the_blocks() -> None:
    async def scenario() -> SimEngine:
        sim = engine(step_time_s=0.001)
        await sim.start()
        stream = sim.generate("a", prompt(200), SamplingParams(max_tokens=500))
        await stream.__anext__()
        assert sim.stats().kv_cache_usage > 0
        await sim.abort("a")
        rest = [delta async for delta in stream]
        assert rest[-1].finish_reason == "abort"
        sim.check_invariants()
        return sim

    assert run(scenario).stats().kv_cache_usage == 0.0


def test_closing_the_stream_early_frees_the_blocks() -> None:
    async def scenario() -> SimEngine:
        sim = engine(step_time_s=0.001)
        await sim.start()
        stream = sim.generate("a", prompt(200), SamplingParams(max_tokens=500))
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
        sim.check_invariants()
        return sim

    assert run(scenario).stats().kv_cache_usage == 0.0


def test_stop_strings_end_the_answer_before_the_stop() -> None:
    async def scenario() -> list[GenerationDelta]:
        sim = engine()
        await sim.start()
        return await collect(sim, "a", 10, 400, stop=("。",), seed=3)

    deltas = run(scenario)
    text = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop"
    assert "。" not in text


def test_requests_the_engine_refuses() -> None:
    async def scenario() -> None:
        sim = engine(adapter_names=("manga",))
        await sim.start()
        with pytest.raises(EngineRequestError, match="more than max_model_len=1024"):
            await collect(sim, "a", 1025, 5)
        with pytest.raises(EngineRequestError, match="unknown LoRA adapter 'anime'"):
            async for _ in sim.generate("b", prompt(5), SamplingParams(max_tokens=2),
                                        AdapterRef("anime", 9, "/x")):
                pass

    run(scenario)


def test_at_most_max_loras_adapters_share_a_batch() -> None:
    async def scenario() -> int:
        names = ("a", "b", "c")
        sim = engine(adapter_names=names, max_loras=2, step_time_s=0.001, num_gpu_blocks=1024)
        await sim.start()
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len({r.adapter for r in sim._running}))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())

        async def one(index: int) -> None:
            adapter = AdapterRef(names[index % 3], index % 3 + 1, "/x")
            async for _ in sim.generate(f"r{index}", prompt(20), SamplingParams(max_tokens=10),
                                        adapter):
                pass

        await asyncio.gather(*(one(i) for i in range(9)))
        watcher.cancel()
        return peak

    assert run(scenario) <= 2


def test_step_latency_is_simulated() -> None:
    async def scenario() -> float:
        sim = engine(step_time_s=0.01)
        await sim.start()
        started = time.perf_counter()
        await collect(sim, "a", 10, 10)
        return time.perf_counter() - started

    assert run(scenario) >= 0.1


def test_a_pool_smaller_than_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one max_model_len=4096 sequence"):
        SimEngine(num_gpu_blocks=100, max_model_len=4096)


def test_a_repeated_prefix_is_served_from_the_prefix_cache_in_whole_blocks() -> None:
    async def scenario(prefix_caching: bool) -> list[int | None]:
        sim = engine(prefix_caching=prefix_caching)
        await sim.start()
        first = await collect(sim, "a", 100, 4)
        longer = await collect(sim, "b", 140, 4)  # the same first 100 tokens, and 40 more
        same = await collect(sim, "c", 96, 4)  # fully cached: the last token is still computed
        sim.check_invariants()
        return [first[0].cached_tokens, longer[0].cached_tokens, same[0].cached_tokens]

    assert run(lambda: scenario(True)) == [0, 96, 80]
    assert run(lambda: scenario(False)) == [0, 0, 0]
