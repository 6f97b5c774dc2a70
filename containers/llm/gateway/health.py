"""What ``/ping`` answers, crash-loop detection and the rebuild backoff. Pure module.

SageMaker routes traffic only to instances whose ``/ping`` answers 200 within 2 s and replaces an
instance whose ``/ping`` keeps failing. So ``/ping`` is computed from state alone, never by asking
the engine, and it turns red only when replacing the instance is the right answer:

* 503 ``warming_up`` — the engine is starting, or warmup has not yet pushed its representative
  requests through the full path (SageMaker must not route users to a cold instance).
* 200 ``healthy`` — serving.
* 200 ``recovering`` — the engine died and is being rebuilt (and the rebuilt engine warmed up),
  for at most the recovery grace: one OOM must not cost the instance (and every session on it) a
  replacement. Requests meanwhile get a 503 at once (docs/gateway.md#engine-rebuild).
* 503 ``recovery_overdue`` — rebuilding took longer than the grace.
* 503 ``crash_loop`` — N engine deaths within the window: something persistent is wrong.
* 503 ``failed`` — the engine could not be (re)built within the bounded retries, or the start-up
  configuration check failed.
* 503 ``draining`` — SIGTERM received; finishing in-flight requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum


class EnginePhase(StrEnum):
    """Lifecycle of the engine slot the supervisor manages."""

    STARTING = "starting"
    READY = "ready"
    RECOVERING = "recovering"
    WARMING = "warming"
    """A rebuilt engine running its warmup: only warmup requests reach it."""
    FAILED = "failed"
    STOPPING = "stopping"


@dataclass(frozen=True)
class RestartPolicy:
    """Bounded rebuild attempts with exponential backoff."""

    max_attempts: int
    backoff_s: float
    backoff_max_s: float

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait before rebuild attempt ``attempt`` (1-based): backoff × 2^(n-1)."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1)))


class CrashLoopDetector:
    """N engine deaths within a sliding window make a crash loop."""

    def __init__(self, *, deaths: int, window_s: float) -> None:
        if deaths < 1 or window_s <= 0:
            raise ValueError(f"deaths must be >= 1 and window_s > 0, got {deaths}, {window_s}")
        self.deaths = deaths
        self.window_s = window_s
        self._times: deque[float] = deque()

    def record(self, now: float) -> None:
        """Count one engine death at ``now``."""
        self._times.append(now)
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()

    def deaths_in_window(self, now: float) -> int:
        """Deaths within the last ``window_s``."""
        self._expire(now)
        return len(self._times)

    def is_crash_loop(self, now: float) -> bool:
        """True while the window holds at least ``deaths`` deaths."""
        return self.deaths_in_window(now) >= self.deaths


@dataclass(frozen=True)
class PingAnswer:
    """HTTP status and the body's ``status`` / ``reason``."""

    http_status: int
    status: str
    reason: str


def ping_answer(
    *,
    phase: EnginePhase,
    warmed_up: bool,
    draining: bool,
    crash_loop: bool,
    deaths_in_window: int,
    crash_loop_window_s: float,
    recovering_since: float | None,
    now: float,
    recovery_grace_s: float,
    failure_reason: str | None,
    warmup_progress: str,
    last_start_error: str | None = None,
) -> PingAnswer:
    """The /ping answer for this state (see the module docstring)."""
    if draining or phase is EnginePhase.STOPPING:
        return PingAnswer(503, "draining", "shutting down; finishing in-flight requests")
    if crash_loop:
        return PingAnswer(503, "crash_loop", f"{deaths_in_window} engine deaths within "
                                             f"{crash_loop_window_s:g} s")
    if phase is EnginePhase.FAILED:
        return PingAnswer(503, "failed", failure_reason or "the engine could not be started")
    if phase in (EnginePhase.RECOVERING, EnginePhase.WARMING):
        since = now - (recovering_since if recovering_since is not None else now)
        if since > recovery_grace_s:
            return PingAnswer(503, "recovery_overdue",
                              f"engine rebuild running for {since:.0f} s, grace is "
                              f"{recovery_grace_s:g} s")
        if warmed_up:
            retrying = f"; {last_start_error}" if last_start_error else ""
            doing = ("rebuilt; warming up" if phase is EnginePhase.WARMING
                     else "rebuilding")
            return PingAnswer(200, "recovering", f"engine died; {doing} for {since:.1f} s "
                                                 f"(grace {recovery_grace_s:g} s){retrying}")
    if not warmed_up:
        if phase is EnginePhase.READY:
            return PingAnswer(503, "warming_up", warmup_progress)
        retrying = f"; retrying after {last_start_error}" if last_start_error else ""
        return PingAnswer(503, "warming_up", f"engine starting{retrying}")
    return PingAnswer(200, "healthy", "serving")
