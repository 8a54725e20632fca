"""Issue 28 item 5: a snapshot carries every capacity and health input, through the projection a written
snapshot applies, so ``plan --snapshot`` decides as the live plan did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_projection import project_documents
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import AT, asg, gpu_node, merge_metrics, node_devices, rfc, write_snapshot_dir


def _documents(root: Path) -> dict[str, Any]:
    return {p.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("*.json")}


def test_a_projected_snapshot_replays_reservations_floors_repairs_and_interruptions(tmp_path: Path) -> None:
    broken = gpu_node("bad", instance_type="g5.xlarge", gpus=1, instance_id="i-bad", nodegroup="g5")
    broken["status"]["conditions"].append(
        {"type": "AcceleratedHardwareReady", "status": "False", "reason": "DCGMHealthCode", "message": "x"}
    )
    nodes = [
        broken,
        gpu_node("ok", instance_type="g5.xlarge", gpus=1, instance_id="i-ok", nodegroup="g5"),
        gpu_node("res", instance_type="p5.48xlarge", gpus=8, instance_id="i-res", nodegroup="p5"),
        gpu_node("p1", instance_type="p5.48xlarge", gpus=8, instance_id="i-p1", nodegroup="p5"),
    ]
    metrics = merge_metrics(
        node_devices("bad", 1, util=lambda i: 90.0),
        node_devices("ok", 1, util=lambda i: 90.0),
        node_devices("res", 8, fb_total=81559.0),
        node_devices("p1", 8, fb_total=81559.0),
    )
    groups = [
        asg("asg-g5", ["i-bad", "i-ok"], nodegroup="g5"),
        asg("asg-p5", ["i-res", "i-p1"], nodegroup="p5"),
    ]
    root = write_snapshot_dir(tmp_path / "raw", nodes, [], metrics, groups=groups)
    ng = json.loads((root / "nodegroups.json").read_text())
    for item in ng["nodegroups"]:
        if item["nodegroupName"] == "g5":
            item["nodeRepairConfig"] = {"enabled": True}
        else:
            item["health"] = {
                "issues": [{"code": "AsgInstanceLaunchFailures", "message": "ICE", "resourceIds": []}]
            }
    ng["capacityFailures"] = {"asg-p5": [rfc(AT)]}
    (root / "nodegroups.json").write_text(json.dumps(ng))
    instance = {
        "InstanceType": "p5.48xlarge",
        "State": {"Name": "running"},
        "Placement": {"AvailabilityZone": "us-east-1a"},
    }
    (root / "instances.json").write_text(
        json.dumps(
            {
                "Reservations": [
                    {"Instances": [{**instance, "InstanceId": "i-res", "CapacityReservationId": "cr-1", "InstanceLifecycle": "capacity-block"}]},
                    {"Instances": [{**instance, "InstanceId": "i-p1"}]},
                ],
                "InstanceStatuses": [
                    {"InstanceId": "i-p1", "Events": [{"Code": "instance-retirement", "Description": "retiring"}]},
                    {"InstanceId": "i-res", "Events": [{"Code": "system-reboot", "Description": "[Completed] done"}]},
                ],
                "CapacityReservations": [
                    {"CapacityReservationId": "cr-1", "InstanceType": "p5.48xlarge", "TotalInstanceCount": 1,
                     "AvailableInstanceCount": 0, "State": "active", "EndDate": "2026-11-05T11:30:00Z",
                     "ReservationType": "capacity-block"}
                ],
            }
        )
    )  # fmt: skip
    projected = project_documents(_documents(root))
    out = tmp_path / "projected"
    for path, doc in projected.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(json.dumps(doc))

    for snap_dir in (root, out):
        result = plan(load_snapshot(snap_dir), Policy())
        reasons = {n.node: n.reasons for n in result.nodes}
        assert result.node("bad").verdict == "unhealthy"
        assert "unhealthy_pending_repair:eks" in reasons["bad"]
        assert "accelerated_hardware_not_ready:DCGMHealthCode" in reasons["bad"]
        assert "capacity_reserved:capacity_block:cr-1" in reasons["res"]
        assert "capacity_block_ends:2026-11-05T11:30:00Z" in reasons["res"]
        assert "spot_interruption:ec2_event:instance-retirement" in reasons["p1"]
        assert not any(r.startswith("spot_interruption") for r in reasons["res"])  # a completed event
        assert any(r.startswith("warm_floor:p5.48xlarge:2:ice:") for r in reasons["p1"])
        assert result.actions == []
        [use] = result.reservations
        assert (use.reservation_id, use.end, use.idle_nodes) == ("cr-1", "2026-11-05T11:30:00Z", ["res"])


def _answer(values: list[float], labels: dict[str, str]) -> dict[str, Any]:
    start = AT.timestamp() - 60 * (len(values) - 1)
    points = [[start + 60 * i, repr(v)] for i, v in enumerate(values)]
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": labels, "values": points}]},
    }


def test_xid_answers_in_a_snapshot_rise_to_a_verdict_and_a_stale_gauge_stays_a_hint(tmp_path: Path) -> None:
    nodes = [
        gpu_node(n, instance_type="g5.xlarge", gpus=1, instance_id=f"i-{n}", nodegroup="g5")
        for n in ("new", "old")
    ]
    metrics = merge_metrics(node_devices("new", 1), node_devices("old", 1))
    root = write_snapshot_dir(tmp_path / "raw", nodes, [], metrics)
    new = {"node": "new", "gpu": "0", "UUID": "GPU-new-0", "xid": "79", "pod_label_noise": "x"}
    old = {"node": "old", "gpu": "0", "UUID": "GPU-old-0"}
    xid = {
        "count": _answer([0.0] * 20 + [1.0] * 10, new),
        "last": {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": old, "values": [[AT.timestamp(), "79"]]},
            {"metric": {**new, "xid": ""}, "values": [[AT.timestamp(), "79"]]},
        ]}},
    }  # fmt: skip
    (root / "xid.json").write_text(json.dumps(xid))
    projected = project_documents(_documents(root))
    assert set(projected["xid.json"]["count"]["data"]["result"][0]["metric"]) == {
        "node",
        "gpu",
        "UUID",
        "xid",
    }
    out = tmp_path / "projected"
    for path, doc in projected.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(json.dumps(doc))
    for snap_dir in (root, out):
        result = plan(load_snapshot(snap_dir), Policy())
        assert result.node("new").verdict == "unhealthy" and "xid:79" in result.node("new").reasons
        old_report = result.node("old")  # idle by its GPUs; protected only by the one-per-group budget
        assert old_report.verdict == "protected" and "xid_last:79" in old_report.reasons
        assert not any(r.startswith("xid:") for r in old_report.reasons)
