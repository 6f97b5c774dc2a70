"""The suite's own time guard and its two-worker layout (registered by tests/conftest.py).

``make test`` runs pytest on two xdist workers with ``--test-budget 60``. Three rules keep it fast:

* **The real-engine tier stays on one worker, each other module on one worker.** With xdist,
  ``ModuleScheduling`` hands out whole modules (a module's fixtures are set up once, not once per
  worker) and the tier's folder, ``tests/containers/llm/engine/``, as one unit: it runs one engine
  module at a time, as it was written to, while the other worker takes the rest of the suite.
  (xdist's own ``loadgroup`` cannot do this under pytest 9.2: it renames ``item._nodeid``, which
  pytest 9 no longer reads.) Every test in that folder must be marked ``engine`` and none
  outside it, so ``make test-engine`` (``-m engine``) and the scheduler agree.
* **A test over the budget says why.** A test whose setup, call and teardown together take longer
  than ``--test-budget`` seconds must carry ``@pytest.mark.budget(reason=...)`` (or a module's
  ``pytestmark``); one that does not fails the run, naming it, so a slow test is a decision
  written beside it, not an accident found later.
* **The run prints its slowest tests**, with the reason of each one over the budget.

Without ``--test-budget`` (a developer's targeted run) nothing is enforced or printed.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

REASON_PROPERTY = "budget_reason"
SLOWEST = 10
ENGINE_TIER = "tests/containers/llm/engine/"
"""The real-engine tier's folder: one unit of work for the scheduler."""


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: the engine tier, or its module."""
    return ENGINE_TIER if nodeid.startswith(ENGINE_TIER) else nodeid.split("::", 1)[0]


def add_option(parser: pytest.Parser) -> None:
    """``--test-budget SECONDS`` (tests/conftest.py's pytest_addoption calls this)."""
    parser.addoption(
        "--test-budget", type=float, default=None, metavar="SECONDS",
        help="fail the run when a test without @pytest.mark.budget(reason=...) takes longer "
             "than SECONDS (setup, call and teardown together); print the slowest tests")


def budget_reason(item: pytest.Item) -> str | None:
    """The reason a test may exceed the budget, or None. A ``budget`` mark without a non-empty
    ``reason`` is an error: the reason is the point of the mark."""
    mark = item.get_closest_marker("budget")
    if mark is None:
        return None
    reason = mark.kwargs.get("reason", mark.args[0] if mark.args else "")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.budget needs reason='why this "
                                "test takes longer than the budget'")
    return reason.strip()


class BudgetGuard:
    """Collects each test's time (all phases) and budget reason; reports and enforces."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.budget: float | None = config.getoption("--test-budget")
        self.durations: dict[str, float] = {}
        self.reasons: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Every ``budget`` mark has its reason; the engine tier's folder and the ``engine``
        mark name the same tests."""
        for item in items:
            budget_reason(item)
            in_tier = work_unit(item.nodeid) == ENGINE_TIER
            if in_tier != (item.get_closest_marker("engine") is not None):
                raise pytest.UsageError(
                    f"{item.nodeid}: the tests under {ENGINE_TIER} and those marked engine must "
                    "be the same (mark it, or move it)")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Carry the budget reason on the report: under xdist the controlling process, which
        sums the times, has no items to read marks from."""
        report = yield
        reason = budget_reason(item)
        if reason is not None and report.when == "call":
            report.user_properties.append((REASON_PROPERTY, reason))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        for name, value in report.user_properties:
            if name == REASON_PROPERTY:
                self.reasons[report.nodeid] = str(value)

    def over_budget(self) -> list[tuple[str, float, str | None]]:
        """Every test over the budget, slowest first, with its reason (None: it has none)."""
        if self.budget is None:
            return []
        over = [(nodeid, seconds, self.reasons.get(nodeid))
                for nodeid, seconds in self.durations.items() if seconds > self.budget]
        return sorted(over, key=lambda entry: -entry[1])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The ten slowest tests (setup + call + teardown), then the budget's verdict."""
        if self.budget is None or not self.durations:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"the {SLOWEST} slowest tests (setup + call + teardown)")
        slowest = sorted(self.durations.items(), key=lambda entry: -entry[1])[:SLOWEST]
        for nodeid, seconds in slowest:
            note = f"  [budget: {self.reasons[nodeid]}]" if nodeid in self.reasons else ""
            write(f"{seconds:7.1f} s  {nodeid}{note}")
        unexplained = [(nodeid, s) for nodeid, s, reason in self.over_budget() if reason is None]
        if unexplained:
            terminalreporter.section("over the per-test budget without a reason", red=True)
        for nodeid, seconds in unexplained:
            write(f"{seconds:7.1f} s > {self.budget:g} s  {nodeid}: make it faster, or mark it "
                  "@pytest.mark.budget(reason=...)")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A test over the budget without a reason fails the run (in the controlling process:
        a worker holds only its own share of the times)."""
        if hasattr(self.config, "workerinput"):
            return
        unexplained = any(reason is None for _, _, reason in self.over_budget())
        if unexplained and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def module_scheduling(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler for ``make test``: whole modules, and the engine tier as one unit
    (``pytest_xdist_make_scheduler``; tests/conftest.py registers it where xdist is loaded)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """LoadScopeScheduling whose scope is a module, or the engine tier's folder, which goes
        out first: it is the longest unit, and the other worker fills in around it."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if ENGINE_TIER in self.workqueue:
                self.workqueue.move_to_end(ENGINE_TIER, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


class XdistScheduling:
    """The plugin that hands xdist the module scheduler when ``--dist loadscope`` is asked for
    (an object of its own: the hook exists only where xdist is installed)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist") != "loadscope":
            return None
        return module_scheduling(config, log)
