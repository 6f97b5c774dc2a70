"""The vLLM adapter with vLLM's classes replaced by test doubles at the module boundary.

Everything but the GPU runs: argument mapping from the stack's environment, start-up in a worker
thread, the real KV pool handed to admission, LoRA registration (one adapter failing), delta
streaming, error translation, stats, and the supervisor rebuilding a dead engine in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gateway.engines import engine_builder
from gateway.engines.base import (
    AdapterRef,
    AdapterUnavailable,
    EngineConfigError,
    EngineDead,
    EngineError,
    EngineOutOfMemory,
    EngineRequestError,
    RenderedPrompt,
    SamplingParams,
    TokenLogprob,
    adapter_refs,
)
from gateway.engines.vllm import (
    BLOCK_SIZE_MULTIPLE,
    VllmApi,
    VllmEngine,
    engine_arguments,
    server_flags,
    token_ids_of,
    write_zero_adapter,
)
from gateway.health import CrashLoopDetector, RestartPolicy
from gateway.main import run
from gateway.settings import load_settings
from gateway.supervisor import EngineStartFailed, EngineSupervisor
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
    config_error: ClassVar[BaseException | None] = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def create_engine_config(self) -> FakeVllmConfig:
        if self.config_error is not None:
            raise self.config_error
        return FakeVllmConfig(engine_args=self)


@dataclass
class FakeSamplingParams:
    """What vLLM's ``to_sampling_params`` was given (the fake does not convert)."""

    max_tokens: int
    fields: dict[str, Any]
    defaults: dict[str, Any]
    output_kind: str


class FakeChatCompletionRequest:
    """vLLM's ``ChatCompletionRequest``: validates a body, converts it to sampling params."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    @classmethod
    def model_validate(cls, body: dict[str, Any]) -> FakeChatCompletionRequest:
        if body.get("top_logprobs", 0) > 20:
            raise FakeValidationError("top_logprobs must be at most 20")
        return cls(body)

    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict[str, Any]
                           ) -> FakeSamplingParams:
        fields = {k: v for k, v in self.body.items() if k not in ("model", "messages", "stream")}
        return FakeSamplingParams(max_tokens, fields, dict(default_sampling_params),
                                  "delta" if self.body.get("stream") else "final_only")


@dataclass
class FakeLogprob:
    logprob: float
    decoded_token: str | None


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
    index: int = 0
    logprobs: list[dict[int, FakeLogprob]] | None = None


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion]
    finished: bool
    num_cached_tokens: int | None = None


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
    engine_args: FakeEngineArgs | None = None
    cache_config: FakeCacheConfig = field(default_factory=FakeCacheConfig)


class FakeModelConfig:
    """The model's generation config (vLLM: ``get_diff_sampling_param``)."""

    def get_diff_sampling_param(self) -> dict[str, Any]:
        return {"temperature": 0.6, "top_p": 0.9, "max_tokens": 256}


class FakeAsyncLLM:
    """Records what the adapter asks of it; ``die(...)`` makes it behave like a dead core."""

    instances: ClassVar[list[FakeAsyncLLM]] = []
    broken_adapters: ClassVar[set[str]] = set()
    start_error: ClassVar[BaseException | None] = None

    def __init__(self, engine_args: FakeEngineArgs, stat_loggers: list[Any]) -> None:
        self.engine_args = engine_args
        self.stat_loggers = [factory(None, 0) for factory in stat_loggers]
        self.vllm_config = FakeVllmConfig()
        self.model_config = FakeModelConfig()
        self.loras: list[FakeLoRARequest] = []
        self.calls: list[tuple[Any, ...]] = []
        self.errored = False
        self.dead_error: BaseException | None = None
        self.shut_down = False
        self.script: list[FakeOutput] = [
            FakeOutput([FakeCompletion("こんにちは", [11, 12], None)], False, 32),
            FakeOutput([FakeCompletion(" world", [13], "stop")], True, 32),
        ]
        self.raise_in_generate: BaseException | None = None

    @classmethod
    def from_vllm_config(cls, vllm_config: FakeVllmConfig, *, stat_loggers: list[Any],
                         enable_log_requests: bool, disable_log_stats: bool) -> FakeAsyncLLM:
        assert vllm_config.engine_args is not None
        assert enable_log_requests is False
        assert disable_log_stats is False
        if cls.start_error is not None:
            raise cls.start_error
        engine = cls(vllm_config.engine_args, stat_loggers)
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
            """transformers 5: ``tokenize=True`` returns a BatchEncoding (a mapping)."""

            def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool,
                                    add_generation_prompt: bool) -> dict[str, list[int]]:
                assert tokenize
                assert add_generation_prompt
                return {"input_ids": [len(m["content"]) for m in messages],
                        "attention_mask": [1] * len(messages)}

            def decode(self, token_ids: int | list[int]) -> str:
                ids = [token_ids] if isinstance(token_ids, int) else token_ids
                return "".join(f"<{token_id}>" for token_id in ids)

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
        ChatCompletionRequest=FakeChatCompletionRequest,
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
    FakeEngineArgs.config_error = None


