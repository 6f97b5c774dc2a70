"""Fixtures for the capacity model's tests."""

from __future__ import annotations

import pytest

from capacity_model import LlmCapacity
from stacks.settings import load_settings


@pytest.fixture(scope="module")
def prod() -> LlmCapacity:
    """Production's capacity plan as config/prod.yaml configures it."""
    return load_settings("prod").llm.capacity_plan()
