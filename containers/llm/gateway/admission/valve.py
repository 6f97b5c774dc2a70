"""The prefill valve: refuse on arrival when the prompt tokens still waiting for their first
token would take longer than the target to drain at the rate the engine is measured to drain them.

vLLM's own server has the static form of this valve (``--max-num-queued-tokens``: refuse when the
prompt tokens of requests still in prefill reach a cap an operator sizes as target TTFT ×
prefill throughput). The gateway keeps the rule and measures the cap instead of asking for it
(docs/design-decisions.md#surge-admission):

* **the backlog** — prompt tokens of every admitted request that has not had its first token:
  those queued in the gateway for KV room and those the engine is prefilling, counted whole
  (as vLLM counts them);
* **the drain rate** — prompt tokens that reached their first token per second *while the
  backlog was not empty*: the engine's prefill throughput under whatever else it was doing then
  (decoding, waiting for KV room, a LoRA swap), the figure vLLM's docs size the cap from. It is
  measured over windows of :data:`WINDOW_S` seconds of backlog, or over a whole shorter stretch
  of backlog, from empty to empty (a request alone: its own prompt over its own wait), and each
  window moves the log of the estimate by :data:`DRAIN_WEIGHT` toward what it measured. A
  window never closes on a first token alone: the engine emits first tokens in batches, one
  step for several requests, and two of them a millisecond apart measure nothing; and a window
  that comes due at a first token takes in the rest of that step's first tokens
  (:data:`SAME_STEP_S`) before it closes;
* **what is still waiting** — a request admitted ``age`` seconds ago without its first token
  proves the rate is at most ``(ahead + own) ÷ age`` now; once it has waited
  :data:`BOUND_AFTER` of the target (before that its wait is mostly the engine's fixed cost per
  request) the valve closes on that evidence without waiting for the first token that would
  teach it (CoDel's lesson: act on the time spent in the queue, not on the last departure);
* **the cap** — ``target_s`` × the lower of the two rates; a request is admitted when the
  backlog with its own prompt fits the cap, **or when nothing is waiting** (the floor: one
  request at a time always goes, so a wrong estimate always gets the first token that corrects
  it), **or when it fits one scheduler step** (:meth:`fits_step`: the backlog with it is at most
  ``step_tokens``, vLLM's ``max_num_batched_tokens``, and no waiting request has shown the
  engine slow) — the controller asks that only when the engine can take the request at once.
  A backlog of one step is prefilled in one step, and a rate measured at such a backlog is the
  step's latency, not the engine's throughput: on a batched GPU engine a lone 150-token prompt
  takes a 150 ms step (H100, eager, 932 tokens/s learned) and 2,048 about the same step, so
  without this the valve kept the backlog too small to ever see the batch's rate and refused
  12,898 requests of a closed loop of 64 (docs/gateway.md#surges).

**A slow recent measure** (:attr:`PrefillValve.low`): the valve also keeps its last
:data:`LOW_SAMPLES` windows' measures, and the turnover's replay predicts waits with the second
slowest of them (:data:`LOW_RANK`; ``AdmissionController.prefill_rate``), where the cap keeps the
level: a burst's prompts are prefilled in a few long steps whose first tokens come together, and
a step slower than the level starts a whole batch late (docs/design-decisions.md#surge-admission,
twentieth and twenty-first rounds).

**The target follows the first tokens** (when the valve knows the SLO, ``slo_s``). A backlog
does not drain at one rate: a burst on an idle engine starts the pool's worth at once and the
next wave only as the first finishes its answers, so where the SLO falls in tokens of backlog
depends on the surge's shape, and no one share of the SLO fits both shapes. Half of it left
one-shot bursts at 0.33-0.64x what vLLM without a cap starts within the SLO; 0.85 reached
parity there and let admitted p99 reach 2.4 s. In a sustained surge a higher target buys no
answers at all (the engine is saturated either way) and only lengthens every wait. The target
starts at :data:`TARGET_SHARE` of the SLO, stays between :data:`TARGET_MIN_SHARE` and
:data:`TARGET_MAX_SHARE`, and moves by three rules (CoDel's, on first tokens):

* **late** — a request the cap admitted after the last decrease had its first token later than
  :data:`LATE_SHARE` of the SLO: down by the ratio of that bound to the wait (a near miss nudges
  it, a wait twice the bound halves it), once per round trip: the late ones admitted before a
  decrease report the old target;
* **standing** — for an SLO's worth of seconds the backlog never emptied and no first token came
  within :data:`STANDING_SHARE` of the SLO: a standing queue, whose only effect is delay; down by
  :data:`STANDING_DECREASE`;
* **ran dry** — the backlog emptied after the valve had refused requests while it lasted, none
  of the requests the cap admitted into it was late, and the engine has room to start another
  request at once (``room``, the controller's: a sequence, and KV room beside what the running
  answers will hold at their ends): the engine ran out of work it could have had; up by
  :data:`TARGET_STEP` of the SLO. Without room the refusals were of requests that would have
  waited for it, and a higher target only admits longer waits: in a sustained surge of short
  chats on the CPU build, where the backlog empties after every wave while the answers hold
  the pool, the rule took the target to 1.79 s (0.9 of the SLO) and 3 of 82 admitted started
  late (issue 37, nineteenth round). A stretch with a late first token did not
  run short of work, it had too much: the late rule lowers the target once per round trip, by
  the first late request's small ratio (1.6 s over 1.67 s), and raised again by a step after
  every burst, the target climbed from 1.4 to 1.73 s over fifteen bursts until the bursts'
  next waves started late (up to 12 of about 40 admitted after the SLO in a burst at 4x-16x;
  issue 37, seventh round).

Requests the floor or the step rule admitted are not the cap's decision and teach nothing. No
baseline latency to drift (Netflix's gradient limits compare with one): the bounds are shares of
the SLO.

Why it heals a wrong estimate in seconds: a cap ``k`` times too small still admits by the floor,
and each window moves the log-rate by ``DRAIN_WEIGHT × log k``; a cap too large admits a
backlog whose age closes the valve within ``target_s`` and whose first tokens then teach the
true rate. Why a throughput and not each request's own wait: the first request in line starts
at once whatever the backlog behind it, so short waits would teach a rate far above the one the
last request in a full backlog sees. There is no baseline to drift: the cap is the target times
a rate, both measured in the units the decision uses.

Pure module: standard library only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

DRAIN_WEIGHT = 0.35
"""How far one window moves the log of the drain rate toward what it measured."""
WINDOW_S = 0.25
"""Seconds of backlog that close a measuring window (a surge learns four times a second; a
quiet spell, at the end of each stretch of backlog)."""
SAME_STEP_S = 0.01
"""First tokens this close after the one at which a window came due are the same engine step's
(the gateway takes a step's outputs one request at a time): they count in that window. Closed
at the first of them, a window measured a batch that one step prefilled as that request's
prompt alone (warmup's calibration batch of 16: 1,453 tokens that reached their first token
together after 0.98 s counted as one 90-token prompt, about 250 tokens a second learned), and
the rest of the batch fell into the next window."""
TARGET_SHARE = 0.7
"""The valve's target first token as a share of the TTFT SLO before any feedback: the last
request admitted into a full backlog waits about the target, and the spread of real first
tokens around it (a decode step, a LoRA load, the next wave of a burst) must stay under the
SLO at the 99th percentile. The first tokens move it (see the module docstring)."""
TARGET_MIN_SHARE = 0.25
TARGET_MAX_SHARE = 0.9
"""The bounds the feedback keeps the target in, as shares of the SLO."""
LATE_SHARE = 0.8
"""An admitted request whose first token came later than this share of the SLO came close to
a miss: the target comes down (the spread of first tokens around the target is what the rest
of the SLO is for)."""
STANDING_SHARE = 0.25
"""A stretch of backlog in which no first token came within this share of the SLO, for an SLO's
worth of seconds, is a standing queue."""
STANDING_DECREASE = 0.9
"""What a standing queue multiplies the target by."""
TARGET_STEP = 0.05
"""What a backlog that ran dry after refusals adds to the target, as a share of the SLO."""
BOUND_AFTER = 0.5
"""A waiting request bounds the rate once it has waited this share of the target."""
MIN_RATE = 1.0
"""Tokens a second the estimate never goes below (a cap of zero would only be the floor)."""
LOW_SAMPLES = 8
"""How many of the latest measures :attr:`PrefillValve.low` (and the turnover's
:class:`~gateway.admission.turnover.PrefillCost`) keep to predict with a slow one."""
LOW_RANK = 2
"""Which of them the replay predicts with, counted from the slowest: the second slowest, so
one step that ran slow alone does not hold every burst for eight measures (on vLLM's CPU
build the whole burst protocol served 116 within the SLO with the second slowest, 106 with the
slowest, none late with either; issue 37, twenty-first round)."""



def geometric_step(mean: float | None, value: float, weight: float) -> float:
    """A running geometric mean moved ``weight`` of the way toward ``value`` in log space
    (``value`` itself when there is no mean yet): the one update every estimate of admission's
    uses (the drain rate here, the decode step, the screen's prompt and output means)."""
    return float(value) if mean is None else mean * (value / mean) ** weight


def slow_pick(values: Iterable[float], *, slow_is_high: bool = False) -> float | None:
    """The :data:`LOW_RANK`-th slowest of ``values`` (the fastest of them when there are fewer;
    None when there are none): rates, slowest lowest, or with ``slow_is_high`` costs, slowest
    highest."""
    ordered = sorted(values, reverse=slow_is_high)
    return ordered[min(LOW_RANK, len(ordered)) - 1] if ordered else None


def always_room() -> bool:
    """The valve's ``room`` when nothing says otherwise: the engine can take another request."""
    return True

@dataclass(frozen=True)
class Waiting:
    """An admitted request without its first token."""

    ahead: int
    """Backlog tokens already waiting when it arrived."""
    own: int
    """Its own prompt tokens."""
    arrived_at: float
    entered_at: float = 0.0
    """When it was admitted (the target it was admitted under was the one then)."""
    by_cap: bool = True
    """Admitted because it fitted the cap; False for the floor, the step rule or warmup,
    whose waits say nothing of the target."""


class PrefillValve:
    """The backlog, the measured drain rate and the decision (see the module docstring)."""

    def __init__(self, *, target_s: float, rate: float, weight: float = DRAIN_WEIGHT,
                 step_tokens: int = 0, slo_s: float | None = None,
                 room: Callable[[], bool] = always_room) -> None:
        if not target_s > 0:
            raise ValueError(f"target_s must be > 0, got {target_s}")
        if slo_s is not None and not slo_s >= target_s:
            raise ValueError(f"slo_s must be >= target_s ({target_s}), got {slo_s}")
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        if step_tokens < 0:
            raise ValueError(f"step_tokens must be >= 0, got {step_tokens}")
        self._initial_target_s = target_s
        self.target_s = target_s
        """The first token the cap aims at (seconds); moved by the first tokens when
        ``slo_s`` is set."""
        self.slo_s = slo_s
        """The TTFT SLO the target follows (None: the target stays where it was set)."""
        self.weight = weight
        self.step_tokens = step_tokens
        """Prompt tokens the engine prefills in one scheduler step (:meth:`fits_step`; 0:
        none)."""
        self.room = room
        """Whether the engine could start another request at once (asked by the ran-dry rule
        only, when the backlog empties after refusals)."""
        self._rate = max(MIN_RATE, rate)
        self._recent: deque[float] = deque(maxlen=LOW_SAMPLES)
        self._waiting: dict[Hashable, Waiting] = {}
        self.backlog = 0
        """Prompt tokens of the admitted requests still waiting for their first token."""
        self.windows = 0
        """Measuring windows closed since the last :meth:`reset`."""
        self._mark: float | None = None  # the last event while the backlog was not empty
        self._busy_s = 0.0  # seconds of backlog in the open window
        self._drained = 0  # tokens that reached their first token in it
        self._whole = True  # whether it began with the backlog empty
        self._due: float | None = None  # the first token at which the open window came due
        self._decreased_at = -math.inf  # when the target last came down for a late request
        self._interval_start: float | None = None  # the standing rule's interval (None: idle)
        self._shortest_wait = math.inf  # the shortest cap-admitted wait in that interval
        self._refused = False  # the valve refused since the backlog was last empty
        self._late = False  # a cap-admitted first token was late since then

    @property
    def rate(self) -> float:
        """The drain rate learned (prompt tokens a second)."""
        return self._rate

    @property
    def low(self) -> float:
        """The :data:`LOW_RANK`-th slowest of the last :data:`LOW_SAMPLES` windows' measures
        (:func:`slow_pick`; the learned rate before any): the rate a wait predicted now can
        meet with few misses, where :attr:`rate` is its recent level."""
        picked = slow_pick(self._recent)
        return self._rate if picked is None else picked

    @property
    def waiting(self) -> int:
        """Admitted requests without their first token."""
        return len(self._waiting)

    def bound(self, now: float) -> float:
        """The rate the waiting requests allow at most now: of those that have waited at least
        :data:`BOUND_AFTER` of the target (a shorter wait is mostly the engine's fixed cost per
        request, not its rate), the least ``(ahead + own) ÷ age``; ``inf`` when none has."""
        bound = math.inf
        for entry in self._waiting.values():
            age = now - entry.arrived_at
            if age >= BOUND_AFTER * self.target_s:
                bound = min(bound, (entry.ahead + entry.own) / age)
        return bound

    def rate_now(self, now: float) -> float:
        """The lower of the learned rate and what the waiting requests allow (tokens a
        second)."""
        return max(MIN_RATE, min(self.rate, self.bound(now)))

    def cap(self, now: float, *, rate: float | None = None) -> float:
        """Backlog tokens the engine drains within the target at :meth:`rate_now` (``rate``:
        that rate, already looked up at ``now``)."""
        return self.target_s * (self.rate_now(now) if rate is None else rate)

    def admits(self, own: float, now: float, *, unsized: float = 0.0) -> bool:
        """Whether a request with ``own`` prompt tokens may join now: nothing waits (the
        floor), or the backlog with it fits the cap. ``unsized``: prompt tokens, estimated, of
        requests let in ahead of it that are not in the backlog yet (the arrival screen's):
        they count in the backlog, and while there are any the floor does not apply."""
        if not self._waiting and unsized <= 0:
            return True
        return self.backlog + unsized + own <= self.cap(now)

    def fits_step(self, own: float, now: float, *, unsized: float = 0.0) -> bool:
        """Whether the backlog with ``own`` more tokens (and ``unsized``, as in :meth:`admits`)
        is one scheduler step's prompt tokens at most (:attr:`step_tokens`) and no waiting
        request has waited long enough to bound the rate (see the module docstring)."""
        return (self.backlog + unsized + own <= self.step_tokens
                and self.bound(now) == math.inf)

    def drain_s(self, own: float, now: float, *, rate: float | None = None) -> float:
        """Seconds until a request of ``own`` tokens would fit (the Retry-After; ``rate`` as
        in :meth:`cap`)."""
        rate = self.rate_now(now) if rate is None else rate
        return max(0.0, (self.backlog + own) / rate - self.target_s)

    def _advance(self, now: float) -> None:
        if self._due is not None and now - self._due > SAME_STEP_S:
            self._close()  # its step's first tokens are in; the time since is the next window's
        if self._mark is not None and now > self._mark:
            self._busy_s += now - self._mark
        self._mark = now if self._waiting else None

    def enter(self, key: Hashable, own: int, now: float, *,
              arrived_at: float | None = None, by_cap: bool = True) -> None:
        """``key`` was admitted at ``now`` with ``own`` prompt tokens; ``arrived_at``: when it
        reached the gateway (its wait is counted from then; None: ``now``); ``by_cap``: admitted
        because it fitted the cap (False: the floor, the step rule, warmup)."""
        if key in self._waiting:
            raise ValueError(f"{key!r} is already waiting")
        self._advance(now)
        self._waiting[key] = Waiting(ahead=self.backlog, own=max(0, own),
                                     arrived_at=now if arrived_at is None else arrived_at,
                                     entered_at=now, by_cap=by_cap)
        self.backlog += max(0, own)
        self._mark = now

    def first_token(self, key: Hashable, now: float, *, learn: bool = True) -> None:
        """``key``'s first token came at ``now``: it leaves the backlog, and (``learn``) its
        tokens count as drained in the open window, which closes when it is long enough."""
        admitted = self._waiting.get(key)
        late = (learn and admitted is not None and admitted.by_cap and self.slo_s is not None
                and now - admitted.arrived_at > LATE_SHARE * self.slo_s)
        self._late = self._late or late  # before it leaves: the ran-dry rule asks then
        entry = self._leave(key, now)
        if entry is None:
            return
        if not learn:
            self._busy_s, self._drained, self._due = 0.0, 0, None
            return
        if entry.by_cap and self.slo_s is not None:
            self._steer(entry, now, late=late)
        self._drained += entry.own
        ended = not self._waiting and self._whole  # a whole stretch of backlog, however short
        if ended and self._busy_s > 0:
            self._close()
        else:
            if self._due is None and self._busy_s >= WINDOW_S:
                self._due = now  # closes after the rest of this step's first tokens
            if self._due is not None and not self._waiting:
                self._close()  # the backlog emptied: nothing more of that step can come
        # The rest of a stretch whose earlier part closed a window: first tokens come in
        # batches, so its last few may drain in a millisecond, too short to measure alone. It
        # is carried into the next window, which closes only after WINDOW_S of backlog:
        # dropped, it lowered the rate after every burst of two waves (the window across the
        # gap between them counted, the second wave's quick drain did not).
        if not self._waiting and not self._whole and not self._drained:
            self._busy_s, self._whole = 0.0, True

    def _close(self) -> None:
        """The open window measured: the tokens drained in it over its seconds of backlog."""
        if self._drained > 0 and self._busy_s > 0:
            measured = max(MIN_RATE, self._drained / self._busy_s)
            self._rate = geometric_step(self._rate, measured, self.weight)
            self._recent.append(measured)
            self.windows += 1
            self._whole = False
        self._busy_s, self._drained, self._due = 0.0, 0, None

    def refused(self) -> None:
        """The valve's decision turned a request away (the target may be too low)."""
        self._refused = True

    def _steer(self, entry: Waiting, now: float, *, late: bool) -> None:
        """A request the cap admitted had its first token at ``now`` (``late``: after
        :data:`LATE_SHARE` of the SLO): the late and the standing rules (see the module
        docstring)."""
        slo = self.slo_s
        assert slo is not None
        wait = now - entry.arrived_at
        if late and entry.entered_at > self._decreased_at:
            self._move(self.target_s * LATE_SHARE * slo / wait)
            self._decreased_at = now
        if not self._waiting:
            return  # it emptied the backlog: the standing rule's interval ended with it
        self._shortest_wait = min(self._shortest_wait, wait)
        if self._interval_start is None:
            self._interval_start = entry.entered_at
        if now - self._interval_start >= slo:
            if self._shortest_wait > STANDING_SHARE * slo:
                self._move(self.target_s * STANDING_DECREASE)
            self._interval_start, self._shortest_wait = now, math.inf

    def _move(self, target_s: float) -> None:
        assert self.slo_s is not None
        self.target_s = min(TARGET_MAX_SHARE * self.slo_s,
                            max(TARGET_MIN_SHARE * self.slo_s, target_s))

    def _ran_dry(self) -> None:
        """The backlog emptied: the ran-dry rule, and the standing rule's interval ends."""
        if self._refused and not self._late and self.slo_s is not None and self.room():
            self._move(self.target_s + TARGET_STEP * self.slo_s)
        self._refused = self._late = False
        self._interval_start, self._shortest_wait = None, math.inf

    def leave(self, key: Hashable, now: float) -> Waiting | None:
        """``key`` left the backlog at ``now`` (on its own: without a first token — refused
        after queueing, cancelled, failed); what it was, None if it was not waiting."""
        entry = self._leave(key, now)
        if entry is not None and self._due is not None and not self._waiting:
            self._close()  # the backlog emptied: nothing more of that step can come
        return entry

    def _leave(self, key: Hashable, now: float) -> Waiting | None:
        """:meth:`leave` but for closing a due window (a first token's tokens count first)."""
        entry = self._waiting.pop(key, None)
        if entry is None:
            return None
        self._advance(now)  # the backlog it was part of lasted until now
        self.backlog -= entry.own
        if not self._waiting:
            self._ran_dry()
        return entry

    def reset(self, rate: float) -> None:
        """Start again from ``rate`` and the target it was built with (a new engine, or
        warmup's measuring pass); what is waiting stays counted."""
        self._rate = max(MIN_RATE, rate)
        self._recent.clear()
        self.target_s = self._initial_target_s
        self._decreased_at = -math.inf
        self._interval_start, self._shortest_wait, self._refused = None, math.inf, False
        self._late = False
        self.windows = 0
        self._busy_s, self._drained, self._due = 0.0, 0, None
