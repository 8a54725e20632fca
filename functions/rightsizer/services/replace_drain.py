"""A node group replacement's child drain (docs/architecture.md §4 "Node group replacement"): one old node
drained through the drain's own steps — validate with its lease and budget slot → cordon → revalidate →
evict → wait — ending at ``drained`` with the node left cordoned until its group scales to 0.

Its eligibility is the drain's in mode ``replace``: busy is fine (the workload is what the replacement
moves, the eviction API and PDBs still apply), and the parent's own ``replacement_in_progress:<parent>``
is no protection. Its budget slot may take the old group to 0 (its MinSize does not bound a replacement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rightsizer.domain.eligibility import DrainFacts, Judged, drain_refusals
from rightsizer.domain.model import ANN_CORDONED_BY, Node
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import ReplaceDrainDetails
from rightsizer.services.workflow.drain_steps import DrainRules, DrainSteps
from rightsizer.services.workflow.engine import StepFn, StepResult
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
from rightsizer.state import WorkflowRecord

KIND = "replace_drain"


@dataclass(frozen=True)
class ReplaceDrainRequest(DrainRequest):
    """Drain ``node`` of the old group for the replacement ``parent`` (its record's execution id)."""

    parent: str = ""


def child_facts(
    report: NodeReport | None, execution_id: str, parent: str, asg: str | None = ""
) -> DrainFacts:
    """The child drain's eligibility facts (``domain.eligibility.DrainFacts`` in mode ``replace``): busy is
    fine, the ``parent`` replacement's own ``replacement_in_progress:<parent>`` is not a protection."""
    return DrainFacts(Judged.of(report), asg, "replace", execution_id, parent)


def child_blockers(report: NodeReport | None, execution_id: str, parent: str = "") -> list[str]:
    """Reasons a fresh report forbids moving an old node's pods (:func:`child_facts`' refusals): not a GPU
    node, excluded, unknown metrics (never act on missing data) or a protection other than those in
    ``domain.eligibility.REPLACE_CHILD_EXEMPT`` and the ``parent`` replacement's own hold."""
    return [r.reason for r in drain_refusals(child_facts(report, execution_id, parent))]


def parent_of(record: WorkflowRecord) -> str:
    """The replacement a child drain works for (its record's ``parent``; empty for another kind)."""
    return record.details.parent if isinstance(record.details, ReplaceDrainDetails) else ""


def _facts(record: WorkflowRecord, report: NodeReport | None, asg: str | None, _policy: Policy) -> DrainFacts:
    return child_facts(report, record.execution_id, parent_of(record), asg)


#: How a child drains: mode ``replace``, idle GPU holders move, the old group may go to 0, ends ``drained``.
RULES = DrainRules(facts=_facts, after_drain="drained", holders_move=True, floor_zero=True)


class ReplaceDrain:
    """The child drain kind: the drain's steps, ending at ``drained`` (the node stays cordoned)."""

    name = KIND
    request_type = ReplaceDrainRequest

    def __init__(self, deps: DrainDeps) -> None:
        self.deps = deps
        self.drain = DrainSteps(deps, RULES)

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the child's record (idempotent: an existing record is returned)."""
        assert isinstance(request, ReplaceDrainRequest)
        return self.drain.ops.create(
            request,
            ReplaceDrainDetails(
                kind=KIND,
                parent=request.parent,
                offhours=False,
                trigger=request.trigger,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
            ),
        )

    def steps(self) -> Mapping[str, StepFn]:
        """validate → approval → cordon → revalidate → evict → wait → drained, and ``rollback``."""
        d = self.drain
        return {
            "validate": d.validate,
            "approval": d.approval,
            "cordon": d.cordon,
            "revalidate": d.revalidate,
            "evict": d.evict,
            "wait": d.wait,
            "drained": self.drained,
            "rollback": d.retry_rollback,
        }

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """The drain's rollback: our cordon undone."""
        return self.drain.rollback(execution_id, reason, status=status, step=step)

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """The drain's approval request."""
        return self.drain.request_approval(execution_id, task_token)

    def drained(self, record: WorkflowRecord) -> StepResult:
        """A child's end: the node is drained and stays cordoned until its group scales to 0."""
        ops = self.drain.ops
        ops.renew(record)
        node_obj = self.deps.cluster.get_node(record.node)
        if (
            node_obj is not None
            and Node.model_validate(node_obj).metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id
        ):
            return self.rollback(record.execution_id, "our cordon is gone", step="drained")
        self.deps.cluster.emit_event(
            record.node, "Drained", f"rightsizer drained the node for {parent_of(record)}; it stays "
            "cordoned until its node group scales to 0",
        )  # fmt: skip
        return ops.end(record, "succeeded", "drained; stays cordoned until the old group is at 0",
                       step="drained", savings=False)  # fmt: skip
