"""The OOM circuit breaker: prevention is not containment.

docs/design-decisions.md#prevention-is-not-containment says why.

An engine death or OOM *trips* the breaker; the request that saw it gets a controlled fallback
answer instead of an error, and the process lives. The breaker then tightens admission until the
rebuilt engine has proven itself:

    closed ──trip──► open ──open_s elapsed──► half_open ──N successes──► closed
                      ▲                           │
                      └──────────trip─────────────┘

* **closed** — normal limits.
* **open** — the history and RAG budgets shrink by ``context_factor``; XL requests get the
  "let's start a fresh context" fallback instead of generation.
* **half_open** — still tightened; at most ``half_open_max_inflight`` requests in flight (the
  probes); ``close_after_successes`` successful generations close it; a trip re-opens it.

Pure module: time comes in as an argument; transitions are reported through a callback so the
caller can emit the BreakerState metric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from metrics_contract import BREAKER_STATE_VALUES


class BreakerState(StrEnum):
    """Circuit-breaker states; values match metrics_contract.BREAKER_STATE_VALUES."""

    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"

    @property
    def metric_value(self) -> int:
        """The number the BreakerState metric publishes (0 closed, 1 half-open, 2 open)."""
        return BREAKER_STATE_VALUES[self.value]


@dataclass(frozen=True)
class BreakerPolicy:
    """How long the breaker stays open, what closes it and how much it tightens."""

    open_s: float
    close_after_successes: int
    half_open_max_inflight: int
    context_factor: float

    def __post_init__(self) -> None:
        if self.open_s < 0 or self.close_after_successes < 1 or self.half_open_max_inflight < 1:
            raise ValueError(f"invalid breaker policy: {self}")
        if not 0.0 < self.context_factor <= 1.0:
            raise ValueError(f"context_factor must be in (0, 1], got {self.context_factor}")


Transition = Callable[[BreakerState, BreakerState, str], None]


class CircuitBreaker:
    """State machine of the module docstring; call :meth:`state` with the current time."""

    def __init__(self, policy: BreakerPolicy, *, on_transition: Transition | None = None) -> None:
        self.policy = policy
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._successes = 0
        self.trips = 0
        self._on_transition = on_transition

    def _move(self, new_state: BreakerState, why: str) -> None:
        old_state, self._state = self._state, new_state
        if old_state is not new_state and self._on_transition is not None:
            self._on_transition(old_state, new_state, why)

    def state(self, now: float) -> BreakerState:
        """Current state (open turns half-open once ``open_s`` has passed)."""
        if self._state is BreakerState.OPEN and now - self._opened_at >= self.policy.open_s:
            self._successes = 0
            self._move(BreakerState.HALF_OPEN, f"open for {self.policy.open_s:g} s")
        return self._state

    def record_trip(self, now: float, why: str = "engine died") -> None:
        """An engine OOM/death: open (again), restarting the open period."""
        self.trips += 1
        self._opened_at = now
        self._successes = 0
        self._move(BreakerState.OPEN, why)

    def record_success(self, now: float) -> None:
        """A request generated without engine failure; enough of them in half-open close it."""
        if self.state(now) is BreakerState.HALF_OPEN:
            self._successes += 1
            if self._successes >= self.policy.close_after_successes:
                self._move(BreakerState.CLOSED, f"{self._successes} successful probes")

    def context_factor(self, now: float) -> float:
        """Multiplier of the history/RAG budgets (1 when closed)."""
        if self.state(now) is BreakerState.CLOSED:
            return 1.0
        return self.policy.context_factor

    def refuses_xl(self, now: float) -> bool:
        """True while XL requests get the fresh-context fallback (open or half-open)."""
        return self.state(now) is not BreakerState.CLOSED

    def max_inflight(self, now: float) -> int | None:
        """In-flight cap while half-open (the probes); None otherwise."""
        if self.state(now) is BreakerState.HALF_OPEN:
            return self.policy.half_open_max_inflight
        return None
