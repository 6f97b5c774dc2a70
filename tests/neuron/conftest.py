"""Fixtures for the compile pipeline: a tiny random DistilBERT, compiled once for cpu by the CLI.

Nothing is downloaded: the WordPiece tokenizer is trained in-process on a small manga corpus and
the model has random weights (neuron.random_model).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CompiledArtifact:
    """What one run of `python -m neuron.compile --target cpu` produced."""

    out_dir: Path
    artifact_dir: Path
    tar_path: Path
    returncode: int
    stderr: str
    elapsed_s: float


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny DistilBERT intent classifier + WordPiece tokenizer directory."""
    from neuron.random_model import build_random_distilbert

    return build_random_distilbert(tmp_path_factory.mktemp("tiny-distilbert"), size="tiny")


def run_compile_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m neuron.compile` exactly as a person would, from the repo root."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "neuron.compile", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="session")
def cpu_artifact(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> CompiledArtifact:
    """The tiny model compiled for cpu by the real CLI (batch sizes 1 and 4)."""
    out_dir = tmp_path_factory.mktemp("compiled-cpu")
    started = time.perf_counter()
    result = run_compile_cli("--target", "cpu", "--model-dir", str(tiny_model_dir),
                             "--out", str(out_dir), "--batch-sizes", "1,4",
                             "--latency-iterations", "8", "--latency-warmup", "3")
    artifact = CompiledArtifact(out_dir=out_dir, artifact_dir=out_dir / "model",
                                tar_path=out_dir / "model.tar.gz",
                                returncode=result.returncode, stderr=result.stderr,
                                elapsed_s=time.perf_counter() - started)
    assert result.returncode == 0, f"compile failed:\n{result.stderr[-4000:]}"
    return artifact
