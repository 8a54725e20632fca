"""Judge one node, read one node (docs/architecture.md §4 "Validate", issue 11 item 5).

The drain's validate and revalidate steps (and the resize workflow, which reuses them) decide about one
node. They read that node only, so their cost does not grow with the cluster:

- the Node by name, its pods by ``fieldSelector=spec.nodeName=<node>``, and the unscheduled Pending pods
  (``spec.nodeName=,status.phase=Pending``: a pending GPU pod that would fit keeps the node);
- the PodDisruptionBudgets and ResourceClaims of those pods' namespaces (a budget or a claim only
  concerns pods of its own namespace), the node's ResourceSlices by ``spec.nodeName``;
- the PersistentVolumeClaims and PersistentVolumes of the pods by name, and for a volume whose node
  affinity names the node, one small search for *another* schedulable Node it could be reached from;
- the AWS inventory for the node's instance;
- the DCGM series selected by ``join.node_series_matchers`` (the node's name labels and its exporter's
  address), joined by a :class:`ResolvingJoiner` that asks the cluster about whatever else a series
  names, so a series naming two nodes is still ambiguous as the whole cluster's join would find it.

Everything lands in the same documents a snapshot holds, decoded by the same code, and is planned by
the same ``plan()``: the node's report is the one the complete observation would give, except for what
is stated in docs/architecture.md §4 (the cooldown sees this node's and the group's launch times only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from rightsizer.domain.health import XID_DOCUMENT
from rightsizer.domain.join import JoinResult, NodeJoiner, node_series_matchers
from rightsizer.domain.model import Node, NodeSelector, PersistentVolume, PersistentVolumeClaim, Pod
from rightsizer.domain.volumes import VolumeFacts, affine_volumes, claim_names, other_node_searches
from rightsizer.ports import JSON, MetricsRangeReader, NodeGroupInventory, NodeReader
from rightsizer.services.snapshot import (
    Observation,
    ObserveRequest,
    instance_ids,
    kubectl_list,
    metric_documents,
    snapshot_meta,
    xid_document,
)

__all__ = ["ResolvingJoiner", "VolumeReads", "node_local_volume_facts", "observe_node"]


class VolumeReads(Protocol):
    """The reads behind :func:`node_local_volume_facts` (both ``ClusterWriter`` and ``NodeReader`` have them)."""

    def get_node(self, name: str) -> JSON | None:
        """The Node, or None."""
        ...

    def find_node(self, accept: Any, *, label_selector: str = "", field_selector: str = "") -> JSON | None:
        """The first listed Node ``accept`` takes, or None."""
        ...

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim, or None."""
        ...

    def get_persistent_volume(self, name: str) -> JSON | None:
        """The PersistentVolume, or None."""
        ...


def _volume_documents(cluster: VolumeReads, pods: Sequence[Pod]) -> tuple[list[JSON], list[JSON], list[JSON]]:
    """(claims, volumes, witness Nodes) as the API answered them; see :func:`node_local_volume_facts`."""
    claims: list[JSON] = []
    volumes: list[JSON] = []
    for namespace, name in sorted(claim_names(pods)):
        found = cluster.get_persistent_volume_claim(namespace, name)
        if found is None:
            continue
        claims.append(found)
        volume_name = PersistentVolumeClaim.model_validate(found).spec.volumeName
        pv = cluster.get_persistent_volume(volume_name) if volume_name else None
        if pv is not None:
            volumes.append(pv)
    witnesses: list[JSON] = []
    parsed = [PersistentVolume.model_validate(v) for v in volumes]
    node_name = next((p.spec.nodeName for p in pods if p.spec.nodeName), "")
    if node_name and any(v.spec.nodeAffinity is not None for v in parsed):
        here = cluster.get_node(node_name)
        if here is not None:
            witnesses.append(here)
            for required in affine_volumes(Node.model_validate(here), parsed):
                witnesses.extend(_witnesses(cluster, required, node_name))
    return claims, volumes, witnesses


def node_local_volume_facts(cluster: VolumeReads, pods: Sequence[Pod]) -> VolumeFacts:
    """What ``domain.volumes`` needs to tell node-local data on the pods' node, read for that node only.

    The claims and volumes behind the pods are read by name (uncached GETs). When a volume's
    ``spec.nodeAffinity`` names the node, the only other fact that matters is whether some *other*
    schedulable Node matches it too: one small search per affinity term (``find_node``, selectors from
    ``domain.volumes.other_node_searches``) finds such a witness or proves there is none, where the
    whole Node list was read before. The facts carry the node and the witnesses found, which decide
    exactly as the complete Node list would.
    """
    claims, volumes, nodes = _volume_documents(cluster, pods)
    return VolumeFacts.of(
        [PersistentVolumeClaim.model_validate(c) for c in claims],
        [PersistentVolume.model_validate(v) for v in volumes],
        [Node.model_validate(n) for n in nodes],
    )


