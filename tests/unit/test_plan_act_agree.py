"""Plan and act agree by construction (issue 25): a hypothesis property over every protection reason x
every executable action kind x node / group shapes.

GIVEN a cluster (Kubernetes fake, Auto Scaling fake, EC2 fake) holding one candidate node with at most one
protection, WHEN the plan is made on a snapshot of it and the kind's workflow validates the same node in
dry run on the same facts (its assessor plans the same snapshot), THEN the plan lists an executable action
of that kind for the node if and only if the workflow's validate accepts it (ends ``dry_run``, never
``abandoned``). Kinds: ``scale_in`` (the drain workflow), ``resize_instance`` (the resize workflow) and
``replace_node_group`` (its preflight: every old node's child drain validates).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.model import TAG_ENABLED, AsgInfo, ClusterSnapshot, Ec2Instance
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.replace import ReplaceDrainRequest, ReplaceWorkflow
from rightsizer.services.resize import ResizeRequest, ResizeWorkflow
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from tests.builders import (
    AT,
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
from tests.support.resize_world import FakeInstances

#: Every protection a pod or a node can carry on an otherwise good candidate ("none": the control).
PROTECTIONS = (
    "none",
    "host_path",
    "local_pv",
    "pdb",
    "bare_pod",
    "pod_do_not_disrupt",
    "node_do_not_disrupt",
    "scale_down_disabled",
    "cordoned_by_other",
    "karpenter_owned",
    "system_pod",
)
KINDS = ("scale_in", "resize_instance", "replace_node_group")
ASG = "eks-gpu-asg"
NODEGROUP = "gpu"


def protected_parts(name: str, node: str, busy: bool) -> dict[str, Any]:
    """Pods (plus PDBs, PVCs, PVs) and node fields giving ``node`` the protection ``name``."""
    gpus = 1 if busy else 0
    base: dict[str, Any] = {"gpus": gpus, "cpu": "2", "memory": "8Gi"}
    parts: dict[str, Any] = {"pods": [], "pdbs": [], "pvcs": [], "pvs": [], "node": {}}
    if name == "host_path":
        parts["pods"] = [
            pod(f"api-{node}", node, volumes=[{"name": "c", "hostPath": {"path": "/models"}}], **base)
        ]
    elif name == "local_pv":
        parts["pods"] = [pod(f"api-{node}", node, volumes=[claim_volume("data")], **base)]
        parts["pvcs"] = [pvc("data", "pv-local")]
        parts["pvs"] = [pv("pv-local", local_path="/mnt/nvme", affinity={"kubernetes.io/hostname": [node]})]
    elif name == "pdb":
        parts["pods"] = [pod(f"api-{node}", node, **base)]
        parts["pdbs"] = [pdb("api", "default", {"app": "api"}, 0)]
    elif name == "bare_pod":
        parts["pods"] = [pod(f"api-{node}", node, owner=None, **base)]
    elif name == "pod_do_not_disrupt":
        parts["pods"] = [
            pod(f"api-{node}", node, annotations={"karpenter.sh/do-not-disrupt": "true"}, **base)
        ]
    elif name == "system_pod":
        parts["pods"] = [pod(f"api-{node}", node, namespace="kube-system", **base)]
    else:
        parts["pods"] = [pod(f"api-{node}", node, **base)]
        parts["node"] = {
            "node_do_not_disrupt": {"annotations": {"rightsizer.io/do-not-disrupt": "true"}},
            "scale_down_disabled": {
                "annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
            },
            "cordoned_by_other": {"unschedulable": True},
            "karpenter_owned": {"labels": {"karpenter.sh/nodepool": "default"}},
            "none": {},
        }[name]
    return parts


@dataclass
class Shape:
    """The candidate's surroundings: its kind, the group's minimum, the opt-ins, the instance type."""

    kind: str
    at_min: bool = False
    opted_in: bool = True
    allowed: bool = True
    instance_type: str = "g5.4xlarge"


@dataclass
class World:
    clock: FakeClock
    writer: FakeClusterWriter
    scaler: FakeNodeScaler
    policy: Policy
    shape: Shape
    nodes: tuple[str, ...]
    metrics: dict[str, Any]

    def observe(self, _at: Any) -> ClusterSnapshot:
        nodes = [n for n in (self.writer.get_node(name) for name in self.nodes) if n]
        pods = [p for name in self.nodes for p in self.writer.list_pods_on_node(name)]
        pdbs = self.writer.list_pdbs()
        claim = self.writer.get_persistent_volume_claim("default", "data")
        volume = self.writer.get_persistent_volume("pv-local")
        ids = [f"i-{i}" for i in range(len(self.nodes))]
        groups: list[AsgInfo] = []
        if self.shape.kind != "resize_instance":
            sizes = self.scaler.describe_group(ASG).sizes
            tags = {TAG_ENABLED: "true"} if self.shape.opted_in else {}
            in_service = dict.fromkeys(self.scaler.describe_group(ASG).in_service, "InService")
            groups = [AsgInfo(ASG, sizes.min, sizes.max, sizes.desired, in_service, NODEGROUP, tags)]
        pvcs, pvs = [claim] if claim else [], [volume] if volume else []
        snap = snapshot(nodes, pods, self.metrics, groups=groups, pdbs=pdbs, pvcs=pvcs, pvs=pvs, at=AT)
        if self.shape.kind != "resize_instance":
            return snap
        tags = {"rightsizer.io/resize": "allowed"} if self.shape.opted_in else {}
        instances = {i: Ec2Instance(i, self.shape.instance_type, tags, "ebs", "running") for i in ids}
        return dataclasses.replace(snap, inventory=dataclasses.replace(snap.inventory, instances=instances))

    def deps(self) -> DrainDeps:
        assessor = PlanningAssessor(self.observe, self.policy)
        return DrainDeps(
            self.writer, self.scaler, assessor, MemoryState("demo"), self.policy, True, self.clock.now
        )


def make_world(protection: str, shape: Shape) -> World:
    clock = FakeClock(AT)
    writer = FakeClusterWriter(clock=clock)
    scaler = FakeNodeScaler()
    # scale_in: gpu-1 is a busy node with room, where the candidate's pods can go (the placement check).
    names = ("gpu-0",) if shape.kind == "resize_instance" else ("gpu-0", "gpu-1")
    itype = "g5.12xlarge" if shape.kind == "replace_node_group" else shape.instance_type
    gpus = 4 if shape.kind == "replace_node_group" else 1
    metrics: list[Any] = []
    hot = {"util": const(30), "fb_used": const(4096), "power": const(100)}
    for i, name in enumerate(names):
        busy = shape.kind != "scale_in" or i > 0
        parts = protected_parts(protection if i == 0 else "none", name, busy)
        if shape.kind == "scale_in" and i > 0:
            parts["pods"] = []
        group = None if shape.kind == "resize_instance" else NODEGROUP
        node = gpu_node(
            name, instance_type=itype, gpus=gpus, instance_id=f"i-{i}", nodegroup=group, **parts["node"]
        )
        writer.add_node(node)
        for p in parts["pods"]:
            writer.add_pod(p)
        for extra, add in (("pdbs", writer.add_pdb), ("pvcs", writer.add_pvc), ("pvs", writer.add_pv)):
            for obj in parts[extra]:
                add(obj)
        metrics.append(node_devices(name, gpus, per_gpu={0: hot}) if busy else node_devices(name, gpus))
    if shape.kind != "resize_instance":
        desired = len(names)
        scaler.add_group(ASG, min_size=desired if shape.at_min else 0, desired=desired, max_size=5,
                         instance_ids=[f"i-{i}" for i in range(len(names))])  # fmt: skip
    policy = Policy(
        allow_resize=shape.allowed,
        resize_allow_instance_store_loss=True,
        allow_replace_node_group=shape.allowed,
        cooldown=0,
    )
    return World(clock, writer, scaler, policy, shape, names, merge_metrics(*metrics))


def listed(result: Plan, kind: str) -> bool:
    if kind == "replace_node_group":
        return any(a.kind == kind and a.node_group == NODEGROUP for a in result.actions)
    return any(a.kind == kind and a.node == "gpu-0" for a in result.actions)


def accepted(world: World, target: str | None) -> tuple[bool, list[str]]:
    """Run the kind's validate in dry run on the same facts: (accepted, the ledger reasons)."""
    deps = world.deps()
    kind = world.shape.kind
    if kind == "scale_in":
        workflow: DrainWorkflow = DrainWorkflow(deps)
        requests: list[DrainRequest] = [DrainRequest("gpu-0", "exec-0")]
    elif kind == "resize_instance":
        tags = {"rightsizer.io/resize": "allowed"} if world.shape.opted_in else {}
        workflow = ResizeWorkflow(deps, FakeInstances("i-0", world.shape.instance_type, tags))
        requests = [ResizeRequest("gpu-0", "exec-0", target_type=target or "g5.xlarge")]
    else:
        # The replacement's preflight: each old node's child drain validates on fresh facts.
        workflow = ReplaceWorkflow(deps, None)
        requests = [ReplaceDrainRequest(n, f"r.{i}.1", parent="r") for i, n in enumerate(world.nodes)]
    if kind == "scale_in":
        requests = requests[:1]
    reasons = []
    ok = True
    for request in requests:
        workflow.start(request)
        result = workflow.step(request.execution_id)
        ok = ok and result.status == "dry_run"
        reasons.append(result.message)
    return ok, reasons


