"""Notices of actions (issue 27 item 4): an opt-in SNS message for every completed or rolled-back removal,
resize, replacement and off-hours transition, on the topic approval requests use (the stack's alarm topic).

One place sees every outcome: the ledger. :class:`NotifyingState` wraps the state store the composition
root hands to every workflow (``Runtime.state``); when a ledger entry is written for the first time (a
retried step records the same entry and is not announced twice) and :func:`notice_for` says it is an
action's outcome, the notice is published. Which entries are outcomes:

- ``scale_in``, ``resize_instance``, ``replace_node_group``, ``consolidate``: ``rolled_back`` (our cordon
  undone, nothing removed), or ``applied`` with its savings booked (the action completed: the instance is
  gone, resized, or the old group at 0);
- ``scale_node_group`` (off-hours): ``applied`` at ``min_zero`` / ``desired_zero`` (the group going to
  zero) and ``restored`` (its nodes Ready again). Its USD are booked per removed node by the drains,
  announced there.

A notice that cannot be published is logged and never fails the action: it already happened, and the
ledger has it (``rightsizer history``). Failures have their own alarms (``DrainsFailed`` ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rightsizer.domain.errors import RightsizerError

if TYPE_CHECKING:
    from rightsizer.services.approval import ApprovalNotifier
    from rightsizer.state import LedgerEntry, StateStore

log = logging.getLogger(__name__)

ACTION_KINDS = frozenset({"scale_in", "resize_instance", "replace_node_group", "consolidate"})
OFFHOURS_KIND = "scale_node_group"
OFFHOURS_TRANSITIONS = {
    "min_zero": "scaling down for off-hours (min 0; its nodes drained one at a time, each announced)",
    "desired_zero": "scaled down for off-hours (desired 0)",
    "restored": "restored from off-hours (its nodes Ready with GPUs)",
}
_WHAT = {
    "scale_in": "removal (drain and scale-in of the node)",
    "resize_instance": "resize of the instance",
    "replace_node_group": "replacement of the node group",
    "consolidate": "consolidation (drain of the node)",
}


@dataclass(frozen=True, slots=True)
class Notice:
    """One message: ``subject`` (SNS: ≤ 100 characters) and ``message`` (plain text lines)."""

    subject: str
    message: str


def notice_for(entry: LedgerEntry, cluster: str) -> Notice | None:
    """The notice of ``entry`` when it is an action's outcome (module docstring), else None."""
    if entry.kind in ACTION_KINDS:
        if entry.result == "rolled_back":
            outcome = "rolled back (our cordon undone, nothing removed)"
        elif entry.result == "applied" and entry.hourly_savings_usd is not None:
            outcome = "completed"
        else:
            return None
        what = _WHAT[entry.kind]
    elif entry.kind == OFFHOURS_KIND and entry.result == "applied" and entry.step in OFFHOURS_TRANSITIONS:
        outcome, what = OFFHOURS_TRANSITIONS[entry.step], "off-hours transition of the node group"
    else:
        return None
    target = entry.node or entry.node_group or "?"
    if entry.hourly_savings_usd is not None and entry.result == "applied":
        usd = f"{entry.hourly_savings_usd:,.2f} USD/hour ({entry.hourly_savings_usd * 730:,.2f} USD/month) saved"
    elif entry.kind == OFFHOURS_KIND:
        usd = "booked per removed node by its drain (see those notices)"
    else:
        usd = "none (nothing was removed)"
    lines = [
        f"cluster: {cluster}",
        f"action: {entry.kind}: {what}",
        f"outcome: {outcome} at step {entry.step}",
        f"node: {entry.node or '-'}"
        + (f" (instance {entry.instance_id})" if entry.instance_id else "")
        + (f", node group {entry.node_group}" if entry.node_group else ""),
        f"reason: {entry.reason or '-'}",
        f"USD: {usd}",
        f"execution: {entry.execution_id}",
        f"at: {entry.at.isoformat().replace('+00:00', 'Z')}",
        "ledger: rightsizer history --stack <stack>" + (f" --node {entry.node}" if entry.node else ""),
    ]
    short = "rolled back" if entry.result == "rolled_back" else "done"
    subject = f"GPU Rightsizer {cluster}: {entry.kind} {short} on {target}"
    return Notice(subject[:100], "\n".join(lines))


class NotifyingState:
    """``state`` whose ``record`` also publishes the notice of each new action outcome through
    ``notifier`` (``sns:Publish`` on the alarm topic); every other method is ``state``'s own."""

    def __init__(self, state: StateStore, notifier: ApprovalNotifier, cluster: str) -> None:
        self._state = state
        self._notifier = notifier
        self._cluster = cluster

    def record(self, entry: LedgerEntry) -> bool:
        """``state.record(entry)``; when written (not a repeat) and an outcome, publish its notice."""
        written = self._state.record(entry)
        notice = notice_for(entry, self._cluster) if written else None
        if notice is not None:
            try:
                self._notifier.publish(notice.subject, notice.message)
            except RightsizerError as exc:  # the action happened; the ledger has it
                log.warning("action notice not published (%s): %s", exc, notice.subject)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def notifying(state: StateStore, notifier: ApprovalNotifier | None, cluster: str) -> StateStore:
    """``state`` announcing action outcomes through ``notifier``; ``state`` itself without one."""
    if notifier is None:
        return state
    wrapped: Callable[..., Any] = NotifyingState
    return cast("StateStore", wrapped(state, notifier, cluster))
