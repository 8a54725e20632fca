"""Realized savings read back from the ledger: instance-hours actually avoided, per UTC day and node group.

A plan's savings are a promise; this is the bill. Every applied removal in the ledger (a drain that ended
``applied`` with a price, ``kind == "scale_in"``) avoids its instance from the moment it was recorded until
capacity came back to its node group — an off-hours ``scale_node_group`` ``restored`` entry of the same
group after it — or until ``now``. The avoided hours are split at UTC midnights and priced at the removal's
USD per hour. Scale-ups the ledger does not see (Cluster Autoscaler, Karpenter, an operator) are not
subtracted: the figures are an upper bound when something else re-adds capacity, and say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from rightsizer.state import LedgerEntry

RESTORE_KIND = "scale_node_group"
RESTORE_STEP = "restored"


@dataclass(frozen=True, slots=True)
class RealizedSavings:
    """Avoided capacity of one node group on one UTC day: ``instance_hours`` hours, ``usd`` USD."""

    day: date
    node_group: str
    instance_hours: float
    usd: float
    removals: int


def _removal(entry: LedgerEntry) -> bool:
    return (
        entry.kind == "scale_in"
        and entry.result == "applied"
        and entry.hourly_savings_usd is not None
        and entry.node is not None
    )


def _restore(entry: LedgerEntry) -> bool:
    return entry.kind == RESTORE_KIND and entry.step == RESTORE_STEP and entry.result == "applied"


def _split_by_day(start: datetime, end: datetime) -> Iterable[tuple[date, float]]:
    cursor = start
    while cursor < end:
        midnight = datetime.combine(cursor.date() + timedelta(days=1), datetime.min.time(), UTC)
        stop = min(midnight, end)
        yield cursor.date(), (stop - cursor).total_seconds() / 3600.0
        cursor = stop


def realized_savings(entries: Iterable[LedgerEntry], now: datetime) -> list[RealizedSavings]:
    """Instance-hours avoided and USD saved per (UTC day, node group), oldest day first, then by group.

    Args:
        entries: ledger entries of one cluster (any order).
        now: the aware instant the report is made at; open removals count until then.

    Raises:
        ValueError: when ``now`` is naive.
    """
    if now.tzinfo is None:
        raise ValueError("realized_savings needs an aware now")
    now = now.astimezone(UTC)
    ordered = sorted(entries, key=LedgerEntry.sort_key)
    restores: dict[str, list[datetime]] = {}
    for e in ordered:
        if _restore(e) and e.node_group:
            restores.setdefault(e.node_group, []).append(e.at)
    totals: dict[tuple[date, str], list[float]] = {}
    for e in ordered:
        if not _removal(e) or e.at >= now:
            continue
        group = e.node_group or "(standalone)"
        end = min([t for t in restores.get(group, []) if t > e.at] + [now])
        first = True
        for day, hours in _split_by_day(e.at, end):
            slot = totals.setdefault((day, group), [0.0, 0.0, 0.0])
            slot[0] += hours
            slot[1] += hours * (e.hourly_savings_usd or 0.0)
            slot[2] += 1 if first else 0
            first = False
    return [
        RealizedSavings(day, group, hours, usd, int(count))
        for (day, group), (hours, usd, count) in sorted(totals.items())
    ]
