"""The prefill valve, one rule per test (gateway.admission.valve)."""

from __future__ import annotations

import math

import pytest

from gateway.admission.valve import (
    LATE_SHARE,
    LOW_RANK,
    LOW_SAMPLES,
    STANDING_DECREASE,
    TARGET_MAX_SHARE,
    TARGET_MIN_SHARE,
    TARGET_STEP,
    PrefillValve,
)


def valve(rate: float = 1000.0, target_s: float = 1.0, weight: float = 0.25) -> PrefillValve:
    return PrefillValve(target_s=target_s, rate=rate, weight=weight)


def test_the_backlog_is_the_prompt_tokens_still_waiting_for_their_first_token() -> None:
    gate = valve()
    gate.enter("a", 300, 0.0)
    gate.enter("b", 200, 0.0)
    assert gate.backlog == 500 and gate.waiting == 2
    gate.first_token("a", 0.4)
    gate.leave("b", 0.5)
    gate.leave("b", 0.5)  # leaving twice (a release after a refusal) changes nothing
    assert gate.backlog == 0 and gate.waiting == 0
    gate.enter("c", 1, 0.0)
    with pytest.raises(ValueError, match="already waiting"):
        gate.enter("c", 1, 0.0)


def test_a_request_is_admitted_while_the_backlog_with_it_fits_the_cap() -> None:
    gate = valve(rate=1000.0, target_s=1.0)  # cap: 1,000 tokens
    gate.enter("a", 600, 0.0)
    assert gate.admits(400, 0.0)
    assert not gate.admits(401, 0.0)


def test_the_floor_admits_one_request_when_nothing_waits_whatever_the_cap() -> None:
    gate = valve(rate=1.0, target_s=1.0)  # a cap of one token
    assert gate.admits(5000, 0.0)
    gate.enter("a", 5000, 0.0)
    assert not gate.admits(1, 0.0)


def test_the_rate_is_the_tokens_drained_per_second_of_backlog_in_quarter_second_windows(
) -> None:
    """Three requests of 100 tokens admitted at once: the first token at 0.1 s does not close a
    window (0.1 s of backlog: first tokens come in batches), the one at 0.3 s makes it due (300
    ms), and the next event after that step closes it: 200 tokens in 0.3 s; the log of the rate
    moves a third of the way (weight 0.35) to 667/s."""
    gate = valve(rate=1000.0, weight=0.35)
    for key in "abc":
        gate.enter(key, 100, 0.0)
    gate.first_token("a", 0.1)
    assert gate.windows == 0 and gate.rate == pytest.approx(1000.0)
    gate.first_token("b", 0.3)
    assert gate.windows == 0  # due: the rest of its step's first tokens may follow
    gate.enter("d", 100, 0.35)
    assert gate.windows == 1
    assert math.log(gate.rate) == pytest.approx(
        math.log(1000) + 0.35 * (math.log(200 / 0.3) - math.log(1000)))


def test_a_window_due_at_a_first_token_takes_in_the_rest_of_that_steps_first_tokens() -> None:
    """Ten prompts of 100 tokens that one step prefilled: their first tokens reach the valve a
    millisecond apart at 1.0 s. The window comes due at the first of them and takes in the other
    nine: 1,000 tokens in 1.009 s, whether the backlog empties with them or another request
    still waits (closed at the first, it measured 100 tokens a second and carried the rest)."""
    for still_waiting in (False, True):
        gate = valve(rate=5000.0, weight=1.0)
        for index in range(10):
            gate.enter(index, 100, 0.0)
        if still_waiting:
            gate.enter("later", 100, 0.0)
        for index in range(10):
            gate.first_token(index, 1.0 + index * 0.001)
        if still_waiting:
            assert gate.windows == 0
            gate.enter("next", 100, 1.5)  # an event after that step: the due window closes
        assert gate.windows == 1 and gate.rate == pytest.approx(1000 / 1.009)


def test_a_window_closes_when_the_backlog_empties() -> None:
    """A request alone: its own prompt over its own wait (a quiet spell learns at once)."""
    gate = valve(rate=1000.0, weight=1.0)
    gate.enter("a", 300, 5.0)
    gate.first_token("a", 5.1)
    assert gate.windows == 1 and gate.rate == pytest.approx(3000.0)


