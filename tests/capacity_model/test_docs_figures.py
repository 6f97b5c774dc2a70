"""The capacity figures docs/capacity.md quotes are the model's own output: every
quoted line of ``python -m tools.capacity plan --env prod`` is in what it prints now, and the pool
table is what ``pools`` prints. (The priced figures are checked in tests/tools/test_cost_report.py
against a fresh ``make cost`` run.)"""

from __future__ import annotations

import re

import pytest

from capacity_model import LlmCapacity
from capacity_model.pools import evaluate_pools, seed_002_options
from capacity_model.report import format_capacity, format_pools
from stacks.settings import REPO_ROOT, Environment

CAPACITY_DOC = REPO_ROOT / "docs" / "capacity.md"


def quoted_plan_lines() -> list[str]:
    """Lines of docs/capacity.md's ```text blocks, which all quote the plan."""
    text = CAPACITY_DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n(.*?)\n```", text, re.DOTALL)
    return [line for block in blocks for line in block.splitlines()
            if line.strip() and not line.startswith("$ ")]


@pytest.fixture(scope="module")
def printed(prod_capacity: LlmCapacity) -> str:
    return format_capacity(prod_capacity)


def test_every_quoted_plan_line_is_printed_now(printed: str) -> None:
    lines = quoted_plan_lines()
    assert len(lines) > 10, "not vacuous"
    stale = [line for line in lines if line not in printed.splitlines()]
    assert stale == [], f"quoted plan lines the model no longer prints: {stale}"


def test_the_pool_table_is_what_pools_prints(prod_environment: Environment) -> None:
    settings = prod_environment.settings.llm
    table = format_pools(evaluate_pools(prod_environment.plans.llm_capacity, settings.memory_plan,
                                        settings.decode_speed_table(),
                                        seed_002_options(settings.instance_type,
                                                         "ml.g6e.xlarge")))
    document = CAPACITY_DOC.read_text(encoding="utf-8").splitlines()
    rows = table.splitlines()
    assert len(rows) == 6
    assert all(row in document for row in rows), [r for r in rows if r not in document]
