"""KV-aware admission: serve what can be served within the TTFT SLO, refuse the rest at once.

KV cache ≈ concurrent sequences × context length × bytes per token
(docs/design-decisions.md#kv-grows-with-concurrency): a burst of long requests fills it and the
engine preempts (evicts running sequences and recomputes them later), thrashes, or (with a memory
spike on top) dies. So the gateway dispatches to the engine only what the engine's *real* pool
(read from the engine after it started) holds under ``watermark``: each request reserves what it
is *expected* to use — its prompt plus the answer length recent answers suggest, capped by its
``max_tokens`` (:class:`gateway.forecast.OutputLengths`), in whole KV blocks — and vLLM's own
scheduler absorbs the rest (its preemptions are counted). Requests are also classified by
prompt + ``max_tokens`` into buckets S/M/L/XL, each with its own concurrency cap, so a burst of
XL requests cannot take every slot from short ones (docs/design-decisions.md#request-buckets).
The buckets and their bounds are :mod:`request_buckets`' (fractions of ``max_model_len``), the
same the GPU budget sizes and the dashboard draws.

What does not fit waits in a first-come-first-served queue, and is dispatched as reservations
are released. Whether a request may join it is decided at once, on arrival: the controller
forecasts its first token (:func:`gateway.forecast.first_token_in_s`) and refuses it — within
milliseconds, with a Retry-After from the forecast — only when that would miss the TTFT SLO
(docs/design-decisions.md#ttft-admission). A request never waits to be refused; one that waits
past ``max_wait_s`` (the forecast was badly wrong) is the exception, counted as such. While the
circuit breaker is half-open, the number of requests in flight is capped too (the probes).

:class:`AdmissionLedger` is the pure bookkeeping; :class:`AdmissionController` adds the queue, the
forecast and what it learns from the streams.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.engines.base import KvCapacity
from gateway.forecast import (
    DEFAULT_PRIOR,
    NEVER,
    DispatchRules,
    InFlight,
    OutputLengths,
    PrefillModel,
    Queued,
    StepModel,
    StepPrior,
    first_token_in_s,
)
from request_buckets import BucketBounds, RequestBucket

LengthBucket = RequestBucket
"""Request-length buckets by reserved tokens (prompt + max output), from :mod:`request_buckets`."""


class RefusalReason(StrEnum):
    """Why a reservation cannot be made now."""

    KV_WATERMARK = "kv_watermark"
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
    """Blocks held for one admitted request until it finishes."""

    bucket: LengthBucket
    tokens: int
    blocks: int
    ticket: int = 0
    """The controller's id of the request (0 for reservations made on the ledger directly)."""
    forecast_ttft_s: float | None = None
    """What the controller forecast for its first token when it arrived."""


