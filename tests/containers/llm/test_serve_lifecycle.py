"""`serve` as SageMaker runs it: port selection, one-line start-up errors, /ping while the
engine starts, SIGTERM draining, the KV capacity check and a crash loop turning /ping red."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.containers.llm.harness import SERVE, GatewayProcess
from tests.support.network import free_port


def load_serve() -> ModuleType:
    """The module behind containers/llm/serve."""
    import gateway.main

    return gateway.main


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        (None, {}, 8080),
        (None, {"PORT": "9001"}, 9001),
        (None, {"SAGEMAKER_BIND_TO_PORT": "9002", "PORT": "9001"}, 9002),
        (9003, {"SAGEMAKER_BIND_TO_PORT": "9002"}, 9003),
    ],
)
def test_port_resolution(cli: int | None, env: dict[str, str], expected: int) -> None:
    assert load_serve().resolve_port(cli, env) == expected


def test_bad_port_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"SAGEMAKER_BIND_TO_PORT='http': expected a TCP port"):
        load_serve().resolve_port(None, {"SAGEMAKER_BIND_TO_PORT": "http"})


def run_serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SERVE), *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "extra_env", "fragment"),
    [
        (["--engine", "sim"], {"GATEWAY_ADMISSION_WATERMARK": "2"},
         "serve: invalid settings: GATEWAY_ADMISSION_WATERMARK='2': expected a number in (0, 1]"),
        (["--engine", "tgi"], {},
         "serve: --engine 'tgi' is not available in this build; available: sim"),
        (["--engine", "sim"], {"GATEWAY_MODEL_DIR": "/nonexistent/model"},
         "serve: GATEWAY_MODEL_DIR='/nonexistent/model': no tokenizer.json there"),
        (["--engine", "sim"], {"ENGINE_NUM_GPU_BLOCKS": "10"},
         "cannot hold one max_model_len=4096 sequence"),
        (["--engine", "sim", "--port", "70000"], {}, "serve: --port='70000': expected a TCP port"),
    ],
)
def test_start_up_errors_are_one_line(demo_model_dir: Path, args: list[str],
                                      extra_env: dict[str, str], fragment: str) -> None:
    env = {"GATEWAY_MODEL_DIR": str(demo_model_dir), "PATH": "/usr/bin:/bin", **extra_env}
    result = run_serve(args, env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


def test_listens_on_sagemaker_bind_to_port(start_gateway: Any) -> None:
    port = free_port()
    gateway: GatewayProcess = start_gateway({"SAGEMAKER_BIND_TO_PORT": str(port)}, port=port,
                                            use_port_flag=False)
    assert gateway.wait_ready()["status"] == "healthy"


def test_ping_answers_fast_while_the_engine_starts(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({"SIM_STARTUP_S": "3"})
    answers: list[tuple[float, int, dict[str, Any]]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            response = gateway.ping()
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        answers.append((time.perf_counter() - started, response.status_code, response.json()))
        if response.status_code == 200:
            break
        time.sleep(0.1)
    warming = [body for _, status, body in answers if status == 503]
    assert warming, "the gateway should answer 503 warming_up while the engine loads"
    assert {body["status"] for body in warming} == {"warming_up"}
    assert warming[0]["reason"] == "engine starting"
    assert answers[-1][1] == 200
    assert max(latency for latency, _, _ in answers) < 2.0


def test_sigterm_drains_in_flight_requests(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({"SIM_STEP_TIME_S": "0.01",
                                             "SIM_EOS_PROBABILITY": "0"})
    gateway.wait_ready()
    result: dict[str, Any] = {}

    def call() -> None:
        response = httpx.post(f"{gateway.url}/invocations", timeout=30.0, json={
            "messages": [{"role": "user", "content": "Recommend a seinen manga."}],
            "max_tokens": 100})
        result["status"] = response.status_code
        result["body"] = response.json()

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.4)  # the request is mid-generation (100 steps x 10 ms)
    gateway.process.send_signal(signal.SIGTERM)
    caller.join(timeout=30)
    code = gateway.process.wait(timeout=30)
    assert result["status"] == 200
    assert result["body"]["usage"]["completion_tokens"] == 100
    assert result["body"]["choices"][0]["finish_reason"] == "length"
    assert code == 0, "a drained stop is a normal stop"
    assert any(line.get("event") == "gateway_stopped" for line in gateway.lines())


def test_kv_capacity_that_cannot_hold_one_request_stops_the_start(start_gateway: Any) -> None:
    # 260 blocks hold one 4096-token sequence, but the 0.9 watermark leaves 234 < 256.
    gateway: GatewayProcess = start_gateway({"ENGINE_NUM_GPU_BLOCKS": "260"})
    code = gateway.process.wait(timeout=30)
    assert code == 3
    stderr = gateway.stderr_path.read_text()
    assert "KV capacity check failed: the engine has 260 blocks" in stderr
    assert "fewer than the 256 one ENGINE_MAX_MODEL_LEN=4096 request needs" in stderr


def test_crash_loop_turns_ping_red(start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({
        "SIM_OOM_AT_STEP": "3",  # every engine built dies a few steps into warmup
        "GATEWAY_ENGINE_RESTART_BACKOFF_S": "0.05",
        "GATEWAY_CRASH_LOOP_DEATHS": "3",
    })
    deadline = time.monotonic() + 30
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            response = gateway.ping()
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        body = response.json()
        if body["status"] == "crash_loop":
            assert response.status_code == 503
            break
        assert body["status"] in ("warming_up", "recovering")
        time.sleep(0.05)
    assert body.get("status") == "crash_loop", body
    deaths = int(body["reason"].split(" ", 1)[0])  # a rebuild may die again before the poll
    assert deaths >= 3 and body["reason"].endswith("engine deaths within 600 s"), body
    assert gateway.process.poll() is None  # red /ping; SageMaker replaces the instance
    trips = [line for line in gateway.emf() if "OOMCircuitTrips" in line]
    assert len(trips) >= 3
