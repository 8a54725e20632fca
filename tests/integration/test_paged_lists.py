"""Kubernetes lists that scale (issue 11 item 7): the live plan's lists are projected page by page.

GIVEN a cluster in the Kubernetes API double with GPU and CPU nodes, pods on both, pending pods, budgets
and volumes, read through the real adapter with small pages,
WHEN the live observation projects each page to what the plan reads (``observe(project=True)``),
THEN the plan and the series join are exactly those of the raw, unprojected lists (paginated or not),
AND a projected list never holds more than about one raw page: its peak memory stays a fraction of the
raw list's, and does not grow with the number of objects listed.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import ANN_CORDONED_BY, ANN_DO_NOT_DISRUPT, PodAddress
from rightsizer.domain.planner import CA_SCALE_DOWN_DISABLED, KARPENTER_NODEPOOL, plan
from rightsizer.domain.pods import (
    CA_DAEMONSET_POD,
    CA_SAFE_TO_EVICT,
    CA_SAFE_TO_EVICT_LOCAL_VOLUMES,
    KARPENTER_DO_NOT_DISRUPT,
    MIRROR_ANNOTATION,
    NVIDIA_VISIBLE_DEVICES,
)
from rightsizer.domain.policy import Policy
from rightsizer.domain.read_fields import POD_ANNOTATIONS
from rightsizer.services.observe import snapshot_from_observation
from rightsizer.services.snapshot import ObserveRequest, observe
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.wiring.builders import decode_live_documents
from tests.builders import AT, claim_volume, exporter_pod, gpu_node, pdb, pod, pv, pvc, rfc
from tests.support.child_double import child_doubles

pytestmark = pytest.mark.integration


def cpu_node(name: str, ip: str) -> dict[str, Any]:
    node = gpu_node(name, instance_type="m5.2xlarge", gpus=0, ip=ip)
    node["metadata"]["labels"].pop("nvidia.com/gpu.present")
    del node["status"]["capacity"]["nvidia.com/gpu"]
    del node["status"]["allocatable"]["nvidia.com/gpu"]
    return node


@pytest.fixture(scope="module")
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=5, resource_api_versions=None) as d:
        for i in range(12):
            d.add_node(gpu_node(f"gpu-{i:02d}", instance_type="g5.2xlarge", gpus=1, ip=f"10.0.0.{i + 1}"))
            d.add_pod(exporter_pod(f"gpu-{i:02d}", f"10.1.0.{i + 1}", name=f"dcgm-{i:02d}"))
            d.add_pod(pod(f"train-{i}", f"gpu-{i:02d}", namespace=f"ml-{i % 2}", gpus=1 if i % 3 else 0))
        for i in range(30):
            d.add_node(cpu_node(f"cpu-{i:02d}", f"10.2.0.{i + 1}"))
            for k in range(4):
                d.add_pod(pod(f"web-{i}-{k}", f"cpu-{i:02d}", namespace="web", pod_ip=f"10.3.{i}.{k + 1}"))
        d.add_pod(pod("waiting", None, namespace="ml-0", gpus=1, phase="Pending"))
        d.add_pdb(pdb("train", "ml-1", {"app": "train"}, 0), managed_status=False)
        d.add_pdb(pdb("web", "web", {"app": "web"}, 1))
        d.add_pod(
            pod("db-0", "gpu-05", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")])
        )
        d.add_pvc(pvc("data-db-0", "local-1"))
        d.add_pv(pv("local-1", local_path="/mnt/nvme", affinity={"kubernetes.io/hostname": ["gpu-05"]}))
        yield d


def reader(double: KubernetesDouble, page_size: int) -> KubernetesCluster:
    return KubernetesCluster.for_eks(
        double.base_url,
        EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
        page_size=page_size,
    )


REQUEST = ObserveRequest(at=AT, window_seconds=1800, step_seconds=60, cluster="prod", region="us-east-1")


@pytest.mark.parametrize("page_size", [1, 7, 5000])
def test_the_projected_plan_is_the_plan_of_the_raw_lists(double: KubernetesDouble, page_size: int) -> None:
    raw = snapshot_from_observation(observe(reader(double, 5000), None, None, REQUEST), decode_live_documents)
    projected = snapshot_from_observation(
        observe(reader(double, page_size), None, None, REQUEST, project=True), decode_live_documents
    )
    policy = Policy()
    expected, got = plan(raw, policy, AT), plan(projected, policy, AT)
    assert got.model_dump(mode="json") == expected.model_dump(mode="json")
    # the cases are there: a pending GPU pod, a budget with no disruptions left, node-local data
    reasons = {r.split(":")[0] for n in got.nodes for r in n.reasons}
    assert {"pending_gpu_pods", "pdb_blocks", "local_storage"} <= reasons, reasons
    # the pods of CPU nodes are kept only as the join reads them, and join the same series to the same nodes
    kept = [p.metadata.name for p in projected.pods] + [a.name for a in projected.pod_addresses]
    assert sorted(kept) == sorted(p.metadata.name for p in raw.pods)
    assert {a.node for a in projected.pod_addresses} == {f"cpu-{i:02d}" for i in range(30)}
    full = NodeJoiner(raw.nodes, raw.pods)
    lean = NodeJoiner(projected.nodes, projected.pods, None, projected.pod_addresses)
    labels = [{"instance": f"{p.status.podIP}:9400"} for p in raw.pods if p.status.podIP]
    labels += [{"namespace": p.metadata.namespace, "pod": p.metadata.name, "Hostname": "x"} for p in raw.pods]
    labels += [{"instance": f"{ip}:9400", "Hostname": n.name} for n in raw.nodes for ip in n.internal_ips]
    assert [lean.join(x) for x in labels] == [full.join(x) for x in labels]
    web = next(a for a in projected.pod_addresses if a.name == "web-0-0")
    assert web == PodAddress("web", "web-0-0", "cpu-00", "10.3.0.1")


def peak_bytes(run: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _serve(pods: int, conn: Connection) -> None:
    """Child process (its memory is not ours): a double with ``pods`` pods on 10 nodes, until told."""
    with KubernetesDouble(seed=5, resource_api_versions=None) as d:
        for i in range(10):
            d.add_node(cpu_node(f"cpu-{i}", f"10.2.0.{i + 1}"))
        for k in range(pods):
            d.add_pod(
                pod(f"web-{k}", f"cpu-{k % 10}", namespace="web", pod_ip=f"10.3.{k // 250}.{k % 250 + 1}")
            )
        conn.send(d.base_url)
        conn.recv()


@pytest.fixture
def remote() -> Iterator[Callable[[int], str]]:
    yield from child_doubles(_serve)


def test_a_projected_list_holds_about_one_raw_page(remote: Callable[[int], str]) -> None:
    peaks: dict[int, tuple[int, int]] = {}
    for pods in (200, 800):
        cluster = KubernetesCluster.for_eks(
            remote(pods),
            EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
            page_size=20,
        )
        cluster.list_nodes()  # connection and imports are not what is measured
        counted: list[int] = []

        def keep_nothing(item: dict[str, Any], counted: list[int] = counted) -> None:
            counted.append(1)
            return None

        raw = peak_bytes(cluster.list_pods)
        lean = peak_bytes(lambda cluster=cluster, keep=keep_nothing: cluster.list_projected("pods", keep))
        assert len(counted) == pods
        peaks[pods] = (raw, lean)
    # THEN the raw list grows with the pods, the projected one stays at about one page of 20
    (raw_small, lean_small), (raw_large, lean_large) = peaks[200], peaks[800]
    assert raw_large > 3 * raw_small, peaks
    assert lean_large < 1.5 * lean_small, peaks
    assert lean_large * 10 < raw_large, peaks


def retained_bytes(build: Callable[[], Any]) -> int:
    """Bytes still allocated once ``build`` returned, while its result is alive (tracemalloc)."""
    tracemalloc.start()
    try:
        kept = build()
        size = tracemalloc.get_traced_memory()[0]
        del kept
        return size
    finally:
        tracemalloc.stop()


def test_the_live_snapshot_keeps_only_what_the_join_reads_of_other_nodes_pods(
    remote: Callable[[int], str],
) -> None:
    # GIVEN clusters whose pods all run on CPU nodes, of 200 and 1,000 pods
    kept: dict[int, int] = {}
    for pods in (200, 1000):
        cluster = KubernetesCluster.for_eks(
            remote(pods),
            EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
            page_size=50,
        )
        observe(cluster, None, None, REQUEST, project=True)  # connection, imports and the catalog

        # WHEN the live plan's ClusterSnapshot is read, page by page
        def live(cluster: KubernetesCluster = cluster) -> Any:
            return snapshot_from_observation(
                observe(cluster, None, None, REQUEST, project=True), decode_live_documents
            )

        kept[pods] = retained_bytes(live)
    # THEN each pod no decision reads costs about what the join reads of it (~0.2 KB), not a Pod (~2 KB):
    # the assessment's memory follows the GPU nodes' pods (issue 11 item 7)
    per_pod = (kept[1000] - kept[200]) / 800
    assert per_pod < 600, (per_pod, kept)


class NoWholeLists(KubernetesCluster):
    """The adapter, refusing every method that returns a whole raw list (the class of issue 11 item 7)."""

    def _list(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a whole raw list was read")


def test_the_live_observation_reads_no_list_whole_dra_included(double: KubernetesDouble) -> None:
    # GIVEN DRA served besides nodes, pods, budgets and volumes: a claim allocated on gpu-03 through a slice
    double.set_resource_api_versions(["v1"])
    try:
        double.add_resource_slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "gpu-03-slice"},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-03", "pool": {"name": "gpu-03"}},
            }
        )
        double.add_resource_claim(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "train", "namespace": "ml-1"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
                "status": {
                    "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "gpu-03"}]}},
                    "reservedFor": [{"resource": "pods", "name": "train-3", "uid": "u1"}],
                },
            }
        )
        lean = NoWholeLists.for_eks(
            double.base_url,
            EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
            page_size=3,
        )
        # WHEN the live plan observes the cluster
        projected = snapshot_from_observation(
            observe(lean, None, None, REQUEST, project=True), decode_live_documents
        )
        raw = snapshot_from_observation(
            observe(reader(double, 5000), None, None, REQUEST), decode_live_documents
        )
    finally:
        double.set_resource_api_versions(None)  # the module's other tests see no DRA

    # THEN every list was read page by page and projected, and the claims decode the same
    assert projected.resource_claims == raw.resource_claims
    (claim,) = projected.resource_claims
    assert claim.nodes == frozenset({"gpu-03"}) and claim.reserved_for == frozenset({"train-3"})


# ---------------------------------------------------------------------------------- every field a rule reads

DAY_OLD = rfc(AT - timedelta(hours=5))


def dressed_pod(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """``obj`` with what the API server adds and no rule reads (the projection may drop all of it)."""
    meta, spec, status = obj["metadata"], obj["spec"], obj["status"]
    meta.update(
        resourceVersion=str(1000 + i),
        generateName=meta["name"][:-2],
        managedFields=[
            {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {"f:podIP": {}}}}
        ],
    )
    meta["labels"] = {**meta["labels"], "pod-template-hash": f"h{i}", "app.kubernetes.io/version": "1.2"}
    meta["annotations"] = {
        **meta["annotations"],
        "kubectl.kubernetes.io/last-applied-configuration": '{"secret": "x"}' * 20,
        "vpc.amazonaws.com/pod-ips": status.get("podIP") or "",
    }
    for c in spec["containers"]:
        c.update(image="ecr/app:v1", ports=[{"containerPort": 8080}], command=["run"], args=["--token=x"])
        c["env"] = [
            *c["env"],
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "POD", "valueFrom": {"fieldRef": {}}},
        ]
        c["volumeMounts"] = [{"name": f"kube-api-access-{i}", "mountPath": "/var/run/secrets"}]
    spec["volumes"] = [*spec["volumes"], {"name": f"kube-api-access-{i}", "projected": {"sources": []}}]
    spec.update(dnsPolicy="ClusterFirst", serviceAccountName="default", priority=0, schedulerName="default")
    status["conditions"] = [
        {"type": t, "status": "True", "lastTransitionTime": DAY_OLD}
        for t in ("Initialized", "Ready", "PodScheduled")
    ]
    status.update(
        hostIP="10.9.9.9", qosClass="Burstable", containerStatuses=[{"name": "main", "ready": True}]
    )
    return obj


def dressed_node(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with what the kubelet and EKS add and no rule reads."""
    obj["metadata"]["annotations"] = {
        **obj["metadata"]["annotations"],
        "alpha.kubernetes.io/provided-node-ip": "10.9.9.9",
        "csi.volume.kubernetes.io/nodeid": '{"ebs.csi.aws.com":"i-0"}',
        "node.alpha.kubernetes.io/ttl": "0",
    }
    obj["metadata"]["labels"] = {**obj["metadata"]["labels"], "kubernetes.io/arch": "amd64", "team": "ml"}
    obj["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    obj["status"].update(
        images=[{"names": ["ecr/app@sha256:ab", "ecr/app:v1"], "sizeBytes": 1}],
        nodeInfo={"kubeletVersion": "v1.31.0-eks"},
        daemonEndpoints={"kubeletEndpoint": {"Port": 10250}},
    )
    return obj


