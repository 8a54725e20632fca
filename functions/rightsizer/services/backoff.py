"""The back-off after a failed drain (policy ``drain_failure_backoff``, docs/architecture.md §4).

Cluster Autoscaler waits ``scale-down-delay-after-failure`` after a failed scale-down; we wait per node.
The rule is ``domain.holds.backoff_reason``; this module reads the ledger it needs.
"""

from __future__ import annotations

from datetime import datetime

from rightsizer.domain.holds import FAILED_RESULTS, backoff_reason
from rightsizer.state import Ledger

__all__ = ["FAILED_RESULTS", "failure_backoff", "last_failures"]


def last_failures(state: Ledger, nodes: list[str] | None = None) -> dict[str, tuple[datetime, str]]:
    """Per node among ``nodes`` (None = every node): (instant, ledger result) of its last failed or
    rolled-back drain. Nodes without a failure are absent.

    Reads the cluster's ledger once — only the node's own entries for one node (a workflow's validate
    step), nothing for an empty list.
    """
    if nodes is not None and not nodes:
        return {}
    wanted = None if nodes is None else set(nodes)
    last: dict[str, tuple[datetime, str]] = {}
    # Entries come oldest first, so the last one seen per node is its latest failure.
    entries = state.entries(node=nodes[0]) if nodes is not None and len(nodes) == 1 else state.entries()
    for entry in entries:
        if entry.node and (wanted is None or entry.node in wanted) and entry.result in FAILED_RESULTS:
            last[entry.node] = (entry.at, entry.result)
    return last


def failure_backoff(state: Ledger, nodes: list[str], now: datetime, backoff_seconds: int) -> dict[str, str]:
    """Nodes among ``nodes`` whose last drain failed or rolled back less than ``backoff_seconds`` ago.

    Every drain honours it, whoever started it: the assessment skips such nodes (its decision record
    says why), the off-hours decision does not start their drains, and the workflow's validate step
    abandons a drain the webhook started.

    Returns:
        node → ``drain_failure_backoff:until:<RFC 3339 UTC>:<ledger result>`` (the decision record's
        ``why_not``). Reads no ledger when ``backoff_seconds`` is 0.
    """
    if backoff_seconds <= 0:
        return {}
    held: dict[str, str] = {}
    for node, failed in last_failures(state, nodes).items():
        reason = backoff_reason(failed, now, backoff_seconds)
        if reason is not None:
            held[node] = reason
    return held
