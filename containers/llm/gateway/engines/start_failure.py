"""Which engine start failures can heal, and how the gateway sees the engine core's own error.

A start failure that cannot heal ends the start after one attempt (EngineConfigError, exit 2);
one that may heal is retried by the supervisor. What the gateway can see decides which:

* **Importing vLLM** happens in this process: an ``ImportError`` (a module missing from the
  image) and an ``OSError`` from loading a shared library (``libcuda.so.1: cannot open shared
  object file``, an undefined symbol, a wrong ELF class: dlopen's errors, which carry no
  ``errno``) cannot heal — the image or the host's driver is wrong
  (:func:`is_library_load_error`). An ``OSError`` with an ``errno`` (EIO, EMFILE, ...) may heal.
* **The engine core** is vLLM's child process. When it fails during start the parent only gets
  ``RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s):
  {'EngineCore': 1}")`` from ``wait_for_engine_startup``: the handshake carries no error, and the
  child's exit code is 1 for every Python exception. The root cause exists only as the
  traceback Python's ``multiprocessing`` prints on the child's stderr, which it inherits from
  this process. :class:`StderrTail` tees this process's fd 2 through a pipe while vLLM builds
  the engine (the child inherits the pipe), forwarding every byte to the real stderr and
  keeping the last :data:`TAIL_BYTES`; :func:`root_cause` reads the child's exception line out
  of it, and :func:`cannot_heal` classifies that line.

The rule (:data:`RULES`, first match wins; anything else, and a root cause not found, may heal):

* the KV cache cannot hold one ``max_model_len`` request ("To serve at least one request with
  the model's max seq len") or there is no memory left for it at all ("No available memory for
  the cache blocks"): the KV budget is the memory-utilization share of the device less the
  weights and the activation peak, fixed by the settings, the model and the device, so no retry
  changes it;
* a memory amount asked for that is larger than the device or node has **in total** (vLLM's
  "(available/total GiB) ... less than requested memory for kv (N GiB)": an explicit KV space,
  ``VLLM_CPU_KVCACHE_SPACE`` on the CPU build): no other process freeing memory can give it;
* may heal, retried: less **free** memory at start than asked for ("Free memory on device ... is
  less than desired GPU memory utilization", or a requested amount within the total: another
  process held memory and may release it), a CUDA out-of-memory error, a transient I/O error,
  the engine core killed by a signal, anything not recognised.

Residual risk: the root cause is read from text vLLM prints; a vLLM that rewords these messages,
or a ``VLLM_LOGGING_*``/stderr setup that sends the child's traceback elsewhere, makes the
failure unrecognised, and it is retried as before (the safe side: a slower failure, never a
refused start that could have healed). The phrases are pinned against vLLM's source by the
tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpu_budget.engine_args import ENGINE_ARG

ENGINE_CORE_FAILED = "Engine core initialization failed"
"""How vLLM's ``wait_for_engine_startup`` says the engine-core process exited during start."""

CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's own variable for an explicit KV space on the CPU build (GiB)."""

TAIL_BYTES = 64 * 1024
"""How much of the engine core's last stderr output is kept to find its root cause in."""

SETTLE_S = 2.0
"""At most this long to wait, after the start failed, for the child's last bytes to be read."""

LIBRARY_LOAD_MARKERS: tuple[str, ...] = (
    "cannot open shared object file",
    "undefined symbol",
    "wrong elf class",
    "cannot load library",
    "invalid elf header",
    "version `glibc",
)
"""dlopen's own words, as ctypes and the import machinery pass them on in an ``OSError``."""

_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)\b.*")
_MEMORY_ASKED = re.compile(
    r"\((?P<available>[\d.]+)/(?P<total>[\d.]+) GiB\).*less than requested memory for kv "
    r"\((?P<requested>[\d.]+) GiB\)")


@dataclass(frozen=True)
class Rule:
    """One kind of engine-core start failure that cannot heal: a phrase of vLLM's message."""

    phrase: str
    setting: str | None
    why: str


RULES: tuple[Rule, ...] = (
    Rule("To serve at least one request with the model's max seq len",
         ENGINE_ARG["max_model_len"].env,
         "the KV cache the settings leave cannot hold one max_model_len request"),
    Rule("No available memory for the cache blocks", ENGINE_ARG["gpu_memory_utilization"].env,
         "the memory share the settings leave holds no KV cache at all"),
)
"""Failures fixed by the settings, the model and the device (see the module docstring)."""


