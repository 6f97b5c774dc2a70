"""The cyclic garbage collector in a process that holds vLLM, torch and transformers.

The gateway process tracks about 620,000 objects once the engine has started — nearly all of
them modules, classes and functions that live as long as the process. CPython's oldest-generation
collection walks every one of them: 240-310 ms on this repository's CPU machine, during which the
event loop answers nothing (/ping, streams, refusals). It comes when the objects promoted since
the last one reach a quarter of the old generation, so an engine rebuild's allocations set one
off while the rebuilt engine warms up (a 361 ms /ping in a CI run).

:func:`freeze_heap` does what vLLM's own server does after its start (``freeze_gc_heap``):
collect once, then move every surviving object to the permanent generation, which collections
skip. The gateway calls it once an engine has warmed up and before it serves
(:mod:`gateway.lifecycle`); later collections walk only what was allocated since. A rebuilt
engine's warmup freezes again. What a dead engine left in reference cycles and had been frozen
stays allocated (``gc.unfreeze`` would bring the 300 ms walk back): measured in docs/gateway.md.

:class:`GcPauses` times every collection (``gc.callbacks``) so that the gauge line says how long
the longest pause since the last line was. No I/O here.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HeapFreeze:
    """What :func:`freeze_heap` did."""

    collected: int
    """Unreachable objects the collection before the freeze freed."""
    seconds: float
    """How long the collection and the freeze took (the event loop's pause)."""


def freeze_heap(clock: Callable[[], float] = time.perf_counter) -> HeapFreeze:
    """Collect every generation, then freeze what survives (see the module docstring).

    Young generations first, so that objects still in them reach the oldest before the freeze,
    as vLLM's ``freeze_gc_heap`` does. It does not count what it froze: ``gc.get_freeze_count``
    walks the whole permanent generation, 50-100 ms of pause on the gateway's heap."""
    started = clock()
    collected = gc.collect(0) + gc.collect(1) + gc.collect(2)
    gc.freeze()
    return HeapFreeze(collected=collected, seconds=clock() - started)


@dataclass(frozen=True)
class PauseSummary:
    """Collections since the last :meth:`GcPauses.take`."""

    collections: int
    longest_s: float
    longest_generation: int | None
    """The generation the longest pause collected (None: no collection)."""

    def fields(self) -> dict[str, Any]:
        """The gauge line's fields."""
        return {"gc_collections": self.collections,
                "gc_pause_max_ms": round(self.longest_s * 1000, 1),
                "gc_pause_max_generation": self.longest_generation}


class GcPauses:
    """Times each collection of the cyclic collector through ``gc.callbacks``.

    The callback runs on the thread that collects, inside the pause: it records two clock
    readings and a comparison, nothing else."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self._collections = 0
        self._longest_s = 0.0
        self._longest_generation: int | None = None

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing collections."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        pause = self._clock() - self._started
        self._started = None
        self._collections += 1
        if pause > self._longest_s:
            self._longest_s, self._longest_generation = pause, info.get("generation")

    def take(self) -> PauseSummary:
        """The collections since the last call, and start counting again."""
        summary = PauseSummary(self._collections, self._longest_s, self._longest_generation)
        self._collections, self._longest_s, self._longest_generation = 0, 0.0, None
        return summary


class ProcessHeap:
    """The process's collector, as the gateway's lifecycle uses it: ``freeze`` once an engine
    has warmed up (:func:`freeze_heap`), ``pauses`` for the gauge line. One per process —
    ``gateway.main`` builds it; an app built without one (in-process tests) leaves the
    collector alone."""

    def __init__(self, freeze: Callable[[], HeapFreeze] = freeze_heap,
                 pauses: GcPauses | None = None) -> None:
        self.freeze = freeze
        self.pauses = pauses or GcPauses()

    def start(self) -> None:
        """Begin timing collections."""
        self.pauses.install()

    def stop(self) -> None:
        """Stop timing collections and unfreeze: what was frozen is collected and finalized
        at the interpreter's exit like the rest (frozen, extension types report it as leaked)."""
        self.pauses.uninstall()
        gc.unfreeze()
