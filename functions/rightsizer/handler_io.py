"""Shared plumbing of the Lambda handlers (docs/architecture.md §6, style guide "Handlers (≤ 15 lines)").

The handlers ask :func:`rightsizer.wiring.lambda_runtime` for their use cases; this module holds what is
left between an event and a use case:

- the event models: :class:`ScheduledTick` (the EventBridge Scheduler ``Input``) and the drain state
  machine's task payloads (:data:`DrainTask`);
- :func:`run_drain_task` — one state machine task → one ``Executor`` call → the JSON the ASL reads;
- :func:`drain_metrics` — the EMF milestones of one drain task;
- :func:`traced` — X-Ray only when ``RIGHTSIZER_TRACING=true`` (the Tracer costs ~0.7 s of import).

Nothing here imports boto3, Kubernetes, Powertools utilities, the domain model or the composition root
at import time: a handler module loads in a fraction of ``import boto3``, and what a request needs is
imported by the request (issue 33; ``tests/unit/test_handler_imports.py`` holds every handler to it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar, cast

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from rightsizer.domain.errors import TransientError

if TYPE_CHECKING:
    from rightsizer.domain.showback import Showback
    from rightsizer.services.drain import StepResult
    from rightsizer.services.workflow.executor import Executor

__all__ = [
    "METRICS_NAMESPACE",
    "AnyDrainTask",
    "DrainTask",
    "RequestApprovalTask",
    "RollbackTask",
    "ScheduledTick",
    "StartTask",
    "StepTask",
    "drain_metrics",
    "drain_workflow",
    "emit_dimensioned",
    "parse_drain_task",
    "run_drain_task",
    "showback_metrics",
    "traced",
    "use_drain_workflow",
]


#: CloudWatch namespace of every EMF metric.
METRICS_NAMESPACE: Final = "GPURightsizer"

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------------------------------
# The drain handler's workflow
# --------------------------------------------------------------------------------------------------

_workflow_override: list[Executor] = []


def use_drain_workflow(workflow: Executor | None) -> None:
    """Make the drain handler use ``workflow`` (the ASL interpreter test over in-memory fakes, a local
    runner); ``None`` goes back to building it from the environment."""
    _workflow_override[:] = [] if workflow is None else [workflow]


def drain_workflow() -> Executor:
    """The drain handler's workflow: the injected one, else the warm runtime's (around the current policy)."""
    if _workflow_override:
        return _workflow_override[0]
    from rightsizer.wiring import lambda_runtime

    return lambda_runtime().drain_workflow()


# --------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------


class ScheduledTick(BaseModel):
    """The EventBridge Scheduler ``Input`` of docs/architecture.md §6: ``<aws.scheduler.scheduled-time>`` (RFC 3339 UTC)
    and ``<aws.scheduler.execution-id>`` (stable across the retries of one invocation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduled_time: AwareDatetime
    execution_id: str = Field(min_length=1)


class DrainRequestModel(BaseModel):
    """The drain state machine's execution input: a ``DrainRequest`` as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1)
    execution_id: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9._-]+$")
    trigger: str = "schedule"
    hourly_savings_usd: float | None = None
    offhours: bool = False
    target_type: str | None = Field(
        None,
        min_length=1,
        description="Set for a resize of a standalone instance, or with nodegroup for a node group replacement.",
    )
    nodegroup: str | None = Field(
        None, min_length=1, description="Set for a managed node group replacement (issue 17)."
    )
    resume: int = Field(
        0,
        ge=0,
        description="The healer's n-th restart of a resize that died after its stop (its record exists).",
    )
    moves: list[tuple[str, str]] = Field(
        default_factory=list,
        description="Set for a consolidation (issue 29): the plan's (pod namespace/name, node) moves.",
    )

    @model_validator(mode="after")
    def _replacement_names_its_type(self) -> DrainRequestModel:
        if self.nodegroup is not None and self.target_type is None:
            raise ValueError("a node group replacement (nodegroup) needs target_type")
        if self.resume and (self.target_type is None or self.nodegroup is not None):
            raise ValueError("resume restarts a resize: it needs target_type and no nodegroup")
        return self


class StartTask(BaseModel):
    """State ``Start``: create the workflow record from the execution input (idempotent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["start"]
    request: DrainRequestModel


class StepTask(BaseModel):
    """State ``Step``: run the record's current step once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["step"]
    execution_id: str = Field(min_length=1)


class StateError(BaseModel):
    """A Catch's ``{"Error", "Cause"}``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    Error: str = "States.ALL"
    Cause: str = ""


class RollbackTask(BaseModel):
    """State ``Rollback``: a step failed after its retries; undo our cordon, never scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["rollback"]
    execution_id: str = Field(min_length=1)
    error: StateError | None = None


class RequestApprovalTask(BaseModel):
    """State ``AwaitApproval`` (``lambda:invoke.waitForTaskToken``): open and publish the approval
    request; the execution then waits until a decision sends the task token back (or the timeout)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["request_approval"]
    execution_id: str = Field(min_length=1)
    task_token: str = Field(min_length=1)


AnyDrainTask = StartTask | StepTask | RollbackTask | RequestApprovalTask
DrainTask = Annotated[AnyDrainTask, Field(discriminator="action")]
_DRAIN_TASK: TypeAdapter[AnyDrainTask] = TypeAdapter(DrainTask)


def parse_drain_task(event: Mapping[str, Any]) -> AnyDrainTask:
    """Validate a drain state machine task payload (``action`` = ``start`` | ``step`` | ``rollback`` |
    ``request_approval``)."""
    return _DRAIN_TASK.validate_python(event)


def _output(result: StepResult) -> dict[str, Any]:
    # Wait.SecondsPath needs a non-negative integer; round up so a poll never comes early.
    return {
        "execution_id": result.execution_id,
        "step": result.step,
        "next_step": result.next_step,
        "status": result.status,
        "wait_seconds": math.ceil(result.wait_seconds),
        "message": result.message,
    }


def run_drain_task(workflow: Executor, task: AnyDrainTask) -> dict[str, Any]:
    """Run one state machine task and return the fields the ASL's ``ResultSelector`` reads.

    Raises:
        TransientError: exactly that class (its name is the ``Error`` the ASL's Retry matches), whatever
            subclass the adapter raised; the record is unchanged, so the retry runs the same step.
    """
    from rightsizer.services.consolidate import ConsolidateRequest
    from rightsizer.services.drain import FINAL_STATUSES, DrainRequest, StepResult
    from rightsizer.services.replace import ReplaceRequest
    from rightsizer.services.resize import ResizeRequest

    try:
        if isinstance(task, StartTask):
            fields = task.request.model_dump()
            target, nodegroup = fields.pop("target_type"), fields.pop("nodegroup")
            resume = fields.pop("resume")
            moves = tuple(tuple(m) for m in fields.pop("moves"))
            request: DrainRequest
            if moves:
                request = ConsolidateRequest(**fields, moves=moves)
            elif nodegroup is not None:
                request = ReplaceRequest(**fields, nodegroup=nodegroup, target_type=str(target))
            elif target is not None:
                request = ResizeRequest(**fields, target_type=target, resume=resume)
            else:
                request = DrainRequest(**fields)
            record = workflow.start(request)
            running = record.status not in FINAL_STATUSES
            nxt = record.step if running else None
            return _output(StepResult(record.execution_id, "start", nxt, record.status, 0.0, "started"))
        if isinstance(task, RequestApprovalTask):
            return _output(workflow.request_approval(task.execution_id, task.task_token))
        if isinstance(task, StepTask):
            result = workflow.step(task.execution_id)
            output = _output(result)
            if result.finished and result.status == "succeeded":
                saved = workflow.deps.state.load(task.execution_id)
                output["hourly_savings_usd"] = saved.details.get("hourly_savings_usd") if saved else None
            return output
        error = task.error or StateError()
        reason = f"failed:{error.Error}:{error.Cause[:200]}".rstrip(":")
        try:
            return _output(workflow.rollback(task.execution_id, reason, status="failed"))
        except KeyError:
            return _output(
                StepResult(task.execution_id, "rollback", None, "failed", 0.0, "no workflow record")
            )
    except TransientError as exc:
        if type(exc) is TransientError:
            raise
        raise TransientError(f"{type(exc).__name__}: {exc}", retry_after=exc.retry_after) from exc


# --------------------------------------------------------------------------------------------------
# Observability
# --------------------------------------------------------------------------------------------------


def drain_metrics(output: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """EMF metrics ``(name, unit, value)`` of one drain task's output: the milestones — node cordoned,
    drained, removed (with the USD/h it saves) — and the failure classes the template's alarms watch:
    ``DrainsRolledBack`` (status ``rolled_back``), ``DrainsFailed`` (``failed``) and ``RollbackFailures``
    (a rollback that could not undo our cordon, ``services.drain.UNCORDON_PENDING`` in its message)."""
    from rightsizer.services.drain import UNCORDON_PENDING

    step, nxt, status = output.get("step"), output.get("next_step"), output.get("status")
    found: list[tuple[str, str, float]] = []
    if step == "cordon" and nxt == "revalidate":
        found.append(("NodesCordoned", "Count", 1.0))
    if step == "wait" and nxt == "remove":
        found.append(("NodesDrained", "Count", 1.0))
    if nxt is None and status == "succeeded":
        found.append(("NodesRemoved", "Count", 1.0))
        found.append(("SavedUsdPerHour", "None", float(output.get("hourly_savings_usd") or 0.0)))
    if nxt is None and status == "rolled_back":
        found.append(("DrainsRolledBack", "Count", 1.0))
    if nxt is None and status == "failed":
        found.append(("DrainsFailed", "Count", 1.0))
    if nxt is None and UNCORDON_PENDING in str(output.get("message") or ""):
        found.append(("RollbackFailures", "Count", 1.0))
    return found


def showback_metrics(cluster: str, showback: Showback | None) -> list[dict[str, Any]]:
    """The assessment's showback as EMF metrics for :func:`emit_dimensioned`: ``IdleGpuHeldUsdPerHour``
    (USD per hour of GPUs held idle, ``domain.showback``) for the cluster, then one per namespace and one
    per team (dimension ``namespace`` / ``team``). The cluster's total is sent even when 0, so the
    dashboard's line drops to 0 instead of ending."""
    rows = (
        [("namespace", r) for r in showback.by_namespace] + [("team", r) for r in showback.by_team]
        if showback is not None
        else []
    )
    total = sum(r.hourly_usd for r in showback.by_namespace) if showback is not None else 0.0
    base = {"name": "IdleGpuHeldUsdPerHour", "unit": "None"}
    return [
        {**base, "value": round(total, 6), "dimensions": {"cluster": cluster}},
        *({**base, "value": r.hourly_usd, "dimensions": {"cluster": cluster, dim: r.key}} for dim, r in rows),
    ]


def emit_dimensioned(service: str, metric: Mapping[str, Any]) -> None:
    """Print one EMF document for ``metric`` (``{"name", "unit", "value", "dimensions"}``) with its own
    dimensions plus ``service`` — a series per node group, beside the handler's per-cluster total that
    the alarms watch (an EMF document has one set of dimension values)."""
    from aws_lambda_powertools.metrics import single_metric

    dimensions = {"service": service, **{str(k): str(v) for k, v in metric.get("dimensions", {}).items()}}
    with single_metric(
        name=str(metric["name"]),
        unit=metric["unit"],
        value=float(metric["value"]),
        namespace=METRICS_NAMESPACE,
        default_dimensions=dimensions,
    ):
        pass


def traced(handler: F) -> F:
    """Wrap ``handler`` with Powertools Tracer only when ``RIGHTSIZER_TRACING`` is true (decided at import
    of the handler module, i.e. once per cold start); otherwise return it unchanged, Tracer not imported."""
    if os.environ.get("RIGHTSIZER_TRACING", "").strip().lower() not in ("1", "true", "yes", "on"):
        return handler
    from aws_lambda_powertools import Tracer

    return cast(F, Tracer().capture_lambda_handler(handler))


def tick_time(tick: ScheduledTick) -> datetime:
    """The tick's instant as an aware datetime (the handlers' ``now``: time comes from the event)."""
    return tick.scheduled_time
