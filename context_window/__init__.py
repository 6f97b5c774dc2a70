"""Which turns of a long conversation stay in the prompt: a window that moves in steps.

Why steps. The engine's prefix cache (vLLM's automatic prefix caching) reuses the KV cache of a
prompt's longest previously-seen *prefix*, in whole blocks. A window that drops the oldest turn
every turn changes the prompt right after the system prompt, so every turn of a long chat is
prefilled again from there: on the real engine, 0 of 32 truncated turns reused more than the
system prompt (docs/design-decisions.md#prefix-stable-window). So once the history outgrows its
budget (the *high-water mark*), the window drops enough of the oldest turns at once that the
next ``step_turns`` turns of the conversation's average size fit again before it must move.
Between two steps, each turn's prompt is the previous prompt plus the new messages, and the
engine prefills only those.

The decision must be the same on every turn without any state in the server (a conversation's
turns may reach different instances, and the gateway keeps nothing between requests). So the
window's start is *replayed* from the history itself: :func:`stable_history_start` walks the
history message by message from the beginning, as the conversation grew, and moves the start
exactly where the conversation would have had to step. History is append-only, so the start it
finds for turn ``t + 1`` is the start of turn ``t`` unless a step fell on the two new messages.

Pure module, standard library only: the gateway applies it to every request, the capacity model
replays synthetic conversations through it to price prefix reuse.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

MESSAGES_PER_TURN = 2
"""A turn is the customer's message and the assistant's answer."""


@dataclass(frozen=True)
class StepPolicy:
    """How the window moves: ``high_water_tokens`` of history at most; when a new message would
    pass it, drop the oldest messages until ``step_turns`` more turns of the conversation's
    average turn size fit below the high-water mark again (keeping the newest turn, if it fits)."""

    high_water_tokens: int
    step_turns: int

    def __post_init__(self) -> None:
        if self.high_water_tokens < 0:
            raise ValueError(f"high_water_tokens must be >= 0, got {self.high_water_tokens}")
        if self.step_turns < 1:
            raise ValueError(f"step_turns must be >= 1, got {self.step_turns}")

    def low_water_tokens(self, mean_message_tokens: float, newest_turn_tokens: int) -> int:
        """What a step keeps at most: room for ``step_turns`` average turns below the mark, but
        never less than the newest turn (the exchange the next question most likely refers to)
        while that turn fits under the mark at all."""
        room = self.step_turns * MESSAGES_PER_TURN * mean_message_tokens
        return max(self.high_water_tokens - math.ceil(room),
                   min(newest_turn_tokens, self.high_water_tokens))


def history_starts(history_tokens: Sequence[int], policy: StepPolicy) -> Iterator[int]:
    """The window's start after each history message, as the conversation grew: one value per
    message of ``history_tokens`` (see :func:`stable_history_start`)."""
    start = 0
    kept = 0
    seen = 0
    for index, tokens in enumerate(history_tokens):
        if tokens < 0:
            raise ValueError(f"history_tokens[{index}] must be >= 0, got {tokens}")
        kept += tokens
        seen += tokens
        if kept > policy.high_water_tokens:
            newest_turn = sum(history_tokens[max(0, index + 1 - MESSAGES_PER_TURN):index + 1])
            low_water = policy.low_water_tokens(seen / (index + 1), newest_turn)
            while kept > low_water and start <= index:
                kept -= history_tokens[start]
                start += 1
        yield start


def stable_history_start(history_tokens: Sequence[int], policy: StepPolicy) -> int:
    """Index (into ``history_tokens``) of the oldest history message the window keeps.

    ``history_tokens`` are the sizes of the conversation's history messages, oldest first —
    only the messages the window may drop (not system, developer or pinned messages, not the
    current one) — each including its chat-template overhead. The kept history
    ``history_tokens[start:]`` never exceeds ``policy.high_water_tokens``.
    """
    starts = list(history_starts(history_tokens, policy))
    return starts[-1] if starts else 0


def step_points(history_tokens: Sequence[int], policy: StepPolicy) -> list[int]:
    """The history lengths (message counts) after which the window had moved: a request whose
    history ends there is the first of a new step, and its prompt does not extend the previous
    request's. For tests and capacity estimates."""
    steps: list[int] = []
    previous = 0
    for end, start in enumerate(history_starts(history_tokens, policy), start=1):
        if start != previous:
            steps.append(end)
            previous = start
    return steps


def kept_history_start(history_tokens: Sequence[int], current_tokens: int, policy: StepPolicy,
                       *, room_tokens: int, marker_tokens: int) -> int:
    """Index (into ``history_tokens``) of the oldest history message a request keeps: 0 when
    nothing is dropped, ``len(history_tokens)`` when all is.

    The window's start is :func:`stable_history_start` over the history *followed by the
    request's current message* (``current_tokens``), so ``policy.high_water_tokens`` bounds
    history and question together and a longer question steps the window rather than trimming
    one more message from its start on this turn only. The history is append-only and the
    current message becomes history on the next turn, so the start still moves only at steps.

    ``room_tokens`` is what this request leaves for history (after its instructions, question
    and retrieved context) and ``marker_tokens`` what the truncation marker costs: when the
    window's start keeps more than that room beside the marker (a question or retrieval larger
    than the high-water mark allowed for), the newest messages that fit are kept instead.
    """
    start = min(stable_history_start([*history_tokens, current_tokens], policy),
                len(history_tokens))
    if start == 0 and sum(history_tokens) <= room_tokens:
        return 0
    limit = max(0, room_tokens - marker_tokens)
    first = len(history_tokens)
    used = 0
    for index in range(len(history_tokens) - 1, start - 1, -1):
        if used + history_tokens[index] > limit:
            break
        used += history_tokens[index]
        first = index
    return first

