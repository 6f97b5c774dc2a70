"""``python -m tools.prices``: refresh ``config/prices.json`` from AWS's Price List bulk API.

Fetches the regional SageMaker offer file (:data:`capacity_model.price_snapshot.OFFER_URL`; tens
of MB, needs network access to ``pricing.us-east-1.amazonaws.com``, no credentials), keeps the
on-demand hosting price of every instance type in the ``gpu_budget`` catalog that the offer
prices, and writes the dated snapshot. ``make prices`` runs it. Exit codes: 0 written, 1 the
fetch or the offer file failed (the snapshot is left as it was).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import urllib.request
from collections.abc import Sequence

from capacity_model.price_snapshot import OFFER_URL, SnapshotError, hosting_prices
from stacks.settings import REPO_ROOT

SNAPSHOT = REPO_ROOT / "config" / "prices.json"
PRICED = ("ml.g5.xlarge", "ml.g6e.xlarge", "ml.inf1.xlarge", "ml.g4dn.xlarge")


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch, extract, write."""
    parser = argparse.ArgumentParser(prog="tools.prices", description=__doc__)
    parser.add_argument("--region", default="ap-northeast-1")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    url = OFFER_URL.format(region=args.region)
    try:
        with urllib.request.urlopen(url, timeout=args.timeout_s) as response:
            offer = json.load(response)
        prices = hosting_prices(offer, PRICED)
    except (OSError, ValueError, SnapshotError) as error:
        print(f"tools.prices: {url}: {error}; {SNAPSHOT} left as it was", file=sys.stderr)
        return 1
    snapshot = {
        "region": args.region, "fetched_on": dt.date.today().isoformat(),
        "status": "fetched", "source": url,
        "note": "on-demand SageMaker real-time inference (Hosting) prices, USD per instance-hour",
        "usd_per_hour": dict(sorted(prices.items())),
    }
    SNAPSHOT.write_text(json.dumps(snapshot, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(prices)} prices to {SNAPSHOT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
