"""The request path, independent of HTTP: validate → route → budget → admit → generate → contain.

:class:`ChatService` turns a parsed :class:`ChatCompletionRequest` into a stream of
:class:`TextEvent` and one closing :class:`FinishEvent`. Every failure that is the caller's
fault is an :class:`ApiError` (a 4xx naming the field); shedding is an ApiError 429/503 with
Retry-After; an engine death or OOM becomes a fallback FinishEvent (and a breaker trip through
the supervisor) — never an exception that could reach the client as a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.admission import (
    AdmissionController,
    AdmissionRejected,
    AdmissionRequest,
    KvReservation,
    LengthBucket,
    RefusalReason,
    ScreenPass,
    classify_bucket,
    retry_after_header,
)
from gateway.api.chat_run import ChatRun, Event, FinishEvent, PreparedChat, TextEvent
from gateway.api.errors import ApiError
from gateway.api.protocol import (
    ChatCompletionRequest,
    ContextReport,
    MangaAssistExtension,
    ResponseExtension,
)
from gateway.breaker import BreakerState, CircuitBreaker
from gateway.context_budget import BudgetError, BudgetMessage, ContextPlan, plan_context
from gateway.engines.base import (
    AdapterUnavailable,
    EngineDead,
    EngineOutOfMemory,
    EngineRequestError,
    GenerationDelta,
    InferenceEngine,
    RenderedPrompt,
    SamplingParams,
)
from gateway.health import EnginePhase
from gateway.routing import AdapterRouter, RouteDecision, UnknownModel
from gateway.settings import Settings
from gateway.supervisor import EngineSupervisor
from gateway.telemetry import RequestRecord, Telemetry
from gateway.tokenizer import ChatTemplateError, ChatTokenizer, ChatTurn

MARKER_TEMPLATE = "[earlier conversation truncated — {count} turns not shown]"
RAG_HEADER = "Reference information (retrieved for the current question):"
_NOTICES = {
    "en": "Earlier conversation truncated — {count} turns not shown.",
    "ja": "以前の会話の一部（{count}件）は省略されています。",
}
_FALLBACK_TEXT = {
    "engine": {
        "en": "I need to start a fresh context for this conversation. Could you repeat your "
              "last question?",
        "ja": "申し訳ありません、この会話は新しいコンテキストで始め直す必要があります。"
              "もう一度ご質問をお願いできますか？",
    },
    "breaker_open_xl": {
        "en": "This conversation has grown too long for me to keep in mind right now — let's "
              "start a fresh context. Could you summarize what you are looking for?",
        "ja": "会話が長くなったため、いったん新しいコンテキストで始めさせてください。"
              "お探しの内容を簡単に教えていただけますか？",
    },
}


@dataclass
class Admission:
    """An admitted request: its KV reservation and the engine generation it runs on."""

    reservation: KvReservation
    engine: InferenceEngine
    generation: int
    admitted_at: float


async def _only(event: Event) -> AsyncGenerator[Event, None]:
    yield event


def _stripped(content: str) -> str:
    """Content without surrounding whitespace (the template trims it; copy only if needed)."""
    if content and (content[0].isspace() or content[-1].isspace()):
        return content.strip()
    return content


_NO_EXTENSION = MangaAssistExtension()


def sampling_params(request: ChatCompletionRequest, max_output: int) -> SamplingParams:
    """The request's sampling parameters: its fields as sent (for an engine's own conversion)
    and the same values typed; unset ones are the model's defaults (None)."""
    stop = request.stop
    response_format = request.response_format
    return SamplingParams(
        max_tokens=max_output,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        seed=request.seed,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        n=request.n or 1,
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        min_tokens=request.min_tokens or 0,
        ignore_eos=bool(request.ignore_eos),
        response_format=(response_format.type if response_format is not None
                         and response_format.type != "text" else None),
        request_fields=request.sampling_fields(),
    )


def language_of(locale: str | None) -> str:
    """'ja' for Japanese locales, else 'en' (the languages of our fixed texts)."""
    return "ja" if locale is not None and locale.lower().startswith("ja") else "en"


def fallback_text(kind: str, language: str) -> str:
    """The controlled fallback answer (``engine`` or ``breaker_open_xl``) in the language."""
    return _FALLBACK_TEXT[kind][language]


