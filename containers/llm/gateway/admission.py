"""KV-aware admission: serve what can be served within the TTFT SLO, refuse the rest at once.

KV cache ≈ concurrent sequences × context length × bytes per token
(docs/design-decisions.md#kv-grows-with-concurrency): a burst of long requests fills it and the
engine preempts (evicts running sequences and recomputes them later) or thrashes. The gateway
dispatches to the engine by vLLM's own admission rule, on the engine's *real* pool (read from the
engine after it started): a queued request goes when its prompt and the first token of each of
its choices fit beside what the running requests **hold now** — their prompts and their answers
so far, in whole KV blocks, counted as their streams grow. It holds back no more than vLLM
would, so a burst's first tokens come as fast as on vLLM alone; vLLM's scheduler absorbs the
answers' growth by preempting a few running sequences, and those are counted. ``watermark``
bounds one request's *expected* end-state (its prompt plus the answer length recent answers
suggest, capped by its ``max_tokens``: :class:`gateway.forecast.OutputLengths`): more than that
share of the pool on its own never fits. Requests are also classified by prompt + ``max_tokens``
into buckets S/M/L/XL, each with its own concurrency cap, so a burst of XL requests cannot take
every slot from short ones (docs/design-decisions.md#request-buckets). A request of ``n`` choices
holds the prompt once and ``n`` answers, and counts as ``n`` of the engine's running sequences
(``max_num_seqs``); a cap counts it once.
The buckets and their bounds are :mod:`request_buckets`' (fractions of ``max_model_len``), the
same the GPU budget sizes and the dashboard draws.

What does not fit waits in a first-come-first-served queue, and is dispatched as running
requests finish and free what they hold. Whether a request may join it is decided at once, on
arrival: the controller forecasts its first token (:func:`gateway.forecast.first_token_in_s`)
and refuses it — within milliseconds, with a Retry-After from the forecast — only when that
would miss the TTFT SLO (docs/design-decisions.md#ttft-admission). A request never waits to be
refused; one that waits past ``max_wait_s`` (the forecast was badly wrong) is the exception,
counted as such. While the circuit breaker is half-open, the number of requests in flight is
capped too (the probes).

:class:`AdmissionLedger` is the pure bookkeeping; :class:`AdmissionController` adds the queue, the
forecast and what it learns from the streams.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.engines.base import KvCapacity
from gateway.forecast import (
    DEFAULT_PRIOR,
    NEVER,
    DispatchRules,
    FirstTokenModel,
    InFlight,
    OutputLengths,
    ProbeGate,
    Queued,
    StepModel,
    StepPrior,
    first_token_in_s,
)
from request_buckets import BucketBounds, RequestBucket

LengthBucket = RequestBucket
"""Request-length buckets by reserved tokens (prompt + max output), from :mod:`request_buckets`."""


class RefusalReason(StrEnum):
    """Why a request cannot be dispatched now, or is refused."""

    KV_POOL = "kv_pool"
    """The running requests hold so much of the pool now that this prompt does not fit (it
    waits for dispatch; never a refusal)."""
    MAX_RUNNING = "max_running"
    """The engine runs ``max_num_seqs`` sequences already (it waits for dispatch; never a
    refusal)."""
    BUCKET_CAP = "bucket_cap"
    PROBE_LIMIT = "half_open_probe_limit"
    NEVER_FITS = "never_fits"
    TTFT_SLO = "ttft_slo"
    """The forecast first token would come after the TTFT SLO (refused on arrival)."""
    QUEUE_TIMEOUT = "queue_timeout"
    """Admitted, but not dispatched within ``max_wait_s`` (the forecast was wrong)."""


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens (PagedAttention allocates whole blocks)."""
    if tokens < 0 or block_size < 1:
        raise ValueError(f"tokens must be >= 0 and block_size >= 1, got {tokens}, {block_size}")
    return math.ceil(tokens / block_size)