class AdmissionLedger:
    """Reserved blocks and in-flight counts per bucket, against a watermark of the pool."""

    def __init__(self, capacity: KvCapacity, *, watermark: float,
                 bucket_caps: Mapping[str, int]) -> None:
        if not 0.0 < watermark <= 1.0:
            raise ValueError(f"watermark must be in (0, 1], got {watermark}")
        self.watermark = watermark
        self.bucket_caps = {LengthBucket(key): value for key, value in bucket_caps.items()}
        self.capacity = capacity
        self.reserved_blocks = 0
        self.inflight: dict[LengthBucket, int] = dict.fromkeys(LengthBucket, 0)

    @property
    def limit_blocks(self) -> int:
        """Blocks admitted requests may reserve: watermark × the engine's pool."""
        return math.floor(self.capacity.num_blocks * self.watermark)

    @property
    def total_inflight(self) -> int:
        """Admitted requests not yet released."""
        return sum(self.inflight.values())

    @property
    def reserved_share(self) -> float:
        """Reserved blocks as a share of the whole pool (0-1)."""
        return self.reserved_blocks / self.capacity.num_blocks

    def set_capacity(self, capacity: KvCapacity) -> None:
        """Adopt the pool of a (re)built engine; reservations already held stay counted."""
        self.capacity = capacity

    def blocks_for(self, tokens: int) -> int:
        """Blocks a reservation of ``tokens`` takes in the current pool."""
        return blocks_for_tokens(tokens, self.capacity.block_size)

    def refusal(self, bucket: LengthBucket, tokens: int, *,
                max_total_inflight: int | None = None) -> RefusalReason | None:
        """Why ``tokens`` in ``bucket`` cannot be reserved now, or None if it can."""
        blocks = self.blocks_for(tokens)
        if blocks > self.limit_blocks:
            return RefusalReason.NEVER_FITS
        if self.inflight[bucket] >= self.bucket_caps[bucket]:
            return RefusalReason.BUCKET_CAP
        if max_total_inflight is not None and self.total_inflight >= max_total_inflight:
            return RefusalReason.PROBE_LIMIT
        if self.reserved_blocks + blocks > self.limit_blocks:
            return RefusalReason.KV_WATERMARK
        return None

    def reserve(self, bucket: LengthBucket, tokens: int, *,
                max_total_inflight: int | None = None) -> KvReservation:
        """Book the reservation; ValueError if :meth:`refusal` would refuse it."""
        reason = self.refusal(bucket, tokens, max_total_inflight=max_total_inflight)
        if reason is not None:
            raise ValueError(f"cannot reserve {tokens} tokens in bucket {bucket}: {reason}")
        reservation = KvReservation(bucket=bucket, tokens=tokens, blocks=self.blocks_for(tokens))
        self.reserved_blocks += reservation.blocks
        self.inflight[bucket] += 1
        return reservation

    def release(self, reservation: KvReservation) -> None:
        """Return a reservation's blocks and slot."""
        self.reserved_blocks -= reservation.blocks
        self.inflight[reservation.bucket] -= 1
        if self.reserved_blocks < 0 or self.inflight[reservation.bucket] < 0:
            raise RuntimeError("admission ledger released more than it reserved")


class AdmissionRejected(Exception):
    """Refused: no room within the SLO (or the wait). Carries what the 429/503 says."""

    def __init__(self, reason: RefusalReason, bucket: LengthBucket, waited_s: float, *,
                 retry_after_s: float | None = None,
                 forecast_ttft_s: float | None = None) -> None:
        super().__init__(f"{reason.value} in bucket {bucket.value} after {waited_s:.3f} s")
        self.reason = reason
        self.bucket = bucket
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s
        """Seconds after which the queue's forecast says a request like it would fit the SLO."""
        self.forecast_ttft_s = forecast_ttft_s


@dataclass(frozen=True)
class AdmissionRequest:
    """What admission needs to know of a request."""

    bucket: LengthBucket
    prompt_tokens: int
    max_tokens: int
    sequences: int = 1
    """Choices generated (``n``): each needs its own answer's KV; the prompt's is shared."""


@dataclass(eq=False)
class _Ticket:
    """A request from arrival to release."""

    id: int
    request: AdmissionRequest
    tokens: int
    """Reserved KV tokens: prompt + expected output."""
    expected_output: int
    arrived_at: float
    forecast_ttft_s: float
    """The calibrated forecast admission decided by."""
    raw_forecast_s: float = NEVER
    """The replay's own forecast (before calibration)."""
    future: asyncio.Future[KvReservation] | None = None
    dispatched_at: float | None = None
    others_prefilling: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    produced: int = 0
    cached_tokens: int = 0


