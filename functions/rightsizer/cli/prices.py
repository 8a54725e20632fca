"""``rightsizer prices --config FILE [--json]``: the on-demand prices plans use in the cluster's region, asked
from the AWS Price List Query API now, beside the packaged catalog's us-east-1 prices (issue 17 "Honest
savings"). Never acts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rightsizer.config import load_config
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.prices import CATALOG, CATALOG_PRICES_DATE, CATALOG_REGION, PriceBook

EXIT_OK, EXIT_FALLBACK = 0, 1


def _report(book: PriceBook) -> dict[str, Any]:
    catalog = load_catalog()
    return {
        "region": book.region,
        "source": book.source,
        "fetched_at": book.fetched_at or None,
        "error": book.error,
        "catalog": {"region": CATALOG_REGION, "date": CATALOG_PRICES_DATE},
        "types": [
            {
                "instance_type": name,
                "usd_per_hour": book.usd_per_hour.get(name) if book.from_api else row.hourly_usd,
                "catalog_usd_per_hour": row.hourly_usd,
            }
            for name, row in sorted(catalog.types.items())
        ],
    }


def cmd_prices(args: argparse.Namespace) -> int:
    """Ask the Price List Query API (``pricing:GetProducts``) for the config's region and print, per catalog
    instance type, the USD per hour plans use there (``null``: not sold on demand in the region) and the
    packaged us-east-1 price.

    Exit codes: 0 the API answered (or ``aws.pricing_api`` is false: the packaged prices are the answer);
    1 it was denied or unreachable (the error is printed; plans price from the packaged catalog);
    2 a bad config file (``ConfigError``, handled by the caller).
    """
    from rightsizer.wiring.builders import build_prices

    config = load_config(args.config)
    region = config.cluster.region or config.aws.region
    if config.aws.pricing_api:
        book = build_prices(config).book(refresh=True)
    else:
        book = PriceBook(region, CATALOG, error="aws.pricing_api is false")
    report = _report(book)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"on-demand Linux USD/hour in {book.region} from {book.source}"
              + (f" at {book.fetched_at}" if book.fetched_at else "")
              + f" (catalog: {CATALOG_REGION} of {CATALOG_PRICES_DATE})")  # fmt: skip
        print(f"{'instance type':<18} {book.region:>14} {CATALOG_REGION:>14}")
        for row in report["types"]:
            here = "not sold" if row["usd_per_hour"] is None else f"{row['usd_per_hour']:.4f}"
            print(f"{row['instance_type']:<18} {here:>14} {row['catalog_usd_per_hour'] or 0:>14.4f}")
    if book.error and config.aws.pricing_api:
        print(f"rightsizer: prices: {book.error}; plans use the packaged catalog", file=sys.stderr)
        return EXIT_FALLBACK
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``prices`` on the ``rightsizer`` sub-command parsers."""
    p = sub.add_parser("prices", help="the region's on-demand prices plans use, asked now (never acts)")
    p.epilog = (
        "exit codes: 0 the Price List answered (or aws.pricing_api is false); 1 it was denied or unreachable "
        "(plans use the packaged catalog); 2 a usage or configuration error (no AWS credentials or region)"
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        required=True,
        help="the config file (docs/policy.md: 'Configuration file')",
    )
    p.add_argument("--json", action="store_true", help="print the prices as one JSON document")
    p.set_defaults(func=cmd_prices)