def stack_environment(environment: str = "prod") -> dict[str, str]:
    settings = load_stack_settings(environment)
    return container_environment(settings.llm, settings.llm.capacity_plan(),
                                 endpoint_name="manga-assist-prod-llm", variant_name="AllTraffic")


def write_model_dir(path: Path, max_position_embeddings: int = 8192) -> Path:
    """What the adapter checks before starting vLLM: config.json and a weight file."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "max_position_embeddings": max_position_embeddings}), encoding="utf-8")
    (path / "model.safetensors").write_bytes(b"weights")
    return path


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    return load_settings({**stack_environment(),
                          "GATEWAY_MODEL_DIR": str(write_model_dir(tmp_path))})


blocking_calls: list[str] = []


async def run_inline(function: Any, *args: Any, **kwargs: Any) -> Any:
    blocking_calls.append(getattr(function, "__name__", repr(function)))
    return function(*args, **kwargs)


def make_engine(settings: Any) -> VllmEngine:
    refs = adapter_refs(settings.gateway.adapters, settings.gateway.adapters_dir)
    return VllmEngine(settings, adapters=tuple(refs.values()), api_loader=fake_api,
                      run_blocking=run_inline)


PROMPT = RenderedPrompt(text="<|begin_of_text|>hi", token_ids=(128000, 6151))
PARAMS = SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, stop=("\n\n",), seed=7,
                        request_fields={"temperature": 0.7, "top_p": 0.9, "stop": "\n\n",
                                        "seed": 7})


async def collect(engine: VllmEngine, adapter: AdapterRef | None = None, *,
                  params: SamplingParams = PARAMS) -> list[Any]:
    return [delta async for delta in engine.generate("req-1", PROMPT, params, adapter)]


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


def test_vllms_server_gets_the_gateways_engine_settings(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``serve --vllm-server-args`` (make gpu-smoke's comparison): exactly the engine arguments
    the gateway gives vLLM (its settings' defaults included: block size, sequences, prefix
    caching), as vLLM's server flags, one a line."""
    environ = {
        "GATEWAY_MODEL_DIR": "/m", "GATEWAY_SERVED_MODEL_NAME": "smoke-base",
        "GATEWAY_ADAPTERS": "smoke=smoke", "GATEWAY_ROUTING_TABLE": "recommendation=smoke",
        "GATEWAY_LOCALE_ROUTES": "",
        "ENGINE_MAX_MODEL_LEN": "8192", "ENGINE_LOAD_FORMAT": "dummy",
        "ENGINE_ENFORCE_EAGER": "true", "ENGINE_ATTENTION_BACKEND": "TRITON_ATTN",
        "ENGINE_ENABLE_LORA": "true", "ENGINE_MAX_LORAS": "1", "ENGINE_MAX_LORA_RANK": "8",
        "ENGINE_ENABLE_PREFIX_CACHING": "false"}
    for name in [name for name in os.environ if name.startswith(("GATEWAY_", "ENGINE_"))]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert run(["serve", "--vllm-server-args"]) == 0
    args = capsys.readouterr().out.splitlines()
    assert args == server_flags(load_settings(environ))
    assert args == ["--model", "/m", "--tokenizer", "/m", "--served-model-name", "smoke-base",
                    "--max-model-len", "8192", "--block-size", "16", "--max-num-seqs", "128",
                    "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.84",
                    "--max-loras", "1", "--max-lora-rank", "8", "--enable-lora",
                    "--tensor-parallel-size", "1", "--dtype", "auto", "--kv-cache-dtype", "auto",
                    "--no-enable-prefix-caching", "--enforce-eager", "--load-format", "dummy",
                    "--attention-backend", "TRITON_ATTN", "--lora-modules",
                    "smoke=/m/adapters/smoke"]


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
    # vLLM's import too: torch and vLLM take seconds to import, /ping must keep answering.
    assert blocking_calls == ["fake_api", "create_engine_config", "from_vllm_config"]
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
    assert [d.cached_tokens for d in deltas] == [32, 32]  # vLLM's num_cached_tokens
    prompt, sampling, request_id, lora = FakeAsyncLLM.instances[0].calls[-1]
    assert prompt == {"prompt_token_ids": [128000, 6151]}, "the gateway's exact tokens"
    assert request_id == "req-1"
    assert lora is None
    # vLLM's own conversion: the request's fields as sent, the gateway's max_tokens, the
    # model's generation defaults (not its max_tokens), streamed deltas.
    assert sampling == FakeSamplingParams(
        max_tokens=32, fields={"temperature": 0.7, "top_p": 0.9, "stop": "\n\n", "seed": 7},
        defaults={"temperature": 0.6, "top_p": 0.9}, output_kind="delta")


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
    with pytest.raises(EngineConfigError,
                       match="vLLM cannot be imported in this image: ImportError: No module"):
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


