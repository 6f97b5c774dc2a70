"""make test's own guard (tests/support/budget_guard.py), run on small suites of its own: a test
over the budget fails the run unless it says why, the run prints its slowest tests, and on two
xdist workers the real-engine tier's folder runs on one worker while every other module stays
whole on one worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
from tests.support import budget_guard


def pytest_addoption(parser):
    budget_guard.add_option(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: the real-engine tier")
    config.addinivalue_line("markers", "budget(reason): may exceed the budget")
    config.pluginmanager.register(budget_guard.BudgetGuard(config), "budget-guard")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(budget_guard.XdistScheduling(), "module-scheduling")
"""


def suite(root: Path, files: dict[str, str]) -> Path:
    """A throwaway suite under ``root`` (its own conftest registering the guard)."""
    (root / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on the throwaway suite with xdist as its only third-party plugin (the others,
    schemathesis and hypothesis, take seconds to import and play no part here)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider",
         "--rootdir", str(root), "-o", "addopts=", "--strict-markers", *args],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


SLOW = """
import time
import pytest

def test_fast():
    pass

def test_slow():
    time.sleep(0.6)

@pytest.mark.budget(reason="sleeps on purpose: the guard's own test")
def test_slow_with_a_reason():
    time.sleep(0.6)
"""


def test_a_test_over_the_budget_without_a_reason_fails_the_run(tmp_path: Path) -> None:
    result = run(suite(tmp_path, {"test_times.py": SLOW}), "--test-budget", "0.4")
    assert result.returncode == 1, result.stdout
    assert "3 passed" in result.stdout
    over = result.stdout.split("over the per-test budget without a reason")[1]
    assert "test_times.py::test_slow:" in over
    assert "test_slow_with_a_reason" not in over
    slowest = result.stdout.split("the 10 slowest tests")[1]
    assert "[budget: sleeps on purpose: the guard's own test]" in slowest
    assert slowest.index("test_slow") < slowest.index("test_fast")


def test_with_every_slow_test_explained_the_run_passes(tmp_path: Path) -> None:
    root = suite(tmp_path, {"test_times.py": SLOW.replace("def test_slow():\n",
                                                          "def test_slow():\n    return\n")})
    result = run(root, "--test-budget", "0.4")
    assert result.returncode == 0, result.stdout
    assert "the 10 slowest tests" in result.stdout
    assert "without a reason" not in result.stdout


def test_without_a_budget_nothing_is_enforced_or_printed(tmp_path: Path) -> None:
    result = run(suite(tmp_path, {"test_times.py": SLOW}))
    assert result.returncode == 0, result.stdout
    assert "slowest" not in result.stdout


@pytest.mark.parametrize(("files", "message"), [
    ({"test_mark.py": "import pytest\n@pytest.mark.budget\ndef test_x():\n    pass\n"},
     "@pytest.mark.budget needs reason="),
    ({"tests/containers/llm/engine/test_unmarked.py": "def test_x():\n    pass\n"},
     "those marked engine must be the same"),
    ({"test_marked.py": "import pytest\n@pytest.mark.engine\ndef test_x():\n    pass\n"},
     "those marked engine must be the same"),
])
def test_a_mark_without_its_reason_or_an_engine_test_out_of_place_is_refused(
        tmp_path: Path, files: dict[str, str], message: str) -> None:
    result = run(suite(tmp_path, files))
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert message in result.stdout + result.stderr


RECORD = """
import os
import pytest
{mark}
@pytest.mark.parametrize("index", range({count}))
def test_where(index):
    with open("{log}", "a") as log:
        log.write(f"{{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
"""


def test_on_two_workers_the_engine_tier_and_each_module_stay_on_one_worker(
        tmp_path: Path) -> None:
    log = tmp_path / "where.log"
    # The engine tier has fewer tests than any other module: by count (xdist's own order) it
    # would go out last.
    engine = RECORD.format(mark="pytestmark = pytest.mark.engine", log=log, count=2)
    plain = RECORD.format(mark="", log=log, count=20)
    files = {f"tests/containers/llm/engine/test_engine_{n}.py": engine for n in range(3)}
    files.update({f"tests/test_module_{n}.py": plain for n in range(6)})
    result = run(suite(tmp_path, files), "-n", "2", "--dist", "loadscope")
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        module, worker = line.split()
        workers.setdefault(module, set()).add(worker)
    engine_workers = set().union(*(w for m, w in workers.items() if "test_engine_" in m))
    assert len(engine_workers) == 1, workers
    order = [line.split()[0] for line in log.read_text(encoding="utf-8").splitlines()]
    first_engine = next(i for i, module in enumerate(order) if "test_engine_" in module)
    assert first_engine < 40, f"the engine tier goes out first, not after {first_engine} tests"
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2, "both workers took work"
