"""Issue 28 end to end on moto + the Kubernetes double (the demo environment, real adapters):

GIVEN the demo cluster where node group ``gpu-dev`` (two idle g5.xlarge) keeps two nodes warm (policy
``warm_floor``) and one of them runs in an On-Demand Capacity Reservation (EC2 CreateCapacityReservation),
and in ``gpu-a10g`` one idle node's GPU fell off the bus (Node condition ``AcceleratedHardwareReady=False``)
next to a healthy idle one, WHEN the live assessment plans and drains, THEN the reserved and the warm nodes
are kept with their reasons, the broken node is removed before the healthy idle one (its instance
terminated with the desired size decremented), the plan reports the reservation's unused cost, and
``rightsizer snapshot`` + ``plan --snapshot`` reproduce every one of these verdicts offline.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.assess import run_assessment
from rightsizer.services.observe import observe_request
from rightsizer.services.snapshot import record
from rightsizer.testing.demo_env import DemoEnvironment
from rightsizer.testing.moto_eks import ACCOUNT_ID
from rightsizer.testing.moto_gaps import place_in_reservation
from rightsizer.wiring import Runtime

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESERVED = "ip-10-5-20-96.ec2.internal"  # gpu-dev, g5.xlarge
WARM = "ip-10-5-235-246.ec2.internal"  # gpu-dev, g5.xlarge
BROKEN = "ip-10-0-150-240.ec2.internal"  # gpu-a10g, idle
HEALTHY = "ip-10-0-83-246.ec2.internal"  # gpu-a10g, idle


def _break(env: DemoEnvironment, name: str) -> None:
    node = env.double.get_node(name)
    assert node is not None
    node["status"]["conditions"].append(
        {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error"}
    )
    env.double.add_node(node)


def test_reserved_warm_and_unhealthy_nodes_live_and_from_a_snapshot(tmp_path: Path) -> None:
    with DemoEnvironment() as env:
        ec2 = env.clients.ec2
        zone = ec2.describe_instances(InstanceIds=[env.instance_of[RESERVED]])["Reservations"][0][
            "Instances"
        ][0]["Placement"]["AvailabilityZone"]
        odcr = ec2.create_capacity_reservation(
            InstanceType="g5.xlarge", InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=2
        )["CapacityReservation"]["CapacityReservationId"]
        place_in_reservation(ACCOUNT_ID, env.region, env.instance_of[RESERVED], odcr)
        _break(env, BROKEN)
        policy = Policy(dry_run=False, warm_floor={"g5.xlarge": 2}, max_nodes_per_run=3)
        config = env.config(policy=policy)
        runtime = Runtime(config, "demo", dry_run=False, metrics=env.metrics)
        now = datetime.now(UTC)

        live = plan(runtime.observe(now), policy, now)

        reasons = {n.node: n.reasons for n in live.nodes}
        verdicts = {n.node: n.verdict for n in live.nodes}
        assert verdicts[RESERVED] == "protected" and f"capacity_reserved:odcr:{odcr}" in reasons[RESERVED]
        assert verdicts[WARM] == "protected" and "warm_floor:g5.xlarge:2" in reasons[WARM]
        assert verdicts[BROKEN] == "unhealthy"
        assert reasons[BROKEN][0] == "accelerated_hardware_not_ready:NvidiaXID79Error"
        assert f"unhealthy_first:{BROKEN}" in reasons[HEALTHY]
        assert [a.node for a in live.actions if a.kind == "scale_in"] == [BROKEN]
        [use] = live.reservations
        assert (use.reservation_id, use.idle_nodes, use.available) == (odcr, [RESERVED], 1)
        assert use.unused_usd_per_hour is not None and use.unused_usd_per_hour > 0

        # the snapshot carries every input: replayed offline, the same verdicts, reasons and actions
        out = tmp_path / "snap"
        request = observe_request(config, policy, now)
        observers = runtime.observers
        with SnapshotDirectoryWriter(out, node_label=config.prometheus.node_label) as writer:
            record(observers.cluster, observers.inventory, env.metrics, request, writer)
            writer.commit()
        replay = plan(load_snapshot(out), policy, now)
        assert {n.node: (n.verdict, n.reasons) for n in replay.nodes} == {
            n.node: (n.verdict, n.reasons) for n in live.nodes
        }
        assert [a.action_id for a in replay.actions] == [a.action_id for a in live.actions]
        assert replay.reservations == live.reservations
        instances = json.loads((out / "instances.json").read_text())
        assert [r["CapacityReservationId"] for r in instances["CapacityReservations"]] == [odcr]

        # the assessment drains the broken node only, and removes its instance
        asg = env.asg_name("gpu-a10g")
        before = runtime.scaler.describe_group(asg).sizes.desired
        runner = runtime.runner(max_wait_s=0.5)
        summary = run_assessment(runtime.assessment(starter=runner), now, "tick-28")
        [execution] = summary.started
        assert runner.results[execution].status == "succeeded", runner.results[execution]
        after = runtime.scaler.describe_group(asg)
        assert env.instance_of[BROKEN] not in after.in_service and after.sizes.desired == before - 1
        for kept in (RESERVED, WARM, HEALTHY):
            node = env.double.get_node(kept)
            assert node is not None and not node["spec"].get("unschedulable"), kept
        assert summary.reservations and summary.reservations[0]["reservation_id"] == odcr
