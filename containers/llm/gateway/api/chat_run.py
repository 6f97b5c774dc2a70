"""One chat request on its way through the serving handler, as the HTTP layer receives it.

The serving handler (:mod:`gateway.api.serving`) produces these and the response builders
(:mod:`gateway.api.responses`) and the handlers (:mod:`gateway.api.handlers`) consume them, so the
dependency runs one way: handlers → responses → chat_run ← serving. A refusal is not here: it is
:class:`gateway.api.errors.ApiError`, the one error base of the HTTP layer.

* :class:`TextEvent` / :class:`FinishEvent` — an answer's events; :class:`ChatRun` carries them
  with the :class:`PreparedChat` they answer; :class:`Answer` is a whole non-streamed answer.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.admission import LengthBucket
from gateway.api.protocol import ChatCompletionRequest, ResponseExtension
from gateway.breaker import BreakerState
from gateway.context_budget import ContextPlan
from gateway.engines.base import RenderedPrompt, SamplingParams, TokenLogprob
from gateway.routing import RouteDecision
from gateway.telemetry import RequestRecord
from gateway.tokenizer import ChatTurn


@dataclass(frozen=True)
class TextEvent:
    """Generated text of one choice (the engine's delta), with its tokens' logprobs if asked."""

    text: str
    choice: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    """The end of the answer; ``fallback`` is set when the text is our fallback message.

    ``finish_reason`` is choice 0's; ``finish_reasons`` each choice's when there are several.
    """

    finish_reason: str
    fallback: dict[str, str] | None = None
    fallback_text: str | None = None
    deadline_exceeded: bool = False
    finish_reasons: Mapping[int, str] = field(default_factory=dict)

    def reason_of(self, choice: int) -> str:
        """How choice ``choice`` ended."""
        return self.finish_reasons.get(choice, self.finish_reason)


@dataclass
class PreparedChat:
    """A validated, routed and budgeted request, ready for admission."""

    request: ChatCompletionRequest
    record: RequestRecord
    route: RouteDecision
    params: SamplingParams
    plan: ContextPlan
    prompt: RenderedPrompt
    turns: list[ChatTurn]
    """The messages the prompt renders: the kept ones, the truncation marker, retrieved context."""
    bucket: LengthBucket
    breaker_state: BreakerState
    context_factor: float
    language: str
    reserved_tokens: int
    extension: ResponseExtension
    """The response's ``mangaassist`` object (how the answer ended is added at the end)."""


Event = TextEvent | FinishEvent


@dataclass(frozen=True)
class Answer:
    """A whole (non-streamed) answer: each choice's text and token logprobs, how it ended."""

    texts: Mapping[int, str]
    logprobs: Mapping[int, Sequence[TokenLogprob]]
    finish: FinishEvent

    def text(self, choice: int) -> str:
        """Choice ``choice``'s text ("" if it produced none)."""
        return self.texts.get(choice, "")


class ChatRun:
    """A request on its way: what ``prepare`` made of it, and the events of its answer.

    Iterate :meth:`events` once (or :meth:`collect` it); :meth:`close` releases what the run
    holds if it is abandoned. The first event of a stream is fetched before the run is handed
    over, so that a refusal at the first engine step is still an HTTP error, not a broken stream.
    """

    def __init__(self, prepared: PreparedChat, events: AsyncGenerator[Event, None],
                 first: Event | None = None) -> None:
        self.prepared = prepared
        self._events = events
        self._first = first

    @property
    def early_finish(self) -> FinishEvent | None:
        """The answer's end when it came before any text (a fallback known before a stream's
        headers are sent); None otherwise."""
        return self._first if isinstance(self._first, FinishEvent) else None

    async def events(self) -> AsyncGenerator[Event, None]:
        """Text events, then one FinishEvent; ApiError if the engine refuses the request."""
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for event in self._events:
            yield event

    async def collect(self) -> Answer:
        """The whole answer: each choice's text and token logprobs, and how it ended."""
        texts: dict[int, list[str]] = {}
        logprobs: dict[int, list[TokenLogprob]] = {}
        finish: FinishEvent | None = None
        try:
            async for event in self.events():
                if isinstance(event, TextEvent):
                    texts.setdefault(event.choice, []).append(event.text)
                    logprobs.setdefault(event.choice, []).extend(event.logprobs)
                else:
                    finish = event
        finally:
            await self.close()
        return Answer(texts={choice: "".join(parts) for choice, parts in texts.items()},
                      logprobs=logprobs, finish=finish or FinishEvent("stop"))

    async def close(self) -> None:
        """Stop generating (a client that went away) and release the KV reservation."""
        await self._events.aclose()