SHAPES = st.builds(
    Shape,
    kind=st.sampled_from(KINDS),
    at_min=st.booleans(),
    opted_in=st.booleans(),
    allowed=st.booleans(),
    instance_type=st.sampled_from(("g5.4xlarge", "g6.4xlarge", "g5.8xlarge")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(protection=st.sampled_from(PROTECTIONS), shape=SHAPES)
def test_the_plan_lists_an_executable_action_iff_the_workflow_validate_accepts_it(
    protection: str, shape: Shape
) -> None:
    world = make_world(protection, shape)
    result = plan(world.observe(AT), world.policy, AT)
    is_listed = listed(result, shape.kind)
    proposed = next((a for a in result.actions if a.kind == "resize_instance"), None)
    if shape.kind == "replace_node_group":
        group_ok = shape.opted_in and shape.allowed  # group-level facts the child drains do not read
        ok, why = accepted(world, None)
        assert is_listed == (ok and group_ok), (protection, shape, why, [n.reasons for n in result.nodes])
        return
    ok, why = accepted(world, str(proposed.to) if proposed else None)
    assert is_listed == ok, (protection, shape, why, result.node("gpu-0").reasons)


def test_every_protection_refuses_every_kind_and_the_control_passes() -> None:
    """The exhaustive corner of the property: each protection on an otherwise good candidate."""
    for kind in KINDS:
        for protection in PROTECTIONS:
            world = make_world(protection, Shape(kind))
            result = plan(world.observe(AT), world.policy, AT)
            ok, why = accepted(world, "g5.xlarge")
            assert listed(result, kind) == ok == (protection == "none"), (kind, protection, why)
