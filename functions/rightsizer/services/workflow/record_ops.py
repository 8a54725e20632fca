"""What every workflow step does around its own work: the clock, saving the record, the ledger, the
node lease, ending and moving on (docs/architecture.md §4; formerly the drain workflow's helpers).

A kind that holds more than its node's lease (a node group replacement also holds its new group's)
passes ``also_renew`` / ``also_release``; they run with every renew and before every end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rightsizer.domain.catalog import HOURS_PER_MONTH
from rightsizer.domain.errors import PermanentError, StalePlan
from rightsizer.domain.workflow_details import DrainStepDetails, WorkflowDetails
from rightsizer.services.workflow.engine import StepResult
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
from rightsizer.state import LedgerEntry, WorkflowRecord, lease_ttl_seconds

log = logging.getLogger(__name__)


def drain_details(record: WorkflowRecord) -> DrainStepDetails:
    """The details of a record that runs the drain's steps (every kind but a node group replacement).

    Raises:
        PermanentError: the record is a replacement's (its own steps never reach the drain's).
    """
    if not isinstance(record.details, DrainStepDetails):
        raise PermanentError(f"not_a_drain_record:{record.details.kind}")
    return record.details


class RecordOps:
    """The record operations of one kind's steps.

    Args:
        deps: the workflow's dependencies.
        also_renew: called after each renew of the node lease (the replacement's new group lease).
        also_release: called with each release of the node lease and budget slot.
    """

    def __init__(
        self,
        deps: DrainDeps,
        *,
        also_renew: Callable[[WorkflowRecord], None] | None = None,
        also_release: Callable[[WorkflowRecord], None] | None = None,
    ) -> None:
        self.deps = deps
        self._also_renew = also_renew
        self._also_release = also_release

    def create(
        self,
        request: DrainRequest,
        details: WorkflowDetails,
        *,
        step: str = "validate",
        timeout: float | None = None,
    ) -> WorkflowRecord:
        """The record of ``request`` at ``step`` with ``details``, its deadline ``timeout`` seconds away
        (the drain timeout by default); idempotent: an existing record of that execution is returned."""
        existing = self.deps.state.load(request.execution_id)
        if existing is not None:
            return existing
        now = self.now()
        seconds = self.deps.policy.drain_timeout if timeout is None else timeout
        record = WorkflowRecord(
            execution_id=request.execution_id,
            node=request.node,
            instance_id=None,
            step=step,
            status="running",
            started_at=now,
            deadline=now + timedelta(seconds=seconds),
            details=details,
        )
        return self.deps.state.save(record, expected_version=0)

    @property
    def ttl(self) -> int:
        """The node lease's duration in seconds: the drain timeout + 5 min."""
        return lease_ttl_seconds(timedelta(seconds=self.deps.policy.drain_timeout))

    def now(self) -> datetime:
        """The clock's now, in UTC."""
        return self.deps.clock().astimezone(UTC)

    def save(self, record: WorkflowRecord, **changes: Any) -> WorkflowRecord:
        """Save ``record`` with ``changes`` (``WorkflowRecord`` fields) over the version it was loaded at.

        Raises:
            ConflictError: saved by someone else since.
        """
        return self.deps.state.save(replace(record, **changes), expected_version=record.version)

    def ledger(
        self, record: WorkflowRecord, step: str, result: str, reason: str, *, savings: bool = False
    ) -> None:
        """One ledger line of ``record``'s ``step``; with ``savings``, the record's savings (USD per hour)."""
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
                at=self.now(),
            )
        )

    def renew(self, record: WorkflowRecord) -> None:
        """Renew the node lease (every step does, first).

        Raises:
            StalePlan: no lease held, lost, or its cancel was requested (a resolved alert).
        """
        if record.lease_epoch is None:
            raise StalePlan("no lease held")
        lease = self.deps.state.renew(
            record.node, record.execution_id, record.lease_epoch, self.now(), self.ttl
        )
        if lease.cancel_requested:
            raise StalePlan("cancelled: the alert resolved")
        if self._also_renew is not None:
            self._also_renew(record)

    def release(self, record: WorkflowRecord) -> None:
        """Give back the budget slot and the node lease (and what ``also_release`` gives back)."""
        if self._also_release is not None:
            self._also_release(record)
        self.deps.state.release_slot(record.node, record.execution_id)
        if record.lease_epoch is not None:
            self.deps.state.release(record.node, record.execution_id, record.lease_epoch)

    def end(
        self, record: WorkflowRecord, status: str, reason: str, *, step: str, savings: bool | None = None
    ) -> StepResult:
        """End the workflow with ``status`` and ``reason``: release, save (step ``done``), one ledger line
        (the savings booked when ``savings``, by default when it succeeded)."""
        self.release(record)
        record = self.save(record, status=status, step="done", details=record.details.but(outcome=reason))
        result = {
            "abandoned": "abandoned",
            "dry_run": "dry_run",
            "rolled_back": "rolled_back",
            "failed": "failed",
        }
        booked = status == "succeeded" if savings is None else savings
        self.ledger(record, step, result.get(status, "applied"), reason, savings=booked)
        log.info(
            "%s %s of %s ended %s: %s", record.details.kind, record.execution_id, record.node, status, reason
        )
        return StepResult(record.execution_id, step, None, status, 0.0, reason)

    def next(
        self,
        record: WorkflowRecord,
        step: str,
        nxt: str,
        *,
        wait: float = 0.0,
        message: str = "",
        **changes: Any,
    ) -> StepResult:
        """Save the record at step ``nxt`` (with ``changes``); run it after ``wait`` seconds."""
        self.save(record, step=nxt, **changes)
        return StepResult(record.execution_id, step, nxt, "running", wait, message)
