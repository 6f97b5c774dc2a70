"""The LLM target's capacity model as the requirements describe it
(docs/design-decisions.md#release-calendar), for the calendar tests."""

from __future__ import annotations

import datetime as dt

from release_calendar import CapacityModel, DailyFloor


def seed_llm_model(*, timezone: str = "Asia/Tokyo", max_capacity: int = 20) -> CapacityModel:
    """600 invocations/min at release hours, 200 per instance, 30 % headroom, floors 2-6 / 4-20."""
    return CapacityModel(
        base_invocations_per_min=600, per_instance_invocations_per_min=200, headroom=0.3,
        min_capacity=2, max_capacity=max_capacity, timezone=timezone,
        off_peak=DailyFloor("off-peak", dt.time(1, 0), 2, 6),
        business_hours=DailyFloor("business-hours", dt.time(8, 0), 4, min(20, max_capacity)))
