"""Workload scale-to-zero and exact restore, per kind, against the Kubernetes double over HTTP (issue 32):
the official client through ``KubernetesCluster``'s workload writes, the scale subresource, and the
owners' own switches (Notebook annotation, InferenceService minReplicas, KEDA paused-replicas)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.workload_saves import MemoryWorkloadSaves
from rightsizer.domain.workload_model import WorkloadRef
from rightsizer.domain.workload_scale import ANN_SAVED, SavedWorkload
from rightsizer.domain.workloads import WorkloadVerdict
from rightsizer.services.workloads import WorkloadScaler, parse_workload
from rightsizer.testing.k8s import KubernetesDouble

CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)
AT = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)
NS = "ml"


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=1, resource_api_versions=None) as d:
        yield d


def cluster(d: KubernetesDouble) -> KubernetesCluster:
    return KubernetesCluster.for_eks(d.base_url, EksTokenSource("prod-eks", "us-east-1", lambda: CREDS))


def obj(
    api: str, kind: str, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "annotations": annotations or {"team": "research"}}
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec}


def verdict(kind: str, group: str, name: str, method: str, **kw: Any) -> WorkloadVerdict:
    return WorkloadVerdict(
        workload=WorkloadRef(group=group, kind=kind, namespace=NS, name=name),
        verdict="scale_to_zero",
        reasons=[],
        method=method,
        replicas=None,
        pods=[],
        nodes=[],
        gpus=1,
        hourly_usd=1.0,
        **kw,
    )


HPA = obj(
    "autoscaling/v2",
    "HorizontalPodAutoscaler",
    "srv-hpa",
    {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "srv"},
        "minReplicas": 2,
        "maxReplicas": 6,
    },
)
SO = obj(
    "keda.sh/v1alpha1",
    "ScaledObject",
    "chat-so",
    {"scaleTargetRef": {"name": "chat"}, "minReplicaCount": 1, "maxReplicaCount": 4},
)

# (objects to store as plural → object, the verdict, the object the switch changes, the change seen at zero)
KINDS = [
    pytest.param(
        {
            "deployments": obj("apps/v1", "Deployment", "srv", {"replicas": 3}),
            "horizontalpodautoscalers": HPA,
        },
        verdict("Deployment", "apps", "srv", "scale_subresource", hpa="srv-hpa"),
        ("deployments", "srv"),
        lambda o: o["spec"]["replicas"] == 0,
        id="deployment-with-hpa",
    ),
    pytest.param(
        {"statefulsets": obj("apps/v1", "StatefulSet", "db", {"replicas": 2})},
        verdict("StatefulSet", "apps", "db", "scale_subresource"),
        ("statefulsets", "db"),
        lambda o: o["spec"]["replicas"] == 0,
        id="statefulset",
    ),
    pytest.param(
        {
            "leaderworkersets": obj(
                "leaderworkerset.x-k8s.io/v1",
                "LeaderWorkerSet",
                "lws",
                {"replicas": 2, "leaderWorkerTemplate": {"size": 4}},
            )
        },
        verdict("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "lws", "scale_subresource"),
        ("leaderworkersets", "lws"),
        lambda o: o["spec"]["replicas"] == 0 and o["spec"]["leaderWorkerTemplate"] == {"size": 4},
        id="leaderworkerset",
    ),
    pytest.param(
        {"notebooks": obj("kubeflow.org/v1", "Notebook", "nb", {"template": {"spec": {"containers": []}}})},
        verdict("Notebook", "kubeflow.org", "nb", "notebook_stopped"),
        ("notebooks", "nb"),
        lambda o: o["metadata"]["annotations"]["kubeflow-resource-stopped"] == "2026-12-07T04:00:00Z",
        id="kubeflow-notebook",
    ),
    pytest.param(
        {
            "inferenceservices": obj(
                "serving.kserve.io/v1beta1",
                "InferenceService",
                "llm",
                {
                    "predictor": {
                        "minReplicas": 1,
                        "maxReplicas": 3,
                        "model": {"modelFormat": {"name": "huggingface"}},
                    }
                },
            )
        },
        verdict("InferenceService", "serving.kserve.io", "llm", "inferenceservice_min_replicas"),
        ("inferenceservices", "llm"),
        lambda o: o["spec"]["predictor"]["minReplicas"] == 0 and o["spec"]["predictor"]["maxReplicas"] == 3,
        id="kserve-inferenceservice",
    ),
    pytest.param(
        {"deployments": obj("apps/v1", "Deployment", "chat", {"replicas": 1}), "scaledobjects": SO},
        verdict("Deployment", "apps", "chat", "keda_paused_replicas", scaled_object="chat-so"),
        ("scaledobjects", "chat-so"),
        lambda o: o["metadata"]["annotations"]["autoscaling.keda.sh/paused-replicas"] == "0",
        id="keda-scaledobject",
    ),
]


def _comparable(o: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(o)
    for k in ("resourceVersion", "generation", "managedFields"):
        out["metadata"].pop(k, None)
    return out


@pytest.mark.parametrize(("objects", "v", "switched", "at_zero"), KINDS)
def test_scale_to_zero_then_restore_brings_back_exactly_what_was_there(
    double: KubernetesDouble,
    objects: dict[str, Any],
    v: WorkloadVerdict,
    switched: tuple[str, str],
    at_zero: Any,
) -> None:
    # GIVEN the workload's objects as a person or a controller left them
    for plural, o in objects.items():
        double.add_object(plural, o)
    owner_plural = next(p for p, o in objects.items() if o["kind"] == v.workload.kind)
    before = {
        p: _comparable(double.get_object(p, NS, o["metadata"]["name"]) or {}) for p, o in objects.items()
    }
    saves = MemoryWorkloadSaves()
    scaler = WorkloadScaler(cluster(double), saves, dry_run=False, clock=lambda: AT)

    # WHEN it is scaled to zero
    out = scaler.scale_to_zero(v)

    # THEN the switch is turned, and the prior state is in the state table and on the owner's annotation
    assert out.result == "scaled_to_zero", out
    assert at_zero(double.get_object(*switched[:1], NS, switched[1]))
    owner = double.get_object(owner_plural, NS, v.workload.name)
    assert owner is not None
    on_owner = SavedWorkload.from_object(owner)
    assert on_owner == saves.get_workload(v.workload.text) == out.saved
    # AND a second scale-down keeps the first one's saved values (never overwritten by the zero state)
    assert scaler.scale_to_zero(v).saved == out.saved

    # WHEN it is restored
    back = scaler.restore(v.workload.text)

    # THEN every object is exactly as before (but for resourceVersion/generation), and nothing stays saved
    assert back.result == "restored", back
    after = {
        p: _comparable(double.get_object(p, NS, o["metadata"]["name"]) or {}) for p, o in objects.items()
    }
    assert after == before
    assert saves.saved_workloads() == []


def test_the_saved_state_names_every_prior_setting(double: KubernetesDouble) -> None:
    double.add_object("deployments", obj("apps/v1", "Deployment", "srv", {"replicas": 3}))
    double.add_object("horizontalpodautoscalers", HPA)
    saves = MemoryWorkloadSaves()
    out = WorkloadScaler(cluster(double), saves, dry_run=False, clock=lambda: AT).scale_to_zero(
        verdict("Deployment", "apps", "srv", "scale_subresource", hpa="srv-hpa")
    )
    assert out.saved is not None
    assert (out.saved.replicas, out.saved.hpa, out.saved.hpa_min_replicas, out.saved.hpa_max_replicas) == (
        3,
        "srv-hpa",
        2,
        6,
    )
    scale = [r for r in double.requests if r.path.endswith("/deployments/srv/scale") and r.method == "PATCH"]
    assert [r.body for r in scale] == [{"spec": {"replicas": 0}}]
    # the annotation was written before the switch was turned
    patches = [r.path for r in double.requests if r.method == "PATCH"]
    assert patches == [
        "/apis/apps/v1/namespaces/ml/deployments/srv",
        "/apis/apps/v1/namespaces/ml/deployments/srv/scale",
    ]


def test_a_restore_without_the_table_reads_the_owners_annotation(double: KubernetesDouble) -> None:
    double.add_object("statefulsets", obj("apps/v1", "StatefulSet", "db", {"replicas": 2}))
    WorkloadScaler(cluster(double), MemoryWorkloadSaves(), dry_run=False, clock=lambda: AT).scale_to_zero(
        verdict("StatefulSet", "apps", "db", "scale_subresource")
    )
    back = WorkloadScaler(cluster(double), MemoryWorkloadSaves(), dry_run=False).restore("statefulset/ml/db")
    assert back.result == "restored"
    restored = double.get_object("statefulsets", NS, "db")
    assert restored is not None and restored["spec"]["replicas"] == 2
    assert ANN_SAVED not in restored["metadata"]["annotations"]


def test_a_dry_run_writes_nothing(double: KubernetesDouble) -> None:
    double.add_object("deployments", obj("apps/v1", "Deployment", "srv", {"replicas": 3}))
    saves = MemoryWorkloadSaves()
    out = WorkloadScaler(cluster(double), saves, dry_run=True).scale_to_zero(
        verdict("Deployment", "apps", "srv", "scale_subresource")
    )
    assert out.result == "would_scale" and out.saved is not None and out.saved.replicas == 3
    assert [r for r in double.requests if r.method != "GET"] == [] and saves.saved_workloads() == []


def test_restore_names_only_scalable_kinds() -> None:
    assert parse_workload("notebook/ml/nb").kind == "Notebook"
    with pytest.raises(ValueError, match="Kind/namespace/name"):
        parse_workload("Job/ml/train")


def test_the_workloads_cluster_role_grants_exactly_what_scale_restore_and_the_read_use(
    double: KubernetesDouble,
) -> None:
    from rightsizer.services.workload_reads import WORKLOAD_READ_CHECKS, workload_objects
    from tests.support.rbac import function_role_named, unused

    # GIVEN every kind at once, and the double enforcing exactly ClusterRole rightsizer-workloads
    role = function_role_named("rightsizer-workloads")
    double.bind_cluster_role(role)
    verdicts = [p.values[1] for p in KINDS]
    for p in KINDS:
        for plural, o in p.values[0].items():
            double.add_object(plural, o)
    double.add_object("replicasets", obj("apps/v1", "ReplicaSet", "srv-5c7d", {"replicas": 3}))
    k8s = cluster(double)
    scaler = WorkloadScaler(k8s, MemoryWorkloadSaves(), dry_run=False, clock=lambda: AT)

    # WHEN the snapshot reads the owners (after asking), and every kind is scaled to zero and restored
    assert k8s.preflight(list(WORKLOAD_READ_CHECKS.values())) == []
    read = workload_objects(k8s, [NS], list(WORKLOAD_READ_CHECKS))
    assert {o["kind"] for o in read} >= {"Deployment", "Notebook", "InferenceService", "ScaledObject"}
    for v in verdicts:
        assert scaler.scale_to_zero(v).result == "scaled_to_zero"
    assert {o.result for o in scaler.restore_all()} == {"restored"}

    # THEN nothing was refused and every verb the role grants was used
    assert [r.path for r in double.requests if r.status == 403] == []
    assert unused(role, double.requests) == []


def test_the_written_snapshot_reads_the_same_workloads_as_the_live_plan(
    double: KubernetesDouble, tmp_path: Any
) -> None:
    from rightsizer.adapters.snapshot_dir import load_snapshot
    from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter
    from rightsizer.domain.planner import plan
    from rightsizer.domain.policy import Policy
    from rightsizer.services.observe import snapshot_from_observation
    from rightsizer.services.snapshot import ObserveRequest, observe, record
    from rightsizer.wiring.builders import decode_live_documents
    from tests.builders import AT as T
    from tests.builders import gpu_node, pod

    # GIVEN a GPU node whose pod belongs to a Deployment (through its ReplicaSet) tracked by Argo CD
    double.add_node(gpu_node("gpu-1", instance_type="g5.xlarge", gpus=1))
    holder = pod("srv-5c7d-x1", "gpu-1", namespace=NS, gpus=1)
    holder["metadata"]["ownerReferences"][0]["name"] = "srv-5c7d"
    double.add_pod(holder)
    rs = obj("apps/v1", "ReplicaSet", "srv-5c7d", {"replicas": 1})
    rs["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "srv", "controller": True}
    ]
    double.add_object("replicasets", rs)
    secret = {"kubectl.kubernetes.io/last-applied-configuration": '{"env": "SECRET"}'}
    deploy = obj("apps/v1", "Deployment", "srv", {"replicas": 1}, annotations=secret)
    deploy["metadata"]["labels"] = {"app.kubernetes.io/instance": "srv", "other": "x"}
    double.add_object("deployments", deploy)
    request = ObserveRequest(at=T, window_seconds=1800, step_seconds=60, cluster="prod", region="us-east-1")

    # WHEN the live plan reads it, and `rightsizer snapshot` writes it
    live = snapshot_from_observation(
        observe(cluster(double), None, None, request, project=True), decode_live_documents
    )
    out = tmp_path / "snap"
    with SnapshotDirectoryWriter(out) as writer:
        record(cluster(double), None, None, request, writer)
        writer.commit()
    written = load_snapshot(out)

    # THEN both name the Deployment, kept for Argo CD, and the file keeps no unread annotation
    expected = plan(live, Policy(), T).workloads
    assert [(w.workload.text, w.reasons[0]) for w in expected] == [
        ("Deployment/ml/srv", "gitops_managed:argocd")
    ]
    assert plan(written, Policy(), T).workloads == expected
    text = (out / "workloads.json").read_text()
    assert "SECRET" not in text and '"other"' not in text


def test_the_assessment_scales_an_idle_workload_when_the_policy_acts_and_restore_undoes_it(
    double: KubernetesDouble,
) -> None:
    from rightsizer.adapters.memory_state import MemoryPlans, MemoryState
    from rightsizer.domain.policy import Policy, WorkloadPolicy
    from rightsizer.services.assess import AssessmentDeps, run_assessment
    from rightsizer.testing.fakes import FakeClock, FakeClusterWriter
    from tests.builders import AT as T
    from tests.unit.test_workload_verdicts import _plan_snapshot

    class Starter:
        def start(self, request: Any) -> str:
            return str(request.execution_id)

    # GIVEN the Deployment behind an idle GPU holder (idle for the whole 2 h workload window)
    double.add_object("deployments", obj("apps/v1", "Deployment", "srv", {"replicas": 2}))
    saves = MemoryWorkloadSaves()
    policy = Policy(dry_run=False, workloads=WorkloadPolicy(scale_to_zero=True))
    deps = AssessmentDeps(
        cluster_name="prod",
        observe=lambda at: _plan_snapshot(7200),
        policy=policy,
        cluster=FakeClusterWriter(clock=FakeClock(T)),
        state=MemoryState("prod"),
        starter=Starter(),
        plans=MemoryPlans(),
        workloads=WorkloadScaler(cluster(double), saves, dry_run=False, clock=lambda: AT),
    )

    # WHEN the assessment runs (rightsizer apply --execute)
    summary = run_assessment(deps, T, "apply-1")

    # THEN it scaled the workload to zero, and restore brings its 2 replicas back
    assert summary.workloads == {"Deployment/ml/srv": "scaled_to_zero"}
    assert (double.get_object("deployments", NS, "srv") or {})["spec"]["replicas"] == 0
    assert summary.to_json()["workloads"] == {"Deployment/ml/srv": "scaled_to_zero"}
    scaler = WorkloadScaler(cluster(double), saves, dry_run=False)
    assert scaler.restore("Deployment/ml/srv").result == "restored"
    assert (double.get_object("deployments", NS, "srv") or {})["spec"]["replicas"] == 2