#: One GPU node per case (its name), each with one pod exercising one field a pod rule reads.
POD_CASES: dict[str, dict[str, Any]] = {
    "emptydir-listed": {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "annotations": {CA_SAFE_TO_EVICT_LOCAL_VOLUMES: "scratch"},
    },
    "emptydir": {"volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}]},
    "hostpath": {"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]},
    "ephemeral": {"volumes": [{"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
    "mirror": {"owner": None, "annotations": {MIRROR_ANNOTATION: "abc"}},
    "ca-daemonset": {"owner": ("NodeAgent", "example.com/v1"), "annotations": {CA_DAEMONSET_POD: "true"}},
    "custom-owner": {"owner": ("NodeAgent", "example.com/v1")},
    "karpenter-expired": {"annotations": {KARPENTER_DO_NOT_DISRUPT: "2h"}},
    "karpenter-active": {"annotations": {KARPENTER_DO_NOT_DISRUPT: "10h"}},
    "do-not-disrupt": {"annotations": {ANN_DO_NOT_DISRUPT: "true"}},
    "safe-false": {"annotations": {CA_SAFE_TO_EVICT: "false"}},
    "safe-true-bare": {"owner": None, "annotations": {CA_SAFE_TO_EVICT: "true"}},
    "bare": {"owner": None},
    "grace": {"grace": 3600},
    "job": {"owner": ("Job", "batch/v1")},
    "terminating": {"owner": None, "deleting": True},
    "succeeded": {"owner": None, "phase": "Succeeded"},
    "runtime": {"extra_spec": {"runtimeClassName": "nvidia"}},
    "visible": {"env": [{"name": NVIDIA_VISIBLE_DEVICES, "value": "all"}]},
    "visible-void": {"env": [{"name": NVIDIA_VISIBLE_DEVICES, "value": "void"}]},
    "visible-from": {"env": [{"name": NVIDIA_VISIBLE_DEVICES, "valueFrom": {"fieldRef": {}}}]},
    "privileged": {"privileged": True},
    "gpu-init": {"init_gpu": True},
    "tolerates-cordon": {
        "extra_spec": {
            "tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
            ]
        }
    },
    "system": {"namespace": "kube-system"},
    "pdb-expression": {"namespace": "ml-2", "labels": {"tier": "gpu", "app": "x"}},
}
#: One GPU node per case, each with one field the node rules read.
NODE_CASES: dict[str, dict[str, Any]] = {
    "node-dnd": {"annotations": {ANN_DO_NOT_DISRUPT: "true"}},
    "node-dnd-label": {"labels": {ANN_DO_NOT_DISRUPT: "true"}},
    "node-karpenter-dnd": {"annotations": {KARPENTER_DO_NOT_DISRUPT: "true"}},
    "node-ca-disabled": {"annotations": {CA_SCALE_DOWN_DISABLED: "true"}},
    "node-ours": {"unschedulable": True, "annotations": {ANN_CORDONED_BY: "exec-1"}},
    "node-cordoned": {"unschedulable": True},
    "node-pool": {"labels": {KARPENTER_NODEPOOL: "gpu"}},
    "node-disrupted": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
    "node-young": {"created": AT - timedelta(minutes=10)},
    "node-mig": {
        "labels": {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}
    },
    "node-team": {
        "labels": {"pool": "reserved"},
        "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    },
}


def case_pod(case: str, i: int, **kw: Any) -> dict[str, Any]:
    deleting, privileged, init_gpu = (
        kw.pop("deleting", False),
        kw.pop("privileged", False),
        kw.pop("init_gpu", False),
    )
    obj = pod(f"{case}-0", case, pod_ip=f"10.5.0.{i + 1}", **kw)
    if deleting:
        # the double removes a terminating pod at its deadline (its clock is the wall clock)
        obj["metadata"]["deletionTimestamp"] = rfc(datetime.now(UTC) + timedelta(hours=1))
    if privileged:
        obj["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    if init_gpu:
        obj["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return dressed_pod(obj, i)


@pytest.fixture(scope="module")
def every_field() -> Iterator[KubernetesDouble]:
    """GPU nodes whose pods and nodes carry every field a rule reads (one case each) and every field the
    API server adds that none reads, beside CPU nodes with pods of the same kinds."""
    with KubernetesDouble(seed=9, resource_api_versions=None) as d:
        for i, (case, kw) in enumerate({**POD_CASES, **{n: {} for n in NODE_CASES}}.items()):
            node_kw = NODE_CASES.get(case, {})
            d.add_node(
                dressed_node(
                    gpu_node(case, instance_type="g5.2xlarge", gpus=1, ip=f"10.4.0.{i + 1}", **node_kw)
                )
            )
            d.add_pod(dressed_pod(exporter_pod(case, f"10.6.0.{i + 1}", name=f"dcgm-{case}"), 500 + i))
            if case in POD_CASES:
                d.add_pod(case_pod(case, i, **kw), controller=False)
        d.add_node(dressed_node(cpu_node("cpu-00", "10.2.0.1")))
        d.add_pod(case_pod("cpu-00", 99, annotations={MIRROR_ANNOTATION: "x"}), controller=False)
        # Pending GPU pods: one only node-team takes (a node label no rule lists, and its taint tolerated),
        # one that no node takes (a toleration no rule lists is not enough without the label)
        d.add_pod(
            dressed_pod(
                pod(
                    "wants-team",
                    None,
                    namespace="ml-0",
                    gpus=1,
                    phase="Pending",
                    node_selector={"pool": "reserved"},
                    extra_spec={
                        "tolerations": [
                            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
                        ]
                    },
                ),
                700,
            )
        )
        d.add_pod(
            dressed_pod(
                pod(
                    "wants-nothing",
                    None,
                    namespace="ml-0",
                    gpus=1,
                    phase="Pending",
                    node_selector={"pool": "none"},
                ),
                701,
            )
        )
        expression = pdb("tier", "ml-2", {}, 0)
        expression["spec"]["selector"] = {
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]
        }
        d.add_pdb(expression, managed_status=False)
        yield d


@pytest.mark.parametrize(
    "policy", [Policy(), Policy(node_selector={"team": "ml"}, evict_idle_gpu_holders=True)]
)
def test_the_projection_keeps_every_field_a_rule_reads(every_field: KubernetesDouble, policy: Policy) -> None:
    # GIVEN pods and nodes exercising each field the pod, node, volume and GPU rules read, dressed as the
    # API server sends them; WHEN the live plan reads them projected, page by page
    raw = snapshot_from_observation(
        observe(reader(every_field, 5000), None, None, REQUEST), decode_live_documents
    )
    projected = snapshot_from_observation(
        observe(reader(every_field, 4), None, None, REQUEST, project=True), decode_live_documents
    )
    # THEN it plans exactly as from the whole objects
    expected, got = plan(raw, policy, AT), plan(projected, policy, AT)
    assert got.model_dump(mode="json") == expected.model_dump(mode="json")
    by_node = {n.node: set(n.reasons) for n in got.nodes}
    # and every case decided what its field decides (so a projection that drops it changes the plan)
    codes = {r.split(":")[0] for reasons in by_node.values() for r in reasons}
    assert {
        "local_storage",
        "bare_pod",
        "do_not_disrupt",
        "grace_exceeds_drain_timeout",
        "running_batch_pod",
        "system_pod",
        "pdb_blocks",
        "pending_gpu_pods",
        "karpenter_owned",
        "in_flight",
        "cordoned_by_other",
        "other_autoscaler",
        "node_too_young",
    } <= codes, codes
    assert ("idle_gpu_holder" in codes) is not policy.evict_idle_gpu_holders
    for quiet in (
        "emptydir-listed",
        "mirror",
        "ca-daemonset",
        "karpenter-expired",
        "safe-true-bare",
        "terminating",
        "succeeded",
        "visible-void",
        "tolerates-cordon",
    ):
        assert not any(f"/{quiet}-0" in r for r in by_node[quiet]), (quiet, by_node[quiet])
    assert any(r.startswith("pending_gpu_pods") for r in by_node["node-team"]), by_node["node-team"]
    # and the series join maps node and pod addresses alike
    full = NodeJoiner(raw.nodes, raw.pods)
    lean = NodeJoiner(projected.nodes, projected.pods, None, projected.pod_addresses)
    series = [{"instance": f"{ip}:9400"} for n in raw.nodes for ip in n.internal_ips]
    series += [{"instance": f"{p.status.podIP}:9400"} for p in raw.pods if p.status.phase == "Running"]
    assert [lean.join(x) for x in series] == [full.join(x) for x in series]
    assert all(lean.join(x).node for x in series)
    # and what it keeps of a GPU node's pod is what the rules read, not what the API server added
    kept = next(p for p in projected.pods if p.metadata.name == "visible-from-0")
    assert set(kept.metadata.annotations) <= set(POD_ANNOTATIONS)
    assert [e.name for c in kept.all_containers() for e in c.env] == [NVIDIA_VISIBLE_DEVICES]
    assert [v.name for v in kept.spec.volumes] == []