def test_the_rest_of_a_stretch_too_short_to_measure_is_carried_not_dropped() -> None:
    """Two waves: the window across the gap comes due at the second wave's first token and
    closes at the next step's (200 tokens in 0.6 s); the second wave's quick drain (1,000 tokens in 50 ms) is too short to measure
    alone and is carried into the next window, which closes after 0.25 s of backlog (dropped,
    it left the rate at the gap's after every such burst)."""
    gate = valve(rate=1000.0, weight=1.0)
    gate.enter("a", 100, 0.0)
    gate.enter("b", 100, 0.0)
    gate.enter("c", 1000, 0.0)
    gate.first_token("a", 0.1)
    gate.first_token("b", 0.6)
    gate.first_token("c", 0.65)  # the next step: the window due at b closes first
    assert gate.windows == 1 and gate.rate == pytest.approx(200 / 0.6)
    gate.enter("d", 100, 5.0)
    gate.first_token("d", 5.15)  # 0.2 s of backlog with the carried 50 ms: not yet
    assert gate.windows == 1
    gate.enter("e", 100, 6.0)
    gate.first_token("e", 6.1)
    assert gate.windows == 2 and gate.rate == pytest.approx(1200 / 0.3)
    gate.enter("f", 100, 9.0)
    gate.first_token("f", 9.1)  # nothing carried any more: a whole stretch again
    assert gate.windows == 3 and gate.rate == pytest.approx(1000.0)


def test_time_without_backlog_is_not_counted() -> None:
    gate = valve(rate=1000.0, weight=1.0)
    gate.enter("a", 100, 0.0)
    gate.leave("a", 0.05)  # left without a first token: 50 ms of backlog, nothing drained
    gate.enter("b", 100, 10.0)  # ten idle seconds later
    gate.first_token("b", 10.05)
    assert gate.rate == pytest.approx(100 / 0.1)


def test_a_first_token_that_must_not_teach_leaves_the_rate_alone() -> None:
    gate = valve(rate=1000.0)
    gate.enter("a", 100, 0.0)
    gate.first_token("a", 10.0, learn=False)  # warmup's first pass: a compile, not the speed
    assert gate.rate == pytest.approx(1000.0) and gate.backlog == 0


def test_a_request_still_waiting_bounds_the_rate_before_its_first_token() -> None:
    """CoDel's lesson: a request admitted 2 s ago with 600 tokens to drain (its own and those
    ahead of it) shows the rate is at most 300/s now, whatever was learned."""
    gate = valve(rate=10_000.0, target_s=1.0)
    gate.enter("a", 600, 0.0)
    gate.enter("b", 400, 1.0)  # 600 ahead + 400 own in 1 s: at most 1,000/s
    assert gate.bound(2.0) == pytest.approx(300.0)
    assert gate.cap(2.0) == pytest.approx(300.0)
    assert gate.cap(0.4) == pytest.approx(10_000.0)  # under half the target: a fixed cost
    assert gate.bound(0.5) == pytest.approx(1200.0)


def test_the_retry_after_is_the_time_until_the_backlog_with_it_drains_to_the_target() -> None:
    gate = valve(rate=1000.0, target_s=1.0)
    gate.enter("a", 2500, 0.0)
    assert gate.drain_s(500, 0.0) == pytest.approx(2.0)
    assert gate.drain_s(0, 0.0) == pytest.approx(1.5)


def test_the_low_rate_is_the_second_slowest_of_the_last_eight_windows() -> None:
    """Each request alone, from empty backlog to empty: a window each. Windows at 1,000 tokens
    a second, one at 500 among them: the low rate passes it by (one step that ran slow alone
    does not hold every burst for eight windows); with a second at 400 it is 500, the faster
    of the two, while the rate's recent level forgets both (the turnover's replay predicts
    waits with :attr:`~PrefillValve.low`, not the level). Eight windows later they are gone;
    before any window the low rate is the rate learned."""
    gate = valve(rate=1000.0, weight=0.35)
    assert gate.low == pytest.approx(1000.0)

    def alone(key: str, seconds: float, at: float) -> None:
        gate.enter(key, 500, at)
        gate.first_token(key, at + seconds)

    alone("slow", 1.0, 0.0)
    assert gate.low == pytest.approx(500.0)  # the only measure
    alone("usual", 0.5, 5.0)
    assert LOW_RANK == 2 and gate.low == pytest.approx(1000.0)
    alone("slower", 1.25, 7.0)
    for index in range(LOW_SAMPLES - 3):
        alone(f"usual{index}", 0.5, 10.0 + index)
    assert gate.windows == LOW_SAMPLES
    assert gate.rate > 800 and gate.low == pytest.approx(500.0)
    alone("one more", 0.5, 30.0)
    assert gate.low == pytest.approx(1000.0)  # 500 forgotten; 400 alone is passed by
    gate.reset(2000.0)
    assert gate.low == pytest.approx(2000.0)


