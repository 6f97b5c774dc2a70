"""The sliding-window context budget.

Why and with which shares: docs/design-decisions.md#sliding-window-marker and
docs/design-decisions.md#context-split.

Unbounded conversation history is what filled the KV cache and crashed GPU workers. This module
decides, in the served model's tokens, what of a conversation goes to the engine:

    prompt budget = max_model_len − max output tokens − the template's fixed overhead

and, inside it, by priority:

1. **Instructions and the question** — system messages, pinned messages (stated preferences the
   caller marked) and the current (last) message always stay. System + pinned may use at most
   the *system* share of max_model_len; if the current message cannot fit beside them the
   request is refused (:class:`CurrentMessageTooLong`), never silently cut.
2. **The truncation marker** — when any turn is dropped, an explicit system message ("earlier
   conversation truncated — N turns not shown") takes the dropped turns' place, so the model and
   the user know. Its tokens are reserved before RAG.
3. **RAG context** — chunks in rank order while they fit the *rag* share and what is left after
   1-2; a chunk that does not fit ends the list (it can never starve the question).
4. **History** — the newest turns that fit, with the question, the *history* share (and the
   prompt budget beside the instructions, a full RAG share and the marker); everything older is
   dropped. A "turn" here is one user or assistant message. The window moves in steps
   (:mod:`context_window`): once history and question outgrow that mark, enough of the oldest
   messages go at once that ``step_turns`` more turns fit before the next step, so between steps
   each request's prompt extends the previous one's and the engine's prefix cache serves all of
   it but the new messages (docs/design-decisions.md#prefix-stable-window). Only when this
   request's question is larger than the mark allows for does it keep fewer, newest first.

While the circuit breaker is not closed, the RAG and history shares are multiplied by a factor
below 1 (a smaller context after an OOM). Pure module: token counts come in as numbers and the
marker's size through a callable, so it is trivially unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from context_window import StepPolicy, kept_history_start
from serving_contract.environment import ContextSplit

INSTRUCTION_ROLES = frozenset({"system", "developer"})


class BudgetError(ValueError):
    """The request cannot be fitted; ``param`` names the request field at fault."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class CurrentMessageTooLong(BudgetError):
    """The current message alone does not fit the budget left beside system and pinned ones."""


class InstructionsTooLong(BudgetError):
    """System + pinned messages exceed their share of the context window."""


class OutputTooLong(BudgetError):
    """max_tokens leaves no room for any prompt."""


class BudgetMessage(NamedTuple):
    """A message as the planner sees it: position in the request, role, size, pinned or not."""

    position: int
    role: str
    tokens: int
    """Content tokens plus the template's per-message overhead for the role."""
    pinned: bool = False


@dataclass(frozen=True)
class ContextPlan:
    """What goes to the engine, and the figures behind the decision."""

    kept_indices: tuple[int, ...]
    """Request message indices kept, oldest first (instructions, pinned, history, current)."""
    dropped_indices: tuple[int, ...]
    """History message indices dropped, oldest first."""
    rag_chunks_kept: int
    """The first ``rag_chunks_kept`` RAG chunks (rank order) are used."""
    rag_chunks_dropped: int
    prompt_budget_tokens: int
    history_budget_tokens: int
    rag_budget_tokens: int
    max_output_tokens: int
    instruction_tokens: int
    current_tokens: int
    rag_tokens: int
    history_tokens: int
    marker_tokens: int
    fixed_overhead_tokens: int

    @property
    def dropped_turns(self) -> int:
        """How many turns the sliding window dropped (the number in the marker)."""
        return len(self.dropped_indices)

    @property
    def truncated(self) -> bool:
        """True when the marker is shown."""
        return bool(self.dropped_indices)

    @property
    def estimated_prompt_tokens(self) -> int:
        """Prompt size by this plan's arithmetic (the rendered prompt is checked against it)."""
        return (self.fixed_overhead_tokens + self.instruction_tokens + self.current_tokens
                + self.rag_tokens + self.history_tokens + self.marker_tokens)


