"""Node-local data protects the node (issue 12 §1): hostPath, generic ephemeral volumes, local and
node-pinned PersistentVolumes, unresolvable claims — in the plan and through the drain workflow."""

from __future__ import annotations

from typing import Any

import pytest

from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainRequest
from tests.builders import (
    AT,
    claim_volume,
    gpu_node,
    merge_metrics,
    node_devices,
    pod,
    pv,
    pvc,
    rfc,
    snapshot,
    verdict_reasons,
)
from tests.unit.test_drain import make_world, reasons

SAFE_LOCAL = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"


def _nodes(zones: dict[str, str]) -> list[dict[str, Any]]:
    return [
        gpu_node(name, instance_type="g5.xlarge", gpus=1, labels={"topology.kubernetes.io/zone": zone})
        for name, zone in zones.items()
    ]


def _node_reasons(
    volumes: list[dict[str, Any]],
    *,
    pvcs: list[dict[str, Any]] | None = None,
    pvs: list[dict[str, Any]] | None = None,
    zones: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: tuple[str, str] = ("StatefulSet", "apps/v1"),
    volumes_known: bool = True,
    policy: Policy | None = None,
) -> list[str]:
    zones = zones or {"gpu-1": "us-east-1a", "gpu-2": "us-east-1a"}
    nodes = _nodes(zones)
    pods = [pod("db-0", "gpu-1", volumes=volumes, annotations=annotations, owner=owner)]
    metrics = merge_metrics(*(node_devices(n, 1) for n in zones))
    snap = snapshot(nodes, pods, metrics, pvcs=pvcs, pvs=pvs, volumes_known=volumes_known)
    return plan(snap, policy or Policy(), AT).node("gpu-1").reasons


def _local(reasons: list[str]) -> list[str]:
    return [r for r in reasons if r.startswith("local_storage")]


@pytest.mark.parametrize(
    ("volume", "pv_doc"),
    [
        (claim_volume("data-db-0"), pv("pv-local", local_path="/mnt/disks/ssd0", affinity={"kubernetes.io/hostname": ["gpu-1"]})),
        (claim_volume("data-db-0"), pv("pv-host", host_path="/srv/data")),
        (claim_volume("data-db-0"), pv("pv-topolvm", affinity={"kubernetes.io/hostname": ["gpu-1"]})),
        (claim_volume("data-db-0"), pv("pv-field", affinity={"metadata.name": ["gpu-1"]})),
        ({"name": "cache", "hostPath": {"path": "/var/cache/models"}}, None),
        ({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "gp3"}}}}, None),
    ],
    ids=["local-pv", "hostpath-pv", "hostname-affinity-csi", "matchfields-affinity", "hostpath", "ephemeral"],
)  # fmt: skip
def test_node_local_data_protects_the_node_until_the_switch_is_set(
    volume: dict[str, Any], pv_doc: dict[str, Any] | None
) -> None:
    pvcs = [pvc("data-db-0", pv_doc["metadata"]["name"])] if pv_doc else []
    pvs = [pv_doc] if pv_doc else []
    found = _node_reasons([volume], pvcs=pvcs, pvs=pvs)
    assert _local(found) == ["local_storage:default/db-0"]
    allowed = _node_reasons([volume], pvcs=pvcs, pvs=pvs, policy=Policy(evict_node_local_data=True))
    assert {r.split(":")[0] for r in verdict_reasons(allowed)} <= {
        "idle_window_clean",
        "disruption_budget_exhausted",
    }


