"""Hypothesis properties of ``plan``: safety, budgets, determinism, re-planning after cordon."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY, ClusterSnapshot, Node
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import asg, const, gpu_node, merge_metrics, node_devices, pod, snapshot

STATES = ("idle", "busy", "frozen", "missing", "holder", "job", "bare", "dnd")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, Policy]:
    n = draw(st.integers(1, 9))
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    parts = []
    members: dict[str, list[str]] = {"ga": [], "gb": []}
    for i in range(n):
        name = f"n{i}"
        group = draw(st.sampled_from(("ga", "gb")))
        state = draw(st.sampled_from(STATES))
        ann = {"rightsizer.io/do-not-disrupt": "true"} if state == "dnd" else {}
        nodes.append(
            gpu_node(
                name,
                instance_type="g5.xlarge",
                gpus=1,
                instance_id=f"i-{i}",
                nodegroup=group,
                annotations=ann,
            )
        )
        members[group].append(f"i-{i}")
        if state == "busy":
            parts.append(node_devices(name, 1, util=const(90)))
        elif state == "frozen":
            parts.append(node_devices(name, 1, energy="frozen", power=const(30)))
        elif state != "missing":
            parts.append(node_devices(name, 1))
        if state == "holder":
            pods.append(pod(f"nb-{i}", name, gpus=1))
        elif state == "job":
            pods.append(pod(f"job-{i}", name, owner=("Job", "batch/v1")))
        elif state == "bare":
            pods.append(pod(f"bare-{i}", name, owner=None))
    groups = []
    for g, ids in members.items():
        if ids:
            min_size = draw(st.integers(0, len(ids)))
            groups.append(asg(f"asg-{g}", ids, min_size=min_size, nodegroup=g))
    per_group = draw(st.one_of(st.integers(0, 3), st.sampled_from(["10%", "50%", "100%"])))
    policy = Policy(max_nodes_per_run=draw(st.integers(0, 4)), max_nodes_per_node_group=per_group)
    return snapshot(nodes, pods, merge_metrics(*parts), groups=groups), policy


def _check_budgets(
    snap: ClusterSnapshot, policy: Policy, removals: list[str], in_flight: Counter[str]
) -> None:
    node_group = {n.name: n.labels["eks.amazonaws.com/nodegroup"] for n in snap.nodes}
    per_group = Counter(node_group[r] for r in removals)
    assert len(removals) + sum(in_flight.values()) <= max(policy.max_nodes_per_run, sum(in_flight.values()))
    for g, count in per_group.items():
        info = snap.inventory.groups[f"asg-{g}"]
        assert count + in_flight[g] <= policy.node_group_budget(info.desired)
        assert info.desired - count - in_flight[g] >= info.min_size


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_plan_is_safe_within_budget_and_deterministic(case: tuple[ClusterSnapshot, Policy]) -> None:
    snap, policy = case
    first = plan(snap, policy)
    assert first == plan(snap, policy)
    verdict = {n.node: n.verdict for n in first.nodes}
    removals = [a.node for a in first.actions if a.kind == "scale_in"]
    assert all(r is not None and verdict[r] == "idle" for r in removals)
    assert not any(verdict[n] in ("unknown", "protected", "busy") for n in removals if n)
    _check_budgets(snap, policy, [r for r in removals if r], Counter())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_cordoning_victims_and_replanning_stays_within_budget(case: tuple[ClusterSnapshot, Policy]) -> None:
    snap, policy = case
    victims = {a.node for a in plan(snap, policy).actions if a.kind == "scale_in"}
    cordoned = []
    for n in snap.nodes:
        if n.name in victims:
            meta = n.metadata.model_copy(
                update={
                    "annotations": {**n.metadata.annotations, ANN_CORDONED_BY: "exec-1", ANN_CORDONED_AT: "x"}
                }
            )
            n = Node.model_validate(
                {
                    **n.model_dump(),
                    "metadata": meta.model_dump(),
                    "spec": {**n.spec.model_dump(), "unschedulable": True},
                }
            )
        cordoned.append(n)
    again = plan(replace(snap, nodes=tuple(cordoned)), policy)
    new = [a.node for a in again.actions if a.kind == "scale_in"]
    assert not set(new) & victims
    in_flight = Counter(n.labels["eks.amazonaws.com/nodegroup"] for n in cordoned if n.name in victims)
    _check_budgets(snap, policy, [r for r in new if r], in_flight)
    for name in victims:
        assert again.node(name).verdict == "protected"
        assert again.node(name).reasons[0].startswith("in_flight:exec-1")
