"""Consolidation in the plan (``domain.consolidation``): which node is emptied, its moves, and why not."""

from __future__ import annotations

from typing import Any

import pytest

from rightsizer.domain.consolidation import consolidation_refusals
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import const, gpu_node, merge_metrics, node_devices, pod, snapshot

BUSY = {"util": const(80.0), "fb_used": const(9000.0), "power": const(200.0)}


def _cluster(
    *, room_gpus: int = 4, a_util: float = 0.0, extra_pods: list[dict[str, Any]] | None = None
) -> Any:
    """Three 8-GPU nodes of one group: ``a`` holds two idle 1-GPU pods, ``b`` runs ``8 - room_gpus``
    busy GPUs, ``c`` runs six busy GPUs (``a``'s activity ``a_util`` percent on GPU 0)."""
    nodes = [gpu_node(n, instance_type="g5.48xlarge", gpus=8) for n in ("a", "b", "c")]
    pods = [
        pod("holder-1", "a", gpus=1),
        pod("holder-2", "a", gpus=1),
        pod("cpu-side", "a", cpu="500m"),
        pod("train", "b", gpus=8 - room_gpus),
        pod("serve", "c", gpus=6),
        *(extra_pods or []),
    ]
    busy_b = dict.fromkeys(range(8 - room_gpus), BUSY)
    metrics = merge_metrics(
        node_devices("a", 8, per_gpu={0: {"util": const(a_util)}}),
        node_devices("b", 8, per_gpu=busy_b),
        node_devices("c", 8, per_gpu=dict.fromkeys(range(6), BUSY)),
    )
    return snapshot(nodes, pods, metrics)


def _consolidations(snap: Any, mode: str, **policy: Any) -> list[Any]:
    return [a for a in plan(snap, Policy(consolidation=mode, **policy)).actions if a.kind == "consolidate"]


def test_off_by_default_proposes_nothing() -> None:
    result = plan(_cluster(), Policy())
    assert not [a for a in result.actions if a.kind == "consolidate"]
    assert result.node("a").verdict == "protected"  # idle GPU holders


def test_idle_holders_empties_the_idle_node_onto_the_fullest_with_room() -> None:
    (action,) = _consolidations(_cluster(), "idle_holders")
    assert action.node == "a" and action.node_group == "gpu-a10g"
    assert [(m.pod, m.to) for m in action.moves] == [
        ("default/holder-1", "c"),
        ("default/holder-2", "c"),
        ("default/cpu-side", "c"),
    ]
    assert action.hourly_savings_usd is not None and action.hourly_savings_usd > 0
    assert action.to == action.from_ - 1
    doc = plan(_cluster(), Policy(consolidation="idle_holders")).to_json_dict()
    consolidate = next(a for a in doc["actions"] if a["kind"] == "consolidate")
    assert consolidate["moves"][0] == {"pod": "default/holder-1", "to": "c"}
    assert all("moves" not in a for a in doc["actions"] if a["kind"] != "consolidate")


def test_idle_holders_never_moves_pods_of_a_node_with_a_busy_gpu() -> None:
    assert _consolidations(_cluster(a_util=90.0), "idle_holders") == []


def test_all_moves_busy_pods_least_used_node_first() -> None:
    (action,) = _consolidations(_cluster(a_util=90.0), "all")
    assert action.node == "a"  # one busy GPU: less used than b (4) and c (6)


def test_no_room_gives_typed_reasons() -> None:
    crowded = [pod("more", "c", gpus=2)]
    snap = _cluster(room_gpus=0, extra_pods=crowded)
    result = plan(snap, Policy(consolidation="idle_holders"))
    assert not [a for a in result.actions if a.kind == "consolidate"]
    assert "no_placement:default/holder-1:gpu" in result.node("a").reasons


def test_budget_bounds_consolidations_and_the_same_input_gives_the_same_plan() -> None:
    snap = _cluster()
    one = plan(snap, Policy(consolidation="all", max_nodes_per_run=1))
    assert [a.node for a in one.actions if a.kind == "consolidate"] == ["a"]
    assert plan(snap, Policy(consolidation="all", max_nodes_per_run=1)) == one


def test_a_protection_still_refuses() -> None:
    snap = _cluster(extra_pods=[pod("precious", "a", annotations={"karpenter.sh/do-not-disrupt": "true"})])
    chosen = _consolidations(snap, "all")
    assert [a.node for a in chosen] == ["b"]  # not a: its pod may not be disrupted; b's pods fit on a
    assert [(m.pod, m.to) for m in chosen[0].moves] == [("default/train", "a")]


@pytest.mark.parametrize(
    ("reasons", "mode", "blocking"),
    [
        (["idle_gpu_holder:ns/p"], "idle_holders", []),
        (["activity_above_threshold"], "idle_holders", ["activity_above_threshold"]),
        (["activity_above_threshold", "idle_gpu_holder:ns/p"], "all", []),
        (["stale_metrics"], "all", ["stale_metrics"]),
        (["pdb_blocks:ns/p:x"], "all", ["pdb_blocks:ns/p:x"]),
        ([], "off", ["consolidation_off"]),
    ],
)
def test_consolidation_refusals(reasons: list[str], mode: str, blocking: list[str]) -> None:
    assert consolidation_refusals(reasons, mode) == blocking


def test_cpu_pods_pinning_a_gpu_node_are_named_with_advice() -> None:
    nodes = [gpu_node("g", instance_type="g5.xlarge", gpus=1)]
    snap = snapshot(nodes, [pod("web", "g", cpu="2")], node_devices("g", 1))
    result = plan(snap, Policy())
    assert "cpu_pods_pin_gpu_node:1" in result.node("g").reasons
    advice = [a for a in result.actions if a.kind == "recommend" and "CPU-only pods" in a.reason]
    assert advice and "taint the GPU node group" in advice[0].reason
