"""A simulated PagedAttention engine: vLLM's memory behaviour without a GPU (test support).

It never ships: the LLM image carries only the vLLM engine. Tests, benchmarks and ``make local``
start the gateway with it registered (:mod:`tests.support.sim_serve`, ``--engine sim``) or pass
it to :class:`gateway.app.GatewayRuntime` as the engine factory; its own knobs are ``SIM_*``
variables (:data:`SIM_SETTING_SPECS`), which the gateway's settings never see.

Its output text is generated, not meaningful; its behaviour under memory pressure is the point:

* **Block accounting.** A fixed pool of ``num_gpu_blocks`` KV blocks of ``block_size`` tokens (16,
  as vLLM). A request holds ``ceil(computed_tokens / block_size)`` blocks from a free list and
  takes a new block only when its sequence crosses a block boundary; nothing is pre-allocated for
  ``max_tokens``. Finished and aborted requests return their blocks at once.
* **Continuous batching.** Each step schedules running requests first (one decode token each, or
  the rest of a chunked prefill), then admits waiting requests first-come-first-served while the
  step's token budget (``max_num_batched_tokens``), ``max_num_seqs``, ``max_loras`` and free blocks
  allow. Requests join and leave the batch at every step.
* **Prefix caching** (``enable_prefix_caching``, as vLLM). Each full block of a prompt is hashed
  with everything before it (and the adapter); once a prompt has been computed its blocks' hashes
  are kept, least recently used first out, up to the pool's size. A request admitted later skips
  the prefill of its longest cached prefix (never the last token) and reports it as
  ``cached_tokens``. Unlike vLLM it does not share the cached blocks between requests: each
  request still holds its own, so memory pressure is if anything overstated.
* **Preemption with recompute.** When a running request needs a block and none is free, the most
  recently admitted running request is preempted: its blocks are freed and it goes back to the
  front of the queue to recompute its prompt *and* the tokens it already produced (vLLM v1).
* **Latency.** A step costs ``step_time_s + token_time_s × scheduled tokens`` of wall time
  (``asyncio.sleep``; zero for benchmarks and soak tests, in which case up to 16 steps run
  between two event-loop turns).
* **First-use cost** (``first_use_s``, like a cold GPU host's kernel compiles): the first step
  that prefills a prompt of a new length class (its bit length: 1, 2-3, 4-7, ... tokens) or a
  request of a new adapter takes ``first_use_s`` longer for each such novelty, once per engine.
  Like vLLM's compile cache, the shapes it has "compiled" are kept in ``VLLM_CACHE_ROOT``
  (``sim_compile_cache.json``) when that variable is set at :meth:`SimEngine.start`, and a shape
  found there costs nothing: the stand-in the start cache's tests check (vLLM's real cache needs
  a compiling engine, docs/develop.md#the-start-cache).
* **Request fields** (:data:`SIM_FIELD_SUPPORT`): ``n`` runs one sequence per choice (more
  than one with temperature 0 is refused, as vLLM refuses greedy sampling of several choices),
  ``logprobs`` reports each sampled word's probability under its uniform choice, ``min_tokens``,
  ``ignore_eos``, ``stop`` and ``seed`` act as in vLLM; the distribution controls (temperature,
  top_p, top_k, min_p, penalties) have nothing to shape in a uniform choice and are accepted
  without effect; a JSON ``response_format`` is refused, naming it — the simulator cannot
  constrain text.
* **OOM injection.** At a step count, at a batched-token threshold, or on :meth:`inject_oom` (the
  gateway exposes that only in test mode). The engine then dies exactly as vLLM's does when its
  engine-core process hits a CUDA OOM: every in-flight request gets :class:`EngineOutOfMemory`,
  every later call :class:`EngineDead`, and nothing restarts it. Step and threshold triggers apply
  to every engine built with them (a persistent fault, i.e. a crash loop); an injected OOM kills
  only the engine it was sent to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import zlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.engines.base import (
    AdapterRef,
    AdapterUnavailable,
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
)
from gateway.settings import Settings

# Words the simulator "generates": manga-shop vocabulary in both languages. Token ids are
# arbitrary but stable (the position in this tuple plus an offset clear of special tokens).
_OUTPUT_WORDS: tuple[str, ...] = (
    " manga", " volume", " chapter", " edition", " series", " recommend", " author", " artist",
    " shonen", " seinen", " fantasy", " adventure", " release", " preorder", " shipping",
    " available", " Japanese", " English", " deluxe", " box set", " One Piece", " Frieren",
    " Naruto", " Berserk", ".", ",", " and", " the", " is", " for", " with", " new",
    "マンガ", "巻", "作品", "おすすめ", "発売", "予約", "配送", "在庫", "です", "。", "、",
    "ワンピース", "進撃の巨人", "呪術廻戦", "鬼滅の刃", "の", "は", "が",
)
_OUTPUT_TOKEN_ID_OFFSET = 1000
_WORD_LOGPROB = -math.log(len(_OUTPUT_WORDS))
"""Every word is equally likely: its log-probability."""
_GREEDY = 1e-5
"""A temperature below this is greedy sampling (vLLM's ``_SAMPLING_EPS``)."""

SIM_FIELD_SUPPORT: dict[str, str] = {
    "n": "honoured: one simulated sequence per choice; with temperature 0 (greedy) refused "
         "like vLLM refuses it, naming n",
    "logprobs": "honoured: each word's probability under the simulator's uniform choice",
    "top_logprobs": "honoured: that many other words, equally likely",
    "min_tokens": "honoured", "ignore_eos": "honoured", "stop": "honoured", "seed": "honoured",
    "temperature": "no effect: the simulator's choice is uniform",
    "top_p": "no effect: the simulator's choice is uniform",
    "top_k": "no effect: the simulator's choice is uniform",
    "min_p": "no effect: the simulator's choice is uniform",
    "presence_penalty": "no effect: the simulator's choice is uniform",
    "frequency_penalty": "no effect: the simulator's choice is uniform",
    "repetition_penalty": "no effect: the simulator's choice is uniform",
    "response_format": "refused for json_object / json_schema: the simulator cannot constrain "
                       "its text (run the vLLM engine); `text` is the default",
}
"""What the simulator does with each sampling field a request may carry."""
# A zero-time step has nothing to wait for, so the simulator runs this many of them between
# event-loop turns (requests join and leave at these turns; deltas reach consumers in batches,
# as vLLM's output processor also batches them). Any step with a duration yields every time.
_ZERO_TIME_STEPS_PER_YIELD = 16


@dataclass(eq=False)
class _SimRequest:
    request_id: str
    prompt_len: int
    params: SamplingParams
    adapter: str | None
    rng: random.Random
    outbox: deque[GenerationDelta | BaseException] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    finished: bool = False
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the prompt's full blocks (the prefix-cache keys)."""
    cached_tokens: int | None = None
    """Prompt tokens taken from the prefix cache at first admission; None before it."""
    choice: int = 0

    num_tokens: int = 0
    """Prompt plus generated tokens (kept in step with output_ids)."""

    def eos_drawn(self, probability: float) -> bool:
        """Whether the simulated model emits end-of-sequence now (never with ``ignore_eos``, nor
        before ``min_tokens`` tokens came ahead of it, as vLLM: its end-of-sequence is a token)."""
        if self.params.ignore_eos or len(self.output_ids) <= self.params.min_tokens:
            return False
        return probability > 0.0 and self.rng.random() < probability

    def deliver(self, item: GenerationDelta | BaseException) -> None:
        """Hand a delta (or the error that ends the request) to the consumer."""
        self.outbox.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_item(self) -> GenerationDelta | BaseException:
        """Everything the engine produced since the last call, merged into one delta.

        A consumer slower than the engine gets one delta for several tokens, as with vLLM's
        DELTA output kind; an error is returned on its own once the deltas before it are out.
        """
        while not self.outbox:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        first = self.outbox.popleft()
        if isinstance(first, BaseException) or not self.outbox:
            return first
        texts = [first.text]
        token_ids = list(first.token_ids)
        logprobs = list(first.logprobs)
        finish = first.finish_reason
        while self.outbox and finish is None and not isinstance(self.outbox[0], BaseException):
            delta = self.outbox.popleft()
            assert isinstance(delta, GenerationDelta)
            texts.append(delta.text)
            token_ids.extend(delta.token_ids)
            logprobs.extend(delta.logprobs)
            finish = delta.finish_reason
        return GenerationDelta("".join(texts), tuple(token_ids), finish, first.cached_tokens,
                               first.choice, tuple(logprobs))


class SimEngine:
    """The simulated engine (see the module docstring). Implements ``InferenceEngine``."""

    name = "sim"

    def __init__(
        self,
        *,
        num_gpu_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 128,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 4096,
        max_loras: int = 4,
        adapter_names: Iterable[str] = (),
        step_time_s: float = 0.0,
        token_time_s: float = 0.0,
        startup_time_s: float = 0.0,
        first_use_s: float = 0.0,
        oom_at_step: int | None = None,
        oom_batched_tokens: int | None = None,
        eos_probability: float = 0.0,
        seed: int = 0,
        prefix_caching: bool = True,
    ) -> None:
        problems = []
        for label, value in (("num_gpu_blocks", num_gpu_blocks), ("block_size", block_size),
                             ("max_num_seqs", max_num_seqs),
                             ("max_num_batched_tokens", max_num_batched_tokens),
                             ("max_model_len", max_model_len), ("max_loras", max_loras)):
            if value < 1:
                problems.append(f"{label} must be at least 1, got {value}")
        for label, seconds in (("step_time_s", step_time_s), ("token_time_s", token_time_s),
                               ("startup_time_s", startup_time_s),
                             ("first_use_s", first_use_s)):
            if not math.isfinite(seconds) or seconds < 0:
                problems.append(f"{label} must be a finite number >= 0, got {seconds}")
        if not 0.0 <= eos_probability <= 1.0:
            problems.append(f"eos_probability must be in [0, 1], got {eos_probability}")
        if oom_at_step is not None and oom_at_step < 1:
            problems.append(f"oom_at_step must be at least 1, got {oom_at_step}")
        if oom_batched_tokens is not None and oom_batched_tokens < 1:
            problems.append(f"oom_batched_tokens must be at least 1, got {oom_batched_tokens}")
        if not problems and num_gpu_blocks * block_size < max_model_len:
            # vLLM refuses to start in this case too: one full-length sequence must fit.
            problems.append(
                f"the KV pool ({num_gpu_blocks} blocks x {block_size} tokens = "
                f"{num_gpu_blocks * block_size} tokens) cannot hold one max_model_len="
                f"{max_model_len} sequence"
            )
        if problems:
            raise ValueError("SimEngine: " + "; ".join(problems))
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_loras = max_loras
        self.adapter_names = frozenset(adapter_names)
        self.step_time_s = step_time_s
        self.token_time_s = token_time_s
        self.startup_time_s = startup_time_s
        self.first_use_s = first_use_s
        self._used_shapes: set[tuple[str, object]] = set()
        self._compile_cache: Path | None = None
        self.oom_at_step = oom_at_step
        self.oom_batched_tokens = oom_batched_tokens
        self.eos_probability = eos_probability
        self.seed = seed
        self.prefix_caching = prefix_caching
        self._prefix_cache: OrderedDict[int, None] = OrderedDict()

        self._free_blocks: list[int] = list(range(num_gpu_blocks))
        self._waiting: deque[_SimRequest] = deque()
        self._running: list[_SimRequest] = []
        self._requests: dict[str, _SimRequest] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._dead_error: EngineDead | None = None
        self._pending_oom: str | None = None
        self.steps = 0
        self.num_preemptions = 0
        self.max_blocks_in_use = 0
        self.max_batch_tokens_seen = 0
        self._last_budget_left = max_num_batched_tokens

    # --- InferenceEngine ---
    async def start(self) -> None:
        """Pretend to load weights for ``startup_time_s``, then start the scheduler loop."""
        if self._started:
            return
        if self._closed:
            raise EngineError("SimEngine: cannot start an engine that was shut down")
        if self.startup_time_s:
            await asyncio.sleep(self.startup_time_s)
        self._open_compile_cache()
        self._loop_task = asyncio.get_running_loop().create_task(
            self._run(), name="sim-engine-loop"
        )
        self._started = True

    def generate(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        adapter: AdapterRef | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        """Queue a request and stream its deltas (see the module docstring)."""
        return self._generate(request_id, prompt, params, adapter)

    async def _generate(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        adapter: AdapterRef | None,
    ) -> AsyncIterator[GenerationDelta]:
        if params.response_format is not None:
            raise EngineRequestError(
                f"response_format {params.response_format!r}: the simulated engine cannot "
                "constrain its output to JSON; run the vLLM engine (--engine vllm)",
                param="response_format")
        if params.n > 1 and params.temperature is not None and params.temperature < _GREEDY:
            raise EngineRequestError(  # as vLLM's SamplingParams refuses it
                f"n must be 1 when using greedy sampling (temperature 0), got {params.n}",
                param="n")
        if params.n == 1:
            async for delta in self._generate_one(request_id, prompt, params, adapter, 0):
                yield delta
            return
        queue: asyncio.Queue[GenerationDelta | BaseException | None] = asyncio.Queue()

        async def pump(choice: int) -> None:
            try:
                async for delta in self._generate_one(f"{request_id}#{choice}", prompt, params,
                                                       adapter, choice):
                    queue.put_nowait(delta)
            except Exception as error:  # delivered in order, raised by the consumer
                queue.put_nowait(error)
            finally:
                queue.put_nowait(None)

        pumps = [asyncio.create_task(pump(choice)) for choice in range(params.n)]
        try:
            running = len(pumps)
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _generate_one(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        adapter: AdapterRef | None,
        choice: int,
    ) -> AsyncIterator[GenerationDelta]:
        if self._dead_error is not None:
            raise EngineDead(f"engine is dead: {self._dead_error}") from self._dead_error
        if not self._started or self._closed:
            raise EngineDead("engine is not running")
        num_prompt = prompt.num_tokens
        if num_prompt < 1:
            raise EngineRequestError("prompt is empty")
        if num_prompt > self.max_model_len:
            raise EngineRequestError(
                f"prompt has {num_prompt} tokens, more than max_model_len={self.max_model_len}"
            )
        if params.max_tokens < 1:
            raise EngineRequestError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if adapter is not None and adapter.name not in self.adapter_names:
            raise AdapterUnavailable(
                f"unknown LoRA adapter {adapter.name!r}; loaded: {sorted(self.adapter_names)}"
            )
        if request_id in self._requests:
            raise EngineRequestError(f"request id {request_id!r} is already running")
        seed = (params.seed if params.seed is not None else (
            zlib.crc32(prompt.text.encode("utf-8", "surrogatepass")) ^ self.seed)) + choice
        adapter_name = adapter.name if adapter is not None else None
        request = _SimRequest(
            request_id=request_id,
            prompt_len=num_prompt,
            num_tokens=num_prompt,
            params=params,
            adapter=adapter_name,
            rng=random.Random(seed),
            block_hashes=self._block_hashes(prompt.token_ids, adapter_name),
            choice=choice,
        )
        self._requests[request_id] = request
        self._waiting.append(request)
        self._wake.set()
        try:
            while True:
                item = await request.next_item()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not request.finished:
                self._drop(request)

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; unknown ids are ignored."""
        request = self._requests.get(request_id)
        if request is not None:
            self._drop(request)
            request.deliver(GenerationDelta("", (), "abort"))

    def adapter_status(self) -> dict[str, str]:
        """Every adapter the simulator was built with is "loaded"."""
        return dict.fromkeys(sorted(self.adapter_names), "loaded")

    def kv_capacity(self) -> KvCapacity:
        """The configured pool (the simulator gets exactly what it was given)."""
        return KvCapacity(num_blocks=self.num_gpu_blocks, block_size=self.block_size)

    def stats(self) -> EngineStats:
        """Block usage, queue lengths and the preemption counter."""
        used = self.num_gpu_blocks - len(self._free_blocks)
        return EngineStats(
            kv_cache_usage=used / self.num_gpu_blocks,
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_preemptions_total=self.num_preemptions,
            extra={"steps": float(self.steps), "max_blocks_in_use": float(self.max_blocks_in_use)},
        )

    @property
    def is_dead(self) -> bool:
        """True once an OOM (or a simulator fault) has killed the engine."""
        return self._dead_error is not None

    @property
    def dead_error(self) -> EngineDead | None:
        """What killed it."""
        return self._dead_error

    async def shutdown(self) -> None:
        """Stop the loop and fail anything still queued; idempotent."""
        self._closed = True
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for request in list(self._requests.values()):
            request.finished = True
            request.deliver(EngineDead("engine was shut down"))
        self._requests.clear()
        self._waiting.clear()
        self._running.clear()

    # --- SupportsFaultInjection ---
    def inject_oom(self, reason: str = "injected") -> None:
        """Kill the engine with an out-of-memory error at its next scheduling point."""
        self._pending_oom = reason
        self._wake.set()

    # --- test helpers ---
    def check_invariants(self) -> None:
        """Raise AssertionError if a block leaked, was double-booked or a queue is inconsistent."""
        held = [block for request in self._running for block in request.blocks]
        if len(held) != len(set(held)) or set(held) & set(self._free_blocks):
            raise AssertionError("a KV block is booked twice")
        if len(held) + len(self._free_blocks) != self.num_gpu_blocks:
            raise AssertionError(
                f"KV blocks leaked: {len(held)} held + {len(self._free_blocks)} free "
                f"!= {self.num_gpu_blocks}"
            )
        if any(request.blocks for request in self._waiting):
            raise AssertionError("a waiting request holds KV blocks")
        for request in self._running:
            if len(request.blocks) != math.ceil(request.num_computed / self.block_size):
                raise AssertionError(f"{request.request_id} holds the wrong number of blocks")

    # --- scheduler ---
    async def _run(self) -> None:
        steps_since_yield = 0
        try:
            while not self._closed:
                if self._pending_oom is not None:
                    self._die_of_oom(0, f"{self._pending_oom} while idle or between steps")
                    return
                if not self._waiting and not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    steps_since_yield = 0
                    continue
                scheduled = self._schedule()
                if not scheduled:
                    # Nothing fits this step (cannot happen with a consistent pool, but never spin).
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=0.01)
                    continue
                self.steps += 1
                batch_tokens = self.max_num_batched_tokens - self._last_budget_left
                if batch_tokens > self.max_batch_tokens_seen:
                    self.max_batch_tokens_seen = batch_tokens
                used = self.num_gpu_blocks - len(self._free_blocks)
                if used > self.max_blocks_in_use:
                    self.max_blocks_in_use = used
                if self.oom_at_step is not None and self.steps >= self.oom_at_step:
                    self._die_of_oom(batch_tokens, f"configured to fail at step {self.oom_at_step}")
                    return
                if self.oom_batched_tokens is not None and batch_tokens >= self.oom_batched_tokens:
                    self._die_of_oom(
                        batch_tokens,
                        f"a step of {batch_tokens} batched tokens passed the simulated activation "
                        f"limit of {self.oom_batched_tokens}",
                    )
                    return
                step_s = (self.step_time_s + self.token_time_s * batch_tokens
                          + self._first_use_cost(scheduled))
                steps_since_yield += 1
                if step_s > 0 or steps_since_yield >= _ZERO_TIME_STEPS_PER_YIELD:
                    await asyncio.sleep(step_s)
                    steps_since_yield = 0
                if self._pending_oom is not None:
                    self._die_of_oom(batch_tokens, self._pending_oom)
                    return
                self._complete_step(scheduled)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a simulator bug must still fail-stop like an engine would
            self._die(EngineDead(f"simulated engine crashed: {exc!r}"))

    def _open_compile_cache(self) -> None:
        """Read the shapes already compiled from ``$VLLM_CACHE_ROOT/sim_compile_cache.json``."""
        root = os.environ.get(SIM_COMPILE_CACHE_ENV)
        if not root:
            return
        self._compile_cache = Path(root) / SIM_COMPILE_CACHE_FILE
        if self._compile_cache.is_file():
            shapes = json.loads(self._compile_cache.read_text(encoding="utf-8"))
            self._used_shapes.update((str(kind), value) for kind, value in shapes)

    def _save_compile_cache(self) -> None:
        if self._compile_cache is not None:
            self._compile_cache.parent.mkdir(parents=True, exist_ok=True)
            self._compile_cache.write_text(json.dumps(sorted(map(list, self._used_shapes),
                                                             key=str)), encoding="utf-8")

    def _first_use_cost(self, scheduled: Sequence[tuple[_SimRequest, int]]) -> float:
        """``first_use_s`` for each prompt-length class and adapter this step uses for the first
        time (see the module docstring)."""
        if not self.first_use_s:
            return 0.0
        new = 0
        for request, _ in scheduled:
            if request.num_computed >= request.prompt_len:
                continue  # decoding: nothing new to compile
            shapes: list[tuple[str, object]] = [("prompt", request.prompt_len.bit_length())]
            if request.adapter is not None:
                shapes.append(("adapter", request.adapter))
            for shape in shapes:
                if shape not in self._used_shapes:
                    self._used_shapes.add(shape)
                    new += 1
        if new:
            self._save_compile_cache()
        return new * self.first_use_s

    def _block_hashes(self, token_ids: Sequence[int], adapter: str | None) -> tuple[int, ...]:
        """Each full block's hash, chained over the blocks before it (vLLM's scheme)."""
        if not self.prefix_caching:
            return ()
        hashes: list[int] = []
        parent = hash(adapter)
        size = self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            parent = hash((parent, tuple(token_ids[start:start + size])))
            hashes.append(parent)
        return tuple(hashes)

    def _cached_prefix(self, request: _SimRequest) -> int:
        """Tokens of the request's prompt whose blocks are cached (never the whole prompt:
        the last token is always computed, as in vLLM)."""
        hits = 0
        for block_hash in request.block_hashes[:(request.prompt_len - 1) // self.block_size]:
            if block_hash not in self._prefix_cache:
                break
            self._prefix_cache.move_to_end(block_hash)
            hits += 1
        return hits * self.block_size

    def _remember_prefix(self, request: _SimRequest) -> None:
        """Keep the computed prompt's block hashes (least recently used out, pool-sized)."""
        for block_hash in request.block_hashes:
            self._prefix_cache[block_hash] = None
            self._prefix_cache.move_to_end(block_hash)
        while len(self._prefix_cache) > self.num_gpu_blocks:
            self._prefix_cache.popitem(last=False)

    def _blocks_needed(self, request: _SimRequest, num_new: int) -> int:
        total = -(-(request.num_computed + num_new) // self.block_size)  # ceil division
        missing = total - len(request.blocks)
        return missing if missing > 0 else 0

    def _allocate(self, request: _SimRequest, count: int) -> None:
        if count:
            request.blocks.extend(self._free_blocks[-count:])
            del self._free_blocks[-count:]

    def _free(self, request: _SimRequest) -> None:
        self._free_blocks.extend(request.blocks)
        request.blocks.clear()

    def _preempt(self, request: _SimRequest) -> None:
        self._free(request)
        request.num_computed = 0  # recompute prompt + generated tokens when rescheduled
        self._waiting.appendleft(request)
        self.num_preemptions += 1

    def _schedule(self) -> list[tuple[_SimRequest, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[_SimRequest, int]] = []
        preempted = False
        index = 0
        while index < len(self._running) and budget > 0:
            request = self._running[index]
            num_new = min(request.num_tokens - request.num_computed, budget)
            need = self._blocks_needed(request, num_new)
            while need > len(self._free_blocks):
                victim = self._running.pop()  # lowest priority: the most recently admitted
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                self._allocate(request, need)
                scheduled.append((request, num_new))
                budget -= num_new
                index += 1
                continue
            break  # the request itself was preempted: nothing after it can run either
        if not preempted and self._waiting:  # as vLLM: no new admissions in a step that had
            budget = self._admit_waiting(budget, scheduled)  # to preempt
        self._last_budget_left = budget
        return scheduled

    def _admit_waiting(self, budget: int, scheduled: list[tuple[_SimRequest, int]]) -> int:
        """Admit waiting requests first come, first served while the step's token budget,
        ``max_num_seqs``, ``max_loras`` and the free blocks allow; the budget left."""
        loras = {request.adapter for request in self._running if request.adapter is not None}
        skipped: list[_SimRequest] = []
        while self._waiting and budget > 0 and len(self._running) < self.max_num_seqs:
            request = self._waiting.popleft()
            if (request.adapter is not None and request.adapter not in loras
                    and len(loras) >= self.max_loras):
                skipped.append(request)  # wait until one of the running adapters drains
                continue
            first_admission = request.cached_tokens is None
            if first_admission:
                request.num_computed = self._cached_prefix(request)
            num_new = min(request.num_tokens - request.num_computed, budget)
            need = self._blocks_needed(request, num_new)
            if need > len(self._free_blocks):
                if first_admission:
                    request.num_computed = 0
                self._waiting.appendleft(request)
                break
            if first_admission:
                request.cached_tokens = request.num_computed
            self._allocate(request, need)
            self._running.append(request)
            if request.adapter is not None:
                loras.add(request.adapter)
            scheduled.append((request, num_new))
            budget -= num_new
        self._waiting.extendleft(reversed(skipped))
        return budget

    def _complete_step(self, scheduled: list[tuple[_SimRequest, int]]) -> None:
        for request, count in scheduled:
            if request.finished or request.num_computed + count > request.num_tokens:
                continue  # aborted (or preempted and requeued) while the step ran
            request.num_computed += count
            if request.num_computed < request.num_tokens:
                continue  # chunked prefill: more of the prompt next step
            self._sample(request)

    def _sample(self, request: _SimRequest) -> None:
        word_index = int(request.rng.random() * len(_OUTPUT_WORDS))
        token_id = _OUTPUT_TOKEN_ID_OFFSET + word_index
        word = _OUTPUT_WORDS[word_index]
        request.output_ids.append(token_id)
        request.num_tokens += 1
        if len(request.output_ids) == 1:
            self._remember_prefix(request)
        finish: FinishReason | None = None
        text = word
        if request.params.stop:
            # Keep the whole text only when stop strings must be found across token boundaries.
            request.text += word
            end = len(request.text)
            for stop in request.params.stop:
                position = request.text.find(stop, max(0, request.emitted_chars - len(stop)))
                if position != -1 and position < end:
                    end = position
                    finish = "stop"
            text = request.text[request.emitted_chars:end] if end > request.emitted_chars else ""
            request.emitted_chars = max(request.emitted_chars, end)
        if finish is None:
            if request.eos_drawn(self.eos_probability):
                finish = "stop"
            elif (len(request.output_ids) >= request.params.max_tokens
                  or request.num_tokens >= self.max_model_len):
                finish = "length"
        request.deliver(GenerationDelta(text, (token_id,), finish, request.cached_tokens,
                                        request.choice, self._logprobs(request, word_index)))
        if finish is not None:
            self._finish(request)

    @staticmethod
    def _logprobs(request: _SimRequest, word_index: int) -> tuple[TokenLogprob, ...]:
        """The sampled word and ``logprobs`` others, all equally likely (see the docstring)."""
        alternatives = request.params.logprobs
        if alternatives is None:
            return ()
        word = _OUTPUT_WORDS[word_index]
        others = (_OUTPUT_WORDS[(word_index + k) % len(_OUTPUT_WORDS)]
                  for k in range(1, alternatives + 1))
        top = ((word, _WORD_LOGPROB), *((other, _WORD_LOGPROB) for other in others))
        return (TokenLogprob(word, _WORD_LOGPROB, tuple(word.encode("utf-8")), top[:max(
            1, alternatives)]),)

    def _finish(self, request: _SimRequest) -> None:
        request.finished = True
        self._free(request)
        with contextlib.suppress(ValueError):
            self._running.remove(request)
        self._requests.pop(request.request_id, None)

    def _drop(self, request: _SimRequest) -> None:
        if request.finished:
            return
        request.finished = True
        self._free(request)
        with contextlib.suppress(ValueError):
            self._running.remove(request)
        with contextlib.suppress(ValueError):
            self._waiting.remove(request)
        self._requests.pop(request.request_id, None)

    def _die_of_oom(self, batch_tokens: int, reason: str) -> None:
        used = self.num_gpu_blocks - len(self._free_blocks)
        self._die(EngineOutOfMemory(
            f"CUDA out of memory (simulated) at step {self.steps}: {reason}; "
            f"{batch_tokens} tokens batched over {len(self._running)} running sequences, "
            f"{used}/{self.num_gpu_blocks} KV blocks in use"
        ))

    def _die(self, error: EngineDead) -> None:
        self._dead_error = error
        self._pending_oom = None
        for request in list(self._requests.values()):
            request.finished = True
            request.deliver(error)
        self._requests.clear()
        self._waiting.clear()
        self._running.clear()
        self._free_blocks = list(range(self.num_gpu_blocks))


SIM_COMPILE_CACHE_ENV = "VLLM_CACHE_ROOT"
SIM_COMPILE_CACHE_FILE = "sim_compile_cache.json"
"""Where the simulator keeps the shapes it has "compiled" (vLLM's cache root, when set)."""

SIM_DEFAULT_NUM_GPU_BLOCKS = 2048
"""The simulator's KV pool when ENGINE_NUM_GPU_BLOCKS is unset (vLLM measures its own)."""


@dataclass(frozen=True)
class SimSpec:
    """One of the simulator's own variables: name, default (None: unset) and meaning."""

    env: str
    default: str | None
    help: str


SIM_SETTING_SPECS: tuple[SimSpec, ...] = (
    SimSpec("SIM_STEP_TIME_S", "0.0", "Wall time per engine step."),
    SimSpec("SIM_TOKEN_TIME_S", "0.0", "Extra wall time per batched token."),
    SimSpec("SIM_STARTUP_S", "0.0", "Time `start()` takes (weight load)."),
    SimSpec("SIM_FIRST_USE_S", "0.0", "Extra time of the first step that prefills a new "
            "prompt-length class or a new adapter's request (a cold host's kernel compile)."),
    SimSpec("SIM_OOM_AT_STEP", None,
            "Every engine built dies of OOM at this step (a persistent fault)."),
    SimSpec("SIM_OOM_BATCHED_TOKENS", None, "A step batching at least this many tokens dies of "
            "OOM."),
    SimSpec("SIM_EOS_PROBABILITY", "0.02",
            "Chance per token of ending the answer (finish_reason stop)."),
    SimSpec("SIM_SEED", "0", "Seed of the generated text."),
)
"""The simulator's knobs. They are the test side's, not the gateway's: the gateway's settings
know nothing of them (its ``GATEWAY_*``/``ENGINE_*`` check never sees a ``SIM_*`` name)."""


@dataclass(frozen=True)
class SimSettings:
    """The simulator's knobs, read from ``SIM_*`` variables by :meth:`from_environ`."""

    step_time_s: float = 0.0
    token_time_s: float = 0.0
    startup_s: float = 0.0
    first_use_s: float = 0.0
    oom_at_step: int | None = None
    oom_batched_tokens: int | None = None
    eos_probability: float = 0.02
    seed: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SimSettings:
        """The ``SIM_*`` variables of ``environ`` (unset: the default); ValueError naming a bad
        one (the engine itself checks the ranges)."""
        values: dict[str, str | None] = {
            spec.env: environ.get(spec.env) or spec.default for spec in SIM_SETTING_SPECS}

        def number(env: str, kind: type[float] | type[int]) -> Any:
            text = values[env]
            if text is None:
                return None
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"{env}={text!r}: expected {kind.__name__}") from None

        return cls(
            step_time_s=number("SIM_STEP_TIME_S", float),
            token_time_s=number("SIM_TOKEN_TIME_S", float),
            startup_s=number("SIM_STARTUP_S", float),
            first_use_s=number("SIM_FIRST_USE_S", float),
            oom_at_step=number("SIM_OOM_AT_STEP", int),
            oom_batched_tokens=number("SIM_OOM_BATCHED_TOKENS", int),
            eos_probability=number("SIM_EOS_PROBABILITY", float),
            seed=number("SIM_SEED", int),
        )


def from_settings(settings: Settings, sim: SimSettings | None = None) -> SimEngine:
    """Build the simulator from the gateway's ENGINE_* settings and its own ``sim`` knobs
    (default: :class:`SimSettings`' defaults)."""
    engine, sim = settings.engine, sim or SimSettings()
    return SimEngine(
        num_gpu_blocks=engine.num_gpu_blocks or SIM_DEFAULT_NUM_GPU_BLOCKS,
        block_size=engine.block_size,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        max_loras=engine.max_loras,
        adapter_names=settings.adapter_names(),
        step_time_s=sim.step_time_s,
        token_time_s=sim.token_time_s,
        startup_time_s=sim.startup_s,
        first_use_s=sim.first_use_s,
        oom_at_step=sim.oom_at_step,
        oom_batched_tokens=sim.oom_batched_tokens,
        eos_probability=sim.eos_probability,
        seed=sim.seed,
        prefix_caching=engine.enable_prefix_caching,
    )


def sim_builder(environ: Mapping[str, str]) -> Callable[[Settings], SimEngine]:
    """The ``--engine sim`` builder the test side registers with ``gateway.main.run``: the
    gateway's settings plus the ``SIM_*`` knobs of ``environ`` (read once, here)."""
    sim = SimSettings.from_environ(environ)
    return lambda settings: from_settings(settings, sim)
