"""Start-up, readiness and refusal: what SageMaker sees before and when things go wrong."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from artifact_manifest import describe_files, list_artifact_files
from intent_server.app import create_app
from intent_server.classifier import ArtifactError, IntentClassifier, preflight
from intent_server.metrics import EmfWriter
from intent_server.settings import load_settings
from neuron.manifest import manifest_from_json
from neuron.runtime import SdkUnavailableError
from neuron.targets import INF1_IMAGE, INF2_IMAGE
from tests.support.network import free_port

from .conftest import REPO_ROOT, SERVE, app_on_socket, server_env, wait_until_ready


def _settings(model_dir: Path, **env: str) -> Any:
    return load_settings({"INTENT_MODEL_DIR": str(model_dir), "INTENT_WARMUP_CALLS": "1",
                          **env})


def test_ping_is_503_until_the_model_is_loaded_and_warm(compiled_model: Any) -> None:
    settings = _settings(compiled_model.model_dir)
    checked = preflight(settings, {})
    release = threading.Event()

    def slow_load() -> IntentClassifier:
        release.wait(timeout=30)
        return IntentClassifier.load(settings, checked, log=lambda _: None)

    app = create_app(settings, checked.manifest, slow_load, EmfWriter(io.StringIO()))
    with app_on_socket(app) as base_url:
        ping = httpx.get(f"{base_url}/ping", timeout=2)
        assert (ping.status_code, ping.json()) == (503, {"status": "loading"})
        early = httpx.post(f"{base_url}/invocations", json={"text": "hi"}, timeout=5)
        assert early.status_code == 503
        assert early.headers["retry-after"] == "5"
        assert "loading" in early.json()["error"]["message"]
        release.set()
        assert wait_until_ready(base_url, timeout_s=30)["status"] == "ready"
        assert httpx.post(f"{base_url}/invocations", json={"text": "hi"},
                          timeout=10).status_code == 200


def test_a_failed_load_keeps_ping_red_with_the_reason(compiled_model: Any) -> None:
    settings = _settings(compiled_model.model_dir)
    checked = preflight(settings, {})

    def broken_load() -> IntentClassifier:
        raise ArtifactError("model-b4.pt: SHA-256 mismatch")

    app = create_app(settings, checked.manifest, broken_load, EmfWriter(io.StringIO()))
    with app_on_socket(app) as base_url:
        for _ in range(50):
            ping = httpx.get(f"{base_url}/ping", timeout=2)
            if ping.json()["status"] != "loading":
                break
            threading.Event().wait(0.05)
        assert ping.status_code == 503
        assert ping.json() == {"status": "failed", "error": "model-b4.pt: SHA-256 mismatch"}


def test_all_copies_busy_answers_503_busy(compiled_model: Any) -> None:
    settings = _settings(compiled_model.model_dir, INTENT_REPLICA_WAIT_S="0.2")
    checked = preflight(settings, {})
    classifier = IntentClassifier.load(settings, checked, log=lambda _: None)
    app = create_app(settings, checked.manifest, lambda: classifier, EmfWriter(io.StringIO()))
    with app_on_socket(app) as base_url:
        wait_until_ready(base_url)
        with classifier.pool.checkout(timeout_s=1):  # hold the only copy
            response = httpx.post(f"{base_url}/invocations", json={"text": "hi"}, timeout=10)
            ping = httpx.get(f"{base_url}/ping", timeout=2)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "busy" in response.json()["error"]["message"]
        assert ping.status_code == 200, "/ping must not wait for a model copy"


def _copy_model(compiled_model: Any, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(compiled_model.model_dir, target)
    return target


def _edit_manifest(model_dir: Path, **changes: Any) -> None:
    """Change manifest.json as a different compile would, artifact-manifest.json included."""
    data = json.loads((model_dir / "manifest.json").read_text())
    data.update(changes)
    (model_dir / "manifest.json").write_text(json.dumps(data))
    (model_dir / "artifact-manifest.json").write_text(
        describe_files(model_dir, list_artifact_files(model_dir)).to_json())


@pytest.mark.parametrize(("target", "image"), [("inf1", INF1_IMAGE), ("inf2", INF2_IMAGE)])
def test_neuron_artifact_without_its_sdk_fails_naming_the_image(
        compiled_model: Any, tmp_path: Path, target: str, image: str) -> None:
    model_dir = _copy_model(compiled_model, tmp_path)
    _edit_manifest(model_dir, target=target)
    with pytest.raises(SdkUnavailableError, match=image.replace(".", r"\.")):
        preflight(_settings(model_dir), {})


def test_inf1_plan_sets_the_runtime_cores_before_import(
        compiled_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stand-in torch_neuron and two fake /dev/neuron devices, preflight plans 8 copies
    and sets NEURON_RT_NUM_CORES before importing the runtime (which reads it at start)."""
    model_dir = _copy_model(compiled_model, tmp_path)
    _edit_manifest(model_dir, target="inf1")
    site = tmp_path / "site" / "torch_neuron"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(
        "import os\nSEEN_NUM_CORES = os.environ.get('NEURON_RT_NUM_CORES')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torch_neuron", raising=False)
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "neuron0").touch()
    (devices / "neuron1").touch()
    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)  # the stand-in reads the planned value from here
    checked = preflight(_settings(model_dir), env, dev_dir=str(devices))
    assert checked.core_plan.copies == 8
    assert env["NEURON_RT_NUM_CORES"] == "8"
    assert sys.modules["torch_neuron"].SEEN_NUM_CORES == "8"
    sys.modules.pop("torch_neuron", None)


