"""What the traffic asks of one engine: the request-length mix, and one long conversation.

**The mix** is the share of requests in each request-size bucket (:mod:`request_buckets`: S, M,
L, XL by prompt + ``max_tokens``, fractions of ``max_model_len``) with each bucket's typical
prompt, ``max_tokens`` and generated tokens. A request can hold prompt + ``max_tokens`` of KV at
its end (its worst case), so that is what bounds how many fit for sure; the *generated*
tokens are what the GPU spends decode steps on, so that is what bounds how many per minute.
Each typical prompt also says how much of it is the product's **system prompt** (the same for
every conversation: always in the prefix cache) and how much is **earlier conversation**
(served from the cache when the instance still holds the conversation's previous turn, as far
as the window's steps allow: :mod:`capacity_model.prefix_reuse`); the rest — retrieved context
and the new message — is prefilled every time.

**A conversation** (30+ turns within the SLA, ~100 tokens a turn:
docs/design-decisions.md#conversations-per-gpu) is sized the way the gateway's context budget
sizes it (``containers/llm/gateway/context_budget.py``):
the system prompt and the retrieved context up to their shares of the window, the newest turns
that fit the history share, the current message, and ``max_tokens`` = the output share.

Pure module: standard library and :mod:`request_buckets` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from context_window import StepPolicy, kept_history_start
from gpu_budget.lengths import blocks_for_tokens
from request_buckets import BUCKET_NAMES, BucketBounds, RequestBucket
from serving_contract.environment import (
    ContextSplit,
    context_split_problems,
    format_context_split,
)

SHARE_TOLERANCE = 1e-6


class DemandError(ValueError):
    """A mix or a conversation the model cannot use; the message names the field and value."""


@dataclass(frozen=True)
class BucketDemand:
    """The typical request of one bucket and its share of all requests."""

    bucket: RequestBucket
    share: float
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    system_tokens: int = 0
    """The part of the prompt that is the product's shared system prompt (always cached)."""
    history_tokens: int = 0
    """The part that is earlier turns of the conversation (cached as far as reuse allows)."""

    @property
    def reserved_tokens(self) -> int:
        """The most KV it holds, at its end: prompt + ``max_tokens``."""
        return self.prompt_tokens + self.max_tokens

    def cached_tokens(self, block_size: int, history_reuse: float) -> float:
        """Prompt tokens the prefix cache serves on average: the system prompt's whole blocks
        plus ``history_reuse`` of the earlier conversation (never the last prompt token)."""
        system = self.system_tokens // block_size * block_size
        return min(system + history_reuse * self.history_tokens, self.prompt_tokens - 1)

    def uncached_tokens(self, block_size: int, history_reuse: float) -> float:
        """What a prefill of this request computes."""
        return self.prompt_tokens - self.cached_tokens(block_size, history_reuse)


@dataclass(frozen=True)
class RequestMix:
    """The request-length mix: one :class:`BucketDemand` per bucket that occurs (shares sum to 1).

    Build it with :func:`request_mix`, which checks every request against the buckets of the
    engine's window.
    """

    demands: tuple[BucketDemand, ...]
    bounds: BucketBounds

    @property
    def mean_prompt_tokens(self) -> float:
        """Share-weighted prompt tokens."""
        return sum(d.share * d.prompt_tokens for d in self.demands)

    @property
    def mean_output_tokens(self) -> float:
        """Share-weighted generated tokens."""
        return sum(d.share * d.output_tokens for d in self.demands)

    def mean_cached_tokens(self, block_size: int, history_reuse: float) -> float:
        """Share-weighted prompt tokens served from the prefix cache."""
        return sum(d.share * d.cached_tokens(block_size, history_reuse) for d in self.demands)

    def mean_reserved_blocks(self, block_size: int) -> float:
        """Share-weighted KV blocks a request holds at its end (prompt + ``max_tokens``)."""
        return sum(d.share * blocks_for_tokens(d.reserved_tokens, block_size) for d in self.demands)

    def share_of(self, bucket: RequestBucket | str) -> float:
        """The share of ``bucket`` (0 when the mix has none)."""
        key = RequestBucket(bucket)
        return next((d.share for d in self.demands if d.bucket is key), 0.0)