@dataclass
class ForecastStats:
    """How the forecasts compared with the first tokens that followed.

    The 90th percentile of actual ÷ forecast (over the last ``window`` first tokens of requests
    forecast to wait at least ``min_forecast_s``: below that, fixed costs dominate the ratio)
    calibrates later forecasts: when the engine runs slower than learned (a noisy neighbour,
    longer prompts), admission tightens before the SLO is missed twice.
    """

    samples: int = 0
    late: int = 0
    """First tokens that came after the SLO although the forecast said they would not."""
    window: int = 256
    min_forecast_s: float = 0.05
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    _p90: float | None = None
    _stale: bool = False

    def observe(self, actual_s: float, forecast_s: float, slo_s: float) -> None:
        """A first token came ``actual_s`` after arrival; the replay said ``forecast_s``."""
        self.samples += 1
        self.late += actual_s > slo_s
        if forecast_s >= self.min_forecast_s:
            self.ratios.append(actual_s / forecast_s)
            self._stale = True

    def ratio_p90(self) -> float | None:
        """90th percentile of actual ÷ forecast time to first token."""
        if self._stale:
            ordered = sorted(self.ratios)
            self._p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
            self._stale = False
        return self._p90

    def calibration(self) -> float:
        """What forecasts are multiplied by: the 90th percentile ratio, between 1 and 4."""
        ratio = self.ratio_p90()
        return 1.0 if ratio is None else min(4.0, max(1.0, ratio))


