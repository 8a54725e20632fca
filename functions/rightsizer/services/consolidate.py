"""Executing a ``consolidate`` action: the drain of its node and the removal of its instance (issue 29).

A consolidation is a drain in mode ``consolidate`` (``domain.eligibility``: idle GPU holders move, and in
policy ``consolidation: all`` busy GPUs do not refuse) followed by the scale-in's removal
(``TerminateInstanceInAutoScalingGroup`` with ``ShouldDecrementDesiredCapacity``). Right before its first
eviction the placement simulation runs again on a fresh read of the whole cluster: the pods to move must
be exactly the plan's and every one must still fit elsewhere, or the drain rolls back (uncordons) with
``placement_changed:…`` / ``no_placement:…``. The controllers then recreate the evicted pods, and the
scheduler places them where the simulation did or anywhere at least as good.

It runs in the drain state machine and the in-process runner like every drain (``ConsolidateRequest`` is a
``DrainRequest`` carrying the plan's moves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rightsizer.domain.eligibility import DrainFacts, Judged
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.placement_cluster import ClusterPlacement, movers
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.pods import PodContext, classify_pods, pdbs_by_namespace
from rightsizer.domain.policy import Policy
from rightsizer.domain.volumes import VolumeFacts
from rightsizer.domain.workflow_details import ConsolidateDetails
from rightsizer.services.drain import DrainRequest, StepResult
from rightsizer.services.replace import ReplaceWorkflow
from rightsizer.state import WorkflowRecord

KIND = "consolidate"


@dataclass(frozen=True)
class ConsolidateRequest(DrainRequest):
    """Consolidate ``node``: drain it, remove its instance. ``moves`` are the plan's (pod ``namespace/name``,
    node) pairs: the pods the drain evicts, which the pre-eviction check holds it to."""

    moves: tuple[tuple[str, str], ...] = field(default=())


def recheck(
    snapshot: ClusterSnapshot, node: str, planned: Sequence[str], at: datetime, policy: Policy
) -> str | None:
    """Why the consolidation of ``node`` may not evict now, or None: the pods its drain sends elsewhere
    (the planner's classification on ``snapshot``) must be exactly ``planned`` and all fit on the other
    nodes (``domain.placement`` on the whole cluster, ``node`` removed).

    Returns:
        ``placement_changed:+<pod>,-<pod>`` or ``no_placement:<pod>:<cause>,…``, or None.
    """
    volumes = VolumeFacts.of(snapshot.pvcs, snapshot.pvs, snapshot.nodes, known=snapshot.volumes_known)
    ctx = PodContext(policy, snapshot.pdbs, {}, at, volumes, pdb_index=pdbs_by_namespace(snapshot.pdbs))
    here = [p for p in snapshot.pods if p.spec.nodeName == node]
    moving = movers(classify_pods(here, ctx))
    now_keys, plan_keys = {p.key for p in moving}, set(planned)
    if now_keys != plan_keys:
        changes = [f"+{k}" for k in sorted(now_keys - plan_keys)] + [
            f"-{k}" for k in sorted(plan_keys - now_keys)
        ]
        return "placement_changed:" + ",".join(changes)
    placed = ClusterPlacement(snapshot, volumes).trial([node], moving)
    return None if placed.ok else ",".join(u.reason for u in placed.unplaced)


class ConsolidateWorkflow(ReplaceWorkflow):
    """The drain workflow that also consolidates: records started from a :class:`ConsolidateRequest` drain
    in mode ``consolidate`` and check placement before the first eviction; every other record runs as in
    :class:`ReplaceWorkflow`.

    Args:
        *args, **kwargs: :class:`ReplaceWorkflow`'s.
        observe_cluster: a fresh snapshot of the whole cluster at an instant (None: a consolidation cannot
            verify placement and rolls back before evicting).
    """

    def __init__(
        self,
        *args: Any,
        observe_cluster: Callable[[datetime], ClusterSnapshot] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.observe_cluster = observe_cluster

    @staticmethod
    def _consolidating(record: WorkflowRecord) -> bool:
        return isinstance(record.details, ConsolidateDetails)

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the record; a :class:`ConsolidateRequest` makes a consolidation record (idempotent)."""
        if not isinstance(request, ConsolidateRequest):
            return super().start(request)
        existing = self.deps.state.load(request.execution_id)
        if existing is not None:
            return existing
        now = self._now()
        record = WorkflowRecord(
            execution_id=request.execution_id,
            node=request.node,
            instance_id=None,
            step="validate",
            status="running",
            started_at=now,
            deadline=now + timedelta(seconds=self.deps.policy.drain_timeout),
            details=ConsolidateDetails(
                kind=KIND,
                trigger=request.trigger,
                offhours=False,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
                moves=request.moves,
            ),
        )
        return self.deps.state.save(record, expected_version=0)

    def _facts(self, record: WorkflowRecord, report: NodeReport | None, asg: str | None) -> DrainFacts:
        """A consolidation's eligibility is the drain's in mode ``consolidate`` (policy ``consolidation``)."""
        if not self._consolidating(record):
            return super()._facts(record, report, asg)
        mode = self.deps.policy.consolidation
        return DrainFacts(Judged.of(report), asg, "consolidate", record.execution_id, consolidation=mode)

    def _holders_block(self, record: WorkflowRecord) -> bool:
        """Idle GPU holders are what a consolidation moves."""
        return False if self._consolidating(record) else super()._holders_block(record)

    def _step_evict(self, record: WorkflowRecord) -> StepResult:
        """Before the first eviction of a consolidation, the placement check on a fresh read of the
        cluster (module docstring); then the drain's evict step."""
        details = record.details
        if (
            isinstance(details, ConsolidateDetails)
            and not record.evicted
            and details.placement_checked is None
        ):
            self._renew(record)
            if self.observe_cluster is None:
                return self.rollback(record.execution_id, "placement_unverifiable", step="evict")
            now = self._now()
            planned = [pod for pod, _to in details.moves]
            why = recheck(self.observe_cluster(now), record.node, planned, now, self.deps.policy)
            if why is not None:
                return self.rollback(record.execution_id, why, step="evict")
            record = self._save(record, details=details.but(placement_checked=now))
        return super()._step_evict(record)
