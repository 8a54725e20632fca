"""The Price List Query API adapter over real HTTP (issue 17 "Honest savings"): boto3's ``pricing`` client
against ``tests.support.pricing_double`` (moto does not implement ``pricing``), serving real products.

GIVEN a cluster in eu-west-1 WHEN the adapter asks THEN it sends the on-demand Linux shared-tenancy filters,
reads every page, keeps the catalog's GPU types at eu-west-1's prices, and asks again only after 12 hours;
WHEN the API is denied or unreachable THEN the book says so and the plan prices from the packaged catalog
with ``price_region_fallback``; WHEN a refresh fails after a good answer THEN the good answer stays.
The whole path: AwsInventory on moto → ``instances.json`` → ``rightsizer plan --snapshot`` → USD figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from rightsizer.adapters.aws import AwsClients, AwsInventory
from rightsizer.adapters.pricing import PRODUCT_FILTERS, PriceListPrices
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.prices import CATALOG, PRICING_API
from rightsizer.testing.moto_eks import BuiltCluster
from tests.builders import gpu_node, merge_metrics, node_devices, write_snapshot_dir
from tests.support.pricing_double import PricingDouble, pricing_double

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

EU_WEST_1 = {"g4dn.xlarge": 0.587, "g5.2xlarge": 1.35296, "p4d.24xlarge": 23.71569}


@pytest.fixture
def double() -> Iterator[PricingDouble]:
    with pricing_double() as started:
        yield started


def _client(endpoint_url: str) -> Any:
    session = boto3.session.Session(
        region_name="eu-central-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    quick = Config(connect_timeout=2, read_timeout=5, retries={"mode": "standard", "max_attempts": 2})
    return session.client("pricing", endpoint_url=endpoint_url, config=quick)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _prices(endpoint_url: str, clock: Clock | None = None) -> PriceListPrices:
    return PriceListPrices(_client(endpoint_url), "eu-west-1", load_catalog().types, clock=clock or Clock())


def test_eu_west_1_prices_are_read_page_by_page_with_the_on_demand_linux_filters(
    double: PricingDouble,
) -> None:
    double.max_page = 2  # AWS may answer fewer products than MaxResults: every page must be read
    prices = _prices(double.endpoint_url)

    book = prices.book()

    assert (book.region, book.source, book.error) == ("eu-west-1", PRICING_API, None)
    assert book.usd_per_hour == pytest.approx(EU_WEST_1)
    assert book.fetched_at.endswith("Z")
    assert len(double.requests) == 2 == prices.calls  # 4 eu-west-1 products (with m5.xlarge), 2 a page
    first = double.requests[0]
    assert first["ServiceCode"] == "AmazonEC2" and first["MaxResults"] == 100
    sent = {f["Field"]: f["Value"] for f in first["Filters"]}
    assert sent == {"regionCode": "eu-west-1", **PRODUCT_FILTERS}
    assert {f["Type"] for f in first["Filters"]} == {"TERM_MATCH"}


def test_an_answer_is_used_for_twelve_hours_then_asked_again(double: PricingDouble) -> None:
    clock = Clock()
    prices = _prices(double.endpoint_url, clock)
    first = prices.book()
    clock.now += 12 * 3600 - 1
    assert prices.book() is first and len(double.requests) == 1
    clock.now += 2
    assert prices.book().usd_per_hour == first.usd_per_hour and len(double.requests) == 2
    prices.book(refresh=True)
    assert len(double.requests) == 3


def test_denied_gives_the_catalog_with_the_reason_and_asks_again_after_fifteen_minutes(
    double: PricingDouble,
) -> None:
    double.deny = True
    clock = Clock()
    prices = _prices(double.endpoint_url, clock)

    book = prices.book()

    assert book.source == CATALOG and book.usd_per_hour == {}
    assert book.error is not None and "AccessDeniedException" in book.error
    assert len(double.requests) == 1  # a 4xx is not retried
    clock.now += 14 * 60
    assert prices.book() is book and len(double.requests) == 1
    double.deny = False
    clock.now += 61
    assert prices.book().source == PRICING_API


def test_a_failed_refresh_keeps_the_last_good_answer(double: PricingDouble) -> None:
    clock = Clock()
    prices = _prices(double.endpoint_url, clock)
    good = prices.book()
    double.deny = True
    clock.now += 13 * 3600
    assert prices.book() is good  # Karpenter keeps the previous prices when an update fails


def test_an_unreachable_api_gives_the_catalog_within_seconds() -> None:
    with pricing_double() as gone:
        url = gone.endpoint_url
    started = time.monotonic()
    book = _prices(url).book()
    assert time.monotonic() - started < 30
    assert book.source == CATALOG and book.error is not None and "EndpointConnectionError" in book.error


def _plan_json(root: Path, policy: Path) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rightsizer.cli",
            "plan",
            "--snapshot",
            str(root),
            "--policy",
            str(policy),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("denied", [False, True], ids=["api", "denied"])
def test_a_eu_west_1_plan_is_priced_from_what_the_inventory_read(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, double: PricingDouble, tmp_path: Path, denied: bool
) -> None:
    image = aws_clients.ec2.describe_images()["Images"][0]["ImageId"]
    ids = [
        aws_clients.ec2.run_instances(
            ImageId=image, InstanceType=t, MinCount=1, MaxCount=1, SubnetId=gpu_cluster.subnet_ids[0]
        )["Instances"][0]["InstanceId"]
        for t in ("g5.2xlarge", "g4dn.xlarge")
    ]
    double.deny = denied
    inventory = AwsInventory(aws_clients, prices=_prices(double.endpoint_url))

    document = inventory.describe_instances(ids)

    region = {"topology.kubernetes.io/region": "eu-west-1"}
    nodes = [
        gpu_node("a", instance_type="g5.2xlarge", gpus=1, instance_id=ids[0], nodegroup=None, labels=region),
        gpu_node("b", instance_type="g4dn.xlarge", gpus=1, instance_id=ids[1], nodegroup=None, labels=region),
    ]
    root = Path(
        write_snapshot_dir(
            tmp_path / "snap", nodes, [], merge_metrics(node_devices("a", 1), node_devices("b", 1))
        )
    )
    meta = json.loads((root / "snapshot.json").read_text())
    (root / "snapshot.json").write_text(json.dumps({**meta, "region": "eu-west-1"}))
    (root / "instances.json").write_text(json.dumps(document))
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_nodes_per_run: 2\n")

    result = _plan_json(root, policy)

    reports = {n["node"]: n for n in result["nodes"]}
    if denied:
        assert document["OnDemandPrices"]["Source"] == "catalog"
        assert "AccessDeniedException" in document["OnDemandPrices"]["Error"]
        expected = {"a": 1.212, "b": 0.526}  # the packaged us-east-1 prices
        reason = "price_region_fallback:eu-west-1"
    else:
        assert document["OnDemandPrices"]["UsdPerHour"] == pytest.approx(EU_WEST_1)
        expected = {"a": 1.35296, "b": 0.587}
        reason = "priced_on_demand:pricing_api:eu-west-1"
    assert {n: r["hourly_usd"] for n, r in reports.items()} == pytest.approx(expected)
    assert all(reason in r["reasons"] for r in reports.values())


@pytest.mark.parametrize("denied", [False, True], ids=["api", "denied"])
def test_rightsizer_prices_shows_the_regions_prices_beside_the_catalogs(
    double: PricingDouble, tmp_path: Path, denied: bool
) -> None:
    double.deny = denied
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "cluster": {"name": "prod-eks", "region": "eu-west-1"},
                "prometheus": {"url": "http://127.0.0.1:9"},
                "aws": {"region": "eu-west-1", "pricing_endpoint_url": double.endpoint_url},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_CONFIG_FILE="/dev/null")
    done = subprocess.run(
        [sys.executable, "-m", "rightsizer.cli", "prices", "--config", str(config), "--json"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip

    report = json.loads(done.stdout)
    rows = {r["instance_type"]: r for r in report["types"]}
    assert report["region"] == "eu-west-1" and len(rows) == len(load_catalog().types)
    assert rows["g5.2xlarge"]["catalog_usd_per_hour"] == pytest.approx(1.212)
    if denied:
        assert done.returncode == 1 and "AccessDeniedException" in done.stderr
        assert report["source"] == "catalog" and rows["g5.2xlarge"]["usd_per_hour"] == pytest.approx(1.212)
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        assert report["source"] == "pricing_api"
        assert rows["g5.2xlarge"]["usd_per_hour"] == pytest.approx(1.35296)
        assert rows["g6.xlarge"]["usd_per_hour"] is None  # eu-west-1 publishes no g6 product
