"""Off-hours reports: what one tick did to each node group, as the CLI, the Lambda and the demo print it.

Shapes only (docs/architecture.md §4 "Off-hours"); sizes are node counts, times RFC 3339 UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from rightsizer.domain.model import GroupSizes
from rightsizer.domain.offhours import Direction
from rightsizer.state import SavedSizes

__all__ = ["Direction", "GroupReport", "OffhoursReport", "rfc3339_or_none"]


def rfc3339_or_none(value: datetime | None) -> str | None:
    """``value`` as RFC 3339 UTC with ``Z``, or ``None``."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _sizes_json(sizes: GroupSizes | None) -> dict[str, int] | None:
    return None if sizes is None else {"min": sizes.min, "desired": sizes.desired, "max": sizes.max}


@dataclass
class GroupReport:
    """What one tick found and did for one node group.

    ``outcome`` is one of: ``down`` (at zero, nothing to do), ``up`` (nothing saved, nothing to do),
    ``scaling_down`` (sizes changed or drains made progress — or would, in dry run), ``waiting`` (a drain
    is in flight), ``skipped`` (blocking nodes, unknown schedule, other direction), ``restoring`` (saved
    sizes applied, nodes not all Ready yet), ``restored`` (success: saved sizes forgotten), ``failed`` (an
    AWS/Kubernetes error or a drain that did not succeed), ``status`` (read-only view).

    Sizes are instances; ``next_transition`` is when the schedule's state flips next (None beyond 8 days).
    ``requested`` is every :class:`~rightsizer.domain.offhours.OffhoursDecision` of the tick as JSON (one per
    round: a drain finished in the tick starts another); ``actions`` and ``drains`` are what was taken (in a
    dry run, ``actions`` say what would be).
    """

    node_group: str
    schedule: str
    source: Literal["config", "tag"]
    state: Direction | None = None
    next_transition: datetime | None = None
    outcome: str = "skipped"
    reasons: list[str] = field(default_factory=list)
    node_reasons: dict[str, list[str]] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    asg_name: str | None = None
    saved: SavedSizes | None = None
    current: GroupSizes | None = None
    in_flight: list[str] = field(default_factory=list)
    drains: list[dict[str, Any]] = field(default_factory=list)
    ready_nodes: int | None = None
    failed_activities: list[dict[str, Any]] = field(default_factory=list)
    health_issues: list[str] = field(default_factory=list)
    restore_overdue: bool = False
    error: str | None = None
    requested: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """True when something went wrong that a person should look at (error, failed drain, overdue)."""
        return self.outcome == "failed" or self.error is not None or self.restore_overdue

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (times RFC 3339 UTC, sizes as ``{min, desired, max}``)."""
        saved = self.saved
        return {
            "node_group": self.node_group,
            "schedule": self.schedule,
            "source": self.source,
            "state": self.state,
            "next_transition": rfc3339_or_none(self.next_transition),
            "outcome": self.outcome,
            "reasons": list(self.reasons),
            "node_reasons": {k: list(v) for k, v in sorted(self.node_reasons.items())},
            "actions": list(self.actions),
            "asg_name": self.asg_name,
            "saved": None
            if saved is None
            else {
                **(_sizes_json(saved.sizes) or {}),
                "saved_at": rfc3339_or_none(saved.saved_at),
                "restore_started_at": rfc3339_or_none(saved.restore_started_at),
            },
            "current": _sizes_json(self.current),
            "in_flight": list(self.in_flight),
            "drains": list(self.drains),
            "ready_nodes": self.ready_nodes,
            "failed_activities": list(self.failed_activities),
            "health_issues": list(self.health_issues),
            "restore_overdue": self.restore_overdue,
            "error": self.error,
            "requested": list(self.requested),
        }


@dataclass
class OffhoursReport:
    """The outcome of one off-hours tick (or ``status``) over every selected node group.

    ``metrics`` are CloudWatch metrics for the caller to emit as EMF: ``{"name", "value", "unit",
    "dimensions"}`` — ``RestoreOverdue`` (Count, 1 per overdue group, dimensions cluster and node_group).
    ``errors`` are problems not tied to one group (listing node groups failed).
    """

    cluster: str
    at: datetime
    dry_run: bool
    force: bool
    only: Direction | None
    groups: list[GroupReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def alarms(self) -> list[str]:
        """Node groups whose restore is overdue."""
        return [g.node_group for g in self.groups if g.restore_overdue]

    @property
    def failed(self) -> bool:
        """True when any group failed, a restore is overdue, or a tick-wide error happened."""
        return bool(self.errors) or any(g.failed for g in self.groups)

    def group(self, name: str) -> GroupReport:
        """The report of node group ``name``.

        Raises:
            KeyError: the group was not selected.
        """
        for report in self.groups:
            if report.node_group == name:
                return report
        raise KeyError(name)

    def to_json_dict(self) -> dict[str, Any]:
        """The report as one JSON document (what ``rightsizer offhours --json`` prints)."""
        return {
            "cluster": self.cluster,
            "at": rfc3339_or_none(self.at),
            "dry_run": self.dry_run,
            "force": self.force,
            "only": self.only,
            "groups": [g.to_json_dict() for g in self.groups],
            "alarms": self.alarms,
            "errors": list(self.errors),
            "metrics": list(self.metrics),
        }
