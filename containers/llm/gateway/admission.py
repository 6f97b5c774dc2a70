"""KV-aware admission: reserve KV blocks before a request reaches the engine.

KV cache ≈ concurrent sequences × context length × bytes per token
(docs/design-decisions.md#kv-grows-with-concurrency): a burst of long requests fills it and the
engine preempts, thrashes, or (with a memory spike on top) dies. So
every request reserves its worst case — prompt tokens + max output tokens, rounded up to whole
KV blocks — against the engine's *real* pool (read from the engine after it started), and only
``watermark`` of the pool may be reserved. Requests are also classified by that length into
buckets S/M/L/XL, each with its own concurrency cap, so a burst of XL requests cannot take every
slot from short ones (docs/design-decisions.md#request-buckets). The buckets and their bounds are
:mod:`request_buckets`' (fractions of ``max_model_len``), the same the GPU budget sizes and the
dashboard draws.

A request that does not fit waits up to ``wait_s`` for reservations to be released, then is
shed (the HTTP layer answers 429 with Retry-After). While the circuit breaker is half-open, the
total number of requests in flight is capped too (the probes).

:class:`AdmissionLedger` is the pure bookkeeping; :class:`AdmissionController` adds the bounded
wait on the event loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gateway.engines.base import KvCapacity
from request_buckets import BucketBounds, RequestBucket

LengthBucket = RequestBucket
"""Request-length buckets by reserved tokens (prompt + max output), from :mod:`request_buckets`."""


class RefusalReason(StrEnum):
    """Why a reservation cannot be made now."""

    KV_WATERMARK = "kv_watermark"
    BUCKET_CAP = "bucket_cap"
    PROBE_LIMIT = "half_open_probe_limit"
    NEVER_FITS = "never_fits"


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
    """Shed: no room within the wait allowed. Carries the reason and bucket for the 429."""

    def __init__(self, reason: RefusalReason, bucket: LengthBucket, waited_s: float) -> None:
        super().__init__(f"{reason.value} in bucket {bucket.value} after {waited_s:.3f} s")
        self.reason = reason
        self.bucket = bucket
        self.waited_s = waited_s


class AdmissionController:
    """The ledger plus a bounded wait: every release wakes the waiters to re-check."""

    def __init__(self, ledger: AdmissionLedger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.clock = clock
        self.waiting = 0
        self._changed = asyncio.Event()

    async def acquire(
        self,
        bucket: LengthBucket,
        tokens: int,
        *,
        wait_s: float,
        max_total_inflight: Callable[[], int | None] = lambda: None,
    ) -> KvReservation:
        """Reserve or wait up to ``wait_s``; AdmissionRejected when the wait runs out."""
        started = self.clock()
        deadline = started + wait_s
        while True:
            limit = max_total_inflight()
            reason = self.ledger.refusal(bucket, tokens, max_total_inflight=limit)
            if reason is None:
                return self.ledger.reserve(bucket, tokens, max_total_inflight=limit)
            remaining = deadline - self.clock()
            if reason is RefusalReason.NEVER_FITS or remaining <= 0:
                raise AdmissionRejected(reason, bucket, self.clock() - started)
            changed = self._changed
            self.waiting += 1
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                continue  # re-check once more, then the deadline test above sheds it
            finally:
                self.waiting -= 1

    def release(self, reservation: KvReservation) -> None:
        """Return a reservation and wake every waiter."""
        self.ledger.release(reservation)
        self.notify()

    def notify(self) -> None:
        """Wake waiters to re-check (after a release, a capacity or a breaker change)."""
        self._changed.set()
        self._changed = asyncio.Event()
