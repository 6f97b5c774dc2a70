"""The vLLM adapter with vLLM's classes replaced by test doubles at the module boundary.

Everything but the GPU runs: argument mapping from the stack's environment, start-up in a worker
thread, the real KV pool handed to admission, LoRA registration (one adapter failing), delta
streaming, error translation, stats, and the supervisor rebuilding a dead engine in-process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gateway.engines import engine_builder
from gateway.engines.base import (
    AdapterRef,
    AdapterUnavailable,
    EngineDead,
    EngineError,
    EngineOutOfMemory,
    EngineRequestError,
    RenderedPrompt,
    SamplingParams,
)
from gateway.engines.vllm import VllmApi, VllmEngine, engine_arguments
from gateway.health import CrashLoopDetector, RestartPolicy
from gateway.routing import adapter_refs
from gateway.settings import load_settings
from gateway.supervisor import EngineSupervisor
from stacks.llm_endpoint import container_environment
from stacks.settings import load_settings as load_stack_settings


# --- doubles for vLLM's classes ---------------------------------------------------------------
class FakeEngineDeadError(Exception):
    pass


class FakeValidationError(Exception):
    pass


class FakeOutOfMemoryError(RuntimeError):
    pass


class FakeEngineArgs:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@dataclass
class FakeSamplingParams:
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] | None
    seed: int | None
    presence_penalty: float
    frequency_penalty: float
    output_kind: str


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class FakeCompletion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion]
    finished: bool


class FakeKinds:
    DELTA = "delta"


class FakeStatLoggerBase:
    pass


@dataclass
class FakeCacheConfig:
    num_gpu_blocks: int = 6144
    block_size: int = 16


@dataclass
class FakeVllmConfig:
    cache_config: FakeCacheConfig = field(default_factory=FakeCacheConfig)


class FakeAsyncLLM:
    """Records what the adapter asks of it; ``die(...)`` makes it behave like a dead core."""

    instances: ClassVar[list[FakeAsyncLLM]] = []
    broken_adapters: ClassVar[set[str]] = set()
    start_error: ClassVar[BaseException | None] = None

    def __init__(self, engine_args: FakeEngineArgs, stat_loggers: list[Any]) -> None:
        self.engine_args = engine_args
        self.stat_loggers = [factory(None, 0) for factory in stat_loggers]
        self.vllm_config = FakeVllmConfig()
        self.loras: list[FakeLoRARequest] = []
        self.calls: list[tuple[Any, ...]] = []
        self.errored = False
        self.dead_error: BaseException | None = None
        self.shut_down = False
        self.script: list[FakeOutput] = [
            FakeOutput([FakeCompletion("こんにちは", [11, 12], None)], False),
            FakeOutput([FakeCompletion(" world", [13], "stop")], True),
        ]
        self.raise_in_generate: BaseException | None = None

    @classmethod
    def from_engine_args(cls, engine_args: FakeEngineArgs, *,
                         stat_loggers: list[Any]) -> FakeAsyncLLM:
        if cls.start_error is not None:
            raise cls.start_error
        engine = cls(engine_args, stat_loggers)
        cls.instances.append(engine)
        return engine

    async def add_lora(self, request: FakeLoRARequest) -> bool:
        if request.lora_name in self.broken_adapters:
            raise ValueError(f"adapter_config.json missing in {request.lora_path}")
        self.loras.append(request)
        return True

    async def generate(self, prompt: dict[str, Any], sampling: FakeSamplingParams,
                       request_id: str, *, lora_request: FakeLoRARequest | None = None
                       ) -> AsyncIterator[FakeOutput]:
        self.calls.append((prompt, sampling, request_id, lora_request))
        if self.raise_in_generate is not None:
            raise self.raise_in_generate
        for output in self.script:
            yield output

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    def shutdown(self) -> None:
        self.shut_down = True

    def get_tokenizer(self) -> Any:
        class Tokenizer:
            def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool,
                                    add_generation_prompt: bool) -> list[int]:
                assert tokenize
                assert add_generation_prompt
                return [len(m["content"]) for m in messages]

        return Tokenizer()

    def die(self, cause: BaseException) -> None:
        error = FakeEngineDeadError("EngineCore encountered an issue")
        error.__cause__ = cause
        self.errored = True
        self.dead_error = error
        self.raise_in_generate = error


def fake_api() -> VllmApi:
    return VllmApi(
        AsyncEngineArgs=FakeEngineArgs,
        AsyncLLM=FakeAsyncLLM,
        SamplingParams=FakeSamplingParams,
        RequestOutputKind=FakeKinds,
        LoRARequest=FakeLoRARequest,
        TokensPrompt=lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids},
        StatLoggerBase=FakeStatLoggerBase,
        EngineDeadError=FakeEngineDeadError,
        ValidationErrors=(FakeValidationError,),
        OutOfMemoryErrors=(FakeOutOfMemoryError,),
    )


@pytest.fixture(autouse=True)
def _reset_fakes() -> None:
    FakeAsyncLLM.instances = []
    FakeAsyncLLM.broken_adapters = set()
    FakeAsyncLLM.start_error = None


def stack_environment(environment: str = "prod") -> dict[str, str]:
    settings = load_stack_settings(environment)
    return container_environment(settings.llm, settings.llm.memory_plan(),
                                 endpoint_name="manga-assist-prod-llm", variant_name="AllTraffic")


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    return load_settings({**stack_environment(), "GATEWAY_MODEL_DIR": str(tmp_path)})


blocking_calls: list[str] = []


async def run_inline(function: Any, *args: Any, **kwargs: Any) -> Any:
    blocking_calls.append(getattr(function, "__name__", repr(function)))
    return function(*args, **kwargs)


def make_engine(settings: Any) -> VllmEngine:
    refs = adapter_refs(settings.gateway.adapters, settings.gateway.adapters_dir)
    return VllmEngine(settings, adapters=tuple(refs.values()), api_loader=fake_api,
                      run_blocking=run_inline)


PROMPT = RenderedPrompt(text="<|begin_of_text|>hi", token_ids=(128000, 6151))
PARAMS = SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, stop=("\n\n",), seed=7)


async def collect(engine: VllmEngine, adapter: AdapterRef | None = None) -> list[Any]:
    return [delta async for delta in engine.generate("req-1", PROMPT, PARAMS, adapter)]


# --- argument mapping ---------------------------------------------------------------------------
def test_engine_arguments_are_the_stacks_plan(settings: Any, tmp_path: Path) -> None:
    plan = load_stack_settings("prod").llm.memory_plan().engine_args()
    args = engine_arguments(settings)
    for name in ("max_model_len", "gpu_memory_utilization", "max_num_seqs",
                 "max_num_batched_tokens", "block_size", "kv_cache_dtype", "quantization",
                 "tensor_parallel_size", "max_loras", "max_lora_rank", "max_cpu_loras"):
        assert args[name] == plan[name], name
    assert args["enable_lora"] is True
    assert args["enable_prefix_caching"] is True
    assert args["enforce_eager"] is False
    assert args["model"] == args["tokenizer"] == str(tmp_path)
    assert args["enable_log_requests"] is False, "prompts are customer data"
    assert "num_gpu_blocks_override" not in args, "vLLM profiles the pool unless told otherwise"
    assert "max_num_queued_reqs" not in args  # None is not passed


def test_engine_arguments_without_adapters_turn_lora_off(tmp_path: Path) -> None:
    env = {**stack_environment(), "GATEWAY_MODEL_DIR": str(tmp_path), "GATEWAY_ADAPTERS": "",
           "GATEWAY_ROUTING_TABLE": "", "GATEWAY_LOCALE_ROUTES": ""}
    args = engine_arguments(load_settings(env))
    assert args["enable_lora"] is False
    assert not {"max_loras", "max_lora_rank", "max_cpu_loras"} & set(args)


def test_the_registry_builds_a_vllm_engine(settings: Any) -> None:
    engine = engine_builder("vllm")(settings)
    assert isinstance(engine, VllmEngine)
    assert engine.adapter_status() == {"manga": "not loaded", "support": "not loaded",
                                       "manga-ja": "not loaded"}


# --- start, KV capacity, adapters --------------------------------------------------------------
def test_start_builds_off_the_event_loop_and_reports_the_real_pool(settings: Any) -> None:
    blocking_calls.clear()
    engine = make_engine(settings)
    asyncio.run(engine.start())
    (llm,) = FakeAsyncLLM.instances
    assert blocking_calls == ["from_engine_args"]
    assert llm.engine_args.kwargs == engine_arguments(settings)
    assert len(llm.stat_loggers) == 1
    capacity = engine.kv_capacity()
    assert (capacity.num_blocks, capacity.block_size, capacity.num_tokens) == (6144, 16, 98304)


def test_adapters_get_stable_ids_and_a_broken_one_does_not_stop_the_others(
    settings: Any,
) -> None:
    FakeAsyncLLM.broken_adapters = {"support"}
    engine = make_engine(settings)
    asyncio.run(engine.start())
    (llm,) = FakeAsyncLLM.instances
    adapters_dir = Path("/opt/ml/model/adapters")  # GATEWAY_ADAPTERS_DIR from the stack
    assert settings.gateway.adapters_dir == adapters_dir
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in llm.loras] == [
        ("manga", 1, str(adapters_dir / "manga_domain")),
        ("manga-ja", 3, str(adapters_dir / "jp_translation")),
    ]
    status = engine.adapter_status()
    assert status["manga"] == status["manga-ja"] == "loaded"
    assert status["support"].startswith("failed: ValueError: adapter_config.json missing")
    refs = adapter_refs(settings.gateway.adapters, settings.gateway.adapters_dir)
    with pytest.raises(AdapterUnavailable, match="adapter 'support' is not available"):
        asyncio.run(collect(engine, refs["support"]))
    deltas = asyncio.run(collect(engine, refs["manga"]))
    assert deltas[-1].finish_reason == "stop"
    assert llm.calls[-1][3].lora_name == "manga"


# --- generation -------------------------------------------------------------------------------
def test_generate_streams_deltas_from_token_ids(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    deltas = asyncio.run(collect(engine))
    assert [(d.text, d.token_ids, d.finish_reason) for d in deltas] == [
        ("こんにちは", (11, 12), None), (" world", (13,), "stop")]
    prompt, sampling, request_id, lora = FakeAsyncLLM.instances[0].calls[-1]
    assert prompt == {"prompt_token_ids": [128000, 6151]}, "the gateway's exact tokens"
    assert request_id == "req-1"
    assert lora is None
    assert sampling == FakeSamplingParams(max_tokens=32, temperature=0.7, top_p=0.9,
                                          stop=["\n\n"], seed=7, presence_penalty=0.0,
                                          frequency_penalty=0.0, output_kind="delta")


def test_an_oom_in_the_engine_core_is_engine_out_of_memory(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    llm = FakeAsyncLLM.instances[0]
    llm.die(FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 1.98 GiB"))
    with pytest.raises(EngineOutOfMemory, match="out of memory"):
        asyncio.run(collect(engine))
    assert engine.is_dead
    assert isinstance(engine.dead_error, EngineOutOfMemory)
    with pytest.raises(EngineOutOfMemory):  # every later call fails the same way
        asyncio.run(collect(engine))


def test_a_dead_core_without_oom_is_engine_dead(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    FakeAsyncLLM.instances[0].die(RuntimeError("NCCL error"))
    with pytest.raises(EngineDead) as info:
        asyncio.run(collect(engine))
    assert not isinstance(info.value, EngineOutOfMemory)
    asyncio.run(engine.abort("req-1"))  # harmless on a dead engine


def test_the_engine_noticed_dead_without_a_request(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    assert not engine.is_dead
    FakeAsyncLLM.instances[0].die(FakeOutOfMemoryError("CUDA out of memory"))
    assert engine.is_dead
    assert isinstance(engine.dead_error, EngineOutOfMemory)


def test_in_process_oom_and_bad_requests(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    llm = FakeAsyncLLM.instances[0]
    llm.raise_in_generate = FakeValidationError("prompt is longer than max_model_len")
    with pytest.raises(EngineRequestError, match="longer than max_model_len"):
        asyncio.run(collect(engine))
    assert not engine.is_dead
    llm.raise_in_generate = FakeOutOfMemoryError("CUDA out of memory in sampler")
    with pytest.raises(EngineOutOfMemory):
        asyncio.run(collect(engine))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FakeOutOfMemoryError("CUDA out of memory"), EngineOutOfMemory),
        (RuntimeError("weights not found"), EngineError),
    ],
)
def test_start_failures_are_translated(settings: Any, error: BaseException,
                                       expected: type[Exception]) -> None:
    FakeAsyncLLM.start_error = error
    with pytest.raises(expected):
        asyncio.run(make_engine(settings).start())


def test_without_vllm_installed_start_says_so(settings: Any) -> None:
    def missing() -> VllmApi:
        raise ImportError("No module named 'vllm'")

    engine = VllmEngine(settings, api_loader=missing)
    with pytest.raises(EngineError, match="vLLM is not installed in this image"):
        asyncio.run(engine.start())


def test_stats_come_from_the_stat_logger(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    logger = FakeAsyncLLM.instances[0].stat_loggers[0]

    @dataclass
    class Scheduler:
        kv_cache_usage: float
        num_running_reqs: int
        num_waiting_reqs: int

    @dataclass
    class Iteration:
        num_preempted_reqs: int

    logger.record(Scheduler(0.42, 17, 3), Iteration(2))
    logger.record(Scheduler(0.5, 18, 1), Iteration(1), None, 0)
    stats = engine.stats()
    assert (stats.kv_cache_usage, stats.num_running, stats.num_waiting,
            stats.num_preemptions_total) == (0.5, 18, 1, 3)
    logger.log_engine_initialized()


# --- recovery -----------------------------------------------------------------------------------
def test_the_supervisor_rebuilds_a_dead_vllm_engine_in_process(settings: Any) -> None:
    deaths: list[EngineDead] = []
    ready: list[int] = []

    async def no_sleep(_: float) -> None:
        return None

    async def scenario() -> None:
        supervisor = EngineSupervisor(
            lambda: make_engine(settings),
            restart=RestartPolicy(max_attempts=3, backoff_s=0.01, backoff_max_s=0.01),
            crash_loop=CrashLoopDetector(deaths=3, window_s=600),
            on_death=lambda generation, error: deaths.append(error),
            on_ready=lambda generation, engine: ready.append(generation),
            log=lambda *args, **kwargs: None, sleep=no_sleep, watch_interval_s=0.01,
        )
        first = await supervisor.start()
        assert isinstance(first, VllmEngine)
        FakeAsyncLLM.instances[0].die(FakeOutOfMemoryError("CUDA out of memory"))
        with pytest.raises(EngineOutOfMemory) as info:
            await collect(first)
        assert supervisor.report_death(supervisor.generation, info.value)
        second = await supervisor.wait_ready(timeout_s=5)
        assert second is not None
        assert second is not first
        assert [d.text for d in await collect(second)] == ["こんにちは", " world"]
        await supervisor.close()

    asyncio.run(scenario())
    old, new = FakeAsyncLLM.instances
    assert old.shut_down, "the dead engine is shut down before the new one starts"
    assert new.shut_down  # closed at the end
    assert len(new.loras) == 3, "adapters are registered again on the new engine"
    assert len(deaths) == 1
    assert isinstance(deaths[0], EngineOutOfMemory)
    assert len(ready) == 2


def test_render_chat_uses_the_engine_tokenizers_template(settings: Any) -> None:
    engine = make_engine(settings)
    with pytest.raises(EngineError, match="not been started"):
        engine.render_chat([{"role": "user", "content": "hi"}])
    asyncio.run(engine.start())
    assert engine.render_chat([{"role": "system", "content": "abc"},
                               {"role": "user", "content": "hello"}]) == [3, 5]
