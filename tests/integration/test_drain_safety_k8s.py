"""The drain workflow against the Kubernetes API double over real HTTP, authorized by exactly the
ClusterRole ``rightsizer`` of ``infra/k8s/rbac.yaml`` (issue 12): node-local data found through
PersistentVolumeClaim → PersistentVolume reads protects the node; a network volume does not; a pod whose
controller object is gone (read back by GET) is a bare pod and keeps the node."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.ports import AccessCheck
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeClock, FakeNodeScaler
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster
from tests.builders import AT, claim_volume, gpu_node, merge_metrics, node_devices, pod, pv, pvc, snapshot

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.moto_fixtures"]

RBAC = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "rbac.yaml"
NODES = ("gpu-1", "gpu-2", "gpu-3")
ASG = "eks-gpu-a10g-asg"


def cluster_role(name: str) -> dict[str, Any]:
    """The ClusterRole ``name`` as infra/k8s/rbac.yaml defines it."""
    docs = yaml.safe_load_all(RBAC.read_text())
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(AT)


@pytest.fixture
def double(clock: FakeClock) -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=7, resource_api_versions=None, clock=clock) as d:
        d.bind_cluster_role(cluster_role("rightsizer"))
        for i, name in enumerate(NODES, start=1):
            d.add_node(gpu_node(name, instance_type="g5.xlarge", gpus=1, instance_id=f"i-{i}"))
        yield d


def drain(
    double: KubernetesDouble, clock: FakeClock, scaler: Any = None, *, cluster_name: str = "prod"
) -> tuple[str, Any]:
    """Run one drain of gpu-1 to its end; returns (final status, the node scaler)."""
    status, scaler, _ = drain_with_reason(double, clock, scaler, cluster_name=cluster_name)
    return status, scaler


def drain_with_reason(
    double: KubernetesDouble,
    clock: FakeClock,
    scaler: Any = None,
    *,
    cluster_name: str = "prod",
    policy: Policy | None = None,
    page_size: int = 500,
) -> tuple[str, Any, str]:
    """Like :func:`drain`, plus the reason of the drain's last ledger entry."""
    cluster = KubernetesCluster.for_eks(
        double.base_url,
        EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
        page_size=page_size,
    )
    if scaler is None:
        scaler = FakeNodeScaler()
        scaler.add_group(ASG, min_size=0, desired=3, max_size=5, instance_ids=["i-1", "i-2", "i-3"])
    metrics = merge_metrics(*(node_devices(n, 1) for n in NODES))

    def observe(now: datetime) -> ClusterSnapshot:
        # Metrics say idle; pods and volumes come from the double (the drain's own reads decide).
        return snapshot(double.list_nodes(), [], metrics, at=AT)

    policy = policy or Policy(dry_run=False)
    deps = DrainDeps(
        cluster=cluster,
        scaler=scaler,
        assessor=PlanningAssessor(observe, policy),
        # the EKS cluster: only its opted-in groups (eks:cluster-name, rightsizer.io/enabled) are scaled in
        state=MemoryState(cluster_name),
        policy=policy,
        dry_run=False,
        clock=clock.now,
    )
    workflow = DrainWorkflow(deps)

    def sleep(seconds: float) -> None:
        clock.advance(seconds)

    InProcessRunner(workflow, sleep=sleep).start(DrainRequest("gpu-1", "exec-1"))
    record = deps.state.load("exec-1")
    assert record is not None
    entries = deps.state.entries("exec-1")  # type: ignore[attr-defined]
    return record.status, scaler, entries[-1].reason if entries else ""


# (owner kind, apiVersion, resource plural, API path segment) of every controller the drain reads back.
CONTROLLERS = [
    ("ReplicaSet", "apps/v1", "replicasets", "/apis/apps/v1/namespaces/ml/replicasets/"),
    ("StatefulSet", "apps/v1", "statefulsets", "/apis/apps/v1/namespaces/ml/statefulsets/"),
    ("DaemonSet", "apps/v1", "daemonsets", "/apis/apps/v1/namespaces/ml/daemonsets/"),
    ("Job", "batch/v1", "jobs", "/apis/batch/v1/namespaces/ml/jobs/"),
    (
        "ReplicationController",
        "v1",
        "replicationcontrollers",
        "/api/v1/namespaces/ml/replicationcontrollers/",
    ),
]


