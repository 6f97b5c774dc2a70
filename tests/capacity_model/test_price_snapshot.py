"""The dated price snapshot (config/prices.json) and the offer-file extraction behind
``make prices`` (capacity_model/price_snapshot.py)."""

from __future__ import annotations

import json

import pytest

from capacity_model.price_snapshot import SnapshotError, hosting_prices, parse_snapshot
from stacks.settings import REPO_ROOT


def _offer() -> dict[str, object]:
    """A minimal regional SageMaker offer file: two hosting SKUs, a training SKU of the same
    instance that must be ignored."""
    def term(usd: str) -> dict[str, object]:
        return {"T1": {"priceDimensions": {"R1": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}

    return {
        "products": {
            "A": {"attributes": {"usagetype": "APN1-Host:ml.g5.xlarge"}},
            "B": {"attributes": {"usagetype": "APN1-Train:ml.g5.xlarge"}},
            "C": {"attributes": {"usagetype": "APN1-Host:ml.g6e.xlarge"}},
        },
        "terms": {"OnDemand": {"A": term("1.9"), "B": term("1.7"), "C": term("3.4")}},
    }


def test_hosting_prices_take_the_hosting_sku_only() -> None:
    assert hosting_prices(_offer(), ["ml.g5.xlarge", "ml.g6e.xlarge"]) == {
        "ml.g5.xlarge": 1.9, "ml.g6e.xlarge": 3.4}
    with pytest.raises(SnapshotError, match=r"ml\.inf1\.xlarge"):
        hosting_prices(_offer(), ["ml.inf1.xlarge"])


def test_the_committed_snapshot_is_honest_about_what_it_holds() -> None:
    """Either prices with the date they were fetched, or none and a status that says so."""
    snapshot = parse_snapshot(json.loads((REPO_ROOT / "config" / "prices.json").read_text()))
    assert snapshot.region == "ap-northeast-1"
    if snapshot.usd_per_hour:
        assert snapshot.fetched_on and snapshot.status == "fetched"
    else:
        assert snapshot.status == "not fetched" and "NO TOKYO PRICE" in snapshot.note


def test_a_priced_snapshot_must_be_dated() -> None:
    data = {"region": "ap-northeast-1", "fetched_on": None, "status": "fetched", "source": "x",
            "note": "", "usd_per_hour": {"ml.g5.xlarge": 1.9}}
    with pytest.raises(SnapshotError, match="fetched_on"):
        parse_snapshot(data)
    with pytest.raises(SnapshotError, match="keys"):
        parse_snapshot({"region": "x"})
