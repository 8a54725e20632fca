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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rightsizer.domain.catalog import Catalog
from rightsizer.domain.eligibility import DrainFacts, Judged
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.placement_cluster import ClusterPlacement, movers
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.pods import PodContext, classify_pods, pdbs_by_namespace
from rightsizer.domain.policy import Policy
from rightsizer.domain.volumes import VolumeFacts
from rightsizer.domain.workflow_details import ConsolidateDetails
from rightsizer.ports import InstanceTypeChanger, LaunchTemplateVersions, NodeGroupReplacer
from rightsizer.services.replace import FreshPlanner, replacement_kinds
from rightsizer.services.workflow.drain_steps import DrainRules, DrainSteps
from rightsizer.services.workflow.engine import StepFn, StepResult
from rightsizer.services.workflow.executor import Executor
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
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


def consolidate_facts(
    record: WorkflowRecord, report: NodeReport | None, asg: str | None, policy: Policy
) -> DrainFacts:
    """A consolidation's eligibility: the drain's in mode ``consolidate`` (policy ``consolidation``)."""
    return DrainFacts(
        Judged.of(report), asg, "consolidate", record.execution_id, consolidation=policy.consolidation
    )


#: How a consolidation drains: idle GPU holders are what it moves; then the instance is removed.
RULES = DrainRules(facts=consolidate_facts, after_drain="remove", holders_move=True)


class Consolidate:
    """The consolidation kind: the drain in mode ``consolidate``, the placement check before the first
    eviction, then the scale-in's removal.

    Args:
        deps: the workflow's dependencies.
        observe_cluster: a fresh snapshot of the whole cluster at an instant (None: a consolidation cannot
            verify placement and rolls back before evicting).
    """

    name = KIND
    request_type = ConsolidateRequest

    def __init__(
        self, deps: DrainDeps, observe_cluster: Callable[[datetime], ClusterSnapshot] | None
    ) -> None:
        self.deps = deps
        self.drain = DrainSteps(deps, RULES)
        self.observe_cluster = observe_cluster

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the consolidation's record (idempotent: an existing record is returned)."""
        assert isinstance(request, ConsolidateRequest)
        return self.drain.ops.create(
            request,
            ConsolidateDetails(
                kind=KIND,
                trigger=request.trigger,
                offhours=False,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
                moves=request.moves,
            ),
        )

    def steps(self) -> Mapping[str, StepFn]:
        """The scale-in's table with its own evict (the placement check first)."""
        d = self.drain
        return {
            "validate": d.validate,
            "approval": d.approval,
            "cordon": d.cordon,
            "revalidate": d.revalidate,
            "evict": self.evict,
            "wait": d.wait,
            "remove": d.remove,
            "verify": d.verify,
            "rollback": d.retry_rollback,
        }

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """The drain's rollback: our cordon undone, nothing scaled."""
        return self.drain.rollback(execution_id, reason, status=status, step=step)

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """The drain's approval request."""
        return self.drain.request_approval(execution_id, task_token)

    def evict(self, record: WorkflowRecord) -> StepResult:
        """Before the first eviction, the placement check on a fresh read of the cluster (module
        docstring); then the drain's evict step."""
        details = record.details
        if (
            isinstance(details, ConsolidateDetails)
            and not record.evicted
            and details.placement_checked is None
        ):
            self.drain.ops.renew(record)
            if self.observe_cluster is None:
                return self.drain.rollback(record.execution_id, "placement_unverifiable", step="evict")
            now = self.drain.ops.now()
            planned = [pod for pod, _to in details.moves]
            why = recheck(self.observe_cluster(now), record.node, planned, now, self.deps.policy)
            if why is not None:
                return self.drain.rollback(record.execution_id, why, step="evict")
            record = self.drain.ops.save(record, details=details.but(placement_checked=now))
        return self.drain.evict(record)


class ConsolidateWorkflow(Executor):
    """The executor of every kind: scale-in, consolidation, resize, node group replacement and its child
    drain (what the drain Lambda and the CLI run).

    Args:
        deps, changer, replacer, templates, planner, catalog: see
            :class:`rightsizer.services.replace.ReplaceWorkflow`.
        observe_cluster: a fresh snapshot of the whole cluster, for a consolidation's placement check.
    """

    def __init__(
        self,
        deps: DrainDeps,
        changer: InstanceTypeChanger | None,
        replacer: NodeGroupReplacer | None = None,
        templates: LaunchTemplateVersions | None = None,
        planner: FreshPlanner | None = None,
        catalog: Catalog | None = None,
        *,
        observe_cluster: Callable[[datetime], ClusterSnapshot] | None = None,
    ) -> None:
        kinds = replacement_kinds(deps, changer, replacer, templates, planner, catalog)
        super().__init__(deps, [*kinds, Consolidate(deps, observe_cluster)])
