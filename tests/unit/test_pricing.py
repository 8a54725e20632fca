"""Honest prices (issue 17): spot at the zone's spot price, reserved capacity saves nothing, regions flagged."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.model import ClusterSnapshot, Ec2Instance
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import gpu_node, node_devices, snapshot, write_snapshot_dir

ZONE = "us-east-1a"


def _idle(
    instance: Ec2Instance, spot: dict[tuple[str, str], float] | None = None, **labels: str
) -> ClusterSnapshot:
    node = gpu_node(
        "n1", instance_type="g5.12xlarge", gpus=4, instance_id=instance.instance_id, labels=labels or None
    )
    snap = snapshot([node], [], node_devices("n1", 4))
    inventory = dataclasses.replace(
        snap.inventory, instances={instance.instance_id: instance}, spot_prices=spot or {}
    )
    return dataclasses.replace(snap, inventory=inventory)


def _instance(**kw: object) -> Ec2Instance:
    base: dict[str, object] = dict(
        instance_id="i-n1",
        instance_type="g5.12xlarge",
        tags={},
        root_device_type="ebs",
        state="running",
        availability_zone=ZONE,
    )
    return Ec2Instance(**{**base, **kw})  # type: ignore[arg-type]


def test_on_demand_instance_is_priced_from_the_catalog() -> None:
    result = plan(_idle(_instance()), Policy())
    assert result.node("n1").hourly_usd == pytest.approx(5.672)
    [action] = result.actions
    assert action.kind == "scale_in" and action.hourly_savings_usd == pytest.approx(5.672)


def test_spot_instance_is_priced_at_its_zones_spot_price() -> None:
    snap = _idle(
        _instance(lifecycle="spot"), {("g5.12xlarge", ZONE): 2.1, ("g5.12xlarge", "us-east-1b"): 9.0}
    )
    result = plan(snap, Policy())
    report = result.node("n1")
    assert report.hourly_usd == pytest.approx(2.1)
    assert "priced_spot:us-east-1a" in report.reasons and "spot_priced_on_demand" not in report.reasons
    [action] = result.actions
    assert action.hourly_savings_usd == pytest.approx(2.1)
    assert result.savings.hourly_usd == pytest.approx(2.1)


def test_spot_without_a_price_in_its_zone_falls_back_to_on_demand_and_says_so() -> None:
    snap = _idle(_instance(lifecycle="spot"), {("g5.12xlarge", "us-east-1b"): 2.1})
    report = plan(snap, Policy()).node("n1")
    assert report.hourly_usd == pytest.approx(5.672) and "spot_priced_on_demand" in report.reasons


@pytest.mark.parametrize(
    ("lifecycle", "kind"),
    [("", "odcr"), ("capacity-block", "capacity_block")],
    ids=["odcr", "capacity-block"],
)
def test_reserved_capacity_is_flagged_and_its_removal_saves_nothing(lifecycle: str, kind: str) -> None:
    snap = _idle(_instance(lifecycle=lifecycle, capacity_reservation_id="cr-0123456789abcdef0"))
    result = plan(snap, Policy())
    report = result.node("n1")
    # Issue 28: kept by default (was: still idle and removed, issue 17); the reason says why.
    assert f"capacity_reserved:{kind}:cr-0123456789abcdef0" in report.reasons
    assert report.verdict == "protected" and result.actions == []
    result = plan(snap, Policy(release_reserved_capacity=True))
    assert f"reservation_released:{kind}:cr-0123456789abcdef0" in result.node("n1").reasons
    assert result.node("n1").verdict == "idle"  # released: idle, only the money is not saved
    [action] = result.actions
    assert action.kind == "scale_in" and action.hourly_savings_usd is None
    assert "removal saves nothing while it is held" in action.reason
    assert result.savings.hourly_usd == 0


def test_other_regions_are_flagged_as_priced_from_us_east_1() -> None:
    snap = _idle(_instance(), **{"topology.kubernetes.io/region": "eu-west-1"})
    assert "price_region_fallback:eu-west-1" in plan(snap, Policy()).node("n1").reasons


def test_snapshot_directory_carries_spot_prices_and_reservations(tmp_path: Path) -> None:
    node = gpu_node("n1", instance_type="g5.12xlarge", gpus=4, instance_id="i-n1")
    root = write_snapshot_dir(tmp_path / "snap", [node], [], node_devices("n1", 4))
    instance = {
        "InstanceId": "i-n1",
        "InstanceType": "g5.12xlarge",
        "InstanceLifecycle": "spot",
        "Placement": {"AvailabilityZone": ZONE},
        "CapacityReservationId": "cr-1",
        "State": {"Name": "running"},
    }
    history = [
        {"InstanceType": "g5.12xlarge", "AvailabilityZone": ZONE, "SpotPrice": "1.5",
         "Timestamp": "2026-11-02T09:00:00Z", "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "g5.12xlarge", "AvailabilityZone": ZONE, "SpotPrice": "1.7",
         "Timestamp": "2026-11-02T09:30:00Z", "ProductDescription": "Linux/UNIX"},
    ]  # fmt: skip
    (Path(root) / "instances.json").write_text(
        json.dumps({"Reservations": [{"Instances": [instance]}], "SpotPriceHistory": history})
    )
    snap = load_snapshot(root)
    [ec2] = (snap.inventory.instances or {}).values()
    assert (ec2.lifecycle, ec2.availability_zone, ec2.capacity_reservation_id) == ("spot", ZONE, "cr-1")
    assert snap.inventory.spot_prices == {("g5.12xlarge", ZONE): 1.7}  # the newest, not the first
