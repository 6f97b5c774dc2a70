"""Which engine start failures can heal (gateway.engines.start_failure), pinned to vLLM's words."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest

from gateway.engines.start_failure import (
    ENGINE_CORE_FAILED,
    RULES,
    StderrTail,
    Verdict,
    cannot_heal,
    capture_stderr,
    is_library_load_error,
    root_cause,
)
from tests.containers.llm.test_vllm_contract import cpu_build_sources

KV_MAX_LEN = ("ValueError: To serve at least one request with the model's max seq len (131072), "
              "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
              "(9.53 GiB). Based on the available memory, the estimated maximum model length is "
              "78000. Try increasing `gpu_memory_utilization` ...")
CPU_KV_TOO_BIG = ("ValueError: Available memory on node 0 (21.87/23.43 GiB) on kv cache allocation "
                  "is less than requested memory for kv (100000.00 GiB). Decrease "
                  "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by "
                  "other processes.")
CPU_KV_NOT_FREE = CPU_KV_TOO_BIG.replace("100000.00", "23.00")
GPU_NOT_FREE = ("ValueError: Free memory on device cuda:0 (10.2/22.1 GiB) on startup is less than "
                "desired GPU memory utilization (0.9, 19.9 GiB). Decrease GPU memory utilization "
                "or reduce GPU memory used by other processes.")
CHILD_STDERR = f"""(EngineCore pid=42) ERROR EngineCore failed to start.
Process EngineCore:
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
  File ".../vllm/v1/worker/cpu_worker.py", line 218, in determine_available_memory
    raise ValueError(
{CPU_KV_TOO_BIG}
"""


def test_the_root_cause_is_the_last_tracebacks_exception_line() -> None:
    chained = ("Traceback (most recent call last):\n  File \"x\", line 1\nKeyError: 'a'\n\n"
               "The above exception was the direct cause of the following exception:\n\n"
               + CHILD_STDERR + "(APIServer pid=1) INFO shutting down\n")
    assert root_cause(CHILD_STDERR) == CPU_KV_TOO_BIG
    assert root_cause(chained) == CPU_KV_TOO_BIG
    assert root_cause("INFO nothing went wrong\n") is None
    assert root_cause("Traceback (most recent call last):\n  File \"x\", line 1\n") is None


@pytest.mark.parametrize(("cause", "expected"), [
    (KV_MAX_LEN, "ENGINE_MAX_MODEL_LEN"),
    ("ValueError: No available memory for the cache blocks. Try increasing ...",
     "ENGINE_GPU_MEMORY_UTILIZATION"),
    (CPU_KV_TOO_BIG, "VLLM_CPU_KVCACHE_SPACE"),
])
def test_a_configuration_no_retry_changes_cannot_heal(cause: str, expected: str) -> None:
    verdict = cannot_heal(cause)
    assert isinstance(verdict, Verdict)
    assert verdict.setting == expected


@pytest.mark.parametrize("cause", [
    GPU_NOT_FREE,  # another process held the GPU's memory at start
    CPU_KV_NOT_FREE,  # within the node's total: other processes may free it
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "OSError: [Errno 5] Input/output error",
    "RuntimeError: something vLLM has not said before",
    None,  # no root cause found: retried, as before
])
def test_what_may_heal_is_left_to_the_retries(cause: str | None) -> None:
    assert cannot_heal(cause) is None


@pytest.mark.parametrize(("error", "expected"), [
    (OSError("libcuda.so.1: cannot open shared object file: No such file or directory"), True),
    (OSError("/opt/x/_C.abi3.so: undefined symbol: _ZN3c10"), True),
    (OSError("libnccl.so.2: wrong ELF class: ELFCLASS32"), True),
    (OSError(5, "Input/output error"), False),
    (OSError(24, "Too many open files"), False),
    (ValueError("libcuda.so.1: cannot open shared object file"), False),
])
def test_a_shared_library_that_does_not_load_is_told_from_a_passing_os_error(
        error: BaseException, expected: bool) -> None:
    assert is_library_load_error(error) is expected


PHRASES = (*(rule.phrase for rule in RULES), "less than requested memory for kv",
           ENGINE_CORE_FAILED)
"""What the rule reads in vLLM's messages (each on one source line where vLLM raises it)."""


@pytest.mark.parametrize("build", ["0.33.0 (image, CUDA)", "0.32.0 (test tier, CPU)"])
def test_the_phrases_the_rule_reads_are_vllms_own(build: str,
                                                   request: pytest.FixtureRequest) -> None:
    """Each phrase is in vLLM's v1 engine source, in both builds (a rewording fails here)."""
    if build.startswith("0.33"):
        wheel: Path = request.getfixturevalue("vllm_wheel")
        with zipfile.ZipFile(wheel) as archive:
            text = "\n".join(archive.read(name).decode() for name in archive.namelist()
                             if name.startswith("vllm/v1/") and name.endswith(".py"))
    else:
        root = cpu_build_sources()
        if root is None:
            pytest.skip("vllm-cpu is not installed in .venv-vllm (make test builds it)")
        text = "\n".join(path.read_text(encoding="utf-8")
                         for path in (root / "vllm" / "v1").rglob("*.py"))
    for phrase in PHRASES:
        assert phrase in text, (build, phrase)


def test_the_tail_forwards_stderr_and_keeps_what_a_child_wrote(
        capfd: pytest.CaptureFixture[str]) -> None:
    import subprocess

    with capture_stderr() as tail:
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from the child\\n')"],
                       check=True)
        os.write(2, b"from the parent\n")
        kept = tail.text()
    assert "from the child\n" in kept
    assert "from the parent\n" in kept
    assert "from the child" in capfd.readouterr().err


def test_the_tail_keeps_only_the_last_bytes() -> None:
    tail = StderrTail(max_bytes=10)
    tail.start()
    try:
        for _ in range(50):
            os.write(2, b"0123456789")
        os.write(2, b"last")
        kept = tail.text()
    finally:
        tail.stop()
    assert kept.endswith("last")
    assert len(kept) <= 20
