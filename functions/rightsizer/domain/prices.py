"""On-demand prices of one region and where they came from (issue 17 "Honest savings", docs/architecture.md §3
"Pricing").

Pure: a :class:`PriceBook` is what the AWS Price List Query API answered for the cluster's region (read by
``rightsizer.adapters.pricing``, carried in the snapshot's ``instances.json`` as ``OnDemandPrices``), or why
it could not answer. The catalog applies it (``Catalog.with_prices``); the planner names the source of
every node's price in its reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: The region whose prices the packaged catalog holds (``ec2-gpu-instances.csv``).
CATALOG_REGION: Final = "us-east-1"
#: The date of the packaged prices (Karpenter's ``zz_generated.pricing_aws.go``, see CATALOG-PROVENANCE.md).
CATALOG_PRICES_DATE: Final = "2026-07-20"
#: ``PriceBook.source`` of prices read from the Price List Query API (``pricing:GetProducts``).
PRICING_API: Final = "pricing_api"
#: ``PriceBook.source`` when the API did not answer: the packaged catalog prices every node.
CATALOG: Final = "catalog"


@dataclass(frozen=True, slots=True)
class PriceBook:
    """On-demand Linux, shared-tenancy prices of the catalog's instance types in ``region``.

    ``usd_per_hour`` maps instance type → USD per hour, as the Price List Query API published it; a type
    missing from a ``pricing_api`` book is not sold on demand in the region (the API's answer for the
    region is complete: every Compute Instance product was read). ``source`` is :data:`PRICING_API` or
    :data:`CATALOG` (the API was denied, unreachable or answered nothing: ``error`` says which).
    ``fetched_at`` is the RFC 3339 instant of the answer (empty for the catalog).
    """

    region: str
    source: str
    usd_per_hour: Mapping[str, float] = field(default_factory=dict)
    fetched_at: str = ""
    error: str | None = None

    @property
    def from_api(self) -> bool:
        """True when the API priced the region (and its answer is therefore complete)."""
        return self.source == PRICING_API and bool(self.usd_per_hour)

    def document(self) -> dict[str, Any]:
        """The ``OnDemandPrices`` object of ``instances.json`` (docs/architecture.md §5)."""
        return {
            "Region": self.region,
            "Source": self.source,
            "FetchedAt": self.fetched_at,
            "UsdPerHour": dict(sorted(self.usd_per_hour.items())),
            "Error": self.error,
        }


def price_reason(book: PriceBook | None, node_region: str, instance_type: str) -> str:
    """The reason naming who priced a node of ``instance_type`` in ``node_region`` on demand.

    ``priced_on_demand:pricing_api:<region>`` (the API's price for the node's region),
    ``priced_on_demand:catalog:us-east-1:<date>`` (a us-east-1 node priced by the packaged catalog), or
    ``price_region_fallback:<region>`` (any other region priced by the packaged us-east-1 catalog, because
    the API was not asked, did not answer or did not list the type).
    """
    if (
        book is not None
        and book.from_api
        and book.region == node_region
        and instance_type in book.usd_per_hour
    ):
        return f"priced_on_demand:{PRICING_API}:{node_region}"
    if node_region == CATALOG_REGION:
        return f"priced_on_demand:{CATALOG}:{CATALOG_REGION}:{CATALOG_PRICES_DATE}"
    return f"price_region_fallback:{node_region}"