def test_reset_starts_again_from_a_rate_and_keeps_what_waits() -> None:
    gate = valve(rate=50.0)
    gate.enter("a", 100, 0.0)
    gate.first_token("b", 1.0)  # unknown key: ignored
    gate.reset(2000.0)
    assert gate.rate == pytest.approx(2000.0) and gate.backlog == 100 and gate.windows == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"target_s": 0.0, "rate": 1.0}, "target_s must be > 0"),
    ({"target_s": 1.0, "rate": 1.0, "weight": 0.0}, "weight must be in"),
    ({"target_s": 1.0, "rate": 1.0, "weight": 1.5}, "weight must be in")])
def test_nonsense_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefillValve(**kwargs)


def steered(target_s: float = 1.5, slo_s: float = 2.0) -> PrefillValve:
    """A valve whose target follows the first tokens (rate 1,000/s)."""
    return PrefillValve(target_s=target_s, rate=1000.0, weight=0.25, slo_s=slo_s)


def test_a_late_first_token_lowers_the_target_once_per_round_trip() -> None:
    """Admitted by the cap, first token after 0.8 of the SLO: the target comes down at once by
    the bound over that wait (1.6 s over 1.7 s); another late one admitted before that decrease
    does not move it (it reports the old target), one admitted after it does."""
    gate = steered()
    bound = LATE_SHARE * 2.0
    gate.enter("a", 100, 0.0)
    gate.enter("b", 100, 0.0)
    gate.first_token("a", 1.7)
    assert gate.target_s == pytest.approx(1.5 * bound / 1.7)
    gate.first_token("b", 1.9)  # admitted at 0 s, before the decrease at 1.7 s
    assert gate.target_s == pytest.approx(1.5 * bound / 1.7)
    gate.enter("c", 100, 3.0)
    gate.first_token("c", 4.9)
    assert gate.target_s == pytest.approx(1.5 * bound / 1.7 * bound / 1.9)


def test_a_standing_queue_lowers_the_target() -> None:
    """For an SLO's worth of seconds (2 s) no first token within a quarter of the SLO (0.5 s):
    the backlog only adds delay, the target comes down by STANDING_DECREASE; an interval with
    one quick first token leaves it."""
    gate = steered()
    gate.enter("keep", 1, 0.0)
    for index in range(5):  # waits of 0.6 s, one every 0.5 s, 0.5 to 2.5 s
        gate.enter(index, 100, index * 0.5 - 0.1)
        gate.first_token(index, index * 0.5 + 0.5)
    assert gate.target_s == pytest.approx(1.5 * STANDING_DECREASE)
    for index in range(5, 10):  # 3.0 to 5.0 s, one of them quick
        gate.enter(index, 100, index * 0.5 - (0.2 if index == 7 else 0.1))
        gate.first_token(index, index * 0.5 + (0.0 if index == 7 else 0.5))
    assert gate.target_s == pytest.approx(1.5 * STANDING_DECREASE)


def test_a_backlog_that_empties_between_slow_first_tokens_is_not_standing() -> None:
    """A request alone, 0.6 s to its first token; ten seconds later two more, the first of
    them 0.6 s too: the backlog emptied in between, so the standing rule's interval ended with
    it and no SLO's worth of standing backlog was seen; no decrease."""
    gate = steered()
    gate.enter("a", 100, 0.0)
    gate.first_token("a", 0.6)
    gate.enter("b", 100, 10.0)
    gate.enter("c", 100, 10.0)
    gate.first_token("b", 10.6)
    assert gate.target_s == pytest.approx(1.5)