def test_a_zonal_volume_protects_the_node_only_when_no_other_node_can_reach_it() -> None:
    claims, volumes = [pvc("data-db-0", "pv-ebs")], [pv("pv-ebs", affinity={"topology.kubernetes.io/zone": ["us-east-1b"]})]  # fmt: skip
    shared = {"gpu-1": "us-east-1b", "gpu-2": "us-east-1b"}
    alone = {"gpu-1": "us-east-1b", "gpu-2": "us-east-1c"}
    assert _local(_node_reasons([claim_volume("data-db-0")], pvcs=claims, pvs=volumes, zones=shared)) == []
    assert _local(_node_reasons([claim_volume("data-db-0")], pvcs=claims, pvs=volumes, zones=alone)) == [
        "local_storage:default/db-0"
    ]
    # A network volume without node affinity follows the pod anywhere.
    assert (
        _local(_node_reasons([claim_volume("data-db-0")], pvcs=claims, pvs=[pv("pv-ebs")], zones=alone)) == []
    )


@pytest.mark.parametrize(
    ("others", "local"),
    [
        ([("gpu-2", "us-east-1c", {})], True),
        ([("gpu-2", "us-east-1b", {"unschedulable": True})], True),
        ([("gpu-2", "us-east-1b", {"deleting": True})], True),
        ([("gpu-2", "us-east-1b", {"unschedulable": True}), ("gpu-3", "us-east-1b", {})], False),
        ([("gpu-3", "us-east-1b", {}), ("gpu-2", "us-east-1b", {"deleting": True})], False),
        ([("gpu-2", "us-east-1c", {}), ("gpu-3", "us-east-1c", {}), ("gpu-4", "us-east-1b", {})], False),
    ],
    ids=[
        "other-zone",
        "only-peer-cordoned",
        "only-peer-deleting",
        "a-later-peer",
        "an-earlier-peer",
        "last-node",
    ],
)
def test_a_zonal_volume_is_pinned_unless_some_other_schedulable_node_reaches_it(
    others: list[tuple[str, str, dict[str, bool]]], local: bool
) -> None:
    """The first other schedulable node the affinity admits settles it, wherever it is in the node list."""
    nodes = [
        gpu_node(
            "gpu-1", instance_type="g5.xlarge", gpus=1, labels={"topology.kubernetes.io/zone": "us-east-1b"}
        )
    ]
    for name, zone, state in others:
        node = gpu_node(
            name,
            instance_type="g5.xlarge",
            gpus=1,
            labels={"topology.kubernetes.io/zone": zone},
            unschedulable=state.get("unschedulable", False),
        )
        if state.get("deleting"):
            node["metadata"]["deletionTimestamp"] = rfc(AT)
        nodes.append(node)
    pods = [pod("db-0", "gpu-1", volumes=[claim_volume("data-db-0")], owner=("StatefulSet", "apps/v1"))]
    metrics = merge_metrics(*(node_devices(n["metadata"]["name"], 1) for n in nodes))
    snap = snapshot(
        nodes,
        pods,
        metrics,
        pvcs=[pvc("data-db-0", "pv-ebs")],
        pvs=[pv("pv-ebs", affinity={"topology.kubernetes.io/zone": ["us-east-1b"]})],
    )
    found = _local(plan(snap, Policy(), AT).node("gpu-1").reasons)
    assert found == (["local_storage:default/db-0"] if local else [])


@pytest.mark.parametrize(
    ("pvcs", "pvs", "known"),
    [
        ([], [], True),  # claim not found
        ([pvc("data-db-0", None)], [], True),  # claim not bound
        ([pvc("data-db-0", "pv-gone")], [], True),  # volume not found
        ([pvc("data-db-0", "pv-ebs")], [pv("pv-ebs")], False),  # the source carried no volumes
    ],
    ids=["claim-missing", "claim-unbound", "volume-missing", "volumes-not-observed"],
)
def test_an_unresolvable_claim_counts_as_node_local(
    pvcs: list[dict[str, Any]], pvs: list[dict[str, Any]], known: bool
) -> None:
    found = _node_reasons([claim_volume("data-db-0")], pvcs=pvcs, pvs=pvs, volumes_known=known)
    assert _local(found) == ["local_storage:default/db-0"]


