"""Nodes and Pods decoded straight from a list page's bytes (issue 33 item 2).

GIVEN the project's Kubernetes objects — the demo snapshot's nodes and pods, the anonymised EKS Node
composites, the benchmarks' realistic pods (every field the API server fills) and nodes, and pods dressed
with every field a rule reads —
WHEN a list page of them is decoded by ``kubernetes_models.ModelPages`` (msgspec, only the declared fields)
THEN every object equals, field for field and given field for given field, the ``Node`` / ``Pod`` that
``CompactObjects`` validates from the parsed JSON (the live read before), equal parts are one object, and a
malformed object fails its page naming the field; the live read over HTTP takes selectors and drops what
its projection drops.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from botocore.credentials import ReadOnlyCredentials
from pydantic import BaseModel

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.kubernetes_models import ModelPages, _constructed, _lean_constructed
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import Node, Pod, PodSpec
from rightsizer.domain.planner import plan
from rightsizer.domain.pod_parts import CompactObjects
from rightsizer.domain.policy import Policy
from rightsizer.domain.read_fields import ENV_NAMES, NODE_ANNOTATIONS, POD_ANNOTATIONS
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.wiring.builders import decode_live_documents
from tests.builders import AT, claim_volume, exporter_pod, gpu_node, pod

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "functions" / "rightsizer" / "data" / "examples" / "demo"
NODE_SOURCES = ROOT / "tests" / "fixtures" / "sources" / "k8s"
sys.path.insert(0, str(ROOT / "benchmarks"))
import k8s_objects  # noqa: E402  (the benchmarks' realistic objects)

pytestmark = pytest.mark.integration


def page(items: list[dict[str, Any]], token: str = "") -> bytes:
    """A list answer as the API server sends it (items without kind/apiVersion)."""
    meta = {"resourceVersion": "7", **({"continue": token} if token else {})}
    bare = [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in items]
    return json.dumps({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": bare}).encode()


def assert_same(got: BaseModel, expected: BaseModel, path: str = "") -> None:
    """Equal values AND equal given-fields sets, recursively (``==`` alone ignores the latter)."""
    assert type(got) is type(expected), path
    assert got.model_fields_set == expected.model_fields_set, path
    assert got.__pydantic_extra__ == expected.__pydantic_extra__, path
    for name in type(got).model_fields:
        a, b = getattr(got, name), getattr(expected, name)
        if isinstance(a, BaseModel):
            assert_same(a, b, f"{path}.{name}")
        elif isinstance(a, list) and a and isinstance(a[0], BaseModel):
            assert len(a) == len(b), f"{path}.{name}"
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_same(x, y, f"{path}.{name}[{i}]")
        else:
            assert a == b, f"{path}.{name}: {a!r} != {b!r}"


def realistic_pods() -> list[dict[str, Any]]:
    """The benchmarks' pods: Deployment and DaemonSet pods with every field the API server fills, GPU
    holders, a StatefulSet pod with a claim, a pending one, a finished one, one being deleted."""
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/{}:v2"
    pods = [
        k8s_objects.pod(
            f"svc-{i % 6}-7d9f8b6c5d-{i:05x}",
            f"team-{i % 3}",
            f"ip-10-0-{i // 4}-1.ec2.internal",
            f"10.0.{i // 4}.1",
            f"10.1.{i // 4}.{i % 4 + 10}",
            app=f"svc-{i % 6}",
            owner=("ReplicaSet", f"svc-{i % 6}-7d9f8b6c5d"),
            image=image.format(i % 6),
            gpus=1 if i % 4 < 2 else 0,
        )
        for i in range(24)
    ]
    pods.append(
        k8s_objects.pod(
            "aws-node-x1",
            "kube-system",
            "ip-10-0-0-1.ec2.internal",
            "10.0.0.1",
            "10.0.0.1",
            app="aws-node",
            owner=("DaemonSet", "aws-node"),
            image=image.format("aws-node"),
        )
    )
    pods[0]["spec"]["volumes"].append(claim_volume("data-svc-0"))
    pods[1]["spec"]["nodeName"] = ""
    pods[1]["status"] = {"phase": "Pending"}
    pods[2]["status"]["phase"] = "Succeeded"
    pods[3]["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    pods[4]["metadata"]["annotations"] = {
        **{key: "true" for key in POD_ANNOTATIONS},
        "cni.projectcalico.org/podIP": "10.1.1.11/32",
    }
    pods[5]["spec"]["containers"][0]["env"] = [
        *({"name": name, "value": "0,1"} for name in ENV_NAMES),
        {"name": "SECRET_TOKEN", "value": "not read"},
    ]
    return pods


def realistic_nodes() -> list[dict[str, Any]]:
    gpu, cpu = k8s_objects.load_templates()
    nodes = [
        k8s_objects.node(template, f"ip-10-0-{i}-1.ec2.internal", f"10.0.{i}.1", i)
        for i, template in enumerate([*gpu, cpu, *gpu])
    ]
    nodes[0]["metadata"]["annotations"] = {key: "x" for key in NODE_ANNOTATIONS}
    nodes[1]["spec"]["unschedulable"] = True
    return nodes


def builder_pods() -> list[dict[str, Any]]:
    return [
        pod("train", "gpu-0", gpus=2, volumes=[{"name": "scratch", "emptyDir": {}}], grace=600),
        pod("bare", "gpu-0", owner=None, node_selector={"team": "ml"}),
        exporter_pod("gpu-0", "10.1.0.1"),
        pod("pending", "", gpus=1, phase="Pending"),
    ]


def sources() -> Iterator[tuple[str, type[Node] | type[Pod], list[dict[str, Any]]]]:
    yield "demo nodes", Node, json.loads((DEMO / "nodes.json").read_text())["items"]
    yield "demo pods", Pod, json.loads((DEMO / "pods.json").read_text())["items"]
    composites = [json.loads(p.read_text()) for p in sorted(NODE_SOURCES.glob("*.node.json"))]
    yield "EKS node composites", Node, composites
    yield "benchmark nodes", Node, realistic_nodes()
    yield "benchmark pods", Pod, realistic_pods()
    yield "builder nodes", Node, [gpu_node("gpu-0"), gpu_node("mig", instance_type="p4d.24xlarge", gpus=8)]
    yield "builder pods", Pod, builder_pods()


@pytest.mark.parametrize(("source", "kind", "items"), list(sources()), ids=[s[0] for s in sources()])
def test_a_decoded_page_equals_the_validated_objects(
    source: str, kind: type[Node] | type[Pod], items: list[dict[str, Any]]
) -> None:
    compact = CompactObjects()
    expected = [compact.node(i) if kind is Node else compact.pod(i) for i in items]
    # pages of 3, as the live read gets them, through one decoder
    pages = ModelPages(kind)
    got: list[Any] = []
    for start in range(0, len(items), 3):
        objects, token = pages.page(page(items[start : start + 3], "more"))
        assert token == "more"
        got += objects
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b, f"{source}:{b.metadata.name}")


def test_equal_parts_are_one_object_and_unread_fields_are_not_kept() -> None:
    pods, _ = ModelPages(Pod).page(page(realistic_pods()))
    # the replicas of one Deployment share their containers, tolerations and labels
    a, b = pods[7], pods[19]  # two of svc-1's pods, on two nodes
    assert a.spec.containers is b.spec.containers
    assert a.spec.tolerations is b.spec.tolerations
    assert a.metadata.labels is b.metadata.labels
    assert a.spec.nodeName != b.spec.nodeName and a.status.podIP != b.status.podIP
    # what no rule reads is not kept: the CNI's annotation, an unread env entry, the token volume
    assert "cni.projectcalico.org/podIP" not in pods[4].metadata.annotations
    assert set(pods[4].metadata.annotations) == POD_ANNOTATIONS
    assert [e.name for e in pods[5].spec.containers[0].env] == sorted(ENV_NAMES, key=list(ENV_NAMES).index)
    assert [v.name for v in pods[0].spec.volumes] == ["data"]
    assert pods[0].metadata.uid == "" and "uid" not in pods[0].metadata.model_fields_set


def test_a_malformed_object_fails_its_page_naming_the_field() -> None:
    good = realistic_pods()[0]
    for broken, where in (
        ({**good, "metadata": {"namespace": "x"}}, "metadata"),
        ({**good, "spec": {**good["spec"], "containers": "nginx"}}, "containers"),
        ({**good, "metadata": {**good["metadata"], "deletionTimestamp": "2026-12-01T10:00:00"}}, "deletion"),
    ):
        with pytest.raises(msgspec.ValidationError, match=where):
            ModelPages(Pod).page(page([good, broken]))
    with pytest.raises(msgspec.DecodeError):
        ModelPages(Pod).page(b'{"items": [')


@pytest.mark.parametrize("construct", [_constructed, _lean_constructed])
def test_constructed_models_are_what_model_construct_makes(construct: Any) -> None:
    values = {name: getattr(PodSpec(), name) for name in PodSpec.model_fields}
    values["nodeName"] = "gpu-0"
    fields = {"nodeName"}
    ours, theirs = construct(PodSpec, dict(values), fields), PodSpec.model_construct(fields, **values)
    assert ours == theirs
    for attribute in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert ours.model_dump() == theirs.model_dump()


def test_the_demo_snapshot_plans_the_same_from_decoded_pages() -> None:
    documents = {p.name: json.loads(p.read_text()) for p in DEMO.glob("*.json")}
    documents.update(
        {f"metrics/{p.name}": json.loads(p.read_text()) for p in (DEMO / "metrics").glob("*.json")}
    )
    expected = decode_live_documents(documents)
    decoded = {
        "nodes.json": {"items": ModelPages(Node).page(page(documents["nodes.json"]["items"]))[0]},
        "pods.json": {"items": ModelPages(Pod).page(page(documents["pods.json"]["items"]))[0]},
    }
    got = decode_live_documents({**documents, **decoded})
    policy = Policy()
    assert plan(got, policy, AT).model_dump(mode="json") == plan(expected, policy, AT).model_dump(mode="json")


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubernetesCluster]:
    with KubernetesDouble(seed=3, resource_api_versions=None) as double:
        for i in range(5):
            double.add_node(gpu_node(f"gpu-{i}", ip=f"10.0.0.{i + 1}"))
            double.add_pod(pod(f"train-{i}", f"gpu-{i}", gpus=1))
            double.add_pod(pod(f"done-{i}", f"gpu-{i}", phase="Succeeded"))
        yield KubernetesCluster.for_eks(
            double.base_url,
            EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
            page_size=2,
        )


def test_the_live_read_takes_selectors_and_keeps_what_its_projection_keeps(
    cluster: KubernetesCluster,
) -> None:
    every = cluster.list_models(Pod, lambda p: p.metadata.name)
    assert sorted(every) == sorted([f"train-{i}" for i in range(5)] + [f"done-{i}" for i in range(5)])
    running = cluster.list_models(
        Pod, lambda p: p.metadata.name, field_selector="status.phase!=Succeeded,status.phase!=Failed"
    )
    assert sorted(running) == [f"train-{i}" for i in range(5)]
    one_node = cluster.list_models(Pod, lambda p: p.metadata.name, field_selector="spec.nodeName=gpu-3")
    assert sorted(one_node) == ["done-3", "train-3"]
    # a shard keeps its own nodes: the projection drops the others
    mine = cluster.list_models(Node, lambda n: n.name if n.name in {"gpu-1", "gpu-4"} else None)
    assert mine == ["gpu-1", "gpu-4"]
    labelled = cluster.list_models(Node, lambda n: n.name, label_selector="kubernetes.io/hostname=gpu-2")
    assert labelled in ([], ["gpu-2"])  # the builder's nodes may not carry the hostname label
    assert [n.name for n in cluster.list_models(Node, lambda n: n)] == [f"gpu-{i}" for i in range(5)]


def test_a_malformed_answer_is_a_transient_error_naming_the_list(cluster: KubernetesCluster) -> None:
    class Broken(KubernetesCluster):
        def _fetch(self, *args: Any, **kwargs: Any) -> bytes:
            return b'{"items": [{"metadata": {}}]}'

    broken = Broken(cluster._connect, page_size=2)
    with pytest.raises(TransientError, match=r"list nodes.*name"):
        broken.list_models(Node, lambda n: n)