def classify_bucket(tokens: int, bounds: BucketBounds) -> LengthBucket:
    """The bucket of a reservation of ``tokens`` under ``bounds`` (the engine's window's)."""
    return bounds.classify(tokens)


@dataclass(frozen=True)
class KvReservation:
    """One dispatched request's blocks at dispatch (what its answer grows into is counted on
    the ledger as it streams), held until it finishes."""

    bucket: LengthBucket
    tokens: int
    """KV tokens held at dispatch: the prompt and the first token of each choice."""
    blocks: int
    ticket: int = 0
    """The controller's id of the request (0 for reservations made on the ledger directly)."""
    forecast_ttft_s: float | None = None
    """What the controller forecast for its first token when it arrived."""
    override: str | None = None
    """Why it was admitted although its forecast missed the SLO: ``idle`` (nothing was running
    or queued) or ``probe`` (:class:`gateway.forecast.ProbeGate`); None when it did not."""


class AdmissionLedger:
    """Blocks the dispatched requests hold now and in-flight counts per bucket, against the
    engine's whole pool (and, for one request's expected end-state, the watermark)."""

    def __init__(self, capacity: KvCapacity, *, watermark: float,
                 bucket_caps: Mapping[str, int]) -> None:
        if not 0.0 < watermark <= 1.0:
            raise ValueError(f"watermark must be in (0, 1], got {watermark}")
        self.watermark = watermark
        self.bucket_caps = {LengthBucket(key): value for key, value in bucket_caps.items()}
        self.capacity = capacity
        self.reserved_blocks = 0
        self.inflight: dict[LengthBucket, int] = dict.fromkeys(LengthBucket, 0)

    @classmethod
    def awaiting_engine(cls, block_size: int, *, watermark: float,
                        bucket_caps: Mapping[str, int]) -> AdmissionLedger:
        """A ledger before any engine reported its pool: a pool of no blocks, so nothing is
        dispatched until :meth:`set_capacity` adopts the engine's real one (the service answers
        503 before asking while the engine starts). Admission is never sized from a plan."""
        return cls(KvCapacity(num_blocks=0, block_size=block_size), watermark=watermark,
                   bucket_caps=bucket_caps)

    @property
    def limit_blocks(self) -> int:
        """The most one request is expected to hold at its end: watermark × the engine's pool
        (more can only run by evicting everything else: it never fits)."""
        return math.floor(self.capacity.num_blocks * self.watermark)

    @property
    def pool_blocks(self) -> int:
        """What the dispatched requests may hold together: the engine's whole pool, as vLLM's
        scheduler admits a request whose prompt fits beside what the running ones hold."""
        return self.capacity.num_blocks

    @property
    def total_inflight(self) -> int:
        """Admitted requests not yet released."""
        return sum(self.inflight.values())

    @property
    def reserved_share(self) -> float:
        """Blocks the dispatched requests hold now as a share of the whole pool (the gauge line's
        ``kv_reserved_share``); briefly above 1 while their answers outgrow the pool and vLLM
        preempts."""
        if not self.capacity.num_blocks:  # no engine has reported its pool yet
            return 0.0
        return self.reserved_blocks / self.capacity.num_blocks

    def set_capacity(self, capacity: KvCapacity) -> None:
        """Adopt the pool of a (re)built engine; blocks already held stay counted."""
        self.capacity = capacity

    def blocks_for(self, tokens: int) -> int:
        """Blocks ``tokens`` tokens take in the current pool."""
        return blocks_for_tokens(tokens, self.capacity.block_size)

    def refusal(self, bucket: LengthBucket, tokens: int, *,
                max_total_inflight: int | None = None) -> RefusalReason | None:
        """Why a request holding ``tokens`` at dispatch in ``bucket`` cannot be dispatched now
        (``KV_POOL``: it does not fit beside what the running requests hold), or None if it
        can."""
        blocks = self.blocks_for(tokens)
        if blocks > self.limit_blocks:
            return RefusalReason.NEVER_FITS
        if self.inflight[bucket] >= self.bucket_caps[bucket]:
            return RefusalReason.BUCKET_CAP
        if max_total_inflight is not None and self.total_inflight >= max_total_inflight:
            return RefusalReason.PROBE_LIMIT
        if self.reserved_blocks + blocks > self.pool_blocks:
            return RefusalReason.KV_POOL
        return None

    def reserve(self, bucket: LengthBucket, tokens: int, *,
                max_total_inflight: int | None = None) -> KvReservation:
        """Book a dispatch's blocks and slot; ValueError if :meth:`refusal` would refuse it."""
        reason = self.refusal(bucket, tokens, max_total_inflight=max_total_inflight)
        if reason is not None:
            raise ValueError(f"cannot reserve {tokens} tokens in bucket {bucket}: {reason}")
        reservation = KvReservation(bucket=bucket, tokens=tokens, blocks=self.blocks_for(tokens))
        self.reserved_blocks += reservation.blocks
        self.inflight[bucket] += 1
        return reservation

    def grow(self, blocks: int) -> None:
        """A dispatched request now holds ``blocks`` more (its answer grew into new blocks)."""
        if blocks < 0:
            raise ValueError(f"blocks must be >= 0, got {blocks}")
        self.reserved_blocks += blocks

    def release(self, reservation: KvReservation, *, grown_blocks: int = 0) -> None:
        """Return a reservation's blocks (and the ``grown_blocks`` it grew by) and its slot."""
        self.reserved_blocks -= reservation.blocks + grown_blocks
        self.inflight[reservation.bucket] -= 1
        if self.reserved_blocks < 0 or self.inflight[reservation.bucket] < 0:
            raise RuntimeError("admission ledger released more than it reserved")


