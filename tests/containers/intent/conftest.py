"""Fixtures for the intent server: a tiny random DistilBERT compiled for cpu, unpacked the way
SageMaker unpacks model.tar.gz, and the real `serve` executable listening on a real socket."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.network import free_port, wait_until_ok

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVE = REPO_ROOT / "containers" / "intent" / "serve"


def wait_until_ready(base_url: str, timeout_s: float = 60.0,
                     process: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """/ping's body once the server answers 200."""

    def exited() -> str | None:
        if process is None or process.poll() is None:
            return None
        return f"server exited with {process.returncode} before ready"

    response = wait_until_ok(f"{base_url}/ping", timeout_s=timeout_s, exited=exited)
    return dict(response.json())


@dataclass(frozen=True)
class CompiledModel:
    out_dir: Path
    model_dir: Path
    """model.tar.gz unpacked, as SageMaker does into /opt/ml/model."""


@pytest.fixture(scope="session")
def compiled_model(tmp_path_factory: pytest.TempPathFactory) -> CompiledModel:
    """Build a random tiny DistilBERT, compile it for cpu (batch sizes 1 and 4), unpack it."""
    from neuron import compile as compile_cli
    from neuron.model_archive import safe_extract
    from neuron.random_model import build_random_distilbert

    source = build_random_distilbert(tmp_path_factory.mktemp("intent-source"), size="tiny")
    out = tmp_path_factory.mktemp("intent-compiled")
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(source), "--out", str(out),
                             "--batch-sizes", "1,4", "--latency-iterations", "5",
                             "--latency-warmup", "2"])
    assert code == 0
    model_dir = tmp_path_factory.mktemp("opt-ml-model")
    safe_extract(out / "model.tar.gz", model_dir)
    return CompiledModel(out_dir=out, model_dir=model_dir)


def server_env(model_dir: Path, port: int, **extra: str) -> dict[str, str]:
    return {**os.environ,
            "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'containers' / 'intent'}",
            "INTENT_MODEL_DIR": str(model_dir), "SAGEMAKER_BIND_TO_PORT": str(port),
            "INTENT_TARGET": "cpu", "INTENT_WARMUP_CALLS": "2",
            "TOKENIZERS_PARALLELISM": "false", **extra}


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    def emf_lines(self) -> list[str]:
        return [line for line in self.stdout_path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def served(compiled_model: CompiledModel, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    """`containers/intent/serve serve` as SageMaker starts it, on a free port."""
    port = free_port()
    logs = tmp_path_factory.mktemp("serve-logs")
    env = server_env(compiled_model.model_dir, port,
                     INTENT_METRICS_ENDPOINT_NAME="intent-test",
                     INTENT_METRICS_VARIANT_NAME="AllTraffic")
    with (logs / "stdout").open("wb") as out, (logs / "stderr").open("wb") as err:
        process = subprocess.Popen([sys.executable, str(SERVE), "serve"], cwd=REPO_ROOT,
                                   env=env, stdout=out, stderr=err)
    server = RunningServer(f"http://127.0.0.1:{port}", process, logs / "stdout",
                           logs / "stderr")
    try:
        wait_until_ready(server.base_url, process=process)
        yield server
    except AssertionError:
        raise AssertionError((logs / "stderr").read_text()[-4000:]) from None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def app_on_socket(app: Any) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread on a real socket; yield its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