def test_safe_to_evict_local_volumes_opts_in_data_volumes_but_never_a_pinned_claim() -> None:
    host = {"name": "cache", "hostPath": {"path": "/var/cache"}}
    assert _local(_node_reasons([host], annotations={SAFE_LOCAL: "cache"})) == []
    assert _local(_node_reasons([host], annotations={SAFE_LOCAL: "other"})) == ["local_storage:default/db-0"]
    claims, volumes = [pvc("data-db-0", "pv-local")], [pv("pv-local", local_path="/mnt/ssd")]
    pinned = _node_reasons(
        [claim_volume("data-db-0")], pvcs=claims, pvs=volumes, annotations={SAFE_LOCAL: "data"}
    )
    assert _local(pinned) == ["local_storage:default/db-0"]


# ------------------------------------------------------------------------------ through the drain


def _world_with_claim(volume_name: str, pv_doc: dict[str, Any]) -> Any:
    world = make_world(pods=[pod("db-0", "gpu-1", volumes=[claim_volume("data-db-0")], owner=("StatefulSet", "apps/v1"))])  # fmt: skip
    world.writer.add_pvc(pvc("data-db-0", volume_name))
    world.writer.add_pv(pv_doc)
    return world


def test_drain_refuses_a_node_whose_pod_keeps_its_data_on_a_local_volume() -> None:
    world = _world_with_claim("pv-local", pv("pv-local", local_path="/mnt/ssd", affinity={"kubernetes.io/hostname": ["gpu-1"]}))  # fmt: skip
    # The plan is a hint: the drain is asked directly, and its own live reads find the local volume.
    world.observe = lambda now: snapshot(  # type: ignore[method-assign]
        [world.writer.get_node(n) for n in ("gpu-1", "gpu-2", "gpu-3")],
        world.writer.list_pods_on_node("gpu-2"),
        world.metrics,
        groups=None,
    )
    record = world.drain()
    assert record.status == "abandoned"
    assert "local_storage:default/db-0" in reasons(world)[-1][2]
    assert world.scaler.terminated == [] and world.writer.evictions == []
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False


def test_a_volume_that_becomes_node_pinned_mid_drain_rolls_back_and_is_reported() -> None:
    zonal = pv("pv-ebs", affinity={"topology.kubernetes.io/zone": ["us-east-1a"]})
    world = _world_with_claim("pv-ebs", zonal)
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        world.writer.update_node(name, lambda n: n["metadata"]["labels"].update({"topology.kubernetes.io/zone": "us-east-1a"}))  # fmt: skip
    world.observe = lambda now: snapshot(  # type: ignore[method-assign]
        [world.writer.get_node(n) for n in ("gpu-1", "gpu-2", "gpu-3")], [], world.metrics
    )
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    assert workflow.step("exec-1").next_step == "cordon"
    assert workflow.step("exec-1").next_step == "revalidate"
    # The other nodes of the zone go away while we hold the cordon: the data can no longer follow.
    world.writer.delete_node("gpu-2")
    world.writer.update_node("gpu-3", lambda n: n["spec"].update({"unschedulable": True}))
    result = workflow.step("exec-1")
    assert result.finished and result.status == "rolled_back"
    assert "local_storage:default/db-0" in result.message
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.writer.evictions == [] and world.scaler.terminated == []
    assert [e["reason"] for e in world.writer.events][-1] == "RolledBack"
    assert reasons(world)[-1][1] == "rolled_back"


def test_drain_of_a_pod_with_a_network_volume_goes_ahead() -> None:
    world = _world_with_claim("pv-ebs", pv("pv-ebs"))
    world.observe = lambda now: snapshot(  # type: ignore[method-assign]
        [world.writer.get_node(n) for n in ("gpu-1", "gpu-2", "gpu-3")], [], world.metrics
    )
    assert world.drain().status == "succeeded"
    assert world.scaler.terminated == ["i-1"]
