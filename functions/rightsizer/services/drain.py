"""The scale-in (docs/architecture.md §4): validate → approval → cordon → revalidate → evict → wait →
remove → verify, the drain's own steps (:mod:`rightsizer.services.workflow.drain_steps`) and the removal
of the instance from its group; off-hours runs it too (``DrainRequest.offhours``).

Each step is a small idempotent function over the ports: it is handed the persisted ``WorkflowRecord``,
re-checks its preconditions on fresh state (a plan is a hint, not an order), acts at most once, saves the
record *before* returning, and names the next step. The in-process runner (CLI, demo, tests) and the Step
Functions state machine (Lambda ``drain``) both call :meth:`Executor.step`, so a drain that outlives one
Lambda invocation resumes where it stopped (BUG-32). Any failure after the cordon rolls back: our cordon
is undone, nothing is scaled, and the reason is recorded (BUG-14, BUG-21, BUG-31).
"""

from __future__ import annotations

from collections.abc import Mapping

from rightsizer.domain.eligibility import DrainFacts, DrainMode, Judged
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import ScaleInDetails
from rightsizer.services.workflow.drain_steps import POLL_S as POLL_S
from rightsizer.services.workflow.drain_steps import UNCORDON_ATTEMPTS as UNCORDON_ATTEMPTS
from rightsizer.services.workflow.drain_steps import UNCORDON_PENDING as UNCORDON_PENDING
from rightsizer.services.workflow.drain_steps import DrainRules, DrainSteps
from rightsizer.services.workflow.engine import FINAL_STATUSES as FINAL_STATUSES
from rightsizer.services.workflow.engine import StepFn
from rightsizer.services.workflow.engine import StepResult as StepResult
from rightsizer.services.workflow.executor import Executor
from rightsizer.services.workflow.record_ops import drain_details
from rightsizer.services.workflow.requests import DrainDeps as DrainDeps
from rightsizer.services.workflow.requests import DrainRequest as DrainRequest
from rightsizer.state import WorkflowRecord

KIND = "scale_in"


def scale_in_facts(
    record: WorkflowRecord, report: NodeReport | None, asg: str | None, policy: Policy
) -> DrainFacts:
    """The scale-in's eligibility facts (``domain.eligibility``, the planner's rule): mode ``offhours`` for
    an off-hours drain; a drain the plan started shrinks its group anyway (issue 28: unhealthy nodes go
    first)."""
    mode: DrainMode = "offhours" if drain_details(record).offhours else "scale_in"
    shrinking = record.details.trigger == "schedule"
    return DrainFacts(Judged.of(report), asg, mode, record.execution_id, shrinking=shrinking)


#: How a scale-in drains: the drain's eligibility, then the instance's removal.
RULES = DrainRules(facts=scale_in_facts, after_drain="remove")


class ScaleIn:
    """The scale-in kind: its record (``ScaleInDetails``), its step table, its rollback (an uncordon)."""

    name = KIND
    request_type = DrainRequest

    def __init__(self, deps: DrainDeps) -> None:
        self.deps = deps
        self.drain = DrainSteps(deps, RULES)

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the workflow record (idempotent: an existing record of that execution is returned)."""
        return self.drain.ops.create(
            request,
            ScaleInDetails(
                trigger=request.trigger,
                offhours=request.offhours,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
            ),
        )

    def steps(self) -> Mapping[str, StepFn]:
        """validate → approval → cordon → revalidate → evict → wait → remove → verify, and ``rollback``
        (an uncordon retried)."""
        d = self.drain
        return {
            "validate": d.validate,
            "approval": d.approval,
            "cordon": d.cordon,
            "revalidate": d.revalidate,
            "evict": d.evict,
            "wait": d.wait,
            "remove": d.remove,
            "verify": d.verify,
            "rollback": d.retry_rollback,
        }

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """The drain's rollback: our cordon undone, nothing scaled (:meth:`DrainSteps.rollback`)."""
        return self.drain.rollback(execution_id, reason, status=status, step=step)

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """The drain's approval request (:meth:`DrainSteps.request_approval`)."""
        return self.drain.request_approval(execution_id, task_token)


class DrainWorkflow(Executor):
    """The executor of scale-in drains (and off-hours' ones): :class:`Executor` with :class:`ScaleIn`."""

    def __init__(self, deps: DrainDeps) -> None:
        super().__init__(deps, [ScaleIn(deps)])
