"""A fresh decision about one node (the ``Assessor`` port), and the scheduled assessment that starts drains."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from rightsizer.domain.decisions import (
    DecisionRecord,
    decision_records,
    event_for,
    plan_document,
    verdict_changes,
)
from rightsizer.domain.eligibility import WorkloadFacts, workload_refusals
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.plan import Action, NodeReport
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.showback import Showback
from rightsizer.ports import ClusterWriter, SnoozeReader, WorkflowStarter
from rightsizer.services.backoff import failure_backoff
from rightsizer.services.consolidate import ConsolidateRequest
from rightsizer.services.drain import DrainRequest
from rightsizer.services.healing import (
    heal_dead_resizes,
    heal_expired_leases,
    heal_stale_cordons,
    stale_cordons,
)
from rightsizer.services.replace import KIND as REPLACE_KIND
from rightsizer.services.replace import ReplaceRequest, known_replacements, lease_key
from rightsizer.services.resize import ResizeRequest
from rightsizer.services.workloads import WorkloadScaler
from rightsizer.state import LeaseStore, PlanHistory, StateStore, lease_ttl_seconds

log = logging.getLogger(__name__)

#: Action kinds the assessment starts a workflow for (a drain, a resize, a node group replacement).
STARTED_KINDS: Final = ("scale_in", "resize_instance", REPLACE_KIND, "consolidate")


def _workflow_key(action: Action) -> str | None:
    """The lease key of the workflow an action starts: the node, or the node group of a replacement."""
    if action.kind == REPLACE_KIND:
        return lease_key(action.node_group) if action.node_group else None
    return action.node


class PlanningAssessor:
    """Assesses a node by planning a freshly observed snapshot.

    Args:
        observe: returns the cluster's snapshot for the window ending at the given instant (live
            Kubernetes + AWS + Prometheus in production, the demo's sources in the demo).
        policy: the decision policy.
        node_label: the series label carrying the node name, if configured.
        snoozes: the snoozes people set (a snoozed node is ``protected``); None = none.
        leases: the state store's leases, for the node group replacements running or settling (their
            nodes are ``protected``, ``domain.replacement``); None = none known.
    """

    def __init__(
        self,
        observe: Callable[[datetime], ClusterSnapshot] | None,
        policy: Policy,
        *,
        node_label: str | None = None,
        snoozes: SnoozeReader | None = None,
        observe_node: Callable[[str, datetime], ClusterSnapshot] | None = None,
        leases: LeaseStore | None = None,
    ) -> None:
        """``observe_node``, when given, is used instead of ``observe``: the snapshot of the node asked
        about only (``observe_node(node, at)``, ``rightsizer.services.observe.observe_node_live``) — the
        drain's validate and revalidate steps, whose cost then does not grow with the cluster (issue 11
        item 5).

        Raises:
            ValueError: neither ``observe`` nor ``observe_node``.
        """
        # A one-node view has no other node to place evicted pods on: its plan skips the placement check
        # (the assessment's whole-cluster plan made it when it proposed the action).
        self._placement = observe_node is None
        if observe_node is None:
            if observe is None:
                raise ValueError("PlanningAssessor needs observe or observe_node")
            whole = observe
            observe_node = lambda _node, at: whole(at)  # noqa: E731
        self._observe = observe_node
        self._policy = policy
        self._node_label = node_label
        self._snoozes = snoozes
        self._leases = leases

    def assess_node(self, node: str, now: datetime) -> NodeReport | None:
        """The node's report in a plan made at ``now``, or None when it is not a GPU node of the cluster."""
        snoozed = self._snoozes.snoozes(now) if self._snoozes is not None else None
        known = known_replacements(self._leases, now) if self._leases is not None else []
        snapshot = self._observe(node, now)
        result = plan(
            snapshot,
            self._policy,
            now,
            node_label=self._node_label,
            snoozed=snoozed,
            replacements=known,
            placement=self._placement,
        )
        try:
            return result.node(node)
        except KeyError:
            return None


# --------------------------------------------------------------------------------------------------
# The scheduled assessment (Lambda ``assess``): heal, plan, start one drain per scale_in action
# --------------------------------------------------------------------------------------------------


def drain_execution_id(cluster: str, tick_id: str, action: Action) -> str:
    """A deterministic drain execution id (= Step Functions execution name, ≤ 80 characters).

    The same schedule tick (EventBridge Scheduler keeps its ``execution-id`` across retries) and the same
    action give the same id, so a retried tick cannot start a second drain of the node; the node name
    leads so operators recognise the execution in the console.
    """
    digest = hashlib.sha256(f"{cluster}|{tick_id}|{action.action_id}".encode()).hexdigest()[:16]
    node = re.sub(r"[^A-Za-z0-9._-]", "-", action.node or action.node_group or "node")[:60]
    return f"{node}-{digest}"


