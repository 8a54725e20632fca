"""On-demand prices of the cluster's region from the AWS Price List Query API, cached, with the packaged
catalog as fallback (issue 17 "Honest savings", docs/architecture.md §3 "Pricing").

The bar is Karpenter's pricing provider (aws/karpenter-provider-aws ``pkg/providers/pricing/pricing.go``
@ 09303f32, Apache-2.0): it calls ``pricing:GetProducts`` at run time from the endpoint nearest the
cluster's region, refreshes every 12 hours, keeps the last good answer when a refresh fails, and starts
from packaged static prices. This adapter does the same for the catalog's GPU instance types:

- ``GetProducts`` on ``AmazonEC2`` with the filters ``regionCode``, ``productFamily=Compute Instance``,
  ``operatingSystem=Linux``, ``tenancy=Shared``, ``preInstalledSw=NA``, ``capacitystatus=Used``,
  ``marketoption=OnDemand`` (without it a Capacity Block product prices a p5.48xlarge at 0.00) and
  ``licenseModel=No License required``; every page (100 products each) is read, so a catalog type the
  answer lacks is not sold on demand in the region.
- Each ``PriceList`` entry is a JSON string: ``product.attributes.instanceType`` and
  ``terms.OnDemand.<offer>.priceDimensions.<rate>.pricePerUnit.USD`` per ``Hrs`` (the Price List
  Query API's documented ``aws_v1`` format). A product whose attributes contradict a filter is ignored,
  and a type with two different prices is left unpriced rather than guessed.
- A denied (``AccessDeniedException``), unreachable or empty answer gives a ``catalog`` book naming the
  error: the planner then prices from the packaged catalog and says so in every node's reasons.

IAM: ``pricing:GetProducts`` supports no resource-level permissions (Service Authorization Reference,
"Actions defined by AWS Price List": no resource types), so the grant's ``Resource`` is ``"*"``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from rightsizer.adapters.aws_errors import environment_error
from rightsizer.domain.prices import CATALOG, PRICING_API, PriceBook

log = logging.getLogger(__name__)

#: The AWS actions this module calls (``tests/integration/test_iam.py`` checks them both ways).
IAM_ACTIONS: Final = frozenset({"pricing:GetProducts"})

#: How long an answer is used before it is asked again (Karpenter refreshes on-demand prices every 12 h).
REFRESH_SECONDS: Final = 12 * 3600.0
#: How long a failed answer (denied, unreachable) is kept before the API is asked again.
RETRY_SECONDS: Final = 15 * 60.0
#: The filters every product must match (Field → Value, ``TERM_MATCH``); ``regionCode`` is added per call.
PRODUCT_FILTERS: Final = {
    "productFamily": "Compute Instance",
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
    "licenseModel": "No License required",
}


def pricing_endpoint_region(region: str) -> str:
    """The Price List Query API endpoint region for a cluster in ``region``.

    The API is served only from us-east-1, eu-central-1 and ap-south-1 (cn-northwest-1 in China);
    Karpenter's rule (``pricing.NewAPI``): ``ap-*`` → ap-south-1, ``cn-*`` → cn-northwest-1, ``eu-*`` →
    eu-central-1, everything else us-east-1.
    """
    for prefix, endpoint in (("ap-", "ap-south-1"), ("cn-", "cn-northwest-1"), ("eu-", "eu-central-1")):
        if region.startswith(prefix):
            return endpoint
    return "us-east-1"


def _hourly(terms: Mapping[str, Any], currency: str) -> set[float]:
    prices: set[float] = set()
    for offer in (terms.get("OnDemand") or {}).values():
        for dimension in (offer.get("priceDimensions") or {}).values():
            if dimension.get("unit") not in (None, "Hrs"):
                continue
            try:
                price = float((dimension.get("pricePerUnit") or {})[currency])
            except (KeyError, TypeError, ValueError):
                continue
            if price > 0:  # 0.00 is a Capacity Block or free-tier product, never an on-demand price
                prices.add(price)
    return prices


def parse_price_list(
    items: Iterable[str], region: str, instance_types: Collection[str], *, currency: str = "USD"
) -> dict[str, float]:
    """USD per hour by instance type from ``GetProducts`` ``PriceList`` entries (JSON strings).

    Keeps the types in ``instance_types`` whose product matches ``region`` and :data:`PRODUCT_FILTERS`;
    an entry that is not JSON, carries no instance type or no positive hourly price is skipped, and a type
    priced twice differently is left out (no guess).
    """
    found: dict[str, set[float]] = {}
    for item in items:
        try:
            product = json.loads(item)
            attributes = product["product"]["attributes"]
        except (ValueError, KeyError, TypeError):
            continue
        name = attributes.get("instanceType")
        if name not in instance_types or attributes.get("regionCode", region) != region:
            continue
        if any(attributes.get(k, v) != v for k, v in PRODUCT_FILTERS.items() if k != "productFamily"):
            continue
        found.setdefault(name, set()).update(_hourly(product.get("terms") or {}, currency))
    prices = {name: next(iter(p)) for name, p in found.items() if len(p) == 1}
    for name in sorted(n for n, p in found.items() if len(p) > 1):
        log.warning("price list: %s has %d different on-demand prices in %s; left unpriced",
                    name, len(found[name]), region)  # fmt: skip
    return prices


class PriceListPrices:
    """The on-demand price book of one region, read from the Price List Query API and cached.

    ``client`` is a boto3 ``pricing`` client (endpoint :func:`pricing_endpoint_region`); ``instance_types``
    the catalog's types to keep. ``book()`` answers from the cache while it is younger than
    ``refresh_s`` (a failure: ``retry_s``); a failed refresh keeps the last good answer (Karpenter's rule)
    and otherwise yields a ``catalog`` book with the error. Thread-safe; one instance per warm container.
    """

    def __init__(
        self,
        client: Any,
        region: str,
        instance_types: Collection[str],
        *,
        refresh_s: float = REFRESH_SECONDS,
        retry_s: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._client = client
        self.region = region
        self._types = frozenset(instance_types)
        self._refresh_s, self._retry_s = refresh_s, retry_s
        self._clock, self._now = clock, now
        self._lock = threading.Lock()
        self._book: PriceBook | None = None
        self._expires = 0.0
        self.calls = 0  # GetProducts pages asked for (tests and ``rightsizer prices`` count them)

    def book(self, *, refresh: bool = False) -> PriceBook:
        """The region's price book (cached; ``refresh`` asks the API now).

        Raises:
            ConfigError: with ``refresh`` only, no AWS credentials, region or profile (``environment_error``);
                otherwise every failure is the packaged catalog's book with its ``error``.
        """
        with self._lock:
            if not refresh and self._book is not None and self._clock() < self._expires:
                return self._book
            try:
                prices = self._fetch()
                error = (
                    None if prices else f"no on-demand Linux product of the catalog's types in {self.region}"
                )
            except (BotoCoreError, ClientError) as exc:
                if refresh and (setup := environment_error(exc)) is not None:
                    raise setup from exc  # asked now (`rightsizer prices`): no credentials is the caller's to fix
                prices, error = {}, _describe(exc)
            if prices:
                self._book = PriceBook(self.region, PRICING_API, prices, _rfc3339(self._now()))
                self._expires = self._clock() + self._refresh_s
            else:
                log.warning("price list: %s; pricing from the packaged catalog", error)
                if self._book is None or not self._book.from_api:
                    self._book = PriceBook(self.region, CATALOG, error=error)
                self._expires = self._clock() + self._retry_s
            return self._book

    def document(self) -> dict[str, Any]:
        """``book().document()``: the ``OnDemandPrices`` object of ``instances.json``."""
        return self.book().document()

    def _fetch(self) -> dict[str, float]:
        filters = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": self.region}]
        filters += [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in PRODUCT_FILTERS.items()]
        items: list[str] = []
        for page in self._client.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2",
            Filters=filters,
            FormatVersion="aws_v1",
            PaginationConfig={"PageSize": 100},
        ):
            self.calls += 1
            items.extend(page.get("PriceList", []))
        return parse_price_list(items, self.region, self._types)


def _describe(exc: BotoCoreError | ClientError) -> str:
    """One line naming the failure (a proxy's or a stub's HTML error page is cut to its first line)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        text = f"{error.get('Code', 'ClientError')}: {error.get('Message', '')}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"GetProducts: {line[:200]}".rstrip(": ")


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
