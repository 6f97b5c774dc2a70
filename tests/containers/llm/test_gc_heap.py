"""The garbage collector in the gateway process (gateway.gc_heap): frozen once an engine has
warmed up, before it serves, so that no collection walks the start's heap again; every pause
timed for the gauge line.

The real collector runs here. A test that freezes unfreezes before it ends: pytest's own heap
must not stay frozen for the tests after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
import weakref
from collections.abc import Iterator
from typing import Any

from gateway.gc_heap import GcPauses, HeapFreeze, ProcessHeap, freeze_heap


class Node:
    """A reference cycle's member (a weakref can see whether it was collected)."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    first, second = Node(), Node()
    first.other, second.other = second, first
    return first, weakref.ref(first)


@contextlib.contextmanager
def unfrozen_after() -> Iterator[None]:
    try:
        yield
    finally:
        gc.unfreeze()


def test_freeze_collects_what_is_garbage_then_later_collections_skip_what_it_froze() -> None:
    with unfrozen_after():
        garbage, garbage_ref = cycle()
        del garbage
        kept, kept_ref = cycle()
        frozen = freeze_heap()
        assert garbage_ref() is None, "garbage before the freeze is collected, not frozen"
        assert frozen.collected >= 2 and frozen.seconds >= 0
        assert gc.get_freeze_count() > 0
        del kept
        gc.collect()
        # What was frozen and dies in a cycle stays until the process unfreezes (the cost
        # docs/gateway.md#garbage-collector measures for an engine rebuild).
        assert kept_ref() is not None
    gc.collect()
    assert kept_ref() is None


def test_a_frozen_heap_is_not_walked_again() -> None:
    """A full collection's pause grows with the objects it walks; once they are frozen it no
    longer does: 200,000 live containers, collected before and after the freeze."""
    with unfrozen_after():
        heap = [[index] for index in range(200_000)]

        def full_collection_s() -> float:
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                gc.collect()
                best = min(best, time.perf_counter() - started)
            return best

        walked = full_collection_s()
        freeze_heap()
        skipped = full_collection_s()
        assert len(heap) == 200_000
    print(f"\nfull collection with 200,000 containers: {walked * 1000:.2f} ms unfrozen, "
          f"{skipped * 1000:.2f} ms frozen")
    assert skipped < walked / 3, (walked, skipped)


def test_pauses_are_timed_by_generation_and_reset_on_take() -> None:
    ticks = iter(range(100))
    pauses = GcPauses(clock=lambda: float(next(ticks)) / 1000)
    pauses.install()
    pauses.install()  # idempotent: one callback
    gc.disable()  # only the two collections below
    try:
        assert gc.callbacks.count(pauses._callback) == 1
        gc.collect(2)
        gc.collect(0)
    finally:
        gc.enable()
        pauses.uninstall()
    assert pauses._callback not in gc.callbacks
    summary = pauses.take()
    # Each collection read the clock at its start and end: 1 ms apiece on this clock.
    assert summary.collections == 2
    assert summary.longest_s == 0.001 and summary.longest_generation == 2
    assert summary.fields() == {"gc_collections": 2, "gc_pause_max_ms": 1.0,
                                "gc_pause_max_generation": 2}
    assert pauses.take().fields() == {"gc_collections": 0, "gc_pause_max_ms": 0.0,
                                      "gc_pause_max_generation": None}


def test_the_gateway_freezes_once_warm_before_healthy_and_reports_pauses(
        make_runtime: Any) -> None:
    """In the app: the freeze is a start phase between the measuring warmup pass and healthy,
    the gauge line carries the pauses since the last line, and a stop unfreezes and stops
    timing."""
    freezes: list[float] = []

    def recording_freeze() -> HeapFreeze:
        freezes.append(time.monotonic())
        return HeapFreeze(collected=7, seconds=0.25)

    heap = ProcessHeap(freeze=recording_freeze)
    runtime, lines = make_runtime(heap=heap, SIM_STEP_TIME_S="0.001")

    async def scenario() -> bool:
        async with runtime.lifecycle.lifespan(runtime.app):
            deadline = time.monotonic() + 60
            while not runtime.lifecycle.warmed_up:
                assert time.monotonic() < deadline, runtime.lifecycle.warmup_progress
                await asyncio.sleep(0.05)
            gc.collect(1)
            runtime.lifecycle.emit_gauges()
            installed = heap.pauses._callback in gc.callbacks
        return installed

    assert asyncio.run(scenario()), "the pauses are timed while the gateway runs"
    assert heap.pauses._callback not in gc.callbacks
    assert len(freezes) == 1
    records = [json.loads(line) for line in lines]
    phases = [record for record in records if record.get("event") == "start_phase"]
    assert [record["phase"] for record in phases][-3:] == ["warmup_measure", "gc_freeze",
                                                           "healthy"]
    assert (phases[-2]["seconds"], phases[-2]["collected"]) == (0.25, 7)
    gauges = [record for record in records if record.get("event") == "gauges"][-1]
    assert gauges["gc_collections"] >= 1 and gauges["gc_pause_max_ms"] >= 0