def _prompt_budget(max_model_len: int, max_output_tokens: int, fixed_overhead_tokens: int,
                   reserve_tokens: int) -> int:
    """Tokens the prompt may use; OutputTooLong when max_tokens leaves none."""
    if max_output_tokens < 1:
        raise OutputTooLong(f"max_tokens must be at least 1, got {max_output_tokens}",
                            param="max_tokens")
    prompt_budget = max_model_len - max_output_tokens - fixed_overhead_tokens - reserve_tokens
    if prompt_budget < 1:
        raise OutputTooLong(
            f"max_tokens={max_output_tokens} leaves no room for a prompt in "
            f"max_model_len={max_model_len} (template overhead {fixed_overhead_tokens})",
            param="max_tokens",
        )
    return prompt_budget


def _check_instructions(instructions: Sequence[BudgetMessage], current: BudgetMessage, *,
                        split: ContextSplit, max_model_len: int, max_output_tokens: int,
                        prompt_budget: int) -> int:
    """Tokens of the system and pinned messages; refuse them, or the current message, when
    they cannot fit. Returns what is left after both."""
    instruction_tokens = sum(m.tokens for m in instructions)
    system_cap = math.floor(split.system * max_model_len)
    if instruction_tokens > system_cap:
        raise InstructionsTooLong(
            f"system and pinned messages use {instruction_tokens} tokens; their share of the "
            f"context is {system_cap} tokens (system={split.system:g} of "
            f"max_model_len={max_model_len}); shorten them or pin fewer messages",
            param="messages" if not any(m.pinned for m in instructions)
            else "mangaassist.pinned_messages",
        )
    room_for_current = prompt_budget - instruction_tokens
    if current.tokens > room_for_current:
        raise CurrentMessageTooLong(
            f"the current message needs {current.tokens} tokens but only {max(0, room_for_current)}"
            f" fit (max_model_len={max_model_len}, max_tokens={max_output_tokens}, system and "
            f"pinned messages {instruction_tokens}); shorten it or lower max_tokens",
            param=f"messages[{current.position}].content",
        )
    return room_for_current - current.tokens


def _partition(earlier: Sequence[BudgetMessage]
               ) -> tuple[list[BudgetMessage], list[BudgetMessage]]:
    """(instructions — system, developer and pinned messages, always kept —, history)."""
    instructions: list[BudgetMessage] = []
    history: list[BudgetMessage] = []
    for message in earlier:
        kept_always = message.role in INSTRUCTION_ROLES or message.pinned
        (instructions if kept_always else history).append(message)
    return instructions, history


def _fit_rag(chunk_tokens: Sequence[int], overhead_tokens: int, room: int) -> tuple[int, int]:
    """Chunks kept in rank order while they fit ``room`` (the first also pays the message's
    overhead): (chunks kept, tokens used)."""
    used = kept = 0
    for tokens in chunk_tokens:
        cost = tokens + (overhead_tokens if kept == 0 else 0)
        if used + cost > room:
            break
        used += cost
        kept += 1
    return kept, used


