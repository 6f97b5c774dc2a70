"""How much of each prompt the engine's prefix cache serves, predicted from the window geometry.

vLLM's automatic prefix caching keeps the KV of every full block it has computed, keyed by the
block's tokens and every token before it, and a new request reuses the blocks of its longest
prefix that some earlier request computed — never its last prompt token, which it recomputes
to produce the first output (docs/design-decisions.md#prefix-stable-window). So what a
conversation's turn prefills depends on how its prompt relates to the previous turns':

* the **system prompt** (and the template's fixed opening) is the same for every conversation
  of the product: cached on every instance;
* **between two steps of the window** (:mod:`context_window`) the history only grows, so the
  turn's prompt repeats the previous turn's prompt up to the previous *user* message, plus the
  answer the engine generated for it when no retrieved context sat in between: retrieved context
  is placed right before the newest message, so it and that message are computed again;
* **at a step** the window drops old turns and the marker's count changes right after the
  system prompt: everything after it is prefilled again.

:func:`replay` walks a conversation turn by turn through the gateway's context budget — the
same arithmetic as ``containers/llm/gateway/context_budget.py`` (``plan_context``), with the
kept history taken from :func:`context_window.kept_history_start` itself, so the policy has
one source — and lays each prompt out as the chat template renders it (fixed opening, system,
marker, kept history, retrieved context, the new message, the generation header). It returns,
per turn, the prompt, the tokens a single engine that saw every earlier turn has cached, and
what the system prompt alone gives on an instance that never saw the conversation. The capacity
model turns that into prefill work per request (:func:`history_reuse`); a test compares the
prediction with the replay measured on the real engine (``config/prefix_reuse.json``).

Pure module: standard library, :mod:`context_window` and :mod:`capacity_model.demand`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capacity_model.demand import ContextWindow, DemandError
from context_window import StepPolicy, kept_history_start

Segment = tuple[str, int]
"""One piece of a prompt as the cache sees it: (identity, tokens). Equal identities at the same
place render to the same tokens."""


@dataclass(frozen=True)
class PromptLayout:
    """The token costs of a prompt's fixed parts (the served model's chat template).

    ``opening_tokens`` precede the system message (Llama 3: ``<|begin_of_text|>``);
    ``generation_header_tokens`` follow the last message (the assistant header the answer is
    generated after) and open every assistant message the same way; ``system_tokens`` is the
    system message as rendered (header and end token included); ``marker_tokens`` the
    truncation marker message.
    """

    system_tokens: int
    opening_tokens: int = 1
    generation_header_tokens: int = 4
    marker_tokens: int = 20
    marker_tokens_for: Callable[[int], int] | None = field(default=None, compare=False)
    """The marker's size for a count of dropped messages, when it depends on the count (the
    served tokenizer's); default: ``marker_tokens`` whatever the count."""

    def __post_init__(self) -> None:
        for name in ("system_tokens", "opening_tokens", "generation_header_tokens",
                     "marker_tokens"):
            if getattr(self, name) < 0:
                raise DemandError(f"prompt layout {name}: {getattr(self, name)}; accepted: >= 0")

    def marker(self, dropped: int) -> int:
        """The truncation marker's tokens when ``dropped`` messages are not shown."""
        return self.marker_tokens if self.marker_tokens_for is None else self.marker_tokens_for(
            dropped)

    @property
    def fixed_tokens(self) -> int:
        """What the gateway counts as the template's fixed overhead."""
        return self.opening_tokens + self.generation_header_tokens


@dataclass(frozen=True)
class ChatTurn:
    """One exchange: the customer's message, its retrieved context, the answer.

    ``user_tokens`` and ``answer_tokens`` are the messages as a prompt carries them (role header
    and end token included); the answer's header is the generation header, so the engine
    generates ``answer_tokens − generation_header_tokens`` tokens."""

    user_tokens: int
    answer_tokens: int
    rag_tokens: int = 0

    def __post_init__(self) -> None:
        if self.user_tokens < 1 or self.answer_tokens < 1 or self.rag_tokens < 0:
            raise DemandError(f"chat turn {self}: accepted: user and answer tokens >= 1, "
                              "rag tokens >= 0")