def request_mix(demands: Sequence[BucketDemand], bounds: BucketBounds) -> RequestMix:
    """Check ``demands`` against ``bounds`` (the buckets of the engine's window).

    DemandError names the bucket and the value when a share is negative, the shares do not add
    up to 1, a bucket appears twice, the typical request is not in its own bucket, or more tokens
    are generated than ``max_tokens`` allows.
    """
    problems: list[str] = []
    seen: set[RequestBucket] = set()
    for demand in demands:
        problems.extend(_entry_problems(demand, seen))
        seen.add(demand.bucket)
        if not problems:  # sizes are compared only while every entry so far is well formed
            problems.extend(_size_problems(demand, bounds))
    total = sum(d.share for d in demands)
    if not problems and abs(total - 1) > SHARE_TOLERANCE:
        problems.append(f"shares add up to {total:g}; accepted: 1")
    if not demands:
        problems.append(f"no bucket given; accepted: shares for some of {', '.join(BUCKET_NAMES)}")
    if problems:
        raise DemandError("request mix: " + "; ".join(problems))
    order = list(RequestBucket)
    return RequestMix(demands=tuple(sorted(demands, key=lambda d: order.index(d.bucket))),
                      bounds=bounds)


def _entry_problems(demand: BucketDemand, seen: set[RequestBucket]) -> list[str]:
    """A repeated bucket, a share outside 0..1, token counts that are not integers >= 1."""
    name = demand.bucket.value
    problems: list[str] = []
    if demand.bucket in seen:
        problems.append(f"{name}: appears twice; accepted: one entry per bucket")
    if not 0 <= demand.share <= 1:
        problems.append(f"{name}.share: {demand.share!r}; accepted: 0 to 1")
    for label in ("prompt_tokens", "max_tokens", "output_tokens"):
        value = getattr(demand, label)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name}.{label}: {value!r}; accepted: an integer >= 1")
    for label in ("system_tokens", "history_tokens"):
        value = getattr(demand, label)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{name}.{label}: {value!r}; accepted: an integer >= 0")
    if not problems and demand.system_tokens + demand.history_tokens >= demand.prompt_tokens:
        problems.append(f"{name}: system_tokens + history_tokens = "
                        f"{demand.system_tokens + demand.history_tokens:,} leave nothing of the "
                        f"{demand.prompt_tokens:,}-token prompt for the new message; accepted: "
                        "less than prompt_tokens")
    return problems


def _size_problems(demand: BucketDemand, bounds: BucketBounds) -> list[str]:
    """More output than ``max_tokens``; a reservation beyond the window or outside its own
    bucket."""
    name = demand.bucket.value
    problems: list[str] = []
    if demand.output_tokens > demand.max_tokens:
        problems.append(f"{name}.output_tokens: {demand.output_tokens} exceeds max_tokens "
                        f"{demand.max_tokens}; accepted: at most max_tokens")
    reserved = demand.reserved_tokens
    if reserved > bounds.max_model_len:
        problems.append(f"{name}: prompt_tokens + max_tokens = {reserved:,} exceeds "
                        f"max_model_len {bounds.max_model_len:,}")
    elif bounds.classify(reserved) is not demand.bucket:
        problems.append(
            f"{name}: prompt_tokens + max_tokens = {reserved:,} is bucket "
            f"{bounds.classify(reserved).value}, not {name}; accepted: "
            f"{bounds.label(demand.bucket)} tokens at max_model_len "
            f"{bounds.max_model_len:,}")
    return problems


# ------------------------------------------------------------------------------ conversation
@dataclass(frozen=True)
class ContextWindow:
    """Shares of ``max_model_len`` for system + pinned messages, retrieved context, history and
    the default ``max_tokens`` (the gateway's ``GATEWAY_CONTEXT_SPLIT``)."""

    system: float
    rag: float
    history: float
    output: float
    step_turns: int = 6
    """Turns each step of the window makes room for (``GATEWAY_CONTEXT_STEP_TURNS``)."""

    def __post_init__(self) -> None:
        problems = context_split_problems(self.split)
        if problems:
            raise DemandError(f"context window: {'; '.join(problems)}")
        if self.step_turns < 1:
            raise DemandError(f"context window: step_turns {self.step_turns}; accepted: >= 1")

    def default_max_tokens(self, max_model_len: int) -> int:
        """``max_tokens`` of a request that names none (the gateway's rule)."""
        return int(self.output * max_model_len)

    @property
    def split(self) -> ContextSplit:
        """The four shares as the contract's :class:`ContextSplit`."""
        return ContextSplit(self.system, self.rag, self.history, self.output)

    def as_env(self) -> str:
        """The gateway's ``GATEWAY_CONTEXT_SPLIT`` value (the contract's one format)."""
        return format_context_split(self.split)


