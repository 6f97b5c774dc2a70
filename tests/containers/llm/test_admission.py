"""KV-aware admission: block rounding, buckets, watermark, caps, bounded waits."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import (
    AdmissionController,
    AdmissionLedger,
    AdmissionRejected,
    LengthBucket,
    RefusalReason,
    blocks_for_tokens,
    classify_bucket,
)
from gateway.engines.base import KvCapacity
from request_buckets import bucket_bounds

BOUNDS = bucket_bounds(4096)  # S ≤ 512, M ≤ 1,024, L ≤ 2,048
CAPS = {"S": 4, "M": 3, "L": 2, "XL": 1}


def ledger(blocks: int = 100, watermark: float = 0.9) -> AdmissionLedger:
    return AdmissionLedger(KvCapacity(blocks, 16), watermark=watermark, bucket_caps=CAPS)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (16, 1), (17, 2), (4096, 256)])
def test_reservations_round_up_to_whole_blocks(tokens: int, blocks: int) -> None:
    assert blocks_for_tokens(tokens, 16) == blocks


@pytest.mark.parametrize(("tokens", "bucket"), [(1, "S"), (512, "S"), (513, "M"), (1024, "M"),
                                                (2048, "L"), (2049, "XL"), (10**6, "XL")])
def test_buckets_by_reserved_tokens(tokens: int, bucket: str) -> None:
    assert classify_bucket(tokens, BOUNDS) is LengthBucket(bucket)


def test_watermark_limits_reserved_blocks() -> None:
    book = ledger(blocks=100, watermark=0.9)  # 90 blocks may be reserved
    assert book.limit_blocks == 90
    first = book.reserve(LengthBucket.L, 60 * 16)
    assert book.refusal(LengthBucket.L, 31 * 16) is RefusalReason.KV_WATERMARK
    assert book.refusal(LengthBucket.L, 30 * 16) is None
    book.release(first)
    assert book.reserved_blocks == 0
    assert book.total_inflight == 0


def test_bucket_caps_are_per_bucket() -> None:
    book = ledger(blocks=10_000)
    for _ in range(CAPS["XL"]):
        book.reserve(LengthBucket.XL, 3000)
    assert book.refusal(LengthBucket.XL, 3000) is RefusalReason.BUCKET_CAP
    assert book.refusal(LengthBucket.S, 100) is None  # XL traffic cannot starve short requests


def test_probe_limit_and_never_fits() -> None:
    book = ledger(blocks=100)
    book.reserve(LengthBucket.S, 100)
    assert book.refusal(LengthBucket.S, 100, max_total_inflight=1) is RefusalReason.PROBE_LIMIT
    assert book.refusal(LengthBucket.XL, 91 * 16) is RefusalReason.NEVER_FITS
    with pytest.raises(ValueError, match="never_fits"):
        book.reserve(LengthBucket.XL, 91 * 16)


def test_capacity_comes_from_the_engine_and_can_change() -> None:
    book = ledger(blocks=1)
    book.set_capacity(KvCapacity(2048, 16))
    assert book.limit_blocks == 1843
    assert book.blocks_for(4096) == 256


def test_waiter_is_admitted_when_room_frees() -> None:
    async def scenario() -> float:
        controller = AdmissionController(ledger(blocks=100))
        held = await controller.acquire(LengthBucket.L, 80 * 16, wait_s=0.1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, controller.release, held)
        started = loop.time()
        second = await controller.acquire(LengthBucket.L, 80 * 16, wait_s=2.0)
        controller.release(second)
        return loop.time() - started

    waited = asyncio.run(scenario())
    assert 0.04 <= waited < 1.0


def test_waiter_is_shed_after_the_wait() -> None:
    async def scenario() -> AdmissionRejected:
        controller = AdmissionController(ledger(blocks=100))
        await controller.acquire(LengthBucket.L, 80 * 16, wait_s=0.1)
        with pytest.raises(AdmissionRejected) as caught:
            await controller.acquire(LengthBucket.L, 80 * 16, wait_s=0.1)
        assert controller.waiting == 0
        return caught.value

    rejected = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.KV_WATERMARK
    assert rejected.bucket is LengthBucket.L
    assert rejected.waited_s >= 0.09


def test_many_waiters_all_complete_without_leaks() -> None:
    async def scenario() -> AdmissionController:
        controller = AdmissionController(ledger(blocks=64, watermark=1.0))

        async def one(tokens: int) -> None:
            reservation = await controller.acquire(
                LengthBucket.S if tokens <= 512 else LengthBucket.M, tokens, wait_s=5.0)
            await asyncio.sleep(0.001)
            controller.release(reservation)

        await asyncio.gather(*(one(100 + (i * 37) % 900) for i in range(200)))
        return controller

    controller = asyncio.run(scenario())
    assert controller.ledger.reserved_blocks == 0
    assert controller.ledger.total_inflight == 0
