"""``rightsizer snapshot`` reads like the live plan (issue 11 item 7): page by page, object by object.

GIVEN clusters of two sizes in the Kubernetes API double (served from another process, so its memory is
not ours), GPU and CPU nodes with pods, budgets and volumes, read through the real adapter in pages of 20,
WHEN ``services.snapshot.record`` writes them through ``SnapshotDirectoryWriter``,
THEN the client's peak memory stays about one page whatever the cluster size (the raw lists grow with it),
AND the written snapshot decides exactly like the live plan's projected observation of the same cluster,
AND a list whose continue token expires (410) mid-way is written once, not spliced or doubled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.observe import snapshot_from_observation
from rightsizer.services.snapshot import ObserveRequest, observe, record
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.k8s.api import RecordedRequest
from rightsizer.wiring.builders import decode_live_documents
from tests.builders import AT, claim_volume, gpu_node, pdb, pod, pv, pvc
from tests.integration.test_paged_lists import cpu_node, peak_bytes
from tests.support.child_double import child_doubles

pytestmark = pytest.mark.integration

REQUEST = ObserveRequest(at=AT, window_seconds=1800, step_seconds=60, cluster="prod", region="us-east-1")
PODS_PER_NODE = 15


def seed(d: KubernetesDouble, nodes: int) -> None:
    """``nodes`` nodes (one in four a GPU node), 15 pods on each, a budget per namespace, one local volume."""
    for i in range(nodes):
        name = f"gpu-{i:04d}" if i % 4 == 0 else f"cpu-{i:04d}"
        ip = f"10.{i // 250}.{i % 250}.1"
        if i % 4 == 0:
            d.add_node(
                gpu_node(name, instance_type="g5.2xlarge", gpus=1, ip=ip, labels={"rack": f"r{i % 3}"})
            )
        else:
            d.add_node(cpu_node(name, ip))
        for k in range(PODS_PER_NODE):
            d.add_pod(
                pod(
                    f"w-{i}-{k}",
                    name,
                    namespace=f"ns-{k % 3}",
                    gpus=1 if (i % 4 == 0 and k == 0) else 0,
                    pod_ip=f"10.{100 + i // 250}.{i % 250}.{k + 2}",
                    labels={"app": f"a{k % 3}", "tier": "x"},
                )
            )
    for k in range(3):
        d.add_pdb(pdb(f"b{k}", f"ns-{k}", {"app": f"a{k}"}, 0 if k == 0 else 1), managed_status=False)
    d.add_pod(pod("waiting", None, namespace="ns-0", gpus=1, phase="Pending", node_selector={"rack": "r1"}))
    d.add_pod(pod("db-0", "gpu-0000", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")]))
    d.add_pvc(pvc("data-db-0", "local-1"))
    d.add_pv(pv("local-1", local_path="/mnt/nvme", affinity={"rack": ["r0"]}))


def reader(base_url: str, page_size: int = 20) -> KubernetesCluster:
    return KubernetesCluster.for_eks(
        base_url,
        EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
        page_size=page_size,
    )


def write(cluster: KubernetesCluster, out: Path) -> Path:
    with SnapshotDirectoryWriter(out, policy_node_labels=("rack",)) as writer:
        record(cluster, None, None, REQUEST, writer)
        return writer.commit()


def _serve(nodes: int, conn: Connection) -> None:
    """Child process: a double holding a seeded cluster of ``nodes`` nodes, until told to stop."""
    with KubernetesDouble(seed=5, resource_api_versions=None) as d:
        seed(d, nodes)
        conn.send(d.base_url)
        conn.recv()


@pytest.fixture
def remote() -> Iterator[Callable[[int], str]]:
    yield from child_doubles(_serve)


def test_a_snapshot_is_written_in_about_one_page_of_memory_whatever_the_cluster_size(
    remote: Callable[[int], str], tmp_path: Path
) -> None:
    peaks: dict[int, tuple[int, int]] = {}
    for nodes in (20, 80):
        cluster = reader(remote(nodes))
        write(cluster, tmp_path / f"warm-{nodes}")  # connection, imports and the catalog are not measured
        out = tmp_path / f"snap-{nodes}"
        lean = peak_bytes(lambda cluster=cluster, out=out: write(cluster, out))
        raw = peak_bytes(lambda cluster=cluster: (cluster.list_nodes(), cluster.list_pods()))
        pods = json.loads((out / "pods.json").read_text())["items"]
        assert len(pods) == nodes * PODS_PER_NODE + 2
        assert len(json.loads((out / "nodes.json").read_text())["items"]) == nodes
        peaks[nodes] = (raw, lean)
    # THEN the raw lists grow with the cluster; writing the snapshot stays at about one page
    (raw_small, lean_small), (raw_large, lean_large) = peaks[20], peaks[80]
    assert raw_large > 3 * raw_small, peaks
    assert lean_large < 1.5 * lean_small, peaks
    assert lean_large * 5 < raw_large, peaks


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=5, resource_api_versions=None) as d:
        seed(d, 12)
        yield d


def test_the_written_snapshot_decides_like_the_live_plan(double: KubernetesDouble, tmp_path: Path) -> None:
    # WHEN the cluster is written page by page and observed as the live plan observes it
    out = write(reader(double.base_url, page_size=7), tmp_path / "snap")
    live = snapshot_from_observation(
        observe(reader(double.base_url), None, None, REQUEST, project=True), decode_live_documents
    )
    raw = snapshot_from_observation(
        observe(reader(double.base_url, 5000), None, None, REQUEST), decode_live_documents
    )

    # THEN the three plans are one document, and the deciding cases are there
    policy = Policy(node_selector={"rack": "r0"})
    expected = plan(raw, policy, AT).model_dump(mode="json")
    assert plan(live, policy, AT).model_dump(mode="json") == expected
    assert plan(load_snapshot(out), policy, AT).model_dump(mode="json") == expected
    reasons = {r.split(":")[0] for n in expected["nodes"] for r in n["reasons"]}
    assert {"pdb_blocks", "local_storage", "not_selected"} <= reasons, reasons
    # AND pods of CPU nodes are written as the join reads them; selector keys survive, others do not
    pods = {p["metadata"]["name"]: p for p in json.loads((out / "pods.json").read_text())["items"]}
    assert pods["w-1-0"] == {
        "metadata": {"name": "w-1-0", "namespace": "ns-0"},
        "spec": {"nodeName": "cpu-0001"},
        "status": {"phase": "Running", "podIP": "10.100.1.2"},
    }
    assert pods["w-0-1"]["metadata"]["labels"] == {"app": "a1"}  # the budgets' key, not "tier"
    nodes = {n["metadata"]["name"]: n for n in json.loads((out / "nodes.json").read_text())["items"]}
    assert nodes["gpu-0000"]["metadata"]["labels"]["rack"] == "r0"  # PV affinity, pod nodeSelector, policy
    assert "kubernetes.io/hostname" not in nodes["gpu-0000"]["metadata"]["labels"]


def test_a_list_restarted_by_an_expired_continue_token_is_written_once(
    double: KubernetesDouble, tmp_path: Path
) -> None:
    # GIVEN the first continued pod list answers 410 Expired
    left = [1]

    def hook(request: RecordedRequest) -> None:
        if request.path == "/api/v1/pods" and request.param("continue") and left[0]:
            left[0] -= 1
            double.inject(
                "GET", r"^/api/v1/pods$", 410, body={"kind": "Status", "reason": "Expired"}, times=1
            )

    double.on_request(hook)
    # WHEN the snapshot is written in pages of 5
    out = write(reader(double.base_url, page_size=5), tmp_path / "snap")

    # THEN the list did restart, and every pod is written exactly once
    assert left == [0]
    names = [p["metadata"]["name"] for p in json.loads((out / "pods.json").read_text())["items"]]
    assert len(names) == len(set(names)) == 12 * PODS_PER_NODE + 2