class AdmissionRejected(Exception):
    """Refused: no room within the SLO (or the wait). Carries what the 429/503 says."""

    def __init__(self, reason: RefusalReason, bucket: LengthBucket, waited_s: float, *,
                 retry_after_s: float | None = None,
                 forecast_ttft_s: float | None = None, while_idle: bool = False) -> None:
        super().__init__(f"{reason.value} in bucket {bucket.value} after {waited_s:.3f} s")
        self.reason = reason
        self.bucket = bucket
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s
        """Seconds after which the queue's forecast says a request like it would fit the SLO."""
        self.forecast_ttft_s = forecast_ttft_s
        self.while_idle = while_idle
        """Refused by forecast while the engine was nearly idle (a forecast gone wrong)."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What admission needs to know of a request."""

    bucket: LengthBucket
    prompt_tokens: int
    max_tokens: int
    sequences: int = 1
    """Choices generated (``n``): each needs its own answer's KV (the prompt's is shared) and
    is one of the engine's running sequences (``max_running``, vLLM's ``max_num_seqs``)."""


@dataclass(frozen=True)
class _Choice:
    """The forecast's bucket key for a request's further choices: running sequences that count
    against ``max_running`` but not against a bucket's cap (caps count requests)."""

    ticket: int
    index: int


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
    expected_output: int
    arrived_at: float
    forecast_ttft_s: float
    """The calibrated forecast admission decided by."""
    raw_forecast_s: float = NEVER
    """The replay's own forecast (before calibration)."""
    override: str | None = None
    """``idle`` or ``probe`` when admitted against a forecast past the SLO."""
    contended: bool = False
    """Whether it had to wait for others when it arrived (:meth:`AdmissionController._contended`):
    which calibration its first token teaches."""
    future: asyncio.Future[KvReservation] | None = None
    dispatched_at: float | None = None
    prefill_ahead: int = 0
    """Prompt tokens of requests dispatched before it and still without a first token."""
    first_token_at: float | None = None
    last_token_at: dict[int, float] = field(default_factory=dict)
    """When each choice's last delta came."""
    produced: int = 0
    """Output tokens over all its choices."""
    held_blocks: int = 0
    """KV blocks it holds now in the ledger: its prompt and its answers so far."""
    cached_tokens: int = 0

    def blocks_now(self, block_size: int) -> int:
        """The blocks its prompt, its answers so far and each choice's next token take."""
        return blocks_for_tokens(self.request.prompt_tokens + self.produced
                                 + self.request.sequences, block_size)

    @property
    def remaining_output(self) -> float:
        """Tokens each of its sequences is still expected to generate."""
        return max(1.0, self.expected_output - self.produced / self.request.sequences)


