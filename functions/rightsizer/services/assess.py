"""A fresh decision about one node (the ``Assessor`` port), and the scheduled assessment that starts drains."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.plan import Action, NodeReport
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.ports import ClusterWriter, WorkflowStarter
from rightsizer.services.drain import DrainRequest, heal_expired_leases, heal_stale_cordons, stale_cordons
from rightsizer.services.resize import ResizeRequest
from rightsizer.state import StateStore


class PlanningAssessor:
    """Assesses a node by planning a freshly observed snapshot.

    Args:
        observe: returns the cluster's snapshot for the window ending at the given instant (live
            Kubernetes + AWS + Prometheus in production, the demo's sources in the demo).
        policy: the decision policy.
        node_label: the series label carrying the node name, if configured.
    """

    def __init__(
        self, observe: Callable[[datetime], ClusterSnapshot], policy: Policy, *, node_label: str | None = None
    ) -> None:
        self._observe = observe
        self._policy = policy
        self._node_label = node_label

    def assess_node(self, node: str, now: datetime) -> NodeReport | None:
        """The node's report in a plan made at ``now``, or None when it is not a GPU node of the cluster."""
        result = plan(self._observe(now), self._policy, now, node_label=self._node_label)
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
    """

    cluster_name: str
    observe: Callable[[datetime], ClusterSnapshot]
    policy: Policy
    cluster: ClusterWriter
    state: StateStore
    starter: WorkflowStarter
    node_label: str | None = None


@dataclass(frozen=True)
class AssessmentSummary:
    """What one assessment did: verdict counts, drains started (execution ids), healed nodes, USD/h."""

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

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (``at`` in RFC 3339 UTC)."""
        document = dataclasses.asdict(self)
        document["at"] = self.at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return document


def run_assessment(
    deps: AssessmentDeps, now: datetime, tick_id: str, *, clock: Callable[[], float] = time.monotonic
) -> AssessmentSummary:
    """Heal expired leases and stale cordons, plan the cluster at ``now``, start a drain per ``scale_in``
    action and a resize workflow per ``resize_instance`` action (issue 17).

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
    healed = heal_expired_leases(deps.cluster, deps.state, now)
    reaped = deps.state.reap_slots(now)
    snapshot = deps.observe(now)
    stale = stale_cordons(snapshot.nodes, deps.state, now)
    healed += heal_stale_cordons(deps.cluster, deps.state, stale, now)
    # A stale cordon (healed now or not) is no drain in flight: it must not spend the budget of others.
    result = plan(snapshot, deps.policy, now, node_label=deps.node_label, stale_cordons=frozenset(stale))
    started = []
    for action in result.actions:
        if action.kind not in ("scale_in", "resize_instance") or action.node is None:
            continue
        execution_id = drain_execution_id(deps.cluster_name, tick_id, action)
        request = (
            ResizeRequest(
                action.node, execution_id, "schedule", action.hourly_savings_usd, target_type=str(action.to)
            )
            if action.kind == "resize_instance"
            else DrainRequest(action.node, execution_id, "schedule", action.hourly_savings_usd)
        )
        started.append(deps.starter.start(request))
    verdicts = Counter(report.verdict for report in result.nodes)
    return AssessmentSummary(
        at=now,
        verdicts=dict(sorted(verdicts.items())),
        started=started,
        healed=healed,
        reaped_slots=len(reaped),
        hourly_savings_usd=result.savings.hourly_usd,
        monthly_savings_usd=result.savings.monthly_usd,
        dry_run=result.dry_run,
        duration_s=clock() - began,
    )
