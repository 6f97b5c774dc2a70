"""NeuronCores → model copies, the order to load them in, and the pool requests draw from.

On inf1 a process owns the NeuronCores it is given and ``torch.jit.load`` places each loaded
Neuron model on the least-used of them (Neuron's "default placement", the recommended one for
non-pipelined models: Developer Guide, torch-neuron Core Placement). So one copy of the model per
core is simply one ``torch.jit.load`` per core, in the right order; a model compiled with
NeuronCore Pipeline over P cores takes P cores per copy. Which cores the process may use comes,
in order, from:

1. ``NEURON_RT_VISIBLE_CORES`` ("0-3", "0,2", "1-2,5"): exactly those cores;
2. ``NEURON_RT_NUM_CORES``: that many cores;
3. otherwise every core of every /dev/neuronN device (4 per Inferentia 1 chip, 2 per Inferentia 2)
   -- and then the server sets ``NEURON_RT_NUM_CORES`` to what it uses before the runtime starts.

``INTENT_MODEL_COPIES`` may ask for fewer copies than fit (never more). On cpu there is one copy.

Pure module (environment and device count in, a plan out), Python 3.10-compatible.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from neuron.targets import CompileTarget, profile


class PlacementError(ValueError):
    """The NeuronCores available cannot hold the requested model copies."""


@dataclass(frozen=True)
class CorePlan:
    """How many model copies to load, and the runtime environment that makes it so."""

    copies: int
    cores_available: int
    pipeline_cores: int
    env_updates: Mapping[str, str] = field(default_factory=dict)
    """Variables to set before the Neuron runtime initializes (before the first jit.load)."""
    reason: str = ""


def parse_visible_cores(value: str) -> list[int]:
    """``"0-3"`` → [0, 1, 2, 3]; ``"0,2"`` → [0, 2]; ``"1-2,5"`` → [1, 2, 5]."""
    cores: set[int] = set()
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            start = int(low)
            end = int(high) if sep else start
        except ValueError:
            raise PlacementError(f"NEURON_RT_VISIBLE_CORES={value!r}: {part!r} is not a core "
                                 "index or range (accepted: '0-3', '0,2', '1-2,5')") from None
        if start < 0 or end < start:
            raise PlacementError(f"NEURON_RT_VISIBLE_CORES={value!r}: bad range {part!r}")
        cores.update(range(start, end + 1))
    if not cores:
        raise PlacementError(f"NEURON_RT_VISIBLE_CORES={value!r} names no core")
    return sorted(cores)


def plan_cores(target: CompileTarget, env: Mapping[str, str], *, device_count: int,
               pipeline_cores: int, requested_copies: int | None) -> CorePlan:
    """Decide the number of model copies for ``target`` on this host."""
    if pipeline_cores < 1:
        raise PlacementError(f"pipeline_cores: {pipeline_cores!r} must be at least 1")
    if requested_copies is not None and requested_copies < 1:
        raise PlacementError(f"INTENT_MODEL_COPIES={requested_copies}: must be at least 1")
    if target is CompileTarget.CPU:
        copies = requested_copies or 1
        return CorePlan(copies=copies, cores_available=0, pipeline_cores=1,
                        reason=f"cpu: {copies} copy(ies) of the TorchScript model")

    env_updates: dict[str, str] = {}
    visible = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    num = env.get("NEURON_RT_NUM_CORES", "").strip()
    if visible:
        cores = len(parse_visible_cores(visible))
        source = f"NEURON_RT_VISIBLE_CORES={visible}"
    elif num:
        try:
            cores = int(num)
        except ValueError:
            raise PlacementError(f"NEURON_RT_NUM_CORES={num!r} is not an integer") from None
        if cores < 1:
            raise PlacementError(f"NEURON_RT_NUM_CORES={cores}: must be at least 1")
        source = f"NEURON_RT_NUM_CORES={cores}"
    else:
        per_device = profile(target).neuron_cores_per_device
        cores = device_count * per_device
        if cores == 0:
            raise PlacementError(
                f"{target.value}: no NeuronCore visible (no /dev/neuron* device). On SageMaker "
                f"use an ml.{target.value}.* instance; locally run the container with "
                "--device=/dev/neuron0")
        source = f"{device_count} device(s) × {per_device} cores"

    capacity = cores // pipeline_cores
    if capacity < 1:
        raise PlacementError(f"{source}: {cores} NeuronCore(s) cannot hold one copy of a model "
                             f"pipelined over {pipeline_cores} cores")
    if requested_copies is not None and requested_copies > capacity:
        raise PlacementError(f"INTENT_MODEL_COPIES={requested_copies}: {source} gives {cores} "
                             f"NeuronCore(s), room for at most {capacity} copy(ies) of a model "
                             f"over {pipeline_cores} core(s)")
    copies = requested_copies or capacity
    if not visible and not num:
        env_updates["NEURON_RT_NUM_CORES"] = str(copies * pipeline_cores)
    return CorePlan(copies=copies, cores_available=cores, pipeline_cores=pipeline_cores,
                    env_updates=env_updates,
                    reason=f"{source}: {copies} copy(ies) × {pipeline_cores} core(s)")


def load_order(batch_sizes: Sequence[int], copies: int) -> list[tuple[int, int]]:
    """(copy, batch size) in the order to ``torch.jit.load`` them.

    Default placement puts each load on the least-used NeuronCore, so loading every copy of the
    first batch size, then every copy of the next, lands copy i's models all on core i.
    """
    if copies < 1:
        raise ValueError(f"copies: {copies!r} must be at least 1")
    return [(copy, size) for size in batch_sizes for copy in range(copies)]


T = TypeVar("T")


class ReplicaTimeout(RuntimeError):
    """No model copy became free in time."""


class ReplicaPool(Generic[T]):
    """Thread-safe checkout of model copies: one request thread per copy at a time."""

    def __init__(self, replicas: Sequence[T]) -> None:
        if not replicas:
            raise ValueError("ReplicaPool: no replicas")
        self._free: queue.Queue[T] = queue.Queue()
        for replica in replicas:
            self._free.put(replica)
        self.size = len(replicas)
        self._busy = 0
        self._lock = threading.Lock()

    @property
    def busy(self) -> int:
        """Copies checked out right now."""
        with self._lock:
            return self._busy

    @contextmanager
    def checkout(self, timeout_s: float) -> Iterator[T]:
        """Borrow a free copy for the duration of the block; ReplicaTimeout after timeout_s."""
        try:
            replica = self._free.get(timeout=timeout_s)
        except queue.Empty:
            raise ReplicaTimeout(f"all {self.size} model copies stayed busy for "
                                 f"{timeout_s:g} s") from None
        with self._lock:
            self._busy += 1
        try:
            yield replica
        finally:
            with self._lock:
                self._busy -= 1
            self._free.put(replica)
