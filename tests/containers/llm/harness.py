"""Test harness for the LLM gateway: the real `serve` process and small request helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from gateway.api.protocol import ChatCompletionRequest
from gateway.settings import Settings, load_settings
from gateway.telemetry import RequestRecord
from tests.support.network import free_port, wait_until_ok

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVE = REPO_ROOT / "tests" / "support" / "sim_serve.py"
"""The gateway's ``serve`` with the simulated engine registered (``--engine sim``)."""


class GatewayProcess:
    """`serve --engine sim` in a subprocess; stdout (EMF + logs) goes to a file."""

    def __init__(self, model_dir: Path, log_dir: Path, env: Mapping[str, str] | None = None,
                 *, port: int | None = None, use_port_flag: bool = True) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = log_dir / f"gateway-{self.port}.out"
        self.stderr_path = log_dir / f"gateway-{self.port}.err"
        full_env = {key: value for key, value in os.environ.items()
                    if not key.startswith(("GATEWAY_", "ENGINE_", "SAGEMAKER_", "PORT"))}
        full_env.update({"GATEWAY_MODEL_DIR": str(model_dir), "GATEWAY_METRICS_INTERVAL_S": "1",
                         "GATEWAY_METRICS_ENDPOINT_NAME": "test-endpoint",
                         "GATEWAY_METRICS_VARIANT_NAME": "AllTraffic"})
        full_env.update(env or {})
        args = [sys.executable, str(SERVE), "--engine", "sim", "--host", "127.0.0.1",
                "--log-level", "warning"]
        if use_port_flag:
            args += ["--port", str(self.port)]
        self._stdout = self.stdout_path.open("wb")
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen(args, stdout=self._stdout, stderr=self._stderr,
                                        env=full_env)

    def ping(self) -> httpx.Response:
        return httpx.get(f"{self.url}/ping", timeout=2.0)

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """/ping's body once the gateway answers 200 and, within ``timeout_s``, ``healthy``:
        a 200 ``recovering`` (an engine rebuilt or warming up) answers requests with 503."""

        def exited() -> str | None:
            if self.process.poll() is None:
                return None
            return (f"gateway exited with {self.process.returncode}: "
                    f"{self.stderr_path.read_text()[-2000:]}")

        deadline = time.monotonic() + timeout_s
        response = wait_until_ok(f"{self.url}/ping", timeout_s=timeout_s, interval_s=0.05,
                                 name="gateway", exited=exited)
        body = dict(response.json())
        while body.get("status") == "recovering" and time.monotonic() < deadline:
            time.sleep(0.05)
            body = dict(httpx.get(f"{self.url}/ping", timeout=5.0).json())
        return body

    def lines(self) -> list[dict[str, Any]]:
        """Every JSON line the gateway wrote to stdout so far."""
        self._stdout.flush()
        result = []
        for line in self.stdout_path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line.startswith("{"):
                result.append(json.loads(line))
        return result

    def emf(self) -> list[dict[str, Any]]:
        """The EMF documents among the stdout lines."""
        return [line for line in self.lines() if "_aws" in line]

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stdout.close()
        self._stderr.close()
        return int(self.process.returncode)


def make_settings(model_dir: Path, **env: str) -> Settings:
    return load_settings({"GATEWAY_MODEL_DIR": str(model_dir), **env})


def chat_request(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(body)


def new_record(path: str = "/invocations") -> RequestRecord:
    return RequestRecord(request_id="chatcmpl-test", path=path, started=time.monotonic())