@dataclass(frozen=True)
class Geometry:
    """The gateway's window: ``max_model_len``, the shares and step of ``window``, the engine's
    KV block size, and the ``max_tokens`` the requests ask (default: the output share)."""

    max_model_len: int
    window: ContextWindow
    block_size: int
    max_tokens: int | None = None

    @property
    def output_tokens(self) -> int:
        """``max_tokens`` of each request."""
        return (self.max_tokens if self.max_tokens is not None
                else self.window.default_max_tokens(self.max_model_len))

    @property
    def history_share_tokens(self) -> int:
        """The high-water mark."""
        return math.floor(self.window.history * self.max_model_len)


@dataclass(frozen=True)
class TurnReuse:
    """One turn's request: its prompt, what the prefix cache serves of it, the window."""

    turn: int
    prompt_tokens: int
    cached_tokens: int
    """Served from the cache on an engine that computed every earlier turn (and that has the
    system prompt cached, when it is shared)."""
    system_cached_tokens: int
    """The part of the hit the opening + system prompt account for: all an instance that never
    saw this conversation serves (when the system prompt is shared)."""
    history_tokens: int
    """Marker + kept history: the part only this conversation's earlier turns can serve."""
    rag_tokens: int
    dropped_messages: int
    step: bool
    """The window moved on this turn (its prompt does not extend the previous one's)."""

    @property
    def prefilled_tokens(self) -> int:
        """What the engine computes."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def history_cached_tokens(self) -> int:
        """The conversation's own contribution to the cache hit."""
        return self.cached_tokens - self.system_cached_tokens


def cached_prefix(prompt: Sequence[Segment], computed: Sequence[Segment], computed_tokens: int,
                  block_size: int) -> int:
    """Tokens of ``prompt`` an engine reuses from a request that computed ``computed`` (its
    first ``computed_tokens`` tokens): the common prefix, in whole blocks, never the prompt's
    last token."""
    common = 0
    for mine, theirs in zip(prompt, computed, strict=False):
        if mine != theirs:
            break
        common += mine[1]
    prompt_tokens = sum(tokens for _, tokens in prompt)
    usable = min(common, computed_tokens, prompt_tokens - 1)
    return max(0, usable) // block_size * block_size


def _prompt(turns: Sequence[ChatTurn], index: int, layout: PromptLayout,
            geometry: Geometry) -> tuple[list[Segment], int, int, int]:
    """Turn ``index``'s prompt as segments, with its history tokens, RAG tokens and dropped
    messages."""
    history = [tokens for turn in turns[:index] for tokens in (turn.user_tokens,
                                                               turn.answer_tokens)]
    current = turns[index]
    prompt_budget = geometry.max_model_len - geometry.output_tokens - layout.fixed_tokens
    remaining = prompt_budget - layout.system_tokens - current.user_tokens
    if remaining < 0:
        raise DemandError(f"turn {index + 1}: the system prompt and the message need "
                          f"{layout.system_tokens + current.user_tokens:,} tokens, the window "
                          f"leaves {prompt_budget:,}")
    marker_reserve = layout.marker(len(history)) if history else 0
    rag_share = math.floor(geometry.window.rag * geometry.max_model_len)
    rag_room = min(rag_share, remaining - marker_reserve)
    rag = current.rag_tokens if 0 < current.rag_tokens <= rag_room else 0
    remaining -= rag
    high_water = min(geometry.history_share_tokens,
                     prompt_budget - layout.system_tokens - rag_share - marker_reserve)
    first = kept_history_start(history, current.user_tokens,
                               StepPolicy(max(0, high_water), geometry.window.step_turns),
                               room_tokens=remaining, marker_tokens=marker_reserve)
    segments: list[Segment] = [("opening", layout.opening_tokens),
                               ("system", layout.system_tokens)]
    if first:
        segments.append((f"marker:{first}", layout.marker(first)))
    for position in range(first, len(history)):
        role = "user" if position % 2 == 0 else "answer"
        if role == "answer":
            segments.append(("generation-header", layout.generation_header_tokens))
            segments.append((f"answer:{position}",
                             history[position] - layout.generation_header_tokens))
        else:
            segments.append((f"user:{position}", history[position]))
    if rag:
        segments.append((f"rag:{index}", rag))
    segments.append((f"user:{2 * index}", current.user_tokens))
    segments.append(("generation-header", layout.generation_header_tokens))
    kept = sum(history[first:]) + (layout.marker(first) if first else 0)
    return segments, kept, rag, first


