"""The drain's fresh reads of a node's pods: which to evict, what blocks the drain (the planner's filter
chain, ``domain.pods``), and the pods a drain waits for (docs/architecture.md §4, kubectl drain semantics).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rightsizer.domain.capacity import interruption_signals
from rightsizer.domain.model import Node, Pod, PodDisruptionBudget
from rightsizer.domain.pods import PodContext, classify_pods
from rightsizer.domain.volumes import UNKNOWN_VOLUMES, VolumeFacts
from rightsizer.services.live_reads import gone_controllers
from rightsizer.services.node_view import node_local_volume_facts
from rightsizer.services.workflow.requests import DrainDeps
from rightsizer.state import WorkflowRecord


class PodReads:
    """Uncached reads of a node's pods and their protections for one kind's drain.

    Args:
        deps: the workflow's dependencies (cluster reads, policy, clock).
        holders_move: pods holding an idle GPU are what this kind moves (a resize, a consolidation, a
            replacement's child); otherwise they block unless policy ``evict_idle_gpu_holders``.
    """

    def __init__(self, deps: DrainDeps, *, holders_move: bool) -> None:
        self.deps = deps
        self.holders_move = holders_move

    def _now(self) -> datetime:
        return self.deps.clock().astimezone(UTC)

    def _volumes(self, pods: Sequence[Pod]) -> VolumeFacts:
        """Live PersistentVolumeClaims and PersistentVolumes behind the pods' claims (uncached GETs), and,
        for a volume whose node affinity names this node, one other schedulable Node it could be reached
        from (:func:`node_local_volume_facts`): nothing here grows with the cluster (issue 11 item 5)."""
        return node_local_volume_facts(self.deps.cluster, pods)

    def _budgets(self, pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The PodDisruptionBudgets of the pods' namespaces (one list per namespace, uncached): a budget
        selects pods of its own namespace only, so no other budget can protect these pods."""
        namespaces = sorted({str((p.get("metadata") or {}).get("namespace") or "default") for p in pods})
        return [pdb for ns in namespaces for pdb in self.deps.cluster.list_pdbs(ns)]

    def pods_and_budgets(self, node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The pods bound to ``node`` and the budgets that may protect them (fresh reads)."""
        pods = self.deps.cluster.list_pods_on_node(node)
        return pods, self._budgets(pods)

    @property
    def holders_block(self) -> bool:
        """Whether pods holding an idle GPU block this kind's drain."""
        return not (self.holders_move or self.deps.policy.evict_idle_gpu_holders)

    def classify(
        self,
        pods: Sequence[dict[str, Any]],
        pdbs: Sequence[dict[str, Any]],
        record: WorkflowRecord,
        *,
        live: bool = True,
    ) -> tuple[list[Pod], list[str]]:
        """Pods to evict and the reasons that block the drain (the same filter chain as the planner).

        ``live`` reads back the claims, volumes and controllers behind the pods; False skips those reads
        where only the pods to evict matter (the blocking reasons are then not complete)."""
        parsed = [Pod.model_validate(p) for p in pods]
        ctx = PodContext(
            self.deps.policy,
            [PodDisruptionBudget.model_validate(p) for p in pdbs],
            {},
            self._now(),
            self._volumes(parsed) if live else UNKNOWN_VOLUMES,
            gone_controllers(self.deps.cluster, parsed) if live else frozenset(),
        )
        to_evict: list[Pod] = []
        # An interruption handler's notice (issue 28): the drain yields to it, leaving its cordon.
        node = self.deps.cluster.get_node(record.node) if live else None
        blocking: list[str] = interruption_signals(Node.model_validate(node), None) if node else []
        for c in classify_pods(parsed, ctx):
            # A pod that is not evicted can still block (do-not-disrupt or a PDB on a DaemonSet pod).
            blocking.extend(f.reason for f in c.findings)
            if c.gpu_holder is not None and self.holders_block:
                blocking.append(c.gpu_holder.reason)
            if c.ignored == "terminating":
                if not self.stuck(c.pod):
                    to_evict.append(c.pod)  # not evicted again, but waited for (adopted by the evict step)
            elif c.ignored is None:
                to_evict.append(c.pod)
        return to_evict, blocking

    # ------------------------------------------------------------------------------------- entry

    def still_there(self, pod: Pod) -> bool:
        """The pod with this UID is still bound to its node and not terminating (the uncached list the drain
        already has RBAC for: ClusterRole ``rightsizer`` grants ``list`` on pods, not ``get``)."""
        listed = [Pod.model_validate(p) for p in self.deps.cluster.list_pods_on_node(pod.spec.nodeName)]
        return any(p.metadata.uid == pod.metadata.uid and not p.metadata.deletionTimestamp for p in listed)

    def stuck(self, pod: Pod) -> bool:
        """A pod terminating longer than ``skip_wait_for_delete_timeout`` past its ``deletionTimestamp`` (the
        API server sets it to the end of the grace period): stuck on a finalizer or a NotReady kubelet, it
        is not waited for (kubectl drain ``skipDeletedFilter``); 0 disables the skip."""
        limit, deleting = self.deps.policy.skip_wait_for_delete_timeout, pod.metadata.deletionTimestamp
        return bool(limit) and deleting is not None and (self._now() - deleting).total_seconds() > limit
