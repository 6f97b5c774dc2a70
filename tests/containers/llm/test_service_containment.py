"""Containment in the request path (in-process, fake engines): every engine failure becomes a
fallback or a 4xx, the KV reservation is always returned, and a death trips the breaker once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.api.chat_run import FinishEvent, TextEvent
from gateway.api.errors import ApiError
from gateway.app import GatewayRuntime
from gateway.engines.base import (
    AdapterRef,
    EngineDead,
    EngineOutOfMemory,
    EngineRequestError,
    EngineStats,
    GenerationDelta,
    KvCapacity,
    RenderedPrompt,
    SamplingParams,
)
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer
from tests.containers.llm.harness import chat_request, make_settings, new_record


class ScriptedEngine:
    """An engine whose generate() yields two deltas and then does what ``failure`` says."""

    name = "scripted"

    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure
        self.dead: EngineDead | None = None

    async def start(self) -> None:
        return None

    async def _stream(self) -> AsyncIterator[GenerationDelta]:
        yield GenerationDelta(" hello", (1,))
        yield GenerationDelta(" world", (2,))
        if self.failure is not None:
            if isinstance(self.failure, EngineDead):
                self.dead = self.failure
            raise self.failure
        yield GenerationDelta("", (3,), "stop")

    def generate(self, request_id: str, prompt: RenderedPrompt, params: SamplingParams,
                 adapter: AdapterRef | None = None) -> AsyncIterator[GenerationDelta]:
        return self._stream()

    async def abort(self, request_id: str) -> None:
        return None

    def kv_capacity(self) -> KvCapacity:
        return KvCapacity(num_blocks=4096, block_size=16)

    def stats(self) -> EngineStats:
        return EngineStats(0.0, 0, 0, 0)

    @property
    def is_dead(self) -> bool:
        return self.dead is not None

    @property
    def dead_error(self) -> EngineDead | None:
        return self.dead

    async def shutdown(self) -> None:
        return None


def runtime_with(demo_model_dir: Path, chat_tokenizer: ChatTokenizer,
                 failures: list[BaseException | None]) -> tuple[GatewayRuntime, list[str]]:
    settings = make_settings(demo_model_dir, GATEWAY_ENGINE_RESTART_BACKOFF_S="0")
    lines: list[str] = []
    script = iter(failures)
    runtime = GatewayRuntime(
        settings, tokenizer=chat_tokenizer,
        engine_factory=lambda: ScriptedEngine(next(script, None)),
        telemetry=Telemetry(endpoint_name="t", variant_name="v", sink=lines.append),
    )
    return runtime, lines


async def answer(runtime: GatewayRuntime) -> list[TextEvent | FinishEvent]:
    request = chat_request(messages=[{"role": "user", "content": "Naruto?"}], max_tokens=8)
    prepared = runtime.service.prepare(request, new_record())
    admission = await runtime.service.admit(prepared)
    return [event async for event in runtime.service.run(prepared, admission)]


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (EngineOutOfMemory("CUDA out of memory"), "engine_out_of_memory"),
        (EngineDead("engine core died"), "engine_dead"),
        (RuntimeError("an adapter bug"), "engine_error"),
    ],
)
def test_engine_failures_become_fallbacks(demo_model_dir: Path, chat_tokenizer: ChatTokenizer,
                                          failure: BaseException, reason: str) -> None:
    runtime, lines = runtime_with(demo_model_dir, chat_tokenizer, [failure])

    async def scenario() -> list[TextEvent | FinishEvent]:
        await runtime.supervisor.start()
        events = await answer(runtime)
        if isinstance(failure, EngineDead):
            assert await runtime.supervisor.wait_ready(5.0) is not None  # rebuilt
        await runtime.supervisor.close()
        return events

    events = asyncio.run(scenario())
    finish = events[-1]
    assert isinstance(finish, FinishEvent)
    assert finish.fallback is not None
    assert finish.fallback["reason"] == reason
    assert finish.fallback_text is not None
    assert finish.fallback_text.startswith("I need to start a fresh context")
    assert runtime.admission.ledger.reserved_blocks == 0  # the reservation came back
    trips = [line for line in lines if "OOMCircuitTrips" in line]
    assert len(trips) == (1 if isinstance(failure, EngineDead) else 0)
    assert runtime.breaker.trips == len(trips)


def test_engine_refusal_is_a_400(demo_model_dir: Path, chat_tokenizer: ChatTokenizer) -> None:
    runtime, _ = runtime_with(demo_model_dir, chat_tokenizer,
                              [EngineRequestError("prompt too long")])

    async def scenario() -> ApiError:
        await runtime.supervisor.start()
        with pytest.raises(ApiError) as caught:
            await answer(runtime)
        await runtime.supervisor.close()
        return caught.value

    error = asyncio.run(scenario())
    assert error.status == 400
    assert "prompt too long" in error.message
    assert runtime.admission.ledger.reserved_blocks == 0


def test_successes_are_counted_and_reservations_returned(demo_model_dir: Path,
                                                         chat_tokenizer: ChatTokenizer) -> None:
    runtime, _ = runtime_with(demo_model_dir, chat_tokenizer, [None])

    async def scenario() -> list[Any]:
        await runtime.supervisor.start()
        events = await answer(runtime)
        await runtime.supervisor.close()
        return events

    events = asyncio.run(scenario())
    assert [e.text for e in events if isinstance(e, TextEvent)] == [" hello", " world"]
    assert events[-1] == FinishEvent("stop", finish_reasons={0: "stop"})
    assert runtime.admission.ledger.total_inflight == 0
