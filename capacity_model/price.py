"""The planned fleet's month over the expected day, beside Seed 001's two fleets
(docs/design-decisions.md#before-fleet).

Seed 001 (user story 4, "Idle GPU Waste in Off-Peak Hours") prices its LLM fleet twice:
**before**, 4 ``ml.g5.xlarge`` always on; **after** (its final fleet), 2 of them during the 5
off-peak hours a night and 4 otherwise ("After: 2 instances off-peak ... × 5hrs × 30days"). The
plan's own fleet runs, each hour of the expected day (no release), the hour's floor or what its
load needs at the target (:func:`capacity_model.pools.expected_day_instances`). All three are
priced at one hourly rate — the instance's on-demand price in the catalog
(:mod:`gpu_budget.instances`, whose basis the report names) — over AWS's 730-hour month.

Pure module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SEED_BEFORE_INSTANCES = 4
SEED_AFTER_NIGHT_INSTANCES, SEED_AFTER_NIGHT_HOURS = 2, 5
HOURS_PER_MONTH = 730
HOURS_PER_DAY = 24


@dataclass(frozen=True)
class PriceComparison:
    """The plan's month and the seed's two fleets' at the same rate (USD)."""

    usd_per_hour: float
    rate_basis: str
    plan_instance_hours_per_day: int
    plan_monthly_usd: float
    seed_before_monthly_usd: float
    seed_final_monthly_usd: float

    @property
    def against_before(self) -> float:
        """The plan's month over the seed's "before", minus 1."""
        return self.plan_monthly_usd / self.seed_before_monthly_usd - 1

    @property
    def against_final(self) -> float:
        """The plan's month over the seed's final fleet, minus 1."""
        return self.plan_monthly_usd / self.seed_final_monthly_usd - 1


def monthly_usd(instance_hours_per_day: float, usd_per_hour: float) -> float:
    """A day's instance-hours as a 730-hour month."""
    return instance_hours_per_day * usd_per_hour * HOURS_PER_MONTH / HOURS_PER_DAY


def price_comparison(hourly_instances: Sequence[int], usd_per_hour: float,
                     rate_basis: str) -> PriceComparison:
    """Price the plan's expected day (``hourly_instances``, one per hour) and the seed's
    fleets at ``usd_per_hour``; ValueError when the day is not 24 whole hours or the rate not
    positive."""
    if len(hourly_instances) != HOURS_PER_DAY or any(n < 0 for n in hourly_instances):
        raise ValueError(f"hourly_instances: {list(hourly_instances)!r}; accepted: 24 counts "
                         ">= 0, one per hour")
    if not usd_per_hour > 0:
        raise ValueError(f"usd_per_hour: {usd_per_hour!r}; accepted: a price > 0")
    hours = sum(hourly_instances)
    final = (SEED_BEFORE_INSTANCES * (HOURS_PER_DAY - SEED_AFTER_NIGHT_HOURS)
             + SEED_AFTER_NIGHT_INSTANCES * SEED_AFTER_NIGHT_HOURS)
    return PriceComparison(
        usd_per_hour=usd_per_hour, rate_basis=rate_basis, plan_instance_hours_per_day=hours,
        plan_monthly_usd=round(monthly_usd(hours, usd_per_hour), 0),
        seed_before_monthly_usd=round(monthly_usd(SEED_BEFORE_INSTANCES * HOURS_PER_DAY,
                                                  usd_per_hour), 0),
        seed_final_monthly_usd=round(monthly_usd(final, usd_per_hour), 0))
