"""Resize of an opted-in standalone instance (issue 17): the drain's steps, then a type change.

validate → cordon → revalidate → evict → wait (the drain's own steps, leases, budget slots and ledger)
→ stop → stopped → set_type → start → ready → uncordon. Each step is idempotent and persisted before its
side effect, and no step waits: the state machine (the same ``drain.asl.json``) or the in-process runner
waits between them, so EC2's minutes-long stop and start never sit inside one Lambda invocation.

Safety: nothing is cordoned before the compatibility preflight passed (Auto Scaling membership, EBS root,
spot, instance-store loss, architecture, GPUs and their driver family, ENA, NVMe, EFA; and the node's
installed NVIDIA driver against the target GPU's minimum, ``rightsizer.domain.drivers``) and the instance
carries ``rightsizer.io/resize=allowed`` with policy ``allow_resize: true``. Once the instance was
stopped, every failure — insufficient capacity or an unsupported type on start, the instance falling back
to stopped, the Node not Ready with the new type's GPUs allocatable by the deadline — restores: the
original type is set and started, and the workflow ends ``rolled_back`` once the Node is Ready again and
uncordoned. A restore that cannot start the instance keeps trying (every ``RESTORE_RETRY_S`` past its
deadline); only a restored instance whose Node never gets Ready ends ``failed`` (uncordoned, for a person). Savings (old minus new on-demand USD per hour) are booked only when the new type serves.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rightsizer.domain.catalog import Catalog, load_catalog
from rightsizer.domain.eligibility import (
    RESIZE_GUARDS,
    first_refusal_message,
)
from rightsizer.domain.errors import PermanentError, RightsizerError, TransientError
from rightsizer.domain.model import ANN_CORDONED_BY, GPU_RESOURCE, Node
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.workflow_details import ResizeDetails
from rightsizer.ports import InstanceTypeChanger
from rightsizer.services.drain import ScaleIn, scale_in_facts
from rightsizer.services.resize_checks import driver_summary, resize_blockers, resize_details, resize_facts
from rightsizer.services.workflow.drain_steps import POLL_S, DrainRules, DrainSteps
from rightsizer.services.workflow.engine import StepFn, StepResult
from rightsizer.services.workflow.executor import Executor
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
from rightsizer.state import WorkflowRecord

log = logging.getLogger(__name__)

KIND = "resize_instance"
STANDALONE_GROUP = "standalone"
#: Seconds between start attempts of an instance whose restore is past its deadline (it is never left stopped).
RESTORE_RETRY_S = 300.0


@dataclass(frozen=True)
class ResizeRequest(DrainRequest):
    """Resize the standalone instance behind ``node`` to ``target_type`` (the plan's ``resize_instance``).

    ``hourly_savings_usd`` is what the plan priced (USD per hour); the catalog difference when None.
    ``resume`` > 0: the healer's restart of a resize whose workflow died after the stop, naming the lease
    epoch the healer took (:func:`rightsizer.services.healing.heal_dead_resizes`); the record exists.
    """

    target_type: str = ""
    resume: int = 0


def _still_a_resize(record: WorkflowRecord, report: NodeReport | None) -> list[str]:
    return resize_blockers(report, record.execution_id)


#: How a resize drains: the workload of a busy node is what it moves (the eviction API and its PDBs still
#: apply), revalidate re-runs the resize's assessment guard, and the instance is stopped after the drain.
RULES = DrainRules(
    facts=scale_in_facts, after_drain="stop", holders_move=True, still_candidate=_still_a_resize
)


class Resize:
    """The resize kind: the drain's steps with its own validate, then stop → stopped → set_type → start →
    ready → uncordon; after the stop, every failure restores the original type.

    Args:
        deps: the workflow's dependencies (cluster, scaler, assessor, state, policy, dry run, clock).
        changer: the EC2 calls; None leaves resizes refused (``resize_not_configured``).
        catalog: instance types (GPU counts, prices); the packaged one by default.
    """

    name = KIND
    request_type = ResizeRequest

    def __init__(
        self, deps: DrainDeps, changer: InstanceTypeChanger | None, catalog: Catalog | None = None
    ) -> None:
        self.deps = deps
        self.changer = changer
        self.catalog = catalog or load_catalog()
        self.drain = DrainSteps(deps, RULES)
        self.ops = self.drain.ops

    def _changer(self) -> InstanceTypeChanger:
        if self.changer is None:
            raise PermanentError("resize_not_configured")
        return self.changer

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """The drain's approval request."""
        return self.drain.request_approval(execution_id, task_token)

    # ------------------------------------------------------------------------------------ entry

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the resize's record (idempotent: an existing one is returned, or resumed for the healer)."""
        assert isinstance(request, ResizeRequest)
        existing = self.deps.state.load(request.execution_id)
        if existing is not None:
            if (
                request.resume
                and isinstance(existing.details, ResizeDetails)
                and existing.status == "running"
            ):
                return self._resume(existing, request.resume)
            return existing
        return self.ops.create(
            request,
            ResizeDetails(
                kind=KIND,
                trigger=request.trigger,
                offhours=False,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
                target_type=request.target_type,
            ),
        )

    def _resume(self, record: WorkflowRecord, epoch: int) -> WorkflowRecord:
        """Take up a resize whose workflow died after the stop, for the healer that took its lease back
        (epoch ``epoch``; :func:`rightsizer.services.healing.heal_dead_resizes`).

        The record adopts that lease (``lease_epoch``), counts the restart (``resumes``) with a ledger line
        (step ``heal:<epoch>``) and an Event ``ResizeResumed``. A record that had not reached ``ready``
        restores the original type (a dead workflow is rolled back, as a drain's is); one at
        ``ready``/``uncordon`` or already restoring goes on from where it stands, its own deadlines deciding.
        Idempotent: a retried start finds the epoch adopted and ``restoring`` set and changes nothing.

        Returns:
            The record to run; a copy marked ``abandoned`` (not saved) when this restart was superseded —
            the lease is no longer ``epoch`` held for this execution — so its execution ends untouched.
        """
        lease = self.deps.state.get(record.node)
        if (
            lease is None
            or lease.owner != record.execution_id
            or lease.epoch != epoch
            or lease.expired(self.ops.now())
        ):
            log.warning("resize %s: restart %d superseded (lease %s)", record.execution_id, epoch, lease)
            return replace(record, status="abandoned")
        if record.lease_epoch != epoch:
            why = f"workflow died at step {record.step}; restarted by the healer (lease epoch {epoch})"
            resumes = resize_details(record).resumes + 1
            record = self.ops.save(
                record, lease_epoch=epoch, details=resize_details(record).but(resumes=resumes)
            )
            self.ops.ledger(record, f"heal:{epoch}", "applied", f"resumed: {why}")
            self.deps.cluster.emit_event(record.node, "ResizeResumed", f"rightsizer: {why}", warning=True)
            before_ready = record.step in ("stop", "stopped", "set_type", "start")
            if before_ready and not resize_details(record).restoring:
                self._restore(record, why, step=record.step)
        found = self.deps.state.load(record.execution_id)
        assert found is not None
        return found

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """Before the instance was touched: the drain's rollback (uncordon, release). After: restore the
        original type and start it, then uncordon once its Node is Ready (the workflow goes on)."""
        record = self.deps.state.load(execution_id)
        if record is None or not isinstance(record.details, ResizeDetails) or not record.details.stopping:
            return self.drain.rollback(execution_id, reason, status=status, step=step)
        if record.status != "running":
            return StepResult(execution_id, step, None, record.status, 0.0, "already finished")
        if resize_details(record).restoring:
            # A failure while restoring: keep trying the restore from where it stands.
            if self.ops.now() <= self._deadline(record) + timedelta(seconds=self.deps.policy.resize_timeout):
                return self.ops.next(
                    record, step, "stopped", wait=POLL_S, message=f"restoring after: {reason}"
                )
            assert record.instance_id is not None
            if self._changer().describe(record.instance_id).state in ("running", "pending"):
                return self._give_up(record, f"restore failed: {reason}")
            # Never end with the instance stopped (it is the user's): past the restore deadline the start
            # is retried every RESTORE_RETRY_S, the Node stays cordoned, each retry warns on the Node.
            message = (
                f"{record.instance_id} still not running as {resize_details(record).original_type}: {reason}"
            )
            self.deps.cluster.emit_event(
                record.node, "ResizeRestoreRetrying", f"rightsizer: {message}", warning=True
            )
            return self.ops.next(
                record, step, "stopped", wait=RESTORE_RETRY_S, message=f"retrying: {message}"
            )
        return self._restore(record, reason, step=step)

    # ------------------------------------------------------------------------------------ steps

    def steps(self) -> Mapping[str, StepFn]:
        """validate (its own) → approval → cordon → revalidate → evict → wait (the drain's) → stop → stopped →
        set_type → start → ready → uncordon, and ``rollback`` (an uncordon retried, before the stop)."""
        d = self.drain
        return {
            "validate": self.validate,
            "approval": d.approval,
            "cordon": d.cordon,
            "revalidate": d.revalidate,
            "evict": d.evict,
            "wait": d.wait,
            "stop": self.stop,
            "stopped": self.stopped,
            "set_type": self.set_type,
            "start": self.start_instance,
            "ready": self.ready,
            "uncordon": self.uncordon,
            "rollback": d.retry_rollback,
        }

    def validate(self, record: WorkflowRecord) -> StepResult:
        """The resize's eligibility on fresh facts, the EC2 preflight, the lease and a budget slot."""
        return self.drain.invalid_name(record) or self._validate(record)

    def _validate(self, record: WorkflowRecord) -> StepResult:
        deps, now, policy = self.deps, self.ops.now(), self.deps.policy
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is None:
            return self.ops.end(record, "abandoned", "node_not_found", step="validate")
        node = Node.model_validate(node_obj)
        lease = deps.state.acquire(record.node, record.execution_id, now, self.ops.ttl)
        if lease is None:
            return self.ops.end(record, "abandoned", "lease_held_by_other", step="validate")
        record = self.ops.save(record, lease_epoch=lease.epoch, instance_id=node.instance_id)
        if node.spec.unschedulable and node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
            return self.ops.end(record, "abandoned", "cordoned_by_other", step="validate")
        if node.instance_id is None:
            return self.ops.end(record, "abandoned", "node_group_unknown:no_provider_id", step="validate")
        if self.changer is None:
            return self.ops.end(record, "abandoned", "resize_not_configured", step="validate")
        # The plan's own rule on fresh facts (domain.eligibility.resize_refusals): policy, Auto Scaling
        # membership, the fresh assessment, the opt-in tag, the instance's state, the target, instance-store
        # data and the AMI's driver against the target's GPU (issue 17), before any EC2 call or cordon.
        report = deps.assessor.assess_node(record.node, now)
        facts = self.changer.describe(node.instance_id)
        target = resize_details(record).target_type
        current_row, target_row = self.catalog.get(facts.instance_type), self.catalog.get(target)
        eligibility = resize_facts(
            report, record.execution_id, policy, self.catalog,
            in_group=deps.scaler.find_group(node.instance_id) is not None,
            tags=facts.tags, state=facts.state, current_type=facts.instance_type, target_type=target,
            labels=node.labels,
        )  # fmt: skip
        refusal = first_refusal_message(RESIZE_GUARDS, eligibility)
        if refusal is not None:
            return self.ops.end(record, "abandoned", refusal, step="validate")
        assert target_row is not None
        try:
            self.changer.preflight(
                node.instance_id, target, allow_instance_store_loss=policy.resize_allow_instance_store_loss
            )
        except TransientError:
            raise
        except PermanentError as exc:
            return self.ops.end(record, "abandoned", f"preflight:{exc}", step="validate")
        slot = deps.state.take_slot(
            STANDALONE_GROUP,
            record.node,
            record.execution_id,
            now,
            max_per_run=policy.max_nodes_per_run,
            max_per_group=max(1, policy.max_nodes_per_run),
            desired=1,
            min_size=0,
        )
        if not hasattr(slot, "taken_at"):
            return self.ops.end(
                record, "abandoned", getattr(slot, "reason", "disruption_budget_exhausted"), step="validate"
            )
        pods, blocked = self.drain.pods.classify(*self.drain.pods.pods_and_budgets(record.node), record)
        if blocked:
            return self.ops.end(record, "abandoned", "protected:" + ",".join(blocked), step="validate")
        hourly = record.details.hourly_savings_usd
        if hourly is None and current_row and current_row.hourly_usd and target_row.hourly_usd:
            hourly = current_row.hourly_usd - target_row.hourly_usd
        details = resize_details(record).but(
            asg=None,
            node_group=None,
            original_type=facts.instance_type,
            want_type=target,
            validated_pods=sorted(p.metadata.uid for p in pods),
            hourly_savings_usd=hourly,
            driver_check=driver_summary(eligibility),
        )
        record = self.ops.save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would cordon {record.node}, evict {len(pods)} pod(s), stop {node.instance_id}, "
                f"change its type {facts.instance_type} -> {target} and start it"
            )
            return self.ops.end(record, "dry_run", message, step="validate")
        return self.drain.validated(record, report, f"validated; {len(pods)} pod(s) to evict")

    def stop(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        deps = self.deps
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is not None:
            node = Node.model_validate(node_obj)
            if node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
                return self.rollback(record.execution_id, "our cordon is gone; refusing to stop", step="stop")
            pods, _ = self.drain.pods.classify(
                deps.cluster.list_pods_on_node(record.node), [], record, live=False
            )
            if pods:
                return self.ops.next(record, "stop", "evict", message="pods appeared; evicting again")
        instance = record.instance_id
        assert instance is not None
        deadline = self.ops.now() + timedelta(seconds=deps.policy.resize_timeout)
        # Persisted before the call: from here on every failure restores the original type.
        record = self.ops.save(
            record, details=resize_details(record).but(stopping=True, resize_deadline=deadline)
        )
        self._changer().stop(instance)
        deps.cluster.emit_event(
            record.node, "Resizing", f"rightsizer stopped {record.instance_id} to resize it"
        )
        return self.ops.next(record, "stop", "stopped", wait=POLL_S, message=f"stopping {record.instance_id}")

    def stopped(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        assert record.instance_id is not None
        state = self._changer().describe(record.instance_id).state
        if state == "stopped":
            return self.ops.next(record, "stopped", "set_type", message=f"{record.instance_id} stopped")
        if state in ("running", "pending") and resize_details(record).restoring:
            return self.ops.next(record, "stopped", "ready", wait=POLL_S, message="running again")
        if state == "running":
            self._changer().stop(record.instance_id)
        if self.ops.now() > self._deadline(record) and not resize_details(record).restoring:
            return self._restore(record, f"deadline: still {state}", step="stopped")
        return self.ops.next(record, "stopped", "stopped", wait=POLL_S, message=f"waiting: {state}")

    def set_type(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        assert record.instance_id is not None
        want = str(resize_details(record).want_type)
        try:
            self._changer().set_type(record.instance_id, want)
        except TransientError:
            raise
        except PermanentError as exc:
            if resize_details(record).restoring:
                raise
            return self._restore(record, f"modify refused: {exc}", step="set_type")
        return self.ops.next(record, "set_type", "start", message=f"type set to {want}")

    def start_instance(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        assert record.instance_id is not None
        try:
            self._changer().start(record.instance_id)
        except RightsizerError as exc:
            if resize_details(record).restoring:
                raise  # retried by the runner / the state machine; the rollback keeps restoring
            return self._restore(record, f"start failed: {exc}", step="start")
        want = resize_details(record).want_type
        return self.ops.next(record, "start", "ready", wait=POLL_S, message=f"starting as {want}")

    def ready(self, record: WorkflowRecord) -> StepResult:
        """The Node is back: Ready, labelled with the wanted type, that type's GPUs allocatable."""
        self.ops.renew(record)
        assert record.instance_id is not None
        want = str(resize_details(record).want_type)
        restoring = bool(resize_details(record).restoring)
        facts = self._changer().describe(record.instance_id)
        if facts.state in ("stopping", "stopped"):
            if restoring:
                return self.ops.next(record, "ready", "stopped", wait=POLL_S, message="fell back to stopped")
            return self._restore(record, f"instance {facts.state} after start (capacity)", step="ready")
        missing = self._node_not_ready(record.node, want)
        if not missing:
            return self.ops.next(
                record, "ready", "uncordon", message=f"Node Ready as {want} with GPUs allocatable"
            )
        now, deadline = self.ops.now(), self._deadline(record)
        if now > deadline and not restoring:
            return self._restore(record, f"deadline: {missing}", step="ready")
        if restoring and now > deadline + timedelta(seconds=self.deps.policy.resize_timeout):
            return self._give_up(record, f"restored to {want} but {missing}")
        return self.ops.next(record, "ready", "ready", wait=POLL_S, message=f"waiting: {missing}")

    def uncordon(self, record: WorkflowRecord) -> StepResult:
        self.ops.renew(record)
        deps = self.deps
        # A Node that re-registered carries no cordon of ours: nothing to undo then.
        deps.cluster.uncordon(record.node, record.execution_id)
        details = resize_details(record)
        original, want, reason = details.original_type, details.want_type, details.restoring
        if reason:
            deps.cluster.emit_event(
                record.node, "RolledBack", f"rightsizer restored {original}: {reason}", warning=True
            )
            return self.ops.end(record, "rolled_back", f"restored {original}: {reason}", step="uncordon")
        deps.cluster.emit_event(
            record.node, "Resized", f"rightsizer resized {record.instance_id} {original} -> {want}"
        )
        return self.ops.end(
            record, "succeeded", f"resized {record.instance_id} {original} -> {want}", step="uncordon"
        )

    # ------------------------------------------------------------------------------------ helpers

    def _deadline(self, record: WorkflowRecord) -> datetime:
        return resize_details(record).resize_deadline or record.deadline

    def _restore(self, record: WorkflowRecord, reason: str, *, step: str) -> StepResult:
        """Go back to the original type: stop (if it runs), set the type, start, wait for the Node."""
        log.warning("resize %s of %s restores %s: %s", record.execution_id, record.node,
                    resize_details(record).original_type, reason)  # fmt: skip
        deadline = self.ops.now() + timedelta(seconds=self.deps.policy.resize_timeout)
        details = resize_details(record)
        details = details.but(restoring=reason, want_type=details.original_type, resize_deadline=deadline)
        assert record.instance_id is not None
        if self._changer().describe(record.instance_id).state in ("running", "pending"):
            self._changer().stop(record.instance_id)
        return self.ops.next(
            record, step, "stopped", wait=POLL_S, details=details, message=f"restoring: {reason}"
        )

    def _give_up(self, record: WorkflowRecord, reason: str) -> StepResult:
        """The restore did not finish: uncordon if it is ours, record ``failed`` (an operator must look)."""
        try:
            self.deps.cluster.uncordon(record.node, record.execution_id)
        except RightsizerError as exc:
            log.error("uncordon of %s failed: %s", record.node, exc)
        self.deps.cluster.emit_event(record.node, "ResizeFailed", f"rightsizer: {reason}", warning=True)
        return self.ops.end(record, "failed", reason, step="ready")

    def _node_not_ready(self, name: str, want: str) -> str:
        """What is still missing on the Node (empty when it is Ready as ``want`` with its GPUs)."""
        node_obj = self.deps.cluster.get_node(name)
        if node_obj is None:
            return "Node not registered"
        node = Node.model_validate(node_obj)
        if node.instance_type != want:
            return f"Node is {node.instance_type}, not {want}"
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        if not ready:
            return "Node not Ready"
        row = self.catalog.get(want)
        gpus = row.gpu_count if row else 1
        if node.allocatable_count(GPU_RESOURCE) < gpus:
            return f"{node.allocatable_count(GPU_RESOURCE)}/{gpus} GPUs allocatable"
        return ""


class ResizeWorkflow(Executor):
    """The executor of scale-ins and resizes (:class:`Executor` with :class:`ScaleIn` and :class:`Resize`)."""

    def __init__(
        self, deps: DrainDeps, changer: InstanceTypeChanger | None, catalog: Catalog | None = None
    ) -> None:
        super().__init__(deps, [ScaleIn(deps), Resize(deps, changer, catalog)])
