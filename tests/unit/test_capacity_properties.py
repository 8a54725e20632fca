"""Issue 28 properties: never an action on a kept reservation, never below a warm floor, ``unhealthy``
never ``idle``, unhealthy nodes removed first; and the off-hours decision at a warm floor."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.domain.model import ClusterSnapshot, Ec2Instance, GroupSizes
from rightsizer.domain.offhours import GroupFacts, OffhoursAction, decide
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.verdicts import code_of, verdict_of
from tests.builders import asg, gpu_node, merge_metrics, node_devices, pod, snapshot

STATES = ("idle", "busy", "reserved", "broken", "broken_holder")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, Policy]:
    n = draw(st.integers(1, 8))
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    parts = []
    members: dict[str, list[str]] = {"p5": [], "g5": []}
    instances: dict[str, Ec2Instance] = {}
    for i in range(n):
        name, iid = f"n{i}", f"i-{i}"
        group = draw(st.sampled_from(("p5", "g5")))
        state = draw(st.sampled_from(STATES))
        itype, gpus, fb = ("p5.48xlarge", 8, 81559.0) if group == "p5" else ("g5.xlarge", 1, 23028.0)
        node = gpu_node(name, instance_type=itype, gpus=gpus, instance_id=iid, nodegroup=group)
        if state.startswith("broken"):
            node["status"]["conditions"].append(
                {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error"}
            )
        nodes.append(node)
        members[group].append(iid)
        util = 90.0 if state == "busy" else 0.0
        parts.append(node_devices(name, gpus, fb_total=fb, util=lambda _i, u=util: u))
        if state == "broken_holder":
            pods.append(pod(f"train-{i}", name, gpus=1))
        reservation = "cr-1" if state == "reserved" else None
        instances[iid] = Ec2Instance(iid, itype, {}, "ebs", "running", "", reservation, "us-east-1a")
    repair = draw(st.booleans())  # EKS node repair on every group
    groups = [
        replace(asg(f"asg-{g}", ids, nodegroup=g, min_size=draw(st.integers(0, 1))), node_repair=repair)
        for g, ids in members.items()
        if ids
    ]
    snap = snapshot(nodes, pods, merge_metrics(*parts), groups=groups)
    snap = replace(snap, inventory=replace(snap.inventory, instances=instances))
    budget = draw(st.integers(1, 8))
    return snap, Policy(max_nodes_per_run=budget, max_nodes_per_node_group=budget)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_reservations_floors_and_health_hold_in_every_plan(case: tuple[ClusterSnapshot, Policy]) -> None:
    snap, policy = case
    result = plan(snap, policy)
    reports = {r.node: r for r in result.nodes}
    acted = {a.node for a in result.actions if a.node}
    removed = [a.node for a in result.actions if a.kind == "scale_in" and a.node]
    for r in result.nodes:
        codes = {code_of(x) for x in r.reasons}
        # never an action on a reserved node by default
        if "capacity_reserved" in codes:
            assert r.node not in acted
        # unhealthy is never idle
        if codes & {"accelerated_hardware_not_ready", "gpus_unallocatable", "xid"}:
            assert r.verdict == "unhealthy"
        # a node with a GPU holder is never removed for health
        if r.node in removed:
            assert r.verdict in ("idle", "unhealthy") and not any(c == "idle_gpu_holder" for c in codes)
    # never below a warm floor (p5: 1)
    by_group = Counter(reports[n].node_group for n in removed)
    p5_total = sum(1 for r in result.nodes if r.node_group == "p5")
    if p5_total:
        assert p5_total - by_group["p5"] >= min(1, p5_total)
    # unhealthy first: no healthy idle node of a group is removed while a removable unhealthy one stays
    for group in by_group:
        healthy_gone = [n for n in removed if reports[n].node_group == group and reports[n].verdict == "idle"]
        if not healthy_gone:
            continue
        for r in result.nodes:
            if r.node_group != group or r.verdict != "unhealthy" or r.node in removed:
                continue
            rest = [
                x
                for x in r.reasons
                if code_of(x) not in ("accelerated_hardware_not_ready", "unhealthy_pending_repair")
            ]
            below_floor = any(code_of(x) == "warm_floor" for x in r.reasons)
            assert verdict_of(rest) != "idle" or below_floor, (r.node, r.reasons, removed)


def _report(node: str, reasons: list[str]) -> NodeReport:
    return NodeReport(node=node, verdict=verdict_of(reasons), reasons=reasons, node_group="p5",
                      instance_id=f"i-{node}", instance_type="p5.48xlarge", gpus=8, gpu_activity_max_pct=0.0,
                      fb_used_max_mib=0.0, coverage=1.0, hourly_usd=55.04)  # fmt: skip


NOW = datetime(2024, 5, 18, 11, 0, tzinfo=UTC)


def test_offhours_goes_down_to_the_warm_floor_and_holds_there() -> None:
    floor = ["warm_floor:p5.48xlarge:1"]
    facts = GroupFacts(
        "down",
        NOW,
        None,
        GroupSizes(1, 3, 4),
        members=("a", "b", "c"),
        verdicts={
            "a": _report("a", ["idle_window_clean"]),
            "b": _report("b", ["accelerated_hardware_not_ready:NvidiaXID79Error"]),
            "c": _report("c", ["idle_window_clean"]),
        },
    )
    decision = decide(facts, Policy())
    assert decision.action == OffhoursAction.DRAIN_THEN_SCALE_DOWN
    assert decision.drain == ("b", "a", "c")  # the unhealthy node first
    last = GroupFacts(
        "down", NOW, None, GroupSizes(0, 1, 4), members=("c",), verdicts={"c": _report("c", floor)}
    )
    held = decide(last, Policy())
    assert held.action == OffhoursAction.HOLD and held.reasons == tuple(floor) and held.drain == ()
    mixed = GroupFacts("down", NOW, None, GroupSizes(0, 2, 4), members=("a", "c"),
                       verdicts={"a": _report("a", ["idle_window_clean"]), "c": _report("c", floor)})  # fmt: skip
    went = decide(mixed, Policy())
    assert went.drain == ("a",) and went.then == GroupSizes(0, 1, 4)
