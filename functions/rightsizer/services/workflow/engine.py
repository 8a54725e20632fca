"""One workflow engine (issue 25, docs/architecture.md §4): run a record's current step from its kind's
explicit step table and map the step's errors to the workflow's outcome.

A workflow kind (drain, resize, node group replacement and its child drains) declares its steps as a
table, step name → step function, chosen by the record's kind; the engine never looks a step up by
building a method name. Every step loads nothing itself: the engine hands it the persisted
``WorkflowRecord``; the step re-checks its preconditions on fresh facts, acts at most once, saves the record
*before* returning and names the next step (``StepResult``). The outcome of an error:

- ``TransientError`` propagates: the record is unchanged and the caller (the Step Functions Retry, the
  in-process runner) runs the same step again later;
- ``StalePlan`` (the world moved: the lease is gone, the alert resolved, our cordon vanished) rolls back
  with status ``abandoned`` and reason ``stale:<why>``;
- ``PermanentError`` rolls back with status ``failed`` and reason ``failed:<why>``.

The Lambda task contract and the state machine definitions are unchanged: they call the workflow's
``step(execution_id)``, which loads the record and calls :func:`run_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.state import WorkflowRecord

#: Statuses of a workflow that ended.
FINAL_STATUSES = frozenset({"succeeded", "abandoned", "rolled_back", "failed", "dry_run"})


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step: ``next_step`` None when the workflow ended with ``status``; otherwise run
    ``next_step`` after ``wait_seconds`` (the Step Functions Wait state, or a sleep in-process)."""

    execution_id: str
    step: str
    next_step: str | None
    status: str
    wait_seconds: float = 0.0
    message: str = ""
    #: The workflow's kind (``scale_in``, ``consolidate``, ``resize_instance``, ...), stamped by the
    #: executor so progress lines name it; "" when no record was read.
    kind: str = ""

    @property
    def finished(self) -> bool:
        """True when the workflow ended."""
        return self.next_step is None


#: A step function: runs one step of the record, persists, returns what comes next.
StepFn = Callable[[WorkflowRecord], StepResult]


class Rollback(Protocol):
    """A workflow's rollback: undo what it did, record ``reason`` and end with ``status``."""

    def __call__(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult: ...


def run_step(record: WorkflowRecord, steps: Mapping[str, StepFn], rollback: Rollback) -> StepResult:
    """Run ``record``'s current step from ``steps`` (its kind's table) once.

    Returns:
        The step's result; for a finished record, its status with ``already finished``; for a step the
        table does not hold (a record written by a newer or a broken release), the rollback's result with
        ``failed:unknown_step:<step>``; for details carrying keys this release does not know (kept on
        load, ``rightsizer.domain.workflow_details``), the rollback's with ``failed:unknown_facts:<keys>``:
        nothing is done on facts we do not understand.

    Raises:
        TransientError: the step should be retried later (the record is unchanged).
    """
    if record.status in FINAL_STATUSES:
        return StepResult(record.execution_id, record.step, None, record.status, 0.0, "already finished")
    step = record.step
    unknown = record.details.unknown()
    if unknown:
        return rollback(
            record.execution_id, "failed:unknown_facts:" + ",".join(unknown), status="failed", step=step
        )
    handler = steps.get(step)
    if handler is None:
        return rollback(record.execution_id, f"failed:unknown_step:{step}", status="failed", step=step)
    try:
        return handler(record)
    except TransientError:
        raise
    except StalePlan as exc:
        return rollback(record.execution_id, f"stale:{exc}", status="abandoned", step=step)
    except PermanentError as exc:
        return rollback(record.execution_id, f"failed:{exc}", status="failed", step=step)
