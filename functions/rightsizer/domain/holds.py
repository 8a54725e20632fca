"""Holds on a node's removal that are not in its metrics (docs/architecture.md §4 "Approval", "Back-off").

- A **snooze**: a person answered an approval request with "snooze"; until its end the node is
  ``protected`` with ``snoozed:until:<t>`` (a reason code of ``domain.verdicts``).
- A **failure back-off**: the node's last drain failed or rolled back less than ``drain_failure_backoff``
  ago (Cluster Autoscaler's ``scale-down-delay-after-failure``, per node); the decision record and the
  off-hours report say ``drain_failure_backoff:until:<t>:<ledger result>``.

The planner, the assessment, the drain's validate step and the off-hours decision all ask these two
functions, so a hold reads the same and ends at the same instant wherever it is checked. Pure: the caller
passes the instants it read (the approval store's snoozes, the ledger's last failure) and ``now``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = ["BACKOFF_CODE", "FAILED_RESULTS", "backoff_reason", "snooze_reason", "stamp"]

#: Reason code of a failure back-off (not a verdict reason: the verdict stays what the metrics say).
BACKOFF_CODE: Final = "drain_failure_backoff"
#: Ledger results that count as a failed drain for the back-off (``Policy.drain_failure_backoff``).
FAILED_RESULTS: Final = frozenset({"failed", "rolled_back"})


def stamp(at: datetime) -> str:
    """``2026-12-02T01:13:04Z``: how a hold names its end (RFC 3339, UTC, whole seconds)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def snooze_reason(until: datetime | None, now: datetime) -> str | None:
    """``snoozed:until:<t>`` while a snooze runs (``now < until``), else None (no snooze, or it ended).

    Args:
        until: the aware instant the snooze ends (``ApprovalStore.snoozes``), or None.
        now: the aware instant of the decision.
    """
    if until is None or until <= now:
        return None
    return f"snoozed:until:{stamp(until)}"


def backoff_reason(failed: tuple[datetime, str] | None, now: datetime, backoff_seconds: int) -> str | None:
    """``drain_failure_backoff:until:<t>:<result>`` while ``now`` is less than ``backoff_seconds`` after the
    node's last failed drain, else None (no failure, a back-off of 0, or it ended).

    Args:
        failed: (aware instant, ledger result in ``FAILED_RESULTS``) of the node's last failed drain, or None.
        now: the aware instant of the decision.
        backoff_seconds: the policy's ``drain_failure_backoff`` (seconds; 0 = no back-off).
    """
    if failed is None or backoff_seconds <= 0:
        return None
    at, result = failed
    until = at + timedelta(seconds=backoff_seconds)
    if until <= now:
        return None
    return f"{BACKOFF_CODE}:until:{stamp(until)}:{result}"
