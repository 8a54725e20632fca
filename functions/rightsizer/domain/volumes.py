"""Where a pod's data lives: node-local data makes evicting the pod lose it, or strand it (docs/architecture.md §3 "Pods").

Pure: the facts (PersistentVolumeClaims, PersistentVolumes, Nodes) come from the snapshot or from live
reads in the drain. A volume is *node-local* when its data cannot follow the pod to another node:

- ``hostPath`` (the files stay on the host);
- a generic ``ephemeral`` volume (its PersistentVolumeClaim is owned by the pod and deleted with it);
- a PersistentVolumeClaim bound to a ``local`` or ``hostPath`` PersistentVolume, or to one whose
  ``spec.nodeAffinity`` matches this node and no other schedulable node (topology-bound: the replacement
  pod could never be scheduled, core/v1 VolumeNodeAffinity);
- a PersistentVolumeClaim we cannot resolve (claim or volume not found, claim not bound, or volumes not
  observed at all): unknown is treated as node-local, because safety beats savings.

``emptyDir`` is kubectl's own rule (``--delete-emptydir-data``) and stays in ``domain.pods``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from rightsizer.domain.model import (
    Node,
    NodeSelector,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Volume,
)


@dataclass(frozen=True)
class VolumeFacts:
    """PersistentVolumeClaims by ``namespace/name``, PersistentVolumes by name and the cluster's Nodes.

    ``known`` False says the source carried no volume documents (an older snapshot): every claim is then
    unresolved.
    """

    claims: Mapping[str, PersistentVolumeClaim] = field(default_factory=dict)
    volumes: Mapping[str, PersistentVolume] = field(default_factory=dict)
    nodes: Sequence[Node] = ()
    known: bool = True

    @classmethod
    def of(
        cls,
        claims: Sequence[PersistentVolumeClaim],
        volumes: Sequence[PersistentVolume],
        nodes: Sequence[Node],
        *,
        known: bool = True,
    ) -> VolumeFacts:
        """Index claims and volumes by key."""
        return cls({c.key: c for c in claims}, {v.metadata.name: v for v in volumes}, tuple(nodes), known)

    @cached_property
    def nodes_by_name(self) -> Mapping[str, Node]:
        """``nodes`` by name, built once: the planner asks about every claimed volume of every node, and a
        scan of the node list each time made a 10,000-node plan quadratic."""
        return {n.name: n for n in self.nodes}


UNKNOWN_VOLUMES = VolumeFacts(known=False)


def _pinned_volume(pv: PersistentVolume, node_name: str, facts: VolumeFacts) -> str | None:
    name = pv.metadata.name
    if pv.spec.local is not None:
        return f"local PersistentVolume {name}"
    if pv.spec.hostPath is not None:
        return f"hostPath PersistentVolume {name}"
    required = pv.spec.nodeAffinity.required if pv.spec.nodeAffinity is not None else None
    if required is None:
        return None
    here = facts.nodes_by_name.get(node_name)
    if here is None or not required.matches(here):
        return None  # the affinity does not even name this node: nothing of it lives here
    # The first other schedulable node the affinity admits settles it (a zonal volume: nearly any node).
    elsewhere = any(
        n.name != node_name
        and n.metadata.deletionTimestamp is None
        and not n.spec.unschedulable
        and required.matches(n)
        for n in facts.nodes
    )
    if not elsewhere:
        return f"PersistentVolume {name} is reachable from this node only (spec.nodeAffinity)"
    return None


def claim_local_data(namespace: str, claim_name: str, node_name: str, facts: VolumeFacts) -> str | None:
    """Why the data behind PersistentVolumeClaim ``namespace/claim_name`` is bound to ``node_name``, or None."""
    if not facts.known:
        return f"PersistentVolumeClaim {claim_name}: volumes were not observed"
    claim = facts.claims.get(f"{namespace}/{claim_name}")
    if claim is None:
        return f"PersistentVolumeClaim {claim_name} not found"
    if not claim.spec.volumeName:
        return f"PersistentVolumeClaim {claim_name} is not bound"
    pv = facts.volumes.get(claim.spec.volumeName)
    if pv is None:
        return f"PersistentVolume {claim.spec.volumeName} of claim {claim_name} not found"
    return _pinned_volume(pv, node_name, facts)


def volume_local_data(pod: Pod, volume: Volume, facts: VolumeFacts) -> str | None:
    """Why ``volume`` of ``pod`` keeps data on the pod's node (``spec.nodeName``), or None.

    ``emptyDir`` is not judged here (kubectl's rule, ``delete_emptydir_data``).
    """
    if volume.hostPath is not None:
        return f"hostPath volume {volume.name}"
    if volume.ephemeral is not None:
        return f"generic ephemeral volume {volume.name} (its claim is deleted with the pod)"
    if volume.persistentVolumeClaim is not None:
        return claim_local_data(
            pod.metadata.namespace, volume.persistentVolumeClaim.claimName, pod.spec.nodeName, facts
        )
    return None


def claim_names(pods: Sequence[Pod]) -> set[tuple[str, str]]:
    """(namespace, claim name) of every PersistentVolumeClaim the pods mount."""
    return {
        (p.metadata.namespace, v.persistentVolumeClaim.claimName)
        for p in pods
        for v in p.spec.volumes
        if v.persistentVolumeClaim is not None
    }


def affine_volumes(node: Node, volumes: Sequence[PersistentVolume]) -> list[NodeSelector]:
    """The ``spec.nodeAffinity.required`` of every volume whose affinity names ``node`` and that is neither
    ``local`` nor ``hostPath`` (those are node-local whatever the other nodes): the volumes for which
    :func:`claim_local_data` needs to know whether *another* schedulable node matches."""
    out: list[NodeSelector] = []
    for pv in volumes:
        if pv.spec.local is not None or pv.spec.hostPath is not None or pv.spec.nodeAffinity is None:
            continue
        required = pv.spec.nodeAffinity.required
        if required is not None and required.matches(node):
            out.append(required)
    return out


def other_node_searches(required: NodeSelector, node_name: str) -> list[tuple[str, str]]:
    """(label selector, field selector) pairs whose listed Nodes include every *other* schedulable node
    ``required`` may match: one search per term (per name of a ``metadata.name In`` field term).

    The selectors say as much of the term as Kubernetes selectors can (``In``, ``NotIn``, ``Exists``,
    ``DoesNotExist``; ``Gt``/``Lt`` are left to the caller's own check of each listed Node), plus
    ``metadata.name!=<node_name>`` and ``spec.unschedulable!=true``; so a search lists a superset and the
    caller keeps a Node only when ``required.matches`` it and it is not being deleted. A term that can
    match nothing (``In`` without values, an empty term) has no search. Label selector syntax:
    Kubernetes "Labels and Selectors" (set-based requirements); Node field selectors: ``metadata.name``,
    ``spec.unschedulable``.
    """
    searches: list[tuple[str, str]] = []
    for term in required.nodeSelectorTerms:
        if not term.matchExpressions and not term.matchFields:
            continue
        labels: list[str] = []
        possible = True
        for r in term.matchExpressions:
            values = ",".join(r.values)
            if r.operator == "In":
                possible = possible and bool(r.values)
                labels.append(f"{r.key} in ({values})")
            elif r.operator == "NotIn" and r.values:
                labels.append(f"{r.key} notin ({values})")
            elif r.operator == "Exists":
                labels.append(r.key)
            elif r.operator == "DoesNotExist":
                labels.append(f"!{r.key}")
        fields = [f"metadata.name!={node_name}", "spec.unschedulable!=true"]
        names: list[str | None] = [None]
        for r in term.matchFields:
            if r.key != "metadata.name":
                possible = False  # the only field a NodeSelector may name; anything else matches nothing
            elif r.operator == "In":
                names = [v for v in r.values if v != node_name] if names == [None] else names
                possible = possible and bool(names)
            elif r.operator == "NotIn":
                fields.extend(f"metadata.name!={v}" for v in r.values)
        if not possible or not names:
            continue
        for name in names:
            chosen = [*fields, f"metadata.name={name}"] if name is not None else fields
            searches.append((",".join(labels), ",".join(chosen)))
    return searches