@pytest.mark.parametrize(
    ("kind", "api_version", "plural", "path"), CONTROLLERS, ids=[c[0] for c in CONTROLLERS]
)
def test_a_pod_whose_controller_is_gone_is_a_bare_pod_and_keeps_its_node(
    double: KubernetesDouble, clock: FakeClock, kind: str, api_version: str, plural: str, path: str
) -> None:
    # GIVEN a pod whose controller was deleted with its pods orphaned (kubectl delete --cascade=orphan),
    # beside a healthy pod of a live ReplicaSet
    double.add_pod(pod("serve-1", "gpu-1", namespace="ml", owner=("ReplicaSet", "apps/v1")))
    double.add_pod(pod("orphan-1", "gpu-1", namespace="ml", owner=(kind, api_version)))
    assert double.delete_controller("ml", plural, "orphan-1-owner")
    # WHEN the drain runs
    status, scaler, reason = drain_with_reason(double, clock)
    # THEN it stops before the cordon: nothing recreates that pod (Cluster Autoscaler: ControllerNotFound)
    assert status == "abandoned", reason
    assert "bare_pod:ml/orphan-1" in reason and "serve-1" not in reason
    assert scaler.terminated == []
    assert double.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert double.get_pod("ml", "orphan-1") is not None
    reads = {(r.path, r.status) for r in double.requests if r.method == "GET" and r.path.startswith(path)}
    assert (path + "orphan-1-owner", 404) in reads
    assert [r for r in double.requests if r.status == 403] == []


@pytest.mark.parametrize(
    ("kind", "api_version", "plural", "path"), CONTROLLERS, ids=[c[0] for c in CONTROLLERS]
)
def test_with_every_controller_alive_the_node_is_drained(
    double: KubernetesDouble, clock: FakeClock, kind: str, api_version: str, plural: str, path: str
) -> None:
    annotations = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"} if kind == "Job" else {}
    double.add_pod(
        pod("worker-1", "gpu-1", namespace="ml", owner=(kind, api_version), annotations=annotations)
    )
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "succeeded", reason
    assert scaler.terminated == ["i-1"]
    assert (path + "worker-1-owner", 200) in {(r.path, r.status) for r in double.requests}
    assert [r for r in double.requests if r.status == 403] == []


