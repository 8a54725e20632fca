"""Audit of issue 12's "Why" classes on other inputs than the issue's examples, each through the drain
workflow against the Kubernetes double over HTTP (ClusterRole ``rightsizer`` of ``infra/k8s/rbac.yaml``
enforced) and, where AWS decides, Auto Scaling and EC2 on moto.

One test per class, parametrized over inputs of that class; the issue's own examples live in
``tests/unit/test_parity_drain.py``, ``test_drain_hygiene.py`` and ``test_drain_safety_k8s.py``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients, AwsInventory
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.ports import TerminateResult
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.observe import snapshot_from_observation
from rightsizer.services.runner import InProcessRunner
from rightsizer.services.snapshot import ObserveRequest, observe
from rightsizer.testing.fakes import FakeClock
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster
from rightsizer.wiring.builders import decode_live_documents
from tests.builders import AT, gpu_node, merge_metrics, node_devices, pdb, pod, rfc, snapshot
from tests.integration.test_drain_safety_k8s import NODES, cluster_role, drain_with_reason

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.moto_fixtures"]

KARPENTER = "karpenter.sh/do-not-disrupt"
SAFE = "cluster-autoscaler.kubernetes.io/safe-to-evict"
SAFE_LOCAL = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"
MIRROR = "kubernetes.io/config.mirror"
DS = ("DaemonSet", "apps/v1")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(AT)


@pytest.fixture
def double(clock: FakeClock) -> Any:
    with KubernetesDouble(seed=11, resource_api_versions=None, clock=clock) as d:
        d.bind_cluster_role(cluster_role("rightsizer"))
        for i, name in enumerate(NODES, start=1):
            d.add_node(gpu_node(name, instance_type="g5.xlarge", gpus=1, instance_id=f"i-{i}"))
        yield d


def started(minutes: int) -> dict[str, Any]:
    return {"startTime": rfc(AT - timedelta(minutes=minutes))}


def _started_pod(obj: dict[str, Any], minutes: int) -> dict[str, Any]:
    obj["status"].update(started(minutes))
    return obj


def kept(double: KubernetesDouble, scaler: Any) -> bool:
    """Nothing happened to gpu-1: not cordoned, no eviction, no instance terminated."""
    node = double.get_node("gpu-1")
    return (
        node is not None
        and not node["spec"].get("unschedulable")
        and scaler.terminated == []
        and not [r for r in double.requests if r.path.endswith("/eviction")]
    )


def no_403(double: KubernetesDouble) -> bool:
    return not [r for r in double.requests if r.status == 403]


# ------------------------------------------------------------- do-not-disrupt / PDB on pods never evicted


def _mirror(annotations: dict[str, str]) -> dict[str, Any]:
    obj = pod(
        "etcd-gpu-1", "gpu-1", namespace="kube-system", owner=None, annotations={MIRROR: "x", **annotations}
    )
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "controller": True}
    ]
    return obj


@pytest.mark.parametrize(
    ("obj", "pdbs", "code"),
    [
        (_mirror({KARPENTER: "true"}), [], "do_not_disrupt:kube-system/etcd-gpu-1"),
        (_mirror({"rightsizer.io/do-not-disrupt": "true"}), [], "do_not_disrupt:kube-system/etcd-gpu-1"),
        (pod("agent-1", "gpu-1", namespace="obs", owner=DS, annotations={SAFE: "false"}), [], "do_not_disrupt:obs/agent-1"),
        (_started_pod(pod("agent-1", "gpu-1", namespace="obs", owner=DS, annotations={KARPENTER: "45m"}), 10), [], "do_not_disrupt:obs/agent-1"),
        (pod("agent-1", "gpu-1", namespace="obs", owner=DS, labels={"app": "agent"}), [pdb("agent-pdb", "obs", {"app": "agent"}, 0)], "pdb_blocks:obs/agent-1:agent-pdb"),
    ],
    ids=["mirror-karpenter", "mirror-ours", "ds-safe-to-evict-false", "ds-karpenter-45m-started-10m", "ds-under-pdb"],
)  # fmt: skip
def test_protection_on_a_pod_that_is_never_evicted_still_keeps_the_node(
    double: KubernetesDouble, clock: FakeClock, obj: dict[str, Any], pdbs: list[dict[str, Any]], code: str
) -> None:
    for budget in pdbs:
        double.add_pdb(budget)
    double.add_pod(obj)
    double.add_pod(pod("web-1", "gpu-1"))
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "abandoned" and code in reason, reason
    assert kept(double, scaler) and no_403(double)


# ------------------------------------------------------------------------------- node being deleted


@pytest.mark.parametrize("finalizers", [["karpenter.sh/termination"], ["example.com/drain-first"]])
def test_a_node_being_deleted_is_left_alone(
    double: KubernetesDouble, clock: FakeClock, finalizers: list[str]
) -> None:
    node = double.get_node("gpu-1")
    node["metadata"]["deletionTimestamp"] = rfc(AT - timedelta(seconds=30))
    node["metadata"]["finalizers"] = finalizers
    double.add_node(node)
    double.add_pod(pod("web-1", "gpu-1"))
    status, scaler, reason = drain_with_reason(double, clock)
    assert (status, reason) == ("abandoned", "node_deleting")
    assert kept(double, scaler)


# --------------------------------------------------------------------------- Go durations, start time


@pytest.mark.parametrize(
    ("value", "minutes", "protected"),
    [
        ("2h45m", 120, True),
        ("1.5h", 100, False),
        ("5400s", 80, True),
        ("1h0m0.5s", 61, False),
        ("90000ms", 1, True),
        ("2d", 1, False),  # not a Go duration: protects nothing (Karpenter)
        ("+30m", 10, True),
    ],
)
def test_karpenter_do_not_disrupt_durations_follow_go_parse_duration_from_start_time(
    double: KubernetesDouble, clock: FakeClock, value: str, minutes: int, protected: bool
) -> None:
    obj = pod("train-1", "gpu-1", annotations={KARPENTER: value})
    obj["status"].update(started(minutes))
    double.add_pod(obj)
    status, scaler, reason = drain_with_reason(double, clock)
    if protected:
        assert status == "abandoned" and "do_not_disrupt:default/train-1" in reason, reason
        assert kept(double, scaler)
    else:
        assert status == "succeeded", reason
        assert scaler.terminated == ["i-1"]


def test_a_duration_without_a_start_time_protects(double: KubernetesDouble, clock: FakeClock) -> None:
    obj = pod("train-1", "gpu-1", annotations={KARPENTER: "1m"})
    del obj["status"]["startTime"]
    double.add_pod(obj)
    status, _scaler, reason = drain_with_reason(double, clock)
    assert status == "abandoned" and "do_not_disrupt" in reason, reason


# ------------------------------------------------------------------------------- safe-to-evict opt-ins


@pytest.mark.parametrize(
    "obj",
    [
        pod("scratch-1", "gpu-1", owner=None, annotations={SAFE: "true"}),
        pod("dns-1", "gpu-1", namespace="kube-system", owner=None, annotations={SAFE: "true"},
            volumes=[{"name": "tmp", "emptyDir": {}}]),
        pod("cache-1", "gpu-1", annotations={SAFE_LOCAL: "cache,logs"},
            volumes=[{"name": "cache", "emptyDir": {}}, {"name": "logs", "hostPath": {"path": "/var/log/x"}}]),
        pod("warm-1", "gpu-1", owner=("Job", "batch/v1"), annotations={SAFE: "true"}),
    ],
    ids=["bare", "kube-system-emptydir", "local-volumes-named", "running-job"],
)  # fmt: skip
def test_safe_to_evict_opt_ins_are_honoured(
    double: KubernetesDouble, clock: FakeClock, obj: dict[str, Any]
) -> None:
    double.add_pod(obj)
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "succeeded", reason
    assert scaler.terminated == ["i-1"] and no_403(double)
    name = obj["metadata"]["name"]
    assert [r for r in double.requests if r.path.endswith(f"/pods/{name}/eviction") and r.status == 201]


# ------------------------------------------------------------------------- unhealthyPodEvictionPolicy


@pytest.mark.parametrize(("policy", "drained"), [("AlwaysAllow", True), ("IfHealthyBudget", False)])
def test_an_unready_pod_under_an_exhausted_budget_follows_the_unhealthy_pod_eviction_policy(
    double: KubernetesDouble, clock: FakeClock, policy: str, drained: bool
) -> None:
    budget = pdb("api-pdb", "svc", {"app": "api"}, 0)
    budget["spec"]["unhealthyPodEvictionPolicy"] = policy
    double.add_pdb(budget)
    double.add_pod(pod("api-1", "gpu-1", namespace="svc", labels={"app": "api"}))
    double.set_pod_ready("svc", "api-1", False)
    status, scaler, reason = drain_with_reason(double, clock)
    if drained:
        assert status == "succeeded", reason
        assert scaler.terminated == ["i-1"]
    else:
        assert status == "abandoned" and "pdb_blocks:svc/api-1:api-pdb" in reason, reason
        assert kept(double, scaler)


# ------------------------------------------------------------------------- tolerate-everything pods


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"operator": "Exists"}],
        [{"operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
    ],
    ids=["everything", "every-noschedule", "the-cordon-taint"],
)
def test_a_pod_tolerating_the_cordon_is_not_evicted_and_does_not_roll_the_drain_back(
    double: KubernetesDouble, clock: FakeClock, tolerations: list[dict[str, str]]
) -> None:
    double.add_pod(pod("agent-1", "gpu-1", namespace="obs", extra_spec={"tolerations": tolerations}))
    double.add_pod(pod("web-1", "gpu-1"))
    status, _scaler, reason = drain_with_reason(double, clock)
    assert status == "succeeded", reason
    evicted = {r.path.rsplit("/", 2)[-2] for r in double.requests if r.path.endswith("/eviction")}
    assert evicted == {"web-1"}


def test_a_gpu_job_tolerating_everything_still_protects_its_node(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    job = pod(
        "train-1", "gpu-1", owner=("Job", "batch/v1"), extra_spec={"tolerations": [{"operator": "Exists"}]}
    )
    double.add_pod(job)
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "abandoned" and "running_batch_pod:default/train-1" in reason, reason
    assert kept(double, scaler)


# --------------------------------------------------------------------------------- eviction answers


@pytest.mark.parametrize("namespace", ["default", "ml"])
def test_an_eviction_answered_404_for_a_live_pod_fails_clearly_after_one_call_and_uncordons(
    double: KubernetesDouble, clock: FakeClock, namespace: str
) -> None:
    double.add_pod(pod("web-1", "gpu-1", namespace=namespace))
    double.inject("POST", r"/pods/web-1/eviction$", 404, times=None)
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "failed" and "eviction_unsupported" in reason, reason
    assert len([r for r in double.requests if r.path.endswith("/pods/web-1/eviction")]) == 1
    assert scaler.terminated == [] and double.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert double.get_pod(namespace, "web-1") is not None


@pytest.mark.parametrize("conflicts", [1, 3])
def test_a_409_on_the_cordon_rereads_and_retries(
    double: KubernetesDouble, clock: FakeClock, conflicts: int
) -> None:
    double.add_pod(pod("web-1", "gpu-1"))
    double.inject("PATCH", r"^/api/v1/nodes/gpu-1$", 409, times=conflicts)
    status, _scaler, reason = drain_with_reason(double, clock)
    assert status == "succeeded", reason
    patches = [r.status for r in double.requests if r.method == "PATCH" and r.path == "/api/v1/nodes/gpu-1"]
    assert patches[:conflicts] == [409] * conflicts and 200 in patches


# ------------------------------------------------------- BUG-51: a paginated pod list that expires (410)


@pytest.mark.parametrize("expiries", [1, 2])
def test_an_expired_pod_list_is_restarted_never_read_as_an_empty_node(
    double: KubernetesDouble, clock: FakeClock, expiries: int
) -> None:
    # GIVEN gpu-1's pods listed one per page, the running GPU Job sorting last, and the continue token
    # expiring (410) on the last page, once or twice in a row
    for name in ("a-web-1", "b-web-2"):
        double.add_pod(pod(name, "gpu-1"))
    double.add_pod(pod("train-llm-0", "gpu-1", namespace="ml", owner=("Job", "batch/v1"), gpus=1))
    left = [expiries]

    def expire_continue_tokens(request: Any) -> None:
        if request.path == "/api/v1/pods" and request.param("continue") and left[0] > 0:
            left[0] -= 1
            double.inject("GET", r"^/api/v1/pods$", 410, times=1)  # this very request answers 410

    double.on_request(expire_continue_tokens)
    # WHEN the drain runs
    status, scaler, reason = drain_with_reason(double, clock, page_size=1)
    # THEN the list was restarted (or the step retried): the Job is seen and protects the node
    assert status == "abandoned" and "running_batch_pod:ml/train-llm-0" in reason, reason
    assert kept(double, scaler)
    assert [r.status for r in double.requests if r.path == "/api/v1/pods"].count(410) == expiries


# ---------------------------------------------------------------------------- what is reported: PDBs


def test_a_second_budget_found_mid_drain_is_named_in_the_reason_the_event_and_the_ledger(
    double: KubernetesDouble, clock: FakeClock
) -> None:
    double.add_pdb(
        {
            **pdb("zeta-pdb", "svc", {"app": "api"}, 1),
            "spec": {"selector": {"matchLabels": {"app": "api"}}, "maxUnavailable": 1},
        }
    )
    double.add_pod(pod("api-1", "gpu-1", namespace="svc", labels={"app": "api", "tier": "gold"}))

    def second_budget_after_cordon(request: Any) -> None:
        if (
            request.method == "PATCH"
            and request.path == "/api/v1/nodes/gpu-1"
            and not double.get_pdb("svc", "alpha-pdb")
        ):
            double.add_pdb(
                {
                    **pdb("alpha-pdb", "svc", {"tier": "gold"}, 1),
                    "spec": {"selector": {"matchLabels": {"tier": "gold"}}, "maxUnavailable": 1},
                }
            )

    double.on_request(second_budget_after_cordon)
    status, scaler, reason = drain_with_reason(double, clock)
    assert status == "rolled_back", reason
    assert "multiple_pdbs:svc/api-1:alpha-pdb,zeta-pdb" in reason  # the ledger's reason
    [event] = double.events(involved_name="gpu-1", reason="RolledBack")
    assert "alpha-pdb,zeta-pdb" in event["message"]
    assert scaler.terminated == [] and double.get_node("gpu-1")["spec"]["unschedulable"] is False


# ------------------------------------------------------------------- AWS decides: moto Auto Scaling/EC2


def _drain_on_moto(
    double: KubernetesDouble,
    clock: FakeClock,
    aws: AwsClients,
    built: BuiltCluster,
    *,
    during_remove: Any = None,
) -> tuple[str, str, MemoryState]:
    """Drain gpu-1 with the assessment reading the double and moto (EC2 states, Auto Scaling membership)
    through the real adapters; metrics say idle."""
    cluster = KubernetesCluster.for_eks(
        double.base_url, EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None))
    )
    metrics = merge_metrics(*(node_devices(n, 1) for n in NODES))

    def observe_now(now: datetime) -> ClusterSnapshot:
        request = ObserveRequest(at=AT, window_seconds=1800, step_seconds=60, cluster=built.cluster,
                                 region="us-east-1", eks_cluster=built.cluster)  # fmt: skip
        live = snapshot_from_observation(
            observe(cluster, AwsInventory(aws), None, request), decode_live_documents
        )
        # Kubernetes objects and AWS inventory as read live; the DCGM samples of an idle window (format 1).
        idle = snapshot([], [], metrics, at=AT)
        return dataclasses.replace(live, meta=idle.meta, metrics=idle.metrics, source="snapshot")

    policy = Policy(dry_run=False)
    scaler = AutoScalingGroups(aws.autoscaling)
    if during_remove is not None:
        original = scaler.terminate

        def terminate(asg_name: str, instance_id: str) -> TerminateResult:
            during_remove(asg_name, instance_id)
            return original(asg_name, instance_id)

        scaler.terminate = terminate  # type: ignore[method-assign]
    state = MemoryState(built.cluster)
    deps = DrainDeps(cluster=cluster, scaler=scaler, assessor=PlanningAssessor(observe_now, policy), state=state,
                     policy=policy, dry_run=False, clock=clock.now)  # fmt: skip
    workflow = DrainWorkflow(deps)
    InProcessRunner(workflow, sleep=clock.advance).start(
        DrainRequest("gpu-1", "exec-1", hourly_savings_usd=1.0)
    )
    record = state.load("exec-1")
    assert record is not None
    return record.status, state.entries("exec-1")[-1].reason, state


@pytest.fixture
def moto_double(clock: FakeClock, gpu_cluster: BuiltCluster) -> Any:
    group = gpu_cluster.nodegroups["gpu-a10g"]
    with KubernetesDouble(seed=11, resource_api_versions=None, clock=clock) as d:
        # The drain's writes under its own role; its assessor here reads the whole cluster (observe_now),
        # as the assessment does under rightsizer-read (issue 26: the drain's role lists no volumes).
        drain, read = cluster_role("rightsizer"), cluster_role("rightsizer-read")
        d.bind_cluster_role({**drain, "rules": [*drain["rules"], *read["rules"]]})
        for name, instance in zip(NODES, group.instance_ids, strict=True):
            d.add_node(gpu_node(name, instance_type="g5.2xlarge", gpus=1, instance_id=instance))
        d.add_pod(pod("web-1", "gpu-1"))
        yield d


@pytest.mark.parametrize("how", ["terminate", "stop"])
def test_a_lingering_node_of_an_instance_that_is_gone_is_not_drained(
    clock: FakeClock,
    aws_clients: AwsClients,
    gpu_cluster: BuiltCluster,
    moto_double: KubernetesDouble,
    how: str,
) -> None:
    instance = gpu_cluster.nodegroups["gpu-a10g"].instance_ids[0]
    getattr(aws_clients.ec2, f"{how}_instances")(InstanceIds=[instance])
    status, reason, _ = _drain_on_moto(moto_double, clock, aws_clients, gpu_cluster)
    assert status == "abandoned" and "other_autoscaler:instance_" in reason, reason
    assert not moto_double.get_node("gpu-1")["spec"].get("unschedulable")


@pytest.mark.parametrize("decrement", [False, True], ids=["replaced", "removed-by-someone"])
def test_savings_are_booked_only_when_our_terminate_removed_the_instance_and_the_group_shrank(
    clock: FakeClock,
    aws_clients: AwsClients,
    gpu_cluster: BuiltCluster,
    moto_double: KubernetesDouble,
    decrement: bool,
) -> None:
    def third_party(asg_name: str, instance_id: str) -> None:
        aws_clients.autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=decrement
        )

    status, reason, state = _drain_on_moto(
        moto_double, clock, aws_clients, gpu_cluster, during_remove=third_party
    )
    assert status == "succeeded", reason
    [verify] = [e for e in state.entries("exec-1") if e.step == "verify"]
    assert verify.hourly_savings_usd is None and "no savings booked" in verify.reason


def test_savings_are_booked_when_our_terminate_shrank_the_group(
    clock: FakeClock, aws_clients: AwsClients, gpu_cluster: BuiltCluster, moto_double: KubernetesDouble
) -> None:
    status, reason, state = _drain_on_moto(moto_double, clock, aws_clients, gpu_cluster)
    assert status == "succeeded", reason
    [verify] = [e for e in state.entries("exec-1") if e.step == "verify"]
    assert verify.hourly_savings_usd == 1.0
