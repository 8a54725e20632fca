"""A sharded assessment decides exactly as the unsharded one (issue 33 item 3, ``domain.shard``).

Generated clusters (node groups of several sizes, nodes of no group, idle/busy/frozen/missing devices, GPU
holders, PDB-protected pods, Pending GPU pods, in-flight cordons, budgets, ``min_size``) are planned once
from one whole-cluster read, and again from shards cut at several sizes: each shard reads only its nodes'
pods and series and reduces them itself, the partials travel through their JSON codec and the merge's own
decoding (``adapters.shard_codec.RunDecoder``: pods from the bytes into compact models), and the merge puts them
back beside the cluster-wide facts. The plans must be equal, field for field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.adapters.shard_codec import RunDecoder
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.gpu import is_gpu_node
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import ANN_CORDONED_BY, ClusterSnapshot, MetricData
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.shard import (
    PARTIAL_CODEC,
    SPECS_CODEC,
    ShardPartial,
    ShardsIncomplete,
    cut_shards,
    merge_shards,
)
from rightsizer.domain.usage import CollectedSignals, Window, collect_signals
from tests.builders import const, gpu_node, merge_metrics, node_devices, pdb, pod, room_node, snapshot

STATES = ("idle", "idle", "idle", "busy", "frozen", "missing", "holder", "pdb", "job", "flying")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, Policy]:
    groups = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    loose = draw(st.integers(0, 4))
    nodes: list[dict[str, Any]] = [room_node()]
    pods: list[dict[str, Any]] = []
    parts = []
    pdbs = []
    index = 0
    members = [(f"ng-{g}", size) for g, size in enumerate(groups)] + [(None, loose)]
    for group, size in members:
        for _ in range(size):
            name = f"gpu-{draw(st.integers(0, 999)):03d}-{index}"
            index += 1
            state = draw(st.sampled_from(STATES))
            ann = {ANN_CORDONED_BY: "exec-old"} if state == "flying" else {}
            nodes.append(
                gpu_node(
                    name,
                    instance_type="g5.xlarge",
                    gpus=1,
                    instance_id=f"i-{index:08x}",
                    nodegroup=group,
                    annotations=ann,
                    unschedulable=state == "flying",
                )
            )
            if state == "busy":
                parts.append(node_devices(name, 1, util=const(90)))
            elif state == "frozen":
                parts.append(node_devices(name, 1, energy="frozen", power=const(30)))
            elif state != "missing":
                parts.append(node_devices(name, 1))
            if state == "holder":
                pods.append(pod(f"nb-{index}", name, gpus=1, namespace="team-a"))
            elif state == "job":
                pods.append(pod(f"job-{index}", name, owner=("Job", "batch/v1")))
            elif state == "pdb":
                pods.append(pod(f"web-{index}", name, namespace="web", labels={"app": f"w{index}"}))
                pdbs.append(pdb(f"w{index}", "web", {"app": f"w{index}"}, draw(st.integers(0, 1))))
            pods.append(pod(f"worker-{index}", name, namespace="batch"))
    if draw(st.booleans()):
        pods.append(pod("wants-gpu", None, gpus=1, phase="Pending"))
    policy = Policy(
        max_nodes_per_run=draw(st.integers(0, 6)),
        max_nodes_per_node_group=draw(st.sampled_from([1, 2, "50%", "100%"])),
        consolidation=draw(st.sampled_from(["off", "all"])),
        cooldown=0,
    )
    pods.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))  # the API's list order
    return snapshot(nodes, pods, merge_metrics(*parts), pdbs=pdbs), policy


def _signals(
    snap: ClusterSnapshot, joiner: NodeJoiner, metrics: dict[str, MetricData], policy: Policy
) -> Any:
    window = Window.ending(snap.meta.taken_at, policy.idle_window, snap.meta.step_seconds)
    return collect_signals(metrics, snap.timestamps, joiner, window, policy.gpu_activity_max_pct)


def unsharded(snap: ClusterSnapshot, policy: Policy) -> ClusterSnapshot:
    """The live assessment's snapshot: every series read at once and reduced over the whole cluster."""
    joiner = NodeJoiner(snap.nodes, snap.pods)
    return dataclasses.replace(snap, signals=_signals(snap, joiner, snap.metrics, policy), source="live")


