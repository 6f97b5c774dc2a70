"""/ping decisions, crash-loop detection and the rebuild backoff (pure)."""

from __future__ import annotations

import pytest

from gateway.health import (
    CrashLoopDetector,
    EnginePhase,
    RestartPolicy,
    ping_answer,
)


def test_crash_loop_window() -> None:
    detector = CrashLoopDetector(deaths=3, window_s=60.0)
    for moment in (0.0, 10.0):
        detector.record(moment)
    assert not detector.is_crash_loop(10.0)
    detector.record(50.0)
    assert detector.is_crash_loop(50.0)
    assert detector.deaths_in_window(50.0) == 3
    assert not detector.is_crash_loop(60.5)  # the first death left the window


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RestartPolicy(max_attempts=6, backoff_s=0.5, backoff_max_s=3.0)
    assert [policy.delay_before(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def answer(**overrides: object):  # type: ignore[no-untyped-def]
    state: dict[str, object] = {
        "phase": EnginePhase.READY, "warmed_up": True, "draining": False, "crash_loop": False,
        "deaths_in_window": 0, "crash_loop_window_s": 600.0, "recovering_since": None,
        "now": 100.0, "recovery_grace_s": 120.0, "failure_reason": None,
        "warmup_progress": "warmup 3/14 requests",
    }
    state.update(overrides)
    return ping_answer(**state)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "status", "http"),
    [
        ({}, "healthy", 200),
        ({"phase": EnginePhase.STARTING, "warmed_up": False}, "warming_up", 503),
        ({"warmed_up": False}, "warming_up", 503),
        ({"phase": EnginePhase.RECOVERING, "recovering_since": 50.0}, "recovering", 200),
        ({"phase": EnginePhase.RECOVERING, "recovering_since": -30.0}, "recovery_overdue", 503),
        ({"crash_loop": True, "deaths_in_window": 3}, "crash_loop", 503),
        ({"crash_loop": True, "warmed_up": False}, "crash_loop", 503),
        ({"phase": EnginePhase.FAILED, "failure_reason": "gave up"}, "failed", 503),
        ({"draining": True}, "draining", 503),
    ],
)
def test_ping_answers(overrides: dict[str, object], status: str, http: int) -> None:
    result = answer(**overrides)
    assert (result.status, result.http_status) == (status, http)
    assert result.reason