@pytest.mark.parametrize(("change", "message"), [
    ({"target": "inf2", "_env": {"INTENT_TARGET": "cpu"}}, "compiled for inf2"),
    ({"_env": {"INTENT_TARGET": "inf1"}}, "built for inf1"),
    ({"labels": ["a", "b", "c", "d", "e", "f", "g", "h"]}, "labels.json"),
    ({"parity": {"samples": 3, "max_abs_logit_diff": 1.0, "mean_abs_logit_diff": 0.5,
                 "top1_disagreements": 1, "smallest_disagreeing_margin": 0.1, "bound": 0.001}},
     "parity failed"),
    ({"model_files": {"1": "model-b1.pt", "4": "model-b9.pt"},
      "files_sha256": None}, "model-b9.pt"),
])
def test_preflight_refuses_an_inconsistent_artifact(compiled_model: Any, tmp_path: Path,
                                                    change: dict[str, Any],
                                                    message: str) -> None:
    model_dir = _copy_model(compiled_model, tmp_path)
    env = change.pop("_env", {})
    data = json.loads((model_dir / "manifest.json").read_text())
    if change.get("files_sha256", "") is None:
        change["files_sha256"] = {**data["files_sha256"], "model-b9.pt": "0" * 64}
    data.update(change)
    (model_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises((ArtifactError, SdkUnavailableError), match=message):
        preflight(_settings(model_dir, **env), {})


def test_corrupt_model_file_is_caught_by_its_checksum(compiled_model: Any,
                                                      tmp_path: Path) -> None:
    model_dir = _copy_model(compiled_model, tmp_path)
    with (model_dir / "model-b4.pt").open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00corrupt\x00")
    settings = _settings(model_dir)
    with pytest.raises(ArtifactError, match=r"model-b4\.pt: SHA-256"):
        IntentClassifier.load(settings, preflight(settings, {}), log=lambda _: None)


def test_truncated_model_without_checksums_fails_to_load_clearly(compiled_model: Any,
                                                                 tmp_path: Path) -> None:
    model_dir = _copy_model(compiled_model, tmp_path)
    (model_dir / "model-b1.pt").write_bytes(b"not a torchscript archive")
    settings = _settings(model_dir, INTENT_VERIFY_CHECKSUMS="false")
    with pytest.raises(ArtifactError, match=r"model-b1\.pt: torch\.jit\.load failed"):
        IntentClassifier.load(settings, preflight(settings, {}), log=lambda _: None)


def _run_serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SERVE), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_serve_exits_with_one_clear_line(compiled_model: Any, tmp_path: Path) -> None:
    port = free_port()
    bad_args = _run_serve("train", env=server_env(compiled_model.model_dir, port))
    assert bad_args.returncode == 2
    assert "unexpected arguments ['train']" in bad_args.stderr
    bad_port = _run_serve("serve", env=server_env(compiled_model.model_dir, port,
                                                  SAGEMAKER_BIND_TO_PORT="http"))
    assert bad_port.returncode == 2
    assert "SAGEMAKER_BIND_TO_PORT='http' is not an integer" in bad_port.stderr
    no_model = _run_serve("serve", env=server_env(tmp_path / "empty", port))
    assert no_model.returncode == 3
    assert "manifest.json not found" in no_model.stderr