@dataclass
class ForecastStats:
    """How the forecasts compared with the first tokens that followed, and the calibration
    that corrects later forecasts by it (the controller keeps two: the first-token model's and
    the queueing replay's, :class:`AdmissionController`).

    Every first token of a request forecast to wait at least ``min_forecast_s`` (below that,
    fixed costs such as parsing and tokenizing under load dominate the ratio) moves the
    calibration: an exponentially weighted mean of ``log(actual ÷ raw forecast)`` with weight
    ``gain``, held between ``floor`` and ``ceiling``. It moves **both ways**: an engine running
    slower than the models learned (a noisy neighbour, longer prompts) tightens admission within
    a few first tokens, one running faster (the models learned a one-off cost, a slow spell
    ended) loosens it just as fast. It is judged against the raw replay, so it settles at the
    replay's real error instead of chasing its own correction. Its evidence ages: without new
    first tokens it returns toward 1 with a half-life of ``half_life_s`` (the burst that made it
    was then; the next one is judged by the models, and corrected again by its own first first
    tokens). Only admitted requests have first tokens: while admission refuses by forecast, the
    probes (:class:`gateway.forecast.ProbeGate`) are what keep it learning
    (docs/design-decisions.md#forecast-lock-out).
    """

    samples: int = 0
    late: int = 0
    """First tokens that came after the SLO although the forecast said they would not."""
    min_forecast_s: float = 0.25
    gain: float = 0.3
    floor: float = 1 / 64
    ceiling: float = 4.0
    half_life_s: float = 10.0
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=48))
    """The last ratios (reported as their median; the calibration is the weighted mean)."""
    _log_calibration: float = 0.0
    _updated_at: float | None = None
    _median: float | None = None
    _stale: bool = False

    def observe(self, actual_s: float, forecast_s: float, slo_s: float,
                now: float | None = None) -> None:
        """A first token came ``actual_s`` after arrival (at ``now``, monotonic; None: no
        ageing); the replay said ``forecast_s``."""
        self.samples += 1
        self.late += actual_s > slo_s
        if forecast_s >= self.min_forecast_s and actual_s > 0 and math.isfinite(forecast_s):
            ratio = actual_s / forecast_s
            self.ratios.append(ratio)
            self._stale = True
            current = self._aged(now)
            moved = current + self.gain * (math.log(ratio) - current)
            self._log_calibration = min(math.log(self.ceiling), max(math.log(self.floor), moved))
            self._updated_at = now

    def _aged(self, now: float | None) -> float:
        if now is None or self._updated_at is None or now <= self._updated_at:
            return self._log_calibration
        return self._log_calibration * 0.5 ** ((now - self._updated_at) / self.half_life_s)

    def ratio_median(self) -> float | None:
        """Median of the last actual ÷ forecast times to first token (None before any)."""
        if self._stale:
            self._median = statistics.median(self.ratios) if self.ratios else None
            self._stale = False
        return self._median

    def calibration(self, now: float | None = None) -> float:
        """What forecasts are multiplied by at ``now`` (1 before any first token; see the
        class)."""
        return math.exp(self._aged(now))

    def reset(self) -> None:
        """Forget everything (a new measuring pass of warmup, and its end)."""
        self.samples = self.late = 0
        self.ratios.clear()
        self._log_calibration = 0.0
        self._updated_at = None
        self._median = None
        self._stale = False


