"""The back-off after a failed drain (policy ``drain_failure_backoff``, docs/architecture.md §4).

Cluster Autoscaler waits ``scale-down-delay-after-failure`` after a failed scale-down; we wait per node.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from rightsizer.state import Ledger

__all__ = ["FAILED_RESULTS", "failure_backoff"]

#: Ledger results that count as a failed drain for the back-off (``Policy.drain_failure_backoff``).
FAILED_RESULTS: Final = frozenset({"failed", "rolled_back"})


def failure_backoff(state: Ledger, nodes: list[str], now: datetime, backoff_seconds: int) -> dict[str, str]:
    """Nodes among ``nodes`` whose last drain failed or rolled back less than ``backoff_seconds`` ago.

    Every drain honours it, whoever started it: the assessment skips such nodes (its decision record
    says why), and the workflow's validate step abandons a drain the webhook or off-hours started.

    Returns:
        node → ``drain_failure_backoff:until:<RFC 3339 UTC>:<ledger result>`` (the decision record's
        ``why_not``). Reads the cluster's ledger once, and only when ``nodes`` is not empty.
    """
    if not nodes or backoff_seconds <= 0:
        return {}
    wanted = set(nodes)
    last: dict[str, tuple[datetime, str]] = {}
    # Entries come oldest first, so the last one seen per node is its latest failure.
    # One node (a workflow's validate step): only its entries are kept.
    for entry in state.entries(node=nodes[0]) if len(nodes) == 1 else state.entries():
        if entry.node in wanted and entry.result in FAILED_RESULTS:
            last[entry.node] = (entry.at, entry.result)
    held: dict[str, str] = {}
    for node, (at, result) in last.items():
        until = at + timedelta(seconds=backoff_seconds)
        if until > now:
            stamp = until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            held[node] = f"drain_failure_backoff:until:{stamp}:{result}"
    return held
