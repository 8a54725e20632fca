"""A fresh decision about one node: observe the cluster now and plan (the ``Assessor`` port)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy


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