def replay(turns: Sequence[ChatTurn], layout: PromptLayout, geometry: Geometry, *,
           shared_system: bool = True, answers_as_generated: bool = True) -> list[TurnReuse]:
    """Each turn's prompt and prefix-cache hit, on one engine that served every turn.

    ``shared_system``: the system prompt is cached before the first turn (other conversations
    of the product use it); False for a conversation replayed alone on a fresh engine.
    ``answers_as_generated``: the history carries each answer exactly as the engine generated
    it (a client sending back what it received); False when the caller substitutes its own text
    (the engine's blocks of the answer then match nothing).
    """
    if not turns:
        raise DemandError("replay: at least one turn is required")
    for turn in turns:
        if turn.answer_tokens <= layout.generation_header_tokens:
            raise DemandError(f"replay: an answer of {turn.answer_tokens} tokens has no content "
                              f"after its {layout.generation_header_tokens}-token header")
    system_stream: list[Segment] = [("opening", layout.opening_tokens),
                                    ("system", layout.system_tokens)]
    system_tokens = layout.opening_tokens + layout.system_tokens
    computed: list[tuple[list[Segment], int]] = (
        [(system_stream, system_tokens)] if shared_system else [])
    results: list[TurnReuse] = []
    previous_first = 0
    for index, turn in enumerate(turns):
        segments, history_tokens, rag, first = _prompt(turns, index, layout, geometry)
        prompt_tokens = sum(tokens for _, tokens in segments)
        cached = max((cached_prefix(segments, stream, tokens, geometry.block_size)
                      for stream, tokens in computed), default=0)
        system_cached = cached_prefix(segments, system_stream, system_tokens,
                                      geometry.block_size)
        results.append(TurnReuse(
            turn=index + 1, prompt_tokens=prompt_tokens, cached_tokens=cached,
            system_cached_tokens=min(system_cached, cached), history_tokens=history_tokens,
            rag_tokens=rag, dropped_messages=first, step=first != previous_first))
        previous_first = first
        generated = turn.answer_tokens - layout.generation_header_tokens
        name = "answer" if answers_as_generated else "generated"
        stream = [*segments, (f"{name}:{2 * index + 1}", generated)]
        # The last generated token is sampled, never fed back: its KV is not computed.
        computed.append((stream, prompt_tokens + generated - 1))
    return results


@dataclass(frozen=True)
class ReuseSummary:
    """A replay in a few numbers."""

    turns: int
    prompt_tokens: int
    cached_tokens: int
    system_cached_tokens: int
    history_tokens: int
    history_cached_tokens: int
    steps: int

    @property
    def cached_share(self) -> float:
        """Cached over all prompt tokens."""
        return self.cached_tokens / self.prompt_tokens

    @property
    def history_reuse(self) -> float:
        """Share of the conversation's own part of the prompts (marker + kept history) the
        cache serves when the engine still holds the earlier turns."""
        return self.history_cached_tokens / self.history_tokens if self.history_tokens else 0.0