@pytest.mark.parametrize(("damage", "message"), [
    ("corrupt", r"^error: artifact check: model-b4\.pt: SHA-256 [0-9a-f]{12}… differs from "
                r"artifact-manifest\.json's [0-9a-f]{12}…"),
    ("truncate", r"^error: artifact check: model-b4\.pt: 100 bytes, but artifact-manifest\.json "
                 r"says \d+ \(an incomplete download"),
    ("delete", r"^error: artifact check: tokenizer\.json: listed in artifact-manifest\.json but "
               r"missing from "),
])
def test_serve_refuses_files_that_differ_from_the_artifact_manifest(
        compiled_model: Any, tmp_path: Path, damage: str, message: str) -> None:
    """compile.py packs artifact-manifest.json into model.tar.gz; before the port opens, the
    server checks what SageMaker unpacked against it and exits 3 with one line naming the file."""
    model_dir = _copy_model(compiled_model, tmp_path)
    if damage == "corrupt":
        with (model_dir / "model-b4.pt").open("r+b") as handle:
            handle.seek(100)
            handle.write(b"\x00corrupt\x00")
    elif damage == "truncate":
        data = (model_dir / "model-b4.pt").read_bytes()
        (model_dir / "model-b4.pt").write_bytes(data[:100])
    else:
        (model_dir / "tokenizer.json").unlink()
    result = _run_serve("serve", env=server_env(model_dir, free_port()))
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.match(message, lines[0]), lines[0]


def test_serve_inf1_artifact_in_a_cpu_environment(compiled_model: Any, tmp_path: Path) -> None:
    model_dir = _copy_model(compiled_model, tmp_path)
    _edit_manifest(model_dir, target="inf1")
    result = _run_serve("serve", env=server_env(model_dir, free_port(), INTENT_TARGET="inf1"))
    assert result.returncode == 3
    assert INF1_IMAGE in result.stderr
    assert "torch_neuron" in result.stderr


def test_serve_with_no_arguments_also_starts(compiled_model: Any) -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(SERVE)], cwd=REPO_ROOT,
                               env=server_env(compiled_model.model_dir, port, INTENT_METRICS="0"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until_ready(f"http://127.0.0.1:{port}", process=process)["status"] == "ready"
        response = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"text": "hi"},
                              timeout=10)
        assert response.status_code == 200
    finally:
        process.terminate()
        stdout, stderr = process.communicate(timeout=30)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (exit status -15).
    assert process.returncode in (0, -15)
    assert b"Finished server process" in stderr, stderr[-2000:]
    assert stdout == b"", "INTENT_METRICS=0 writes no EMF lines"


def test_manifest_in_the_model_dir_is_what_the_server_reports(compiled_model: Any) -> None:
    manifest = manifest_from_json((compiled_model.model_dir / "manifest.json").read_text())
    assert manifest.batch_sizes == (1, 4)
    assert manifest.target.value == "cpu"


def test_several_cpu_copies_serve_concurrently(compiled_model: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    settings = _settings(compiled_model.model_dir, INTENT_MODEL_COPIES="2")
    checked = preflight(settings, {})
    assert checked.core_plan.copies == 2
    classifier = IntentClassifier.load(settings, checked, log=lambda _: None)
    assert classifier.pool.size == 2
    texts = ["Where is my order?", "Recommend a manga like Frieren", "返品したい"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(classifier.classify, [texts] * 8))
    first = [p.intent for p in results[0].predictions]
    assert all([p.intent for p in r.predictions] == first for r in results)
    assert all(r.model_calls >= 1 and r.latency_ms > 0 for r in results)
