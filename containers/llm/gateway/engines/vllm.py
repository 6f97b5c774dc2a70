"""The vLLM 0.33 engine behind the gateway: ``AsyncLLM`` in this process, its core in a child.

What this adapter owns (docs/design-decisions.md#vllm-asyncllm-api, vLLM 0.33):

* **Engine arguments** — ``AsyncEngineArgs`` from the container's ``ENGINE_*`` settings (the GPU
  budget's plan, set by the stack), with the model directory SageMaker unpacked to.
* **Start** — in a worker thread (weight loading, profiling and CUDA-graph capture take
  minutes; /ping must keep answering): first ``AsyncEngineArgs.create_engine_config`` (vLLM
  validates the arguments against the model: a refusal cannot heal and is never retried), then
  ``AsyncLLM.from_vllm_config``; an engine core that fails has its root cause read from its
  stderr and classified: a setting no retry changes fails once, the rest is retried
  (:mod:`gateway.engines.start_failure`). A vLLM that cannot be imported (a module missing, a
  shared library that does not load) cannot heal either. Before that, the model directory and
  the block size are checked
  (:mod:`gateway.engines.model_dir`; the block size against
  :data:`gpu_budget.engine_args.BLOCK_SIZE_MULTIPLE` for this device: vLLM finds a wrong one
  only inside the engine-core process, where the start fails with a generic "Engine core
  initialization failed", so it is checked here first and fails once, naming the setting). The
  KV pool the engine really got (``vllm_config.cache_config.num_gpu_blocks`` × ``block_size``)
  is what admission uses.
* **LoRA adapters** — registered up front with ``add_lora`` under the stable integer ids the
  router assigns (position in ``GATEWAY_ADAPTERS``, from 1); one that fails to load is reported
  in :meth:`VllmEngine.adapter_status` and the others keep serving. On vLLM's CPU platform the
  base model is served through an all-zero copy of an adapter: its pure-PyTorch LoRA ops read a
  base-model token's "no adapter" index (-1) as the *last* adapter slot, so a base-model request
  batched with adapter requests would get that adapter's weights (vllm-project/vllm#48421, open;
  the CUDA kernels skip -1). A zero adapter's delta is exactly zero, and no token carries -1.
* **Generation** — the gateway renders the prompt with the model's own tokenizer and chat
  template (checked against the engine tokenizer's, :mod:`gateway.rendering`) and passes the
  token ids (``TokensPrompt``), so what the context budget counted is
  exactly what the engine sees; deltas stream with ``RequestOutputKind.DELTA``. The sampling
  parameters are vLLM's own: the request's sampling fields go through vLLM's
  ``ChatCompletionRequest.to_sampling_params`` with the model's generation defaults
  (``model_config.get_diff_sampling_param()``), as vLLM's OpenAI server builds them, so
  structured outputs, logprobs, ``n`` and every sampling extension mean what they mean there and
  a vLLM upgrade brings its fixes. Each choice's deltas carry its index and, when asked for,
  its tokens' logprobs as vLLM's server reports them.
* **Errors** — ``EngineDeadError`` (the engine core died, e.g. a CUDA OOM in a step) becomes
  :class:`EngineDead`, or :class:`EngineOutOfMemory` when the cause was an out-of-memory error;
  ``torch.OutOfMemoryError`` raised in this process becomes :class:`EngineOutOfMemory`;
  ``VLLMValidationError`` / ``ValueError`` for one request becomes :class:`EngineRequestError`.
  There is no restart API: :meth:`shutdown` releases the dead engine and the gateway's
  supervisor builds a new :class:`VllmEngine` in the same process.
* **Stats** — a ``StatLoggerBase`` subclass registered through ``stat_loggers`` keeps the last
  ``SchedulerStats`` (KV usage, running, waiting) and counts preemptions.

Everything vLLM is reached through :class:`VllmApi`, so the tests replace vLLM's classes at this
one boundary and exercise the rest without a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.engines.base import (
    AdapterRef,
    AdapterUnavailable,
    ChatRenderer,
    EngineConfigError,
    EngineDead,
    EngineError,
    EngineOutOfMemory,
    EngineRequestError,
    EngineStats,
    FinishReason,
    GenerationDelta,
    KvCapacity,
    RenderedPrompt,
    SamplingParams,
    TokenLogprob,
    adapter_refs,
)
from gateway.engines.model_dir import check_model_dir
from gateway.engines.start_failure import (
    ENGINE_CORE_FAILED,
    StderrTail,
    cannot_heal,
    capture_stderr,
    is_library_load_error,
    root_cause,
)
from gateway.settings import Settings
from gpu_budget.engine_args import (
    BLOCK_SIZE_MULTIPLE,
    ENGINE_ARG,
    ENGINE_ARGS,
    block_sizes_for,
)
from serving_contract.environment import ENGINE_ENV_PREFIX

LOG = logging.getLogger("gateway.engines.vllm")

GATEWAY_SUPPLIED_FIELDS: tuple[str, ...] = (
    "model",
    "tokenizer",
    "served_model_name",
    "disable_log_stats",
    "enable_log_requests",
)
"""``EngineArgs`` fields the adapter fills from the gateway itself, not from ``ENGINE_*``."""

ENGINE_ARG_FIELDS: tuple[str, ...] = (
    *(arg.field for arg in ENGINE_ARGS),
    *GATEWAY_SUPPLIED_FIELDS,
)
"""Every ``EngineArgs`` field this adapter may set: one per row of the engine-argument table
(:data:`gpu_budget.engine_args.ENGINE_ARGS`) plus the gateway's own (checked against vLLM's
source by the tests)."""

ASYNC_LLM_MEMBERS: tuple[str, ...] = (
    "from_vllm_config",
    "generate",
    "abort",
    "add_lora",
    "shutdown",
    "get_tokenizer",
    "errored",
    "dead_error",
    "vllm_config",
    "model_config",
)
"""Every ``AsyncLLM`` member this adapter touches (checked against vLLM's source by the tests)."""

GENERATE_KEYWORDS: tuple[str, ...] = ("lora_request",)
"""Keyword arguments this adapter passes to ``AsyncLLM.generate`` besides the positional ones."""

SAMPLING_CONVERSION: tuple[str, ...] = ("model_validate", "to_sampling_params")
"""What the adapter calls on vLLM's ``ChatCompletionRequest`` (checked against vLLM's source)."""

LOGPROB_FLOOR = -9999.0
"""vLLM's server reports no log-probability below this."""

REQUEST_OUTPUT_FIELDS: tuple[str, ...] = ("outputs", "finished", "num_cached_tokens")
"""What the adapter reads from each ``RequestOutput`` (checked against vLLM's source)."""

OOM_MARKERS: tuple[str, ...] = ("out of memory", "outofmemoryerror", "cuda oom")

BASE_ADAPTER_NAME = "__base__"
"""The zero adapter the base model is served through on the CPU platform (see the docstring)."""
ZERO_ADAPTER_PLATFORMS: frozenset[str] = frozenset({"cpu"})
"""Platforms whose LoRA ops apply the last adapter to base-model tokens (vllm#48421)."""


def write_zero_adapter(source: Path, target: Path) -> None:
    """Copy the PEFT LoRA adapter in ``source`` to ``target`` with every weight zero."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = source / "adapter_model.safetensors"
    if not weights.is_file():
        raise EngineError(f"{weights}: no safetensors weights to derive the base adapter from")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "adapter_config.json", target / "adapter_config.json")
    save_file({name: torch.zeros_like(tensor) for name, tensor in load_file(str(weights)).items()},
              str(target / "adapter_model.safetensors"))


@dataclass(frozen=True)
class VllmApi:
    """The vLLM (and torch) names this adapter uses, imported at one place."""

    AsyncEngineArgs: Any
    AsyncLLM: Any
    ChatCompletionRequest: Any
    SamplingParams: Any
    RequestOutputKind: Any
    LoRARequest: Any
    TokensPrompt: Any
    StatLoggerBase: Any
    EngineDeadError: type[BaseException]
    ValidationErrors: tuple[type[BaseException], ...]
    OutOfMemoryErrors: tuple[type[BaseException], ...]
    device_type: str = "cuda"
    """``vllm.platforms.current_platform.device_type``: "cuda" in the image, "cpu" in tests."""


def load_vllm_api() -> VllmApi:
    """Import vLLM and torch: vLLM 0.33 on CUDA in the image, the CPU build in the test tier."""
    import torch
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMValidationError
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.metrics.loggers import StatLoggerBase

    return VllmApi(
        AsyncEngineArgs=AsyncEngineArgs,
        AsyncLLM=AsyncLLM,
        ChatCompletionRequest=ChatCompletionRequest,
        SamplingParams=SamplingParams,
        RequestOutputKind=RequestOutputKind,
        LoRARequest=LoRARequest,
        TokensPrompt=TokensPrompt,
        StatLoggerBase=StatLoggerBase,
        EngineDeadError=EngineDeadError,
        ValidationErrors=(VLLMValidationError,),
        OutOfMemoryErrors=(torch.OutOfMemoryError,),
        device_type=str(current_platform.device_type),
    )


def engine_arguments(settings: Settings) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments from the validated settings, one per row of the
    engine-argument table (under the row's vLLM field name) plus the gateway's own.

    Unset arguments (``num_gpu_blocks_override`` unless ``ENGINE_NUM_GPU_BLOCKS`` is set — an
    operator's escape hatch that replaces vLLM's own profiling) are left out; LoRA arguments
    only with adapters.
    """
    engine_settings = settings.engine
    gateway = settings.gateway
    lora_on = engine_settings.enable_lora and bool(gateway.adapters)
    args: dict[str, Any] = {
        "model": str(gateway.model_dir),
        "tokenizer": str(gateway.model_dir),
        "served_model_name": gateway.served_model_name,
        **{arg.field: getattr(engine_settings, arg.name) for arg in ENGINE_ARGS
           if lora_on or not arg.lora_only},
        "enable_lora": lora_on,
        "disable_log_stats": False,  # our stat logger needs the scheduler stats
        "enable_log_requests": False,  # prompts are customer data: never in the logs
    }
    return {name: value for name, value in args.items() if value is not None}


SERVER_SKIPS = ("disable_log_stats", "enable_log_requests")
"""The gateway's own logging choices among its engine arguments (vLLM's server keeps its own)."""


def server_flags(settings: Settings) -> list[str]:
    """vLLM's own OpenAI server with exactly the engine arguments the gateway gives vLLM
    (:func:`engine_arguments`), as its command-line flags; booleans as ``--x`` / ``--no-x``
    (vLLM's BooleanOptionalAction), the adapters as ``--lora-modules``. ``serve
    --vllm-server-args`` prints them (``make gpu-smoke`` compares the two servers with them)."""
    arguments = engine_arguments(settings)
    flags: list[str] = []
    for name, value in arguments.items():
        if name in SERVER_SKIPS:
            continue
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", str(value)]
    if arguments.get("enable_lora"):
        gateway = settings.gateway
        flags += ["--lora-modules", *(f"{adapter.name}={gateway.adapters_dir}/{adapter.directory}"
                                      for adapter in gateway.adapters)]
    return flags


@dataclass
class _SchedulerSnapshot:
    """What the stat logger last saw (written on the engine's output thread, read anywhere)."""

    kv_cache_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions_total: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def stat_logger_factory(api: VllmApi, snapshot: _SchedulerSnapshot) -> Callable[..., Any]:
    """A ``stat_loggers`` entry: builds a ``StatLoggerBase`` that fills ``snapshot``."""

    class GatewayStatLogger(api.StatLoggerBase):  # type: ignore[name-defined]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                snapshot.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
                snapshot.num_running = int(scheduler_stats.num_running_reqs)
                snapshot.num_waiting = int(scheduler_stats.num_waiting_reqs)
            if iteration_stats is not None:
                snapshot.num_preemptions_total += int(
                    getattr(iteration_stats, "num_preempted_reqs", 0)
                )

        def log_engine_initialized(self) -> None:
            return None

    def factory(vllm_config: Any, engine_index: int = 0) -> Any:
        return GatewayStatLogger(vllm_config, engine_index)

    return factory


def token_ids_of(rendered: Any) -> list[int]:
    """The token ids ``apply_chat_template(..., tokenize=True)`` returned.

    transformers 4 returns a list of ids; transformers 5 a ``BatchEncoding`` (a mapping with
    ``input_ids``). A batch of one (a list holding one list) is unwrapped.
    """
    if isinstance(rendered, Mapping) or hasattr(rendered, "input_ids"):
        rendered = rendered["input_ids"]
    ids = list(rendered)
    if len(ids) == 1 and isinstance(ids[0], list | tuple):
        ids = list(ids[0])
    return [int(token) for token in ids]


def _lap(phases: dict[str, float], phase: str, since: float) -> float:
    """Record ``phase`` as having taken the time since ``since``; the time now."""
    now = time.monotonic()
    phases[phase] = now - since
    return now


def _finish_reason(value: str | None) -> FinishReason | None:
    if value is None:
        return None
    if value in ("stop", "length", "abort"):
        return value  # type: ignore[return-value]
    return "stop"


def _is_oom(error: BaseException, api: VllmApi) -> bool:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, api.OutOfMemoryErrors):
            return True
        if any(marker in str(current).lower() for marker in OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


class VllmEngine:
    """:class:`~gateway.engines.base.InferenceEngine` on vLLM's ``AsyncLLM``."""

    name = "vllm"

    def __init__(
        self,
        settings: Settings,
        *,
        adapters: Sequence[AdapterRef] = (),
        api_loader: Callable[[], VllmApi] = load_vllm_api,
        run_blocking: Callable[..., Any] | None = None,
        zero_adapter_writer: Callable[[Path, Path], None] = write_zero_adapter,
        stderr_capture: Callable[[], AbstractContextManager[StderrTail]] = capture_stderr,
    ) -> None:
        self._settings = settings
        self._arguments = engine_arguments(settings)
        check_model_dir(settings.gateway.model_dir,
                        max_model_len=settings.engine.max_model_len)
        self._adapters = tuple(adapters)
        self._api_loader = api_loader
        self._run_blocking = run_blocking or asyncio.to_thread
        self._api: VllmApi | None = None
        self._engine: Any = None
        self._capacity: KvCapacity | None = None
        self._snapshot = _SchedulerSnapshot()
        self._dead: EngineDead | None = None
        self._adapter_status: dict[str, str] = {a.name: "not loaded" for a in self._adapters}
        self._lora_requests: dict[str, Any] = {}
        self._default_sampling: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._write_zero_adapter = zero_adapter_writer
        self._base_lora_request: Any = None
        self._base_adapter_dir: Path | None = None
        self._phases: dict[str, float] = {}
        self._stderr_capture = stderr_capture

    @property
    def arguments(self) -> Mapping[str, Any]:
        """The ``AsyncEngineArgs`` keyword arguments this engine starts with."""
        return dict(self._arguments)

    async def start(self) -> None:
        """Build ``AsyncLLM`` off the event loop, read its KV pool, register the adapters.

        What cannot heal fails with :class:`EngineConfigError`, which is never retried (exit
        2): vLLM that cannot be imported (a module missing, a shared library that does not
        load), an engine configuration vLLM refuses (every argument validated against the
        model; a block size the platform cannot use), and an engine core that failed on a
        setting no retry changes (its root cause read from its stderr and classified by
        :mod:`gateway.engines.start_failure`: a KV cache that cannot hold one max_model_len
        request, a KV space larger than the device). Everything else about the engine itself
        (weights, free memory, an out-of-memory error, the core process killed) fails with
        EngineError or EngineOutOfMemory, which the supervisor retries.
        """
        phases = self._phases
        phases.clear()
        mark = time.monotonic()
        try:
            api = self._api = await self._run_blocking(self._api_loader)
        except (ImportError, OSError) as error:
            if isinstance(error, OSError) and not is_library_load_error(error):
                raise EngineError(f"vLLM failed to import: {type(error).__name__}: {error}") \
                    from error
            # cannot heal by retrying: a module missing, a shared library that does not load
            raise EngineConfigError(
                f"vLLM cannot be imported in this image: {type(error).__name__}: {error}") \
                from error
        mark = _lap(phases, "vllm_import", mark)
        self._check_block_size(api)
        engine_args = api.AsyncEngineArgs(**self._arguments)
        try:
            vllm_config = await self._run_blocking(engine_args.create_engine_config)
        except BaseException as error:
            if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
                raise
            raise self._config_error(error) from error
        mark = _lap(phases, "engine_config", mark)
        with self._stderr_capture() as tail:  # the engine core's stderr: its root cause
            try:
                self._engine = await self._run_blocking(
                    api.AsyncLLM.from_vllm_config,
                    vllm_config,
                    stat_loggers=[stat_logger_factory(api, self._snapshot)],
                    enable_log_requests=False,  # prompts are customer data: never in the logs
                    disable_log_stats=False,  # our stat logger needs the scheduler stats
                )
            except BaseException as error:
                if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
                    raise
                raise self._core_start_error(error, api, tail) from error
        mark = _lap(phases, "engine_core", mark)
        cache = self._engine.vllm_config.cache_config
        if not cache.num_gpu_blocks:
            raise EngineError("vLLM started without a KV cache (cache_config.num_gpu_blocks=0)")
        self._capacity = KvCapacity(num_blocks=int(cache.num_gpu_blocks),
                                    block_size=int(cache.block_size))
        # The model's generation defaults, as vLLM's server applies them (max_tokens is ours).
        defaults = self._engine.model_config.get_diff_sampling_param()
        self._default_sampling = {k: v for k, v in defaults.items() if k != "max_tokens"}
        self._tokenizer = self._engine.get_tokenizer()
        LOG.info("vLLM engine started: %d KV blocks of %d tokens", cache.num_gpu_blocks,
                 cache.block_size)
        await self._register_adapters(api)
        if api.device_type in ZERO_ADAPTER_PLATFORMS and self._lora_requests:
            await self._register_base_adapter(api)
        _lap(phases, "adapters", mark)

    def start_phases(self) -> dict[str, float]:
        """Seconds of each phase of the last :meth:`start`: ``vllm_import`` (torch and vLLM),
        ``engine_config`` (vLLM validates the arguments against the model), ``engine_core``
        (``AsyncLLM.from_vllm_config``: the engine-core process's spawn, weight load, KV-cache
        profiling and allocation, torch.compile and CUDA-graph capture unless eager — vLLM's
        own log lines split it further), ``adapters`` (LoRA registration)."""
        return dict(self._phases)

    async def _register_base_adapter(self, api: VllmApi) -> None:
        """Serve the base model through a zero copy of a loaded adapter (see the docstring)."""
        source = next(iter(self._lora_requests.values()))
        target = Path(tempfile.mkdtemp(prefix="mangaassist-base-adapter-"))
        self._base_adapter_dir = target
        await self._run_blocking(self._write_zero_adapter, Path(source.lora_path), target)
        request = api.LoRARequest(lora_name=BASE_ADAPTER_NAME,
                                  lora_int_id=max(a.int_id for a in self._adapters) + 1,
                                  lora_path=str(target))
        if await self._engine.add_lora(request) is False:
            raise EngineError("vLLM refused the zero base adapter")
        self._base_lora_request = request
        LOG.warning("vLLM on %s: base-model requests run through a zero-weight LoRA adapter "
                    "(vllm-project/vllm#48421: the %s LoRA ops apply the last adapter to "
                    "base-model tokens)", api.device_type, api.device_type)

    def _check_block_size(self, api: VllmApi) -> None:
        multiple = BLOCK_SIZE_MULTIPLE.get(api.device_type)
        block_size = self._settings.engine.block_size
        if multiple is not None and block_size % multiple:
            accepted = ", ".join(map(str, block_sizes_for(api.device_type)))
            setting = ENGINE_ARG["block_size"].env
            raise EngineConfigError(
                f"{setting}={block_size}: the {api.device_type} attention backend needs a "
                f"multiple of {multiple}; accepted: {accepted}", setting=setting)

    def _core_start_error(self, error: BaseException, api: VllmApi,
                          tail: StderrTail) -> EngineError:
        """What ``AsyncLLM.from_vllm_config`` raised, as the supervisor must treat it.

        When the engine core failed (vLLM's "Engine core initialization failed"), its own root
        cause is read from its stderr and classified (:mod:`gateway.engines.start_failure`): one
        that cannot heal is an EngineConfigError (never retried, exit 2); otherwise
        EngineOutOfMemory or EngineError (retried), with the root cause in the message.
        """
        cause = root_cause(tail.text()) if ENGINE_CORE_FAILED in str(error) else None
        verdict = cannot_heal(cause)
        if verdict is not None:
            setting = verdict.setting or ""
            value = self._arguments.get(setting.removeprefix(ENGINE_ENV_PREFIX).lower(),
                                        os.environ.get(setting, ""))
            named = f"{setting}={value}: " if setting else ""
            return EngineConfigError(f"{named}vLLM's engine core refused the settings: "
                                     f"{verdict.why}: {(cause or '')[:400]}",
                                     setting=verdict.setting)
        detail = f" (root cause: {cause[:300]})" if cause else ""
        if _is_oom(error, api) or any(marker in (cause or "").lower() for marker in OOM_MARKERS):
            return EngineOutOfMemory(f"vLLM ran out of GPU memory while starting: {error}{detail}")
        return EngineError(f"vLLM failed to start: {type(error).__name__}: {error}{detail}")

    def _config_error(self, error: BaseException) -> EngineConfigError:
        """vLLM's refusal of the configuration, on one line, naming our setting when it can."""
        message = " ".join(str(error).split()) or type(error).__name__
        names = sorted((name for name in self._arguments if name in message),
                       key=message.index)
        if names:
            setting = f"{ENGINE_ENV_PREFIX}{names[0].upper()}"
            value = self._arguments[names[0]]
            return EngineConfigError(f"{setting}={value}: vLLM refused it: {message[:400]}",
                                     setting=setting)
        return EngineConfigError(f"vLLM refused the engine settings (ENGINE_*): "
                                 f"{type(error).__name__}: {message[:400]}")

    async def _register_adapters(self, api: VllmApi) -> None:
        for adapter in self._adapters:
            request = api.LoRARequest(lora_name=adapter.name, lora_int_id=adapter.int_id,
                                      lora_path=adapter.path)
            try:
                loaded = await self._engine.add_lora(request)
            except Exception as error:  # one broken adapter must not stop the others
                self._adapter_status[adapter.name] = f"failed: {type(error).__name__}: {error}"
                LOG.error("LoRA adapter %s (id %d, %s) failed to load: %s", adapter.name,
                          adapter.int_id, adapter.path, error)
                continue
            if loaded is False:
                self._adapter_status[adapter.name] = "failed: add_lora returned False"
                continue
            self._adapter_status[adapter.name] = "loaded"
            self._lora_requests[adapter.name] = request

    def adapter_status(self) -> dict[str, str]:
        """``{adapter name: "loaded" | "failed: <reason>" | "not loaded"}``."""
        return dict(self._adapter_status)

    def chat_renderer(self) -> ChatRenderer:
        """The engine tokenizer's ``apply_chat_template`` (what vLLM's own OpenAI server sends),
        bound to the tokenizer object so that it outlives this engine."""
        if self._engine is None:
            raise EngineError("the vLLM engine has not been started")
        tokenizer = self._engine.get_tokenizer()

        def render(messages: Sequence[Mapping[str, str]]) -> list[int]:
            rendered = tokenizer.apply_chat_template([dict(message) for message in messages],
                                                     tokenize=True, add_generation_prompt=True)
            return token_ids_of(rendered)

        return render

    async def generate(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        adapter: AdapterRef | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        """Stream deltas for one request, translating vLLM's errors into ours."""
        api, async_llm = self._require_running()
        lora_request = self._base_lora_request
        if adapter is not None:
            lora_request = self._lora_requests.get(adapter.name)
            if lora_request is None:
                status = self._adapter_status.get(adapter.name, "not configured")
                raise AdapterUnavailable(f"adapter {adapter.name!r} is not available ({status})")
        sampling = self._sampling_params(api, params)
        engine_prompt = api.TokensPrompt(prompt_token_ids=list(prompt.token_ids))
        try:
            async for output in async_llm.generate(engine_prompt, sampling, request_id,
                                                   lora_request=lora_request):
                for completion in output.outputs:
                    yield GenerationDelta(
                        text=completion.text,
                        token_ids=tuple(completion.token_ids),
                        finish_reason=_finish_reason(completion.finish_reason),
                        cached_tokens=output.num_cached_tokens,
                        choice=int(completion.index),
                        logprobs=self._token_logprobs(completion.token_ids,
                                                      completion.logprobs),
                    )
        except api.EngineDeadError as error:
            raise self._died(error) from error
        except api.OutOfMemoryErrors as error:
            raise self._died(error) from error
        except api.ValidationErrors as error:
            raise self._refused(str(error), params) from error
        except ValueError as error:  # vLLM raises plain ValueError for some bad requests
            if async_llm.errored:
                raise self._died(error) from error
            raise self._refused(str(error), params) from error

    @staticmethod
    def _refused(message: str, params: SamplingParams) -> EngineRequestError:
        """vLLM's refusal of one request, naming the field at fault when it can: one it names,
        or ``response_format`` for a grammar vLLM could not build from the schema."""
        text = " ".join(message.split())[:500]
        lowered = text.lower()
        if params.response_format is not None and any(
                word in lowered for word in ("grammar", "schema", "json")):
            return EngineRequestError(f"response_format: the engine cannot build a grammar "
                                      f"from this JSON schema: {text}", param="response_format")
        named = [name for name in sorted(params.request_fields, key=len, reverse=True)
                 if re.search(rf"\b{re.escape(name)}\b", text)]
        return EngineRequestError(text, param=named[0] if named else None)

    def _sampling_params(self, api: VllmApi, params: SamplingParams) -> Any:
        """vLLM's own ``SamplingParams`` for the request's sampling fields (vLLM's server's
        conversion, with the model's defaults); EngineRequestError when vLLM refuses them."""
        body = {"model": self._settings.gateway.served_model_name, "stream": True,
                "messages": [{"role": "user", "content": ""}], **params.request_fields}
        refusals: tuple[type[BaseException], ...] = (ValueError, *api.ValidationErrors)
        try:
            request = api.ChatCompletionRequest.model_validate(body)
            return request.to_sampling_params(params.max_tokens, self._default_sampling)
        except refusals as error:  # pydantic's ValidationError is a ValueError
            refused = self._refused(str(error), params)
            raise EngineRequestError(f"vLLM refused the sampling fields: {refused}",
                                     param=refused.param) from error

    def _token_logprobs(self, token_ids: Sequence[int], logprobs: Any
                        ) -> tuple[TokenLogprob, ...]:
        """Each new token's logprob and alternatives, as vLLM's server formats them: the
        engine's decoded token (or the tokenizer's decoding), in the engine's order."""
        if not logprobs:
            return ()
        decode = self._tokenizer.decode
        result = []
        for token_id, positions in zip(token_ids, logprobs, strict=False):
            sampled = positions.get(token_id) if positions else None
            if sampled is None:
                token = decode(token_id)
                result.append(TokenLogprob(token, LOGPROB_FLOOR,
                                           tuple(token.encode("utf-8", "replace"))))
                continue
            decoded = sampled.decoded_token
            top = tuple((lp.decoded_token if lp.decoded_token is not None else decode([tid]),
                         max(float(lp.logprob), LOGPROB_FLOOR))
                        for tid, lp in positions.items())
            result.append(TokenLogprob(
                decoded if decoded is not None else decode([token_id]),
                max(float(sampled.logprob), LOGPROB_FLOOR),
                tuple(decoded.encode("utf-8", "replace")) if decoded is not None else None, top))
        return tuple(result)

    def _require_running(self) -> tuple[VllmApi, Any]:
        if self._dead is not None:
            raise self._dead
        if self._engine is None or self._api is None:
            raise EngineError("the vLLM engine has not been started")
        if self._engine.errored:
            raise self._died(self._engine.dead_error)
        return self._api, self._engine

    def _died(self, error: BaseException | None) -> EngineDead:
        if self._dead is None:
            assert self._api is not None
            reason = f"{type(error).__name__}: {error}" if error is not None else "engine died"
            cause = error.__cause__ if error is not None else None
            if cause is not None:  # EngineDeadError wraps what really happened in the core
                reason += f" (caused by {type(cause).__name__}: {cause})"
            oom = error is not None and _is_oom(error, self._api)
            self._dead = (EngineOutOfMemory if oom else EngineDead)(f"vLLM engine died: {reason}")
        return self._dead

    async def abort(self, request_id: str) -> None:
        """Abort one request; harmless if it finished or the engine is dead."""
        if self._engine is None or self._dead is not None:
            return
        with contextlib.suppress(Exception):
            await self._engine.abort(request_id)

    def kv_capacity(self) -> KvCapacity:
        """The KV pool vLLM allocated."""
        if self._capacity is None:
            raise EngineError("the vLLM engine has not been started")
        return self._capacity

    def stats(self) -> EngineStats:
        """The stat logger's last view of the scheduler."""
        snap = self._snapshot
        return EngineStats(kv_cache_usage=snap.kv_cache_usage, num_running=snap.num_running,
                           num_waiting=snap.num_waiting,
                           num_preemptions_total=snap.num_preemptions_total,
                           extra=dict(snap.extra))

    @property
    def is_dead(self) -> bool:
        """True once the engine core has died (fail-stop)."""
        if self._dead is not None:
            return True
        if self._engine is not None and self._engine.errored:
            self._died(self._engine.dead_error)
            return True
        return False

    @property
    def dead_error(self) -> EngineDead | None:
        """The error that killed the engine."""
        return self._dead if self.is_dead else None

    async def shutdown(self) -> None:
        """Shut the engine (and its core process) down; safe on a dead engine, idempotent."""
        if self._base_adapter_dir is not None:
            shutil.rmtree(self._base_adapter_dir, ignore_errors=True)
            self._base_adapter_dir = None
        async_llm, self._engine = self._engine, None
        if async_llm is None:
            return
        try:
            await self._run_blocking(async_llm.shutdown)
        except Exception as error:  # a dead core may already be gone
            LOG.warning("vLLM shutdown raised %s: %s", type(error).__name__, error)
        await asyncio.sleep(0)  # the sockets' close, which shutdown scheduled on this loop
        release_zmq_context(async_llm)


def release_zmq_context(async_llm: Any) -> None:
    """Terminate the ZMQ context of a shut-down ``AsyncLLM``'s engine-core client.

    vLLM's shutdown closes the client's sockets but not the context it made for them
    (``MPClient.ctx``, ``zmq.Context(io_threads=2)``): its I/O and reaper threads, each with an
    epoll and an eventfd, outlive the engine: 3 threads and 7 descriptors more after each
    rebuild on the CPU build (tests/containers/llm/engine/test_faults.py counts them across
    three). Closing what is left with linger 0 and terminating it releases them; harmless when
    already done."""
    context = getattr(getattr(async_llm, "engine_core", None), "ctx", None)
    destroy = getattr(context, "destroy", None)
    if destroy is None:
        return
    try:
        destroy(linger=0)
    except Exception as error:  # never let cleanup fail a rebuild
        LOG.warning("closing vLLM's ZMQ context raised %s: %s", type(error).__name__, error)


def from_settings(settings: Settings) -> VllmEngine:
    """The ``--engine vllm`` builder."""
    refs = adapter_refs(settings.gateway.adapters, settings.gateway.adapters_dir)
    return VllmEngine(settings, adapters=tuple(refs.values()))
