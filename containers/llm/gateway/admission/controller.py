"""Admission's controller: refuse on arrival what would miss the TTFT SLO, queue the rest and
dispatch it first come, first served as the KV pool allows.

The parts, each its own module (docs/design-decisions.md#surge-admission):

* :mod:`gateway.admission.ledger` — the KV blocks the dispatched requests hold, per bucket, and
  vLLM's dispatch rule on the engine's real pool;
* :mod:`gateway.admission.valve` — the prefill valve: the prompt tokens still waiting for their
  first token, the rate the engine drains them at (measured from first tokens), and the decision
  on arrival (refused at once with a Retry-After when the backlog with the new prompt would not
  drain within the target; always admitted when nothing waits);
* :mod:`gateway.admission.turnover` — when a request that must wait for KV room would have its
  first token (the running answers' ends, replayed): what admits the next wave of a burst that
  the valve's one rate cannot tell from the wave after it;
* this module — the queue and the clock: it asks the valve (and, where the valve refuses, the
  turnover) on arrival, dispatches by the ledger, tells the valve each first token and the
  ledger each answer's growth.

A request never waits to be refused; one that waits past ``max_wait_s`` (the engine slowed down
sharply) is the exception, counted as such. While the circuit breaker is half-open, the number of
requests in flight is capped too (its probes).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.admission.ledger import (
    AdmissionLedger,
    KvReservation,
    LengthBucket,
    RefusalReason,
)
from gateway.admission.lengths import OutputLengths
from gateway.admission.turnover import (
    Candidate,
    DecodeStep,
    Holder,
    PrefillCost,
    holder_ends,
    replay,
    slot_free_at,
    step_so_far,
)
from gateway.admission.valve import (
    LATE_SHARE,
    MIN_RATE,
    TARGET_SHARE,
    PrefillValve,
    geometric_step,
)
from gpu_budget.lengths import blocks_for_tokens

PRIOR_DRAIN_TOKENS_PER_S = 2000.0
"""The drain rate the valve starts from before any first token (warmup measures the real one
before /ping turns healthy)."""
PROMPT_MEAN_WEIGHT = 0.1
"""How far each admitted prompt moves the log of the mean the screen counts a screened request
at (a geometric mean: one 20,000-token prompt among 200-token ones moves it by 58 %, where an
arithmetic mean moved it tenfold)."""
SCREENED_SPREAD = 2.0
"""A request the screen let through keeps the screen's decision while its prompt is at most this
many times what the screen counted it at (the mean admitted prompt): a mix's prompts spread
around their mean, and half of them are above it. Decided again, those near the line were
refused after waiting their turn to start (27-119 ms in the gateway, the longest refusals of
the bursts). A prompt more than twice the usual is another kind of request, decided on its own."""
REFUSAL_HOLD_S = 0.002
"""How long the screen's refusal stands for the arrivals after it while nothing has changed but
more screened in (no dispatch, token, release or arrival sized): the decision is monotone in
what was screened in before a request, so theirs is the same refusal, up to the few
milliseconds by which the valve's rate and the replay's clock move on (0.1 % of a 2 s SLO). A
burst's refusals then skip the replay, the screen's costliest part (about 50 of the 180 us a
refusal held the event loop for in a burst of 512 on the H200-shaped simulator;
docs/design-decisions.md#surge-admission), and say what it said (its backlog, cap and
Retry-After) without looking at the waiting requests again."""
NEARLY_IDLE_SHARE = 0.1
"""At most this share of ``max_running`` running (and nothing queued) is "nearly idle": a
refusal then means the valve's rate, not the load, turned the user away."""


class AdmissionRejected(Exception):
    """Refused: no room within the SLO (or the wait). Carries what the 429/503 says."""

    def __init__(self, reason: RefusalReason, bucket: LengthBucket | None, waited_s: float, *,
                 retry_after_s: float | None = None, backlog_tokens: int = 0,
                 cap_tokens: float = 0.0, while_idle: bool = False) -> None:
        where = "before it was sized" if bucket is None else f"in bucket {bucket.value}"
        super().__init__(f"{reason.value} {where} after {waited_s:.3f} s")
        self.reason = reason
        self.bucket = bucket
        """The request's bucket; None when it was refused before it was parsed and sized
        (:meth:`AdmissionController.screen`)."""
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s
        """Seconds after which the backlog would have drained enough for it."""
        self.backlog_tokens = backlog_tokens
        """Prompt tokens waiting for their first token when it was refused by the valve."""
        self.cap_tokens = cap_tokens
        """What the valve allowed to wait then."""
        self.while_idle = while_idle
        """Refused by the valve while the engine was nearly idle (the rate it learned is
        wrong, or a lock-out)."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What admission needs to know of a request."""

    bucket: LengthBucket
    prompt_tokens: int
    max_tokens: int
    sequences: int = 1
    """Choices generated (``n``): each needs its own answer's KV (the prompt's is shared) and
    is one of the engine's running sequences (``max_running``, vLLM's ``max_num_seqs``)."""


