"""Fixtures for the LLM gateway: a demo tokenizer trained once per session, and the real `serve`
executable on the simulated engine, listening on a real socket (stdout captured for EMF)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.app import GatewayRuntime
from gateway.gc_heap import ProcessHeap
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer
from tests.containers.llm.harness import GatewayProcess, make_settings
from tests.support.demo_model import write_model_dir
from tests.support.run_shared import exclusive
from tests.support.sim_engine import SimSettings, from_settings


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with a byte-level BPE trained on the manga corpus (no downloads)."""
    return write_model_dir(tmp_path_factory.mktemp("demo-model"))


@pytest.fixture(scope="session")
def chat_tokenizer(demo_model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer.from_model_dir(demo_model_dir)


@pytest.fixture(scope="session")
def start_gateway(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Any]:
    """Factory: start a gateway with extra env; every one started is stopped at session end."""
    started: list[GatewayProcess] = []
    log_dir = tmp_path_factory.mktemp("gateway-logs")

    def start(env: Mapping[str, str] | None = None, **kwargs: Any) -> GatewayProcess:
        gateway = GatewayProcess(demo_model_dir, log_dir, env, **kwargs)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="session")
def gateway(start_gateway: Any) -> GatewayProcess:
    """The shared gateway (defaults, zero-latency sim) used by the HTTP contract tests."""
    process: GatewayProcess = start_gateway({"SIM_EOS_PROBABILITY": "0.05"})
    process.wait_ready()
    return process


@pytest.fixture
def make_runtime(demo_model_dir: Path, chat_tokenizer: ChatTokenizer) -> Any:
    """Factory: an in-process GatewayRuntime (not started) whose log lines land in a list."""

    def build(*, heap: ProcessHeap | None = None, **env: str
              ) -> tuple[GatewayRuntime, list[str]]:
        # SIM_* are the simulator's own knobs; the rest are the gateway's settings.
        sim = SimSettings.from_environ(env)
        settings = make_settings(demo_model_dir, **{key: value for key, value in env.items()
                                                    if not key.startswith("SIM_")})
        lines: list[str] = []
        runtime = GatewayRuntime(
            settings, tokenizer=chat_tokenizer,
            engine_factory=lambda: from_settings(settings, sim),
            telemetry=Telemetry(endpoint_name="test", variant_name="AllTraffic",
                                sink=lines.append),
            heap=heap,
        )
        return runtime, lines

    return build


VLLM_VERSION = "0.33.0"
WHEEL_CACHE = Path(__file__).resolve().parents[3] / ".cache" / "wheels"


@pytest.fixture(scope="session")
def vllm_wheel() -> Path:
    """The exact vLLM wheel the image installs (``pip download --no-deps``, cached): read, never
    imported — it is a CUDA 13 build."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    with exclusive(WHEEL_CACHE / ".download.lock"):  # one download, whichever worker asks first
        wheels = sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if not wheels:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", f"vllm=={VLLM_VERSION}", "--no-deps",
                 "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--quiet",
                 "-d", str(WHEEL_CACHE)],
                check=True,
            )
            wheels = sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    assert wheels, f"pip download left no vllm {VLLM_VERSION} wheel in {WHEEL_CACHE}"
    return wheels[0]
