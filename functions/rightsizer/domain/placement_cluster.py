"""A snapshot's pods and nodes as a :class:`~rightsizer.domain.placement.PlacementState` (issue 29).

Built once per plan, lazily (a plan with no candidate never pays for it). Every pod bound to a node and
not finished holds its requests there; Pending pods that fit somewhere now are placed first (they
compete for the same room); a node whose pods the snapshot knows only by address (the live plan keeps
pods of non-GPU nodes as ``PodAddress``) receives nothing: its free room is not known.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from rightsizer.domain.model import ClusterSnapshot, NodeSelector, Pod
from rightsizer.domain.placement import Placement, PlacementState
from rightsizer.domain.placement_demand import NO_DRA, Demand, DraClaimFacts, demand_of
from rightsizer.domain.pods import PodClassification
from rightsizer.domain.volumes import VolumeFacts


def _volume_affinity(pod: Pod, facts: VolumeFacts) -> tuple[tuple[tuple[str, NodeSelector], ...], str | None]:
    """(claim, the bound volume's required node affinity) per claim of ``pod``, or why one is unknown."""
    out: list[tuple[str, NodeSelector]] = []
    for volume in pod.spec.volumes:
        source = volume.persistentVolumeClaim
        if source is None:
            continue
        if not facts.known:
            return (), "volumes were not observed"
        claim = facts.claims.get(f"{pod.metadata.namespace}/{source.claimName}")
        if claim is None or not claim.spec.volumeName:
            return (), f"PersistentVolumeClaim {source.claimName} is not bound"
        pv = facts.volumes.get(claim.spec.volumeName)
        if pv is None:
            return (), f"PersistentVolume {claim.spec.volumeName} not found"
        required = pv.spec.nodeAffinity.required if pv.spec.nodeAffinity is not None else None
        if required is not None:
            out.append((source.claimName, required))
    return tuple(out), None


def pod_demand(pod: Pod, volumes: VolumeFacts, dra: DraClaimFacts = NO_DRA) -> Demand:
    """``pod``'s :class:`Demand` with its volumes' node affinity and DRA requests resolved."""
    affinity, problem = _volume_affinity(pod, volumes)
    return demand_of(pod, affinity, dra=dra, volume_problem=problem)


def placement_reasons(pods: Sequence[Pod], placed: Placement) -> list[str]:
    """``no_placement:<pod>:<cause>`` per pod that fits nowhere, and ``cpu_pods_pin_gpu_node:<n>`` when
    no pod of the node asks for a GPU and ``n`` CPU-only pods that fit nowhere else keep it (karpenter
    -provider-aws #5218, #8447): GPU nodes should carry a taint only GPU pods tolerate."""
    reasons = [u.reason for u in placed.unplaced]
    if placed.unplaced and not any(p.gpu_request() for p in pods):
        reasons.append(f"cpu_pods_pin_gpu_node:{len(placed.unplaced)}")
    return reasons


def movers(pods: Sequence[PodClassification]) -> list[Pod]:
    """The pods a drain of their node sends elsewhere: evicted (not ignored), or not evicted because
    they tolerate the cordon (they die with the instance), and owned by a controller that recreates
    them. DaemonSet and mirror pods are not recreated elsewhere; a bare pod is not recreated at all."""
    return [c.pod for c in pods if c.ignored in (None, "tolerates_cordon") and c.pod.controller is not None]


class ClusterPlacement:
    """The placement check of one plan: ``trial`` a removal, then ``keep`` or ``undo`` it.

    Args:
        snapshot: the cluster.
        volumes: the snapshot's volume facts (zonal volumes).
        dra: the DRA claims' requests and the modelled DeviceClasses (``NO_DRA``: a pod with a claim
            cannot be verified).
    """

    def __init__(self, snapshot: ClusterSnapshot, volumes: VolumeFacts, dra: DraClaimFacts = NO_DRA) -> None:
        self._snapshot = snapshot
        self._volumes = volumes
        self._dra = dra
        self._mark: int | None = None
        self._arrived: dict[str, list[Pod]] = {}  # node → pods kept trials moved onto it
        self._last: tuple[list[Pod], Placement] | None = None

    @cached_property
    def state(self) -> PlacementState:
        """The state, built on first use, Pending pods settled."""
        snapshot = self._snapshot
        unknown_room = {a.node for a in snapshot.pod_addresses}
        nodes = [n for n in snapshot.nodes if n.name not in unknown_room]
        bound = [
            (p.spec.nodeName, pod_demand(p, self._volumes, self._dra))
            for p in snapshot.pods
            if p.spec.nodeName and p.status.phase not in ("Succeeded", "Failed")
        ]
        state = PlacementState(nodes, bound)
        pending = [
            pod_demand(p, self._volumes, self._dra)
            for p in snapshot.pods
            if not p.spec.nodeName and p.status.phase == "Pending" and p.metadata.deletionTimestamp is None
        ]
        state.settle_pending(pending)
        return state

    def trial(self, nodes: Sequence[str], pods: Sequence[Pod]) -> Placement:
        """Remove ``nodes`` and place ``pods`` elsewhere — with the pods earlier kept trials moved onto
        ``nodes`` — the change holding until :meth:`keep` or :meth:`undo`."""
        state = self.state
        self._mark = state.mark()
        moving = [*pods, *(p for n in nodes for p in self._arrived.get(n, ()))]
        placed = state.simulate(nodes, [pod_demand(p, self._volumes, self._dra) for p in moving])
        self._last = (moving, placed)
        return placed

    def removable(self, node: str, pods: Sequence[PodClassification], reasons: list[str]) -> bool:
        """Whether the pods a drain of ``node`` sends elsewhere (:func:`movers` of its classified
        ``pods``) fit on the nodes left: kept when they do, as Cluster Autoscaler's simulator commits each
        removal; else undone, and ``reasons`` gets :func:`placement_reasons`."""
        placed = self.trial([node], movers(pods))
        if placed.ok:
            self.keep()
            return True
        self.undo()
        reasons.extend(placement_reasons([c.pod for c in pods if c.ignored is None], placed))
        return False

    def keep(self) -> None:
        """Make the last trial's removals and placements part of the state (later trials see them)."""
        self._mark = None
        if self._last is not None:
            moving, placed = self._last
            by_key = {p.key: p for p in moving}
            for move in placed.moves:
                self._arrived.setdefault(move.to, []).append(by_key[move.pod])
            self._last = None

    def undo(self) -> None:
        """Forget the last trial."""
        if self._mark is not None:
            self.state.undo(self._mark)
            self._mark = None
        self._last = None
