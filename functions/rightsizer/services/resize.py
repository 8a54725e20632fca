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
from rightsizer.domain.drivers import driver_check
from rightsizer.domain.eligibility import (
    RESIZE_GUARDS,
    Judged,
    ResizeFacts,
    first_refusal_message,
    resize_assessment,
)
from rightsizer.domain.errors import PermanentError, RightsizerError, TransientError
from rightsizer.domain.model import ANN_CORDONED_BY, GPU_RESOURCE, Node
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import ResizeDetails
from rightsizer.ports import InstanceTypeChanger
from rightsizer.services.drain import POLL_S, DrainDeps, DrainRequest, DrainWorkflow, StepResult
from rightsizer.services.workflow.engine import StepFn
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


def resize_details(record: WorkflowRecord) -> ResizeDetails:
    """The details of a resize record.

    Raises:
        PermanentError: the record is of another kind.
    """
    if not isinstance(record.details, ResizeDetails):
        raise PermanentError(f"not_a_resize_record:{record.details.kind}")
    return record.details


def resize_facts(
    report: NodeReport | None,
    execution_id: str,
    policy: Policy,
    catalog: Catalog,
    *,
    in_group: bool,
    tags: Mapping[str, str],
    state: str,
    current_type: str,
    target_type: str,
    labels: Mapping[str, str],
) -> ResizeFacts:
    """The resize eligibility's facts (``domain.eligibility.ResizeFacts``) from fresh reads: the
    assessor's report, EC2 DescribeInstances (tags, state, type), Auto Scaling membership and the Node."""
    return ResizeFacts(
        judged=Judged.of(report),
        allow_resize=policy.allow_resize,
        in_group=in_group,
        tags=tags,
        state=state,
        current=catalog.get(current_type),
        current_type=current_type,
        target_type=target_type,
        target=catalog.get(target_type),
        labels=labels,
        driver_minimums=catalog.driver_minimums,
        allow_unknown_driver=policy.resize_allow_unknown_driver,
        allow_instance_store_loss=policy.resize_allow_instance_store_loss,
        execution_id=execution_id,
    )


def driver_summary(facts: ResizeFacts) -> str:
    """``code: detail`` of the driver rule that let the resize pass (recorded in the workflow's details)."""
    assert facts.target is not None
    check = driver_check(
        facts.current.gpu_model if facts.current else None,
        facts.target.gpu_model,
        facts.target.gpu_manufacturer,
        facts.labels,
        facts.driver_minimums,
        allow_unknown=facts.allow_unknown_driver,
    )
    return f"{check.code}: {check.detail}"


def resize_blockers(report: NodeReport | None, execution_id: str) -> list[str]:
    """Reasons a fresh report forbids resizing (the ``assessment`` guard of
    ``domain.eligibility.RESIZE_GUARDS``): not a GPU node, excluded, unknown metrics (never act on missing
    data), a protection other than our own cordon, or no cheaper shape fitting any more (verdict other than
    ``underutilized``). Busy reasons are what a resize is for, so they pass, and so do idle GPU holders: on
    a busy node they are the workload the resize moves (the eviction API still applies)."""
    return [r.reason for r in resize_assessment(Judged.of(report), execution_id)]


