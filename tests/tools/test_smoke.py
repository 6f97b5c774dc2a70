"""make smoke against the real gateway (simulated engine) and the real intent server (CPU model),
behind the local SageMaker runtime stand-in, so that botocore's own parsers read every answer —
the binary event stream of InvokeEndpointWithResponseStream included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from stacks.settings import load_settings
from tests.containers.intent.conftest import server_env, wait_until_ready
from tests.containers.llm.harness import GatewayProcess
from tests.support.aws import fake_credentials
from tests.support.eventstream import model_stream_error, payload_part
from tests.support.network import free_port
from tests.support.runtime_standin import RuntimeStandin, StandinConfig
from tools import smoke as smoke_module
from tools.smoke import _session, main
from tools.smoke_checks import judge_session

REPO_ROOT = Path(__file__).resolve().parents[2]
LLM, INTENT = "manga-assist-dev-llm", "manga-assist-dev-intent"


def gateway_env() -> dict[str, str]:
    """The routing the stack gives the container for dev (stacks/llm_endpoint.py)."""
    from stacks.llm_endpoint import container_environment

    llm = load_settings("dev").llm
    env = container_environment(llm, llm.capacity_plan(), endpoint_name=LLM,
                                variant_name="AllTraffic")
    keep = ("GATEWAY_ROUTING_TABLE", "GATEWAY_LOCALE_ROUTES", "GATEWAY_ADAPTERS")
    return {key: env[key] for key in keep}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smoke")


@pytest.fixture(scope="module")
def gateway(workdir: Path) -> Iterator[GatewayProcess]:
    from tests.support.demo_model import write_model_dir

    model_dir = write_model_dir(workdir / "llm-model")
    process = GatewayProcess(model_dir, workdir, {
        **gateway_env(), "GATEWAY_TEST_MODE": "true", "SIM_EOS_PROBABILITY": "0",
        "SIM_STEP_TIME_S": "0.02"})
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def intent_server(workdir: Path) -> Iterator[str]:
    from neuron import compile as compile_cli
    from neuron.model_archive import safe_extract
    from neuron.random_model import build_random_distilbert

    source = build_random_distilbert(workdir / "intent-source", size="tiny")
    out = workdir / "intent-compiled"
    assert compile_cli.main(["--target", "cpu", "--model-dir", str(source), "--out", str(out),
                             "--batch-sizes", "1,4", "--latency-iterations", "2",
                             "--latency-warmup", "1"]) == 0
    model_dir = workdir / "intent-model"
    safe_extract(out / "model.tar.gz", model_dir)
    port = free_port()
    with (workdir / "intent.out").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "containers/intent/serve"), "serve"], cwd=REPO_ROOT,
            env=server_env(model_dir, port), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process=process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials, and dev's thresholds with room for 2 shared CPU cores under load."""
    import shutil

    import yaml

    shutil.copytree(REPO_ROOT / "config", tmp_path / "config")
    dev = tmp_path / "config" / "dev.yaml"
    data = yaml.safe_load(dev.read_text(encoding="utf-8"))
    data["smoke"].update(llm_time_to_first_token_ms=10000, intent_latency_ms=10000)
    dev.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    monkeypatch.setenv("MANGAASSIST_CONFIG_DIR", str(tmp_path / "config"))
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    fake_credentials(monkeypatch)


def smoke(standin: RuntimeStandin, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["--env", "dev", "--endpoint-url", standin.url])
    return code, capsys.readouterr().out.splitlines()


def config(gateway: GatewayProcess, intent_url: str, **extra: object) -> StandinConfig:
    # 37-byte parts split SSE lines and multi-byte UTF-8 characters across events.
    return StandinConfig({LLM: gateway.url, INTENT: intent_url}, max_part_bytes=37,
                         **extra)  # type: ignore[arg-type]


