"""The live read of what workload verdicts need (issue 32): in every namespace with a GPU-holding pod on a
GPU node, the objects of ``domain.workload_model.RESOURCES`` (owners, HPAs, KEDA ScaledObjects) — the
snapshot's ``workloads.json``. ReplicaSets scaled to 0 (a Deployment's old revisions) are left out: no
running pod names them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from rightsizer.domain.model import Pod
from rightsizer.domain.pods import gpu_holding
from rightsizer.domain.workload_model import RESOURCES, KubeObject
from rightsizer.domain.workloads import READ_KEYS
from rightsizer.ports import JSON, AccessCheck, WorkloadWriter

__all__ = ["WORKLOAD_READ_CHECKS", "holder_namespaces", "project", "workload_objects"]

#: One ``list`` permission per kind of ``RESOURCES``, asked by SelfSubjectAccessReview before reading: a
#: kind the identity may not list is not read (its workloads read ``unknown_owner:not_read:…``, kept), so
#: the assessment runs without the optional ClusterRole ``rightsizer-workloads`` (infra/k8s/rbac.yaml).
WORKLOAD_READ_CHECKS: Final = {
    (group, kind): AccessCheck("list", plural, "", group) for (group, kind), (_v, plural) in RESOURCES.items()
}


def holder_namespaces(pods: Iterable[Pod], gpu_nodes: frozenset[str]) -> list[str]:
    """Namespaces of the pods on ``gpu_nodes`` that hold a GPU (``domain.pods.gpu_holding`` without DRA
    claims, which the plan reads separately), sorted."""
    return sorted(
        {
            p.metadata.namespace
            for p in pods
            if p.spec.nodeName in gpu_nodes and gpu_holding(p, {}) is not None
        }
    )


def workload_objects(
    cluster: WorkloadWriter,
    namespaces: Iterable[str],
    kinds: Sequence[tuple[str, str]],
    visit: Callable[[JSON], None] | None = None,
) -> list[JSON]:
    """Every object of the (group, kind)s ``kinds`` of ``RESOURCES`` in ``namespaces``, projected
    (:func:`project`; one list per kind and namespace; a kind the API server does not serve contributes
    nothing). With ``visit`` each is handed to it page by page and the answer is empty."""
    out: list[JSON] = []
    keep = visit or out.append
    for namespace in namespaces:
        for group, kind in kinds:

            def each(item: JSON, group: str = group, kind: str = kind) -> None:
                if kind == "ReplicaSet" and (item.get("spec") or {}).get("replicas") == 0:
                    return
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", f"{group}/{RESOURCES[(group, kind)][0]}")
                keep(project(item))

            cluster.list_objects(group, kind, namespace, each)
    return out


def project(item: JSON) -> JSON:
    """What the verdicts read of an object (``KubeObject``'s fields; labels and annotations cut to
    ``domain.workloads.READ_KEYS``): a snapshot keeps no pod template, env value or last-applied spec."""
    obj = KubeObject.model_validate(item)
    meta = obj.metadata
    kept = meta.model_copy(
        update={
            "labels": {k: v for k, v in meta.labels.items() if k in READ_KEYS},
            "annotations": {k: v for k, v in meta.annotations.items() if k in READ_KEYS},
        }
    )
    return obj.model_copy(update={"metadata": kept}).model_dump(mode="json", exclude_none=True)
