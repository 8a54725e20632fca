"""The live plan's Nodes and Pods, compact (issue 11 item 7): read fields only, equal parts stored once.

GIVEN the pods of a few Deployments (same containers, tolerations, labels, owner, conditions per template)
as the API server sends them, and EKS nodes
WHEN each passes through one ``CompactObjects``
THEN every pod decides exactly as its whole validated self, the parts of one template are one object,
different parts stay apart, what no rule reads is gone, and the objects' memory falls to a fraction.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from pydantic import ValidationError

from rightsizer.domain.model import Node, Pod
from rightsizer.domain.pod_parts import CompactObjects
from rightsizer.domain.pods import CA_SAFE_TO_EVICT, NVIDIA_VISIBLE_DEVICES, PodContext, classify_pod
from rightsizer.domain.policy import Policy
from rightsizer.domain.read_fields import NODE_ANNOTATIONS, POD_ANNOTATIONS
from tests.builders import AT, gpu_node, pod

TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def replica(i: int, app: str) -> dict[str, Any]:
    item = pod(
        f"{app}-{i}",
        f"gpu-{i % 7}",
        namespace="ml",
        gpus=1,
        cpu="2" if app == "serve" else "1",
        labels={"app": app, "pod-template-hash": "7d9f8b6c5d"},
        annotations={CA_SAFE_TO_EVICT: "false", "kubectl.kubernetes.io/restartedAt": "2026-11-30T08:00:00Z"},
        env=[{"name": NVIDIA_VISIBLE_DEVICES, "value": "all"}, {"name": "MODEL", "value": app}],
        volumes=[
            {
                "name": f"kube-api-access-{i}",
                "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]},
            },
            {"name": "scratch", "emptyDir": {}},
        ],
        pod_ip=f"10.1.0.{i % 250 + 1}",
        extra_spec={"tolerations": TOLERATIONS},
    )
    item["metadata"]["ownerReferences"][0]["name"] = f"{app}-7d9f8b6c5d"
    item["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    item["status"]["conditions"] = [
        {"type": t, "status": "True", "lastTransitionTime": f"2026-11-30T08:{i % 60:02d}:00Z"}
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return item


def decision(p: Pod) -> tuple[Any, ...]:
    ctx = PodContext(Policy(), [], {}, AT)
    found = classify_pod(p, ctx)
    return (found.ignored, found.findings, found.gpu_holder, p.key, p.ready, p.gpu_request(), p.controller)


def test_equal_parts_are_one_object_and_every_pod_decides_as_before() -> None:
    compact = CompactObjects()
    items = [replica(i, app) for app in ("train", "serve") for i in range(20)]
    kept = [compact.pod(x) for x in items]

    assert [decision(p) for p in kept] == [decision(Pod.model_validate(x)) for x in items]
    assert all(isinstance(p, Pod) for p in kept)
    train, serve = kept[:20], kept[20:]
    for group in (train, serve):
        first = group[0]
        assert all(p.spec.containers is first.spec.containers for p in group)
        assert all(p.spec.volumes is first.spec.volumes for p in group)  # the token volumes are gone
        assert all(p.spec.tolerations is first.spec.tolerations for p in group)
        assert all(p.metadata.labels is first.metadata.labels for p in group)
        assert all(p.metadata.annotations is first.metadata.annotations for p in group)
        assert all(p.metadata.ownerReferences is first.metadata.ownerReferences for p in group)
        assert all(p.status.conditions is first.status.conditions for p in group)
        assert all(p.model_fields_set is first.model_fields_set for p in group)
        assert all(p.metadata.model_fields_set is first.metadata.model_fields_set for p in group)
    # what differs stays apart: another template's containers and labels, every pod's own name and IP
    assert train[0].spec.containers is not serve[0].spec.containers
    assert train[0].metadata.labels is not serve[0].metadata.labels
    assert [p.metadata.name for p in kept] == [x["metadata"]["name"] for x in items]
    assert [p.status.podIP for p in kept] == [x["status"]["podIP"] for x in items]
    assert train[0].spec.tolerations is serve[0].spec.tolerations  # equal across templates too
    # what no rule reads is not kept: other annotations and env entries, the token volume, the pod's uid
    first = kept[0]
    assert set(first.metadata.annotations) == {CA_SAFE_TO_EVICT} and set(POD_ANNOTATIONS) >= {
        CA_SAFE_TO_EVICT
    }
    assert [e.name for c in first.all_containers() for e in c.env] == [NVIDIA_VISIBLE_DEVICES]
    assert [v.name for v in first.spec.volumes] == ["scratch"]
    assert first.metadata.uid == "" and first.metadata.creationTimestamp is None
    assert first.metadata.labels == items[0]["metadata"]["labels"]  # labels whole: selectors compare them


def test_nodes_keep_every_label_and_the_read_annotations_with_equal_parts_shared() -> None:
    compact = CompactObjects()
    items = [
        gpu_node(
            f"gpu-{i}",
            ip=f"10.0.0.{i + 1}",
            labels={"team": "ml"},
            annotations={"rightsizer.io/cordoned-by": "exec-1", "node.alpha.kubernetes.io/ttl": "0"},
        )
        for i in range(5)
    ]
    for item in items:
        item["status"]["addresses"].append({"type": "Hostname", "address": item["metadata"]["name"]})
        item["status"]["images"] = [{"names": ["ecr/app:v1"], "sizeBytes": 1}]
    kept = [compact.node(x) for x in items]

    whole = [Node.model_validate(x) for x in items]
    assert [n.labels for n in kept] == [n.labels for n in whole]
    assert [n.internal_ips for n in kept] == [n.internal_ips for n in whole]
    assert [(n.instance_id, n.instance_type, n.spec, n.metadata.creationTimestamp) for n in kept] == [
        (n.instance_id, n.instance_type, n.spec, n.metadata.creationTimestamp) for n in whole
    ]
    assert all(set(n.metadata.annotations) == {"rightsizer.io/cordoned-by"} <= NODE_ANNOTATIONS for n in kept)
    assert all(n.status.capacity is kept[0].status.capacity for n in kept)
    assert all(n.status.conditions is kept[0].status.conditions for n in kept)
    assert kept[0].labels is not kept[1].labels  # each node's own hostname


def test_a_malformed_item_fails_as_its_model_does() -> None:
    compact = CompactObjects()
    with pytest.raises(ValidationError, match="metadata"):
        compact.pod({"metadata": "x"})
    with pytest.raises(ValidationError, match="name"):
        compact.node({"metadata": {"labels": {}}})
    with pytest.raises(ValidationError, match="containers"):
        compact.pod({"metadata": {"name": "p"}, "spec": {"containers": "x"}})


def test_compact_pods_cost_a_fraction_of_the_validated_ones() -> None:
    items = [replica(i, f"app{i % 4}") for i in range(1000)]

    def retained(compact: CompactObjects | None) -> int:
        tracemalloc.start()
        try:
            kept = [compact.pod(x) if compact else Pod.model_validate(x) for x in items]
            size = tracemalloc.get_traced_memory()[0]
            del kept
            return size
        finally:
            tracemalloc.stop()

    whole, lean = retained(None), retained(CompactObjects())
    assert lean * 4 < whole, (lean, whole)
