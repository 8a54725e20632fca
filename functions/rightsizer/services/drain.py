"""The drain workflow (docs/architecture.md §4): validate → cordon → revalidate → evict → wait → remove → verify.

Each step is a small idempotent function over the ports. It loads the persisted ``WorkflowRecord``,
re-checks its preconditions on fresh state (a plan is a hint, not an order), acts at most once, saves the
record *before* returning, and names the next step. The in-process runner (CLI, demo, tests) and the Step
Functions state machine (Lambda ``drain``) both call :meth:`DrainWorkflow.step`, so a drain that outlives
one Lambda invocation resumes where it stopped (BUG-32). Any failure after the cordon rolls back: our
cordon is undone, nothing is scaled, and the reason is recorded (BUG-14, BUG-21, BUG-31).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rightsizer.domain.capacity import interruption_signals, reserved_kept
from rightsizer.domain.catalog import HOURS_PER_MONTH
from rightsizer.domain.eligibility import (
    DRAIN_GUARDS,
    DrainFacts,
    DrainMode,
    Judged,
    drain_refusals,
    first_refusal_message,
)
from rightsizer.domain.errors import PermanentError, RightsizerError, StalePlan, TransientError
from rightsizer.domain.holds import stamp
from rightsizer.domain.model import ANN_CORDONED_BY, Node, Pod, PodDisruptionBudget
from rightsizer.domain.names import dns1123_subdomain_problem
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.pods import PodContext, classify_pods
from rightsizer.domain.policy import Policy
from rightsizer.domain.volumes import UNKNOWN_VOLUMES, VolumeFacts
from rightsizer.domain.workflow_details import (
    ApprovalShown,
    DrainStepDetails,
    PendingRollback,
    ScaleInDetails,
)
from rightsizer.ports import Assessor, ClusterWriter, EvictionOutcome, NodeScaler
from rightsizer.services.approval import ApprovalGate, tell_cluster
from rightsizer.services.backoff import failure_backoff
from rightsizer.services.live_reads import gone_controllers
from rightsizer.services.node_view import node_local_volume_facts
from rightsizer.services.workflow.engine import FINAL_STATUSES as FINAL_STATUSES
from rightsizer.services.workflow.engine import StepFn, run_step
from rightsizer.services.workflow.engine import StepResult as StepResult
from rightsizer.state import EvictedPod, LedgerEntry, StateStore, WorkflowRecord, lease_ttl_seconds

log = logging.getLogger(__name__)

#: In the reason of a rollback that could not undo our cordon (the node may still be cordoned by us).
UNCORDON_PENDING = "uncordon_pending"
EVICTION_ERROR_RETRIES = 3
EVICTION_CONCURRENCY = 8
EVICT_MARGIN_S = 60
POLL_S = 5.0
MAX_RETRY_AFTER_S = 60.0
UNCORDON_ATTEMPTS = 5
UNCORDON_BACKOFF_S = 2.0


def drain_details(record: WorkflowRecord) -> DrainStepDetails:
    """The details of a record that runs the drain's steps (every kind but a node group replacement).

    Raises:
        PermanentError: the record is a replacement's (its own steps never reach the drain's).
    """
    if not isinstance(record.details, DrainStepDetails):
        raise PermanentError(f"not_a_drain_record:{record.details.kind}")
    return record.details


@dataclass(frozen=True)
class DrainRequest:
    """Drain ``node`` and remove its instance; ``trigger`` says who asked (``schedule``, ``alert:<fp>``,
    ``offhours:<group>``, ``cli``). ``offhours`` exempts the drain from ``max_nodes_per_*``, cooldown and
    disruption windows (docs/architecture.md §4: the schedule is the operator's window). Savings in USD per hour."""

    node: str
    execution_id: str
    trigger: str = "schedule"
    hourly_savings_usd: float | None = None
    offhours: bool = False


@dataclass
class DrainDeps:
    """What the workflow talks to. ``clock`` returns an aware UTC now; ``dry_run`` True validates and
    records what would happen without touching the cluster or AWS. ``approvals`` opens and reads approval
    requests (policy ``approval``); without it a drain that needs approval is abandoned, never run unasked."""

    cluster: ClusterWriter
    scaler: NodeScaler
    assessor: Assessor
    state: StateStore
    policy: Policy
    dry_run: bool = True
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    approvals: ApprovalGate | None = None


class DrainWorkflow:
    """Runs drain steps for one cluster; every method is safe to call again after a crash."""

    def __init__(self, deps: DrainDeps) -> None:
        self.deps = deps

    # ------------------------------------------------------------------------------------ helpers

    @property
    def _ttl(self) -> int:
        return lease_ttl_seconds(timedelta(seconds=self.deps.policy.drain_timeout))

    def _now(self) -> datetime:
        return self.deps.clock().astimezone(UTC)

    def _save(self, record: WorkflowRecord, **changes: Any) -> WorkflowRecord:
        return self.deps.state.save(replace(record, **changes), expected_version=record.version)

    def _ledger(
        self, record: WorkflowRecord, step: str, result: str, reason: str, *, savings: bool = False
    ) -> None:
        hourly = record.details.hourly_savings_usd if savings else None
        self.deps.state.record(
            LedgerEntry(
                execution_id=record.execution_id,
                node=record.node,
                instance_id=record.instance_id,
                node_group=record.details.node_group,
                kind=record.details.kind,
                step=step,
                result=result,  # type: ignore[arg-type]
                reason=reason,
                hourly_savings_usd=hourly,
                monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
                at=self._now(),
            )
        )

    def _renew(self, record: WorkflowRecord) -> None:
        if record.lease_epoch is None:
            raise StalePlan("no lease held")
        lease = self.deps.state.renew(
            record.node, record.execution_id, record.lease_epoch, self._now(), self._ttl
        )
        if lease.cancel_requested:
            raise StalePlan("cancelled: the alert resolved")

    def _release(self, record: WorkflowRecord) -> None:
        self.deps.state.release_slot(record.node, record.execution_id)
        if record.lease_epoch is not None:
            self.deps.state.release(record.node, record.execution_id, record.lease_epoch)

    def _end(
        self, record: WorkflowRecord, status: str, reason: str, *, step: str, savings: bool | None = None
    ) -> StepResult:
        self._release(record)
        record = self._save(record, status=status, step="done", details=record.details.but(outcome=reason))
        result = {
            "abandoned": "abandoned",
            "dry_run": "dry_run",
            "rolled_back": "rolled_back",
            "failed": "failed",
        }
        booked = status == "succeeded" if savings is None else savings
        self._ledger(record, step, result.get(status, "applied"), reason, savings=booked)
        log.info("drain %s of %s ended %s: %s", record.execution_id, record.node, status, reason)
        return StepResult(record.execution_id, step, None, status, 0.0, reason)

    def _next(
        self,
        record: WorkflowRecord,
        step: str,
        nxt: str,
        *,
        wait: float = 0.0,
        message: str = "",
        **changes: Any,
    ) -> StepResult:
        self._save(record, step=nxt, **changes)
        return StepResult(record.execution_id, step, nxt, "running", wait, message)

    def _still_candidate(self, record: WorkflowRecord, report: NodeReport | None) -> tuple[bool, list[str]]:
        """Whether a fresh report still allows this workflow to go on (revalidate; a hook: resize and a
        replacement's child judge by their own kind): the drain's eligibility (``domain.eligibility``, the
        planner's rule) on the report, the group having been judged by validate."""
        found = drain_refusals(self._facts(record, report, ""))
        return not found, [r.reason for r in found]

    def _facts(self, record: WorkflowRecord, report: NodeReport | None, asg: str | None) -> DrainFacts:
        """The drain's eligibility facts; a drain the plan started shrinks its group anyway (issue 28:
        unhealthy nodes go first)."""
        mode: DrainMode = "offhours" if drain_details(record).offhours else "scale_in"
        shrinking = record.details.trigger == "schedule"
        return DrainFacts(Judged.of(report), asg, mode, record.execution_id, shrinking=shrinking)

    def _slot_floor(self, record: WorkflowRecord, min_size: int) -> int:
        """The group size the budget slot may not take the group below (a hook: off-hours and a node group
        replacement take their groups to 0)."""
        return 0 if drain_details(record).offhours else min_size

    def _after_drain(self, record: WorkflowRecord) -> str:
        """The step that follows a drained node (a hook: resize stops the instance instead)."""
        return "remove"

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

    def _pods_and_budgets(self, node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The pods bound to ``node`` and the budgets that may protect them (fresh reads)."""
        pods = self.deps.cluster.list_pods_on_node(node)
        return pods, self._budgets(pods)

    def _holders_block(self, record: WorkflowRecord) -> bool:
        """Whether pods holding an idle GPU block this workflow (a hook: a resize moves busy holders)."""
        return not self.deps.policy.evict_idle_gpu_holders

    def _classify(
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
            if c.gpu_holder is not None and self._holders_block(record):
                blocking.append(c.gpu_holder.reason)
            if c.ignored == "terminating":
                if not self._stuck(c.pod):
                    to_evict.append(c.pod)  # not evicted again, but waited for (adopted by the evict step)
            elif c.ignored is None:
                to_evict.append(c.pod)
        return to_evict, blocking

    # ------------------------------------------------------------------------------------- entry

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the workflow record (idempotent: an existing record of that execution is returned)."""
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
            details=ScaleInDetails(
                trigger=request.trigger,
                offhours=request.offhours,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
            ),
        )
        return self.deps.state.save(record, expected_version=0)

    def step(self, execution_id: str) -> StepResult:
        """Run the record's current step once and persist its outcome.

        Raises:
            KeyError: no workflow record for ``execution_id``.
            TransientError: the step should be retried later (the record is unchanged).
        """
        record = self.deps.state.load(execution_id)
        if record is None:
            raise KeyError(execution_id)
        if record.step == "validate" and (problem := dns1123_subdomain_problem(record.node)) is not None:
            # Not a name any Node can have: it never reaches a request path (issue 14, ".." and "/").
            return self._end(record, "abandoned", f"invalid_node_name:{problem}", step="validate")
        return run_step(record, self.steps(record.details.kind), self.rollback)

    def steps(self, kind: str) -> Mapping[str, StepFn]:
        """The step table of workflow kind ``kind`` (the record's ``kind``): the drain's
        (docs/architecture.md §4): validate → approval → cordon → revalidate → evict → wait → remove →
        verify, and ``rollback`` (an uncordon retried)."""
        return {
            "validate": self._step_validate,
            "approval": self._step_approval,
            "cordon": self._step_cordon,
            "revalidate": self._step_revalidate,
            "evict": self._step_evict,
            "wait": self._step_wait,
            "remove": self._step_remove,
            "verify": self._step_verify,
            "rollback": self._step_rollback,
        }

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """Undo our cordon (only if ours), record why, release the slot and lease; never scales anything.

        An uncordon that fails for a reason worth retrying (5xx, 429, a timeout, a 409 race) is retried
        with exponential backoff (``UNCORDON_BACKOFF_S`` doubling, ``UNCORDON_ATTEMPTS`` attempts): the
        workflow stays ``running`` in step ``rollback`` holding its lease, and the state machine (or the
        in-process runner) waits and calls again. When the attempts are spent, or the uncordon is refused
        (403), the workflow ends ``failed`` with ``uncordon_pending`` in its details and ledger reason: the
        next assessment finds our annotation without a live workflow and heals the node
        (:func:`heal_stale_cordons`).
        """
        record = self.deps.state.load(execution_id)
        if record is None:
            raise KeyError(execution_id)
        if record.status in FINAL_STATUSES:
            return StepResult(execution_id, step, None, record.status, 0.0, "already finished")
        undone = False
        yielding = "spot_interruption:" in reason  # the handler's cordon, and the node, are its now
        if record.cordoned_at is not None and not record.details.dry_run and not yielding:
            try:
                undone = self.deps.cluster.uncordon(record.node, execution_id)
            except (TransientError, StalePlan) as exc:
                tries = drain_details(record).uncordon_attempts + 1
                log.warning("uncordon of %s failed (attempt %d): %s", record.node, tries, exc)
                if tries < UNCORDON_ATTEMPTS:
                    wait = UNCORDON_BACKOFF_S * 2 ** (tries - 1)
                    details = drain_details(record).but(
                        uncordon_attempts=tries,
                        rollback=PendingRollback(reason=reason, status=status, step=step),
                    )
                    return self._next(record, step, "rollback", wait=wait, details=details,
                                      message=f"uncordon failed ({exc}); retrying in {wait:g} s")  # fmt: skip
                return self._uncordon_failed(record, reason, exc, step=step)
            except RightsizerError as exc:
                return self._uncordon_failed(record, reason, exc, step=step)
        if undone or record.cordoned_at is not None:
            self.deps.cluster.emit_event(
                record.node, "RolledBack", f"rightsizer rolled back: {reason}", warning=True
            )
        elif status != "abandoned":
            self.deps.cluster.emit_event(
                record.node, "DrainBlocked", f"rightsizer did not drain: {reason}", warning=True
            )
        return self._end(record, status, reason, step=step)

    def _uncordon_failed(
        self, record: WorkflowRecord, reason: str, exc: Exception, *, step: str
    ) -> StepResult:
        log.error("uncordon of %s failed for good: %s", record.node, exc)
        record = self._save(record, details=drain_details(record).but(uncordon_pending=True))
        self.deps.cluster.emit_event(
            record.node,
            "UncordonFailed",
            f"rightsizer could not uncordon the node ({exc}); the next assessment retries",
            warning=True,
        )
        return self._end(record, "failed", f"{reason}; {UNCORDON_PENDING}: {exc}", step=step)

    def _step_rollback(self, record: WorkflowRecord) -> StepResult:
        """Retry the uncordon of a rollback whose first attempt failed (see :meth:`rollback`)."""
        pending = drain_details(record).rollback or PendingRollback()
        return self.rollback(record.execution_id, pending.reason, status=pending.status, step=pending.step)

    # ------------------------------------------------------------------------------------- steps

    def _step_validate(self, record: WorkflowRecord) -> StepResult:
        deps, now = self.deps, self._now()
        offhours = drain_details(record).offhours
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is None:
            return self._end(record, "abandoned", "node_not_found", step="validate")
        node = Node.model_validate(node_obj)
        if node.name != record.node:
            return self._end(record, "abandoned", "node_not_found", step="validate")
        if node.metadata.deletionTimestamp is not None:
            return self._end(record, "abandoned", "node_deleting", step="validate")
        lease = deps.state.acquire(record.node, record.execution_id, now, self._ttl)
        if lease is None:
            return self._end(record, "abandoned", "lease_held_by_other", step="validate")
        record = self._save(record, lease_epoch=lease.epoch, instance_id=node.instance_id)
        if node.spec.unschedulable and node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
            return self._end(record, "abandoned", "cordoned_by_other", step="validate")
        report = deps.assessor.assess_node(record.node, now)
        asg = deps.scaler.find_group(node.instance_id) if node.instance_id is not None else None
        # The planner's own rule on fresh facts: the first refusing guard ends the drain.
        refusal = first_refusal_message(DRAIN_GUARDS, self._facts(record, report, asg))
        if refusal is not None:
            return self._end(record, "abandoned", refusal, step="validate")
        assert asg is not None  # the eligibility's in_a_group guard
        # Before the cordon: IAM allows the scale-in only in opted-in groups (template.yaml), so a
        # system or foreign group must never be drained first and denied afterwards.
        refusal = deps.scaler.opt_in_refusal(asg, deps.state.cluster)
        if refusal is not None:
            return self._end(record, "abandoned", refusal, step="validate")
        sizes = deps.scaler.describe_group(asg).sizes
        min_size, desired = sizes.min, sizes.desired
        policy = deps.policy
        slot = deps.state.take_slot(
            asg,
            record.node,
            record.execution_id,
            now,
            max_per_run=10**6 if offhours else policy.max_nodes_per_run,
            max_per_group=1 if offhours else policy.node_group_budget(desired),
            desired=desired,
            min_size=self._slot_floor(record, min_size),
        )
        if not hasattr(slot, "taken_at"):
            return self._end(
                record, "abandoned", getattr(slot, "reason", "disruption_budget_exhausted"), step="validate"
            )
        pods, blocking = self._classify(*self._pods_and_budgets(record.node), record)
        if blocking:
            return self._end(record, "abandoned", "protected:" + ",".join(blocking), step="validate")
        hourly = record.details.hourly_savings_usd
        if hourly is None and report is not None and reserved_kept(report.reasons) is None:
            hourly = report.hourly_usd  # a node in a Capacity Reservation or Block saves nothing while held
        details = drain_details(record).but(
            asg=asg,
            node_group=(report.node_group if report is not None else None) or asg,
            validated_pods=sorted(p.metadata.uid for p in pods),
            desired_before=desired,
            hourly_savings_usd=hourly,
        )
        record = self._save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would cordon {record.node}, evict {len(pods)} pod(s), terminate {node.instance_id} "
                f"in {asg} (desired {desired} -> {desired - 1})"
            )
            return self._end(record, "dry_run", message, step="validate")
        return self._validated(record, report, f"validated; {len(pods)} pod(s) to evict")

    def _validated(self, record: WorkflowRecord, report: NodeReport | None, message: str) -> StepResult:
        """After a successful validate, before the cordon: the failure back-off (whoever started the
        drain), then a person's approval when the policy requires it for the node's group."""
        deps, now, policy = self.deps, self._now(), self.deps.policy
        held = failure_backoff(deps.state, [record.node], now, policy.drain_failure_backoff)
        if held:
            return self._end(record, "abandoned", held[record.node], step="validate")
        if not policy.approval_required(record.details.node_group, record.details.asg):
            return self._next(record, "validate", "cordon", message=message)
        if deps.approvals is None:
            return self._end(record, "abandoned", "approval_unavailable", step="validate")
        # Lease and budget slot stay held while a person decides: the lease must outlive the wait.
        assert record.lease_epoch is not None  # validate took it
        deps.state.renew(record.node, record.execution_id, record.lease_epoch, now,
                         self._ttl + policy.approval_timeout)  # fmt: skip
        expires = now + timedelta(seconds=policy.approval_timeout)
        approval = (
            ApprovalShown(verdict=report.verdict, reasons=tuple(report.reasons),
                          instance_type=report.instance_type, expires_at=expires)
            if report
            else ApprovalShown(expires_at=expires)
        )  # fmt: skip
        return self._next(record, "validate", "approval", wait=policy.approval_timeout,
                          message=f"{message}; waiting for approval", details=drain_details(record).but(approval=approval))  # fmt: skip

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """Open and publish the approval request of a workflow waiting in step ``approval`` (the state
        machine's ``AwaitApproval`` task with its task token, or the in-process runner); idempotent."""
        record = self.deps.state.load(execution_id)
        if record is None:
            raise KeyError(execution_id)
        if record.status in FINAL_STATUSES or record.step != "approval" or self.deps.approvals is None:
            return StepResult(execution_id, "approval", record.step, record.status, 0.0, "not waiting")
        details = drain_details(record)
        if details.approval is None:
            return StepResult(execution_id, "approval", record.step, record.status, 0.0, "not waiting")
        expires = details.approval.expires_at
        shown = {
            **details.approval.model_dump(mode="json", exclude_unset=True, exclude={"expires_at"}),
            "node_group": details.node_group,
            "hourly_savings_usd": details.hourly_savings_usd,
            "instance_id": record.instance_id,
        }
        opened, published = self.deps.approvals.open(
            execution_id, record.node, shown, now=self._now(), expires_at=expires,
            snooze_seconds=self.deps.policy.approval_snooze, task_token=task_token,
        )  # fmt: skip
        if published:  # once per request, like the message on the topic
            tell_cluster(self.deps.cluster, record.node, "requested", execution_id, opened)
        wait = max(1.0, (expires - self._now()).total_seconds())
        return StepResult(execution_id, "approval", "approval", "running", wait, "approval requested")

    def _step_approval(self, record: WorkflowRecord) -> StepResult:
        """Read the person's decision: approved → cordon; rejected, snoozed, unanswered at the deadline or
        never published → abandoned with nothing cordoned; still pending → wait for the rest of the time."""
        gate, now = self.deps.approvals, self._now()
        if gate is None:
            return self._end(record, "abandoned", "approval_unavailable", step="approval")
        approval = drain_details(record).approval
        if approval is None:
            raise PermanentError("approval_lost: the record holds no approval request")
        expires = approval.expires_at
        request = gate.store.get_approval(record.execution_id)
        # Each outcome is told on the node once the record moved on (a retried step then says nothing).
        if request is None or not request.notified:  # the request could not be published: nobody asked
            ended = self._end(record, "abandoned", "approval_request_failed", step="approval")
            tell_cluster(self.deps.cluster, record.node, "unpublished", record.execution_id, request)
            return ended
        if request.status == "pending" and now >= expires:
            # One conditional write: a decision that got in first wins, and is read back here.
            gate.store.decide_approval(record.execution_id, "expired", by="timeout", now=now)
            request = gate.store.get_approval(record.execution_id) or request
        if request.status == "approved":
            self._renew(record)
            moved = self._next(record, "approval", "cordon", message=f"approved by {request.decided_by}")
            tell_cluster(self.deps.cluster, record.node, "approved", record.execution_id, request)
            return moved
        if request.status == "pending":
            wait = max(1.0, (expires - now).total_seconds())
            return self._next(record, "approval", "approval", wait=wait, message="waiting for approval")
        until = stamp(request.snooze_until) if request.snooze_until else ""
        reason = {
            "rejected": f"approval_rejected:{request.decided_by}",
            "snoozed": f"approval_snoozed:until:{until}",
        }.get(request.status, "approval_timeout")
        ended = self._end(record, "abandoned", reason, step="approval")
        tell_cluster(self.deps.cluster, record.node, request.status, record.execution_id, request)
        return ended

    def _step_cordon(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        now = self._now()
        at = now.isoformat().replace("+00:00", "Z")
        try:
            self.deps.cluster.cordon(record.node, record.execution_id, at)
        except StalePlan as exc:
            if str(exc) != "node_changed":
                raise
            # 409: the node changed between our GET and PATCH (a label, a condition). Re-read and re-check
            # on the next attempt, as kubectl's cordon helper does, instead of giving up the drain.
            raise TransientError("node changed while cordoning (409); re-reading", retry_after=1.0) from exc
        cordoned_at = record.cordoned_at or now
        self.deps.cluster.emit_event(
            record.node, "CordonedIdle", f"rightsizer cordoned the idle node ({record.execution_id})"
        )
        return self._next(
            record,
            "cordon",
            "revalidate",
            cordoned_at=cordoned_at,
            deadline=cordoned_at + timedelta(seconds=self.deps.policy.drain_timeout),
            message="cordoned",
        )

    def _step_revalidate(self, record: WorkflowRecord) -> StepResult:
        """After the cordon: uncached pods, protections, and fresh metrics when the decision is old (BUG-21)."""
        self._renew(record)
        deps, now = self.deps, self._now()
        pods, blocking = self._classify(*self._pods_and_budgets(record.node), record)
        validated = set(drain_details(record).validated_pods)
        landed = sorted(
            f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata.uid not in validated
        )
        if landed:
            return self.rollback(record.execution_id, "pods_landed:" + ",".join(landed), step="revalidate")
        if blocking:
            return self.rollback(record.execution_id, "protected:" + ",".join(blocking), step="revalidate")
        if (now - record.started_at).total_seconds() > deps.policy.max_decision_age:
            ok, reasons = self._still_candidate(record, deps.assessor.assess_node(record.node, now))
            if not ok:
                return self.rollback(
                    record.execution_id, "not_idle_anymore:" + ",".join(reasons), step="revalidate"
                )
        return self._next(record, "revalidate", "evict", message=f"{len(pods)} pod(s) to evict")

    def _step_evict(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        deps, now = self.deps, self._now()
        if now >= record.deadline:
            return self._timeout(record)
        pods, blocking = self._classify(*self._pods_and_budgets(record.node), record)
        if blocking:
            return self.rollback(record.execution_id, "protected:" + ",".join(blocking), step="evict")
        evicted = {p.uid: p for p in record.evicted}
        # A pod already terminating that we did not record was evicted by an invocation that died before
        # saving (BUG-32): track it by UID like our own, instead of bouncing between evict and wait.
        adopted = [
            EvictedPod(
                p.metadata.uid,
                p.metadata.namespace,
                p.metadata.name,
                (p.metadata.deletionTimestamp or now) + timedelta(seconds=p.grace_seconds),
            )
            for p in pods
            if p.metadata.uid not in evicted and p.metadata.deletionTimestamp is not None
        ]
        todo = [p for p in pods if p.metadata.uid not in evicted and p.metadata.deletionTimestamp is None]
        too_late = [
            p for p in todo if now + timedelta(seconds=p.grace_seconds + EVICT_MARGIN_S) > record.deadline
        ]
        if too_late:
            # No eviction may start that cannot finish before the deadline: it is as good as reached.
            names = ",".join(p.key for p in too_late)
            why = "; ".join(drain_details(record).blocked) or f"grace_period_exceeds_deadline:{names}"
            return self.rollback(record.execution_id, f"drain_timeout:{why}", step="evict")
        attempts: dict[str, int] = dict(drain_details(record).attempts)
        blocked: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, min(EVICTION_CONCURRENCY, len(todo)))) as pool:
            outcomes: list[EvictionOutcome] = list(
                pool.map(
                    lambda p: deps.cluster.evict(p.metadata.namespace, p.metadata.name, p.metadata.uid), todo
                )
            )
        new_evicted = [*record.evicted, *adopted]
        hints: list[float] = []
        for pod, outcome in zip(todo, outcomes, strict=True):
            if outcome.status == "accepted":
                new_evicted.append(
                    EvictedPod(
                        pod.metadata.uid,
                        pod.metadata.namespace,
                        pod.metadata.name,
                        now + timedelta(seconds=pod.grace_seconds),
                    )
                )
            elif outcome.status == "blocked":
                blocked.append(f"{pod.key}: {outcome.message}")
                if outcome.retry_after:
                    hints.append(outcome.retry_after)
            elif outcome.status == "error":
                attempts[pod.metadata.uid] = attempts.get(pod.metadata.uid, 0) + 1
                if attempts[pod.metadata.uid] >= EVICTION_ERROR_RETRIES:
                    return self.rollback(
                        record.execution_id, f"eviction_failed:{pod.key}: {outcome.message}", step="evict"
                    )
                blocked.append(f"{pod.key}: {outcome.message}")
            elif outcome.status == "gone" and self._still_there(pod):
                # 404 from the eviction subresource while the pod exists: the API server does not serve
                # policy/v1 Eviction for it (kubectl falls back to DELETE; we never delete pods).
                return self.rollback(
                    record.execution_id,
                    f"failed:eviction_unsupported:{pod.key}: the Eviction API answered 404 for a pod that "
                    "exists; rightsizer never deletes pods",
                    status="failed",
                    step="evict",
                )
            # gone (404) and uid_mismatch (409) are done for that UID; a replacement is re-classified next round.
        details = drain_details(record).but(attempts=attempts, blocked=blocked)
        if blocked:
            if tuple(blocked) != drain_details(record).blocked:
                deps.cluster.emit_event(
                    record.node, "DrainBlocked", "eviction blocked: " + "; ".join(blocked), warning=True
                )
            # The API server's Retry-After is a hint: honour it, but never wait past the drain deadline.
            wait = min(
                max([POLL_S, *hints]), MAX_RETRY_AFTER_S, max(0.0, (record.deadline - now).total_seconds())
            )
            return self._next(record, "evict", "evict", wait=max(wait, 0.5), evicted=tuple(new_evicted), details=details,
                              message="waiting for PodDisruptionBudgets: " + "; ".join(blocked))  # fmt: skip
        return self._next(
            record,
            "evict",
            "wait",
            evicted=tuple(new_evicted),
            details=details,
            message=f"{len(todo)} eviction(s) accepted",
        )

    def _still_there(self, pod: Pod) -> bool:
        """The pod with this UID is still bound to its node and not terminating (the uncached list the drain
        already has RBAC for: ClusterRole ``rightsizer`` grants ``list`` on pods, not ``get``)."""
        listed = [Pod.model_validate(p) for p in self.deps.cluster.list_pods_on_node(pod.spec.nodeName)]
        return any(p.metadata.uid == pod.metadata.uid and not p.metadata.deletionTimestamp for p in listed)

    def _stuck(self, pod: Pod) -> bool:
        """A pod terminating longer than ``skip_wait_for_delete_timeout`` past its ``deletionTimestamp`` (the
        API server sets it to the end of the grace period): stuck on a finalizer or a NotReady kubelet, it
        is not waited for (kubectl drain ``skipDeletedFilter``); 0 disables the skip."""
        limit, deleting = self.deps.policy.skip_wait_for_delete_timeout, pod.metadata.deletionTimestamp
        return bool(limit) and deleting is not None and (self._now() - deleting).total_seconds() > limit

    def _step_wait(self, record: WorkflowRecord) -> StepResult:
        """Drained = every evicted pod UID is gone or finished (BUG-17), and nothing else is left to evict."""
        self._renew(record)
        deps, now = self.deps, self._now()
        # One uncached list instead of a GET per pod: a UID bound to this node stays bound to it, so an
        # evicted pod is gone once its UID is no longer listed on the node (or it finished).
        listed = {p.get("metadata", {}).get("uid"): p for p in deps.cluster.list_pods_on_node(record.node)}
        remaining = [
            pod
            for pod in record.evicted
            if pod.uid in listed
            and listed[pod.uid].get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]
        stuck = [p for p in remaining if self._stuck(Pod.model_validate(listed[p.uid]))]
        names = ", ".join(f"{p.namespace}/{p.name}" for p in stuck)
        if stuck and drain_details(record).stuck != names:
            record = self._save(record, details=drain_details(record).but(stuck=names))
            log.warning("%s: not waiting for pods stuck terminating: %s", record.node, names)
            limit = deps.policy.skip_wait_for_delete_timeout
            deps.cluster.emit_event(record.node, "SkippedStuckPods", f"rightsizer no longer waits for pods "
                                    f"terminating over {limit} s past their deletionTimestamp: {names}", warning=True)  # fmt: skip
        remaining = [p for p in remaining if p not in stuck]
        if remaining:
            if now >= record.deadline:
                return self._timeout(record)
            # Wake up when the first grace period ends, but never spin: a pod still terminating past its
            # grace period is polled every POLL_S until it is stuck (skip_wait_for_delete_timeout).
            soonest = min((p.grace_deadline - now).total_seconds() for p in remaining)
            wait = POLL_S if soonest <= 0 else min(POLL_S, max(0.5, soonest))
            return self._next(
                record, "wait", "wait", wait=wait, message=f"waiting for {len(remaining)} pod(s) to terminate"
            )
        pods, _ = self._classify(list(listed.values()), [], record, live=False)
        evicted_uids = {p.uid for p in record.evicted}
        if [p for p in pods if p.metadata.uid not in evicted_uids]:
            return self._next(record, "wait", "evict", message="pods left to evict")
        return self._next(record, "wait", self._after_drain(record), message="drained")

    def _step_remove(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        deps = self.deps
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is not None:
            node = Node.model_validate(node_obj)
            if node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
                raise StalePlan("our cordon is gone; refusing to remove the node")
            pods, _ = self._classify(deps.cluster.list_pods_on_node(record.node), [], record, live=False)
            if pods:
                return self._next(record, "remove", "evict", message="pods appeared; evicting again")
        asg = record.details.asg
        assert record.instance_id is not None and asg is not None  # validate found both
        removed = deps.scaler.terminate(asg, record.instance_id)
        before, after, already = removed.desired_before, removed.desired_after, removed.already_done
        deps.cluster.emit_event(
            record.node,
            "ScaledIn",
            f"rightsizer terminated {record.instance_id} in {asg}: desired {before} -> {after}",
        )
        details = drain_details(record).but(desired_before=before, desired_after=after, already_done=already)
        return self._next(
            record,
            "remove",
            "verify",
            details=details,
            message=f"terminated {record.instance_id}; desired {before} -> {after}",
        )

    def _step_verify(self, record: WorkflowRecord) -> StepResult:
        deps = self.deps
        asg = str(record.details.asg)
        group = deps.scaler.describe_group(asg)
        desired_now = group.sizes.desired
        if record.instance_id in group.in_service:
            if self._now() >= record.deadline + timedelta(minutes=5):
                return self._end(record, "failed", "instance_still_in_service", step="verify")
            return self._next(
                record, "verify", "verify", wait=POLL_S, message="waiting for the instance to leave the group"
            )
        # Savings happened only if *our* terminate removed the instance and the group got smaller: an
        # instance someone else had already replaced (already_done, desired unchanged) saved nothing.
        details = drain_details(record)
        before, after = details.desired_before, details.desired_after
        saved = (
            not details.already_done
            and isinstance(before, int)
            and isinstance(after, int)
            and after == before - 1
            and desired_now <= after
        )
        note = "" if saved else "; no savings booked (the group did not shrink by our instance)"
        return self._end(
            record,
            "succeeded",
            f"removed {record.instance_id} from {asg}{note}",
            step="verify",
            savings=saved,
        )

    def _timeout(self, record: WorkflowRecord) -> StepResult:
        blocked = "; ".join(drain_details(record).blocked) or "pods still terminating"
        return self.rollback(record.execution_id, f"drain_timeout:{blocked}", step="evict")
