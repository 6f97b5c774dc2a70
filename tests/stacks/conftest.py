"""Fixtures for the stack tests: each environment's Serving stack template, read from the
session's one synthesis (``synthesized`` in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def prod(synthesized: Any) -> dict[str, Any]:
    """Prod's Serving stack template."""
    return synthesized.template("Prod/Serving")


@pytest.fixture(scope="module")
def dev(synthesized: Any) -> dict[str, Any]:
    """Dev's Serving stack template."""
    return synthesized.template("Dev/Serving")


@pytest.fixture(params=["Dev", "Prod"], scope="module")
def stage(request: pytest.FixtureRequest) -> str:
    """Each environment's stage name in turn (a test module runs once per stage)."""
    return str(request.param)
