"""The prefill valve, one rule per test (gateway.admission.valve)."""

from __future__ import annotations

import math

import pytest

from gateway.admission.valve import PrefillValve


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
    window (0.1 s of backlog: first tokens come in batches), the one at 0.3 s does (300 ms):
    200 tokens in 0.3 s; the log of the rate moves a third of the way (weight 0.35) to 667/s."""
    gate = valve(rate=1000.0, weight=0.35)
    for key in "abc":
        gate.enter(key, 100, 0.0)
    gate.first_token("a", 0.1)
    assert gate.windows == 0 and gate.rate == pytest.approx(1000.0)
    gate.first_token("b", 0.3)
    assert gate.windows == 1
    assert math.log(gate.rate) == pytest.approx(
        math.log(1000) + 0.35 * (math.log(200 / 0.3) - math.log(1000)))


def test_a_window_closes_when_the_backlog_empties() -> None:
    """A request alone: its own prompt over its own wait (a quiet spell learns at once)."""
    gate = valve(rate=1000.0, weight=1.0)
    gate.enter("a", 300, 5.0)
    gate.first_token("a", 5.1)
    assert gate.windows == 1 and gate.rate == pytest.approx(3000.0)


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