class ResizeWorkflow(DrainWorkflow):
    """The drain workflow that also resizes: records started from a :class:`ResizeRequest` run the resize
    steps, every other record runs the drain exactly as :class:`DrainWorkflow` does.

    Args:
        deps: the drain's dependencies (cluster, scaler, assessor, state, policy, dry run, clock).
        changer: the EC2 calls; None leaves resizes refused (``resize_not_configured``).
        catalog: instance types (GPU counts, prices); the packaged one by default.
    """

    def __init__(
        self, deps: DrainDeps, changer: InstanceTypeChanger | None, catalog: Catalog | None = None
    ) -> None:
        super().__init__(deps)
        self.changer = changer
        self.catalog = catalog or load_catalog()

    # ------------------------------------------------------------------------------------ hooks

    @staticmethod
    def _is_resize(record: WorkflowRecord) -> bool:
        return isinstance(record.details, ResizeDetails)

    def _still_candidate(self, record: WorkflowRecord, report: NodeReport | None) -> tuple[bool, list[str]]:
        if not self._is_resize(record):
            return super()._still_candidate(record, report)
        blocking = resize_blockers(report, record.execution_id)
        return not blocking, blocking

    def _holders_block(self, record: WorkflowRecord) -> bool:
        # The workload of a busy node is what a resize moves; the eviction API and its PDBs still apply.
        return False if self._is_resize(record) else super()._holders_block(record)

    def _after_drain(self, record: WorkflowRecord) -> str:
        return "stop" if self._is_resize(record) else super()._after_drain(record)

    def _changer(self) -> InstanceTypeChanger:
        if self.changer is None:
            raise PermanentError("resize_not_configured")
        return self.changer

    # ------------------------------------------------------------------------------------ entry

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the record; a :class:`ResizeRequest` makes a resize record (idempotent like the drain's)."""
        if not isinstance(request, ResizeRequest):
            return super().start(request)
        existing = self.deps.state.load(request.execution_id)
        if existing is not None:
            if request.resume and self._is_resize(existing) and existing.status == "running":
                return self._resume(existing, request.resume)
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
            details=ResizeDetails(
                kind=KIND,
                trigger=request.trigger,
                offhours=False,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
                target_type=request.target_type,
            ),
        )
        return self.deps.state.save(record, expected_version=0)

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
            or lease.expired(self._now())
        ):
            log.warning("resize %s: restart %d superseded (lease %s)", record.execution_id, epoch, lease)
            return replace(record, status="abandoned")
        if record.lease_epoch != epoch:
            why = f"workflow died at step {record.step}; restarted by the healer (lease epoch {epoch})"
            resumes = resize_details(record).resumes + 1
            record = self._save(
                record, lease_epoch=epoch, details=resize_details(record).but(resumes=resumes)
            )
            self._ledger(record, f"heal:{epoch}", "applied", f"resumed: {why}")
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
            return super().rollback(execution_id, reason, status=status, step=step)
        if record.status != "running":
            return StepResult(execution_id, step, None, record.status, 0.0, "already finished")
        if resize_details(record).restoring:
            # A failure while restoring: keep trying the restore from where it stands.
            if self._now() <= self._deadline(record) + timedelta(seconds=self.deps.policy.resize_timeout):
                return self._next(record, step, "stopped", wait=POLL_S, message=f"restoring after: {reason}")
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
            return self._next(record, step, "stopped", wait=RESTORE_RETRY_S, message=f"retrying: {message}")
        return self._restore(record, reason, step=step)

    # ------------------------------------------------------------------------------------ steps

    def steps(self, kind: str) -> Mapping[str, StepFn]:
        """A resize record's step table: the drain's, its own validate, and after the drain (wait) stop →
        stopped → set_type → start → ready → uncordon; any other kind's is the drain's."""
        if kind != KIND:
            return super().steps(kind)
        return {
            **super().steps(kind),
            "validate": self._step_resize_validate,
            "stop": self._step_stop,
            "stopped": self._step_stopped,
            "set_type": self._step_set_type,
            "start": self._step_start,
            "ready": self._step_ready,
            "uncordon": self._step_uncordon,
        }

    def _step_resize_validate(self, record: WorkflowRecord) -> StepResult:
        deps, now, policy = self.deps, self._now(), self.deps.policy
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is None:
            return self._end(record, "abandoned", "node_not_found", step="validate")
        node = Node.model_validate(node_obj)
        lease = deps.state.acquire(record.node, record.execution_id, now, self._ttl)
        if lease is None:
            return self._end(record, "abandoned", "lease_held_by_other", step="validate")
        record = self._save(record, lease_epoch=lease.epoch, instance_id=node.instance_id)
        if node.spec.unschedulable and node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
            return self._end(record, "abandoned", "cordoned_by_other", step="validate")
        if node.instance_id is None:
            return self._end(record, "abandoned", "node_group_unknown:no_provider_id", step="validate")
        if self.changer is None:
            return self._end(record, "abandoned", "resize_not_configured", step="validate")
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
            return self._end(record, "abandoned", refusal, step="validate")
        assert target_row is not None
        try:
            self.changer.preflight(
                node.instance_id, target, allow_instance_store_loss=policy.resize_allow_instance_store_loss
            )
        except TransientError:
            raise
        except PermanentError as exc:
            return self._end(record, "abandoned", f"preflight:{exc}", step="validate")
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
            return self._end(
                record, "abandoned", getattr(slot, "reason", "disruption_budget_exhausted"), step="validate"
            )
        pods, blocked = self._classify(*self._pods_and_budgets(record.node), record)
        if blocked:
            return self._end(record, "abandoned", "protected:" + ",".join(blocked), step="validate")
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
        record = self._save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would cordon {record.node}, evict {len(pods)} pod(s), stop {node.instance_id}, "
                f"change its type {facts.instance_type} -> {target} and start it"
            )
            return self._end(record, "dry_run", message, step="validate")
        return self._validated(record, report, f"validated; {len(pods)} pod(s) to evict")

    def _step_stop(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        deps = self.deps
        node_obj = deps.cluster.get_node(record.node)
        if node_obj is not None:
            node = Node.model_validate(node_obj)
            if node.metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id:
                return self.rollback(record.execution_id, "our cordon is gone; refusing to stop", step="stop")
            pods, _ = self._classify(deps.cluster.list_pods_on_node(record.node), [], record, live=False)
            if pods:
                return self._next(record, "stop", "evict", message="pods appeared; evicting again")
        instance = record.instance_id
        assert instance is not None
        deadline = self._now() + timedelta(seconds=deps.policy.resize_timeout)
        # Persisted before the call: from here on every failure restores the original type.
        record = self._save(
            record, details=resize_details(record).but(stopping=True, resize_deadline=deadline)
        )
        self._changer().stop(instance)
        deps.cluster.emit_event(
            record.node, "Resizing", f"rightsizer stopped {record.instance_id} to resize it"
        )
        return self._next(record, "stop", "stopped", wait=POLL_S, message=f"stopping {record.instance_id}")

    def _step_stopped(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        assert record.instance_id is not None
        state = self._changer().describe(record.instance_id).state
        if state == "stopped":
            return self._next(record, "stopped", "set_type", message=f"{record.instance_id} stopped")
        if state in ("running", "pending") and resize_details(record).restoring:
            return self._next(record, "stopped", "ready", wait=POLL_S, message="running again")
        if state == "running":
            self._changer().stop(record.instance_id)
        if self._now() > self._deadline(record) and not resize_details(record).restoring:
            return self._restore(record, f"deadline: still {state}", step="stopped")
        return self._next(record, "stopped", "stopped", wait=POLL_S, message=f"waiting: {state}")

    def _step_set_type(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
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
        return self._next(record, "set_type", "start", message=f"type set to {want}")

    def _step_start(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        assert record.instance_id is not None
        try:
            self._changer().start(record.instance_id)
        except RightsizerError as exc:
            if resize_details(record).restoring:
                raise  # retried by the runner / the state machine; the rollback keeps restoring
            return self._restore(record, f"start failed: {exc}", step="start")
        want = resize_details(record).want_type
        return self._next(record, "start", "ready", wait=POLL_S, message=f"starting as {want}")

    def _step_ready(self, record: WorkflowRecord) -> StepResult:
        """The Node is back: Ready, labelled with the wanted type, that type's GPUs allocatable."""
        self._renew(record)
        assert record.instance_id is not None
        want = str(resize_details(record).want_type)
        restoring = bool(resize_details(record).restoring)
        facts = self._changer().describe(record.instance_id)
        if facts.state in ("stopping", "stopped"):
            if restoring:
                return self._next(record, "ready", "stopped", wait=POLL_S, message="fell back to stopped")
            return self._restore(record, f"instance {facts.state} after start (capacity)", step="ready")
        missing = self._node_not_ready(record.node, want)
        if not missing:
            return self._next(
                record, "ready", "uncordon", message=f"Node Ready as {want} with GPUs allocatable"
            )
        now, deadline = self._now(), self._deadline(record)
        if now > deadline and not restoring:
            return self._restore(record, f"deadline: {missing}", step="ready")
        if restoring and now > deadline + timedelta(seconds=self.deps.policy.resize_timeout):
            return self._give_up(record, f"restored to {want} but {missing}")
        return self._next(record, "ready", "ready", wait=POLL_S, message=f"waiting: {missing}")

    def _step_uncordon(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        deps = self.deps
        # A Node that re-registered carries no cordon of ours: nothing to undo then.
        deps.cluster.uncordon(record.node, record.execution_id)
        details = resize_details(record)
        original, want, reason = details.original_type, details.want_type, details.restoring
        if reason:
            deps.cluster.emit_event(
                record.node, "RolledBack", f"rightsizer restored {original}: {reason}", warning=True
            )
            return self._end(record, "rolled_back", f"restored {original}: {reason}", step="uncordon")
        deps.cluster.emit_event(
            record.node, "Resized", f"rightsizer resized {record.instance_id} {original} -> {want}"
        )
        return self._end(
            record, "succeeded", f"resized {record.instance_id} {original} -> {want}", step="uncordon"
        )

    # ------------------------------------------------------------------------------------ helpers

    def _deadline(self, record: WorkflowRecord) -> datetime:
        return resize_details(record).resize_deadline or record.deadline

    def _restore(self, record: WorkflowRecord, reason: str, *, step: str) -> StepResult:
        """Go back to the original type: stop (if it runs), set the type, start, wait for the Node."""
        log.warning("resize %s of %s restores %s: %s", record.execution_id, record.node,
                    resize_details(record).original_type, reason)  # fmt: skip
        deadline = self._now() + timedelta(seconds=self.deps.policy.resize_timeout)
        details = resize_details(record)
        details = details.but(restoring=reason, want_type=details.original_type, resize_deadline=deadline)
        assert record.instance_id is not None
        if self._changer().describe(record.instance_id).state in ("running", "pending"):
            self._changer().stop(record.instance_id)
        return self._next(
            record, step, "stopped", wait=POLL_S, details=details, message=f"restoring: {reason}"
        )

    def _give_up(self, record: WorkflowRecord, reason: str) -> StepResult:
        """The restore did not finish: uncordon if it is ours, record ``failed`` (an operator must look)."""
        try:
            self.deps.cluster.uncordon(record.node, record.execution_id)
        except RightsizerError as exc:
            log.error("uncordon of %s failed: %s", record.node, exc)
        self.deps.cluster.emit_event(record.node, "ResizeFailed", f"rightsizer: {reason}", warning=True)
        return self._end(record, "failed", reason, step="ready")

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
