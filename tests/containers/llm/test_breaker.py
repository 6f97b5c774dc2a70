"""The OOM circuit breaker's state machine."""

from __future__ import annotations

from gateway.breaker import BreakerPolicy, BreakerState, CircuitBreaker

POLICY = BreakerPolicy(open_s=30.0, close_after_successes=3, half_open_max_inflight=2,
                       context_factor=0.5)


def test_closed_open_half_open_closed() -> None:
    transitions: list[tuple[str, str]] = []
    breaker = CircuitBreaker(POLICY, on_transition=lambda a, b, _why: transitions.append(
        (a.value, b.value)))
    assert breaker.state(0.0) is BreakerState.CLOSED
    assert breaker.context_factor(0.0) == 1.0
    assert not breaker.refuses_xl(0.0)
    assert breaker.max_inflight(0.0) is None

    breaker.record_trip(10.0)
    assert breaker.state(10.0) is BreakerState.OPEN
    assert breaker.context_factor(20.0) == 0.5
    assert breaker.refuses_xl(20.0)
    breaker.record_success(20.0)  # successes while open do not count
    assert breaker.state(39.9) is BreakerState.OPEN

    assert breaker.state(40.0) is BreakerState.HALF_OPEN
    assert breaker.max_inflight(40.0) == 2
    assert breaker.refuses_xl(40.0)
    breaker.record_success(41.0)
    breaker.record_success(42.0)
    assert breaker.state(42.0) is BreakerState.HALF_OPEN
    breaker.record_success(43.0)
    assert breaker.state(43.0) is BreakerState.CLOSED
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert breaker.trips == 1


def test_trip_while_half_open_reopens_and_restarts_the_clock() -> None:
    breaker = CircuitBreaker(POLICY)
    breaker.record_trip(0.0)
    assert breaker.state(30.0) is BreakerState.HALF_OPEN
    breaker.record_success(31.0)
    breaker.record_trip(32.0)
    assert breaker.state(61.0) is BreakerState.OPEN
    assert breaker.state(62.0) is BreakerState.HALF_OPEN
    for moment in (63.0, 64.0):
        breaker.record_success(moment)
    assert breaker.state(64.5) is BreakerState.HALF_OPEN  # the earlier success was reset
    assert breaker.trips == 2


def test_metric_values_match_the_contract() -> None:
    assert [state.metric_value for state in BreakerState] == [0, 1, 2]
