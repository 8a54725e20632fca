"""The live read of what workload verdicts need (issue 32): in every namespace with a GPU-holding pod on a
GPU node, the objects of ``domain.workload_model.RESOURCES`` (owners, HPAs, KEDA ScaledObjects) — the
snapshot's ``workloads.json``. ReplicaSets scaled to 0 (a Deployment's old revisions) are left out: no
running pod names them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from rightsizer.domain.model import Pod
from rightsizer.domain.pods import gpu_holding
from rightsizer.domain.workload_model import RESOURCES
from rightsizer.ports import JSON, AccessCheck, WorkloadWriter

__all__ = ["WORKLOAD_READ_CHECKS", "holder_namespaces", "workload_objects"]

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
    cluster: WorkloadWriter, namespaces: Iterable[str], kinds: Sequence[tuple[str, str]]
) -> list[JSON]:
    """Every object of the (group, kind)s ``kinds`` of ``RESOURCES`` in ``namespaces`` (one list per kind
    and namespace; a kind the API server does not serve contributes nothing)."""
    out: list[JSON] = []
    for namespace in namespaces:
        for group, kind in kinds:
            for item in cluster.list_objects(group, kind, namespace):
                if kind == "ReplicaSet" and (item.get("spec") or {}).get("replicas") == 0:
                    continue
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", f"{group}/{RESOURCES[(group, kind)][0]}")
                out.append(item)
    return out