def _witnesses(cluster: VolumeReads, required: NodeSelector, node_name: str) -> list[JSON]:
    """At most one other schedulable, not deleting Node matching ``required`` (searches until found)."""

    def accept(obj: JSON) -> bool:
        other = Node.model_validate(obj)
        return (
            other.name != node_name
            and other.metadata.deletionTimestamp is None
            and not other.spec.unschedulable
            and required.matches(other)
        )

    for labels, fields in other_node_searches(required, node_name):
        found = cluster.find_node(accept, label_selector=labels, field_selector=fields)
        if found is not None:
            return [found]
    return []


class ResolvingJoiner(NodeJoiner):
    """A :class:`NodeJoiner` that starts from one node's view and asks the cluster about the other nodes
    and pods a series names (``NodeJoiner.unknown_references``): a ``GET`` of a Node by a name label's
    value, a list of pods by ``metadata.name`` in a namespace, and by ``status.podIP`` for an
    ``instance`` address. Each distinct value is asked once; a series of one node names a handful, so
    the reads stay constant in the cluster's size. An address that is only another node's InternalIP
    (no pod of that node uses it, not even a host-network one) stays unknown, as an address of no node.
    """

    def __init__(
        self, nodes: Iterable[Node], pods: Iterable[Pod], node_label: str | None, reader: NodeReader
    ):
        super().__init__(nodes, pods, node_label)
        self._reader = reader
        self._asked: set[tuple[str, ...]] = set()

    def _join(self, labels: Mapping[str, str]) -> JoinResult:
        names, pairs, hosts = self.unknown_references(labels)
        nodes: list[Node] = []
        pods: list[JSON] = []
        for name in names:
            if self._first(("node", name)):
                found = self._reader.get_node(name)
                if found is not None:
                    nodes.append(Node.model_validate(found))
        for namespace, pod in pairs:
            if self._first(("pod", namespace, pod)):
                pods += self._reader.list_pods(namespace=namespace, field_selector=f"metadata.name={pod}")
        for host in hosts:
            if self._first(("ip", host)):
                pods += self._reader.list_pods(field_selector=f"status.podIP={host}")
        if nodes or pods:
            self.add(nodes, [Pod.model_validate(p) for p in pods])
        return super()._join(labels)

    def _first(self, key: tuple[str, ...]) -> bool:
        if key in self._asked:
            return False
        self._asked.add(key)
        return True


def observe_node(
    reader: NodeReader,
    inventory: NodeGroupInventory | None,
    metrics: MetricsRangeReader | None,
    request: ObserveRequest,
    node: str,
) -> Observation:
    """The snapshot documents of one node (module docstring), read without any cluster-wide list.

    Returns:
        An :class:`Observation` like ``snapshot.observe``'s whose ``nodes.json`` holds the node (empty when
        it does not exist) and the witness Nodes of its node-affine volumes, ``pods.json`` its pods and the
        unscheduled Pending pods; with ``metrics``, the node's series (``node_series_matchers``) in the
        format-2 metrics files. The live path passes ``metrics`` None and reads them with
        ``collect_live(scope=…)``.

    Raises:
        PermanentError / TransientError: as the reads (no preflight: a refused read raises by itself).
    """
    found = reader.get_node(node)
    on_node = reader.list_pods(field_selector=f"spec.nodeName={node}") if found is not None else []
    pending = reader.list_pods(field_selector="spec.nodeName=,status.phase=Pending")
    pods = [Pod.model_validate(p) for p in on_node]
    namespaces = sorted({p.metadata.namespace for p in pods})
    claims, volumes, witnesses = _volume_documents(reader, pods)
    nodes = ([found] if found is not None else []) + [w for w in witnesses if _name(w) != node]
    documents: dict[str, Any] = {
        "snapshot.json": {**snapshot_meta(request), "scope": {"node": node}},
        "nodes.json": kubectl_list(nodes),
        "pods.json": kubectl_list([*on_node, *pending]),
        "pdbs.json": kubectl_list(p for ns in namespaces for p in reader.list_pdbs(ns)),
        "persistentvolumeclaims.json": kubectl_list(claims),
        "persistentvolumes.json": kubectl_list(volumes),
    }
    if reader.served_resource_api():
        claiming = sorted({p.metadata.namespace for p in pods if p.spec.resourceClaims})
        documents["resourceclaims.json"] = kubectl_list(
            c for ns in claiming for c in reader.list_resource_claims(ns)
        )
        documents["resourceslices.json"] = kubectl_list(
            s for s in reader.list_resource_slices(f"spec.nodeName={node}")
        )
    if inventory is not None and request.eks_cluster:
        ids = instance_ids(nodes[:1])
        documents["nodegroups.json"] = inventory.describe(ids, request.eks_cluster)
        documents["instances.json"] = inventory.describe_instances(ids)
    if metrics is not None and found is not None:
        scope = node_series_matchers(Node.model_validate(found), pods, request.node_label)
        documents.update(metric_documents(metrics, request, scope))
        documents[XID_DOCUMENT] = xid_document(metrics, request, scope)
    return Observation(documents)


def _name(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