@dataclass(eq=False)
class _Ticket:
    """A request from arrival to release."""

    id: int
    request: AdmissionRequest
    tokens: int
    """KV tokens it holds when dispatched: its prompt and one token per choice (what vLLM's
    scheduler allocates when it admits a request)."""
    expected_tokens: int
    """KV tokens it is expected to hold at its end: prompt + expected output per choice (more
    than the watermark's share of the pool: it never fits)."""
    arrived_at: float
    expected_output: int = 1
    """Output tokens each of its choices is expected to generate."""
    floor: bool = False
    """Admitted by the valve's floor although the backlog with it was over the cap."""
    by_cap: bool = False
    """Admitted because the backlog with it fitted the valve's cap (not by the floor, the step
    rule or as warmup): only such a request's first token moves the valve's target."""
    learn: bool = True
    """Whether its first token teaches the valve (off for warmup's first pass)."""
    future: asyncio.Future[KvReservation] | None = None
    first_token_at: float | None = None
    produced: int = 0
    """Output tokens over all its choices."""
    held_blocks: int = 0
    """KV blocks it holds now in the ledger: its prompt and its answers so far."""

    def holder(self, block_size: int) -> Holder:
        """What the turnover's replay needs of it once dispatched."""
        request = self.request
        return Holder(end_blocks=max(self.held_blocks,
                                     blocks_for_tokens(self.expected_tokens, block_size)),
                      sequences=request.sequences,
                      remaining=max(0, self.expected_output
                                    - self.produced // request.sequences),
                      prefill_tokens=request.prompt_tokens if self.first_token_at is None else 0)

    def candidate(self, block_size: int) -> Candidate:
        """What the turnover's replay needs of it while it waits for dispatch."""
        return Candidate(blocks=blocks_for_tokens(self.tokens, block_size),
                         end_blocks=blocks_for_tokens(self.expected_tokens, block_size),
                         sequences=self.request.sequences,
                         prompt_tokens=self.request.prompt_tokens, output=self.expected_output)

    def blocks_now(self, block_size: int) -> int:
        """The blocks its prompt, its answers so far and each choice's next token take."""
        return blocks_for_tokens(self.request.prompt_tokens + self.produced
                                 + self.request.sequences, block_size)


@dataclass(eq=False)
class ScreenPass:
    """A chat request the screen let through, counted in the valve's backlog at ``tokens`` (the
    estimate when it was screened) until it is sized. The arrival screen calls :meth:`release`
    at the request's turn to start (``gateway.api.edge.StartGate``), or when it went away before
    that; nothing between that turn and :meth:`AdmissionController.acquire`, which enters its
    own prompt into the valve, yields the event loop (parsing, routing and the context window
    are synchronous), so no screen ever sees the request counted twice or not at all."""

    tokens: float
    controller: AdmissionController
    released: bool = False

    def release(self) -> None:
        """No longer counted (idempotent)."""
        if not self.released:
            self.released = True
            self.controller.pending_count -= 1
            self.controller.pending_tokens -= self.tokens
            if self.controller.pending_tokens < 1e-6:
                self.controller.pending_tokens = 0.0


@dataclass(frozen=True)
class _HeldRefusal:
    """A refusal of the screen and what it was decided on (:data:`REFUSAL_HOLD_S`)."""

    at: float
    changes: int
    pending_count: int
    pending_tokens: float
    pool_blocks: int
    """The engine's pool then (its capacity is set from outside the controller)."""
    by_turnover: bool
    """The turnover refused it over the valve's cap (counted again for each it stands for)."""
    rejected: AdmissionRejected
    """The refusal itself: the ones it stands for say what it said (its backlog, cap and
    Retry-After, figures of at most :data:`REFUSAL_HOLD_S` ago)."""


@dataclass
class ArrivalCounts:
    """What admission decided on arrival (the /ping body's ``admission`` block and the gauge
    line report them as they happen)."""

    refused_by_valve: int = 0
    refused_while_idle: int = 0
    """Refused by the valve while the engine was nearly idle (see
    :meth:`AdmissionController.nearly_idle`): a healthy instance turning users away."""
    floor_admits: int = 0
    """Admitted by the valve's floor (nothing else waited) over the cap."""
    turnover_admits: int = 0
    """Admitted over the valve's cap because the turnover predicted its first token within the
    target (the screen's decisions and the sized ones)."""
    turnover_refusals: int = 0
    """Refused although the valve's cap (or its floor, for a request that waits for room)
    admitted them: the turnover predicted a first token after the SLO (after the target, for
    a request that waits for a sequence or KV room)."""
    last_refused_while_idle_at: float | None = None


class AdmissionController:
    """The ledger, a first-come-first-served queue, and the valve that decides on arrival.

    ``learning`` off (warmup's first pass, which pays the engine's one-off compile and load
    costs) keeps first tokens from teaching the valve and answers from teaching the lengths.
    """

    def __init__(self, ledger: AdmissionLedger, *, ttft_slo_s: float, max_running: int,
                 clock: Callable[[], float] = time.monotonic,
                 prior_rate: float = PRIOR_DRAIN_TOKENS_PER_S, step_tokens: int = 0) -> None:
        self.ledger = ledger
        self.ttft_slo_s = ttft_slo_s
        self.max_running = max_running
        self.clock = clock
        self.prior_rate = prior_rate
        self.valve = PrefillValve(target_s=TARGET_SHARE * ttft_slo_s, rate=prior_rate,
                                  step_tokens=step_tokens, slo_s=ttft_slo_s,
                                  room=self._room_for_one)
        self.prefill = PrefillValve(target_s=TARGET_SHARE * ttft_slo_s, rate=prior_rate)
        """The engine's prefill rate: the valve's measure over *dispatched* requests only
        (entered at dispatch, left at the first token), without their waits for KV room
        (:mod:`gateway.admission.turnover`). It decides nothing."""
        self.decode = DecodeStep()
        """The engine's decode step, from the answers (:mod:`gateway.admission.turnover`)."""
        self.prefill_cost = PrefillCost()
        """The engine's prefill per token beyond each step's fixed cost, from the dispatched
        requests' first tokens (:mod:`gateway.admission.turnover`), in steps of the valve's
        ``step_tokens``."""
        self.lengths = OutputLengths()
        self.arrivals = ArrivalCounts()
        self.learning = True
        """Whether first tokens teach the valve and answers the lengths."""
        self.pending_count = 0
        """Requests the screen let through that are not sized yet."""
        self.pending_tokens = 0.0
        """Prompt tokens, estimated, of the requests the screen let through that are not sized
        yet (:class:`ScreenPass`)."""
        self.prompt_mean: float | None = None
        """The running geometric mean of the prompts the valve admitted (tokens, each moving its
        log by :data:`PROMPT_MEAN_WEIGHT`; None before the first): what a screened request
        counts as until it is sized."""
        self.output_mean: float | None = None
        """The same mean of the output tokens per choice the admitted requests were expected to
        generate: what a screened request's answer counts as in the turnover's replay."""
        self.reserved_mean: float | None = None
        """The same mean of what the admitted requests reserve (prompt + ``max_tokens``): the
        length bucket a screened request counts in, for its bucket's cap."""
        self._ids = itertools.count(1)
        self._queue: deque[_Ticket] = deque()
        self._running: dict[int, _Ticket] = {}
        self._running_sequences = 0
        self._decoding = 0
        """Dispatched requests past their first token: while any is, the engine runs steps."""
        self._changes = 0
        """Bumped by everything that can make room (an arrival sized, a dispatch, a token, a
        release, a request leaving the queue): what the screen's held refusal checks."""
        self._held: _HeldRefusal | None = None
        """The screen's last refusal, standing for :data:`REFUSAL_HOLD_S`."""

    @property
    def waiting(self) -> int:
        """Admitted requests waiting for dispatch."""
        return len(self._queue)

    @property
    def running_sequences(self) -> int:
        """Sequences of the dispatched requests (``n`` each): what ``max_running`` caps."""
        return self._running_sequences

    def nearly_idle(self) -> bool:
        """Nothing queued or screened in (requests the screen let through that are not sized
        yet: a burst's first arrivals, about to start), and at most
        :data:`NEARLY_IDLE_SHARE` of ``max_running`` running."""
        return (not self._queue and self.pending_tokens <= 0 and self._running_sequences
                <= max(1, math.floor(NEARLY_IDLE_SHARE * self.max_running)))

    def idle_first_token_s(self, prompt_tokens: int) -> float:
        """The first token of a ``prompt_tokens`` prompt on an idle engine at the drain rate
        learned (what warmup checks against the SLO before /ping turns healthy)."""
        return prompt_tokens / self.valve.rate

    def reset_learning(self) -> None:
        """The valve back to its prior rate (warmup's measuring pass starts from here; the
        answer lengths, learned from real answers only, stay)."""
        self._changes += 1
        self.valve.reset(self.prior_rate)
        self.prefill.reset(self.prior_rate)
        self.prefill_cost.reset()
        self.decode.reset()

    # --- arrival ---
    def screen(self, smallest_prompt_tokens: int) -> AdmissionRejected | ScreenPass:
        """The valve's decision before a request is parsed. Not yet sized, a request counts as
        :meth:`estimate` (the running geometric mean of the prompts the valve admitted, at least
        ``smallest_prompt_tokens``, the smallest the gateway can send): refused when that would
        not fit beside the backlog and the requests screened in before it that are not sized
        yet; else a :class:`ScreenPass` that counts it among those until it is sized (read and
        decided on its own prompt by :meth:`acquire`; docs/design-decisions.md#surge-admission).

        Parsing, rendering and tokenizing are the expensive part of a request, and a burst's
        arrivals are screened before any of them is parsed (:class:`gateway.api.edge.StartGate`):
        counted at nothing, the requests screened in before would leave the backlog empty and
        the screen would refuse no one; counted at the smallest prompt, it let through requests
        that were then refused after waiting for the others' starts."""
        now = self.clock()
        valve = self.valve
        pending = self.pending_tokens
        estimate = self.estimate(smallest_prompt_tokens)
        held = self._standing_refusal(now)
        if held is not None:
            self.arrivals.turnover_refusals += held.by_turnover
            return self._refused_again(held.rejected, now)
        by_valve = valve.admits(estimate, now, unsized=pending) or (
            not self._queue and valve.fits_step(estimate, now, unsized=pending))
        predicted: float | None = None
        at_once = False
        floor = not valve.waiting and pending <= 0  # the floor, if the engine takes it at once
        if self.output_mean is not None and not (floor and self._takes_now(round(estimate) + 1)):
            block_size = self.ledger.capacity.block_size
            unsized = Candidate(blocks=blocks_for_tokens(round(estimate) + 1, block_size),
                                end_blocks=blocks_for_tokens(
                                    round(estimate + self.output_mean), block_size),
                                sequences=1, prompt_tokens=round(estimate),
                                output=round(self.output_mean))
            bucket = (None if self.reserved_mean is None
                      else self.ledger.bucket_of(self.reserved_mean))
            predicted, at_once = self._predicted_wait([unsized] * (self.pending_count + 1), now,
                                                      now, bucket=bucket)
        refusals = self.arrivals.turnover_refusals
        if self._turnover_decides(by_valve, predicted, at_once):
            self.pending_count += 1
            self.pending_tokens += estimate
            return ScreenPass(estimate, self)
        by_turnover = self.arrivals.turnover_refusals > refusals
        rejected = self._refused(None, round(estimate), now, pending=round(pending))
        self._held = _HeldRefusal(now, self._changes, self.pending_count, pending,
                                  self.ledger.pool_blocks, by_turnover, rejected)
        return rejected

    def _standing_refusal(self, now: float) -> _HeldRefusal | None:
        """The screen's last refusal if it stands for an arrival now: within
        :data:`REFUSAL_HOLD_S`, nothing changed (what the ledger holds changes only with a
        dispatch, a token or a release, each a change) but (as much or) more screened in."""
        held = self._held
        if (held is None or now - held.at > REFUSAL_HOLD_S or self._changes != held.changes
                or self.pending_count < held.pending_count
                or self.pending_tokens < held.pending_tokens
                or self.ledger.pool_blocks != held.pool_blocks):
            return None
        return held

    def _turnover_decides(self, by_valve: bool, predicted: float | None, at_once: bool) -> bool:
        """The decision, given the valve's (``by_valve``: admitted by its cap or its step rule)
        and the turnover's prediction of the wait (None: none yet, and the valve decides): a
        request predicted to have its first token after the SLO is refused whatever the cap
        says, and one predicted within the valve's target is admitted over the cap — within
        :data:`~gateway.admission.valve.LATE_SHARE` of the SLO, if that is higher, when the
        replay dispatched it (and those screened in before it) at once (``at_once``), as its
        prediction is then the prefill ahead of it alone, not a wait for sequences or KV room
        (:mod:`gateway.admission.turnover`). One that waits for a sequence or KV room is the
        turnover's to decide, the cap's admission included: a rate cannot say when answers end
        (docs/design-decisions.md#surge-admission, "What waits for room"). Where the two
        differ it is counted in :attr:`arrivals`."""
        if predicted is None:
            return by_valve
        bar = self.valve.target_s
        if at_once:  # never below the target (which the ran-dry rule can raise above it)
            bar = max(bar, LATE_SHARE * self.ttft_slo_s)
        if predicted > self.ttft_slo_s or (not at_once and predicted > bar):
            self.arrivals.turnover_refusals += by_valve
            return False
        if not by_valve and predicted <= bar:
            self.arrivals.turnover_admits += 1
        return by_valve or predicted <= bar

    def _predicted_wait(self, waiting: list[Candidate], now: float, arrived_at: float, *,
                        bucket: LengthBucket | None = None) -> tuple[float | None, bool]:
        """Seconds from ``arrived_at`` until the last of ``waiting``, after the requests queued
        for dispatch, would have its first token by the turnover's replay, and whether every one
        of ``waiting`` is dispatched at once; None before the engine's decode step is known (no
        answer has ended, and none running has shown its pace:
        :func:`~gateway.admission.turnover.step_so_far`), and before an engine reported its
        pool. ``bucket``: the length bucket of ``waiting`` (None: not known), whose cap can make
        them wait for a slot where the pool has room
        (:func:`~gateway.admission.turnover.slot_free_at`)."""
        ledger = self.ledger
        block_size = ledger.capacity.block_size
        running = [ticket.holder(block_size) for ticket in self._running.values()]
        step = self.decode.now_s(now, decoding=self._decoding > 0)
        if step is None:  # no answer has ended yet: the running ones' pace so far
            step = step_so_far(now, ((ticket.first_token_at,
                                      ticket.produced // ticket.request.sequences)
                                     for ticket in self._running.values()
                                     if ticket.first_token_at is not None and ticket.learn))
        if step is None or not ledger.pool_blocks:
            return None, False
        tickets = [ticket for ticket in self._queue
                   if ticket.future is None or not ticket.future.done()]
        queued = [ticket.candidate(block_size) for ticket in tickets]
        rate = self.prefill_rate(step, now)
        predicted, at_once = replay(now, running=running, queued=queued + waiting,
                                    pool_blocks=ledger.pool_blocks,
                                    max_running=self.max_running, step_s=step,
                                    prefill_rate=rate)
        if (bucket is not None  # its cap can bind (checked at no cost before it is replayed)
                and ledger.inflight[bucket] + len(tickets) + len(waiting)
                > ledger.bucket_caps[bucket]):
            ends, _ = holder_ends(now, running, step_s=step, prefill_rate=rate)
            slot = slot_free_at(
                now, running_ends=[end for ticket, end in zip(self._running.values(), ends,
                                                              strict=True)
                                   if ticket.request.bucket is bucket],
                queued=[candidate for ticket, candidate in zip(tickets, queued, strict=True)
                        if ticket.request.bucket is bucket] + waiting,
                cap=ledger.bucket_caps[bucket], step_s=step, prefill_rate=rate)
            if slot > now:
                predicted = max(predicted, slot + waiting[-1].prompt_tokens / rate)
                at_once = False
        return predicted - arrived_at, at_once

    def prefill_rate(self, step_s: float | None, now: float) -> float:
        """The prefill rate the replay predicts with: the higher of two measures that each err low
        for a reason of their own, at most what the dispatched requests still waiting allow (the
        measure's bound). The dispatched requests' windows (:attr:`prefill`) fold each step's fixed
        cost into its tokens, so where a step prefills a prompt or two they measure a step's latency
        per prompt. Full steps at the measured cost per token with the decode step as each step's
        fixed cost (:class:`PrefillCost`) count against a request only the prompts dispatched before
        it, though the step that prefills it also prefills those dispatched beside it (its wait
        for the step in progress at its dispatch is not counted: :class:`PrefillCost` times it
        from that step's end). The one error the other way: a step on an idle engine costs less
        than the decode step beside running streams (their tokens' share: about 2.5 ms of 66 on an
        H200 with 64 streams), which the cost per token then over-subtracts.

        Each measure at the second slowest of its last
        :data:`~gateway.admission.valve.LOW_SAMPLES` (:data:`~gateway.admission.valve.LOW_RANK`;
        :attr:`PrefillValve.low`, :meth:`PrefillCost.rate`'s ``slowest``), not at its recent
        level: a burst's prompts are prefilled in a few long steps, all of one step's first
        tokens come when it ends, and a step that runs slower than the level predicted starts
        the whole batch late. On vLLM's CPU build the step that prefilled a burst's next six to
        eight prompts ran at 1,010 to 1,745 tokens a second within one run, and with the level
        7 of 46 bursts started such a batch 2.01-2.22 s after it arrived (issue 37, twentieth
        round); with the slowest of eight none did, but one slow step held every burst for eight
        measures (the whole burst protocol: 106 within the SLO, 116 with the second slowest,
        none late; twenty-first round). Where the steps run alike (a GPU) the second slowest is
        the level."""
        rate = self.prefill.low
        stepped = self.prefill_cost.rate(step_s, self.valve.step_tokens, slowest=True)
        if stepped is not None:
            rate = max(rate, stepped)
        return max(MIN_RATE, min(rate, self.prefill.bound(now)))

    def estimate(self, smallest_prompt_tokens: int) -> float:
        """What a request not yet sized counts as: :attr:`prompt_mean`, at least the smallest
        prompt the gateway can send."""
        return max(float(smallest_prompt_tokens), self.prompt_mean or 0.0)

    def _refused(self, bucket: LengthBucket | None, own: int, now: float, *, pending: int = 0
                 ) -> AdmissionRejected:
        """The valve's refusal of ``own`` prompt tokens; ``pending``: the screened-in tokens it
        was decided beside (the screen's; a sized request is decided without them, as they
        arrived after it)."""
        valve = self.valve
        while_idle = self._count_refusal(now)
        rate = valve.rate_now(now)  # one look at the waiting requests for both figures
        return AdmissionRejected(
            RefusalReason.TTFT_SLO, bucket, 0.0,
            retry_after_s=valve.drain_s(own + pending, now, rate=rate),
            backlog_tokens=valve.backlog + pending, cap_tokens=valve.cap(now, rate=rate),
            while_idle=while_idle)

    def _refused_again(self, rejected: AdmissionRejected, now: float) -> AdmissionRejected:
        """The held refusal ``rejected`` again, for an arrival it stands for: counted as a
        refusal of its own, with its figures."""
        return AdmissionRejected(
            rejected.reason, rejected.bucket, 0.0, retry_after_s=rejected.retry_after_s,
            backlog_tokens=rejected.backlog_tokens, cap_tokens=rejected.cap_tokens,
            while_idle=self._count_refusal(now))

    def _count_refusal(self, now: float) -> bool:
        """Count a refusal of the valve's (the valve is told); whether the engine was nearly
        idle then."""
        arrivals = self.arrivals
        while_idle = self.nearly_idle()
        arrivals.refused_by_valve += 1
        self.valve.refused()
        if while_idle:
            arrivals.refused_while_idle += 1
            arrivals.last_refused_while_idle_at = now
        return while_idle

    def _ticket(self, request: AdmissionRequest, now: float) -> _Ticket:
        expected = self.lengths.expected(request.max_tokens)
        return _Ticket(id=next(self._ids), request=request,
                       tokens=request.prompt_tokens + request.sequences,
                       expected_tokens=request.prompt_tokens + request.sequences * expected,
                       arrived_at=now, expected_output=expected, learn=self.learning)

    async def acquire(self, request: AdmissionRequest, *, max_wait_s: float,
                      max_total_inflight: Callable[[], int | None] = lambda: None,
                      by_valve: bool = True, arrived_at: float | None = None,
                      screened_tokens: float | None = None) -> KvReservation:
        """Refuse at once (AdmissionRejected) or queue and return the reservation once
        dispatched; AdmissionRejected(QUEUE_TIMEOUT) after ``max_wait_s`` in the queue.
        ``by_valve=False`` (warmup): never refused by the valve — warmup is what measures the
        rate it decides by — though still counted in its backlog. ``arrived_at``: when the
        request reached the gateway (before it was read and parsed), so that its first token
        teaches the valve the whole wait a caller sees; None: now. ``screened_tokens``: what
        the arrival screen counted it at when it let it through (:meth:`screen`): the screen's
        decision stands for a prompt up to :data:`SCREENED_SPREAD` times that (a request let
        through is not refused after waiting its turn to start because the decision was taken
        again a few milliseconds later), and a bigger one is decided again on its own
        prompt."""
        now = self.clock()
        ticket = self._ticket(request, now if arrived_at is None else min(now, arrived_at))
        screened = (screened_tokens is not None
                    and request.prompt_tokens <= SCREENED_SPREAD * screened_tokens)
        self._refuse_on_arrival(ticket, max_total_inflight(), by_valve=by_valve and not screened)
        if screened:  # the screen's decision, on the target: its first token steers it
            ticket.by_cap = True
        if by_valve:
            self.prompt_mean = geometric_step(self.prompt_mean, max(1, request.prompt_tokens),
                                              PROMPT_MEAN_WEIGHT)
            self.output_mean = geometric_step(self.output_mean, ticket.expected_output,
                                              PROMPT_MEAN_WEIGHT)
            self.reserved_mean = geometric_step(
                self.reserved_mean, max(1, request.prompt_tokens + request.max_tokens),
                PROMPT_MEAN_WEIGHT)
        self.valve.enter(ticket.id, request.prompt_tokens, now, arrived_at=ticket.arrived_at,
                         by_cap=ticket.by_cap)
        ticket.future = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        self._changes += 1
        self.dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.future), timeout=max_wait_s)
        except TimeoutError:
            if ticket.future.done():  # dispatched at the deadline: keep it
                return ticket.future.result()
            self._queue.remove(ticket)
            self._changes += 1
            self.valve.leave(ticket.id, self.clock())
            ticket.future.cancel()
            raise AdmissionRejected(RefusalReason.QUEUE_TIMEOUT, request.bucket,
                                    self.clock() - now, retry_after_s=max_wait_s) from None
        except asyncio.CancelledError:  # the caller went away while queued
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._changes += 1
                self.valve.leave(ticket.id, self.clock())
            elif ticket.future.done() and not ticket.future.cancelled():
                self.release(ticket.future.result())
            raise

    def _refuse_on_arrival(self, ticket: _Ticket, probe_limit: int | None, *,
                           by_valve: bool) -> None:
        request = ticket.request
        if (self.ledger.blocks_for(ticket.expected_tokens) > self.ledger.limit_blocks
                or request.sequences > self.max_running):
            raise AdmissionRejected(RefusalReason.NEVER_FITS, request.bucket, 0.0)
        if probe_limit is not None and len(self._running) + len(self._queue) >= probe_limit:
            raise AdmissionRejected(RefusalReason.PROBE_LIMIT, request.bucket, 0.0)
        if not by_valve:
            return
        valve = self.valve
        now = self.clock()
        own = request.prompt_tokens
        candidate = [ticket.candidate(self.ledger.capacity.block_size)]
        if valve.waiting == 0:  # the floor: nothing waits, so its first token teaches the rate
            if not self._takes_at_once(ticket):  # unless it waits for room past the SLO
                predicted, _ = self._predicted_wait(candidate, now, ticket.arrived_at,
                                                    bucket=request.bucket)
                if predicted is not None and predicted > self.ttft_slo_s:
                    self.arrivals.turnover_refusals += 1
                    raise self._refused(request.bucket, own, now)
            ticket.floor = own > valve.cap(now)
            self.arrivals.floor_admits += ticket.floor
            ticket.by_cap = not ticket.floor
            return
        by_cap = valve.admits(own, now)
        by_step = (not by_cap and self._takes_at_once(ticket) and valve.fits_step(own, now))
        predicted, at_once = self._predicted_wait(candidate, now, ticket.arrived_at,
                                                  bucket=request.bucket)
        if not self._turnover_decides(by_cap or by_step, predicted, at_once):
            raise self._refused(request.bucket, own, now)
        ticket.by_cap = not by_step  # admitted on the target: its first token steers it

    def _takes_at_once(self, ticket: _Ticket) -> bool:
        """Whether the engine would take ``ticket`` now and keep it to its first token: nothing
        queued ahead of it, its prompt fits the sequences and the KV room left, and the room
        the running answers leave at their ends (the valve's step rule and its floor hold only
        for prompts the engine prefills at once, not for those that wait for room)."""
        return (not self._queue and self._blocked(ticket) is None
                and self._fits_beside_ends(self.ledger.blocks_for(ticket.tokens)))

    def _takes_now(self, tokens: int) -> bool:
        """:meth:`_takes_at_once` for a request not yet sized (the screen's), holding ``tokens``
        at dispatch, one sequence, its bucket not known."""
        ledger = self.ledger
        blocks = ledger.blocks_for(tokens)
        return (not self._queue and self._running_sequences < self.max_running
                and ledger.reserved_blocks + blocks <= ledger.pool_blocks
                and self._fits_beside_ends(blocks))

    def _fits_beside_ends(self, blocks: int) -> bool:
        """Whether ``blocks`` fit beside what the running requests are expected to hold at their
        ends, as the turnover's replay counts them. vLLM admits a prompt beside what the running
        answers hold *now*; when they then grow into the last free blocks it preempts the
        request it admitted last, and one preempted before its first token waits, its prefill
        lost, until answers end. A floor admission into such a pool started 2.36 s after it
        arrived, 3 ms after the releases that gave it room (issue 37, nineteenth round)."""
        block_size = self.ledger.capacity.block_size
        held = sum(ticket.holder(block_size).end_blocks for ticket in self._running.values())
        return held + blocks <= self.ledger.pool_blocks

    def _room_for_one(self) -> bool:
        """Whether the engine could start a request of the mean admitted prompt at once: a
        sequence free, and KV room beside what the running answers will hold at their ends (the
        valve's ran-dry rule asks, when its backlog empties after refusals)."""
        tokens = round(self.prompt_mean or 0.0) + 1
        return (self._running_sequences < self.max_running
                and self._fits_beside_ends(self.ledger.blocks_for(tokens)))

    # --- dispatch ---
    def _blocked(self, ticket: _Ticket) -> RefusalReason | None:
        """Why ``ticket`` cannot be dispatched now (None: it can): the engine's sequences are
        taken, or the ledger's reason (its bucket's cap, or its prompt beside what the running
        requests hold)."""
        request = ticket.request
        if self._running_sequences + request.sequences > self.max_running:
            return RefusalReason.MAX_RUNNING
        return self.ledger.refusal(request.bucket, ticket.tokens)

    def dispatch(self) -> None:
        """Dispatch queued requests first come, first served while each one's prompt (and one
        token per choice) fits beside what the running requests hold now in the whole pool,
        vLLM's own rule (one blocked only by its bucket's cap lets the ones behind it pass);
        ``max_running`` caps the sequences running, ``n`` for a request of ``n`` choices."""
        index = 0
        while index < len(self._queue):
            ticket = self._queue[index]
            reason = self._blocked(ticket)
            if reason is RefusalReason.BUCKET_CAP:
                index += 1
                continue
            if reason is not None:
                return
            del self._queue[index]
            self._changes += 1
            assert ticket.future is not None
            if ticket.future.done():  # cancelled while queued
                self.valve.leave(ticket.id, self.clock())
                continue
            booked = self.ledger.reserve(ticket.request.bucket, ticket.tokens)
            now = self.clock()
            self.prefill.enter(ticket.id, ticket.request.prompt_tokens, now)
            self.prefill_cost.dispatched(ticket.id, now, stepping=self._decoding > 0)
            reservation = KvReservation(booked.bucket, booked.tokens, booked.blocks, ticket.id,
                                        ticket.floor)
            ticket.held_blocks = reservation.blocks
            self._running[ticket.id] = ticket
            self._running_sequences += ticket.request.sequences
            ticket.future.set_result(reservation)

    def refuse_waiting(self) -> int:
        """The engine died: every request queued for dispatch is refused at once
        (``ENGINE_DIED``; it would wait for the rebuild); how many were."""
        now = self.clock()
        refused = 0
        while self._queue:
            ticket = self._queue.popleft()
            self._changes += 1
            self.valve.leave(ticket.id, now)
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_exception(AdmissionRejected(
                    RefusalReason.ENGINE_DIED, ticket.request.bucket, now - ticket.arrived_at))
                refused += 1
        return refused

    def notify(self) -> None:
        """Capacity, breaker or engine changed: dispatch what now fits."""
        self.dispatch()

    # --- what the streams tell ---
    def progress(self, reservation: KvReservation, tokens: int) -> None:
        """``tokens`` more tokens of ``reservation``'s answer (over its choices) arrived now:
        the first of them teaches the valve, each grows what the request holds."""
        ticket = self._running.get(reservation.ticket)
        if ticket is None or tokens <= 0:
            return
        self._changes += 1
        now = self.clock()
        if ticket.first_token_at is None:
            ticket.first_token_at = now
            self._decoding += 1
            learn = ticket.learn and self.learning
            self.valve.first_token(ticket.id, now, learn=learn)
            self.prefill.first_token(ticket.id, now, learn=learn)
            self.prefill_cost.first_token(ticket.id, now,
                                          prompt_tokens=ticket.request.prompt_tokens,
                                          step_s=self.decode.step_s,
                                          step_tokens=self.valve.step_tokens, learn=learn)
        # after its first token is timed: a step's outputs that begin with it end the waits of
        # the requests dispatched during that step, not its own
        self.prefill_cost.token(now, previous_at=self.decode.last_token_at,
                                step_s=self.decode.step_s)
        self.decode.token(now)
        ticket.produced += tokens
        held = ticket.blocks_now(self.ledger.capacity.block_size)
        if held > ticket.held_blocks:
            self.ledger.grow(held - ticket.held_blocks)
            ticket.held_blocks = held

    def release(self, reservation: KvReservation, *, completion_tokens: int | None = None,
                capped: bool = False, warmup: bool = False) -> None:
        """Free what a request holds (its blocks at dispatch and what its answer grew into) and
        its slot; learn the engine's decode step from an answer that ended
        (``completion_tokens``: over all its choices, as its usage counts them; None: it did
        not end as an answer) and, unless it was ``warmup``'s, the answer's length (``capped``
        when ``max_tokens`` cut one of them): each of its ``n`` choices is one answer of
        ``completion_tokens / n`` tokens. A warmup answer's pace is the engine's like any
        other's — without it a fresh engine's first burst found no decode step and the turnover
        could not say that a request waits for room past the SLO — but its length is short on
        purpose. Dispatch what now fits."""
        self._changes += 1
        ticket = self._running.pop(reservation.ticket, None)
        grown = max(0, ticket.held_blocks - reservation.blocks) if ticket is not None else 0
        self.ledger.release(reservation, grown_blocks=grown)
        if ticket is not None:
            now = self.clock()
            self._running_sequences -= ticket.request.sequences
            if ticket.first_token_at is not None:
                self._decoding -= 1
            else:
                self.prefill_cost.forget(ticket.id)
            # one that ended without a first token (failed, cancelled) leaves the backlog
            self.valve.leave(ticket.id, now)
            self.prefill.leave(ticket.id, now)
            if (ticket.first_token_at is not None and completion_tokens is not None
                    and ticket.learn and self.learning):
                self.decode.answer(now - ticket.first_token_at,
                                   ticket.produced // ticket.request.sequences)
        if (ticket is not None and completion_tokens is not None and ticket.produced > 0
                and not warmup):
            sequences = ticket.request.sequences
            per_choice = math.ceil(completion_tokens / sequences)
            for _ in range(sequences):
                self.lengths.observe(per_choice, capped=capped)
        self.dispatch()


def retry_after_header(seconds: float | None, floor_s: int) -> str:
    """Retry-After in whole seconds: the backlog's drain time, at least ``floor_s``, at most 60."""
    wait = floor_s if seconds is None else max(floor_s, math.ceil(seconds))
    return str(min(60, wait))

