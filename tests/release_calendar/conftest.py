"""Shared fixtures for the release-calendar tests: the LLM target's capacity model as the
requirements describe it (docs/design-decisions.md#release-calendar), and a way to write calendars
as Python data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from release_calendar import CapacityModel
from tests.release_calendar.seed_models import seed_llm_model


@pytest.fixture
def llm_model() -> CapacityModel:
    return seed_llm_model()


@pytest.fixture
def models(llm_model: CapacityModel) -> dict[str, CapacityModel]:
    return {"llm": llm_model}


@pytest.fixture
def calendar_yaml() -> Callable[..., str]:
    """Render a calendar document; entries default to one target (llm) and a 2 h window."""

    def render(*, recurring: list[dict[str, Any]] | None = None,
               seasonal: list[dict[str, Any]] | None = None,
               dated: list[dict[str, Any]] | None = None,
               timezone: str = "Asia/Tokyo") -> str:
        def fill(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
            defaults = {"duration_min": 120, "multiplier": 2.0, "targets": ["llm"]}
            return [{**defaults, **entry} for entry in entries or []]

        document = {"version": 1, "timezone": timezone, "recurring": fill(recurring),
                    "seasonal": fill(seasonal), "dated": fill(dated)}
        return yaml.safe_dump(document, sort_keys=False)

    return render
