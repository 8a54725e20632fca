"""The workflow engine (issue 25, ``rightsizer.services.workflow.engine``): a record's step comes from its
kind's explicit table; errors map to the outcome (transient: retried, stale: abandoned, permanent: failed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps
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
    workflow = ReplaceWorkflow(DrainDeps(None, None, None, None, Policy()), None)  # type: ignore[arg-type]
    drain = ["validate", "approval", "cordon", "revalidate", "evict", "wait"]
    assert list(workflow.steps("scale_in")) == [*drain, "remove", "verify", "rollback"]
    resize = workflow.steps(RESIZE)
    assert list(resize) == [*drain, "stop", "stopped", "set_type", "start", "ready", "uncordon", "rollback"]
    assert resize["validate"].__qualname__ == "Resize.validate"  # its own, not the drain's
    assert resize["evict"].__qualname__ == "DrainSteps.evict"  # the drain's, composed
    assert list(workflow.steps(CHILD_KIND)) == [*drain, "drained", "rollback"]
    assert list(workflow.steps(KIND)) == [
        "ng_validate", "ng_create", "ng_created", "ng_ready", "ng_drain", "ng_scale_old", "ng_gone", "ng_delete_old",
    ]  # fmt: skip


def test_no_workflow_inherits_from_another_and_no_step_checks_a_kind() -> None:
    """Issue 25: each kind is its own module; what kinds share is composed (the drain's steps)."""
    import inspect
    import re

    from rightsizer.services import consolidate, drain, replace, replace_drain, resize
    from rightsizer.services.workflow import drain_steps, evict_steps

    kinds = {
        drain.ScaleIn,
        consolidate.Consolidate,
        resize.Resize,
        replace.Replace,
        replace_drain.ReplaceDrain,
    }
    for kind in kinds:
        assert kind.__bases__ == (object,), kind
    for module in (consolidate, drain, replace, replace_drain, resize, drain_steps, evict_steps):
        source = inspect.getsource(module)
        # A record's kind picks its table in the executor; no step branches on it.
        assert not re.search(
            r"details\.kind\s*[!=]=|_kind\(record\)|_is_resize|details\.get\(.kind", source
        ), module
