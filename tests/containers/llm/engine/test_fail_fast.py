"""Start-up errors that cannot heal end the start after one attempt, with exit code 2 and one line
naming the setting, its value and what is accepted; an error that may heal is retried, and while
it is, /ping says what the last attempt died of."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.containers.llm.engine.conftest import Servers
from tests.support.cpu_engine import EngineConfig, Served, ServerProcess

pytestmark = pytest.mark.engine


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


@pytest.mark.budget(reason="the retry it tests: two real engine-core starts, each failing after vLLM's import, 3 s apart (50 s on the quiet machine)")
def test_a_retried_start_shows_the_last_error_in_ping_then_gives_up(servers: Servers) -> None:
    """A KV pool larger than the machine's memory fails inside vLLM's engine core: the gateway
    cannot tell that from a passing fault, so it retries, says why on /ping, and exits 3 after
    its bounded attempts."""
    server = servers.gateway(GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS="2",
                             GATEWAY_ENGINE_RESTART_BACKOFF_S="3",
                             VLLM_CPU_KVCACHE_SPACE="100000")
    reasons: list[str] = []
    deadline = time.monotonic() + 300
    while server.process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            reasons.append(httpx.get(f"{server.url}/ping", timeout=2.0).json()["reason"])
        time.sleep(0.2)
    retrying = [reason for reason in reasons if "retrying after attempt 1/2 failed" in reason]
    assert retrying, sorted(set(reasons))
    assert "Engine core initialization failed" in retrying[0]
    assert server.process.wait(timeout=60) == 3
    (line,) = serve_lines(server)
    assert line.startswith("serve: engine start failed 2 times; last error:")


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
    assert elapsed < 30, elapsed
