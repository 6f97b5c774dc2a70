"""The sliding-window planner (pure): priorities, exact budget arithmetic, refusals."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_window import StepPolicy, stable_history_start, step_points
from gateway.context_budget import (
    BudgetMessage,
    CurrentMessageTooLong,
    InstructionsTooLong,
    OutputTooLong,
    plan_context,
)
from gateway.settings import ContextSplit

SPLIT = ContextSplit(system=0.125, rag=0.25, history=0.5, output=0.125)  # docs/design-decisions.md#context-split


def marker(count: int) -> int:
    return 12 + len(str(count))  # a marker message whose size grows with the digits of N


def conversation(history: list[int], *, system: int = 100, current: int = 50,
                 pinned: set[int] | None = None) -> list[BudgetMessage]:
    """system, then history messages (sizes given), then the current user message."""
    messages = [BudgetMessage(0, "system", system)]
    for offset, tokens in enumerate(history, start=1):
        role = "user" if offset % 2 else "assistant"
        messages.append(BudgetMessage(offset, role, tokens, offset in (pinned or set())))
    messages.append(BudgetMessage(len(history) + 1, "user", current))
    return messages


def plan(messages: list[BudgetMessage], **overrides: object):  # type: ignore[no-untyped-def]
    arguments: dict[str, object] = {
        "max_model_len": 4096, "max_output_tokens": 512, "split": SPLIT,
        "fixed_overhead_tokens": 9, "marker_tokens": marker, "step_turns": 6,
    }
    arguments.update(overrides)
    return plan_context(messages, **arguments)  # type: ignore[arg-type]


def test_everything_fits_no_marker() -> None:
    result = plan(conversation([100] * 10))
    assert result.dropped_indices == ()
    assert not result.truncated
    assert result.marker_tokens == 0
    assert result.kept_indices == tuple(range(12))
    assert result.estimated_prompt_tokens == 9 + 100 + 1000 + 50


def test_long_history_keeps_the_newest_as_the_step_policy_says() -> None:
    history = [100] * 40  # 4000 tokens against a 2048-token history share
    result = plan(conversation(history))
    assert result.truncated
    dropped = result.dropped_indices
    assert dropped == tuple(range(1, 1 + len(dropped)))  # the oldest ones, contiguous
    kept_history = [i for i in result.kept_indices if 1 <= i <= 40]
    assert kept_history == list(range(41 - len(kept_history), 41))  # the newest ones
    # The window stepped where a 2048-token history share with room for 6 more turns puts it.
    start = stable_history_start(history, StepPolicy(2048, 6))
    assert kept_history[0] == 1 + start
    assert result.history_tokens == 100 * len(kept_history) <= result.history_budget_tokens
    assert result.marker_tokens == marker(len(dropped))
    assert result.estimated_prompt_tokens <= 4096 - 512


def test_between_steps_each_turn_keeps_the_previous_turns_history() -> None:
    """Turn t+1 (two messages longer: the answer and the next question, which was turn t's
    current message) keeps exactly what turn t kept plus its two new messages, except on the
    turns where the window steps; steps are 6 turns apart for equal turns."""
    messages = [100] * 60
    plans = [plan(conversation(messages[:length], current=messages[length]))
             for length in range(0, 60, 2)]
    steps = 0
    for before, after in itertools.pairwise(plans):
        kept_before = [i for i in before.kept_indices if i not in (0, before.kept_indices[-1])]
        kept_after = [i for i in after.kept_indices if i not in (0, after.kept_indices[-1])]
        if kept_after[:len(kept_before) + 1] == [*kept_before, before.kept_indices[-1]]:
            assert after.dropped_indices == before.dropped_indices  # the same marker text
        else:
            steps += 1
            assert len(after.dropped_indices) > len(before.dropped_indices)
    # The window walks history and question together (the high-water mark bounds both): a
    # request whose walk ends at message 2k + 1 steps when a step point is 2k or 2k + 1.
    points = step_points(messages[:59], StepPolicy(2048, 6))
    assert steps == len({point // 2 for point in points}) == len(points)
    assert 1 <= steps <= 60 // 2 // 6


def test_a_full_system_prompt_and_retrieval_do_not_move_the_window_every_turn() -> None:
    """With the system prompt at its share and a full RAG share, the history share does not fit
    beside them; the high-water mark is what does, so the window still moves only in steps."""
    messages = [100] * 60
    plans = [plan(conversation(messages[:length], system=512, current=messages[length]),
                  rag_chunk_tokens=[256] * 4)
             for length in range(0, 60, 2)]
    starts = [min((i for i in p.kept_indices if i > 0), default=0) for p in plans]
    moves = [turn for turn, (a, b) in enumerate(itertools.pairwise(starts)) if a != b]
    assert len(moves) >= 2
    assert all(later - earlier >= 6 for earlier, later in itertools.pairwise(moves))
    assert all(p.estimated_prompt_tokens <= 4096 - 512 for p in plans)


def test_system_and_pinned_messages_survive_truncation() -> None:
    result = plan(conversation([100] * 40, pinned={3, 4}))
    assert {0, 3, 4, 41} <= set(result.kept_indices)
    assert 3 not in result.dropped_indices
    assert 4 not in result.dropped_indices
    assert result.instruction_tokens == 100 + 200  # system + two pinned


def test_rag_is_trimmed_before_it_starves_the_question() -> None:
    # A long question leaves 4096-512-9-100-3000 = 475 tokens; RAG chunks of 200 each.
    result = plan(conversation([], current=3000), rag_chunk_tokens=[200, 200, 200, 200],
                  rag_overhead_tokens=20)
    assert result.current_tokens == 3000
    assert result.rag_chunks_kept == 2
    assert result.rag_chunks_dropped == 2
    assert result.rag_tokens == 420
    assert result.estimated_prompt_tokens <= 4096 - 512


def test_rag_is_capped_by_its_share() -> None:
    result = plan(conversation([]), rag_chunk_tokens=[300] * 10)
    assert result.rag_tokens <= 1024
    assert result.rag_chunks_kept == 3


def test_current_message_that_cannot_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(CurrentMessageTooLong) as caught:
        plan(conversation([100], current=3600))
    assert caught.value.param == "messages[2].content"
    assert "needs 3600 tokens but only 3475 fit" in str(caught.value)


def test_instructions_over_their_share_are_refused_naming_pins() -> None:
    with pytest.raises(InstructionsTooLong) as caught:
        plan(conversation([300, 300, 300], pinned={1, 2}))
    assert caught.value.param == "mangaassist.pinned_messages"


def test_absurd_max_tokens_is_refused() -> None:
    with pytest.raises(OutputTooLong) as caught:
        plan(conversation([]), max_output_tokens=4090)
    assert caught.value.param == "max_tokens"


def test_open_breaker_factor_shrinks_history_and_rag() -> None:
    normal = plan(conversation([100] * 40), rag_chunk_tokens=[100] * 20)
    tight = plan(conversation([100] * 40), rag_chunk_tokens=[100] * 20, context_factor=0.5)
    assert tight.history_budget_tokens == normal.history_budget_tokens // 2
    assert tight.history_tokens < normal.history_tokens
    assert tight.rag_tokens <= 512 < normal.rag_tokens


def test_reserve_tokens_tighten_the_prompt_budget() -> None:
    loose = plan(conversation([100] * 40), split=ContextSplit(0.125, 0.25, 0.625, 0.125))
    tight = plan(conversation([100] * 40), split=ContextSplit(0.125, 0.25, 0.625, 0.125),
                 reserve_tokens=300)
    assert tight.prompt_budget_tokens == loose.prompt_budget_tokens - 300
    assert tight.history_tokens <= loose.history_tokens


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(st.integers(min_value=1, max_value=400), max_size=80),
    system=st.integers(min_value=1, max_value=500),
    current=st.integers(min_value=1, max_value=1500),
    rag=st.lists(st.integers(min_value=1, max_value=600), max_size=10),
    max_output=st.integers(min_value=1, max_value=1500),
    factor=st.sampled_from([1.0, 0.5]),
    pinned_seed=st.integers(min_value=0, max_value=2**16),
)
def test_plan_invariants(history: list[int], system: int, current: int, rag: list[int],
                         max_output: int, factor: float, pinned_seed: int) -> None:
    pinned = {i for i in range(1, len(history) + 1) if (pinned_seed >> (i % 16)) & 1 and i % 7 == 0}
    messages = conversation(history, system=system, current=current, pinned=pinned)
    try:
        result = plan(messages, max_output_tokens=max_output, rag_chunk_tokens=rag,
                      rag_overhead_tokens=15, context_factor=factor)
    except (CurrentMessageTooLong, InstructionsTooLong, OutputTooLong):
        return
    kept = set(result.kept_indices)
    assert {0, len(history) + 1} | pinned <= kept  # instructions, pins and the question stay
    assert result.estimated_prompt_tokens <= 4096 - max_output  # inside the window, exactly
    assert result.history_tokens <= result.history_budget_tokens
    free = [i for i in range(1, len(history) + 1) if i not in pinned]
    dropped = list(result.dropped_indices)
    assert dropped == free[:len(dropped)]  # only the oldest unpinned turns are dropped
    assert result.truncated == bool(dropped)
    assert result.rag_chunks_kept + result.rag_chunks_dropped == len(rag)
    assert kept.isdisjoint(dropped)
    assert kept | set(dropped) == set(range(len(messages)))