def test_a_controller_deleted_after_the_cordon_rolls_the_drain_back(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    # GIVEN a StatefulSet pod whose StatefulSet is deleted (orphaning it) right after our cordon
    double.add_pod(pod("db-0", "gpu-1", namespace="ml", owner=("StatefulSet", "apps/v1")))

    def orphan_after_cordon(request: Any) -> None:
        if request.method == "PATCH" and request.path == "/api/v1/nodes/gpu-1":
            double.delete_controller("ml", "statefulsets", "db-0-owner")

    double.on_request(orphan_after_cordon)
    status, scaler, reason = drain_with_reason(double, clock)
    # THEN the revalidation finds the bare pod and rolls back: uncordoned, nothing evicted or terminated
    assert status == "rolled_back", reason
    assert "bare_pod:ml/db-0" in reason
    assert scaler.terminated == []
    assert double.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert double.get_pod("ml", "db-0") is not None
    assert not [r for r in double.requests if r.path.endswith("/eviction")]


def test_without_the_controller_grants_the_drain_fails_closed(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    role = cluster_role("rightsizer")
    role["rules"] = [r for r in role["rules"] if "jobs" not in r["resources"]]
    double.bind_cluster_role(role)
    double.add_pod(
        pod(
            "warm-1",
            "gpu-1",
            owner=("Job", "batch/v1"),
            annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
        )
    )
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "failed" and "get jobs.batch" in reason, reason
    # the remedy names the role that grants it to the drain's identity, not the assessment's read role
    # (the drain's own group since off-hours has a list-only group of its own, #26)
    assert "Remedy: bind the ClusterRole rightsizer (infra/k8s/rbac.yaml; the drain function's EKS" in reason
    assert "rightsizer-read" not in reason
    assert scaler.terminated == [] and double.get_node("gpu-1")["spec"]["unschedulable"] is False


def test_a_pod_on_a_local_persistent_volume_keeps_its_node(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    double.add_pod(
        pod("db-0", "gpu-1", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")])
    )
    double.add_pvc(pvc("data-db-0", "local-pv-1"))
    double.add_pv(pv("local-pv-1", local_path="/mnt/nvme0", affinity={"kubernetes.io/hostname": ["gpu-1"]}))
    status, scaler = drain(double, clock)
    assert status == "abandoned"
    assert scaler.terminated == []
    assert double.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert double.get_pod("default", "db-0") is not None
    paths = [r.path for r in double.requests if r.status == 200]
    assert "/api/v1/namespaces/default/persistentvolumeclaims/data-db-0" in paths
    assert "/api/v1/persistentvolumes/local-pv-1" in paths
    assert [r for r in double.requests if r.status == 403] == []


def test_a_pod_on_a_network_volume_is_drained(double: KubernetesDouble, clock: FakeClock) -> None:
    double.add_pod(
        pod("db-0", "gpu-1", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")])
    )
    double.add_pvc(pvc("data-db-0", "pv-ebs"))
    double.add_pv(pv("pv-ebs"))
    status, scaler = drain(double, clock)
    assert status == "succeeded"
    assert scaler.terminated == ["i-1"]
    assert [r for r in double.requests if r.status == 403] == []


def test_without_the_volume_grants_the_drain_fails_closed(double: KubernetesDouble, clock: FakeClock) -> None:
    role = cluster_role("rightsizer")
    role["rules"] = [r for r in role["rules"] if "persistentvolumes" not in r["resources"]]
    double.bind_cluster_role(role)
    double.add_pod(
        pod("db-0", "gpu-1", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")])
    )
    double.add_pvc(pvc("data-db-0", "pv-ebs"))
    double.add_pv(pv("pv-ebs"))
    status, scaler = drain(double, clock)
    assert status == "failed"
    assert scaler.terminated == [] and double.get_node("gpu-1")["spec"]["unschedulable"] is False


def test_a_403_namespace_terminating_eviction_waits_instead_of_failing(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    double.add_pod(pod("web-1", "gpu-1"))
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'pods "web-1" is forbidden: unable to create new content in namespace default because it '
        "is being terminated",
        "reason": "Forbidden",
        "details": {"name": "web-1", "kind": "pods", "causes": [{"type": "NamespaceTerminating"}]},
        "code": 403,
    }
    double.inject("POST", r"/pods/web-1/eviction$", 403, body, times=2)
    status, scaler = drain(double, clock)
    assert status == "succeeded" and scaler.terminated == ["i-1"]
    evictions = [r for r in double.requests if r.path.endswith("/pods/web-1/eviction")]
    assert [r.status for r in evictions][:3] == [403, 403, 201]


def test_the_assessment_identity_heals_a_stale_cordon_with_exactly_its_roles(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    """The assess function is bound to rightsizer-read and rightsizer-heal only: that is enough to remove a
    cordon of ours that no live workflow holds, and to record the Event — and nothing more."""
    from rightsizer.domain.model import ANN_CORDONED_BY, Node
    from rightsizer.services.healing import heal_stale_cordons, stale_cordons

    read, heal = cluster_role("rightsizer-read"), cluster_role("rightsizer-heal")
    double.bind_cluster_role({"rules": read["rules"] + heal["rules"]})
    double.add_node(
        gpu_node("gpu-9", instance_type="g5.xlarge", gpus=1, instance_id="i-9", unschedulable=True,
                 annotations={ANN_CORDONED_BY: "dead-exec", "rightsizer.io/cordoned-at": "2026-11-02T09:00:00Z"})
    )  # fmt: skip
    cluster = KubernetesCluster.for_eks(
        double.base_url, EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None))
    )
    state = MemoryState("prod")
    nodes = [Node.model_validate(n) for n in cluster.list_nodes()]
    stale = stale_cordons(nodes, state, clock.now())
    assert stale == {"gpu-9": "dead-exec"}
    assert heal_stale_cordons(cluster, state, stale, clock.now()) == ["gpu-9"]
    healed = double.get_node("gpu-9")
    assert healed["spec"]["unschedulable"] is False
    assert ANN_CORDONED_BY not in healed["metadata"].get("annotations", {})
    assert [e["reason"] for e in double.events(involved_name="gpu-9")] == ["RolledBack"]
    assert [r for r in double.requests if r.status == 403] == []
    # The same identity still may not evict: the heal role grants no more than it needs.
    assert double.get_pod("default", "nothing") is None
    denied = cluster.preflight([AccessCheck("create", "pods", "eviction")])
    assert denied == [AccessCheck("create", "pods", "eviction")]


@pytest.mark.parametrize("local", [True, False], ids=["local-pv-kept", "network-pv-drained"])
def test_node_local_data_on_moto_auto_scaling(
    clock: FakeClock, aws_clients: AwsClients, gpu_cluster: BuiltCluster, local: bool
) -> None:
    """The same drain against Auto Scaling on moto: a local volume leaves the group untouched; a network
    volume ends with exactly that instance terminated and DesiredCapacity one lower."""
    group = gpu_cluster.nodegroups["gpu-a10g"]
    with KubernetesDouble(seed=7, resource_api_versions=None, clock=clock) as double:
        double.bind_cluster_role(cluster_role("rightsizer"))
        for name, instance in zip(NODES, group.instance_ids, strict=True):
            double.add_node(gpu_node(name, instance_type="g5.2xlarge", gpus=1, instance_id=instance))
        double.add_pod(
            pod("db-0", "gpu-1", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")])
        )
        double.add_pvc(pvc("data-db-0", "pv-1"))
        affinity = {"kubernetes.io/hostname": ["gpu-1"]}
        double.add_pv(pv("pv-1", local_path="/mnt/nvme0", affinity=affinity) if local else pv("pv-1"))
        scaler = AutoScalingGroups(aws_clients.autoscaling)
        status, _ = drain(double, clock, scaler, cluster_name=gpu_cluster.cluster)
    described = scaler.describe_group(group.asg_name)
    desired, in_service = described.sizes.desired, described.in_service
    if local:
        assert status == "abandoned"
        assert desired == 3 and group.instance_ids[0] in in_service
    else:
        assert status == "succeeded"
        assert desired == 2 and group.instance_ids[0] not in in_service


def _kubelet_goes_away(double: KubernetesDouble) -> Any:
    """A request hook: once the first eviction is accepted, gpu-1's kubelet stops reporting (NotReady)."""

    def hook(request: Any) -> None:
        if request.method == "POST" and request.path.endswith("/eviction"):
            node = double.get_node("gpu-1")
            assert node is not None
            node["status"]["conditions"] = [
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
            ]
            double.add_node(node)

    return hook


@pytest.mark.parametrize("stuck_by", ["finalizer", "NotReady kubelet"])
def test_a_pod_stuck_terminating_is_skipped_after_the_timeout_not_polled_until_the_deadline(
    double: KubernetesDouble, clock: FakeClock, stuck_by: str
) -> None:
    # GIVEN a pod (grace 20 s) that will never finish terminating, beside one that will
    stuck = pod("cache-1", "gpu-1", namespace="ml", grace=20)
    if stuck_by == "finalizer":
        stuck["metadata"]["finalizers"] = ["example.com/flush"]
    else:
        double.on_request(_kubelet_goes_away(double))
    double.add_pod(stuck)
    start = clock.now()
    # WHEN the drain runs with skip_wait_for_delete_timeout 45 s (simulated time)
    status, scaler, reason = drain_with_reason(
        double, clock, policy=Policy(dry_run=False, skip_wait_for_delete_timeout=45)
    )
    # THEN it stops waiting 45 s after the deletionTimestamp (eviction + 20 s), well before drain_timeout
    assert status == "succeeded", reason
    assert scaler.terminated == ["i-1"]
    took = (clock.now() - start).total_seconds()
    assert 20 + 45 <= took <= 20 + 45 + 15, took
    lists = [
        r for r in double.requests if r.method == "GET" and r.param("fieldSelector") == "spec.nodeName=gpu-1"
    ]
    assert len(lists) <= 25  # polled every 5 s, then given up — not until the 600 s deadline
    events = double.events(involved_name="gpu-1", reason="SkippedStuckPods")
    assert len(events) == 1 and "ml/cache-1" in events[0]["message"]


def test_with_the_skip_disabled_a_stuck_pod_is_waited_for_until_the_drain_timeout(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    stuck = pod("cache-1", "gpu-1", namespace="ml", grace=20)
    stuck["metadata"]["finalizers"] = ["example.com/flush"]
    double.add_pod(stuck)
    status, scaler, reason = drain_with_reason(
        double, clock, policy=Policy(dry_run=False, skip_wait_for_delete_timeout=0)
    )
    assert status == "rolled_back" and reason.startswith("drain_timeout"), reason
    assert scaler.terminated == [] and double.get_node("gpu-1")["spec"]["unschedulable"] is False