@dataclass(frozen=True)
class AssessmentDeps:
    """What the scheduled assessment talks to.

    Attributes:
        cluster_name: the cluster the state store is bound to (part of the execution ids).
        observe: a live ``ClusterSnapshot`` for the window ending at the given instant.
        policy: the decision policy.
        cluster: Kubernetes writes (uncordon of expired leases).
        state: leases and budget slots.
        starter: starts drain workflows (Step Functions in Lambda).
        node_label: the configured series label carrying the node name.
        plans: where the assessment's decision records are kept (latest plan and a short history);
            None keeps nothing and raises no verdict-change Events (nothing to compare with).
        snoozes: the snoozes people set through approval requests (None = none).
    """

    cluster_name: str
    observe: Callable[[datetime], ClusterSnapshot]
    policy: Policy
    cluster: ClusterWriter
    state: StateStore
    starter: WorkflowStarter
    node_label: str | None = None
    plans: PlanHistory | None = None
    snoozes: SnoozeReader | None = None
    workloads: WorkloadScaler | None = None
    """Scales ``scale_to_zero`` workloads when the policy's ``workloads.scale_to_zero`` is on (issue 32; in
    process only: ``rightsizer apply``); None scales nothing."""


@dataclass(frozen=True)
class AssessmentSummary:
    """What one assessment did: verdict counts, drains started (execution ids), healed nodes, USD/h, and
    one decision record per GPU node (``records``; not part of :meth:`to_json`, they are logged one per
    line)."""

    at: datetime
    verdicts: dict[str, int]
    started: list[str]
    healed: list[str]
    reaped_slots: int
    hourly_savings_usd: float
    monthly_savings_usd: float
    dry_run: bool
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    records: list[DecisionRecord] = field(default_factory=list)
    backed_off: dict[str, str] = field(default_factory=dict)
    events: int = 0
    reservations: list[dict[str, Any]] = field(default_factory=list)
    """The plan's capacity reservations and their unused cost (``Plan.reservations``, issue 28)."""
    workloads: dict[str, str] = field(default_factory=dict)
    """Workload → what scale-to-zero did (``scaled_to_zero``, ``would_scale``, ``already_zero``...)."""
    showback: Showback | None = None
    """Idle GPU-hours and USD per namespace and team (``domain.showback``); ``to_json`` keeps the sums,
    not the holders (they are in the plan and its log line)."""

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (``at`` in RFC 3339 UTC), without the records."""
        document = dataclasses.asdict(dataclasses.replace(self, records=[], showback=None))
        del document["records"]
        document["at"] = self.at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        document["showback"] = (
            None if self.showback is None else self.showback.model_dump(mode="json", exclude={"holders"})
        )
        return document


def _publish_decisions(deps: AssessmentDeps, records: list[DecisionRecord], summary: dict[str, Any]) -> int:
    """Keep the records and raise one Event per verdict change; returns the number of Events.

    The records are the assessment's outcome, so a failure to keep them fails the assessment loudly
    (the Lambda's Errors alarm); Events are best effort (``ClusterWriter.emit_event`` never raises).
    """
    if deps.plans is None:
        return 0
    previous = deps.plans.plans(limit=1)
    before = {r["node"]: r["verdict"] for r in previous[0]["records"]} if previous else None
    by_node = {r.node: r for r in records}
    changes = verdict_changes(before, records)
    for change in changes:
        reason, message, warning = event_for(change, by_node[change.node])
        deps.cluster.emit_event(change.node, reason, message, warning=warning)
    at = summary["at"]
    deps.plans.save_plan(
        plan_document(deps.cluster_name, at, bool(summary["dry_run"]), records, summary),
        datetime.fromisoformat(at.replace("Z", "+00:00")),
    )
    return len(changes)


def run_assessment(
    deps: AssessmentDeps, now: datetime, tick_id: str, *, clock: Callable[[], float] = time.monotonic
) -> AssessmentSummary:
    """Restart resizes that died after their stop, heal expired leases and stale cordons, plan the cluster
    at ``now``, start a drain per ``scale_in``
    action, a resize workflow per ``resize_instance`` action and a replacement per ``replace_node_group``
    action (issue 17).

    Healing comes first so a node whose drain died (or whose rollback could not uncordon it) is
    uncordoned before it is judged again; the plan never picks a node in flight (our cordon with a live
    workflow counts against the budget, a stale one does not), and the workflow's validate step re-checks
    everything on fresh state — the plan is a hint, not an order.

    Args:
        now: the instant of the decision (the schedule's ``scheduled_time``, never a clock).
        tick_id: the schedule invocation's id (stable across its retries), part of every execution id.

    Returns:
        The summary; ``started`` lists the execution ids, also those a retried tick had already started.
    """
    began = clock()
    # A resize that died after stopping its instance is restarted (restore, start, uncordon) before the
    # lease healer, which would only uncordon it, and before slots are reaped: its lease is live again.
    ttl = lease_ttl_seconds(timedelta(seconds=deps.policy.drain_timeout))
    healed = heal_dead_resizes(deps.state, deps.starter, now, ttl)
    healed += heal_expired_leases(deps.cluster, deps.state, now)
    reaped = deps.state.reap_slots(now)
    snapshot = deps.observe(now)
    stale = stale_cordons(snapshot.nodes, deps.state, now)
    healed += heal_stale_cordons(deps.cluster, deps.state, stale, now)
    # A stale cordon (healed now or not) is no drain in flight: it must not spend the budget of others.
    # Snoozes people set through approval requests keep their nodes protected (docs/architecture.md §4).
    snoozed = deps.snoozes.snoozes(now) if deps.snoozes is not None else None
    result = plan(
        snapshot,
        deps.policy,
        now,
        node_label=deps.node_label,
        stale_cordons=frozenset(stale),
        snoozed=snoozed,
        # Replacements running or settling (their leases): never proposed again, their nodes protected.
        replacements=known_replacements(deps.state, now),
    )
    candidates = [a for a in result.actions if a.kind in STARTED_KINDS and _workflow_key(a) is not None]
    backed_off = failure_backoff(
        deps.state, [str(_workflow_key(a)) for a in candidates], now, deps.policy.drain_failure_backoff
    )
    requests = [
        ReplaceRequest(
            lease_key(str(action.node_group)),
            drain_execution_id(deps.cluster_name, tick_id, action),
            "schedule",
            action.hourly_savings_usd,
            nodegroup=str(action.node_group),
            target_type=str(action.to),
        )
        if action.kind == REPLACE_KIND
        else ResizeRequest(
            str(action.node),
            drain_execution_id(deps.cluster_name, tick_id, action),
            "schedule",
            action.hourly_savings_usd,
            target_type=str(action.to),
        )
        if action.kind == "resize_instance"
        else ConsolidateRequest(
            str(action.node),
            drain_execution_id(deps.cluster_name, tick_id, action),
            "schedule",
            action.hourly_savings_usd,
            moves=tuple((m.pod, m.to) for m in action.moves or ()),
        )
        if action.kind == "consolidate"
        else DrainRequest(
            str(action.node),
            drain_execution_id(deps.cluster_name, tick_id, action),
            "schedule",
            action.hourly_savings_usd,
        )
        for action in candidates
        if str(_workflow_key(action)) not in backed_off
    ]
    for node, why in backed_off.items():
        log.info("assessment: not draining %s: %s", node, why)
    verdicts = Counter(report.verdict for report in result.nodes)
    records = decision_records(
        result,
        deps.cluster_name,
        started={r.node: r.execution_id for r in requests},
        skipped=backed_off,
    )
    summary = AssessmentSummary(
        at=now,
        verdicts=dict(sorted(verdicts.items())),
        started=[r.execution_id for r in requests],
        healed=healed,
        reaped_slots=len(reaped),
        hourly_savings_usd=result.savings.hourly_usd,
        monthly_savings_usd=result.savings.monthly_usd,
        dry_run=result.dry_run,
        records=records,
        backed_off=backed_off,
        reservations=[r.model_dump(mode="json") for r in result.reservations],
        showback=result.showback,
    )
    # Decisions are published before the drains start: the verdict's Event precedes the drain's own
    # Events, and an in-process drain (CLI, demo) cannot outrun its record. Execution ids are
    # deterministic, so the record names the execution the starter is about to start.
    events = _publish_decisions(deps, records, summary.to_json())
    for request in requests:
        deps.starter.start(request)  # returns request.execution_id (WorkflowStarter contract)
    scaled: dict[str, str] = {}
    scaler, allowed = deps.workloads, deps.policy.workloads.scale_to_zero
    if scaler is not None:
        for verdict in result.workloads:
            if not workload_refusals(WorkloadFacts(verdict, allowed)):  # the action model's guards (issue 25)
                scaled[verdict.workload.text] = scaler.scale_to_zero(verdict).result
    return dataclasses.replace(summary, events=events, duration_s=clock() - began, workloads=scaled)