def plan_context(
    messages: Sequence[BudgetMessage],
    *,
    max_model_len: int,
    max_output_tokens: int,
    split: ContextSplit,
    fixed_overhead_tokens: int,
    marker_tokens: Callable[[int], int],
    step_turns: int,
    rag_chunk_tokens: Sequence[int] = (),
    rag_overhead_tokens: int = 0,
    context_factor: float = 1.0,
    reserve_tokens: int = 0,
) -> ContextPlan:
    """Plan the prompt for ``messages`` (the last one is the current message).

    ``marker_tokens(n)`` is the size of the truncation-marker message for ``n`` dropped turns;
    ``rag_chunk_tokens`` the size of each RAG chunk in rank order and ``rag_overhead_tokens`` the
    cost of the message that carries them; ``reserve_tokens`` is taken off the prompt budget (the
    caller's correction when the rendered prompt came out larger than estimated);
    ``step_turns`` how many turns of the conversation's average size each step of the window
    makes room for (:class:`context_window.StepPolicy`).
    """
    if not messages:
        raise BudgetError("messages: at least one message is required", param="messages")
    if not 0.0 < context_factor <= 1.0:
        raise ValueError(f"context_factor must be in (0, 1], got {context_factor}")
    prompt_budget = _prompt_budget(max_model_len, max_output_tokens, fixed_overhead_tokens,
                                   reserve_tokens)
    current = messages[-1]
    instructions, history = _partition(messages[:-1])
    remaining = _check_instructions(instructions, current, split=split,
                                    max_model_len=max_model_len,
                                    max_output_tokens=max_output_tokens,
                                    prompt_budget=prompt_budget)
    instruction_tokens = sum(m.tokens for m in instructions)

    # Retrieved context first (within its share), keeping room for a marker should history
    # have to be cut; then the newest history that fits its share of what is left.
    marker_reserve = marker_tokens(len(history)) if history else 0
    rag_share = math.floor(split.rag * max_model_len * context_factor)
    rag_room = min(rag_share, remaining - marker_reserve)
    rag_kept, rag_used = _fit_rag(rag_chunk_tokens, rag_overhead_tokens, rag_room)
    remaining -= rag_used

    history_share = math.floor(split.history * max_model_len * context_factor)
    # The window's high-water mark: see _kept_history.
    high_water = min(history_share,
                     prompt_budget - instruction_tokens - rag_share - marker_reserve)
    kept_history = _kept_history(history, current, high_water=high_water, step_turns=step_turns,
                                 room_tokens=remaining, marker_reserve=marker_reserve)
    kept_set = {m.position for m in kept_history}
    dropped = tuple(m.position for m in history if m.position not in kept_set)
    kept = sorted([*(m.position for m in instructions), *kept_set, current.position])
    plan = ContextPlan(
        kept_indices=tuple(kept),
        dropped_indices=dropped,
        rag_chunks_kept=rag_kept,
        rag_chunks_dropped=len(rag_chunk_tokens) - rag_kept,
        prompt_budget_tokens=prompt_budget,
        history_budget_tokens=min(history_share, remaining),
        rag_budget_tokens=max(0, rag_room),
        max_output_tokens=max_output_tokens,
        instruction_tokens=instruction_tokens,
        current_tokens=current.tokens,
        rag_tokens=rag_used,
        history_tokens=sum(m.tokens for m in kept_history),
        marker_tokens=marker_tokens(len(dropped)) if dropped else 0,
        fixed_overhead_tokens=fixed_overhead_tokens,
    )
    _check_marker_fits(plan, current, max_model_len=max_model_len,
                       max_output_tokens=max_output_tokens, reserve_tokens=reserve_tokens)
    return plan


def _kept_history(history: Sequence[BudgetMessage], current: BudgetMessage, *,
                  high_water: int, step_turns: int, room_tokens: int,
                  marker_reserve: int) -> Sequence[BudgetMessage]:
    """The newest history the window keeps.

    The window's high-water mark is what every turn of this conversation has for history and
    question: the history share, within the prompt budget beside the instructions, a full RAG
    share and the marker. Not what this turn's retrieval happened to leave, which changes from
    turn to turn and would move the window's start on every turn.
    """
    first = kept_history_start([m.tokens for m in history], current.tokens,
                               StepPolicy(max(0, high_water), step_turns),
                               room_tokens=room_tokens, marker_tokens=marker_reserve)
    return history[first:]


def _check_marker_fits(plan: ContextPlan, current: BudgetMessage, *, max_model_len: int,
                       max_output_tokens: int, reserve_tokens: int) -> None:
    """CurrentMessageTooLong when the plan's prompt does not fit: only possible when the
    truncation marker itself does not fit beside the current message."""
    if plan.estimated_prompt_tokens + reserve_tokens > max_model_len - max_output_tokens:
        raise CurrentMessageTooLong(
            f"the current message ({current.tokens} tokens) leaves no room for the truncation "
            f"marker of the {len(plan.dropped_indices)} earlier turns it would drop "
            f"(max_model_len={max_model_len}, max_tokens={max_output_tokens}); shorten it or "
            "lower max_tokens",
            param=f"messages[{current.position}].content",
        )
