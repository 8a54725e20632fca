"""Workload verdicts: may an idle GPU workload be scaled to zero? (issue 32, docs/architecture.md §3
"Workloads"). Pure: the caller passes the objects it read and each node's activity over the workload's
idle window.

For every GPU-holding pod (``domain.pods.gpu_holding``), follow ``metadata.ownerReferences``
(``controller: true``) up to the root; the **scalable owner** is the topmost object of a kind in
``SCALABLE_KINDS`` (Deployment through its ReplicaSet, StatefulSet, Kubeflow Notebook through its
StatefulSet, KServe InferenceService (raw deployment mode) through its Deployment, LeaderWorkerSet through
its StatefulSets and leader pod). A chain that ends anywhere else — a Job, an operator's own resource, an
owner the snapshot did not read — keeps the pod's workload (``unknown_owner:<Kind>``): scaling a
Deployment an operator owns would be undone by it.

Every workload gets ``scale_to_zero`` when nothing keeps it, else ``keep`` with every reason, in this
order (``KEEP_CODES``): ``unknown_owner``, ``excluded`` (namespace, or ``rightsizer.io/scale-to-zero:
"false"``), ``do_not_disrupt`` (the pod or owner do-not-disrupt family), ``gitops_managed:<tool>`` (an Argo
CD or Flux tracking label or annotation, unless ``allow_gitops``: its self-heal would undo the scale),
``hpa_managed:<hpa>`` (unless ``allow_hpa``), ``keda_scales_to_zero:<so>`` (its ScaledObject already goes to
zero by itself), ``keda_managed:<so>`` (unless ``allow_keda``), ``too_young:<s>s`` (grace period),
``metrics_unknown:<node>`` (a node of its pods has no verdict-grade evidence over the window),
``busy:<node>`` (a node of its pods was busy at any step of the window).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from rightsizer.domain.model import ObjectMeta, Pod
from rightsizer.domain.policy import WorkloadPolicy
from rightsizer.domain.workload_model import (
    ANN_KEDA_PAUSED_REPLICAS,
    ANN_SCALE_TO_ZERO,
    SCALABLE_KINDS,
    KubeObject,
    WorkloadRef,
)

__all__ = [
    "ARGOCD_MARKS",
    "FLUX_MARKS",
    "KEEP_CODES",
    "READ_KEYS",
    "Activity",
    "Holder",
    "WorkloadVerdict",
    "judge_workloads",
]

Activity = Literal["idle", "busy", "unknown"]
"""A node over the workload's idle window: every device idle at every step, some device busy at some
step, or not enough evidence (an ``unknown``-class reason, coverage short of the window)."""

KEEP_CODES: Final = (
    "unknown_owner",
    "excluded",
    "do_not_disrupt",
    "gitops_managed",
    "hpa_managed",
    "keda_scales_to_zero",
    "keda_managed",
    "too_young",
    "metrics_unknown",
    "busy",
)
#: Argo CD: the default tracking label (``application.instanceLabelKey``) and the annotation of
#: annotation-based tracking (argo-cd docs "Resource Tracking").
ARGOCD_MARKS: Final = ("app.kubernetes.io/instance", "argocd.argoproj.io/tracking-id")
#: Flux: the labels kustomize-controller and helm-controller put on what they apply.
FLUX_MARKS: Final = (
    "kustomize.toolkit.fluxcd.io/name",
    "helm.toolkit.fluxcd.io/name",
)
_DO_NOT_DISRUPT: Final = (
    ("rightsizer.io/do-not-disrupt", "true"),
    ("karpenter.sh/do-not-disrupt", "true"),
)
#: The label and annotation keys the verdicts read of an owner or autoscaler: what a snapshot keeps of them
#: (``services.workload_reads.project``; every other key may hold anything, e.g. a last-applied spec).
READ_KEYS: Final = frozenset(
    {
        ANN_SCALE_TO_ZERO,
        ANN_KEDA_PAUSED_REPLICAS,
        *ARGOCD_MARKS,
        *FLUX_MARKS,
        *(k for k, _v in _DO_NOT_DISRUPT),
    }
)


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod holding a GPU, the node it runs on and its share of that node's USD per hour (None unpriced)."""

    pod: Pod
    node: str
    hourly_usd: float | None