def sharded(snap: ClusterSnapshot, policy: Policy, per_shard: int) -> ClusterSnapshot:
    """Cut, observe each shard on its own (its pods, its series), encode, decode, merge."""
    catalog = load_catalog()
    gpu = [n for n in snap.nodes if is_gpu_node(n, catalog)]
    specs = SPECS_CODEC.validate_json(SPECS_CODEC.dump_json(cut_shards(gpu, per_shard)))
    assert sorted(n for s in specs for n in s.nodes) == sorted(n.name for n in gpu)
    assert all(len(s.nodes) <= per_shard for s in specs)
    partials = []
    decoder = RunDecoder()
    for spec in reversed(specs):  # any completion order
        mine = set(spec.nodes)
        nodes = [n for n in snap.nodes if n.name in mine]
        pods = tuple(p for p in snap.pods if p.spec.nodeName in mine)
        metrics = {
            k: dataclasses.replace(m, series=tuple(s for s in m.series if s.labels.get("node") in mine))
            for k, m in snap.metrics.items()
        }
        signals = _signals(snap, NodeJoiner(nodes, pods), metrics, policy)
        partial = ShardPartial("run-1", spec.id, spec.nodes, pods, signals)
        # the merge's own decoding: pods from the bytes, equal parts shared across partials
        partials.append(decoder.partial(PARTIAL_CODEC.dump_json(partial)))
    decoder.close()
    partials.append(partials[0])  # a retried shard's partial read twice counts once
    base = dataclasses.replace(snap, pods=tuple(p for p in snap.pods if not p.spec.nodeName), metrics={})
    return merge_shards(base, specs, partials)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.sampled_from([1, 2, 3, 5, 8]))
def test_a_sharded_plan_is_the_unsharded_plan(case: tuple[ClusterSnapshot, Policy], per_shard: int) -> None:
    snap, policy = case
    whole = plan(unsharded(snap, policy), policy)
    cut = plan(sharded(snap, policy, per_shard), policy)
    assert cut == whole


def test_shards_keep_groups_whole_when_they_fit_and_cut_big_groups_into_name_ranges() -> None:
    from rightsizer.domain.model import Node

    nodes = (
        [Node.model_validate(gpu_node(f"a-{i}", nodegroup="a")) for i in range(3)]
        + [Node.model_validate(gpu_node(f"b-{i}", nodegroup="b")) for i in range(5)]
        + [Node.model_validate(gpu_node(f"c-{i}", nodegroup="c")) for i in range(1)]
        + [Node.model_validate(gpu_node(f"z-{i}", nodegroup=None)) for i in range(3)]
    )
    specs = cut_shards(nodes, 4)
    assert [(s.id, s.node_groups, s.nodes) for s in specs] == [
        ("s0000", ("a",), ("a-0", "a-1", "a-2")),
        ("s0001", ("b",), ("b-0", "b-1", "b-2", "b-3")),
        ("s0002", ("b",), ("b-4",)),
        ("s0003", ("c",), ("c-0",)),
        ("s0004", (), ("z-0", "z-1", "z-2")),
    ]
    with pytest.raises(ValueError, match="per_shard"):
        cut_shards(nodes, 0)


def test_the_merge_refuses_a_missing_or_foreign_shard() -> None:
    snap = snapshot([gpu_node("a-0", nodegroup="a"), gpu_node("b-0", nodegroup="b")])
    specs = cut_shards(list(snap.nodes), 1)
    first = ShardPartial("r", "s0000", ("a-0",), (), CollectedSignals())
    with pytest.raises(ShardsIncomplete, match="s0001"):
        merge_shards(snap, specs, [first])
    with pytest.raises(ShardsIncomplete, match="other nodes"):
        merge_shards(snap, specs, [first, ShardPartial("r", "s0001", ("a-0",))])
    with pytest.raises(ShardsIncomplete, match="unknown shard"):
        merge_shards(snap, specs, [first, ShardPartial("r", "s0009", ("x",))])
