"""Workload verdicts (issue 32): each owner kind, each keep reason, and coexistence with HPA, KEDA and
GitOps. Pure: ``domain.workloads.judge_workloads`` on objects built here, then ``plan()`` end to end."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rightsizer.domain.model import Pod
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy, WorkloadPolicy
from rightsizer.domain.workload_model import KubeObject
from rightsizer.domain.workloads import Activity, Holder, WorkloadVerdict, judge_workloads
from tests.builders import AT, gpu_node, node_devices, pod, rfc, snapshot, times

NS = "ml"
OLD = rfc(AT - timedelta(days=2))


def obj(
    api: str,
    kind: str,
    name: str,
    *,
    owner: tuple[str, str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    created: str = OLD,
) -> KubeObject:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "creationTimestamp": created,
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "controller": True}
        ]
    return KubeObject.model_validate({"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec or {}})


def holder(name: str, owner: tuple[str, str] | None, owner_name: str, node: str = "n1", **kw: Any) -> Holder:
    raw = pod(name, node, namespace=kw.pop("namespace", NS), gpus=1, owner=owner, **kw)
    if owner:
        raw["metadata"]["ownerReferences"][0]["name"] = owner_name
    return Holder(Pod.model_validate(raw), node, 1.006)


DEPLOY = [
    obj("apps/v1", "ReplicaSet", "srv-5c7d", owner=("apps/v1", "Deployment", "srv")),
    obj("apps/v1", "Deployment", "srv", spec={"replicas": 2}),
]
SRV = holder("srv-5c7d-x1", ("ReplicaSet", "apps/v1"), "srv-5c7d")


def judge(
    holders: list[Holder],
    objects: list[KubeObject],
    autoscalers: list[KubeObject] = (),  # type: ignore[assignment]
    activity: dict[str, Activity] | None = None,
    **policy: Any,
) -> list[WorkloadVerdict]:
    return judge_workloads(
        holders,
        objects,
        list(autoscalers),
        {"n1": "idle", "n2": "idle"} if activity is None else activity,
        WorkloadPolicy(**policy),
        AT,
    )


def one(*args: Any, **kw: Any) -> WorkloadVerdict:
    (verdict,) = judge(*args, **kw)
    return verdict


# --- each owner kind ------------------------------------------------------------------------------------

OWNER_KINDS = [
    pytest.param([SRV], DEPLOY, "Deployment/ml/srv", "scale_subresource", 2, id="deployment-via-replicaset"),
    pytest.param(
        [holder("db-0", ("StatefulSet", "apps/v1"), "db")],
        [obj("apps/v1", "StatefulSet", "db", spec={"replicas": 1})],
        "StatefulSet/ml/db",
        "scale_subresource",
        1,
        id="statefulset",
    ),
    pytest.param(
        [holder("nb-0", ("StatefulSet", "apps/v1"), "nb")],
        [
            obj("apps/v1", "StatefulSet", "nb", owner=("kubeflow.org/v1", "Notebook", "nb")),
            obj("kubeflow.org/v1", "Notebook", "nb"),
        ],
        "Notebook/ml/nb",
        "notebook_stopped",
        None,
        id="kubeflow-notebook",
    ),
    pytest.param(
        [holder("llm-predictor-7f-x", ("ReplicaSet", "apps/v1"), "llm-predictor-7f")],
        [
            obj(
                "apps/v1", "ReplicaSet", "llm-predictor-7f", owner=("apps/v1", "Deployment", "llm-predictor")
            ),
            obj(
                "apps/v1",
                "Deployment",
                "llm-predictor",
                owner=("serving.kserve.io/v1beta1", "InferenceService", "llm"),
                spec={"replicas": 1},
            ),
            obj(
                "serving.kserve.io/v1beta1", "InferenceService", "llm", spec={"predictor": {"minReplicas": 1}}
            ),
        ],
        "InferenceService/ml/llm",
        "inferenceservice_min_replicas",
        None,
        id="kserve-inferenceservice",
    ),
    pytest.param(
        [
            holder("lws-0", ("StatefulSet", "apps/v1"), "lws"),
            holder("lws-0-1", ("StatefulSet", "apps/v1"), "lws-0", node="n2"),
        ],
        [
            obj(
                "apps/v1",
                "StatefulSet",
                "lws",
                owner=("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws"),
            ),
            obj("apps/v1", "StatefulSet", "lws-0", owner=("v1", "Pod", "lws-0")),
            obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", spec={"replicas": 1}),
        ],
        "LeaderWorkerSet/ml/lws",
        "scale_subresource",
        1,
        id="leaderworkerset-leader-and-worker",
    ),
]


@pytest.mark.parametrize(("holders", "objects", "workload", "method", "replicas"), OWNER_KINDS)
def test_each_scalable_owner_kind_is_found_through_its_owner_references(
    holders: list[Holder], objects: list[KubeObject], workload: str, method: str, replicas: int | None
) -> None:
    verdict = one(holders, objects)
    assert (verdict.workload.text, verdict.verdict, verdict.reasons) == (workload, "scale_to_zero", [])
    assert verdict.method == method and verdict.replicas == replicas
    assert verdict.pods == sorted(h.pod.key for h in holders) and verdict.gpus == len(holders)
    assert verdict.hourly_usd == pytest.approx(1.006 * len(holders))


UNKNOWN_OWNERS = [
    pytest.param(holder("train-x", ("Job", "batch/v1"), "train"), [], "unknown_owner:Job", id="job"),
    pytest.param(holder("lonely", None, ""), [], "unknown_owner:bare_pod", id="bare-pod"),
    pytest.param(SRV, [], "unknown_owner:not_read:ReplicaSet/srv-5c7d", id="owner-not-read"),
    pytest.param(
        SRV,
        [
            obj("apps/v1", "ReplicaSet", "srv-5c7d", owner=("apps/v1", "Deployment", "srv")),
            obj("apps/v1", "Deployment", "srv", owner=("example.com/v1", "ModelServer", "srv")),
        ],
        "unknown_owner:ModelServer",
        id="operator-owned-deployment",
    ),
    pytest.param(
        SRV, [obj("apps/v1", "ReplicaSet", "srv-5c7d")], "unknown_owner:ReplicaSet", id="bare-replicaset"
    ),
]


@pytest.mark.parametrize(("h", "objects", "reason"), UNKNOWN_OWNERS)
def test_an_owner_chain_that_does_not_end_in_a_scalable_kind_keeps_unknown_owner(
    h: Holder, objects: list[KubeObject], reason: str
) -> None:
    verdict = one([h], objects)
    assert (verdict.verdict, verdict.reasons[0], verdict.method) == ("keep", reason, None)
    assert verdict.decision == f"keep:{reason}"


# --- each keep reason -----------------------------------------------------------------------------------

HPA = obj(
    "autoscaling/v2",
    "HorizontalPodAutoscaler",
    "srv-hpa",
    spec={"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "srv"}, "minReplicas": 1},
)


def keda(min_count: int, annotations: dict[str, str] | None = None) -> KubeObject:
    return obj(
        "keda.sh/v1alpha1",
        "ScaledObject",
        "srv-so",
        annotations=annotations,
        spec={"scaleTargetRef": {"name": "srv"}, "minReplicaCount": min_count, "maxReplicaCount": 4},
    )


def deploy(**kw: Any) -> list[KubeObject]:
    return [DEPLOY[0], obj("apps/v1", "Deployment", "srv", spec={"replicas": 2}, **kw)]


KEEP_REASONS = [
    pytest.param({"activity": {"n1": "busy"}}, "busy:n1", id="busy-in-the-window"),
    pytest.param({"activity": {"n1": "unknown"}}, "metrics_unknown:n1", id="metrics-unknown"),
    pytest.param({"activity": {}}, "metrics_unknown:n1", id="node-not-judged"),
    pytest.param({"exclude_namespaces": ["ml"]}, "excluded:namespace:ml", id="excluded-namespace"),
    pytest.param(
        {"objects": deploy(annotations={"rightsizer.io/scale-to-zero": "false"})},
        "excluded:annotation",
        id="excluded-annotation",
    ),
    pytest.param(
        {"objects": deploy(annotations={"karpenter.sh/do-not-disrupt": "true"})},
        "do_not_disrupt:owner",
        id="do-not-disrupt-owner",
    ),
    pytest.param(
        {"objects": deploy(labels={"app.kubernetes.io/instance": "srv"})},
        "gitops_managed:argocd",
        id="argocd-tracking-label",
    ),
    pytest.param(
        {"objects": deploy(annotations={"argocd.argoproj.io/tracking-id": "ml:apps/Deployment:ml/srv"})},
        "gitops_managed:argocd",
        id="argocd-tracking-annotation",
    ),
    pytest.param(
        {"objects": deploy(labels={"kustomize.toolkit.fluxcd.io/name": "apps"})},
        "gitops_managed:flux",
        id="flux-kustomization",
    ),
    pytest.param(
        {"objects": deploy(labels={"helm.toolkit.fluxcd.io/name": "srv"})},
        "gitops_managed:flux",
        id="flux-helm",
    ),
    pytest.param({"autoscalers": [HPA]}, "hpa_managed:srv-hpa", id="hpa"),
    pytest.param({"autoscalers": [keda(1)]}, "keda_managed:srv-so", id="keda"),
    pytest.param({"autoscalers": [keda(0)]}, "keda_scales_to_zero:srv-so", id="keda-already-to-zero"),
    pytest.param(
        {"objects": deploy(created=rfc(AT - timedelta(minutes=5)))}, "too_young:600s", id="younger-than-grace"
    ),
]


@pytest.mark.parametrize(("case", "reason"), KEEP_REASONS)
def test_each_keep_reason(case: dict[str, Any], reason: str) -> None:
    case = dict(case)
    objects = case.pop("objects", DEPLOY)
    autoscalers = case.pop("autoscalers", [])
    activity = case.pop("activity", None)
    verdict = one([SRV], objects, autoscalers, activity, **case)
    assert (verdict.verdict, verdict.reasons) == ("keep", [reason])


def test_a_pod_marked_do_not_disrupt_keeps_its_workload() -> None:
    h = holder(
        "srv-5c7d-x1",
        ("ReplicaSet", "apps/v1"),
        "srv-5c7d",
        annotations={"karpenter.sh/do-not-disrupt": "true"},
    )
    assert one([h], DEPLOY).reasons == ["do_not_disrupt:pod"]


def test_every_reason_is_kept_in_the_contract_order() -> None:
    verdict = one(
        [SRV],
        deploy(labels={"app.kubernetes.io/instance": "srv"}),
        [HPA],
        {"n1": "busy"},
        exclude_namespaces=["ml"],
    )
    assert verdict.reasons == [
        "excluded:namespace:ml",
        "gitops_managed:argocd",
        "hpa_managed:srv-hpa",
        "busy:n1",
    ]


def test_one_busy_node_of_several_keeps_the_whole_workload() -> None:
    other = holder("srv-5c7d-x2", ("ReplicaSet", "apps/v1"), "srv-5c7d", node="n2")
    verdict = one([SRV, other], DEPLOY, activity={"n1": "idle", "n2": "busy"})
    assert verdict.reasons == ["busy:n2"] and verdict.nodes == ["n1", "n2"]


# --- coexistence: the opt-ins hand the workload to its own switch ------------------------------------------


def test_an_hpa_target_is_scaled_to_zero_only_when_opted_in_and_names_its_hpa() -> None:
    verdict = one([SRV], DEPLOY, [HPA], allow_hpa=True)
    assert (verdict.verdict, verdict.method, verdict.hpa) == ("scale_to_zero", "scale_subresource", "srv-hpa")


def test_a_keda_target_is_paused_at_zero_through_keda_when_opted_in() -> None:
    verdict = one([SRV], DEPLOY, [keda(1)], allow_keda=True)
    assert (verdict.verdict, verdict.method, verdict.scaled_object) == (
        "scale_to_zero",
        "keda_paused_replicas",
        "srv-so",
    )


def test_a_scaled_object_of_another_workload_or_namespace_does_not_count() -> None:
    other = keda(1).model_copy(update={"spec": keda(1).spec.model_copy(update={"scaleTargetRef": None})})
    assert one([SRV], DEPLOY, [other]).verdict == "scale_to_zero"


def test_a_gitops_workload_is_scaled_when_opted_in() -> None:
    verdict = one([SRV], deploy(labels={"kustomize.toolkit.fluxcd.io/name": "apps"}), allow_gitops=True)
    assert verdict.verdict == "scale_to_zero"


# --- through plan() -------------------------------------------------------------------------------------


def _plan_snapshot(window: int) -> Any:
    node = gpu_node("n1", instance_type="g5.xlarge", gpus=1)
    raw = pod("srv-5c7d-x1", "n1", namespace=NS, gpus=1)
    raw["metadata"]["ownerReferences"][0]["name"] = "srv-5c7d"
    snap = snapshot([node], [raw], node_devices("n1", 1, ts=times(window=window)))
    return snap.__class__(**{**snap.__dict__, "owners": tuple(DEPLOY)})


def test_plan_names_the_idle_workload_with_its_verdict_and_cost() -> None:
    result = plan(_plan_snapshot(7200), Policy())
    (verdict,) = result.workloads
    assert (verdict.workload.text, verdict.verdict, verdict.hourly_usd) == (
        "Deployment/ml/srv",
        "scale_to_zero",
        1.006,
    )
    assert result.node("n1").verdict == "protected"  # the holder still protects the node itself


def test_plan_keeps_a_workload_whose_window_the_metrics_do_not_cover() -> None:
    (verdict,) = plan(_plan_snapshot(1800), Policy()).workloads
    assert verdict.reasons == ["metrics_unknown:n1"]
    shorter = plan(_plan_snapshot(1800), Policy(workloads=WorkloadPolicy(idle_window=1800))).workloads
    assert shorter[0].verdict == "scale_to_zero"


def test_plan_keeps_a_workload_busy_an_hour_ago() -> None:
    snap = _plan_snapshot(7200)
    busy_early = node_devices("n1", 1, util=lambda i: 90.0 if i < 30 else 0.0, ts=times(window=7200))
    snap = snap.__class__(**{**snap.__dict__, "metrics": snapshot([], [], busy_early).metrics})
    result = plan(snap, Policy())
    assert result.node("n1").verdict == "protected"  # idle for the node's own 30 min window
    assert result.workloads[0].reasons == ["busy:n1"]


def test_the_plan_text_names_each_workload_with_its_verdict() -> None:
    from rightsizer.render import render_plan

    text = render_plan(plan(_plan_snapshot(1800), Policy()))
    assert "Deployment/ml/srv" in text and "keep:metrics_unknown:n1" in text


def test_the_live_path_judges_workloads_only_on_signals_read_for_their_window() -> None:
    from dataclasses import replace

    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.planner_holders import signals_over
    from rightsizer.domain.usage import CollectedSignals, Window

    snap = _plan_snapshot(1800)
    joiner = NodeJoiner(snap.nodes, snap.pods, None)
    policy, short, longer = Policy(), CollectedSignals(), CollectedSignals()
    wl_window = Window.ending(AT, policy.workloads.idle_window, 60)
    assert signals_over(replace(snap, signals=short), joiner, wl_window, policy) is None
    live = replace(snap, signals=short, workload_signals=longer)
    assert signals_over(live, joiner, wl_window, policy) is longer
    assert signals_over(live, joiner, Window.ending(AT, policy.idle_window, 60), policy) is short


def test_scale_workload_is_on_the_action_model_plan_and_act_share_its_guards() -> None:
    from rightsizer.domain.eligibility import WORKLOAD_GUARDS, WorkloadFacts, first_refusal_message

    ok, kept = one([SRV], DEPLOY), one([SRV], DEPLOY, activity={"n1": "busy"})
    assert first_refusal_message(WORKLOAD_GUARDS, WorkloadFacts(ok, True)) is None
    assert first_refusal_message(WORKLOAD_GUARDS, WorkloadFacts(ok, False)) == (
        "not_opted_in:workloads.scale_to_zero:false"
    )
    assert first_refusal_message(WORKLOAD_GUARDS, WorkloadFacts(kept, True)) == "not_a_candidate:busy:n1"
    assert first_refusal_message(WORKLOAD_GUARDS, WorkloadFacts(ok, True, owner_found=False)) == (
        "stale:owner_not_found:Deployment/ml/srv"
    )
