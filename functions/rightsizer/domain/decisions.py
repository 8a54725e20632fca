"""Decision records: why each GPU node was or was not acted on in one assessment (pure, no I/O).

One :class:`DecisionRecord` per GPU node of a :class:`~rightsizer.domain.plan.Plan`: the verdict and every
reason exactly as the plan has them, the recommendation (the node's action, if any), the price, and what
the assessment did about it (``drain_started`` with the execution id, or ``none`` with ``why_not``). The
scheduled assessment logs each record as one structured log line, keeps the latest records per cluster
(with a short history) in the state table, and raises a Kubernetes Event on a node when its verdict
changes (:func:`verdict_changes`, :func:`event_for`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from rightsizer.domain.plan import Action, NodeReport, Plan
from rightsizer.domain.verdicts import (
    BUSY_CODES,
    EXCLUDED_CODES,
    PROTECTED_CODES,
    UNKNOWN_CODES,
    Verdict,
    code_of,
)

__all__ = [
    "DECISION_LOG_MESSAGE",
    "EVENT_REASONS",
    "DecisionRecord",
    "Recommendation",
    "VerdictChange",
    "decision_records",
    "event_for",
    "plan_document",
    "verdict_changes",
]

#: The ``message`` of every decision log line (the shipped Logs Insights queries filter on it).
DECISION_LOG_MESSAGE: Final = "decision"

#: Kubernetes Event ``reason`` per verdict (CamelCase, as Karpenter's ``Unconsolidatable`` /
#: ``DisruptionBlocked``): what the node became.
EVENT_REASONS: Final[Mapping[str, str]] = {
    "idle": "GPUIdle",
    "underutilized": "GPUUnderutilized",
    "busy": "GPUBusy",
    "protected": "GPUProtected",
    "unknown": "GPUVerdictUnknown",
    "excluded": "GPUExcluded",
}

_CLASS_CODES: Final[Mapping[str, frozenset[str]]] = {
    "excluded": EXCLUDED_CODES,
    "unknown": UNKNOWN_CODES,
    "busy": BUSY_CODES,
    "underutilized": BUSY_CODES,
    "protected": PROTECTED_CODES,
}

ActionTaken = Literal["drain_started", "resize_started", "replace_started", "consolidate_started", "none"]
#: The plan's action kinds the scheduled assessment starts a workflow for, and what the record calls it.
_STARTED: Final[Mapping[str, ActionTaken]] = {
    "scale_in": "drain_started",
    "resize_instance": "resize_started",
    "replace_node_group": "replace_started",
    "consolidate": "consolidate_started",
}
#: Reasons of a node group replacement on the node's group (``domain.replacement.replacement_reasons``).
_REPLACEMENT_CODES: Final = frozenset({"replacement_in_progress", "replacement_settling"})
#: The key ``started`` uses for a node group replacement (``rightsizer.services.replace.lease_key``).
_GROUP_KEY = "nodegroup:{}"


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recommendation(_Out):
    """The plan's action for the node (``rightsizer.domain.plan.Action``) reduced to what a person reads.

    ``to`` is the action's target (an instance type, a size …; ``None`` for a scale-in); savings in USD
    per hour and per month (730 h), ``None`` when unpriced.
    """

    action_id: str
    kind: str
    to: Any
    reason: str
    hourly_savings_usd: float | None
    monthly_savings_usd: float | None


class DecisionRecord(_Out):
    """Why one GPU node was or was not acted on at ``at`` (RFC 3339 UTC).

    ``verdict`` and ``reasons`` are the plan's, unchanged; ``hourly_usd`` the node's on-demand price (USD
    per hour, ``None`` when unpriced); ``action`` is ``drain_started`` or ``resize_started``
    (``execution_id`` set; in dry run the workflow validates and records only) or ``none`` with
    ``why_not`` — the blocking reasons of the
    verdict's class (``protected: pdb_blocks``), or what kept an idle node's drain from starting
    (``drain_failure_backoff:until:<t>``).
    """

    cluster: str
    at: str
    node: str
    node_group: str | None
    instance_id: str | None
    instance_type: str | None
    gpus: int
    verdict: Verdict
    reasons: list[str]
    gpu_activity_max_pct: float | None
    fb_used_max_mib: float | None
    coverage: float
    hourly_usd: float | None
    recommendation: Recommendation | None
    action: ActionTaken
    execution_id: str | None
    why_not: str | None
    dry_run: bool


def _recommendation(action: Action | None) -> Recommendation | None:
    if action is None:
        return None
    return Recommendation(
        action_id=action.action_id,
        kind=action.kind,
        to=action.to,
        reason=action.reason,
        hourly_savings_usd=action.hourly_savings_usd,
        monthly_savings_usd=action.monthly_savings_usd,
    )


def _why_not(report: NodeReport, action: Action | None, skipped: str | None) -> str:
    if skipped is not None:
        return skipped
    if action is not None and action.kind not in _STARTED:
        kinds = list(_STARTED)
        return f"{action.kind} is a recommendation: the assessment starts only {', '.join(kinds[:-1])} and {kinds[-1]}"
    # A node group replacement running on (or just finished to) the node's group explains it first: an
    # underutilized node of a group being replaced is not acted on because the replacement moves it.
    replacing = [r for r in report.reasons if code_of(r) in _REPLACEMENT_CODES]
    if replacing:
        return f"{report.verdict}: {', '.join(replacing)}"
    codes = _CLASS_CODES.get(report.verdict)
    blocking = [r for r in report.reasons if codes is not None and code_of(r) in codes]
    if blocking:
        return f"{report.verdict}: {', '.join(blocking)}"
    return f"{report.verdict}: no executable action"


def decision_records(
    result: Plan,
    cluster: str,
    *,
    started: Mapping[str, str],
    skipped: Mapping[str, str],
) -> list[DecisionRecord]:
    """One record per GPU node of ``result``, in the plan's node order.

    Args:
        result: the assessment's plan.
        cluster: the cluster the plan is of.
        started: node → execution id of the workflows (drain, resize) this assessment started.
        skipped: node → why a startable action was not started (e.g. the failure back-off).
    """
    by_node: dict[str, Action] = {}
    by_group = {a.node_group: a for a in result.actions if a.kind == "replace_node_group" and a.node_group}
    for action in result.actions:
        # An action the assessment starts wins over a recommendation for the same node.
        if action.node is not None and (action.node not in by_node or action.kind in _STARTED):
            by_node[action.node] = action
    records = []
    for report in result.nodes:
        chosen = by_node.get(report.node)
        execution_id = started.get(report.node)
        if chosen is None and report.node_group in by_group:
            # every node of a group being replaced shares the group's action and execution
            chosen = by_group[report.node_group]
            execution_id = started.get(_GROUP_KEY.format(report.node_group))
        records.append(
            DecisionRecord(
                cluster=cluster,
                at=result.at,
                node=report.node,
                node_group=report.node_group,
                instance_id=report.instance_id,
                instance_type=report.instance_type,
                gpus=report.gpus,
                verdict=report.verdict,
                reasons=list(report.reasons),
                gpu_activity_max_pct=report.gpu_activity_max_pct,
                fb_used_max_mib=report.fb_used_max_mib,
                coverage=report.coverage,
                hourly_usd=report.hourly_usd,
                recommendation=_recommendation(chosen),
                action=_STARTED[chosen.kind] if execution_id and chosen is not None else "none",
                execution_id=execution_id,
                why_not=None if execution_id else _why_not(report, chosen, skipped.get(report.node)),
                dry_run=result.dry_run,
            )
        )
    return records


def plan_document(
    cluster: str, at: str, dry_run: bool, records: Sequence[DecisionRecord], summary: Mapping[str, Any]
) -> dict[str, Any]:
    """The stored form of one assessment (the state table's latest plan and its history): JSON-ready
    ``{"cluster", "at", "dry_run", "summary", "records": [DecisionRecord …]}``."""
    return {
        "cluster": cluster,
        "at": at,
        "dry_run": dry_run,
        "summary": dict(summary),
        "records": [r.model_dump(mode="json") for r in records],
    }


class VerdictChange(_Out):
    """A node whose verdict differs from the previous assessment's (``before`` None: first seen)."""

    node: str
    before: str | None
    after: Verdict


#: Verdicts worth an Event when a node is seen for the first time (something can be done about them).
_FIRST_SIGHTING: Final = frozenset({"idle", "underutilized"})


def verdict_changes(
    previous: Mapping[str, str] | None, records: Sequence[DecisionRecord]
) -> list[VerdictChange]:
    """Nodes whose verdict changed since ``previous`` (node → verdict of the last stored plan).

    One change per node and assessment, so a node that keeps its verdict raises no further Event (no
    event spam). A node absent from ``previous`` (first assessment, a new node) counts as changed only
    when its verdict is actionable (``idle``, ``underutilized``): a fresh deployment does not raise an
    Event for every busy node of the cluster.
    """
    before = previous or {}
    changes = []
    for record in records:
        old = before.get(record.node)
        if old == record.verdict:
            continue
        if old is None and record.verdict not in _FIRST_SIGHTING:
            continue
        changes.append(VerdictChange(node=record.node, before=old, after=record.verdict))
    return changes


def event_for(change: VerdictChange, record: DecisionRecord) -> tuple[str, str, bool]:
    """The Kubernetes Event ``(reason, message, warning)`` of a verdict change.

    Reason: :data:`EVENT_REASONS` of the new verdict; message: ``GPU verdict busy -> idle: <reasons>;
    <what the assessment does>``; ``Warning`` only for ``unknown`` (metrics missing or stale — a person
    should look), ``Normal`` otherwise.
    """
    was = change.before or "new"
    reasons = ", ".join(record.reasons) or "no reasons"
    if record.action != "none":
        kind = record.action.removesuffix("_started")
        then = f"{kind} {record.execution_id} started" + (" (dry run)" if record.dry_run else "")
    else:
        then = f"no action ({record.why_not})"
    message = f"GPU verdict {was} -> {record.verdict}: {reasons}; {then}"
    return EVENT_REASONS[record.verdict], message, record.verdict == "unknown"