@dataclass
class ArrivalCounts:
    """What admission decided on arrival, by forecast (the /ping body's ``admission`` block and
    the per-request record report them as they happen)."""

    refused_by_forecast: int = 0
    refused_while_idle: int = 0
    """Refused by forecast while the engine was nearly idle (see
    :meth:`AdmissionController.nearly_idle`): a healthy instance turning users away."""
    probes: int = 0
    """Admitted against a forecast past the SLO to test it (:class:`ProbeGate`)."""
    idle_admits: int = 0
    """Admitted against a forecast past the SLO because nothing was running or queued."""
    last_refused_while_idle_at: float | None = None


PROBE_INTERVAL_S = 1.0
"""While admission refuses by forecast, one request a second is admitted to test the forecast
(:class:`gateway.forecast.ProbeGate`; docs/design-decisions.md#forecast-lock-out)."""
NEARLY_IDLE_SHARE = 0.1
"""At most this share of ``max_running`` running (and nothing queued) is "nearly idle": a
refusal by forecast then means the forecast, not the load, turned the user away."""


class AdmissionController:
    """The ledger, a first-come-first-served queue, and the forecast that decides on arrival.

    The forecast decides only between requests that compete for capacity in use: with nothing
    running and nothing queued, a request that fits the pool is dispatched whatever the forecast
    says; while it refuses, :class:`gateway.forecast.ProbeGate` admits one request per
    ``probe_interval_s`` to test it. ``learning`` off (warmup's first pass, which pays the
    engine's one-off compile and load costs) keeps the streams from teaching the models.
    """

    def __init__(self, ledger: AdmissionLedger, *, ttft_slo_s: float, max_running: int,
                 clock: Callable[[], float] = time.monotonic,
                 prior: StepPrior = DEFAULT_PRIOR,
                 probe_interval_s: float = PROBE_INTERVAL_S) -> None:
        self.ledger = ledger
        self.ttft_slo_s = ttft_slo_s
        self.max_running = max_running
        self.clock = clock
        self.prior = prior
        self.steps = StepModel(prior)
        self.first_token = FirstTokenModel(prior)
        self.lengths = OutputLengths()
        self.forecasts = ForecastStats(min_forecast_s=min(0.25, ttft_slo_s / 4), floor=1.0)
        """The replay's error for requests that wait for others (never below 1: under a burst
        the replay is optimistic, and a low-load spell must not make the next burst more so)."""
        self.first_tokens = ForecastStats(min_forecast_s=min(0.25, ttft_slo_s / 4))
        """The forecast's error for requests dispatched at once, i.e. the first-token model's
        (both ways: a model that learned a one-off cost is corrected within a few first
        tokens)."""
        self.probes = ProbeGate(probe_interval_s)
        self.arrivals = ArrivalCounts()
        self.learning = True
        """Whether first tokens and stream paces teach the models and the calibration."""
        self._ids = itertools.count(1)
        self._queue: deque[_Ticket] = deque()
        self._running: dict[int, _Ticket] = {}
        self._running_sequences = 0

    @property
    def waiting(self) -> int:
        """Admitted requests waiting for dispatch."""
        return len(self._queue)

    @property
    def running_sequences(self) -> int:
        """Sequences of the dispatched requests (``n`` each): what ``max_running`` caps."""
        return self._running_sequences

    @property
    def idle(self) -> bool:
        """Nothing running and nothing queued."""
        return not self._running and not self._queue

    def nearly_idle(self) -> bool:
        """Nothing queued and at most :data:`NEARLY_IDLE_SHARE` of ``max_running`` running."""
        return (not self._queue and self._running_sequences
                <= max(1, math.floor(NEARLY_IDLE_SHARE * self.max_running)))

    def idle_forecast_s(self, prompt_tokens: int) -> float:
        """The calibrated forecast first token of a ``prompt_tokens`` prompt on an idle engine
        (what warmup checks against the SLO before /ping turns healthy)."""
        return self.first_token.seconds(prompt_tokens) * self.first_tokens.calibration(
            self.clock())

    def reset_learning(self) -> None:
        """Back to the prior: the step and first-token models and both calibrations (warmup's
        measuring pass starts from here; the answer lengths, learned from real answers only,
        stay)."""
        self.steps = StepModel(self.prior)
        self.first_token = FirstTokenModel(self.prior)
        self.reset_calibrations()

    def reset_calibrations(self) -> None:
        """Both calibrations back to 1 (the end of warmup: they corrected forecasts made while
        the models were still learning)."""
        self.forecasts.reset()
        self.first_tokens.reset()

    # --- arrival ---
    def forecast_ttft_s(self, request: AdmissionRequest) -> float:
        """Seconds until ``request``'s first token if it joined the queue now."""
        ticket = self._ticket(request, 0.0)
        return ticket.forecast_ttft_s

    def _ticket(self, request: AdmissionRequest, now: float) -> _Ticket:
        expected = self.lengths.expected(request.max_tokens)
        ticket = _Ticket(id=next(self._ids), request=request,
                         tokens=request.prompt_tokens + request.sequences,
                         expected_tokens=request.prompt_tokens + request.sequences * expected,
                         expected_output=expected, arrived_at=now, forecast_ttft_s=NEVER)
        if (self.ledger.blocks_for(ticket.expected_tokens) <= self.ledger.limit_blocks
                and request.sequences <= self.max_running):
            *ahead, new = self._queued(ticket)
            clock_now = self.clock()
            ticket.contended = self._contended(ticket)
            ticket.raw_forecast_s = first_token_in_s(
                (flight for t in self._running.values() for flight in self._in_flight(t)),
                itertools.chain((item for t in self._queue for item in self._queued(t)),
                                ahead), new,
                rules=DispatchRules(
                    limit_tokens=self.ledger.pool_blocks * self.ledger.capacity.block_size,
                    max_running=self.max_running,
                    bucket_caps=self.ledger.bucket_caps),
                step_s=self.steps.step_s, first_token_s=self.first_token.seconds)
            # Judged against the raw replay (ForecastStats.observe), so each calibration settles
            # at the replay's real error instead of chasing its own correction.
            calibration = self.forecasts if ticket.contended else self.first_tokens
            ticket.forecast_ttft_s = ticket.raw_forecast_s * calibration.calibration(clock_now)
        return ticket

    def _contended(self, ticket: _Ticket) -> bool:
        """Whether ``ticket`` competes for capacity in use: others queued ahead of it, or it
        could not be dispatched now (:meth:`_blocked`)."""
        return bool(self._queue) or self._blocked(ticket) is not None

    def _blocked(self, ticket: _Ticket) -> RefusalReason | None:
        """Why ``ticket`` cannot be dispatched now (None: it can): the engine's sequences are
        taken, or the ledger's reason (its bucket's cap, or its prompt beside what the running
        requests hold)."""
        request = ticket.request
        if self._running_sequences + request.sequences > self.max_running:
            return RefusalReason.MAX_RUNNING
        return self.ledger.refusal(request.bucket, ticket.tokens)

    # The replay (gateway.forecast) counts each entry as one running sequence, so a request of
    # n choices is handed to it as n entries: the request itself, with the KV it holds, bucket
    # and prompt, and n - 1 further choices keyed apart from the buckets (a cap counts
    # requests), holding no KV of their own. Running, they finish together. Queued, the choices
    # come first and the first of them carries the KV it takes at dispatch, so the request is
    # dispatched only when its prompt's KV and its n sequences fit.
    def _in_flight(self, ticket: _Ticket) -> Iterator[InFlight]:
        block = self.ledger.capacity.block_size
        remaining = ticket.remaining_output
        yield InFlight(tokens=ticket.held_blocks * block,
                       remaining_output=remaining, bucket=ticket.request.bucket,
                       prefill_tokens=(ticket.request.prompt_tokens
                                       if ticket.first_token_at is None else 0))
        for index in range(1, ticket.request.sequences):
            yield InFlight(tokens=0, remaining_output=remaining,
                           bucket=_Choice(ticket.id, index))

    def _queued(self, ticket: _Ticket) -> list[Queued]:
        tokens = self.ledger.blocks_for(ticket.tokens) * self.ledger.capacity.block_size
        request = ticket.request
        choices = [Queued(tokens=tokens if index == 1 else 0, prompt_tokens=0,
                          output_tokens=ticket.expected_output,
                          bucket=_Choice(ticket.id, index))
                   for index in range(1, request.sequences)]
        return [*choices, Queued(tokens=0 if choices else tokens,
                                 prompt_tokens=request.prompt_tokens,
                                 output_tokens=ticket.expected_output, bucket=request.bucket)]

    async def acquire(self, request: AdmissionRequest, *, max_wait_s: float,
                      max_total_inflight: Callable[[], int | None] = lambda: None,
                      by_forecast: bool = True) -> KvReservation:
        """Refuse at once (AdmissionRejected) or queue and return the reservation once
        dispatched; AdmissionRejected(QUEUE_TIMEOUT) after ``max_wait_s`` in the queue.
        ``by_forecast=False`` (warmup): never refused for a forecast past the TTFT SLO — warmup
        is what teaches the forecast, and a warmup refused by it could never complete."""
        now = self.clock()
        ticket = self._ticket(request, now)
        self._refuse_on_arrival(ticket, max_total_inflight(), by_forecast=by_forecast)
        ticket.future = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        self.dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.future), timeout=max_wait_s)
        except TimeoutError:
            if ticket.future.done():  # dispatched at the deadline: keep it
                return ticket.future.result()
            self._queue.remove(ticket)
            ticket.future.cancel()
            raise AdmissionRejected(RefusalReason.QUEUE_TIMEOUT, request.bucket,
                                    self.clock() - now, retry_after_s=max_wait_s,
                                    forecast_ttft_s=ticket.forecast_ttft_s) from None
        except asyncio.CancelledError:  # the caller went away while queued
            if ticket in self._queue:
                self._queue.remove(ticket)
            elif ticket.future.done() and not ticket.future.cancelled():
                self.release(ticket.future.result())
            raise

    def _refuse_on_arrival(self, ticket: _Ticket, probe_limit: int | None, *,
                           by_forecast: bool) -> None:
        request = ticket.request
        if ticket.forecast_ttft_s == NEVER:
            raise AdmissionRejected(RefusalReason.NEVER_FITS, request.bucket, 0.0)
        if probe_limit is not None and len(self._running) + len(self._queue) >= probe_limit:
            raise AdmissionRejected(RefusalReason.PROBE_LIMIT, request.bucket, 0.0)
        if not by_forecast or ticket.forecast_ttft_s <= self.ttft_slo_s:
            return
        arrivals = self.arrivals
        if self.idle:  # nothing competes: the forecast has nobody to protect
            ticket.override = "idle"
            arrivals.idle_admits += 1
            return
        if self.probes.allow(ticket.arrived_at):
            ticket.override = "probe"
            arrivals.probes += 1
            return
        while_idle = self.nearly_idle()
        arrivals.refused_by_forecast += 1
        if while_idle:
            arrivals.refused_while_idle += 1
            arrivals.last_refused_while_idle_at = ticket.arrived_at
        raise AdmissionRejected(
            RefusalReason.TTFT_SLO, request.bucket, 0.0,
            retry_after_s=ticket.forecast_ttft_s - self.ttft_slo_s,
            forecast_ttft_s=ticket.forecast_ttft_s, while_idle=while_idle)

    # --- dispatch ---
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
            assert ticket.future is not None
            if ticket.future.done():  # cancelled while queued
                continue
            reservation = self.ledger.reserve(ticket.request.bucket, ticket.tokens)
            reservation = KvReservation(reservation.bucket, reservation.tokens,
                                        reservation.blocks, ticket.id, ticket.forecast_ttft_s,
                                        ticket.override)
            ticket.held_blocks = reservation.blocks
            ticket.dispatched_at = self.clock()
            ticket.prefill_ahead = sum(t.request.prompt_tokens for t in self._running.values()
                                       if t.first_token_at is None)
            self._running[ticket.id] = ticket
            self._running_sequences += ticket.request.sequences
            ticket.future.set_result(reservation)

    def notify(self) -> None:
        """Capacity, breaker or engine changed: dispatch what now fits."""
        self.dispatch()

    # --- what the streams tell ---
    def progress(self, reservation: KvReservation, tokens: int, *,
                 cached_tokens: int | None = None, choice: int = 0) -> None:
        """``tokens`` more tokens of ``reservation``'s answer (its choice ``choice``) arrived
        now."""
        ticket = self._running.get(reservation.ticket)
        if ticket is None or tokens <= 0:
            return
        now = self.clock()
        if cached_tokens is not None:
            ticket.cached_tokens = cached_tokens
        if ticket.first_token_at is None:
            ticket.first_token_at = now
            self._first_token(ticket, now)
        last = ticket.last_token_at.get(choice)
        if last is not None and self.learning:
            # The pace of one sequence as it streams, against the sequences running (a burst's
            # first wave teaches the model within steps).
            self.steps.observe(self.running_sequences, (now - last) / tokens, tokens)
        ticket.last_token_at[choice] = now
        ticket.produced += tokens
        held = ticket.blocks_now(self.ledger.capacity.block_size)
        if held > ticket.held_blocks:
            self.ledger.grow(held - ticket.held_blocks)
            ticket.held_blocks = held

    def _first_token(self, ticket: _Ticket, now: float) -> None:
        if not self.learning:
            return
        if ticket.arrived_at > 0:
            calibration = self.forecasts if ticket.contended else self.first_tokens
            calibration.observe(now - ticket.arrived_at, ticket.raw_forecast_s, self.ttft_slo_s,
                                now)
        if ticket.dispatched_at is not None:
            own = ticket.request.prompt_tokens - ticket.cached_tokens
            self.first_token.observe(ticket.prefill_ahead + own, now - ticket.dispatched_at)


    def release(self, reservation: KvReservation, *, completion_tokens: int | None = None,
                capped: bool = False) -> None:
        """Free what a request holds (its blocks at dispatch and what its answer grew into) and
        its slot; learn the answer's length (``completion_tokens`` of a real answer over all its
        choices, as its usage counts them; ``capped`` when ``max_tokens`` cut one of them): each
        of its ``n`` choices is one answer of ``completion_tokens / n`` tokens. Dispatch what now
        fits."""
        ticket = self._running.pop(reservation.ticket, None)
        grown = max(0, ticket.held_blocks - reservation.blocks) if ticket is not None else 0
        self.ledger.release(reservation, grown_blocks=grown)
        if ticket is not None:
            self._running_sequences -= ticket.request.sequences
        if ticket is not None and completion_tokens is not None and ticket.produced > 0:
            sequences = ticket.request.sequences
            per_choice = math.ceil(completion_tokens / sequences)
            for _ in range(sequences):
                self.lengths.observe(per_choice, capped=capped)
        self.dispatch()


def retry_after_header(seconds: float | None, floor_s: int) -> str:
    """Retry-After in whole seconds: the forecast's wait, at least ``floor_s``, at most 60."""
    wait = floor_s if seconds is None else max(floor_s, math.ceil(seconds))
    return str(min(60, wait))

