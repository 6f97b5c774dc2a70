"""Start-up errors that cannot heal end the start after one attempt, within 15 s, with exit code 2
and one line naming the setting, its value and what is accepted: a model that cannot serve the
settings, vLLM that cannot be imported (a module missing, a shared library that does not load), a
configuration vLLM's engine core refuses. An error that may heal is retried (with /ping saying what
the last attempt died of): tests/containers/llm/test_supervisor.py and test_vllm_adapter.py."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.containers.llm.engine.conftest import Servers
from tests.support.cpu_engine import EngineConfig, Served, ServerProcess

pytestmark = pytest.mark.engine

FAIL_FAST_S = 15.0
"""A failure that cannot heal ends the process within this (issue 38)."""
KV_REFUSAL = "less than requested memory for kv"
"""vLLM's CPU worker refusing an explicit KV space larger than the node's memory."""
LIBCUDA_ERROR = "libcuda.so.1: cannot open shared object file: No such file or directory"


def serve_lines(server: ServerProcess) -> list[str]:
    """The gateway's own error lines on stderr (vLLM logs there too)."""
    text = server.stderr_path.read_text(encoding="utf-8", errors="replace")
    return [line for line in text.splitlines() if line.startswith("serve: ")]


def wait_exit(server: ServerProcess, timeout_s: float) -> tuple[int, float]:
    started = time.monotonic()
    code = server.process.wait(timeout=timeout_s)
    return code, time.monotonic() - started


def without_weights(served: Served, root: Path) -> Served:
    """The same model directory, its weight file missing (a half-finished upload)."""
    copy = root / "no-weights"
    copy.mkdir()
    for entry in served.model_dir.iterdir():
        if entry.name != "model.safetensors":
            os.symlink(entry, copy / entry.name)
    return Served(model_dir=copy, adapters=served.adapters)


@pytest.mark.parametrize(("case", "expected"), [
    ("max_model_len", "serve: ENGINE_MAX_MODEL_LEN=2048: above the model's position limit of "
                      "1024 tokens"),
    ("no_weights", "serve: GATEWAY_MODEL_DIR="),
])
def test_a_model_that_cannot_serve_the_settings_stops_at_once(
        servers: Servers, served: Served, tmp_path: Path, case: str, expected: str) -> None:
    if case == "max_model_len":
        server = servers.gateway(EngineConfig(max_model_len=2048))
    else:
        server = servers.gateway(served=without_weights(served, tmp_path))
    code, _ = wait_exit(server, timeout_s=120)
    (line,) = serve_lines(server)
    assert code == 2
    assert line.startswith(expected), line
    if case == "no_weights":
        assert "no weight files there" in line


def test_a_block_size_the_cpu_backend_cannot_use_fails_after_one_attempt(
        servers: Servers) -> None:
    server = servers.gateway(EngineConfig(block_size=16))
    code, _ = wait_exit(server, timeout_s=240)
    (line,) = serve_lines(server)
    assert code == 2
    assert line == ("serve: ENGINE_BLOCK_SIZE=16: the cpu attention backend needs a multiple of "
                    "32; accepted: 32, 64, 128")
    assert len(server.events("engine_config_refused")) == 1
    assert not server.events("engine_start_failed"), "a configuration error is never retried"


def test_the_cpu_backends_block_sizes_are_the_adapters(vllm_python: Path) -> None:
    """BLOCK_SIZE_MULTIPLE["cpu"] is what the installed vLLM CPU build declares."""
    import subprocess

    from gateway.engines.vllm import BLOCK_SIZE_MULTIPLE

    code = ("from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as B;"
            "print([getattr(s, 'base', s) for s in B.get_supported_kernel_block_sizes()])")
    result = subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == f"[{BLOCK_SIZE_MULTIPLE['cpu']}]"


@pytest.mark.budget(reason="one real engine-core start that fails after vLLM's import in the gateway and again in the core (37 s on the quiet 2-core machine)")
def test_a_kv_space_larger_than_the_machine_fails_after_one_attempt(servers: Servers) -> None:
    """A KV pool larger than the machine's memory fails inside vLLM's engine-core process; the
    gateway reads the core's root cause from its stderr (it asked for more than the node has in
    total: no retry can change that), so it is a configuration error: exit 2 after one attempt,
    within 15 s of the engine core's own failure (its traceback on stderr)."""
    server = servers.gateway(GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS="3",
                             GATEWAY_ENGINE_RESTART_BACKOFF_S="3",
                             VLLM_CPU_KVCACHE_SPACE="100000")
    core_failed: float | None = None
    deadline = time.monotonic() + 300
    while server.process.poll() is None and time.monotonic() < deadline:
        if core_failed is None and KV_REFUSAL in server.stderr_path.read_text(errors="replace"):
            core_failed = time.monotonic()
        time.sleep(0.1)
    exited = time.monotonic()
    assert server.process.wait(timeout=60) == 2
    assert core_failed is not None, server.stderr_path.read_text(errors="replace")[-3000:]
    (line,) = serve_lines(server)
    assert line.startswith("serve: VLLM_CPU_KVCACHE_SPACE=100000: vLLM's engine core refused the "
                           "settings: the KV space asked for (100000.0 GiB) is more than the "
                           "node has in total ("), line
    assert "Available memory on node 0 (" in line, line
    assert len(server.events("engine_config_refused")) == 1
    assert not server.events("engine_start_failed"), "a configuration error is never retried"
    print(f"engine core failed -> gateway exited: {exited - core_failed:.2f} s")
    assert exited - core_failed < FAIL_FAST_S, exited - core_failed


def test_a_shared_library_that_does_not_load_stops_the_start_within_seconds(
        servers: Servers, tmp_path: Path) -> None:
    """A ``vllm`` whose import cannot load libcuda (a GPU image on a host without the driver):
    the image cannot heal, so exit 2 after one attempt, naming the library."""
    stub = tmp_path / "stub" / "vllm"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise OSError({LIBCUDA_ERROR!r})\n", encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")]))
    started = time.monotonic()
    server = servers.gateway(PYTHONPATH=path)
    code, _ = wait_exit(server, timeout_s=120)
    elapsed = time.monotonic() - started
    (line,) = serve_lines(server)
    assert code == 2
    assert line == f"serve: vLLM cannot be imported in this image: OSError: {LIBCUDA_ERROR}", line
    assert not server.events("engine_start_failed"), "a library that does not load is never retried"
    print(f"libcuda stub: process start -> exit: {elapsed:.2f} s")
    assert elapsed < FAIL_FAST_S, elapsed


def test_an_engine_that_cannot_be_imported_stops_the_start_within_seconds(
        servers: Servers) -> None:
    """The gateway under an interpreter without vLLM (the project's own venv): an import error
    cannot heal, so it is a configuration error: exit 2 after one attempt, naming it."""
    started = time.monotonic()
    server = servers.gateway(python=Path(sys.executable))
    code, _ = wait_exit(server, timeout_s=120)
    elapsed = time.monotonic() - started
    (line,) = serve_lines(server)
    assert code == 2
    assert line.startswith("serve: vLLM cannot be imported in this image: ModuleNotFoundError: "
                           "No module named 'vllm'"), line
    assert not server.events("engine_start_failed"), "an import error is never retried"
    print(f"no vllm module: process start -> exit: {elapsed:.2f} s")
    assert elapsed < FAIL_FAST_S, elapsed
