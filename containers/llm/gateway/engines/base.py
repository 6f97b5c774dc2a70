"""The inference-engine interface the gateway drives, and the errors engines raise.

Two engines implement it: the vLLM ``AsyncLLM`` adapter (:mod:`gateway.engines.vllm`, the one the
image ships) and, on the test side, a simulated PagedAttention engine (tests/support/sim_engine.py,
for tests, benchmarks and ``make local``). The interface mirrors what the vLLM adapter offers
(docs/design-decisions.md#vllm-asyncllm-api, vLLM 0.33):

* ``start()`` builds the engine; ``kv_capacity()`` then reports the KV pool it really got
  (vLLM: ``cache_config.num_gpu_blocks`` × ``block_size``), which admission is sized from.
* ``generate()`` streams :class:`GenerationDelta` objects (text, token ids, finish reason) for a
  rendered prompt, sampling parameters and an optional LoRA adapter.
* An engine that dies (vLLM: the engine-core child process exits after a CUDA OOM) raises
  :class:`EngineDead` into every in-flight and every later call. There is no restart: the gateway
  builds a new engine. The vLLM adapter translates ``EngineDeadError`` and
  ``torch.OutOfMemoryError`` into :class:`EngineDead` / :class:`EngineOutOfMemory`, and vLLM's
  validation errors into :class:`EngineRequestError`.

Pure module: dataclasses and a Protocol, no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gateway.settings import AdapterSpec

FinishReason = Literal["stop", "length", "abort"]


class EngineError(Exception):
    """Base class of every error an engine raises through this interface."""


class EngineDead(EngineError):
    """The engine has died; this and every later call fails until the gateway rebuilds it."""


class EngineOutOfMemory(EngineDead):
    """The engine died because the accelerator ran out of memory (a CUDA OOM in a step)."""


class EngineConfigError(EngineError):
    """The engine cannot start with these settings, and retrying will not change that.

    ``setting`` names the variable (``ENGINE_BLOCK_SIZE``, ``GATEWAY_MODEL_DIR``, ...); the message
    names its value and what is accepted. The supervisor does not retry it: the gateway exits 2.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class EngineRequestError(EngineError):
    """The engine refused this one request (client-side problem); the engine itself is fine.

    ``param`` names the request field at fault when the engine's reason says which.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class AdapterUnavailable(EngineRequestError):
    """The request's LoRA adapter failed to load on this instance; the others still serve."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A chat conversation rendered with the model's chat template, and its token ids."""

    text: str
    token_ids: Sequence[int]

    @property
    def num_tokens(self) -> int:
        """Prompt length in the served model's tokens."""
        return len(self.token_ids)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request: ``max_tokens`` (the gateway's, from its window) and the
    request's sampling fields.

    ``request_fields`` holds them as the caller sent them (OpenAI's names and vLLM's
    extensions, :data:`gateway.api.openai_fields.SAMPLING_FIELDS`): an engine with its own
    conversion reads those (the vLLM adapter hands them to vLLM's ``to_sampling_params``). The
    typed fields are the same values read for engines that interpret them themselves (the
    simulator); None means "the model's default".
    """

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    logprobs: int | None = None
    """Alternatives per token to report (0-20) when the caller asked for logprobs, else None."""
    min_tokens: int = 0
    ignore_eos: bool = False
    response_format: str | None = None
    """``json_object`` or ``json_schema`` when the answer must be JSON; None for free text."""
    request_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter as the engine needs it (vLLM: ``LoRARequest(name, int_id, path)``)."""

    name: str
    int_id: int
    path: str


def adapter_refs(adapters: Sequence[AdapterSpec], adapters_dir: Path) -> dict[str, AdapterRef]:
    """Served name → :class:`AdapterRef`: ids are positions in GATEWAY_ADAPTERS from 1 (vLLM
    needs ``lora_int_id`` > 0 and the same id for the same adapter on every engine rebuild)."""
    return {
        spec.name: AdapterRef(name=spec.name, int_id=position,
                              path=str(adapters_dir / spec.directory))
        for position, spec in enumerate(adapters, start=1)
    }


class TokenLogprob(NamedTuple):
    """One generated token's log-probability and the alternatives the engine reported, in the
    engine's order (the sampled token's own entry included, as vLLM reports them)."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None
    top: tuple[tuple[str, float], ...] = ()


class GenerationDelta(NamedTuple):
    """New output of one choice since its previous delta; ``finish_reason`` is set on its last.

    (A NamedTuple: one is made per generated token, so it must be cheap.)
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None
    """Prompt tokens the engine took from its prefix cache instead of prefilling them (vLLM:
    ``RequestOutput.num_cached_tokens``); set once the prompt has been scheduled, None before."""
    choice: int = 0
    """Which of the request's ``n`` choices (0 to n - 1)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """One per token in ``token_ids`` when logprobs were asked for."""


@dataclass(frozen=True)
class KvCapacity:
    """The engine's real KV-cache pool: ``num_blocks`` blocks of ``block_size`` tokens."""

    num_blocks: int
    block_size: int

    @property
    def num_tokens(self) -> int:
        """Tokens the whole pool holds."""
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine scheduler (vLLM: SchedulerStats)."""

    kv_cache_usage: float
    """Share of KV blocks in use, 0-1 (vLLM ``kv_cache_usage``)."""
    num_running: int
    num_waiting: int
    num_preemptions_total: int
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class InferenceEngine(Protocol):
    """What the gateway needs from an engine. Implementations must be safe on one event loop."""

    name: str

    async def start(self) -> None:
        """Build the engine (load weights, size the KV pool). Raises EngineError on failure."""
        ...

    def generate(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        adapter: AdapterRef | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        """Stream deltas for one request. Raises EngineDead / EngineRequestError while iterating."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request (client went away); unknown ids are ignored."""
        ...

    def kv_capacity(self) -> KvCapacity:
        """The KV pool the started engine really has."""
        ...

    def stats(self) -> EngineStats:
        """Current scheduler statistics (cheap; never waits on the engine)."""
        ...

    @property
    def is_dead(self) -> bool:
        """True once the engine has died (fail-stop)."""
        ...

    @property
    def dead_error(self) -> EngineDead | None:
        """The error that killed the engine, if it is dead."""
        ...

    async def shutdown(self) -> None:
        """Release the engine's resources; safe to call on a dead engine and more than once."""
        ...


@runtime_checkable
class SupportsAdapterStatus(Protocol):
    """Engines that report, per LoRA adapter, whether it loaded (shown in /ping's body)."""

    def adapter_status(self) -> dict[str, str]:
        """``{adapter name: "loaded" | "failed: <reason>" | "not loaded"}``."""
        ...


ChatRenderer = Callable[[Sequence[Mapping[str, str]]], list[int]]
"""Token ids of a conversation (``[{"role", "content"}, ...]``) with the generation prompt."""


@runtime_checkable
class SupportsChatRendering(Protocol):
    """Engines that can render a conversation with their own tokenizer and chat template."""

    def chat_renderer(self) -> ChatRenderer:
        """The engine tokenizer's own rendering (``apply_chat_template`` with the generation
        prompt). The callable must keep working after the engine is shut down: the gateway may
        render every prompt with it when its own rendering differs (see gateway.rendering)."""
        ...


@runtime_checkable
class SupportsStartPhases(Protocol):
    """Engines that time the phases of their own start (logged on the ``start_phase`` line)."""

    def start_phases(self) -> Mapping[str, float]:
        """``{phase: seconds}`` of the last :meth:`InferenceEngine.start`, in start order."""
        ...


@runtime_checkable
class SupportsFaultInjection(Protocol):
    """Engines that can be told to die of an OOM on purpose (the simulator, in test mode)."""

    def inject_oom(self, reason: str = "injected") -> None:
        """Make the next engine step fail with an out-of-memory error."""
        ...
