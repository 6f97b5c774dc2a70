"""The KV ledger: what the dispatched requests hold of the engine's pool, per length bucket.

KV cache ≈ concurrent sequences × context length × bytes per token
(docs/design-decisions.md#kv-grows-with-concurrency): a burst of long requests fills it and the
engine preempts (evicts running sequences and recomputes them later) or thrashes. The gateway
dispatches to the engine by vLLM's own admission rule, on the engine's *real* pool (read from the
engine after it started): a queued request goes when its prompt and the first token of each of
its choices fit beside what the running requests **hold now** — their prompts and their answers
so far, in whole KV blocks (:func:`gpu_budget.lengths.blocks_for_tokens`, the GPU budget's one
rule), counted as their streams grow. ``watermark`` bounds one request's *expected* end-state:
more than that share of the pool on its own never fits. Requests are classified by prompt +
``max_tokens`` into buckets S/M/L/XL (:mod:`request_buckets`), each with its own concurrency cap,
so a burst of XL requests cannot take every slot from short ones
(docs/design-decisions.md#request-buckets).

Pure bookkeeping: no clock, no queue (:mod:`gateway.admission.controller` has those).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gateway.engines.base import KvCapacity
from gpu_budget.lengths import blocks_for_tokens
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
    """The prompt tokens waiting for their first token would not drain within the target at
    the engine's measured rate (the prefill valve, refused on arrival)."""
    QUEUE_TIMEOUT = "queue_timeout"
    """Admitted, but not dispatched within ``max_wait_s`` (the engine slowed down sharply)."""
    ENGINE_DIED = "engine_died"
    """Admitted, but the engine died before it was dispatched: no engine will take it before
    the rebuild (and its warmup) ends, so it is answered at once (503)."""


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
    floor: bool = False
    """Admitted by the valve's floor (nothing else waited for a first token) although the
    backlog with it was over the cap (:class:`gateway.admission.valve.PrefillValve`)."""


class AdmissionLedger:
    """Blocks the dispatched requests hold now and in-flight counts per bucket, against the
    engine's whole pool (and, for one request's expected end-state, the watermark)."""

    def __init__(self, capacity: KvCapacity, *, watermark: float,
                 bucket_caps: Mapping[str, int], bounds: BucketBounds | None = None) -> None:
        if not 0.0 < watermark <= 1.0:
            raise ValueError(f"watermark must be in (0, 1], got {watermark}")
        self.watermark = watermark
        self.bucket_caps = {LengthBucket(key): value for key, value in bucket_caps.items()}
        self.bounds = bounds
        """The buckets' bounds (the engine's window's), to say which bucket a request not yet
        sized would be in (:meth:`bucket_of`); None: not known."""
        self.capacity = capacity
        self.reserved_blocks = 0
        self.inflight: dict[LengthBucket, int] = dict.fromkeys(LengthBucket, 0)

    @classmethod
    def awaiting_engine(cls, block_size: int, *, watermark: float,
                        bucket_caps: Mapping[str, int],
                        bounds: BucketBounds | None = None) -> AdmissionLedger:
        """A ledger before any engine reported its pool: a pool of no blocks, so nothing is
        dispatched until :meth:`set_capacity` adopts the engine's real one (the service answers
        503 before asking while the engine starts). Admission is never sized from a plan."""
        return cls(KvCapacity(num_blocks=0, block_size=block_size), watermark=watermark,
                   bucket_caps=bucket_caps, bounds=bounds)

    def bucket_of(self, reserved_tokens: float) -> LengthBucket | None:
        """The bucket of a request reserving ``reserved_tokens`` (prompt + ``max_tokens``);
        None when the bounds are not known."""
        if self.bounds is None:
            return None
        return classify_bucket(max(1, round(reserved_tokens)), self.bounds)

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
