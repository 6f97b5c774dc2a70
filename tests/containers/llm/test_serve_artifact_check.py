"""`serve` checks the model directory against artifact-manifest.json before the engine starts.

`make publish` writes the manifest at the root of the LLM's S3 prefix, so SageMaker copies it into
/opt/ml/model with the weights; a file that is missing, short or different stops the start with
exit 2 and one line naming it. Without a manifest (local runs) nothing is checked. The manifest
also names the adapters served with the model (the ones its quality gate evaluated on it, for a
quantized model): an adapter it does not name, or whose files differ, stops the start too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from artifact_manifest import (
    ArtifactFiles,
    NamedAdapter,
    adapter_dir_checksum,
    describe_files,
    list_artifact_files,
)
from tests.containers.llm.harness import SERVE

SERVED_ADAPTERS = {"manga": "manga_domain", "support": "general_support",
                   "manga-ja": "jp_translation"}
"""GATEWAY_ADAPTERS' default."""


def run_serve(model_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {"GATEWAY_MODEL_DIR": str(model_dir), "PATH": "/usr/bin:/bin", **env}
    return subprocess.run([sys.executable, str(SERVE), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def published(demo_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the demo model with its adapter folders and the manifest `make publish` writes
    (naming the adapters)."""
    model_dir = tmp_path / "model"
    shutil.copytree(demo_model_dir, model_dir)
    for folder in SERVED_ADAPTERS.values():
        adapter = model_dir / "adapters" / folder
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text('{"r": 8}')
    write_manifest(model_dir, SERVED_ADAPTERS)
    return model_dir


def write_manifest(model_dir: Path, adapters: dict[str, str]) -> None:
    """artifact-manifest.json for every file, naming ``adapters`` (name -> folder)."""
    files = describe_files(model_dir, list_artifact_files(model_dir)).files
    named = {name: NamedAdapter(folder, adapter_dir_checksum(model_dir / "adapters" / folder))
             for name, folder in adapters.items()}
    (model_dir / "artifact-manifest.json").write_text(
        ArtifactFiles(files=files, adapters=named).to_json())


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
    first, second, third = result.stderr.strip().splitlines()
    assert first.startswith("serve: artifact-manifest.json: ")
    assert "sizes and SHA-256 match" in first
    assert second == ("serve: 3 adapter(s) named for this model in its manifest, checksums "
                      "match")
    assert "--engine 'tgi' is not available" in third


def test_an_adapter_the_manifest_does_not_name_stops_the_start(published: Path) -> None:
    """A model is served only with the adapters named for it: here 'manga-ja', never gated on
    this model (its files are listed, but not as an adapter of the model)."""
    write_manifest(published, {"manga": "manga_domain", "support": "general_support"})
    result = run_serve(published, "--engine", "sim")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "serve: adapter check: adapter 'manga-ja' (GATEWAY_ADAPTERS) is not named in "
        "artifact-manifest.json for this model (it names: manga, support); a model is served "
        "only with the adapters its quality gate evaluated on it: gate it (make quantize), then "
        "make promote")


def test_an_adapter_other_than_the_named_one_stops_the_start(published: Path,
                                                             tmp_path: Path) -> None:
    """GATEWAY_ADAPTERS_DIR pointing at another copy of 'manga' (not the one gated)."""
    other = tmp_path / "other"
    shutil.copytree(published / "adapters", other)
    (other / "manga_domain" / "adapter_config.json").write_text('{"r": 16}')
    result = run_serve(published, "--engine", "sim", GATEWAY_ADAPTERS_DIR=str(other))
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"serve: adapter check: adapter 'manga' in {other / 'manga_domain'}: checksum ")
    assert line.endswith("artifact-manifest.json names (not the adapter this model was gated "
                         "with)")


def test_without_a_manifest_nothing_is_checked(demo_model_dir: Path) -> None:
    result = run_serve(demo_model_dir, "--engine", "tgi")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("serve: --engine 'tgi' is not available in this build")