@pytest.mark.slow
def test_passes_against_the_real_containers(
    gateway: GatewayProcess, intent_server: str, aws_env: None,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    with RuntimeStandin(config(gateway, intent_server)) as standin:
        code, lines = smoke(standin, capsys)
    assert code == 0, "\n".join(lines)
    rows = {tuple(line.split()[:3]) for line in lines[1:]}
    for name in ("conversation ja", "conversation en", "routed intent+locale", "stream"):
        assert (LLM, *name.split()[:1], *name.split()[1:2]) in rows or any(
            line.startswith(LLM) and name in line and "  ok  " in line for line in lines), name
    assert any(line.startswith(INTENT) and "batch" in line and "  ok  " in line for line in lines)
    routed = next(line for line in lines if "routed intent+locale" in line)
    assert routed.endswith("adapter manga-ja")  # recommendation + ja-JP: config/dev.yaml
    assert lines[-1] == "smoke: 6 passed, 0 failed"
    assert f"invocations-response-stream {LLM} {gateway.url}" in standin.config.invocations
    session = next(line for line in lines if " session " in line)
    assert "2 turns on its instance, turn 2 cached" in session and session.endswith("closed")


@pytest.mark.slow
def test_fails_saying_why_when_a_stream_breaks_off(
    gateway: GatewayProcess, intent_server: str, aws_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with RuntimeStandin(config(gateway, intent_server, cut_stream_after_parts=4)) as standin:
        code, lines = smoke(standin, capsys)
    assert code == 1
    [failure] = [line for line in lines if line.startswith("FAIL ")]
    assert failure.startswith(f"FAIL {LLM} stream: stream broke off: ")
    assert "and no [DONE]" in failure
    assert lines[-1] == "smoke: 5 passed, 1 failed"


@pytest.mark.slow
def test_fails_saying_why_when_the_gateway_answers_with_a_fallback(
    gateway: GatewayProcess, intent_server: str, aws_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 48 tokens at 20 ms a step: the first conversation is in flight for about a second; the
    # simulated CUDA OOM kills the engine as soon as /ping shows it running, and the gateway
    # answers it with a fallback.
    def oom_soon() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            admission = httpx.get(f"{gateway.url}/ping", timeout=5).json()["admission"]
            if admission["running_sequences"]:
                break
            time.sleep(0.02)
        httpx.post(f"{gateway.url}/admin/engine/oom", timeout=5)

    with RuntimeStandin(config(gateway, intent_server)) as standin:
        killer = threading.Thread(target=oom_soon)
        killer.start()
        code, lines = smoke(standin, capsys)
        killer.join()
    assert code == 1
    failures = [line for line in lines if line.startswith("FAIL ")]
    assert failures[0].startswith(
        f"FAIL {LLM} conversation ja: fallback answer (engine_out_of_memory): "), lines
    gateway.wait_ready()  # it rebuilt the engine in-process for the next test


def test_botocore_reads_the_event_stream_framing() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(payload_part("data: {\"x\": \"漫画\"}\n".encode()) + model_stream_error("boom"))
    first, second = list(buffer)
    assert first.headers[":event-type"] == "PayloadPart"
    assert first.payload.decode() == 'data: {"x": "漫画"}\n'
    assert second.headers[":exception-type"] == "ModelStreamError"
    assert second.payload == b'{"Message": "boom", "ErrorCode": "ModelStreamError"}'


@pytest.fixture(scope="module")
def second_gateway(workdir: Path) -> Iterator[GatewayProcess]:
    """Another instance of the LLM endpoint (sessions must stick to one of the two)."""
    from tests.support.demo_model import write_model_dir

    model_dir = write_model_dir(workdir / "llm-model-2")
    process = GatewayProcess(model_dir, workdir, {**gateway_env(),
                                                  "SIM_EOS_PROBABILITY": "0"})
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def runtime_client(standin: RuntimeStandin) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("sagemaker-runtime", region_name="ap-northeast-1",
                        endpoint_url=standin.url,
                        config=Config(retries={"max_attempts": 1, "mode": "standard"}))


@pytest.mark.slow
def test_a_sessions_turns_stay_on_the_instance_that_opened_it(
        gateway: GatewayProcess, second_gateway: GatewayProcess, aws_env: None) -> None:
    """Two instances, requests otherwise in turn: every request of a session goes where it was
    opened, and its second turn finds the first one's prompt cached there."""
    settings = load_settings("dev")
    config = StandinConfig({LLM: [gateway.url, second_gateway.url]})
    with RuntimeStandin(config) as standin:
        records = [_session(runtime_client(standin), LLM, settings, time.perf_counter)
                   for _ in range(3)]
    for record in records:
        check = judge_session(LLM, record, settings.smoke, block_size=settings.llm.block_size)
        assert check.passed, check.detail
        assert len(record.opened) == 1
    instances = [line.split()[-1] for line in config.invocations]
    # open, two turns, close: four requests per session, all on one instance; sessions alternate
    per_session = [instances[i:i + 4] for i in range(0, len(instances), 4)]
    assert all(len(set(group)) == 1 for group in per_session), per_session
    assert {group[0] for group in per_session} == {gateway.url, second_gateway.url}


@pytest.mark.slow
def test_a_session_whose_instance_is_gone_is_reopened_and_loses_nothing(
        workdir: Path, aws_env: None) -> None:
    """The session's instance dies between two turns: SageMaker's router cannot reach it (424
    ModelError here), the caller opens a new session and sends the same history again."""
    from tests.support.demo_model import write_model_dir

    settings = load_settings("dev")
    model_dir = write_model_dir(workdir / "llm-model-3")
    doomed = GatewayProcess(model_dir, workdir, {**gateway_env(),
                                                 "SIM_EOS_PROBABILITY": "0"})
    survivor = GatewayProcess(model_dir, workdir, {**gateway_env(),
                                                   "SIM_EOS_PROBABILITY": "0"})
    try:
        doomed.wait_ready()
        survivor.wait_ready()
        config = StandinConfig({LLM: [doomed.url, survivor.url]})
        with RuntimeStandin(config) as standin:
            client = runtime_client(standin)
            original = smoke_module.open_session

            def open_then_kill(runtime: Any, endpoint: str) -> tuple[str | None, str]:
                opened = original(runtime, endpoint)
                if doomed.process.poll() is None:
                    doomed.stop()  # the instance that holds the new session is replaced
                return opened

            smoke_module.open_session = open_then_kill  # type: ignore[assignment]
            try:
                record = _session(client, LLM, settings, time.perf_counter)
            finally:
                smoke_module.open_session = original  # type: ignore[assignment]
        check = judge_session(LLM, record, settings.smoke, block_size=settings.llm.block_size)
        assert check.passed, check.detail
        assert len(record.opened) == 2
        assert "reopened once" in check.detail
        assert config.invocations[-1].endswith(survivor.url)
    finally:
        for process in (doomed, survivor):
            if process.process.poll() is None:
                process.stop()
