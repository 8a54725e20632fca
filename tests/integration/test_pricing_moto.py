"""Spot prices through EC2 DescribeSpotPriceHistory on a moto server, into the plan (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rightsizer.adapters.aws import AwsClients, AwsInventory
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.testing.moto_eks import BuiltCluster, record_calls
from tests.builders import gpu_node, merge_metrics, node_devices, write_snapshot_dir

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration


def _run(clients: AwsClients, cluster: BuiltCluster, *, spot: bool) -> str:
    image = clients.ec2.describe_images()["Images"][0]["ImageId"]
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    answer = clients.ec2.run_instances(
        ImageId=image,
        InstanceType="g5.12xlarge",
        MinCount=1,
        MaxCount=1,
        SubnetId=cluster.subnet_ids[0],
        **extra,  # type: ignore[arg-type]
    )
    return str(answer["Instances"][0]["InstanceId"])


def test_a_spot_node_is_priced_from_describe_spot_price_history(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, tmp_path: Path
) -> None:
    spot_id = _run(aws_clients, gpu_cluster, spot=True)
    on_demand_id = _run(aws_clients, gpu_cluster, spot=False)
    calls = record_calls(aws_clients.ec2)

    doc = AwsInventory(aws_clients).describe_instances([spot_id, on_demand_id])

    assert calls.count("DescribeSpotPriceHistory") == 1
    zone = next(
        i["Placement"]["AvailabilityZone"]
        for r in doc["Reservations"]
        for i in r["Instances"]
        if i["InstanceId"] == spot_id
    )
    prices = {(p["InstanceType"], p["AvailabilityZone"]): p["SpotPrice"] for p in doc["SpotPriceHistory"]}
    assert ("g5.12xlarge", zone) in prices
    # The plan prices the spot node at what AWS answered (moto answers 0.00001), the other from the catalog.
    nodes = [
        gpu_node("spot-1", instance_type="g5.12xlarge", gpus=4, instance_id=spot_id, nodegroup=None),
        gpu_node("od-1", instance_type="g5.12xlarge", gpus=4, instance_id=on_demand_id, nodegroup=None),
    ]
    metrics = merge_metrics(node_devices("spot-1", 4), node_devices("od-1", 4))
    root = Path(write_snapshot_dir(tmp_path / "snap", nodes, [], metrics, groups=[]))
    (root / "instances.json").write_text(json.dumps(doc))
    result = plan(load_snapshot(root), Policy())
    assert result.node("spot-1").hourly_usd == pytest.approx(float(prices[("g5.12xlarge", zone)]))
    assert f"priced_spot:{zone}" in result.node("spot-1").reasons
    assert result.node("od-1").hourly_usd == pytest.approx(5.672)
