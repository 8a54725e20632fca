"""Per-region on-demand prices (issue 17 "Honest savings"): the Price List Query API's PriceList entries
parsed from real products (tests/fixtures/pricing, see its PROVENANCE.md), the catalog priced for a region,
and every node's reasons naming who priced it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rightsizer.adapters.pricing import parse_price_list, pricing_endpoint_region
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_projection import project_documents
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.errors import SnapshotError
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.prices import CATALOG, PRICING_API, PriceBook, price_reason
from tests.builders import gpu_node, merge_metrics, node_devices, snapshot, write_snapshot_dir
from tests.support.pricing_double import load_offers

TYPES = load_catalog().types
ITEMS = [json.dumps(p) for p in load_offers()]  # each PriceList entry is a JSON string


@pytest.mark.parametrize(
    ("region", "expected"),
    [
        ("us-east-1", {"g4dn.xlarge": 0.526, "g5.2xlarge": 1.212, "g6.xlarge": 0.8048,
                       "p4d.24xlarge": 21.957642, "p5.48xlarge": 55.04}),
        ("us-west-2", {"g4dn.xlarge": 0.526, "g5.2xlarge": 1.212, "g6.xlarge": 0.8048,
                       "p4d.24xlarge": 21.95764, "p5.48xlarge": 55.04}),
        ("eu-west-1", {"g4dn.xlarge": 0.587, "g5.2xlarge": 1.35296, "p4d.24xlarge": 23.71569}),
        ("ap-northeast-1", {}),
    ],
)  # fmt: skip
def test_price_list_entries_give_each_regions_nominal_on_demand_linux_price(
    region: str, expected: dict[str, float]
) -> None:
    # The slice also holds Windows, SQL Std, Dedicated, unused-reservation and a 0.00 Capacity Block
    # product of the same types, the free-tier pseudo-product and a non-GPU m5.xlarge: none may win.
    assert parse_price_list(ITEMS, region, TYPES) == pytest.approx(expected)


def test_a_capacity_block_product_never_prices_a_p5_at_zero() -> None:
    [block] = [p for p in load_offers() if p["product"]["attributes"].get("marketoption") == "CapacityBlock"]
    assert parse_price_list([json.dumps(block)], "us-east-1", TYPES) == {}
    # Even with the filter attribute missing, a 0.00 price is never an on-demand price.
    del block["product"]["attributes"]["marketoption"]
    assert parse_price_list([json.dumps(block)], "us-east-1", TYPES) == {}


def test_unparsable_entries_and_unknown_types_are_skipped_and_conflicts_left_unpriced() -> None:
    [g5] = [
        p
        for p in load_offers()
        if p["product"]["attributes"].get("instanceType") == "g5.2xlarge"
        and p["product"]["attributes"]["regionCode"] == "eu-west-1"
    ]
    other = json.loads(json.dumps(g5))
    [[offer]] = [list(other["terms"]["OnDemand"].values())]
    [[dimension]] = [list(offer["priceDimensions"].values())]
    dimension["pricePerUnit"]["USD"] = "9.0000000000"
    items = ["not json", json.dumps({"product": {}}), json.dumps(g5)]
    assert parse_price_list(items, "eu-west-1", TYPES) == {"g5.2xlarge": pytest.approx(1.35296)}
    assert parse_price_list(items, "eu-west-1", {"g4dn.xlarge"}) == {}
    assert parse_price_list([*items, json.dumps(other)], "eu-west-1", TYPES) == {}


@pytest.mark.parametrize(
    ("region", "endpoint"),
    [("us-east-1", "us-east-1"), ("us-west-2", "us-east-1"), ("ca-central-1", "us-east-1"),
     ("eu-west-1", "eu-central-1"), ("eu-central-1", "eu-central-1"), ("ap-northeast-1", "ap-south-1"),
     ("cn-north-1", "cn-northwest-1"), ("me-south-1", "us-east-1"), ("sa-east-1", "us-east-1")],
)  # fmt: skip
def test_the_api_is_asked_at_the_endpoint_karpenter_uses(region: str, endpoint: str) -> None:
    assert pricing_endpoint_region(region) == endpoint


EU = PriceBook(
    "eu-west-1", PRICING_API, {"g5.2xlarge": 1.35296, "g4dn.xlarge": 0.587}, "2026-12-01T19:00:00Z"
)


def test_a_regions_book_reprices_the_catalog_and_unsold_types_are_never_targets() -> None:
    catalog = load_catalog().with_prices(EU)
    assert catalog.types["g5.2xlarge"].hourly_usd == pytest.approx(1.35296)
    assert catalog.types["g5.xlarge"].hourly_usd is None  # not in the region's (complete) answer
    assert catalog.on_demand_usd("g5.xlarge") == pytest.approx(1.006)  # a running one: packaged price
    assert load_catalog().types["g5.2xlarge"].hourly_usd == pytest.approx(1.212)  # the packaged one unchanged
    denied = PriceBook("eu-west-1", CATALOG, error="GetProducts: AccessDeniedException")
    assert load_catalog().with_prices(denied).types == load_catalog().types


@pytest.mark.parametrize(
    ("book", "region", "instance_type", "reason"),
    [
        (EU, "eu-west-1", "g5.2xlarge", "priced_on_demand:pricing_api:eu-west-1"),
        (EU, "eu-west-1", "g6.xlarge", "price_region_fallback:eu-west-1"),
        (None, "eu-west-1", "g5.2xlarge", "price_region_fallback:eu-west-1"),
        (PriceBook("eu-west-1", CATALOG, error="denied"), "eu-west-1", "g5.2xlarge",
         "price_region_fallback:eu-west-1"),
        (None, "us-east-1", "g5.2xlarge", "priced_on_demand:catalog:us-east-1:2026-07-20"),
        (EU, "us-east-1", "g5.2xlarge", "priced_on_demand:catalog:us-east-1:2026-07-20"),
    ],
)  # fmt: skip
def test_every_price_names_its_source(
    book: PriceBook | None, region: str, instance_type: str, reason: str
) -> None:
    assert price_reason(book, region, instance_type) == reason


def _idle_cluster(region: str, book: PriceBook | None) -> ClusterSnapshot:
    nodes = [
        gpu_node("a", instance_type="g5.2xlarge", gpus=1, instance_id="i-a", labels={"topology.kubernetes.io/region": region}),
        gpu_node("b", instance_type="g6.xlarge", gpus=1, instance_id="i-b", labels={"topology.kubernetes.io/region": region}),
    ]  # fmt: skip
    snap = snapshot(nodes, [], merge_metrics(node_devices("a", 1), node_devices("b", 1)))
    snap = dataclasses.replace(snap, meta=dataclasses.replace(snap.meta, region=region))
    return dataclasses.replace(snap, inventory=dataclasses.replace(snap.inventory, on_demand=book))


def test_an_eu_west_1_plan_saves_what_eu_west_1_charges() -> None:
    policy = Policy(max_nodes_per_run=5, max_nodes_per_node_group=5)
    before = plan(_idle_cluster("eu-west-1", None), policy)
    after = plan(_idle_cluster("eu-west-1", EU), policy)

    assert before.node("a").hourly_usd == pytest.approx(1.212)
    assert "price_region_fallback:eu-west-1" in before.node("a").reasons
    assert after.node("a").hourly_usd == pytest.approx(1.35296)
    assert "priced_on_demand:pricing_api:eu-west-1" in after.node("a").reasons
    # g6.xlarge: the region publishes no product, yet the node runs: packaged price, and it says so.
    assert after.node("b").hourly_usd == pytest.approx(0.8048)
    assert "price_region_fallback:eu-west-1" in after.node("b").reasons
    savings = {a.node: a.hourly_savings_usd for a in after.actions if a.kind == "scale_in"}
    assert savings == {"a": pytest.approx(1.35296), "b": pytest.approx(0.8048)}
    assert after.savings.hourly_usd == pytest.approx(1.35296 + 0.8048)
    assert before.savings.hourly_usd == pytest.approx(1.212 + 0.8048)


def test_a_snapshot_replays_the_prices_it_was_decided_with(tmp_path: Path) -> None:
    node = gpu_node("a", instance_type="g5.2xlarge", gpus=1, instance_id="i-a")
    root = Path(write_snapshot_dir(tmp_path / "snap", [node], [], node_devices("a", 1)))
    document = {"Reservations": [], "SpotPriceHistory": [], "OnDemandPrices": EU.document()}
    written = project_documents({"instances.json": document})["instances.json"]  # what `snapshot` writes
    (root / "instances.json").write_text(json.dumps(written))

    assert load_snapshot(root).inventory.on_demand == EU
    (root / "instances.json").write_text(json.dumps({**document, "OnDemandPrices": {"Region": "eu-west-1"}}))
    with pytest.raises(SnapshotError, match="Source"):
        load_snapshot(root)
