"""The drain's steps, shared by every kind that drains a node (docs/architecture.md §4):
validate → approval → cordon → revalidate → evict → wait, then a scale-in's remove → verify; and the
rollback (our cordon undone, an uncordon that fails retried).

A kind composes :class:`DrainSteps` with its :class:`DrainRules` — how its drain differs from the
scale-in's (the eligibility mode, the step after ``wait``, whether idle GPU holders move, whether the
budget slot may take the group to 0) — and references the steps it runs in its own step table. Each step
re-checks its preconditions on fresh state, acts at most once, saves the record *before* returning and
names the next step; any failure after the cordon rolls back: our cordon is undone, nothing is scaled,
and the reason is recorded (BUG-14, BUG-21, BUG-31, BUG-32).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from rightsizer.domain.capacity import reserved_kept
from rightsizer.domain.eligibility import DRAIN_GUARDS, DrainFacts, drain_refusals, first_refusal_message
from rightsizer.domain.errors import PermanentError, RightsizerError, StalePlan, TransientError
from rightsizer.domain.holds import stamp
from rightsizer.domain.model import ANN_CORDONED_BY, Node
from rightsizer.domain.names import dns1123_subdomain_problem
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import ApprovalShown, PendingRollback
from rightsizer.services.approval import tell_cluster
from rightsizer.services.backoff import failure_backoff
from rightsizer.services.workflow import evict_steps
from rightsizer.services.workflow.drain_pods import PodReads
from rightsizer.services.workflow.engine import FINAL_STATUSES, StepResult
from rightsizer.services.workflow.evict_steps import POLL_S as POLL_S
from rightsizer.services.workflow.record_ops import RecordOps, drain_details
from rightsizer.services.workflow.requests import DrainDeps
from rightsizer.state import WorkflowRecord

log = logging.getLogger(__name__)

#: In the reason of a rollback that could not undo our cordon (the node may still be cordoned by us).
UNCORDON_PENDING = "uncordon_pending"

UNCORDON_ATTEMPTS = 5
UNCORDON_BACKOFF_S = 2.0

#: A kind's eligibility facts of a record: (record, fresh report, its Auto Scaling group, policy).
FactsOf = Callable[[WorkflowRecord, NodeReport | None, str | None, Policy], DrainFacts]


@dataclass(frozen=True)
class DrainRules:
    """How a kind's drain differs from the scale-in's.

    Attributes:
        facts: its eligibility facts (``domain.eligibility``, the planner's rule) of a record.
        after_drain: the step after ``wait`` (``remove``; a resize's ``stop``, a replacement child's
            ``drained``).
        holders_move: pods holding an idle GPU are what it moves (they never block it).
        floor_zero: its budget slot may take the group to 0 (a replacement's child: the old group goes).
        still_candidate: the refusals of a fresh report at revalidate; by default the eligibility's on
            ``facts`` (the group having been judged by validate).
    """

    facts: FactsOf
    after_drain: str = "remove"
    holders_move: bool = False
    floor_zero: bool = False
    still_candidate: Callable[[WorkflowRecord, NodeReport | None], list[str]] | None = None


class DrainSteps:
    """The drain's steps of one kind (``rules``), over its record operations ``ops``."""

    def __init__(self, deps: DrainDeps, rules: DrainRules, ops: RecordOps | None = None) -> None:
        self.deps = deps
        self.rules = rules
        self.ops = ops or RecordOps(deps)
        self.pods = PodReads(deps, holders_move=rules.holders_move)

    def invalid_name(self, record: WorkflowRecord) -> StepResult | None:
        """The end of a workflow whose node name no Node can have (it never reaches a request path,
        issue 14: ``..`` and ``/``), or None."""
        problem = dns1123_subdomain_problem(record.node)
        if problem is None:
            return None
        return self.ops.end(record, "abandoned", f"invalid_node_name:{problem}", step="validate")

    def evict(self, record: WorkflowRecord) -> StepResult:
        """Evict the node's pods through the Eviction API (:func:`evict_steps.evict`)."""
        return evict_steps.evict(self, record)

    def wait(self, record: WorkflowRecord) -> StepResult:
        """Wait until every evicted pod is gone (:func:`evict_steps.wait`)."""
        return evict_steps.wait(self, record)

    def timeout(self, record: WorkflowRecord) -> StepResult:
        """Roll back at the drain deadline, naming what blocked."""
        blocked = "; ".join(drain_details(record).blocked) or "pods still terminating"
        return self.rollback(record.execution_id, f"drain_timeout:{blocked}", step="evict")

    def _still_candidate(self, record: WorkflowRecord, report: NodeReport | None) -> tuple[bool, list[str]]:
        """Whether a fresh report still allows this workflow to go on (revalidate): the kind's
        ``still_candidate``, by default its eligibility on the report, the group judged by validate."""
        if self.rules.still_candidate is not None:
            refusals = self.rules.still_candidate(record, report)
        else:
            facts = self.rules.facts(record, report, "", self.deps.policy)
            refusals = [r.reason for r in drain_refusals(facts)]
        return not refusals, refusals

    def _slot_floor(self, record: WorkflowRecord, min_size: int) -> int:
        """The group size the budget slot may not take the group below (off-hours and a node group
        replacement take their groups to 0)."""
        return 0 if self.rules.floor_zero or drain_details(record).offhours else min_size

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
                    return self.ops.next(record, step, "rollback", wait=wait, details=details,
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
        return self.ops.end(record, status, reason, step=step)

    def _uncordon_failed(
        self, record: WorkflowRecord, reason: str, exc: Exception, *, step: str
    ) -> StepResult:
        log.error("uncordon of %s failed for good: %s", record.node, exc)
        record = self.ops.save(record, details=drain_details(record).but(uncordon_pending=True))
        self.deps.cluster.emit_event(
            record.node,
            "UncordonFailed",
            f"rightsizer could not uncordon the node ({exc}); the next assessment retries",
            warning=True,
        )
        return self.ops.end(record, "failed", f"{reason}; {UNCORDON_PENDING}: {exc}", step=step)

    def retry_rollback(self, record: WorkflowRecord) -> StepResult:
        """Retry the uncordon of a rollback whose first attempt failed (see :meth:`rollback`)."""
        pending = drain_details(record).rollback or PendingRollback()
        return self.rollback(record.execution_id, pending.reason, status=pending.status, step=pending.step)

    # ------------------------------------------------------------------------------------- steps

    def validate(self, record: WorkflowRecord) -> StepResult:
        """The node is there, still a candidate (the kind's eligibility on a fresh report), in an opted-in
        group; take its lease and a budget slot; nothing protected on it; then approval or the cordon."""
        return self.invalid_name(record) or self._validate(record)

    def _validate(self, record: WorkflowRecord) -> StepResult:
        deps, now = self.deps, self.ops.now()
        offhours = drain_details(record).offhours
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is None:
            return self.ops.end(record, "abandoned", "node_not_found", step="validate")
        node = Node.model_validate(node_obj)
        if node.name != record.node:
            return self.ops.end(record, "abandoned", "node_not_found", step="validate")
        if node.metadata.deletionTimestamp is not None:
            return self.ops.end(record, "abandoned", "node_deleting", step="validate")
        lease = deps.state.acquire(record.node, record.execution_id, now, self.ops.ttl)
        if lease is None:
            return self.ops.end(record, "abandoned", "lease_held_by_other", step="validate")
        record = self.ops.save(record, lease_epoch=lease.epoch, instance_id=node.instance_id)
        if node.spec.unschedulable and node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
            return self.ops.end(record, "abandoned", "cordoned_by_other", step="validate")
        report = deps.assessor.assess_node(record.node, now)
        asg = deps.scaler.find_group(node.instance_id) if node.instance_id is not None else None
        # The planner's own rule on fresh facts: the first refusing guard ends the drain.
        refusal = first_refusal_message(DRAIN_GUARDS, self.rules.facts(record, report, asg, self.deps.policy))
        if refusal is not None:
            return self.ops.end(record, "abandoned", refusal, step="validate")
        assert asg is not None  # the eligibility's in_a_group guard
        # Before the cordon: IAM allows the scale-in only in opted-in groups (template.yaml), so a
        # system or foreign group must never be drained first and denied afterwards.
        refusal = deps.scaler.opt_in_refusal(asg, deps.state.cluster)
        if refusal is not None:
            return self.ops.end(record, "abandoned", refusal, step="validate")
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
            return self.ops.end(
                record, "abandoned", getattr(slot, "reason", "disruption_budget_exhausted"), step="validate"
            )
        pods, blocking = self.pods.classify(*self.pods.pods_and_budgets(record.node), record)
        if blocking:
            return self.ops.end(record, "abandoned", "protected:" + ",".join(blocking), step="validate")
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
        record = self.ops.save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would cordon {record.node}, evict {len(pods)} pod(s), terminate {node.instance_id} "
                f"in {asg} (desired {desired} -> {desired - 1})"
            )
            return self.ops.end(record, "dry_run", message, step="validate")
        return self.validated(record, report, f"validated; {len(pods)} pod(s) to evict")

    def validated(self, record: WorkflowRecord, report: NodeReport | None, message: str) -> StepResult:
        """After a successful validate, before the cordon: the failure back-off (whoever started the
        drain), then a person's approval when the policy requires it for the node's group."""
        deps, now, policy = self.deps, self.ops.now(), self.deps.policy
        held = failure_backoff(deps.state, [record.node], now, policy.drain_failure_backoff)
        if held:
            return self.ops.end(record, "abandoned", held[record.node], step="validate")
        if not policy.approval_required(record.details.node_group, record.details.asg):
            return self.ops.next(record, "validate", "cordon", message=message)
        if deps.approvals is None:
            return self.ops.end(record, "abandoned", "approval_unavailable", step="validate")
        # Lease and budget slot stay held while a person decides: the lease must outlive the wait.
        assert record.lease_epoch is not None  # validate took it
        deps.state.renew(record.node, record.execution_id, record.lease_epoch, now,
                         self.ops.ttl + policy.approval_timeout)  # fmt: skip
        expires = now + timedelta(seconds=policy.approval_timeout)
        approval = (
            ApprovalShown(verdict=report.verdict, reasons=tuple(report.reasons),
                          instance_type=report.instance_type, expires_at=expires)
            if report
            else ApprovalShown(expires_at=expires)
        )  # fmt: skip
        return self.ops.next(record, "validate", "approval", wait=policy.approval_timeout,
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
            execution_id, record.node, shown, now=self.ops.now(), expires_at=expires,
            snooze_seconds=self.deps.policy.approval_snooze, task_token=task_token,
        )  # fmt: skip
        if published:  # once per request, like the message on the topic
            tell_cluster(self.deps.cluster, record.node, "requested", execution_id, opened)
        wait = max(1.0, (expires - self.ops.now()).total_seconds())
        return StepResult(execution_id, "approval", "approval", "running", wait, "approval requested")

    def approval(self, record: WorkflowRecord) -> StepResult:
        """Read the person's decision: approved → cordon; rejected, snoozed, unanswered at the deadline or
        never published → abandoned with nothing cordoned; still pending → wait for the rest of the time."""
        gate, now = self.deps.approvals, self.ops.now()
        if gate is None:
            return self.ops.end(record, "abandoned", "approval_unavailable", step="approval")
        approval = drain_details(record).approval
        if approval is None:
            raise PermanentError("approval_lost: the record holds no approval request")
        expires = approval.expires_at
        request = gate.store.get_approval(record.execution_id)
        # Each outcome is told on the node once the record moved on (a retried step then says nothing).
        if request is None or not request.notified:  # the request could not be published: nobody asked
            ended = self.ops.end(record, "abandoned", "approval_request_failed", step="approval")
            tell_cluster(self.deps.cluster, record.node, "unpublished", record.execution_id, request)
            return ended
        if request.status == "pending" and now >= expires:
            # One conditional write: a decision that got in first wins, and is read back here.
            gate.store.decide_approval(record.execution_id, "expired", by="timeout", now=now)
            request = gate.store.get_approval(record.execution_id) or request
        if request.status == "approved":
            self.ops.renew(record)
            moved = self.ops.next(record, "approval", "cordon", message=f"approved by {request.decided_by}")
            tell_cluster(self.deps.cluster, record.node, "approved", record.execution_id, request)
            return moved
        if request.status == "pending":
            wait = max(1.0, (expires - now).total_seconds())
            return self.ops.next(record, "approval", "approval", wait=wait, message="waiting for approval")
        until = stamp(request.snooze_until) if request.snooze_until else ""
        reason = {
            "rejected": f"approval_rejected:{request.decided_by}",
            "snoozed": f"approval_snoozed:until:{until}",
        }.get(request.status, "approval_timeout")
        ended = self.ops.end(record, "abandoned", reason, step="approval")
        tell_cluster(self.deps.cluster, record.node, request.status, record.execution_id, request)
        return ended

    def cordon(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        now = self.ops.now()
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
        return self.ops.next(
            record,
            "cordon",
            "revalidate",
            cordoned_at=cordoned_at,
            deadline=cordoned_at + timedelta(seconds=self.deps.policy.drain_timeout),
            message="cordoned",
        )

    def revalidate(self, record: WorkflowRecord) -> StepResult:
        """After the cordon: uncached pods, protections, and fresh metrics when the decision is old (BUG-21)."""
        self.ops.renew(record)
        deps, now = self.deps, self.ops.now()
        pods, blocking = self.pods.classify(*self.pods.pods_and_budgets(record.node), record)
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
        return self.ops.next(record, "revalidate", "evict", message=f"{len(pods)} pod(s) to evict")

    def remove(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        deps = self.deps
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is not None:
            node = Node.model_validate(node_obj)
            if node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
                raise StalePlan("our cordon is gone; refusing to remove the node")
            pods, _ = self.pods.classify(deps.cluster.list_pods_on_node(record.node), [], record, live=False)
            if pods:
                return self.ops.next(record, "remove", "evict", message="pods appeared; evicting again")
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
        return self.ops.next(
            record,
            "remove",
            "verify",
            details=details,
            message=f"terminated {record.instance_id}; desired {before} -> {after}",
        )

    def verify(self, record: WorkflowRecord) -> StepResult:
        deps = self.deps
        asg = str(record.details.asg)
        group = deps.scaler.describe_group(asg)
        desired_now = group.sizes.desired
        if record.instance_id in group.in_service:
            if self.ops.now() >= record.deadline + timedelta(minutes=5):
                return self.ops.end(record, "failed", "instance_still_in_service", step="verify")
            return self.ops.next(
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
        return self.ops.end(
            record,
            "succeeded",
            f"removed {record.instance_id} from {asg}{note}",
            step="verify",
            savings=saved,
        )