@dataclass(frozen=True)
class Conversation:
    """A long chat: ``turns`` messages of ``tokens_per_turn`` (the last is the current one),
    a system prompt and ``rag_tokens`` of retrieved context in ``rag_chunks`` equal chunks (the
    gateway keeps whole chunks only)."""

    turns: int
    tokens_per_turn: int
    system_tokens: int
    rag_tokens: int
    rag_chunks: int = 4

    def __post_init__(self) -> None:
        for label in ("turns", "tokens_per_turn", "rag_chunks"):
            if getattr(self, label) < 1:
                raise DemandError(f"conversation.{label}: {getattr(self, label)}; accepted: >= 1")
        for label in ("system_tokens", "rag_tokens"):
            if getattr(self, label) < 0:
                raise DemandError(f"conversation.{label}: {getattr(self, label)}; accepted: >= 0")

    @property
    def rag_chunk_tokens(self) -> int:
        """The size of one retrieved chunk."""
        return -(-self.rag_tokens // self.rag_chunks)


@dataclass(frozen=True)
class ConversationRequest:
    """What one turn of :class:`Conversation` reserves after the gateway's context budget."""

    prompt_tokens: int
    max_tokens: int
    turns_kept: int
    turns_dropped: int
    bucket: RequestBucket

    @property
    def reserved_tokens(self) -> int:
        """prompt + ``max_tokens``: the most KV it holds, at its end."""
        return self.prompt_tokens + self.max_tokens


def size_conversation(conversation: Conversation, window: ContextWindow,
                      bounds: BucketBounds) -> ConversationRequest:
    """The request the gateway builds for the conversation's latest turn.

    Mirrors ``plan_context``: system up to its share, the current message, the whole retrieved
    chunks that fit its share, then the history the stepped window keeps — on the chat's largest
    request, the turn before a step, where history and question reach the high-water mark (the
    history share, within what is left of the window after ``max_tokens``). DemandError when the
    system prompt and the current message alone do not fit — the gateway answers that with a 400.
    """
    max_model_len = bounds.max_model_len
    max_tokens = window.default_max_tokens(max_model_len)
    prompt_budget = max_model_len - max_tokens
    system = conversation.system_tokens
    if system > math.floor(window.system * max_model_len):
        raise DemandError(
            f"conversation.system_tokens: {system:,} exceeds the system share "
            f"({math.floor(window.system * max_model_len):,} tokens of {max_model_len:,}); the "
            "gateway refuses such a request")
    current = conversation.tokens_per_turn
    remaining = prompt_budget - system - current
    if remaining < 0:
        raise DemandError(f"conversation: the system prompt and the current message need "
                          f"{system + current:,} tokens, the window leaves {prompt_budget:,}")
    rag_room = min(math.floor(window.rag * max_model_len), remaining)
    chunk = conversation.rag_chunk_tokens
    rag = min(conversation.rag_chunks, rag_room // chunk if chunk else 0) * chunk
    remaining -= rag
    # The stepped window (context_window.kept_history_start, as plan_context applies it): history
    # and question up to the high-water mark, the request before each step the largest.
    rag_share = math.floor(window.rag * max_model_len)
    policy = StepPolicy(max(0, min(math.floor(window.history * max_model_len),
                                   prompt_budget - system - rag_share)), window.step_turns)
    earlier_turns = conversation.turns - 1
    kept = 0
    for count in {*range(0, earlier_turns, 2), earlier_turns}:  # each request of the chat
        history = [conversation.tokens_per_turn] * count
        first = kept_history_start(history, current, policy, room_tokens=remaining,
                                   marker_tokens=0)
        kept = max(kept, count - first)
    prompt = system + current + rag + kept * conversation.tokens_per_turn
    return ConversationRequest(prompt_tokens=prompt, max_tokens=max_tokens, turns_kept=kept + 1,
                               turns_dropped=earlier_turns - kept,
                               bucket=bounds.classify(prompt + max_tokens))
