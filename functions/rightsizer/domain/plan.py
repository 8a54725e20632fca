"""The Plan JSON contract (docs/architecture.md §5 "Plan JSON"): pydantic models, serialised as the contract says."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rightsizer.domain.showback import Showback
from rightsizer.domain.verdicts import Verdict
from rightsizer.domain.workloads import WorkloadVerdict

ActionKind = Literal[
    "scale_in", "resize_instance", "replace_node_group", "scale_node_group", "consolidate", "recommend"
]
EXECUTABLE_KINDS = frozenset(
    {"scale_in", "resize_instance", "replace_node_group", "scale_node_group", "consolidate"}
)


def action_id(kind: str, target: str, to: Any) -> str:
    """First 16 hex characters of sha256(``kind|node or node group|canonical JSON of to``)."""
    canonical = json.dumps(to, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{kind}|{target}|{canonical}".encode()).hexdigest()[:16]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeReport(_Out):
    """One GPU node's verdict with every reason and the figures behind it.

    Units: ``gpu_activity_max_pct`` percent, ``fb_used_max_mib`` MiB, ``coverage`` 0..1,
    ``hourly_usd`` on-demand USD per hour (None when the type is not priced).
    """

    node: str
    verdict: Verdict
    reasons: list[str]
    node_group: str | None
    instance_id: str | None
    instance_type: str | None
    gpus: int
    gpu_activity_max_pct: float | None
    fb_used_max_mib: float | None
    coverage: float
    hourly_usd: float | None


class PodMove(_Out):
    """Where a consolidation expects an evicted pod (``namespace/name``) to land: node ``to``."""

    pod: str
    to: str


class Action(_Out):
    """A proposed action. ``from``/``to`` depend on ``kind`` (docs/architecture.md §5); ``reason`` says why.

    ``hourly_savings_usd`` is set only for an action the rightsizer will execute and that stops paying for
    an instance (USD per hour); a ``recommend`` whose target is priced carries what it would save once a
    person applied it in ``estimated_hourly_savings_usd`` (and ``estimated_monthly_savings_usd``, 730 h),
    never counted in the plan's ``savings``.
    ``expected_slowdown_pct`` is the slowdown the workloads should expect (percent, 0 when none) and
    ``why_safe`` the evidence for it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    action_id: str
    kind: ActionKind
    node: str | None
    node_group: str | None
    instance_id: str | None
    from_: Any = Field(alias="from")
    to: Any
    reason: str
    hourly_savings_usd: float | None
    monthly_savings_usd: float | None
    estimated_hourly_savings_usd: float | None = None
    estimated_monthly_savings_usd: float | None = None
    manifests: list[str] = Field(default_factory=list)
    expected_slowdown_pct: float = 0.0
    why_safe: str = ""
    moves: list[PodMove] | None = None
    """``consolidate`` only: every pod the drain evicts and the node the simulation placed it on."""


class UnmappedReport(_Out):
    """A series that could not be joined to a node."""

    metric: str
    labels: dict[str, str]
    reason: str


class Savings(_Out):
    """Savings of the executable actions (USD per hour and per month, month = 730 h)."""

    hourly_usd: float
    monthly_usd: float


class ReservationReport(_Out):
    """One capacity reservation the plan's GPU nodes run in, and what it costs unused (issue 28).

    ``kind`` ``odcr`` or ``capacity_block``; ``idle_nodes`` its GPU nodes with nothing to do;
    ``available`` its empty slots (EC2 DescribeCapacityReservations ``AvailableInstanceCount``);
    ``unused_usd_per_hour`` (idle nodes + empty slots) × on-demand USD/h, None when unpriced; ``end``
    RFC 3339 ``EndDate`` (a Capacity Block's end: AWS terminates its instances 30 min before); ``advice``.
    """

    reservation_id: str
    kind: str
    instance_type: str | None
    idle_nodes: list[str]
    available: int
    unused_usd_per_hour: float | None
    end: str | None
    advice: str


class Plan(_Out):
    """What the rightsizer decided at ``at`` for the snapshot taken at ``taken_at`` (docs/architecture.md §5)."""

    at: str
    taken_at: str
    dry_run: bool
    policy: dict[str, Any]
    nodes: list[NodeReport]
    actions: list[Action]
    unmapped: list[UnmappedReport]
    savings: Savings
    showback: Showback | None = None
    """Idle GPU-hours and USD per holder, namespace and team (``domain.showback``); None in plans
    written before it."""
    workloads: list[WorkloadVerdict] = Field(default_factory=list)
    """Every workload owning a GPU-holding pod, with ``scale_to_zero`` or ``keep`` and why
    (``domain.workloads``)."""
    reservations: list[ReservationReport] = Field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        """The contract JSON document (``from`` spelled as in the contract; ``moves`` only on the actions
        that carry them)."""
        doc = self.model_dump(mode="json", by_alias=True)
        for action in doc["actions"]:
            if action.get("moves") is None:
                action.pop("moves", None)
        return doc

    def node(self, name: str) -> NodeReport:
        """The report of node ``name``.

        Raises:
            KeyError: when the node is not a GPU node of this plan.
        """
        for report in self.nodes:
            if report.node == name:
                return report
        raise KeyError(name)