def summarize(results: Sequence[TurnReuse]) -> ReuseSummary:
    """Totals over a replay's turns."""
    return ReuseSummary(
        turns=len(results),
        prompt_tokens=sum(r.prompt_tokens for r in results),
        cached_tokens=sum(r.cached_tokens for r in results),
        system_cached_tokens=sum(r.system_cached_tokens for r in results),
        history_tokens=sum(r.history_tokens for r in results),
        history_cached_tokens=sum(r.history_cached_tokens for r in results),
        steps=sum(r.step for r in results),
    )


def uniform_turns(count: int, *, user_tokens: int, answer_tokens: int,
                  rag_tokens: int) -> list[ChatTurn]:
    """``count`` identical exchanges (the capacity model's synthetic conversation)."""
    return [ChatTurn(user_tokens, answer_tokens, rag_tokens) for _ in range(count)]


# ------------------------------------------------------------------------- measured replay
@dataclass(frozen=True)
class TurnComparison:
    """One turn of a measured replay next to the prediction for it."""

    turn: int
    prompt_tokens: int
    measured_cached_tokens: int
    predicted_cached_tokens: int
    predicted_prompt_tokens: int
    dropped_turns: int
    predicted_dropped_turns: int

    @property
    def error_tokens(self) -> int:
        """Predicted minus measured cached tokens."""
        return self.predicted_cached_tokens - self.measured_cached_tokens


def _require(data: Any, key: str, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise DemandError(f"{where}: missing {key!r}")
    return data[key]


def measured_inputs(document: dict[str, Any], *, system_overhead: int, user_overhead: int,
                    answer_overhead: int, layout: PromptLayout,
                    max_tokens: int) -> tuple[list[ChatTurn], Geometry]:
    """The conversation and window a replay file (``config/prefix_reuse.json``, written by
    ``benchmarks/conversation_replay.py``) describes: per turn the *content* tokens of its new
    messages (the previous answer — the system prompt on the first turn — then the question),
    to which the chat template adds each role's overhead; the engine's block size and the
    gateway's window. ``layout`` carries the template's fixed parts and the system prompt."""
    engine = _require(document, "engine", "replay")
    split = _require(document, "window", "replay")
    rows = _require(document, "turns", "replay")
    window = ContextWindow(system=split["system"], rag=split["rag"], history=split["history"],
                           output=split["output"], step_turns=split["step_turns"])
    geometry = Geometry(max_model_len=engine["max_model_len"], window=window,
                        block_size=engine["block_size"], max_tokens=max_tokens)
    system = rows[0]["new_message_tokens"][0] + system_overhead
    if system != layout.system_tokens:
        raise DemandError(f"replay: the file's system prompt is {system} tokens with its "
                          f"overhead, the layout says {layout.system_tokens}")
    users = [row["new_message_tokens"][1] + user_overhead for row in rows]
    answers = [row["new_message_tokens"][0] + answer_overhead for row in rows[1:]]
    answers.append(answers[-1] if answers else layout.generation_header_tokens + 1)
    turns = [ChatTurn(user, answer, row.get("rag_tokens", 0))
             for user, answer, row in zip(users, answers, rows, strict=True)]
    return turns, geometry


def compare_with_measured(document: dict[str, Any], turns: Sequence[ChatTurn],
                          layout: PromptLayout, geometry: Geometry, *,
                          answers_as_generated: bool) -> list[TurnComparison]:
    """The prediction (:func:`replay` of the file's conversation, alone on a fresh engine) next
    to what the engine reported for each turn."""
    predicted = replay(turns, layout, geometry, shared_system=False,
                       answers_as_generated=answers_as_generated)
    return [TurnComparison(turn=row["turn"], prompt_tokens=row["prompt_tokens"],
                           measured_cached_tokens=row["cached_tokens"],
                           predicted_cached_tokens=mine.cached_tokens,
                           predicted_prompt_tokens=mine.prompt_tokens,
                           dropped_turns=row["dropped_turns"],
                           predicted_dropped_turns=mine.dropped_messages)
            for row, mine in zip(document["turns"], predicted, strict=True)]