@dataclass(frozen=True)
class Verdict:
    """A start failure that cannot heal: the setting to change (if one is known) and why."""

    setting: str | None
    why: str


def is_library_load_error(error: BaseException) -> bool:
    """True for an ``OSError`` raised because a shared library does not load (dlopen's errors:
    no ``errno``, or one of dlopen's messages); an ``OSError`` with an errno and none of those
    words (EIO, EMFILE) may heal."""
    if not isinstance(error, OSError):
        return False
    message = str(error).lower()
    return any(marker in message for marker in LIBRARY_LOAD_MARKERS) or (
        error.errno is None and ".so" in message)


def root_cause(output: str) -> str | None:
    """The exception line of the last traceback in ``output`` (``"ValueError: ..."``), or None.

    Python prints a traceback as ``Traceback (most recent call last):``, indented frame lines,
    then the exception's line; a chained exception prints another traceback after it, so the
    last one is the exception that ended the process.
    """
    lines = output.splitlines()
    starts = [index for index, line in enumerate(lines)
              if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        if _EXCEPTION_LINE.match(line):
            return line.strip()
        return None
    return None


def cannot_heal(cause: str | None) -> Verdict | None:
    """The verdict for the engine core's root cause (:func:`root_cause`); None: it may heal."""
    if not cause:
        return None
    for rule in RULES:
        if rule.phrase in cause:
            return Verdict(rule.setting, rule.why)
    asked = _MEMORY_ASKED.search(cause)
    if asked and float(asked["requested"]) > float(asked["total"]):
        return Verdict(CPU_KV_SPACE,
                       f"the KV space asked for ({asked['requested']} GiB) is more than the "
                       f"node has in total ({asked['total']} GiB)")
    return None


class StderrTail:
    """Tees this process's fd 2 through a pipe while active; keeps the last bytes.

    Processes started while it is active (vLLM's engine core) inherit the pipe as their stderr;
    the reader thread forwards what they write for as long as they live, then ends at EOF. One
    process outlives every engine: multiprocessing's resource tracker, started with the first
    engine core (spawn), holds the first start's pipe, so that reader stays for the gateway's
    life (one thread, two descriptors; measured on the CPU build: the core and the tracker both
    write to the pipe, the gateway's own fd 2 is back on its log). A rebuild's tee ends with its
    core: nothing grows per rebuild.
    """

    def __init__(self, max_bytes: int = TAIL_BYTES) -> None:
        self._max_bytes = max_bytes
        self._kept = bytearray()
        self._lock = threading.Condition()
        self._idle_at = 0.0
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Point fd 2 at the pipe (the real stderr keeps every byte, through the reader)."""
        read_end, write_end = os.pipe()
        self._saved = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end, os.dup(self._saved)),
                                        name="engine-stderr-tail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Give fd 2 back to the real stderr (children keep the pipe until they exit)."""
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None

    def text(self, settle_s: float = SETTLE_S) -> str:
        """What was kept, once the reader has caught up (the pipe seen empty after this call,
        or it ended), waiting at most ``settle_s``."""
        asked = time.monotonic()
        with self._lock:
            self._lock.wait_for(lambda: self._idle_at > asked or not self._alive(), settle_s)
            return self._kept.decode("utf-8", "replace")

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _pump(self, read_end: int, forward: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([read_end], [], [], 0.05)
                if not ready:
                    with self._lock:
                        self._idle_at = time.monotonic()
                        self._lock.notify_all()
                    continue
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                _write_all(forward, chunk)
                self._keep(chunk)
        finally:
            os.close(read_end)
            os.close(forward)
            with self._lock:
                self._lock.notify_all()

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            self._kept += chunk
            del self._kept[:-self._max_bytes]


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; a stderr that is gone loses it, nothing else does."""
    view = memoryview(data)
    with contextlib.suppress(OSError):
        while view:
            view = view[os.write(fd, view):]


@contextlib.contextmanager
def capture_stderr() -> Iterator[StderrTail]:
    """A :class:`StderrTail` active for the ``with`` block."""
    tail = StderrTail()
    tail.start()
    try:
        yield tail
    finally:
        tail.stop()
