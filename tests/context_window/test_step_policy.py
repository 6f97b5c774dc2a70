"""The sliding window's step policy (pure): it never exceeds the high-water mark, it is the same
decision on every turn of a growing conversation, and it steps rarely enough that the engine's
prefix cache serves most turns."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_window import (
    MESSAGES_PER_TURN,
    StepPolicy,
    history_starts,
    stable_history_start,
    step_points,
)

sizes = st.lists(st.integers(min_value=0, max_value=600), max_size=120)
policies = st.builds(StepPolicy, high_water_tokens=st.integers(min_value=0, max_value=4096),
                     step_turns=st.integers(min_value=1, max_value=12))


@settings(max_examples=400, deadline=None)
@given(history=sizes, policy=policies)
def test_the_kept_history_never_exceeds_the_high_water_mark(history: list[int],
                                                            policy: StepPolicy) -> None:
    start = stable_history_start(history, policy)
    assert 0 <= start <= len(history)
    assert sum(history[start:]) <= policy.high_water_tokens


@settings(max_examples=400, deadline=None)
@given(history=sizes, policy=policies, extra=st.lists(st.integers(0, 600), min_size=1,
                                                      max_size=4))
def test_a_longer_conversation_keeps_its_start_unless_a_step_falls_on_the_new_messages(
        history: list[int], policy: StepPolicy, extra: list[int]) -> None:
    """History is append-only: the start found for turn t+1 is turn t's, or it moved forward at
    one of the new messages (a step), never back."""
    before = stable_history_start(history, policy)
    grown = [*history, *extra]
    after = stable_history_start(grown, policy)
    assert after >= before
    stepped = [point for point in step_points(grown, policy) if point > len(history)]
    assert (after == before) == (not stepped)
    starts = list(history_starts(grown, policy))
    assert starts[len(history) - 1 if history else 0:] == sorted(starts[len(history) - 1
                                                                        if history else 0:])


@settings(max_examples=300, deadline=None)
@given(message=st.integers(min_value=1, max_value=400),
       high_water=st.integers(min_value=256, max_value=8192),
       step_turns=st.integers(min_value=1, max_value=10))
def test_equal_turns_step_at_least_step_turns_apart(message: int, high_water: int,
                                                    step_turns: int) -> None:
    """... or as far apart as the high-water mark allows, when it holds fewer turns (a step
    then keeps only the newest turn)."""
    policy = StepPolicy(high_water, step_turns)
    points = step_points([message] * 400, policy)
    gaps = [later - earlier for earlier, later in itertools.pairwise(points)]
    fits = high_water // message
    assert all(gap >= min(step_turns * MESSAGES_PER_TURN, fits - 1) for gap in gaps)


@settings(max_examples=300, deadline=None)
@given(mean=st.integers(min_value=20, max_value=300),
       jitter=st.lists(st.floats(min_value=-0.25, max_value=0.25), min_size=200, max_size=200),
       high_water=st.integers(min_value=1024, max_value=8192),
       step_turns=st.integers(min_value=2, max_value=10))
def test_typical_turns_step_at_least_sixty_percent_of_step_turns_apart(
        mean: int, jitter: list[float], high_water: int, step_turns: int) -> None:
    """Messages within ±25 % of a typical size: a step leaves room for ``step_turns`` turns of
    the running mean (≥ 0.75 of it), each message takes at most 1.25 of it, so steps are at
    least 0.6 × step_turns turns apart."""
    history = [round(mean * (1 + j)) for j in jitter]
    points = step_points(history, StepPolicy(high_water, step_turns))
    gaps = [later - earlier for earlier, later in itertools.pairwise(points)]
    fits = high_water / (1.25 * mean)  # messages the mark holds at the least
    assert all(gap >= min(0.6 * step_turns * MESSAGES_PER_TURN, fits - 2) - 1
               for gap in gaps), gaps


def test_a_step_keeps_room_for_step_turns_average_turns() -> None:
    # 2,048 tokens of history at most; 110-token messages: a step keeps at most
    # 2,048 - 6 x 2 x 110 = 728 tokens (6 messages, 660 tokens).
    policy = StepPolicy(2048, 6)
    history = [110] * 19  # 2,090 tokens: the 19th message passes the mark
    start = stable_history_start(history, policy)
    assert sum(history[start:]) == 660
    assert stable_history_start(history[:18], policy) == 0


def test_a_step_keeps_the_newest_turn_when_the_window_holds_few_turns() -> None:
    # 512 tokens of history, 100-token messages: room for 6 turns (1,200 tokens) does not
    # exist, so a step keeps only the newest exchange (200 tokens), never nothing.
    policy = StepPolicy(512, 6)
    history = [100] * 6
    start = stable_history_start(history, policy)
    assert history[start:] == [100, 100]


def test_a_newest_turn_above_the_mark_is_dropped_too() -> None:
    assert stable_history_start([10, 700], StepPolicy(512, 6)) == 2


@pytest.mark.parametrize(("high_water", "step_turns", "message"), [(-1, 6, "high_water"),
                                                                    (10, 0, "step_turns")])
def test_a_bad_policy_names_the_field(high_water: int, step_turns: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepPolicy(high_water, step_turns)


def test_a_negative_size_names_the_message() -> None:
    with pytest.raises(ValueError, match=r"history_tokens\[2\]"):
        stable_history_start([1, 2, -3], StepPolicy(10, 1))