class AdmissionController:
    """The ledger, a first-come-first-served queue, and the forecast that decides on arrival."""

    def __init__(self, ledger: AdmissionLedger, *, ttft_slo_s: float, max_running: int,
                 clock: Callable[[], float] = time.monotonic,
                 prior: StepPrior = DEFAULT_PRIOR) -> None:
        self.ledger = ledger
        self.ttft_slo_s = ttft_slo_s
        self.max_running = max_running
        self.clock = clock
        self.steps = StepModel(prior)
        self.prefill = PrefillModel(prior)
        self.lengths = OutputLengths()
        self.forecasts = ForecastStats()
        self._ids = itertools.count(1)
        self._queue: deque[_Ticket] = deque()
        self._running: dict[int, _Ticket] = {}

    @property
    def waiting(self) -> int:
        """Admitted requests waiting for dispatch."""
        return len(self._queue)

    # --- arrival ---
    def forecast_ttft_s(self, request: AdmissionRequest) -> float:
        """Seconds until ``request``'s first token if it joined the queue now."""
        ticket = self._ticket(request, 0.0)
        return ticket.forecast_ttft_s

    def _ticket(self, request: AdmissionRequest, now: float) -> _Ticket:
        expected = self.lengths.expected(request.max_tokens)
        tokens = request.prompt_tokens + request.sequences * expected
        ticket = _Ticket(id=next(self._ids), request=request, tokens=tokens,
                         expected_output=expected, arrived_at=now, forecast_ttft_s=NEVER)
        if self.ledger.blocks_for(tokens) <= self.ledger.limit_blocks:
            ticket.raw_forecast_s = first_token_in_s(
                (self._in_flight(t) for t in self._running.values()),
                (self._queued(t) for t in self._queue), self._queued(ticket),
                rules=DispatchRules(
                    limit_tokens=self.ledger.limit_blocks * self.ledger.capacity.block_size,
                    max_running=self.max_running,
                    bucket_caps=self.ledger.bucket_caps),
                step_s=self.steps.step_s, prefill_s=self.prefill.seconds)
            # Judged against the raw replay (ForecastStats.observe), so the calibration settles
            # at the replay's real error instead of chasing its own correction.
            ticket.forecast_ttft_s = ticket.raw_forecast_s * self.forecasts.calibration()
        return ticket

    def _in_flight(self, ticket: _Ticket) -> InFlight:
        block = self.ledger.capacity.block_size
        return InFlight(tokens=self.ledger.blocks_for(ticket.tokens) * block,
                        remaining_output=max(1, ticket.expected_output - ticket.produced),
                        prefill_tokens=(ticket.request.prompt_tokens
                                        if ticket.first_token_at is None else 0),
                        bucket=ticket.request.bucket)

    def _queued(self, ticket: _Ticket) -> Queued:
        block = self.ledger.capacity.block_size
        return Queued(tokens=self.ledger.blocks_for(ticket.tokens) * block,
                      prompt_tokens=ticket.request.prompt_tokens,
                      output_tokens=ticket.expected_output, bucket=ticket.request.bucket)

    async def acquire(self, request: AdmissionRequest, *, max_wait_s: float,
                      max_total_inflight: Callable[[], int | None] = lambda: None
                      ) -> KvReservation:
        """Refuse at once (AdmissionRejected) or queue and return the reservation once
        dispatched; AdmissionRejected(QUEUE_TIMEOUT) after ``max_wait_s`` in the queue."""
        now = self.clock()
        ticket = self._ticket(request, now)
        self._refuse_on_arrival(ticket, max_total_inflight())
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

    def _refuse_on_arrival(self, ticket: _Ticket, probe_limit: int | None) -> None:
        request = ticket.request
        if ticket.forecast_ttft_s == NEVER:
            raise AdmissionRejected(RefusalReason.NEVER_FITS, request.bucket, 0.0)
        if probe_limit is not None and len(self._running) + len(self._queue) >= probe_limit:
            raise AdmissionRejected(RefusalReason.PROBE_LIMIT, request.bucket, 0.0)
        if ticket.forecast_ttft_s > self.ttft_slo_s:
            raise AdmissionRejected(
                RefusalReason.TTFT_SLO, request.bucket, 0.0,
                retry_after_s=ticket.forecast_ttft_s - self.ttft_slo_s,
                forecast_ttft_s=ticket.forecast_ttft_s)

    # --- dispatch ---
    def dispatch(self) -> None:
        """Dispatch queued requests first come, first served while their reservations fit (one
        blocked only by its bucket's cap lets the ones behind it pass)."""
        index = 0
        while index < len(self._queue) and len(self._running) < self.max_running:
            ticket = self._queue[index]
            reason = self.ledger.refusal(ticket.request.bucket, ticket.tokens)
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
                                        reservation.blocks, ticket.id, ticket.forecast_ttft_s)
            ticket.dispatched_at = self.clock()
            ticket.others_prefilling = sum(1 for t in self._running.values()
                                           if t.first_token_at is None)
            self._running[ticket.id] = ticket
            ticket.future.set_result(reservation)

    def notify(self) -> None:
        """Capacity, breaker or engine changed: dispatch what now fits."""
        self.dispatch()

    # --- what the streams tell ---
    def progress(self, reservation: KvReservation, tokens: int, *,
                 cached_tokens: int | None = None) -> None:
        """``tokens`` more tokens of ``reservation``'s answer arrived now."""
        ticket = self._running.get(reservation.ticket)
        if ticket is None or tokens <= 0:
            return
        now = self.clock()
        if cached_tokens is not None:
            ticket.cached_tokens = cached_tokens
        if ticket.first_token_at is None:
            ticket.first_token_at = now
            self._first_token(ticket, now)
        elif ticket.last_token_at is not None:
            self.steps.observe(len(self._running), (now - ticket.last_token_at) / tokens, tokens)
        ticket.last_token_at = now
        ticket.produced += tokens

    def _first_token(self, ticket: _Ticket, now: float) -> None:
        if ticket.arrived_at > 0:
            self.forecasts.observe(now - ticket.arrived_at, ticket.raw_forecast_s,
                                   self.ttft_slo_s)
        if ticket.others_prefilling == 0 and ticket.dispatched_at is not None:
            alone = now - ticket.dispatched_at - self.steps.step_s(len(self._running))
            self.prefill.observe(ticket.request.prompt_tokens - ticket.cached_tokens, alone)

    def release(self, reservation: KvReservation, *, completion_tokens: int | None = None,
                capped: bool = False) -> None:
        """Return a reservation; learn the answer's length (``completion_tokens`` of a real
        answer, ``capped`` when ``max_tokens`` cut it); dispatch what now fits."""
        self.ledger.release(reservation)
        ticket = self._running.pop(reservation.ticket, None)
        if ticket is not None and completion_tokens is not None and ticket.produced > 0:
            self.lengths.observe(completion_tokens, capped=capped)
        self.dispatch()


def retry_after_header(seconds: float | None, floor_s: int) -> str:
    """Retry-After in whole seconds: the forecast's wait, at least ``floor_s``, at most 60."""
    wait = floor_s if seconds is None else max(floor_s, math.ceil(seconds))
    return str(min(60, wait))

