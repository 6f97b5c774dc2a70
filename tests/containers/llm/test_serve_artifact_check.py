"""`serve` checks the model directory against artifact-manifest.json before the engine starts.

`make publish` writes the manifest at the root of the LLM's S3 prefix, so SageMaker copies it into
/opt/ml/model with the weights; a file that is missing, short or different stops the start with
exit 2 and one line naming it. Without a manifest (local runs) nothing is checked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from artifact_manifest import describe_files, list_artifact_files
from tests.containers.llm.harness import SERVE


def run_serve(model_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GATEWAY_MODEL_DIR": str(model_dir), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(SERVE), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def published(demo_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the demo model with an adapter folder and the manifest `make publish` writes."""
    model_dir = tmp_path / "model"
    shutil.copytree(demo_model_dir, model_dir)
    adapter = model_dir / "adapters" / "manga_domain"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (model_dir / "artifact-manifest.json").write_text(
        describe_files(model_dir, list_artifact_files(model_dir)).to_json())
    return model_dir


def test_a_changed_adapter_file_stops_the_start_naming_it(published: Path) -> None:
    (published / "adapters" / "manga_domain" / "adapter_config.json").write_text('{"r": 9}')
    result = run_serve(published, "--engine", "sim")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "serve: artifact check: adapters/manga_domain/adapter_config.json: SHA-256 ")


def test_a_missing_file_stops_the_start_naming_it(published: Path) -> None:
    (published / "tokenizer.json").unlink()
    result = run_serve(published, "--engine", "sim")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"serve: artifact check: tokenizer.json: listed in artifact-manifest.json but missing "
        f"from {published}")


def test_a_matching_directory_passes_and_the_start_goes_on(published: Path) -> None:
    """The check passes (one line saying so), then the next start-up step runs: here a bad
    engine name, so the process stops there instead of serving."""
    result = run_serve(published, "--engine", "tgi")
    assert result.returncode == 2
    first, second = result.stderr.strip().splitlines()
    assert first.startswith("serve: artifact-manifest.json: ")
    assert "sizes and SHA-256 match" in first
    assert "--engine 'tgi' is not available" in second


def test_without_a_manifest_nothing_is_checked(demo_model_dir: Path) -> None:
    result = run_serve(demo_model_dir, "--engine", "tgi")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("serve: --engine 'tgi' is not available in this build")