def test_a_backlog_that_ran_dry_after_refusals_raises_the_target() -> None:
    """The valve turned users away and then the engine ran out of work: the target goes up by
    TARGET_STEP of the SLO; a backlog that empties without refusals leaves it."""
    gate = steered()
    gate.enter("a", 100, 0.0)
    gate.first_token("a", 0.3)
    assert gate.target_s == pytest.approx(1.5)
    gate.enter("b", 100, 1.0)
    gate.refused()
    gate.first_token("b", 1.3)
    assert gate.target_s == pytest.approx(1.5 + TARGET_STEP * 2.0)
    gate.enter("c", 100, 2.0)
    gate.refused()
    gate.leave("c", 2.1)  # left without a first token (cancelled): ran dry all the same
    assert gate.target_s == pytest.approx(1.5 + 2 * TARGET_STEP * 2.0)


def test_a_backlog_that_ran_dry_without_room_in_the_engine_leaves_the_target() -> None:
    """The backlog emptied after refusals while the running answers hold the engine's KV pool
    (``room`` says no request could start at once): the refusals were of requests that would
    have waited for room, and the target stays. In a sustained surge of short chats on the CPU
    build the backlog emptied after every wave so, and the step took the target to 1.79 s (0.9
    of the SLO); 3 of 82 admitted started late (the code before raised it each time)."""
    room = [False]
    gate = steered()
    gate.room = lambda: room[0]
    gate.enter("a", 100, 1.0)
    gate.refused()
    gate.first_token("a", 1.3)
    assert gate.target_s == pytest.approx(1.5)
    gate.enter("b", 100, 2.0)
    gate.refused()
    room[0] = True
    gate.first_token("b", 2.3)
    assert gate.target_s == pytest.approx(1.5 + TARGET_STEP * 2.0)


def test_a_backlog_with_a_late_first_token_does_not_raise_the_target_when_it_runs_dry() -> None:
    """A stretch in which a request the cap admitted was late did not run short of work: it
    ends without the ran-dry step, after the late rule's decrease (the late rule took the
    target down by 1.6 s over 1.7 s once; the step after every burst took it back up and
    more, 1.4 to 1.73 s over fifteen bursts of the seventh round)."""
    gate = steered()
    gate.enter("a", 100, 0.0)
    gate.enter("b", 100, 0.0)
    gate.refused()
    gate.first_token("a", 1.7)
    gate.first_token("b", 1.75)  # the backlog ran dry after refusals, with a late request
    assert gate.target_s == pytest.approx(1.5 * LATE_SHARE * 2.0 / 1.7)
    gate.enter("c", 100, 5.0)
    gate.refused()
    gate.first_token("c", 5.3)  # the next stretch: no late request, so the step again
    assert gate.target_s == pytest.approx(1.5 * LATE_SHARE * 2.0 / 1.7 + TARGET_STEP * 2.0)


def test_the_target_stays_within_its_bounds() -> None:
    gate = steered()
    for index in range(40):
        gate.enter(index, 10, 10.0 * index)
        gate.refused()
        gate.first_token(index, 10.0 * index + 0.1)
    assert gate.target_s == pytest.approx(TARGET_MAX_SHARE * 2.0)
    for index in range(40, 80):
        gate.enter(index, 10, 10.0 * index)
        gate.first_token(index, 10.0 * index + 1.95)
    assert gate.target_s == pytest.approx(TARGET_MIN_SHARE * 2.0)


def test_what_the_floor_or_warmup_admitted_does_not_move_the_target() -> None:
    gate = steered()
    gate.enter("keep", 1, 0.0)
    gate.enter("a", 5000, 0.0, by_cap=False)  # over the cap, admitted by the floor
    gate.first_token("a", 1.95)
    assert gate.target_s == pytest.approx(1.5)
    gate.enter("b", 100, 2.0)
    gate.first_token("b", 3.95, learn=False)  # warmup's first pass teaches nothing
    assert gate.target_s == pytest.approx(1.5)


def test_without_an_slo_the_target_stays_and_reset_restores_it() -> None:
    fixed = valve(target_s=1.0)
    fixed.enter("a", 100, 0.0)
    fixed.refused()
    fixed.first_token("a", 1.95)
    assert fixed.target_s == pytest.approx(1.0)
    gate = steered()
    gate.enter("a", 100, 0.0)
    gate.first_token("a", 1.95)
    assert gate.target_s < 1.5
    gate.reset(1000.0)  # a new engine: the rate and the target start again
    assert gate.target_s == pytest.approx(1.5)
    with pytest.raises(ValueError, match="slo_s must be >= target_s"):
        PrefillValve(target_s=2.0, rate=1.0, slo_s=1.0)
