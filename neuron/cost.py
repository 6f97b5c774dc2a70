"""The cost comparison for the intent classifier: g4dn (GPU) against inf1 (Inferentia).

The DistilBERT classifier ran on 4 × ml.g4dn.xlarge and moved to 2 × ml.inf1.xlarge
(docs/design-decisions.md#intent-on-inferentia; the ``SEED_*`` constants are that story's
figures). The comparison is a plain function of hourly prices and instance counts, so it is
recomputed from the platform's instance catalog (``gpu_budget.instance_type(name)
.on_demand_usd_per_hour``, approximate ap-northeast-1 on-demand prices) instead of the story's
typed-in ones. ``python -m neuron.cost`` prints it; ``--gpu-price`` / ``--inferentia-price``
override the catalog (the story's own figures: 0.736 and 0.228, with ``--hours-per-month 720``).

Pure module, Python 3.10-compatible.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

HOURS_PER_MONTH = 730.0
"""AWS's monthly convention (8,760 h / 12), the same as gpu_budget's catalog."""

SEED_HOURS_PER_MONTH = 720.0
"""30 days × 24 h: the month the story's "$1,790/month" uses (2.488 $/h × 720 h ≈ $1,791)."""

SEED_GPU_INSTANCE = "ml.g4dn.xlarge"
SEED_GPU_COUNT = 4
SEED_INFERENTIA_INSTANCE = "ml.inf1.xlarge"
SEED_INFERENTIA_COUNT = 2


@dataclass(frozen=True)
class FleetCost:
    """A fleet of identical instances."""

    instance_type: str
    count: int
    price_per_hour_usd: float

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"{self.instance_type}: count {self.count!r} must be at least 1")
        if not (math.isfinite(self.price_per_hour_usd) and self.price_per_hour_usd > 0):
            raise ValueError(f"{self.instance_type}: price_per_hour_usd "
                             f"{self.price_per_hour_usd!r} must be a positive number")

    @property
    def per_hour_usd(self) -> float:
        """Whole fleet, per hour."""
        return self.count * self.price_per_hour_usd


@dataclass(frozen=True)
class InferentiaSaving:
    """GPU fleet before, Inferentia fleet after, and what the move saves."""

    before: FleetCost
    after: FleetCost
    hours_per_month: float = HOURS_PER_MONTH

    @property
    def saving_per_hour_usd(self) -> float:
        """Hourly saving (negative if Inferentia costs more)."""
        return self.before.per_hour_usd - self.after.per_hour_usd

    @property
    def saving_per_month_usd(self) -> float:
        """Saving over ``hours_per_month``."""
        return self.saving_per_hour_usd * self.hours_per_month

    @property
    def saving_fraction(self) -> float:
        """Share of the GPU fleet's cost saved (0.845 = 84.5 %)."""
        return self.saving_per_hour_usd / self.before.per_hour_usd

    @property
    def per_instance_price_ratio(self) -> float:
        """Inferentia instance price ÷ GPU instance price (the story: "70 % less" ⇔ ≈ 0.3)."""
        return self.after.price_per_hour_usd / self.before.price_per_hour_usd

    def report(self) -> str:
        """The comparison as the story wrote it, recomputed."""
        return "\n".join([
            f"Before: {self.before.instance_type} ${self.before.price_per_hour_usd:.3f}/h "
            f"× {self.before.count} = ${self.before.per_hour_usd:.3f}/h",
            f"After:  {self.after.instance_type} ${self.after.price_per_hour_usd:.3f}/h "
            f"× {self.after.count} = ${self.after.per_hour_usd:.3f}/h",
            f"Saving: ${self.saving_per_hour_usd:.3f}/h → "
            f"${self.saving_per_month_usd:,.0f}/month ({self.hours_per_month:g} h), "
            f"{self.saving_fraction:.1%} of the GPU fleet; one {self.after.instance_type} costs "
            f"{self.per_instance_price_ratio:.0%} of one {self.before.instance_type}",
        ])


