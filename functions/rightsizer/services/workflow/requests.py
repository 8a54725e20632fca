"""What starts a workflow and what every workflow talks to (docs/architecture.md §4).

A request type names its kind (``rightsizer.services.workflow.executor.Kind.request_type``): a
:class:`DrainRequest` starts a scale-in, and each other kind's request extends it with its own fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rightsizer.domain.policy import Policy
from rightsizer.ports import Assessor, ClusterWriter, NodeScaler
from rightsizer.services.approval import ApprovalGate
from rightsizer.state import StateStore


@dataclass(frozen=True)
class DrainRequest:
    """Drain ``node`` and remove its instance; ``trigger`` says who asked (``schedule``, ``alert:<fp>``,
    ``offhours:<group>``, ``cli``). ``offhours`` exempts the drain from ``max_nodes_per_*``, cooldown and
    disruption windows (docs/architecture.md §4: the schedule is the operator's window). Savings in USD per hour."""

    node: str
    execution_id: str
    trigger: str = "schedule"
    hourly_savings_usd: float | None = None
    offhours: bool = False


@dataclass
class DrainDeps:
    """What the workflow talks to. ``clock`` returns an aware UTC now; ``dry_run`` True validates and
    records what would happen without touching the cluster or AWS. ``approvals`` opens and reads approval
    requests (policy ``approval``); without it a drain that needs approval is abandoned, never run unasked."""

    cluster: ClusterWriter
    scaler: NodeScaler
    assessor: Assessor
    state: StateStore
    policy: Policy
    dry_run: bool = True
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    approvals: ApprovalGate | None = None
