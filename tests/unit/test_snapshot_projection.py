"""The snapshot allowlists are the decision's reads, both ways (issue 14 item 3).

The planner runs over several snapshots whose label, annotation and tag maps record every key the
decision looks up. Each key an allowlist keeps must be looked up in some scenario (an allowlist entry
nobody reads fails), and every key looked up must be kept — statically, or because a selector of the
same snapshot or the policy compares it (a read the projection would drop fails).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot, snapshot_from_documents
from rightsizer.adapters.snapshot_projection import (
    ASG_TAGS,
    INSTANCE_TAGS,
    NODE_ANNOTATIONS,
    NODE_LABELS,
    POD_ANNOTATIONS,
    POD_LABELS,
    project_documents,
)
from rightsizer.cli import example_snapshot_dir
from rightsizer.domain.model import ClusterSnapshot, Ec2Instance, Inventory
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from tests.builders import asg, const, gpu_node, merge_metrics, node_devices, pdb, pod, snapshot
from tests.support.recording import RecordingMap


@dataclass
class Reads:
    node_labels: set[str] = field(default_factory=set)
    node_annotations: set[str] = field(default_factory=set)
    pod_labels: set[str] = field(default_factory=set)
    pod_annotations: set[str] = field(default_factory=set)
    asg_tags: set[str] = field(default_factory=set)
    instance_tags: set[str] = field(default_factory=set)
    #: label keys a selector of the snapshot or the policy compares (kept per snapshot)
    node_selected: set[str] = field(default_factory=set)
    pod_selected: set[str] = field(default_factory=set)


def _record(snap: ClusterSnapshot, policy: Policy, reads: Reads) -> None:
    for node in snap.nodes:
        object.__setattr__(node.metadata, "labels", RecordingMap(node.metadata.labels, reads.node_labels))
        object.__setattr__(
            node.metadata, "annotations", RecordingMap(node.metadata.annotations, reads.node_annotations)
        )
    for p in snap.pods:
        object.__setattr__(p.metadata, "labels", RecordingMap(p.metadata.labels, reads.pod_labels))
        object.__setattr__(
            p.metadata, "annotations", RecordingMap(p.metadata.annotations, reads.pod_annotations)
        )
        reads.node_selected |= set(p.spec.nodeSelector)
    for group in snap.inventory.groups.values():
        object.__setattr__(group, "tags", RecordingMap(group.tags, reads.asg_tags))
    for instance in (snap.inventory.instances or {}).values():
        object.__setattr__(instance, "tags", RecordingMap(instance.tags, reads.instance_tags))
    for budget in snap.pdbs:
        selector = budget.spec.selector
        if selector is not None:
            reads.pod_selected |= set(selector.matchLabels) | {e.key for e in selector.matchExpressions}
    for volume in snap.pvs:
        required = volume.spec.nodeAffinity.required if volume.spec.nodeAffinity else None
        for term in required.nodeSelectorTerms if required else []:
            reads.node_selected |= {e.key for e in term.matchExpressions}
    reads.node_selected |= set(policy.node_selector)
    plan(snap, policy)


def _instances(
    nodes: Iterable[dict[str, Any]], tags: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Ec2Instance]:
    out = {}
    for n in nodes:
        iid = n["spec"]["providerID"].rsplit("/", 1)[-1]
        itype = n["metadata"]["labels"].get("node.kubernetes.io/instance-type", "g5.2xlarge")
        out[iid] = Ec2Instance(
            instance_id=iid,
            instance_type=itype,
            tags=dict(tags or {}),
            root_device_type="ebs",
            state="running",
            **kwargs,
        )
    return out


def _scenarios() -> list[tuple[ClusterSnapshot, Policy]]:
    idle: dict[str, Any] = {}
    spot = gpu_node(
        "spot-0", instance_type="g5.2xlarge", gpus=1, labels={"eks.amazonaws.com/capacityType": "SPOT"}
    )
    beta = gpu_node("beta-0", instance_type="g5.2xlarge", gpus=1)
    beta["metadata"]["labels"]["beta.kubernetes.io/instance-type"] = beta["metadata"]["labels"].pop(
        "node.kubernetes.io/instance-type"
    )
    mig = gpu_node(
        "mig-0",
        instance_type="p4d.24xlarge",
        gpus=8,
        labels={"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"},
    )
    solo = gpu_node("solo-0", instance_type="g5.12xlarge", gpus=4, nodegroup=None)  # standalone: resizable
    # standalone g5.xlarge whose cheapest fit is another GPU model (L4): the plan reads the driver labels
    driver = {"major": "535", "minor": "183", "revision": "01"}
    gfd = {f"nvidia.com/cuda.driver-version.{k}": v for k, v in driver.items()}
    gfd |= {f"nvidia.com/cuda.driver.{k[:3] if k == 'revision' else k}": v for k, v in driver.items()}
    gfd["nvidia.com/cuda.driver-version.full"] = "535.183.01"
    cross = gpu_node("solo-1", instance_type="g5.xlarge", gpus=1, nodegroup=None, labels=gfd)
    nodes = [spot, beta, mig, solo, cross]
    metrics = merge_metrics(
        *(node_devices(n["metadata"]["name"], 1, **idle) for n in nodes[:3]),
        node_devices("solo-0", 4, per_gpu={0: {"util": const(60.0)}}),
        node_devices("solo-1", 1, util=const(30.0), fb_used=const(4096.0), power=const(100.0)),
    )
    pods = [
        pod("web-0", "beta-0", labels={"app": "web"}),
        pod("pending-0", None, gpus=1, phase="Pending", node_selector={"example.com/pool": "a"}),
        pod("api-0", "solo-1", gpus=1, cpu="2", memory="8Gi"),
    ]
    built = snapshot(nodes, pods, metrics, pdbs=[pdb("web", "default", {"app": "web"}, allowed=0)])
    groups = [asg(g.name, g.instances, nodegroup=g.nodegroup) for g in built.inventory.groups.values()]
    for group in groups:
        object.__setattr__(group, "tags", {})
    inventory = Inventory(
        known=True,
        groups={g.name: g for g in groups},
        asg_of_instance=built.inventory.asg_of_instance,
        instances={
            **_instances(nodes[:3], lifecycle="spot", availability_zone=""),
            **_instances([solo, cross], tags={"rightsizer.io/resize": "allowed"}),
        },
    )
    built = ClusterSnapshot(**{**built.__dict__, "inventory": inventory})
    demo = load_snapshot(example_snapshot_dir("demo"))
    return [
        (demo, Policy()),
        (demo, Policy(node_selector={"example.com/team": "ml"})),
        (built, Policy()),
        (demo, Policy(node_groups=["gpu-a10g"])),
        (built, Policy.model_validate({"cooldown": "0s", "max_nodes_per_run": 10, "allow_resize": True})),
    ]


@pytest.fixture(scope="module")
def reads() -> Reads:
    found = Reads()
    for snap, policy in _scenarios():
        _record(snap, policy, found)
    return found


@pytest.mark.parametrize(
    ("kept", "attr"),
    [
        (NODE_LABELS, "node_labels"),
        (NODE_ANNOTATIONS, "node_annotations"),
        (POD_LABELS, "pod_labels"),
        (POD_ANNOTATIONS, "pod_annotations"),
        (INSTANCE_TAGS, "instance_tags"),
    ],
)
def test_every_kept_key_is_read_by_the_decision(reads: Reads, kept: frozenset[str], attr: str) -> None:
    assert sorted(kept - getattr(reads, attr)) == []


@pytest.mark.parametrize(
    ("kept", "attr", "selected"),
    [
        (NODE_LABELS, "node_labels", "node_selected"),
        (NODE_ANNOTATIONS, "node_annotations", None),
        # the policy's showback_team_label is kept too (SnapshotDirectoryWriter(policy_pod_labels=...))
        (POD_LABELS | {Policy().showback_team_label}, "pod_labels", "pod_selected"),
        (POD_ANNOTATIONS, "pod_annotations", None),
        (ASG_TAGS, "asg_tags", None),
        (INSTANCE_TAGS, "instance_tags", None),
    ],
)
def test_every_key_the_decision_reads_is_kept(
    reads: Reads, kept: frozenset[str], attr: str, selected: str | None
) -> None:
    allowed = kept | (getattr(reads, selected) if selected else set())
    assert sorted(getattr(reads, attr) - allowed) == []


def test_asg_tags_are_read_by_the_opt_in_and_the_self_managed_node_group_name() -> None:
    # The opt-in pair is read by domain.model.opt_in_refusal (the drain's and off-hours' check); the
    # node group name of a self-managed group by the snapshot decoder.
    from rightsizer.domain.model import opt_in_refusal

    log: set[str] = set()
    opt_in_refusal(RecordingMap({"rightsizer.io/enabled": "true"}, log), "c", asg=True)
    docs = {
        "snapshot.json": {
            "taken_at": "2026-11-02T10:00:00Z",
            "window_seconds": 1800,
            "step_seconds": 60,
            "cluster": "c",
            "region": "us-east-1",
        },
        "nodes.json": {"items": []},
        "pods.json": {"items": []},
        "pdbs.json": {"items": []},
        "nodegroups.json": {
            "autoScalingGroups": [
                {
                    "AutoScalingGroupName": "self-managed",
                    "MinSize": 0,
                    "MaxSize": 3,
                    "DesiredCapacity": 1,
                    "Tags": [
                        {"Key": "eks:nodegroup-name", "Value": "gpu-self"},
                        {"Key": "team", "Value": "x"},
                    ],
                }
            ]
        },
    }
    projected = project_documents(docs)
    group = snapshot_from_documents(projected, root=_ROOT).inventory.groups["self-managed"]
    assert group.nodegroup == "gpu-self"
    assert projected["nodegroups.json"]["autoScalingGroups"][0]["Tags"] == [
        {"Key": "eks:nodegroup-name", "Value": "gpu-self"}
    ]
    assert log | {"eks:nodegroup-name"} == set(ASG_TAGS)


_ROOT = __import__("pathlib").Path("snapshot")


def test_the_packaged_example_plans_the_same_after_projection() -> None:
    # The projection keeps everything the decision reads of a real example (labels of real EKS nodes).
    import json

    root = example_snapshot_dir("demo")
    docs = {p.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("*.json")}
    docs.pop("expected.json", None)
    before = plan(snapshot_from_documents(docs, root=root), Policy())
    after = plan(snapshot_from_documents(project_documents(docs), root=root), Policy())
    assert after == before


def test_the_paged_projection_writes_what_the_whole_projection_writes() -> None:
    # GIVEN the packaged example's documents (real EKS nodes and pods, budgets) projected one object at a
    # time in the order rightsizer snapshot reads them (budgets before pods, nodes finished last)
    import json

    from rightsizer.adapters.snapshot_projection import PagedProjection

    root = example_snapshot_dir("demo")
    docs = {p.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("*.json")}
    docs.pop("expected.json", None)
    paged = PagedProjection(policy_node_labels=("example.com/team",))
    drafts = [paged.node_draft(n) for n in docs["nodes.json"]["items"]]
    items = {
        path: [paged.item(path, obj) for obj in docs.get(path, {}).get("items", [])]
        for path in ("pdbs.json", "persistentvolumeclaims.json", "persistentvolumes.json", "pods.json")
    }
    nodes = [paged.node_final(d) for d in drafts]

    # THEN every object equals the whole-document projection's
    whole = project_documents(docs, policy_node_labels=("example.com/team",))
    assert nodes == whole["nodes.json"]["items"]
    for path, projected in items.items():
        assert projected == (whole.get(path) or {}).get("items", []), path
    assert paged.document("instances.json", docs["instances.json"]) == whole["instances.json"]
    # AND the order that keeps the deciding labels is enforced
    with pytest.raises(RuntimeError, match="before pods"):
        paged.item("pdbs.json", docs["pdbs.json"]["items"][0])
    with pytest.raises(RuntimeError, match="after the nodes"):
        paged.item("pods.json", docs["pods.json"]["items"][0])