def compare_fleets(*, gpu_price_per_hour_usd: float, inferentia_price_per_hour_usd: float,
                   gpu_instance: str = SEED_GPU_INSTANCE, gpu_count: int = SEED_GPU_COUNT,
                   inferentia_instance: str = SEED_INFERENTIA_INSTANCE,
                   inferentia_count: int = SEED_INFERENTIA_COUNT,
                   hours_per_month: float = HOURS_PER_MONTH) -> InferentiaSaving:
    """The comparison for the given hourly prices (fleet sizes default to the story's)."""
    if not (math.isfinite(hours_per_month) and hours_per_month > 0):
        raise ValueError(f"hours_per_month: {hours_per_month!r} must be a positive number")
    return InferentiaSaving(
        before=FleetCost(gpu_instance, gpu_count, gpu_price_per_hour_usd),
        after=FleetCost(inferentia_instance, inferentia_count, inferentia_price_per_hour_usd),
        hours_per_month=hours_per_month,
    )


@dataclass(frozen=True)
class CatalogPrice:
    """One instance type's price as the platform's catalog states it."""

    usd_per_hour: float
    basis: str
    """"list" (from AWS's price list) or "derived" (EC2 price × SageMaker markup)."""
    region: str


def catalog_price(instance_type: str) -> CatalogPrice | None:
    """The on-demand price from ``gpu_budget``'s instance catalog; None if it is not importable.

    An instance type the catalog does not know raises its own error (naming the known ones).
    """
    try:
        catalog = importlib.import_module("gpu_budget")
    except ImportError:
        return None
    entry = catalog.instance_type(instance_type)
    return CatalogPrice(usd_per_hour=float(entry.on_demand_usd_per_hour),
                        basis=str(entry.price_basis), region=str(entry.price_region))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison; prices from the catalog unless given on the command line."""
    parser = argparse.ArgumentParser(prog="python -m neuron.cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-instance", default=SEED_GPU_INSTANCE)
    parser.add_argument("--gpu-count", type=int, default=SEED_GPU_COUNT)
    parser.add_argument("--inferentia-instance", default=SEED_INFERENTIA_INSTANCE)
    parser.add_argument("--inferentia-count", type=int, default=SEED_INFERENTIA_COUNT)
    parser.add_argument("--gpu-price", type=float, help="USD per hour (default: the catalog)")
    parser.add_argument("--inferentia-price", type=float,
                        help="USD per hour (default: the catalog)")
    parser.add_argument("--hours-per-month", type=float, default=HOURS_PER_MONTH)
    args = parser.parse_args(argv)
    sources: list[str] = []
    prices: list[float | None] = []
    for name, given in ((args.gpu_instance, args.gpu_price),
                        (args.inferentia_instance, args.inferentia_price)):
        if given is not None:
            prices.append(given)
            sources.append(f"{name}: given on the command line")
            continue
        try:
            found = catalog_price(name)
        except (KeyError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        prices.append(None if found is None else found.usd_per_hour)
        if found is not None:
            sources.append(f"{name}: gpu_budget catalog, {found.region} on-demand, "
                           f"{found.basis} price")
    gpu_price, inf_price = prices
    if gpu_price is None or inf_price is None:
        print("error: no price for "
              f"{args.gpu_instance if gpu_price is None else args.inferentia_instance}: the "
              "gpu_budget catalog is not importable; pass --gpu-price and --inferentia-price",
              file=sys.stderr)
        return 2
    try:
        saving = compare_fleets(gpu_price_per_hour_usd=gpu_price,
                                inferentia_price_per_hour_usd=inf_price,
                                gpu_instance=args.gpu_instance, gpu_count=args.gpu_count,
                                inferentia_instance=args.inferentia_instance,
                                inferentia_count=args.inferentia_count,
                                hours_per_month=args.hours_per_month)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(saving.report())
    print("Prices: " + "; ".join(sources))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