def test_the_chat_renderer_is_the_engine_tokenizers_template(settings: Any) -> None:
    engine = make_engine(settings)
    with pytest.raises(EngineError, match="not been started"):
        engine.chat_renderer()
    asyncio.run(engine.start())
    render = engine.chat_renderer()
    asyncio.run(engine.shutdown())
    # transformers 5 answers with a BatchEncoding; the ids are its input_ids, and the renderer
    # keeps working after the engine is gone (the gateway may render every prompt with it).
    assert render([{"role": "system", "content": "abc"},
                   {"role": "user", "content": "hello"}]) == [3, 5]


@pytest.mark.parametrize("rendered", [
    [1, 2, 3], (1, 2, 3), {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}, [[1, 2, 3]],
])
def test_token_ids_of_every_shape_apply_chat_template_returns(rendered: Any) -> None:
    assert token_ids_of(rendered) == [1, 2, 3]


def test_token_ids_of_a_real_transformers_batch_encoding(demo_model_dir: Path) -> None:
    """The start-up check's bug, on the real tokenizer: transformers 5 returns a BatchEncoding,
    whose list() is its two keys."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    messages = [{"role": "user", "content": "鬼滅の刃に似たマンガは？"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert len(list(rendered)) == 2, "list() of a BatchEncoding is its keys, not the ids"
    assert token_ids_of(rendered) == tokenizer.encode(text, add_special_tokens=False)


# --- start-up errors that cannot heal -----------------------------------------------------------
def test_a_setting_vllm_refuses_is_a_config_error_naming_it(settings: Any) -> None:
    FakeEngineArgs.config_error = ValueError(
        "User-specified max_model_len (4096) is greater than the derived max_model_len\n"
        "(max_position_embeddings=2048 in model's config.json).")
    with pytest.raises(EngineConfigError) as info:
        asyncio.run(make_engine(settings).start())
    assert info.value.setting == "ENGINE_MAX_MODEL_LEN"
    assert str(info.value).startswith("ENGINE_MAX_MODEL_LEN=4096: vLLM refused it: User-specified")
    assert "\n" not in str(info.value)
    assert not FakeAsyncLLM.instances, "the engine is not started on a refused configuration"


def test_a_block_size_the_platform_cannot_use_is_refused_before_vllm_starts(
        tmp_path: Path) -> None:
    env = {**stack_environment(), "GATEWAY_MODEL_DIR": str(write_model_dir(tmp_path)),
           "ENGINE_BLOCK_SIZE": "16"}
    engine = VllmEngine(load_settings(env), api_loader=lambda: replace(fake_api(),
                                                                       device_type="cpu"))
    with pytest.raises(EngineConfigError, match=r"ENGINE_BLOCK_SIZE=16: the cpu attention "
                                                r"backend needs a multiple of 32; accepted: 32"):
        asyncio.run(engine.start())
    assert BLOCK_SIZE_MULTIPLE == {"cuda": 16, "cpu": 32}
    # the same setting is fine on the image's CUDA backend
    asyncio.run(VllmEngine(load_settings(env), api_loader=fake_api,
                           run_blocking=run_inline).start())


@pytest.mark.parametrize(("files", "max_positions", "expected"), [
    ({}, 8192, "GATEWAY_MODEL_DIR=.*no config.json there"),
    ({"config.json": "{"}, 8192, "GATEWAY_MODEL_DIR=.*config.json is not readable JSON"),
    ({"config.json": "{}"}, 8192, "GATEWAY_MODEL_DIR=.*no weight files there"),
    ({"config.json": "{}", "model.safetensors.index.json":
      '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}'}, 8192,
     "1 weight shard.*missing: model-00001-of-00002.safetensors"),
    (None, 2048, r"ENGINE_MAX_MODEL_LEN=4096: above the model's position limit of 2048 tokens"
                 r".*accepted: at most 2048"),
])
def test_the_model_directory_is_checked_when_the_engine_is_built(
        tmp_path: Path, files: dict[str, str] | None, max_positions: int, expected: str) -> None:
    if files is None:
        write_model_dir(tmp_path, max_position_embeddings=max_positions)
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    env = {**stack_environment(), "GATEWAY_MODEL_DIR": str(tmp_path)}
    with pytest.raises(EngineConfigError, match=expected):
        VllmEngine(load_settings(env), api_loader=fake_api)


def test_rope_scaling_leaves_the_length_check_to_vllm(tmp_path: Path) -> None:
    write_model_dir(tmp_path, max_position_embeddings=2048)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**stack_environment(), "GATEWAY_MODEL_DIR": str(tmp_path)}
    VllmEngine(load_settings(env), api_loader=fake_api)  # 4096 may fit 4 x 2048: vLLM decides


def test_the_supervisor_does_not_retry_a_config_error(settings: Any) -> None:
    FakeEngineArgs.config_error = ValueError("max_num_batched_tokens (2) is smaller than "
                                             "max_model_len")
    attempts: list[int] = []

    def factory() -> VllmEngine:
        attempts.append(1)
        return make_engine(settings)

    async def no_sleep(_: float) -> None:
        return None

    async def scenario() -> None:
        supervisor = EngineSupervisor(
            factory, restart=RestartPolicy(max_attempts=5, backoff_s=0.01, backoff_max_s=0.01),
            crash_loop=CrashLoopDetector(deaths=3, window_s=600),
            on_death=lambda generation, error: None, on_ready=lambda generation, engine: None,
            log=lambda *args, **kwargs: None, sleep=no_sleep)
        with pytest.raises(EngineStartFailed) as info:
            await supervisor.start()
        assert info.value.config_error is not None
        assert info.value.config_error.setting == "ENGINE_MAX_NUM_BATCHED_TOKENS"
        assert supervisor.failure_reason is not None
        assert supervisor.failure_reason.startswith("ENGINE_MAX_NUM_BATCHED_TOKENS=")

    asyncio.run(scenario())
    assert len(attempts) == 1


def test_a_retried_start_shows_its_last_error_until_it_succeeds(settings: Any) -> None:
    FakeAsyncLLM.start_error = RuntimeError("Engine core initialization failed")
    seen: list[str | None] = []

    async def sleep_and_heal(_: float) -> None:
        seen.append(supervisor.last_start_error)
        FakeAsyncLLM.start_error = None

    supervisor = EngineSupervisor(
        lambda: make_engine(settings),
        restart=RestartPolicy(max_attempts=3, backoff_s=0.01, backoff_max_s=0.01),
        crash_loop=CrashLoopDetector(deaths=3, window_s=600),
        on_death=lambda generation, error: None, on_ready=lambda generation, engine: None,
        log=lambda *args, **kwargs: None, sleep=sleep_and_heal)

    async def scenario() -> None:
        await supervisor.start()
        await supervisor.close()

    asyncio.run(scenario())
    assert seen == ["attempt 1/3 failed: EngineError: vLLM failed to start: RuntimeError: "
                    "Engine core initialization failed"]
    assert supervisor.last_start_error is None


def test_each_choice_and_its_logprobs_come_as_vllms_server_reports_them(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    FakeAsyncLLM.instances[0].script = [FakeOutput([
        FakeCompletion("ab", [11, 12], None, index=0, logprobs=[
            {11: FakeLogprob(-0.5, "a"), 7: FakeLogprob(-1.5, "z")},
            {12: FakeLogprob(-1e9, None)}]),  # no decoded token: the tokenizer's decoding
        FakeCompletion("c", [13], "length", index=1, logprobs=[{9: FakeLogprob(-2.0, "q")}]),
    ], False), FakeOutput([FakeCompletion("", [], "stop", index=0)], True)]
    deltas = asyncio.run(collect(engine))
    assert [(d.choice, d.text, d.finish_reason) for d in deltas] == [
        (0, "ab", None), (1, "c", "length"), (0, "", "stop")]
    first, second = deltas[0].logprobs
    assert first == TokenLogprob("a", -0.5, tuple(b"a"), (("a", -0.5), ("z", -1.5)))
    assert second == TokenLogprob("<12>", -9999.0, None, (("<12>", -9999.0),))
    # A sampled token missing from its position's logprobs: decoded, no logprob (vLLM's -9999).
    assert deltas[1].logprobs == (TokenLogprob("<13>", -9999.0, tuple(b"<13>")),)


def test_sampling_fields_vllm_refuses_are_the_callers_error(settings: Any) -> None:
    engine = make_engine(settings)
    asyncio.run(engine.start())
    params = SamplingParams(max_tokens=8, logprobs=21,
                            request_fields={"logprobs": True, "top_logprobs": 21})
    with pytest.raises(EngineRequestError, match="vLLM refused the sampling fields: "
                                                 "top_logprobs must be at most 20") as caught:
        asyncio.run(collect(engine, params=params))
    assert caught.value.param == "top_logprobs"


def test_on_the_cpu_platform_the_base_model_runs_through_a_zero_adapter(
        settings: Any, tmp_path: Path) -> None:
    """vllm-project/vllm#48421: the CPU LoRA ops give base-model tokens the last adapter's
    weights, so there the base model is served through a zero copy of a loaded adapter; on
    CUDA it runs without one."""
    written: list[tuple[Path, Path]] = []

    def cpu_api() -> VllmApi:
        return dataclasses.replace(fake_api(), device_type="cpu")

    refs = adapter_refs(settings.gateway.adapters, settings.gateway.adapters_dir)
    cpu_settings = load_settings({**stack_environment(), "ENGINE_BLOCK_SIZE": "32",
                                  "GATEWAY_MODEL_DIR": str(settings.gateway.model_dir)})
    cpu = VllmEngine(cpu_settings, adapters=tuple(refs.values()), api_loader=cpu_api,
                     run_blocking=run_inline,
                     zero_adapter_writer=lambda source, target: written.append((source, target)))
    asyncio.run(cpu.start())
    asyncio.run(collect(cpu))
    base = FakeAsyncLLM.instances[-1].calls[-1][3]
    assert base.lora_name == "__base__"
    assert base.lora_int_id == max(ref.int_id for ref in refs.values()) + 1
    assert written == [(Path(FakeAsyncLLM.instances[-1].loras[0].lora_path),
                        Path(base.lora_path))]
    assert "__base__" not in cpu.adapter_status()
    asyncio.run(cpu.shutdown())
    assert not Path(base.lora_path).exists()

    cuda = make_engine(settings)
    asyncio.run(cuda.start())
    asyncio.run(collect(cuda))
    assert FakeAsyncLLM.instances[-1].calls[-1][3] is None


def test_the_zero_adapter_has_the_adapters_shape_and_no_weight(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    source = tmp_path / "manga"
    source.mkdir()
    (source / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj"]}')
    weights = {"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(8, 16),
               "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(16, 8)}
    save_file(weights, str(source / "adapter_model.safetensors"))
    write_zero_adapter(source, tmp_path / "zero")
    zero = load_file(str(tmp_path / "zero" / "adapter_model.safetensors"))
    assert {name: tensor.shape for name, tensor in zero.items()} == {
        name: tensor.shape for name, tensor in weights.items()}
    assert all(not tensor.any() for tensor in zero.values())
    assert (tmp_path / "zero" / "adapter_config.json").read_text() == (
        source / "adapter_config.json").read_text()
    with pytest.raises(EngineError, match="no safetensors weights"):
        write_zero_adapter(tmp_path / "nothing", tmp_path / "zero2")


class FakeTail:
    """What the engine core left on stderr, as :class:`StderrTail` would keep it."""

    def __init__(self, text: str) -> None:
        self._text = text

    def text(self, settle_s: float = 0.0) -> str:
        return self._text


def engine_whose_core_printed(settings: Any, stderr: str) -> VllmEngine:
    """An engine whose core fails to start after printing ``stderr``."""
    FakeAsyncLLM.start_error = RuntimeError(
        "Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore': 1}")

    @contextlib.contextmanager
    def capture() -> Iterator[Any]:
        yield FakeTail(stderr)

    return VllmEngine(settings, api_loader=fake_api, run_blocking=run_inline,
                      stderr_capture=capture)


def core_traceback(line: str) -> str:
    return (f"Process EngineCore:\nTraceback (most recent call last):\n  File \"core.py\", "
            f"line 1, in run_engine_core\n{line}\n")


def test_an_engine_core_that_cannot_hold_one_request_is_a_config_error(settings: Any) -> None:
    cause = ("ValueError: To serve at least one request with the model's max seq len (8192), "
             "(1.00 GiB KV cache is needed, which is larger than the available KV cache memory "
             "(0.50 GiB).")
    engine = engine_whose_core_printed(settings, core_traceback(cause))
    with pytest.raises(EngineConfigError) as info:
        asyncio.run(engine.start())
    assert info.value.setting == "ENGINE_MAX_MODEL_LEN"
    assert str(info.value).startswith(
        f"ENGINE_MAX_MODEL_LEN={settings.engine.max_model_len}: vLLM's engine core refused the "
        f"settings: the KV cache the settings leave cannot hold one max_model_len request: "
        f"{cause}")


@pytest.mark.parametrize(("stderr", "expected"), [
    (core_traceback("ValueError: Free memory on device cuda:0 (10.2/22.1 GiB) on startup is "
                    "less than desired GPU memory utilization (0.9, 19.9 GiB)."), EngineError),
    (core_traceback("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
     EngineOutOfMemory),
    ("", EngineError),  # no root cause on stderr (a core killed by a signal): retried as before
])
def test_an_engine_core_failure_that_may_heal_is_left_to_the_retries(
        settings: Any, stderr: str, expected: type[Exception]) -> None:
    with pytest.raises(EngineError) as info:
        asyncio.run(engine_whose_core_printed(settings, stderr).start())
    assert type(info.value) is expected
    if stderr:
        assert "(root cause: " in str(info.value)


@pytest.mark.parametrize(("error", "expected"), [
    (OSError("libcuda.so.1: cannot open shared object file: No such file or directory"),
     EngineConfigError),
    (OSError(5, "Input/output error"), EngineError),
])
def test_an_os_error_importing_vllm_fails_at_once_only_for_a_library(
        settings: Any, error: OSError, expected: type[Exception]) -> None:
    def broken() -> VllmApi:
        raise error

    with pytest.raises(EngineError) as info:
        asyncio.run(VllmEngine(settings, api_loader=broken).start())
    assert type(info.value) is expected
