"""A node group replacement's steps after validate (docs/architecture.md §4 "Node group replacement"):
``ng_create`` → ``ng_created`` → ``ng_ready`` → ``ng_drain`` → ``ng_scale_old`` → ``ng_gone``
(→ ``ng_delete_old``), each a function of the :class:`~rightsizer.services.replace.Replace` kind and the
record, referenced by its step table. See :mod:`rightsizer.services.replace` for what each does.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import TYPE_CHECKING

from rightsizer.domain.catalog import HOURS_PER_MONTH
from rightsizer.domain.errors import PermanentError, RightsizerError
from rightsizer.domain.model import GPU_RESOURCE, NODEGROUP_LABEL, GroupSizes, Node
from rightsizer.domain.workflow_details import NewGroupSpec, ReplaceDetails
from rightsizer.ports import ManagedNodeGroup
from rightsizer.services.replace_drain import ReplaceDrainRequest
from rightsizer.services.workflow.drain_steps import POLL_S
from rightsizer.services.workflow.engine import FINAL_STATUSES, StepResult, run_step
from rightsizer.state import LedgerEntry, WorkflowRecord

if TYPE_CHECKING:
    from rightsizer.services.replace import Replace

log = logging.getLogger(__name__)

#: Node group statuses and health issues that mean the new group will not get its nodes.
FAILED_STATUSES = frozenset({"CREATE_FAILED", "DEGRADED", "DELETING", "DELETE_FAILED"})
#: How many times a child drain of one node may fail (or roll back) before the replacement rolls back.
DRAIN_ATTEMPTS = 3


def replace_details(record: WorkflowRecord) -> ReplaceDetails:
    """The details of a node group replacement's record.

    Raises:
        PermanentError: the record is of another kind.
    """
    if not isinstance(record.details, ReplaceDetails):
        raise PermanentError(f"not_a_replacement_record:{record.details.kind}")
    return record.details


def ng_create(kind: Replace, record: WorkflowRecord) -> StepResult:
    kind.ops.renew(record)
    stored = replace_details(record).new_spec
    assert stored is not None  # validate made it
    minimum, desired, maximum = stored.scaling
    fields = {name: getattr(stored, name) for name in NewGroupSpec.model_fields}
    spec = ManagedNodeGroup(**{**fields, "scaling": GroupSizes(minimum, desired, maximum)})
    # Persisted before the call: from here on a rollback deletes the new group.
    record = kind.ops.save(record, details=replace_details(record).but(creating=True))
    kind.eks().create_nodegroup(kind.deps.state.cluster, spec, record.execution_id[-64:])
    return kind.ops.next(record, "ng_create", "ng_created", wait=POLL_S, message=f"creating {spec.name}")


def ng_created(kind: Replace, record: WorkflowRecord) -> StepResult:
    kind.ops.renew(record)
    name = str(replace_details(record).new_nodegroup)
    group = kind.eks().describe_managed(kind.deps.state.cluster, name)
    if group is None:
        return kind.rollback(record.execution_id, f"new node group {name} disappeared", step="ng_created")
    failed = _failed(group)
    if failed:
        return kind.rollback(record.execution_id, failed, step="ng_created")
    if group.status == "ACTIVE":
        return kind.ops.next(record, "ng_created", "ng_ready", message=f"{name} ACTIVE")
    if kind.ops.now() > record.deadline:
        return kind.rollback(record.execution_id, f"deadline: {name} still {group.status}", step="ng_created")
    return kind.ops.next(record, "ng_created", "ng_created", wait=POLL_S, message=f"{name} {group.status}")


def _failed(group: ManagedNodeGroup) -> str:
    if group.status in FAILED_STATUSES:
        issues = ",".join(group.health_issues) or "no health issue reported"
        return f"no_capacity: new node group {group.name} is {group.status} ({issues})"
    return ""


def ng_ready(kind: Replace, record: WorkflowRecord) -> StepResult:
    """As many Nodes of the new group as the old group's desired size, Ready as the new type with its
    GPUs allocatable."""
    kind.ops.renew(record)
    details = replace_details(record)
    name, target = str(details.new_nodegroup), details.target_type
    group = kind.eks().describe_managed(kind.deps.state.cluster, name)
    failed = "new node group disappeared" if group is None else _failed(group)
    if failed:
        return kind.rollback(record.execution_id, failed, step="ng_ready")
    want = _old_sizes(record).desired
    row = kind.catalog.get(target)
    gpus = row.gpu_count if row else 1
    ready = [n for n in group_nodes(kind, name).values() if _serves(n, target, gpus)]
    if len(ready) >= want:
        drains = math.ceil(len(details.old_nodes) / _budget(kind, record)) + 1
        deadline = kind.ops.now() + timedelta(seconds=kind.deps.policy.drain_timeout * drains)
        return kind.ops.next(record, "ng_ready", "ng_drain", details=details.but(drain_deadline=deadline, children={}, drained={}),
                          message=f"{len(ready)} node(s) of {name} Ready as {target}, {gpus} GPU(s) each")  # fmt: skip
    missing = f"{len(ready)}/{want} node(s) of {name} Ready as {target} with {gpus} GPU(s) allocatable"
    if kind.ops.now() > record.deadline:
        return kind.rollback(record.execution_id, f"deadline: {missing}", step="ng_ready")
    return kind.ops.next(record, "ng_ready", "ng_ready", wait=POLL_S, message=f"waiting: {missing}")


def _budget(kind: Replace, record: WorkflowRecord) -> int:
    policy = kind.deps.policy
    return max(1, min(policy.max_nodes_per_run, policy.node_group_budget(_old_sizes(record).desired)))


def _old_sizes(record: WorkflowRecord) -> GroupSizes:
    """The old group's sizes as validate found them."""
    sizes = replace_details(record).old_scaling
    assert sizes is not None  # validate saved them
    return GroupSizes(*sizes)


