"""The plan's month beside Seed 001's two fleets (capacity_model/price.py)."""

from __future__ import annotations

import pytest

from capacity_model import LlmCapacity
from capacity_model.price import monthly_usd, price_comparison
from capacity_model.report import format_capacity, plan_price


def test_the_seeds_fleets_at_one_rate() -> None:
    """Seed 001's before (4 always on) and final fleet (2 for 5 night hours, 4 otherwise):
    at its own $1.41/h they are its $5.64/h and $2.82/h × 5 h × 30 days less."""
    price = price_comparison([3] * 24, 1.41, "Seed 001's")
    assert price.seed_before_monthly_usd == pytest.approx(4 * 1.41 * 730, abs=1)
    saving = price.seed_before_monthly_usd - price.seed_final_monthly_usd
    assert saving == pytest.approx(2 * 1.41 * 5 * 730 / 24, abs=1)  # ≈ the seed's $423
    assert price.plan_monthly_usd == pytest.approx(monthly_usd(72, 1.41), abs=1)
    assert price.against_before == pytest.approx(72 / 96 - 1, abs=0.01)
    assert price.against_final == pytest.approx(72 / 86 - 1, abs=0.01)


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="hourly_instances"):
        price_comparison([1] * 23, 1.0, "x")
    with pytest.raises(ValueError, match="usd_per_hour"):
        price_comparison([1] * 24, 0.0, "x")


def test_the_plan_prints_both_comparisons(prod: LlmCapacity) -> None:
    price = plan_price(prod)
    printed = format_capacity(prod)
    assert f"${price.seed_final_monthly_usd:,.0f}" in printed
    assert f"${price.seed_before_monthly_usd:,.0f}" in printed
    assert "not a looked-up Tokyo price" in printed
