"""The workflow engine (issue 25, ``rightsizer.services.workflow.engine``): a record's step comes from its
kind's explicit table; errors map to the outcome (transient: retried, stale: abandoned, permanent: failed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.services.drain import DrainWorkflow
from rightsizer.services.replace import CHILD_KIND, KIND, ReplaceWorkflow
from rightsizer.services.resize import KIND as RESIZE
from rightsizer.services.workflow.engine import StepResult, run_step
from rightsizer.state import WorkflowRecord
from tests.builders import AT

RECORD = WorkflowRecord("exec-1", "gpu-1", None, "evict", "running", AT, AT + timedelta(minutes=30))


def rollback(
    execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
) -> StepResult:
    return StepResult(execution_id, step, None, status, 0.0, reason)


def raising(error: Exception) -> dict[str, object]:
    def step(_record: WorkflowRecord) -> StepResult:
        raise error

    return {"evict": step}


def test_the_step_comes_from_the_table() -> None:
    done = StepResult("exec-1", "evict", "wait", "running")
    assert run_step(RECORD, {"evict": lambda _r: done}, rollback) is done


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (StalePlan("cancelled"), "abandoned", "stale:cancelled"),
        (PermanentError("eviction_unsupported"), "failed", "failed:eviction_unsupported"),
    ],
)
def test_errors_map_to_the_outcome(error: Exception, status: str, reason: str) -> None:
    result = run_step(RECORD, raising(error), rollback)  # type: ignore[arg-type]
    assert (result.status, result.message, result.step) == (status, reason, "evict")


def test_a_transient_error_leaves_the_step_to_be_retried() -> None:
    with pytest.raises(TransientError):
        run_step(RECORD, raising(TransientError("429")), rollback)  # type: ignore[arg-type]


def test_an_unknown_step_fails_and_a_finished_record_stays_finished() -> None:
    assert run_step(RECORD, {}, rollback).message == "failed:unknown_step:evict"
    ended = WorkflowRecord("exec-1", "gpu-1", None, "done", "succeeded", AT, AT)
    assert run_step(ended, {}, rollback).message == "already finished"


def test_each_kind_has_an_explicit_table() -> None:
    """The tables name every step a record of that kind can be in (no name built from the step)."""
    workflow = ReplaceWorkflow.__new__(ReplaceWorkflow)
    drain = list(DrainWorkflow.steps(workflow, "scale_in"))
    assert drain == [
        "validate",
        "approval",
        "cordon",
        "revalidate",
        "evict",
        "wait",
        "remove",
        "verify",
        "rollback",
    ]
    assert list(workflow.steps(RESIZE))[len(drain) :] == [
        "stop",
        "stopped",
        "set_type",
        "start",
        "ready",
        "uncordon",
    ]
    assert workflow.steps(RESIZE)["validate"] == workflow._step_resize_validate
    assert list(workflow.steps(CHILD_KIND)) == [*drain, "drained"]
    assert list(workflow.steps(KIND)) == [
        "ng_validate", "ng_create", "ng_created", "ng_ready", "ng_drain", "ng_scale_old", "ng_gone", "ng_delete_old",
    ]  # fmt: skip