def ng_drain(kind: Replace, record: WorkflowRecord) -> StepResult:
    """Step the children in flight once; start new ones up to the disruption budget; done when every
    old node that still exists was drained."""
    kind.ops.renew(record)
    details = replace_details(record)
    children: dict[str, str] = dict(details.children)
    drained: dict[str, str] = dict(details.drained)
    failures: dict[str, int] = dict(details.failures)
    notes: list[str] = []
    for node, child_id in sorted(children.items()):
        result = _advance(kind, child_id)
        if result is not None and not result.finished:
            continue
        del children[node]
        child = kind.deps.state.load(child_id)
        status = child.status if child is not None else "missing"
        if status == "succeeded":
            drained[node] = child_id
        elif child is not None and _refused(child):
            # The node's eligibility refuses the drain on fresh facts: retrying cannot help (issue 25).
            kind.ops.save(record, details=details.but(children=children, drained=drained))
            return kind.rollback(record.execution_id, f"drain_refused:{node}: {child.details.outcome}",
                                 step="ng_drain")  # fmt: skip
        elif status != "abandoned":
            failures[node] = failures.get(node, 0) + 1
            reason = result.message if result is not None else status
            if failures[node] >= DRAIN_ATTEMPTS:
                kind.ops.save(record, details=details.but(children=children, drained=drained))
                return kind.rollback(record.execution_id, f"drain_failed:{node}: {reason}", step="ng_drain")
            notes.append(f"{node}: {status} ({reason}); will retry")
        else:
            notes.append(f"{node}: {result.message if result else status}; will retry")
    present = set(group_nodes(kind, details.nodegroup))
    todo = [n for n in details.old_nodes if n in present and n not in drained and n not in children]
    if not todo and not children:
        record = kind.ops.save(record, details=details.but(children=children, drained=drained))
        return kind.ops.next(
            record, "ng_drain", "ng_scale_old", message=f"{len(drained)} old node(s) drained"
        )
    if details.drain_deadline is not None and kind.ops.now() > details.drain_deadline:
        kind.ops.save(record, details=details.but(children=children, drained=drained))
        return kind.rollback(record.execution_id, "drain deadline: " + ("; ".join(notes) or f"{len(todo)} left"),
                             step="ng_drain")  # fmt: skip
    tries: dict[str, int] = dict(details.tries)
    for node in todo[: max(0, _budget(kind, record) - len(children))]:
        tries[node] = tries.get(node, 0) + 1
        child_id = f"{record.execution_id}.{details.old_nodes.index(node)}.{tries[node]}"
        children[node] = child_id
        # The child is recorded before it starts: a crash here resumes it instead of starting another.
        record = kind.ops.save(record, details=details.but(children=children, drained=drained,
                                                        failures=failures, tries=tries))  # fmt: skip
        kind.child.start(
            ReplaceDrainRequest(node, child_id, f"replace:{record.execution_id}", parent=record.execution_id)
        )
        result = _advance(kind, child_id)
        if result is not None and result.finished:
            del children[node]
            child = kind.deps.state.load(child_id)
            if child is not None and child.status == "succeeded":
                drained[node] = child_id
            elif child is not None and _refused(child):
                kind.ops.save(record, details=details.but(children=children, drained=drained,
                                                       failures=failures, tries=tries))  # fmt: skip
                return kind.rollback(record.execution_id, f"drain_refused:{node}: {child.details.outcome}",
                                     step="ng_drain")  # fmt: skip
            else:
                notes.append(f"{node}: {result.message}; will retry")
    record = kind.ops.save(
        record,
        details=details.but(children=children, drained=drained, failures=failures, tries=tries),
    )
    message = f"{len(drained)}/{len(details.old_nodes)} drained, {len(children)} draining"
    return kind.ops.next(record, "ng_drain", "ng_drain", wait=POLL_S,
                      message=message + ("; " + "; ".join(notes) if notes else ""))  # fmt: skip


