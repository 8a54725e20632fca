"""One eligibility function per action kind (issue 25, ``rightsizer.domain.eligibility``).

GIVEN a node protected by node-local data (a ``hostPath`` volume, a local PersistentVolume), a
PodDisruptionBudget, an opt-out annotation or a bare pod, WHEN the plan is made, THEN no executable action
of any kind is proposed for it (a standalone instance keeps a ``recommend`` naming the refusal, a managed
node group holding such a node gets no ``replace_node_group``), and the executable savings count none of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rightsizer.domain.eligibility import (
    DRAIN_GUARDS,
    RESIZE_GUARDS,
    DrainFacts,
    Judged,
    Refusal,
    drain_refusals,
    first_refusal_message,
    refusals,
)
from rightsizer.domain.model import TAG_ENABLED, Ec2Instance
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import (
    AT,
    asg,
    claim_volume,
    const,
    gpu_node,
    merge_metrics,
    node_devices,
    pdb,
    pod,
    pv,
    pvc,
    snapshot,
)

RESIZE_POLICY = Policy(allow_resize=True, resize_allow_instance_store_loss=True)
HOST_PATH = [{"name": "cache", "hostPath": {"path": "/var/cache/models"}}]


def protection(name: str, node: str) -> dict[str, Any]:
    """Pods, PDBs, volumes and node annotations that protect ``node`` (one protection reason each)."""
    workload = {"gpus": 1, "cpu": "2", "memory": "8Gi"}
    if name == "host_path":
        return {"pods": [pod("api-0", node, volumes=HOST_PATH, **workload)]}
    if name == "local_pv":
        vol = pv("pv-local", local_path="/mnt/nvme", affinity={"kubernetes.io/hostname": [node]})
        return {
            "pods": [pod("api-0", node, volumes=[claim_volume("data")], **workload)],
            "pvcs": [pvc("data", "pv-local")],
            "pvs": [vol],
        }
    if name == "pdb":
        return {"pods": [pod("api-0", node, **workload)], "pdbs": [pdb("api", "default", {"app": "api"}, 0)]}
    if name == "bare_pod":
        return {"pods": [pod("api-0", node, owner=None, **workload)]}
    if name == "do_not_disrupt":
        return {"pods": [pod("api-0", node, annotations={"karpenter.sh/do-not-disrupt": "true"}, **workload)]}
    assert name == "none"
    return {"pods": [pod("api-0", node, **workload)]}


#: Each protection and the reason code the plan gives it.
CODES = {
    "host_path": "local_storage",
    "local_pv": "local_storage",
    "pdb": "pdb_blocks",
    "bare_pod": "bare_pod",
    "do_not_disrupt": "do_not_disrupt",
}
PROTECTIONS = tuple(CODES)


def standalone_plan(protected: str) -> Plan:
    node = gpu_node("solo", instance_type="g5.4xlarge", gpus=1, instance_id="i-solo", nodegroup=None)
    metrics = node_devices("solo", 1, util=const(30), fb_used=const(4096), power=const(100))
    parts = protection(protected, "solo")
    snap = snapshot(
        [node],
        parts["pods"],
        metrics,
        groups=[],
        pdbs=parts.get("pdbs"),
        pvcs=parts.get("pvcs"),
        pvs=parts.get("pvs"),
    )
    tags = {"rightsizer.io/resize": "allowed"}
    instances = {"i-solo": Ec2Instance("i-solo", "g5.4xlarge", tags, "ebs", "running")}
    snap = dataclasses.replace(snap, inventory=dataclasses.replace(snap.inventory, instances=instances))
    return plan(snap, RESIZE_POLICY, AT)


def test_an_unprotected_standalone_instance_gets_its_executable_resize() -> None:
    result = standalone_plan("none")
    [action] = result.actions
    assert action.kind == "resize_instance" and result.savings.hourly_usd == pytest.approx(1.624 - 1.006)


@pytest.mark.parametrize("protected", PROTECTIONS)
def test_a_protected_standalone_instance_gets_a_recommend_naming_the_refusal(protected: str) -> None:
    """BUG (issue 25): a hostPath / local PV pod left the resize executable; the workflow then abandoned it."""
    result = standalone_plan(protected)
    [action] = result.actions
    code = CODES[protected]
    assert any(r.startswith(code) for r in result.node("solo").reasons)
    assert action.kind == "recommend" and action.hourly_savings_usd is None
    assert "the resize preflight would refuse it" in action.reason and code in action.reason
    assert result.savings.hourly_usd == 0
    # The would-be saving is still a number, outside the executable savings.
    assert action.estimated_hourly_savings_usd == pytest.approx(1.624 - 1.006)
    assert action.estimated_monthly_savings_usd == pytest.approx((1.624 - 1.006) * 730)


def group_plan(protected: str) -> Plan:
    nodes = [
        gpu_node(name, instance_type="g5.12xlarge", gpus=4, instance_id=f"i-{i:017x}", nodegroup="ng")
        for i, name in enumerate(("n1", "n2"))
    ]
    group = dataclasses.replace(
        asg("eks-ng", [f"i-{i:017x}" for i in range(2)], min_size=1, nodegroup="ng"),
        tags={TAG_ENABLED: "true"},
    )
    parts = protection(protected, "n1")
    pods = [*parts["pods"], pod("api-1", "n2", gpus=1, cpu="2", memory="8Gi")]
    hot = {"util": const(40), "fb_used": const(6000), "power": const(150)}
    metrics = merge_metrics(*(node_devices(n, 4, per_gpu={0: hot}) for n in ("n1", "n2")))
    snap = snapshot(
        nodes,
        pods,
        metrics,
        groups=[group],
        pdbs=parts.get("pdbs"),
        pvcs=parts.get("pvcs"),
        pvs=parts.get("pvs"),
    )
    return plan(snap, Policy(allow_replace_node_group=True, cooldown=0), AT)


def test_an_unprotected_managed_group_is_replaced() -> None:
    assert [a.kind for a in group_plan("none").actions] == ["replace_node_group"]


@pytest.mark.parametrize("protected", PROTECTIONS)
def test_one_protected_node_keeps_its_managed_group_from_being_replaced(protected: str) -> None:
    """BUG (issue 25): a group with one hostPath node got replace_node_group; CreateNodegroup ran, then
    the refused child drain was retried until the drain deadline."""
    result = group_plan(protected)
    assert {a.kind for a in result.actions} == {"recommend"} and result.savings.hourly_usd == 0
    # Every node's recommend names the refusal (the refused node and its reason code).
    for action in result.actions:
        assert f"replace_node_group of ng refused: {CODES[protected]}:n1" in action.reason, action.reason
    assert all(a.estimated_hourly_savings_usd and a.estimated_hourly_savings_usd > 0 for a in result.actions)


def test_guards_are_ordered_entries_and_the_first_refusing_one_names_the_workflow_reason() -> None:
    busy_and_held = Judged("busy", ("activity_above_threshold:0", "local_storage:default/api-0"))
    facts = DrainFacts(busy_and_held, asg=None)
    assert [g.name for g in DRAIN_GUARDS] == ["gpu_node", "assessment", "in_a_group"]
    assert [r.reason for r in drain_refusals(facts)] == [
        "activity_above_threshold:0",
        "local_storage:default/api-0",
        "node_group_unknown:standalone",
    ]
    assert [r.guard for r in drain_refusals(facts)] == ["assessment", "assessment", "in_a_group"]
    message = first_refusal_message(DRAIN_GUARDS, facts)
    assert message == "not_a_candidate:activity_above_threshold:0,local_storage:default/api-0"
    assert first_refusal_message(DRAIN_GUARDS, DrainFacts(Judged("idle"), asg="eks-ng")) is None


def test_a_guard_is_one_entry() -> None:
    """What another engineer does to add a protection: one more Guard in the kind's tuple."""
    from rightsizer.domain.eligibility import Guard

    spot: Guard[DrainFacts] = Guard(
        "spot", lambda f: [Refusal("spot_interruption")] if f.asg == "spot" else []
    )
    guards = (*DRAIN_GUARDS, spot)
    assert [r.reason for r in refusals(guards, DrainFacts(Judged("idle"), asg="spot"))] == [
        "spot_interruption"
    ]
    assert refusals(guards, DrainFacts(Judged("idle"), asg="od")) == ()
    assert RESIZE_GUARDS[0].name == "allow_resize"


@pytest.mark.parametrize(
    ("verdict", "reasons", "mode", "refused"),
    [
        ("idle", ("cooldown:30s",), "scale_in", True),
        ("idle", ("cooldown:30s",), "offhours", False),
        ("busy", ("activity_above_threshold:0",), "replace", False),
        ("busy", ("activity_above_threshold:0", "local_storage:a/b"), "replace", True),
        ("protected", ("in_flight:me",), "scale_in", False),
        ("protected", ("in_flight:other",), "scale_in", True),
        ("unknown", ("stale_metrics:0",), "replace", True),
        (None, (), "scale_in", True),
    ],
)
def test_drain_modes(verdict: Any, reasons: tuple[str, ...], mode: Any, refused: bool) -> None:
    facts = DrainFacts(Judged(verdict, reasons), asg="g", mode=mode, execution_id="me")
    assert bool(drain_refusals(facts)) is refused
