"""Fixtures for the capacity model's tests."""

from __future__ import annotations

import pytest

from capacity_model import LlmCapacity


@pytest.fixture(scope="module")
def prod(prod_capacity: LlmCapacity) -> LlmCapacity:
    """Production's capacity plan (tests/conftest.py's ``prod_capacity``), as these tests name it."""
    return prod_capacity