def _advance(kind: Replace, child_id: str) -> StepResult | None:
    """Run the child's current step once (its waits are the parent's poll); None when it already ended."""
    child = kind.deps.state.load(child_id)
    if child is None or child.status in FINAL_STATUSES:
        return None
    try:
        return run_step(child, kind.child.steps(), kind.child.rollback)
    except RightsizerError as exc:
        # A transient failure (the step maps the others to a rollback): the record is unchanged and
        # the child's step is tried again at the parent's next poll.
        log.info("child drain %s: %s; retrying", child_id, exc)
        return StepResult(child_id, child.step, child.step, "running", POLL_S, str(exc))


def ng_scale_old(kind: Replace, record: WorkflowRecord) -> StepResult:
    kind.ops.renew(record)
    old = replace_details(record).nodegroup
    maximum = max(1, _old_sizes(record).max)
    deadline = kind.ops.now() + timedelta(seconds=kind.deps.policy.replace_ready_timeout)
    record = kind.ops.save(record, details=replace_details(record).but(
        point_of_no_return=True, old_sizes_changed=True, gone_deadline=deadline))  # fmt: skip
    kind.eks().update_sizes(kind.deps.state.cluster, old, GroupSizes(0, 0, maximum))
    return kind.ops.next(
        record,
        "ng_scale_old",
        "ng_gone",
        wait=POLL_S,
        message=f"{old}: min 0 / desired 0 / max {maximum}",
    )


def ng_gone(kind: Replace, record: WorkflowRecord) -> StepResult:
    """Savings are booked once no instance of the old group is in service any more."""
    kind.ops.renew(record)
    details = replace_details(record)
    asg, old = str(details.asg), details.nodegroup
    group = kind.deps.scaler.describe_group(asg)
    desired, ids = group.sizes.desired, group.in_service
    if ids or desired:
        if details.gone_deadline is not None and kind.ops.now() > details.gone_deadline:
            return kind.ops.end(record, "failed", f"{old} still has {len(ids)} instance(s) in service", step="ng_gone",
                             savings=False)  # fmt: skip
        return kind.ops.next(
            record, "ng_gone", "ng_gone", wait=POLL_S, message=f"{len(ids)} old instance(s) left"
        )
    left = len(details.drained)
    per_node = details.per_node_savings_usd
    hourly = None if per_node is None else float(per_node) * left
    record = kind.ops.save(record, details=details.but(hourly_savings_usd=hourly))
    new, target = details.new_nodegroup, details.target_type
    reason = f"{old} ({details.old_type}) at 0 after {left} node(s) moved to {new} ({target})"
    # One entry for the group, the savings of its ``left`` old instances from now on (services.realized).
    entry = LedgerEntry(
        execution_id=record.execution_id,
        node=record.node,
        instance_id=None,
        node_group=old,
        kind=details.kind,
        step="ng_gone",
        result="applied",
        reason=reason,
        hourly_savings_usd=hourly,
        monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
        at=kind.ops.now(),
        instances=left,
    )
    kind.deps.state.record(entry)
    after = kind.deps.policy.replace_delete_old_after
    if after is None:
        return kind.ops.end(
            record, "succeeded", reason + f"; {old} kept at size 0", step="ng_gone", savings=False
        )
    details = details.but(delete_after=kind.ops.now() + timedelta(seconds=after))
    return kind.ops.next(
        record, "ng_gone", "ng_delete_old", wait=float(after), details=details, message=reason
    )


def ng_delete_old(kind: Replace, record: WorkflowRecord) -> StepResult:
    kind.ops.renew(record)
    old = replace_details(record).nodegroup
    due = replace_details(record).delete_after or kind.ops.now()
    if kind.ops.now() < due:
        return kind.ops.next(
            record, "ng_delete_old", "ng_delete_old", wait=(due - kind.ops.now()).total_seconds()
        )
    kind.eks().delete_nodegroup(kind.deps.state.cluster, old)
    return kind.ops.end(record, "succeeded", f"old node group {old} deleted after its grace period",
                     step="ng_delete_old", savings=False)  # fmt: skip


def group_nodes(kind: Replace, nodegroup: str) -> dict[str, Node]:
    """Nodes labelled ``eks.amazonaws.com/nodegroup=<nodegroup>``, by name (uncached list)."""
    nodes = (Node.model_validate(n) for n in kind.deps.cluster.list_nodes())
    return {n.name: n for n in nodes if n.metadata.labels.get(NODEGROUP_LABEL) == nodegroup}


#: Ends of a child drain that are its node's eligibility refusing (validate's guards, or the pods'
#: protections on fresh reads at validate and revalidate): final for the replacement.
REFUSED_OUTCOMES = ("not_a_candidate:", "protected:")


def _refused(child: WorkflowRecord) -> bool:
    """Whether the child drain ended refused by its node's eligibility (not the budget, a lease or a race)."""
    outcome = child.details.outcome or ""
    return child.status in ("abandoned", "rolled_back") and outcome.startswith(REFUSED_OUTCOMES)


def _serves(node: Node, instance_type: str, gpus: int) -> bool:
    """Ready, of ``instance_type``, with ``gpus`` GPUs allocatable, not being deleted."""
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    return (
        ready
        and node.instance_type == instance_type
        and node.allocatable_count(GPU_RESOURCE) >= gpus
        and node.metadata.deletionTimestamp is None
    )