class WorkloadVerdict(BaseModel):
    """One GPU-holding workload's verdict (docs/architecture.md §5 "Plan JSON" ``workloads``).

    ``method`` says how it would be scaled (``scale_subresource``, ``notebook_stopped``,
    ``inferenceservice_min_replicas``, ``keda_paused_replicas``); ``replicas`` is its ``spec.replicas``
    (None for a kind without it); ``hourly_usd`` the sum of its pods' shares of their nodes' prices.
    A workload whose owner is unknown is named by the pod's first unknown owner.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadRef
    verdict: Literal["scale_to_zero", "keep"]
    reasons: list[str]
    method: str | None
    replicas: int | None
    pods: list[str]
    nodes: list[str]
    gpus: int
    hourly_usd: float | None
    hpa: str | None = None
    scaled_object: str | None = None

    @property
    def decision(self) -> str:
        """``scale_to_zero`` or ``keep:<first reason>`` (how the plan text names it)."""
        return "scale_to_zero" if self.verdict == "scale_to_zero" else f"keep:{self.reasons[0]}"


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _controller(meta: ObjectMeta) -> tuple[str, str, str] | None:
    for ref in meta.ownerReferences:
        if ref.controller:
            return _group(ref.apiVersion), ref.kind, ref.name
    return None


def scalable_owner(
    pod: Pod, objects: Mapping[tuple[str, str, str, str], KubeObject]
) -> tuple[KubeObject | None, str | None]:
    """The pod's scalable owner, or None with the ``unknown_owner:<detail>`` reason.

    Args:
        pod: a GPU-holding pod.
        objects: (group, kind, namespace, name) → object, for every owner read (pods included, as
            ``v1``/``Pod``: a LeaderWorkerSet's worker StatefulSet is owned by its leader pod).
    """
    ns = pod.metadata.namespace
    chain: list[KubeObject] = []
    ref = _controller(pod.metadata)
    if ref is None:
        return None, "unknown_owner:bare_pod"
    seen: set[tuple[str, str, str]] = set()
    while ref is not None:
        if ref in seen:
            return None, f"unknown_owner:cycle:{ref[1]}/{ref[2]}"
        seen.add(ref)
        obj = objects.get((ref[0], ref[1], ns, ref[2]))
        if obj is None:
            kind = ref[1]
            if (ref[0], kind) in SCALABLE_KINDS or kind in ("ReplicaSet", "Pod"):
                return None, f"unknown_owner:not_read:{kind}/{ref[2]}"
            return None, f"unknown_owner:{kind}"
        chain.append(obj)
        ref = _controller(obj.metadata)
    root = chain[-1]
    if (root.group, root.kind) not in SCALABLE_KINDS:
        return None, f"unknown_owner:{root.kind}"
    return root, None


def _marked(meta: ObjectMeta, keys: Iterable[str]) -> bool:
    return any(k in meta.labels or k in meta.annotations for k in keys)


def _gitops(objs: Sequence[ObjectMeta]) -> str | None:
    for meta in objs:
        if _marked(meta, ARGOCD_MARKS):
            return "argocd"
        if _marked(meta, FLUX_MARKS):
            return "flux"
    return None


def _targets(autoscaler: KubeObject, owner: KubeObject) -> bool:
    ref = autoscaler.spec.scaleTargetRef
    return (
        ref is not None
        and autoscaler.metadata.namespace == owner.metadata.namespace
        and ref.kind == owner.kind
        and ref.name == owner.metadata.name
        and _group(ref.apiVersion) == owner.group
    )


def _pod_dnd(pod: Pod) -> bool:
    ann = pod.metadata.annotations
    return any(ann.get(k) == v for k, v in _DO_NOT_DISRUPT) or (
        ann.get("cluster-autoscaler.kubernetes.io/safe-to-evict") == "false"
    )


def _autoscaled(
    owner: KubeObject | None, autoscalers: Sequence[KubeObject], policy: WorkloadPolicy, method: str | None
) -> tuple[str | None, str | None, str | None, list[str]]:
    """The HPA and ScaledObject scaling ``owner``, the method that scales it given them, and the keep
    reasons they give (``hpa_managed``, ``keda_scales_to_zero``, ``keda_managed``)."""
    hpa = scaled = None
    reasons: list[str] = []
    for a in autoscalers if owner is not None else ():
        if owner is None or not _targets(a, owner):
            continue
        if a.kind == "HorizontalPodAutoscaler":
            hpa = a.metadata.name
            if not policy.allow_hpa:
                reasons.append(f"hpa_managed:{hpa}")
        elif a.kind == "ScaledObject":
            scaled = a.metadata.name
            if a.spec.minReplicaCount == 0 and ANN_KEDA_PAUSED_REPLICAS not in a.metadata.annotations:
                reasons.append(f"keda_scales_to_zero:{scaled}")
            elif not policy.allow_keda:
                reasons.append(f"keda_managed:{scaled}")
            method = "keda_paused_replicas"
    return hpa, scaled, method, reasons


def judge_workloads(
    holders: Sequence[Holder],
    objects: Sequence[KubeObject],
    autoscalers: Sequence[KubeObject],
    activity: Mapping[str, Activity],
    policy: WorkloadPolicy,
    at: datetime,
) -> list[WorkloadVerdict]:
    """A verdict for every workload that owns a GPU-holding pod (module docstring for the rules).

    Args:
        holders: the GPU-holding pods (Running or Pending, not terminating) with their nodes.
        objects: every owner object read (ReplicaSets, Deployments, StatefulSets, Notebooks,
            InferenceServices, LeaderWorkerSets, pods that own StatefulSets), any kind.
        autoscalers: HorizontalPodAutoscalers and KEDA ScaledObjects of the holders' namespaces.
        activity: node → its activity over ``policy.idle_window`` (a node absent counts as unknown).
        policy: the ``workloads`` policy keys.
        at: the decision instant (aware).

    Returns:
        Verdicts sorted by workload (``Kind/namespace/name``).
    """
    index = {(o.group, o.kind, o.metadata.namespace, o.metadata.name): o for o in objects}
    for h in holders:
        index.setdefault(("", "Pod", h.pod.metadata.namespace, h.pod.metadata.name), _as_object(h.pod))
    groups: dict[WorkloadRef, tuple[KubeObject | None, str | None, list[Holder]]] = {}
    for h in holders:
        owner, why = scalable_owner(h.pod, index)
        ref = owner.ref if owner is not None else _unknown_ref(h.pod)
        groups.setdefault(ref, (owner, why, []))[2].append(h)
    out = [
        _judge(ref, owner, why, hs, autoscalers, activity, policy, at)
        for ref, (owner, why, hs) in groups.items()
    ]
    return sorted(out, key=lambda v: v.workload.text)


def _as_object(pod: Pod) -> KubeObject:
    return KubeObject(apiVersion="v1", kind="Pod", metadata=pod.metadata)


def _unknown_ref(pod: Pod) -> WorkloadRef:
    ref = _controller(pod.metadata)
    if ref is None:
        return WorkloadRef(group="", kind="Pod", namespace=pod.metadata.namespace, name=pod.metadata.name)
    return WorkloadRef(group=ref[0], kind=ref[1], namespace=pod.metadata.namespace, name=ref[2])


def _judge(
    ref: WorkloadRef,
    owner: KubeObject | None,
    why: str | None,
    holders: Sequence[Holder],
    autoscalers: Sequence[KubeObject],
    activity: Mapping[str, Activity],
    policy: WorkloadPolicy,
    at: datetime,
) -> WorkloadVerdict:
    reasons: list[str] = [why] if why else []
    method = SCALABLE_KINDS.get((owner.group, owner.kind)) if owner is not None else None
    if ref.namespace in policy.exclude_namespaces:
        reasons.append(f"excluded:namespace:{ref.namespace}")
    metas = [h.pod.metadata for h in holders] + ([owner.metadata] if owner is not None else [])
    if owner is not None:
        if owner.metadata.annotations.get(ANN_SCALE_TO_ZERO) == "false":
            reasons.append("excluded:annotation")
        if any(owner.metadata.annotations.get(k) == v for k, v in _DO_NOT_DISRUPT):
            reasons.append("do_not_disrupt:owner")
    if any(_pod_dnd(h.pod) for h in holders):
        reasons.append("do_not_disrupt:pod")
    tool = _gitops([owner.metadata] if owner is not None else [])
    if tool and not policy.allow_gitops:
        reasons.append(f"gitops_managed:{tool}")
    hpa, scaled, method, found = _autoscaled(owner, autoscalers, policy, method)
    reasons += found
    born = [m.creationTimestamp for m in metas if m.creationTimestamp is not None]
    born += [h.pod.status.startTime for h in holders if h.pod.status.startTime is not None]
    if born:
        age = (at - max(born)).total_seconds()
        if age < policy.grace_period:
            reasons.append(f"too_young:{int(policy.grace_period - age)}s")
    nodes = sorted({h.node for h in holders})
    for node in nodes:
        state = activity.get(node, "unknown")
        if state != "idle":
            reasons.append(f"{'busy' if state == 'busy' else 'metrics_unknown'}:{node}")
    reasons.sort(key=lambda r: KEEP_CODES.index(r.split(":", 1)[0]))
    prices = [h.hourly_usd for h in holders]
    return WorkloadVerdict(
        workload=ref,
        verdict="keep" if reasons else "scale_to_zero",
        reasons=reasons,
        method=method if owner is not None else None,
        replicas=owner.spec.replicas if owner is not None else None,
        pods=sorted(h.pod.key for h in holders),
        nodes=nodes,
        gpus=sum(h.pod.gpu_request() for h in holders),
        hourly_usd=None if any(p is None for p in prices) else round(sum(p or 0.0 for p in prices), 6),
        hpa=hpa,
        scaled_object=scaled,
    )
