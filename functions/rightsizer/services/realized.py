"""Realized savings read back from the ledger: instance-hours actually avoided, per UTC day, node group and
action kind.

A plan's savings are a promise; this is the bill. Two kinds of ledger entries book savings:

- ``scale_in``: a drain that ended ``applied`` with a price avoids its instance from the moment it was
  recorded; one instance-hour per hour at the removal's USD per hour.
- ``resize_instance``: a resize that ended ``applied`` (the instance runs the new type, its Node Ready)
  avoids the old type of its one instance from then, priced at the difference it booked.
- ``replace_node_group``: the replacement's ``ng_gone`` entry (``applied``, recorded once no instance of
  the old group is in service) avoids the old type for each of its ``instances`` old nodes: the
  instance-hours of the old type not run, priced at the price difference (old − new, the entry's USD per
  hour for all of them). The new group's instances are paid for; only the difference is saved.

Each runs until capacity is billed again in its (old) node group — the first ``scale_node_group`` entry of
the same group after it that raised its desired size (``restore``: the ``UpdateNodegroupConfig`` that
launches the replacements, which EC2 bills from launch, not from when they are Ready; ``scaled_out``: a
scale-out the product observed, see ``services.restore_timing``; ``restored`` for ledgers older than
those) — or until ``now``. The hours are split at UTC midnights.
Scale-ups the ledger does not see (Cluster Autoscaler, Karpenter, an operator) are not subtracted: the
figures are an upper bound when something else re-adds capacity, and say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from rightsizer.domain.restore_timing import TIMING_STEP, timing_from_reason
from rightsizer.state import LedgerEntry

RESTORE_KIND = "scale_node_group"
RESTORE_STEP = "restored"
#: Steps of ``scale_node_group`` entries after which the group's instances are billed again.
BILLED_AGAIN_STEPS = frozenset({"restore", TIMING_STEP, RESTORE_STEP})


REPLACE_KIND = "replace_node_group"
REPLACE_STEP = "ng_gone"


@dataclass(frozen=True, slots=True)
class RealizedSavings:
    """Avoided capacity of one node group on one UTC day by one action kind: ``instance_hours`` hours of
    instances not run (for ``replace_node_group``: of the old type, replaced by the cheaper one), ``usd``
    USD saved; ``removals`` counts the actions that started saving that day (instances removed, groups
    replaced)."""

    day: date
    node_group: str
    instance_hours: float
    usd: float
    removals: int
    kind: str = "scale_in"


def _removal(entry: LedgerEntry) -> bool:
    if entry.result != "applied" or entry.hourly_savings_usd is None:
        return False
    if entry.kind == REPLACE_KIND:
        return entry.step == REPLACE_STEP and entry.node_group is not None
    return entry.kind in ("scale_in", "resize_instance") and entry.node is not None


def _restore(entry: LedgerEntry) -> bool:
    return entry.kind == RESTORE_KIND and entry.step in BILLED_AGAIN_STEPS and entry.result == "applied"


def _billed_again_at(entry: LedgerEntry) -> datetime:
    """When the entry's instances started to be billed: a measured scale-out's request (its reason
    carries it), else the entry's own instant."""
    if entry.step == TIMING_STEP and entry.node_group and entry.node:
        timing = timing_from_reason(entry.node_group, entry.node, entry.reason)
        if timing is not None:
            return timing.requested_at
    return entry.at


def _split_by_day(start: datetime, end: datetime) -> Iterable[tuple[date, float]]:
    cursor = start
    while cursor < end:
        midnight = datetime.combine(cursor.date() + timedelta(days=1), datetime.min.time(), UTC)
        stop = min(midnight, end)
        yield cursor.date(), (stop - cursor).total_seconds() / 3600.0
        cursor = stop


def realized_savings(entries: Iterable[LedgerEntry], now: datetime) -> list[RealizedSavings]:
    """Instance-hours avoided and USD saved per (UTC day, node group, kind), oldest day first, then by group
    and kind.

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
            restores.setdefault(e.node_group, []).append(_billed_again_at(e))
    totals: dict[tuple[date, str, str], list[float]] = {}
    for e in ordered:
        if not _removal(e) or e.at >= now:
            continue
        group = e.node_group or "(standalone)"
        end = min([t for t in restores.get(group, []) if t > e.at] + [now])
        instances = e.instances if e.instances is not None else 1
        first = True
        for day, hours in _split_by_day(e.at, end):
            slot = totals.setdefault((day, group, e.kind), [0.0, 0.0, 0.0])
            slot[0] += hours * instances
            slot[1] += hours * (e.hourly_savings_usd or 0.0)
            slot[2] += 1 if first else 0
            first = False
    return [
        RealizedSavings(day, group, hours, usd, int(count), kind)
        for (day, group, kind), (hours, usd, count) in sorted(totals.items())
    ]
