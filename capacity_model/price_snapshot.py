"""A dated snapshot of AWS's SageMaker hosting prices for one region (``config/prices.json``).

The snapshot is what ``make prices`` (``python -m tools.prices``) writes from AWS's Price List
bulk API: the regional SageMaker offer file, its on-demand **Hosting** products (usage type
``<region code>-Host:<instance type>``), one USD-per-hour price per instance type, with the date
it was fetched and the URL. :func:`hosting_prices` extracts them from the offer file's JSON;
:func:`parse_snapshot` reads the snapshot back. A snapshot that was never fetched says so in its
``status`` and holds no price: the plan then prices at the catalog's derived rate and says which.

Pure module: standard library only (the fetch lives in ``tools/prices.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OFFER_URL = ("https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/current/"
             "{region}/index.json")
SNAPSHOT_KEYS = {"region", "fetched_on", "status", "source", "note", "usd_per_hour"}


class SnapshotError(ValueError):
    """A snapshot or offer file the plan cannot use; the message names the field and value."""


@dataclass(frozen=True)
class PriceSnapshot:
    """The snapshot: region, when and where it was fetched, and the prices it holds."""

    region: str
    fetched_on: str | None
    status: str
    source: str
    note: str
    usd_per_hour: Mapping[str, float]

    def rate_of(self, instance_type: str) -> float | None:
        """The snapshot's price for ``instance_type``, None when it holds none."""
        return self.usd_per_hour.get(instance_type)

    def basis(self) -> str:
        """How a report names the snapshot's price."""
        return f"AWS price list for {self.region}, fetched {self.fetched_on} ({self.source})"


def parse_snapshot(data: Any) -> PriceSnapshot:
    """The snapshot's JSON; SnapshotError names what is wrong."""
    if not isinstance(data, dict) or set(data) != SNAPSHOT_KEYS:
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise SnapshotError(f"price snapshot: keys {found}; accepted: exactly "
                            f"{sorted(SNAPSHOT_KEYS)}")
    prices = data["usd_per_hour"]
    if not isinstance(prices, dict) or not all(
            isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in prices.values()):
        raise SnapshotError(f"price snapshot usd_per_hour: {prices!r}; accepted: instance type "
                            "to a price > 0")
    if prices and not data["fetched_on"]:
        raise SnapshotError("price snapshot fetched_on: None; accepted: the date the prices "
                            "were fetched (a snapshot with prices must be dated)")
    return PriceSnapshot(region=str(data["region"]), fetched_on=data["fetched_on"],
                         status=str(data["status"]), source=str(data["source"]),
                         note=str(data["note"]),
                         usd_per_hour={str(k): float(v) for k, v in prices.items()})


def _hosting_skus(products: Mapping[str, Any], wanted: set[str]) -> dict[str, str]:
    """SKU → instance type of the on-demand hosting products of ``wanted`` types."""
    skus = {}
    for sku, product in products.items():
        attributes = product.get("attributes", {})
        usage = str(attributes.get("usagetype", ""))
        if "-Host:" not in usage:
            continue
        instance = usage.split("-Host:", 1)[1]
        if instance in wanted:
            skus[sku] = instance
    return skus


def hosting_prices(offer: Mapping[str, Any], instance_types: Iterable[str]) -> dict[str, float]:
    """USD per hour of each of ``instance_types`` as a SageMaker real-time (Hosting) instance in
    the offer file ``offer`` (its ``products`` and ``terms.OnDemand``); SnapshotError when one
    is missing or priced twice."""
    wanted = set(instance_types)
    skus = _hosting_skus(offer.get("products", {}), wanted)
    on_demand = offer.get("terms", {}).get("OnDemand", {})
    prices: dict[str, float] = {}
    for sku, instance in skus.items():
        for term in on_demand.get(sku, {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", "nan"))
                if not (math.isfinite(usd) and usd > 0):
                    continue
                if instance in prices and prices[instance] != usd:
                    raise SnapshotError(f"offer file: {instance} priced twice ({prices[instance]}"
                                        f" and {usd}); accepted: one on-demand hosting price")
                prices[instance] = usd
    missing = sorted(wanted - set(prices))
    if missing:
        raise SnapshotError(f"offer file: no on-demand hosting price for {missing}")
    return prices