class ChatService:
    """The request path (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizer: ChatTokenizer,
        router: AdapterRouter,
        admission: AdmissionController,
        breaker: CircuitBreaker,
        supervisor: EngineSupervisor,
        telemetry: Telemetry,
        clock: Any = time.monotonic,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.router = router
        self.admission = admission
        self.breaker = breaker
        self.supervisor = supervisor
        self.telemetry = telemetry
        self.clock = clock
        self._system_overhead = tokenizer.overhead.for_role("system")
        self._role_overhead = {role: tokenizer.overhead.for_role(role)
                               for role in ("system", "user", "assistant")}
        self._rag_header_tokens = tokenizer.count([RAG_HEADER])[0]
        self.smallest_prompt_tokens = tokenizer.render_prompt([ChatTurn("user", "")]).num_tokens
        """The fewest prompt tokens any chat request is sent with (one empty user message in
        the chat template): what :meth:`screen` asks the valve about."""

    async def start(self, request: ChatCompletionRequest, record: RequestRecord) -> ChatRun:
        """The whole request path up to the answer's events: prepare (validate, route, budget),
        the breaker's fresh-context answer for XL, admission, then generation.

        ApiError (4xx, or 429/503 with Retry-After) for anything answered before generation.
        """
        prepared = self.prepare(request, record)
        if self.refuses_as_xl(prepared):
            events = _only(self.xl_fallback(prepared))
        else:
            events = self.run(prepared, await self.admit(prepared))
        if not request.stream:
            return ChatRun(prepared, events)
        try:
            first = await events.__anext__()
        except ApiError:
            await events.aclose()
            raise
        return ChatRun(prepared, events, first)

    # --- validate, route, budget ---
    def prepare(self, request: ChatCompletionRequest, record: RequestRecord) -> PreparedChat:
        """Everything up to admission; ApiError (4xx) for anything the caller must fix."""
        gateway = self.settings.gateway
        messages = request.messages
        extension = request.mangaassist or _NO_EXTENSION
        record.intent = extension.intent
        record.locale = extension.locale
        last = self._check_messages(request)
        pinned = self._pinned(extension.pinned_messages, last)

        try:
            route = self.router.resolve(request.model, record.intent, record.locale)
        except UnknownModel as error:
            raise ApiError(404, str(error), param="model", code="model_not_found") from None
        record.served_name = route.served_name
        record.route_reason = route.reason

        max_output = self._max_output_tokens(request)
        now = self.clock()
        breaker_state = self.breaker.state(now)
        context_factor = self.breaker.context_factor(now)
        record.breaker_state = breaker_state.value

        roles: list[str] = []
        contents: list[str] = []
        for message in messages:
            roles.append("system" if message.role == "developer" else message.role)
            contents.append(_stripped(message.text))
        rag_lines = [f"- {chunk.strip()}" for chunk in extension.rag_context if chunk.strip()]
        ids = self.tokenizer.content_ids(contents + rag_lines)
        overhead = self._role_overhead
        budget_messages = [BudgetMessage(index, role, len(ids[index]) + overhead[role],
                                         index in pinned)
                           for index, role in enumerate(roles)]
        rag_tokens = [len(line_ids) + 1 for line_ids in ids[len(roles):]]  # +1: line break
        plan, prompt, turns = self._fit(budget_messages, roles, contents, ids, rag_lines,
                                        rag_tokens, max_output, context_factor)
        reserved = prompt.num_tokens + max_output
        bucket = classify_bucket(reserved, gateway.buckets.bounds)
        record.bucket = bucket.value
        record.prompt_tokens = prompt.num_tokens
        record.truncated = plan.truncated
        record.dropped_turns = plan.dropped_turns
        record.rag_chunks_dropped = plan.rag_chunks_dropped
        language = language_of(record.locale)
        return PreparedChat(
            request=request, record=record, route=route,
            params=sampling_params(request, max_output), plan=plan,
            prompt=prompt, turns=turns, bucket=bucket, breaker_state=breaker_state,
            context_factor=context_factor, language=language, reserved_tokens=reserved,
            extension=self._extension(route, bucket, breaker_state, plan, prompt,
                                      context_factor, language),
        )

    def _check_messages(self, request: ChatCompletionRequest) -> int:
        """Refuse what no window can fix; the index of the current (last) message."""
        messages = request.messages
        limit = self.settings.gateway.max_messages
        if len(messages) > limit:
            raise ApiError(400, f"messages: {len(messages)} messages, at most {limit} are "
                                "accepted", param="messages")
        max_n = min(self.settings.gateway.max_n, self.settings.engine.max_num_seqs)
        if request.n is not None and request.n > max_n:
            # Each choice is one of the engine's running sequences.
            raise ApiError(400, f"n: {request.n} choices asked for; at most {max_n} are "
                                "accepted (GATEWAY_MAX_N, at most ENGINE_MAX_NUM_SEQS)",
                           param="n")
        # The last message is the current one, whatever its role or content (as OpenAI and
        # vLLM take it): the window always keeps it.
        return len(messages) - 1

    def _pinned(self, indices: Sequence[int], last: int) -> set[int]:
        pinned: set[int] = set()
        for position, index in enumerate(indices):
            if index == last:
                continue  # the current message: always kept
            if index > last:
                raise ApiError(400, f"mangaassist.pinned_messages[{position}]: {index} is not the "
                                    f"index of a message (0..{last})",
                               param=f"mangaassist.pinned_messages[{position}]")
            pinned.add(index)
        return pinned

    def _max_output_tokens(self, request: ChatCompletionRequest) -> int:
        engine = self.settings.engine
        if request.max_tokens is not None and request.max_completion_tokens is not None:
            # One limit under two names (OpenAI renamed it): as /openapi.json states, one of them.
            raise ApiError(400, f"max_tokens={request.max_tokens} and max_completion_tokens="
                                f"{request.max_completion_tokens}: send one of them (the same "
                                "limit under its old and new name)",
                           param="max_completion_tokens")
        requested = request.max_completion_tokens or request.max_tokens
        name = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        if requested is None:
            default = int(self.settings.gateway.context_split.output * engine.max_model_len)
            requested, name = max(default, request.min_tokens or 0), "min_tokens"
            if requested == default:  # else raised to min_tokens (vLLM: min_tokens <= max_tokens)
                return default
        if requested >= engine.max_model_len:
            raise ApiError(400, f"{name}={requested}: must be below the context window "
                                f"(max_model_len={engine.max_model_len}) to leave room for the "
                                "prompt", param=name)
        return requested

    def _marker_tokens(self, count: int) -> int:
        return (self.tokenizer.count([MARKER_TEMPLATE.format(count=count)])[0]
                + self._system_overhead)

    def _fit(self, messages: list[BudgetMessage], roles: list[str], contents: list[str],
             ids: list[array[int]], rag_lines: list[str], rag_tokens: list[int],
             max_output: int, context_factor: float
             ) -> tuple[ContextPlan, RenderedPrompt, list[ChatTurn]]:
        engine = self.settings.engine
        limit = engine.max_model_len - max_output
        reserve = 0
        for _ in range(8):
            try:
                plan = plan_context(
                    messages, max_model_len=engine.max_model_len, max_output_tokens=max_output,
                    split=self.settings.gateway.context_split,
                    fixed_overhead_tokens=self.tokenizer.overhead.fixed_tokens,
                    marker_tokens=self._marker_tokens, rag_chunk_tokens=rag_tokens,
                    rag_overhead_tokens=self._system_overhead + self._rag_header_tokens,
                    context_factor=context_factor, reserve_tokens=reserve,
                    step_turns=self.settings.gateway.context_step_turns,
                )
            except BudgetError as error:
                raise ApiError(400, str(error), param=error.param,
                               code="context_length_exceeded") from None
            final_turns, known_ids = self._assemble(plan, roles, contents, ids, rag_lines)
            try:
                prompt = self.tokenizer.render_prompt(final_turns, known_ids=known_ids)
            except ChatTemplateError as error:
                raise ApiError(400, f"messages: the model's chat template rejected the "
                                    f"conversation: {error}", param="messages") from None
            if prompt.num_tokens <= limit:
                return plan, prompt, final_turns
            reserve += prompt.num_tokens - limit  # the estimate was short; tighten and re-plan
        raise ApiError(400, "messages: the conversation could not be fitted into the context "
                            "window", param="messages", code="context_length_exceeded")

    @staticmethod
    def _assemble(plan: ContextPlan, roles: list[str], contents: list[str],
                  ids: list[array[int]], rag_lines: list[str]
                  ) -> tuple[list[ChatTurn], list[array[int] | None]]:
        """The turns sent to the engine (marker and RAG message added), with known content ids."""
        current = len(roles) - 1
        result: list[ChatTurn] = []
        known: list[array[int] | None] = []
        marker: ChatTurn | None = None
        first_dropped = -1
        if plan.dropped_indices:  # oldest first; the marker takes the first one's place
            first_dropped = plan.dropped_indices[0]
            marker = ChatTurn("system", MARKER_TEMPLATE.format(count=plan.dropped_turns))
        for index in plan.kept_indices:
            if marker is not None and index > first_dropped:
                result.append(marker)
                known.append(None)
                marker = None
            if index == current and plan.rag_chunks_kept:
                lines = "\n".join(rag_lines[:plan.rag_chunks_kept])
                result.append(ChatTurn("system", f"{RAG_HEADER}\n{lines}"))
                known.append(None)
            result.append(ChatTurn(roles[index], contents[index]))
            known.append(ids[index])
        return result, known

    @staticmethod
    def _extension(route: RouteDecision, bucket: LengthBucket, breaker_state: BreakerState,
                   plan: ContextPlan, prompt: RenderedPrompt, context_factor: float,
                   language: str) -> ResponseExtension:
        notice = _NOTICES[language].format(count=plan.dropped_turns) if plan.truncated else None
        return ResponseExtension(
            adapter=route.adapter.name if route.adapter else None,
            route=route.reason,
            bucket=bucket.value,
            breaker=breaker_state.value,
            fallback=None,
            deadline_exceeded=False,
            context=ContextReport(
                prompt_tokens=prompt.num_tokens,
                prompt_budget_tokens=plan.prompt_budget_tokens,
                history_budget_tokens=plan.history_budget_tokens,
                max_output_tokens=plan.max_output_tokens,
                template_overhead_tokens=plan.fixed_overhead_tokens,
                kept_messages=list(plan.kept_indices),
                dropped_messages=list(plan.dropped_indices),
                dropped_turns=plan.dropped_turns,
                truncated=plan.truncated,
                truncation_notice=notice,
                rag_chunks_kept=plan.rag_chunks_kept,
                rag_chunks_dropped=plan.rag_chunks_dropped,
                context_factor=context_factor,
            ),
        )

    # --- admit ---
    def screen(self, *, warmup: bool) -> tuple[ApiError, bool] | ScreenPass | None:
        """The answer a chat request gets before it is parsed, if any, and whether it was
        refused while the engine was nearly idle: the valve's 429 when not even the smallest
        prompt would start within the SLO beside what waits and what was screened in before it
        (:meth:`AdmissionController.screen`); while the engine is rebuilt (or the rebuilt one
        warms up), the 503 of :meth:`engine_unavailable`. Else it is read and decided on its
        own prompt: the valve's :class:`ScreenPass` (counted until it is sized), or None when
        no engine serves yet. Warmup requests go the whole way, None."""
        if warmup:
            return None
        phase = self.supervisor.phase
        if phase in (EnginePhase.RECOVERING, EnginePhase.WARMING):
            return self.engine_unavailable(), False
        if phase is not EnginePhase.READY:
            return None
        decided = self.admission.screen(self.smallest_prompt_tokens)
        if isinstance(decided, ScreenPass):
            return decided
        return self._refusal(decided), decided.while_idle

    def engine_unavailable(self) -> ApiError:
        """The 503 of a request that arrives while no engine serves (starting, rebuilding after
        a death, a rebuilt one warming up, failed): at once, so that the caller's retry can go
        to another instance; Retry-After is the rebuild's expected remaining time (the last
        start's duration less the time it has run), at least ``GATEWAY_RETRY_AFTER_S``."""
        supervisor = self.supervisor
        floor_s = self.settings.gateway.retry_after_s
        retry_after = retry_after_header(supervisor.rebuild_remaining_s(self.clock()), floor_s)
        doing = {EnginePhase.RECOVERING: "being rebuilt after a failure",
                 EnginePhase.WARMING: "rebuilt and warming up"}.get(
                     supervisor.phase, supervisor.phase.value)
        return ApiError(503, f"the inference engine is {doing}; retry in {retry_after} s",
                        type_="service_unavailable", code="engine_unavailable",
                        headers={"Retry-After": retry_after})

    def refuses_as_xl(self, prepared: PreparedChat) -> bool:
        """True when the breaker answers this XL request with the fresh-context fallback."""
        return prepared.bucket is LengthBucket.XL and self.breaker.refuses_xl(self.clock())

    async def admit(self, prepared: PreparedChat) -> Admission:
        """A ready engine and a KV reservation: refused at once (ApiError 429 with Retry-After)
        when the prefill valve is over its cap with this prompt, else queued until dispatched."""
        gateway = self.settings.gateway
        record = prepared.record
        started = self.clock()
        deadline = record.started + gateway.request_deadline_s
        wait_s = max(0.0, min(gateway.admission_wait_s, deadline - started))
        retry = {"Retry-After": str(gateway.retry_after_s)}
        engine = self.supervisor.serving(warmup=record.warmup)
        if engine is None:
            record.queue_wait_s = self.clock() - started
            raise self.engine_unavailable()
        generation = self.supervisor.generation
        remaining = max(0.0, wait_s - (self.clock() - started))
        request = AdmissionRequest(bucket=prepared.bucket,
                                   prompt_tokens=prepared.prompt.num_tokens,
                                   max_tokens=prepared.params.max_tokens,
                                   sequences=prepared.params.n)
        try:
            reservation = await self.admission.acquire(
                request, max_wait_s=remaining, arrived_at=record.started,
                screened_tokens=record.screened_tokens,
                max_total_inflight=lambda: self.breaker.max_inflight(self.clock()),
                by_valve=not record.warmup)
        except AdmissionRejected as rejected:
            record.queue_wait_s = self.clock() - started
            record.refused_while_idle = rejected.while_idle
            if rejected.reason is RefusalReason.ENGINE_DIED:
                raise self.engine_unavailable() from None
            raise self._refusal(rejected) from None
        now = self.clock()
        record.queue_wait_s = now - started
        record.admitted_by = "floor" if reservation.floor else None
        if self.supervisor.engine is not engine or self.supervisor.generation != generation:
            # The engine died while this request waited for KV room: try the new one later.
            self.admission.release(reservation)
            raise ApiError(503, "the inference engine restarted while the request waited; "
                                f"retry in {gateway.retry_after_s} s",
                           type_="service_unavailable", code="engine_unavailable", headers=retry)
        return Admission(reservation=reservation, engine=engine, generation=generation,
                         admitted_at=now)

    def _refusal(self, rejected: AdmissionRejected) -> ApiError:
        """The 429 (no room within the SLO) or 503 (recovering) for a refused request."""
        gateway = self.settings.gateway
        retry_after = retry_after_header(rejected.retry_after_s, gateway.retry_after_s)
        headers = {"Retry-After": retry_after}
        if rejected.reason is RefusalReason.TTFT_SLO:
            return ttft_refusal(rejected, self.admission.ttft_slo_s, retry_after)
        if rejected.reason is RefusalReason.QUEUE_TIMEOUT:
            sized = rejected.bucket.value if rejected.bucket is not None else "unsized"
            return ApiError(429, f"the gateway is at capacity for {sized} "
                                 f"requests (waited {rejected.waited_s:.1f} s); retry in "
                                 f"{retry_after} s", type_="rate_limit_error",
                            code=rejected.reason.value, headers=headers)
        return ApiError(503, f"the gateway is recovering from an engine failure "
                             f"({rejected.reason.value}); retry in {retry_after} s",
                        type_="service_unavailable", code=rejected.reason.value,
                        headers=headers)

    # --- generate and contain ---
    async def run(self, prepared: PreparedChat, admission: Admission
                  ) -> AsyncGenerator[TextEvent | FinishEvent, None]:
        """Generate; yields text events and one FinishEvent. Releases the reservation."""
        record = prepared.record
        record.reached_engine = True
        record.engine_generation = admission.generation
        engine = admission.engine
        request_id = record.request_id
        loop = asyncio.get_running_loop()
        deadline_hit = False
        abort_tasks: list[asyncio.Task[None]] = []

        def on_deadline() -> None:
            nonlocal deadline_hit
            deadline_hit = True
            abort_tasks.append(loop.create_task(engine.abort(request_id)))

        remaining = record.started + self.settings.gateway.request_deadline_s - self.clock()
        timer = loop.call_later(max(0.0, remaining), on_deadline)
        finish_reasons: dict[int, str] = {}
        try:
            stream = engine.generate(request_id, prepared.prompt, prepared.params,
                                     prepared.route.adapter)
            try:
                async for delta in stream:
                    event = self._on_delta(delta, record, admission, finish_reasons)
                    if event is not None:
                        yield event
            finally:
                close = getattr(stream, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()
            if deadline_hit:
                record.finish_reason = "length"
                yield FinishEvent("length", deadline_exceeded=True)
                return
            self.breaker.record_success(self.clock())
            record.finish_reason = finish_reasons.get(0, "stop")
            yield FinishEvent(record.finish_reason, finish_reasons=finish_reasons)
        except AdapterUnavailable as error:
            raise ApiError(503, f"{error}; other models keep serving on this instance",
                           type_="service_unavailable", param="model",
                           code="adapter_unavailable",
                           headers={"Retry-After": str(self.settings.gateway.retry_after_s)}
                           ) from None
        except EngineRequestError as error:
            raise ApiError(400, f"the engine refused the request: {error}",
                           param=error.param or "messages") from None
        except EngineDead as error:
            self.supervisor.report_death(admission.generation, error)
            reason = ("engine_out_of_memory" if isinstance(error, EngineOutOfMemory)
                      else "engine_dead")
            yield self._fallback(record, reason, str(error), prepared.language)
        except Exception as error:  # EngineError, or anything unexpected from an engine: contain
            self.telemetry.log("engine_error", level="error", request_id=request_id,
                               error=repr(error)[:500])
            yield self._fallback(record, "engine_error", str(error), prepared.language)
        finally:
            timer.cancel()
            # An answer that ended teaches admission the engine's decode step, and a real one
            # how long answers are (warmup's are short on purpose).
            answered = (record.finish_reason in ("stop", "length") and not deadline_hit
                        and record.outcome != "fallback")
            # completion_tokens counts every choice; admission learns each choice's length.
            self.admission.release(admission.reservation,
                                   completion_tokens=record.completion_tokens if answered else None,
                                   capped="length" in finish_reasons.values(),
                                   warmup=record.warmup)

    def _on_delta(self, delta: GenerationDelta, record: RequestRecord, admission: Admission,
                  finish_reasons: dict[int, str]) -> TextEvent | None:
        """Account for one engine delta; the event to pass on, if any."""
        first_token = record.ttft_s is None and bool(delta.token_ids)
        if first_token:
            record.ttft_s = self.clock() - admission.admitted_at
        if delta.cached_tokens is not None:
            record.cached_tokens = delta.cached_tokens
        self.admission.progress(admission.reservation, len(delta.token_ids))
        record.completion_tokens += len(delta.token_ids)
        if delta.choice == 0:  # the time per output token is one sequence's pace
            record.mark_tokens(self.clock(), len(delta.token_ids))
        if delta.finish_reason is not None:
            finish_reasons[delta.choice] = "length" if delta.finish_reason == "length" else "stop"
        # A stream starts at the first token, as vLLM's does, even if it shows no text yet; a
        # token without text still carries its logprob.
        if delta.text or delta.logprobs or first_token:
            return TextEvent(delta.text, delta.choice, delta.logprobs)
        return None

    def _fallback(self, record: RequestRecord, reason: str, detail: str,
                  language: str) -> FinishEvent:
        record.outcome = "fallback"
        record.fallback_reason = reason
        record.finish_reason = "stop"
        kind = "breaker_open_xl" if reason == "breaker_open_xl" else "engine"
        return FinishEvent("stop", fallback={"reason": reason, "detail": detail[:500]},
                           fallback_text=fallback_text(kind, language))

    def xl_fallback(self, prepared: PreparedChat) -> FinishEvent:
        """The fresh-context answer for an XL request while the breaker is not closed."""
        return self._fallback(
            prepared.record, "breaker_open_xl",
            f"the circuit breaker is {prepared.breaker_state.value}; requests of "
            f"{prepared.reserved_tokens} tokens (bucket XL) start a fresh context",
            prepared.language,
        )


def ttft_refusal(rejected: AdmissionRejected, slo_s: float, retry_after: str) -> ApiError:
    """The 429 of a request the prefill valve refused (on arrival, before or after it was
    parsed)."""
    what = ("a request of the usual size" if rejected.bucket is None
            else f"a {rejected.bucket.value} request")
    return ApiError(
        429, f"the gateway is at capacity: {rejected.backlog_tokens} prompt tokens are waiting "
             f"for their first token, more than the {rejected.cap_tokens:.0f} the engine starts "
             f"within the {slo_s:g} s first-token SLO at its measured rate, so {what} would "
             f"miss it; retry in {retry_after} s", type_="rate_limit_error",
        code=rejected.reason.value, headers={"Retry-After": retry_after})

