"""The placement simulation (``domain.placement``), table-tested on the situations Cluster Autoscaler's and
Karpenter's own tests check before a node is removed, plus properties.

Sources (situations translated, not code):
- kubernetes/autoscaler ``cluster-autoscaler/simulator/cluster_test.go`` at
  fad686801d5b93d9221ed7e6b4d5f11ae27a5845, ``TestFindNodesToRemove``: "just a drainable node, but nowhere
  for pods to go to", "drainable node, and a full node that cannot fit anymore pods", "drainable node, and
  a mostly empty node that can take its pods", "4 nodes, 1 empty, 1 drainable".
- kubernetes-sigs/karpenter ``pkg/controllers/disruption/consolidation_test.go`` at
  2266468104f36373ed002241afaee2d3bbc26078: "won't delete node if it would require pods to schedule on an
  uninitialized node" (l. 3004), "can delete nodes with a permanently pending pod" (l. 3390), "won't
  delete nodes if it would make a non-pending pod go pending" (l. 3442), "can replace node maintaining
  zonal topology spread" (l. 4525), "won't delete node if it would violate pod anti-affinity" (l. 4599).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rightsizer.domain.model import Node, NodeSelector, Pod
from rightsizer.domain.placement import Move, Placement, PlacementState, Unplaced
from rightsizer.domain.placement_demand import DraClaimFacts, demand_of
from tests.builders import gpu_node, pod

ZONE = "topology.kubernetes.io/zone"


def node(name: str, *, zone: str = "us-east-1a", gpus: int = 8, **kw: Any) -> Node:
    labels = {ZONE: zone, **kw.pop("labels", {})}
    return Node.model_validate(gpu_node(name, gpus=gpus, labels=labels, **kw))


def cpu_node(name: str, *, cpu: str = "4", zone: str = "us-east-1a") -> Node:
    raw = gpu_node(name, gpus=0, labels={ZONE: zone})
    raw["metadata"]["labels"].pop("nvidia.com/gpu.present")
    raw["status"]["capacity"] = {"cpu": cpu, "memory": "16Gi", "pods": "110"}
    raw["status"]["allocatable"] = dict(raw["status"]["capacity"])
    return Node.model_validate(raw)


def p(name: str, where: str | None, **kw: Any) -> Pod:
    return Pod.model_validate(pod(name, where, **kw))


def simulate(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    source: str,
    *,
    dra: DraClaimFacts | None = None,
    dra_free: Mapping[str, Mapping[str, int]] | None = None,
    volumes: Mapping[str, tuple[tuple[str, NodeSelector], ...]] | None = None,
) -> Placement:
    facts = dra or DraClaimFacts()

    def demand(x: Pod) -> Any:
        return demand_of(x, (volumes or {}).get(x.key, ()), dra=facts)

    state = PlacementState(
        nodes, [(x.spec.nodeName, demand(x)) for x in pods if x.spec.nodeName], dra_free=dra_free
    )
    state.settle_pending([demand(x) for x in pods if not x.spec.nodeName])
    movers = [demand(x) for x in pods if x.spec.nodeName == source]
    return state.simulate([source], movers)


def causes(result: Placement) -> dict[str, str]:
    return {u.pod: u.cause for u in result.unplaced}


def test_ca_just_a_drainable_node_but_nowhere_for_pods_to_go() -> None:
    result = simulate([node("n2")], [p("p1", "n2"), p("p2", "n2")], "n2")
    assert causes(result) == {"default/p1": "unknown", "default/p2": "unknown"}


def test_ca_drainable_node_and_a_full_node_that_cannot_fit_more() -> None:
    nodes = [node("n2"), node("n4")]
    pods = [p("p1", "n2", cpu="100m"), p("p2", "n2", cpu="100m"), p("p4", "n4", cpu="47")]
    assert causes(simulate(nodes, pods, "n2")) == {"default/p1": "cpu", "default/p2": "cpu"}


def test_ca_mostly_empty_node_takes_the_pods() -> None:
    nodes = [node("n2"), node("n3")]
    pods = [p("p1", "n2", cpu="100m"), p("p2", "n2", cpu="100m"), p("p3", "n3", cpu="100m")]
    result = simulate(nodes, pods, "n2")
    assert result.ok and {m.to for m in result.moves} == {"n3"}


@pytest.mark.parametrize(
    ("free_gpus", "want", "cause"),
    [(2, 2, None), (2, 3, "gpu"), (0, 1, "gpu")],
    ids=["exactly-full", "over-by-one", "no-free-gpu"],
)
def test_gpu_count_exactly_full_and_over_by_one(free_gpus: int, want: int, cause: str | None) -> None:
    nodes = [node("src"), node("dst", gpus=4)]
    pods = [p("held", "dst", gpus=4 - free_gpus), p("mover", "src", gpus=want)]
    result = simulate(nodes, pods, "src")
    assert causes(result) == ({} if cause is None else {"default/mover": cause})
    if cause is None:
        assert result.moves == (Move("default/mover", "dst"),)


def test_mig_profile_mismatch() -> None:
    dst = node("dst", gpus=0, capacity={"nvidia.com/mig-1g.10gb": "7"})
    mover = p("mover", "src", extra_spec={"containers": [
        {"name": "m", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}
    ]})  # fmt: skip
    assert causes(simulate([node("src"), dst], [mover], "src")) == {"default/mover": "mig"}


def test_mig_profile_match_fits() -> None:
    dst = node("dst", gpus=0, capacity={"nvidia.com/mig-3g.40gb": "2"})
    mover = p("mover", "src", extra_spec={"containers": [
        {"name": "m", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}
    ]})  # fmt: skip
    assert simulate([node("src"), dst], [mover], "src").moves == (Move("default/mover", "dst"),)


@pytest.mark.parametrize(
    ("taint", "tolerations", "cause"),
    [
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, [], "taint"),
        ({"key": "karpenter.sh/unregistered", "effect": "NoExecute"}, [], "taint"),
        ({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}, [], "taint"),
        (
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            None,
        ),
    ],
    ids=["gpu-taint", "karpenter-unregistered", "health-unreachable", "tolerated"],
)
def test_taint_not_tolerated(taint: dict[str, str], tolerations: list[Any], cause: str | None) -> None:
    nodes = [node("src"), node("dst", taints=[taint])]
    mover = p("mover", "src", gpus=1, extra_spec={"tolerations": tolerations})
    assert causes(simulate(nodes, [mover], "src")) == ({} if cause is None else {"default/mover": cause})


def test_autoscaler_removal_taint_makes_no_target() -> None:
    dst = node("dst", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
    mover = p("mover", "src", gpus=1)
    assert causes(simulate([node("src"), dst], [mover], "src")) == {"default/mover": "gpu"}


def _anti(app: str) -> dict[str, Any]:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}}  # fmt: skip


def test_karpenter_wont_delete_node_if_it_would_violate_pod_anti_affinity() -> None:
    nodes = [node("src"), node("dst")]
    pods = [
        p("web-1", "dst", labels={"app": "web"}, extra_spec=_anti("web")),
        p("web-2", "src", labels={"app": "web"}, extra_spec=_anti("web")),
    ]
    assert causes(simulate(nodes, pods, "src")) == {"default/web-2": "anti_affinity"}


def test_anti_affinity_of_a_pod_already_there_refuses_the_newcomer() -> None:
    nodes = [node("src"), node("dst")]
    pods = [
        p("guard", "dst", labels={"app": "guard"}, extra_spec=_anti("web")),
        p("web-2", "src", labels={"app": "web"}),
    ]
    assert causes(simulate(nodes, pods, "src")) == {"default/web-2": "anti_affinity"}


def _spread(app: str) -> dict[str, Any]:
    return {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": app}},
    }]}  # fmt: skip


def test_do_not_schedule_spread() -> None:
    # zones a: 2 pods (one of them moves), b: 0 pods, on a node that cannot take more;
    # moving the pod from zone a to another a node makes skew 2 - 0 = 2 > 1.
    nodes = [node("src", zone="a"), node("dst-a", zone="a"), node("full-b", zone="b", gpus=1)]
    pods = [
        p("filler", "full-b", gpus=1, cpu="47"),
        p("web-1", "dst-a", labels={"app": "web"}, extra_spec=_spread("web")),
        p("web-2", "src", labels={"app": "web"}, extra_spec=_spread("web")),
        p("web-3", "dst-a", labels={"app": "web"}, extra_spec=_spread("web")),
    ]
    assert causes(simulate(nodes, pods, "src")) == {"default/web-2": "spread"}


def test_karpenter_maintains_zonal_topology_spread() -> None:
    nodes = [node("src", zone="a"), node("dst-a", zone="a"), node("dst-b", zone="b")]
    pods = [
        p("web-1", "dst-a", labels={"app": "web"}, extra_spec=_spread("web")),
        p("web-2", "src", labels={"app": "web"}, extra_spec=_spread("web")),
    ]
    result = simulate(nodes, pods, "src")
    assert result.moves == (Move("default/web-2", "dst-b"),)


def test_pvc_in_another_zone() -> None:
    zone_b = NodeSelector.model_validate(
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b"]}]}]}
    )
    nodes = [node("src", zone="b"), node("dst", zone="a")]
    mover = p("db", "src", volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}])
    result = simulate(nodes, [mover], "src", volumes={"default/db": (("data", zone_b),)})
    assert causes(result) == {"default/db": "volume_zone"}


def test_cordoned_target_is_no_target() -> None:
    nodes = [node("src"), node("dst", unschedulable=True)]
    assert causes(simulate(nodes, [p("m", "src", gpus=1)], "src")) == {"default/m": "gpu"}


def test_karpenter_wont_schedule_on_an_uninitialised_node() -> None:
    raw = gpu_node("dst", gpus=8, allocatable={"nvidia.com/gpu": "0"})
    nodes = [node("src"), Node.model_validate(raw)]
    assert causes(simulate(nodes, [p("m", "src", gpus=1)], "src")) == {"default/m": "gpu"}


def test_not_ready_target_is_no_target() -> None:
    raw = gpu_node("dst")
    raw["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes = [node("src"), Node.model_validate(raw)]
    assert causes(simulate(nodes, [p("m", "src", cpu="1")], "src")) == {"default/m": "unknown"}


@pytest.mark.parametrize(("want", "cause"), [(7, None), (8, "gpu")])
def test_target_with_7_of_8_gpus_allocatable(want: int, cause: str | None) -> None:
    raw = gpu_node("dst", gpus=8, allocatable={"nvidia.com/gpu": "7"})
    nodes = [node("src"), Node.model_validate(raw)]
    result = simulate(nodes, [p("m", "src", gpus=want)], "src")
    assert causes(result) == ({} if cause is None else {"default/m": cause})


def _claimed(name: str) -> Pod:
    return p(
        name, "src", extra_spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]}
    )


@pytest.mark.parametrize(
    ("free", "cause"), [(1, None), (0, "dra")], ids=["free-device", "device-class-has-no-free-device"]
)
def test_dra_claim_device_class_free_devices(free: int, cause: str | None) -> None:
    dra = DraClaimFacts(
        requests={"default/m-gpu": (("gpu.nvidia.com", 1),)}, classes={"gpu.nvidia.com": "gpu.nvidia.com"}
    )
    result = simulate(
        [node("src"), node("dst")],
        [_claimed("m")],
        "src",
        dra=dra,
        dra_free={"dst": {"gpu.nvidia.com": free}},
    )
    assert causes(result) == ({} if cause is None else {"default/m": cause})


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (DraClaimFacts(requests={"default/m-gpu": (("mystery", 1),)}), "DeviceClass mystery is not modelled"),
        (DraClaimFacts(), "requests were not observed"),
    ],
)
def test_unknown_device_class_cannot_be_verified(facts: DraClaimFacts, why: str) -> None:
    result = simulate([node("src"), node("dst")], [_claimed("m")], "src", dra=facts)
    assert causes(result) == {"default/m": "unknown"} and why in result.unplaced[0].detail


@pytest.mark.parametrize(
    "spec",
    [
        {"schedulerName": "volcano"},
        {"nodeSelector": {"kubernetes.io/hostname": "src"}},
    ],
    ids=["custom-scheduler", "pinned-by-name"],
)
def test_unmodelled_constraints_cannot_be_verified(spec: dict[str, Any]) -> None:
    result = simulate([node("src"), node("dst")], [p("m", "src", extra_spec=spec)], "src")
    assert causes(result) == {"default/m": "unknown"}
    assert result.unplaced[0].detail.startswith("cannot verify")


def test_karpenter_a_permanently_pending_pod_vetoes_nothing() -> None:
    nodes = [node("src"), node("dst")]
    pods = [p("m", "src", gpus=1), p("huge", None, phase="Pending", gpus=64)]
    assert simulate(nodes, pods, "src").ok


def test_a_pending_pod_that_fits_competes_for_the_room() -> None:
    nodes = [node("src"), node("dst", gpus=2)]
    pods = [p("m", "src", gpus=1), p("waiting", None, phase="Pending", gpus=2)]
    assert causes(simulate(nodes, pods, "src")) == {"default/m": "gpu"}


def test_host_port_conflict() -> None:
    ports = {"containers": [{"name": "m", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}
    nodes = [node("src"), node("dst")]
    pods = [p("a", "dst", extra_spec=ports), p("b", "src", extra_spec=ports)]
    assert causes(simulate(nodes, pods, "src")) == {"default/b": "host_port"}


def test_node_selector_and_required_node_affinity() -> None:
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}]
    }}}}  # fmt: skip
    nodes = [node("src"), node("dst")]
    pods = [p("a", "src", extra_spec=affinity), p("b", "src", node_selector={"pool": "x"})]
    assert causes(simulate(nodes, pods, "src")) == {"default/a": "affinity", "default/b": "affinity"}


def test_cpu_pods_prefer_cpu_nodes_and_gpu_pods_the_fullest_gpu_node() -> None:
    nodes = [node("src"), node("emptier", gpus=8), node("fuller", gpus=8), cpu_node("cpu")]
    pods = [p("held", "fuller", gpus=6), p("g", "src", gpus=2), p("c", "src", cpu="1")]
    result = simulate(nodes, pods, "src")
    assert set(result.moves) == {Move("default/g", "fuller"), Move("default/c", "cpu")}


def test_sequential_commits_never_reuse_capacity() -> None:
    nodes = [node("src"), node("dst", gpus=2)]
    pods = [p("a", "src", gpus=1), p("b", "src", gpus=1), p("c", "src", gpus=1)]
    result = simulate(nodes, pods, "src")
    assert len(result.moves) == 2 and causes(result) == {"default/c": "gpu"}


def test_undo_restores_the_state() -> None:
    nodes = [node("src"), node("dst", gpus=2)]
    demand = demand_of(p("a", "src", gpus=2))
    state = PlacementState(nodes, [("src", demand)])
    mark = state.mark()
    assert state.simulate(["src"], [demand]).ok
    state.undo(mark)
    assert state.node_of("default/a") == "src" and state.is_target("src")
    assert state.simulate(["src"], [demand]).ok  # dst still has both GPUs


# ---------------------------------------------------------------------------- properties
_cluster = st.tuples(
    st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=5),  # allocatable GPUs per target
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=12),  # (target index, GPUs) held
    st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=10),  # GPUs of pods that move
)


def _run(
    data: tuple[list[int], list[tuple[int, int]], list[int]],
) -> tuple[Placement, dict[str, int], list[Pod]]:
    sizes, held, moving = data
    nodes = [node("src", gpus=8)]
    alloc: dict[str, int] = {}
    for i, g in enumerate(sizes):
        raw = gpu_node(f"t{i}", gpus=8, allocatable={"nvidia.com/gpu": str(g)})
        nodes.append(Node.model_validate(raw))
        alloc[f"t{i}"] = g
    used = dict.fromkeys(alloc, 0)
    pods: list[Pod] = []
    for k, (i, g) in enumerate(held):
        name = f"t{i % len(sizes)}"
        if g and used[name] + g <= alloc[name]:
            used[name] += g
            pods.append(p(f"held-{k}", name, gpus=g, cpu="100m"))
    pods += [p(f"m-{k}", "src", gpus=g, cpu="100m") for k, g in enumerate(moving)]
    return simulate(nodes, pods, "src"), alloc, pods


@settings(max_examples=60, deadline=None)
@given(_cluster)
def test_never_over_allocatable_and_never_two_pods_on_one_gpu(
    data: tuple[list[int], list[tuple[int, int]], list[int]],
) -> None:
    result, alloc, pods = _run(data)
    gpus = {x.key: x.gpu_request() for x in pods}
    load = {x.spec.nodeName: 0 for x in pods}
    for x in pods:
        if x.spec.nodeName != "src":
            load[x.spec.nodeName] += gpus[x.key]
    for move in result.moves:
        load[move.to] = load.get(move.to, 0) + gpus[move.pod]
    # exclusive GPUs: the pods on a node never ask for more devices than it has, so no device serves two
    assert all(load[n] <= alloc[n] for n in alloc if n in load)
    placed = {m.pod for m in result.moves} | {u.pod for u in result.unplaced}
    assert placed == {x.key for x in pods if x.spec.nodeName == "src"}


@settings(max_examples=40, deadline=None)
@given(_cluster)
def test_sequential_commits_keep_what_a_fresh_state_would_not_give_twice(
    data: tuple[list[int], list[tuple[int, int]], list[int]],
) -> None:
    """Every move committed is room taken: re-placing the same movers on the state after the first
    simulation never finds more room than the free GPUs left."""
    result, alloc, pods = _run(data)
    free_before = sum(alloc.values()) - sum(
        x.gpu_request() for x in pods if x.spec.nodeName not in (None, "src")
    )
    moved = sum(x.gpu_request() for x in pods if x.key in {m.pod for m in result.moves})
    assert moved <= free_before


@settings(max_examples=30, deadline=None)
@given(_cluster)
def test_the_same_input_gives_the_same_placement(
    data: tuple[list[int], list[tuple[int, int]], list[int]],
) -> None:
    assert _run(data)[0] == _run(data)[0]


def test_unplaced_reason_is_typed() -> None:
    assert Unplaced("ns/p", "gpu", "x").reason == "no_placement:ns/p:gpu"


# ---------------------------------------------------------------------------- the guard on scale_in
def _plan_of(room: bool) -> Any:
    from rightsizer.domain.planner import plan
    from rightsizer.domain.policy import Policy
    from tests.builders import node_devices, snapshot

    snap = snapshot(
        [gpu_node("idle", instance_type="g5.xlarge", gpus=1)],
        [pod("web-1", "idle", cpu="2"), pod("web-2", "idle", cpu="2")],
        node_devices("idle", 1),
        room=room,
    )
    return plan(snap, Policy())


def test_scale_in_is_proposed_only_when_the_evicted_pods_fit_elsewhere() -> None:
    refused = _plan_of(room=False)
    assert refused.node("idle").verdict == "protected"
    assert [r for r in refused.node("idle").reasons if r.startswith("no_placement")] == [
        "no_placement:default/web-1:unknown",
        "no_placement:default/web-2:unknown",
    ]
    assert not [a for a in refused.actions if a.kind == "scale_in"]
    proposed = _plan_of(room=True)
    assert [a.kind for a in proposed.actions] == ["scale_in"]
    assert proposed.node("idle").verdict == "idle"


def test_a_written_snapshot_keeps_the_labels_placement_compares() -> None:
    from rightsizer.adapters.snapshot_projection import project_documents

    spec = {
        **_anti("web"),
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "example.com/rack", "labelSelector": {"matchLabels": {"tier": "x"}}}
        ],
    }
    spec["affinity"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": ["a"]}]}]
    }}  # fmt: skip
    raw_pod = pod("web-1", "n", labels={"app": "web", "tier": "x", "secret-ish": "y"}, extra_spec=spec)
    raw_node = gpu_node("n", labels={"example.com/pool": "a", "example.com/rack": "r1", "other": "z"})
    docs = {"pods.json": {"items": [raw_pod]}, "nodes.json": {"items": [raw_node]}}
    out = project_documents(docs)
    assert out["pods.json"]["items"][0]["metadata"]["labels"] == {"app": "web", "tier": "x"}
    kept = out["nodes.json"]["items"][0]["metadata"]["labels"]
    assert {"example.com/pool", "example.com/rack", "kubernetes.io/hostname"} <= set(kept)
    assert "other" not in kept
