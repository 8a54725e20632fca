"""``rightsizer status`` and ``history``: what a deployment decided and did, read back from its state table.

Reads only (never acts): the latest assessment's decision records (``PlanHistory``), the drains in flight
(held budget slots → their workflow records and current step), the off-hours node groups whose sizes are
saved for a restore, realized savings from the ledger (per UTC day and node group — the bill of
``rightsizer.services.realized`` — and per action kind), the last failures, and the measured restore
delays per node group (p50/p95, ``rightsizer.services.restore_timing``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rightsizer.domain.holds import FAILED_RESULTS  # the results the failure back-off counts, too
from rightsizer.domain.restore_timing import delay_stats
from rightsizer.services.realized import realized_savings
from rightsizer.services.restore_timing import recorded_timings
from rightsizer.state import LedgerEntry, PlanHistory, StateStore

__all__ = ["FAILED_RESULTS", "StatusReport", "history_rows", "read_status", "recommended_window"]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entry(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "at": _iso(entry.at),
        "execution_id": entry.execution_id,
        "node": entry.node,
        "node_group": entry.node_group,
        "instance_id": entry.instance_id,
        "kind": entry.kind,
        "step": entry.step,
        "result": entry.result,
        "reason": entry.reason,
        "hourly_savings_usd": entry.hourly_savings_usd,
    }


@dataclass
class StatusReport:
    """The status of one cluster at ``at`` (JSON-ready parts; see :func:`read_status`)."""

    cluster: str
    at: str
    plan: dict[str, Any] | None
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    offhours: list[dict[str, Any]] = field(default_factory=list)
    savings_by_day: list[dict[str, Any]] = field(default_factory=list)
    savings_by_kind: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    restore_delays: list[dict[str, Any]] = field(default_factory=list)
    recommended_window: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON document."""
        return {
            "cluster": self.cluster,
            "at": self.at,
            "plan": self.plan,
            "in_flight": self.in_flight,
            "offhours": self.offhours,
            "savings": {
                "by_day_and_node_group": self.savings_by_day,
                "by_action_kind": self.savings_by_kind,
                "total_usd": round(sum(r["usd"] for r in self.savings_by_day), 6),
            },
            "failures": self.failures,
            "reservations": reservations_of(self.plan),
            "restore_delays": self.restore_delays,
            "recommended_window": self.recommended_window,
        }


def reservations_of(plan: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The capacity reservations the latest assessment saw, with their unused USD/h and advice
    (``Plan.reservations`` kept in its summary; none before issue 28's assessments)."""
    if plan is None:
        return []
    return list((plan.get("summary") or {}).get("reservations") or [])


def _by_kind(entries: Iterable[LedgerEntry]) -> list[dict[str, Any]]:
    """Applied actions with a price, per kind: how many and the USD per hour they save together."""
    kinds: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry.result != "applied" or entry.hourly_savings_usd is None:
            continue
        row = kinds.setdefault(entry.kind, {"kind": entry.kind, "applied": 0, "hourly_usd": 0.0})
        row["applied"] += 1
        row["hourly_usd"] = round(row["hourly_usd"] + entry.hourly_savings_usd, 6)
    return [kinds[k] for k in sorted(kinds)]


def read_status(
    state: StateStore,
    plans: PlanHistory,
    now: datetime,
    *,
    offhours_groups: Iterable[str] = (),
    failures: int = 10,
) -> StatusReport:
    """Read the cluster's status from its state.

    Args:
        state: the state store bound to the cluster (ledger, slots, workflow records, saved sizes).
        plans: the decision records' store.
        now: the instant realized savings run to (aware).
        offhours_groups: node groups configured for off-hours; groups the ledger names in off-hours
            entries are added, so tag-selected groups show too.
        failures: how many of the newest failed or rolled-back ledger entries to show.

    Reads: one Query for the latest plan, one for the slots, one per slot (workflow record), the ledger
    once, one GetItem per off-hours group.
    """
    latest = plans.plans(limit=1)
    in_flight = []
    for slot in state.slots():
        record = state.load(slot.owner)
        in_flight.append(
            {
                "node": slot.node,
                "node_group": slot.group,
                "execution_id": slot.owner,
                "since": _iso(slot.taken_at),
                "step": record.step if record else None,
                "status": record.status if record else None,
                "deadline": _iso(record.deadline) if record else None,
            }
        )
    entries = state.entries()
    groups = set(offhours_groups) | {
        e.node_group for e in entries if e.kind == "scale_node_group" and e.node_group is not None
    }
    offhours = []
    for group in sorted(groups):
        saved = state.get_sizes(group)
        if saved is None:
            continue
        offhours.append(
            {
                "node_group": group,
                "saved": {"min": saved.sizes.min, "desired": saved.sizes.desired, "max": saved.sizes.max},
                "saved_at": _iso(saved.saved_at),
                "restore_started_at": _iso(saved.restore_started_at),
            }
        )
    days = [
        {
            "day": r.day.isoformat(),
            "node_group": r.node_group,
            "instance_hours": round(r.instance_hours, 6),
            "usd": round(r.usd, 6),
            "removals": r.removals,
            "kind": r.kind,
        }
        for r in realized_savings(entries, now)
    ]
    failed = [_entry(e) for e in entries if e.result in FAILED_RESULTS][-failures:] if failures > 0 else []
    return StatusReport(
        cluster=state.cluster,
        at=_iso(now) or "",
        plan=latest[0] if latest else None,
        in_flight=in_flight,
        offhours=offhours,
        savings_by_day=days,
        savings_by_kind=_by_kind(entries),
        failures=list(reversed(failed)),
        restore_delays=_restore_delays(entries),
        recommended_window=recommended_window(entries),
    )


def _restore_delays(entries: Iterable[LedgerEntry]) -> list[dict[str, Any]]:
    """Per node group, the measured scale-outs (``services.restore_timing``): how many (warm of them) and
    p50/p95 seconds from the desired-size change to each milestone and to serving."""
    return [
        {
            "node_group": s.node_group,
            "measured": s.count,
            "warm": s.warm,
            "p50_seconds": s.p50,
            "p95_seconds": s.p95,
            "serving_p50_seconds": s.serving_p50,
            "serving_p95_seconds": s.serving_p95,
        }
        for s in delay_stats(recorded_timings(entries)).values()
    ]


def history_rows(state: StateStore, *, node: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` ledger entries of the cluster (optionally one node's), oldest first."""
    entries = state.entries(node=node)
    return [_entry(e) for e in entries[-limit:]] if limit > 0 else []


def recommended_window(entries: Iterable[LedgerEntry]) -> dict[str, Any] | None:
    """The newest idle window a backtest on the cluster's own history recommended (``backtest
    --prometheus --config --sweep idle_window=…`` records it; ``rightsizer.backtest.frontier``): the swept
    key's value, whether with a warm pool, the net USD, the price and the history's span; None when none."""
    found = [e for e in entries if e.kind == "backtest" and e.step == "recommended_window"]
    if not found:
        return None
    latest = max(found, key=LedgerEntry.sort_key)
    fields = dict(part.split("=", 1) for part in latest.reason.split() if "=" in part)
    key = next(iter(fields), None)
    if key is None:
        return None
    out: dict[str, Any] = {"parameter": key, "value": fields[key], "at": _iso(latest.at)}
    out["warm_pool"] = fields.get("warm_pool") == "true"
    for name in ("net_usd", "unserved_gpu_minute_usd"):
        try:
            out[name] = float(fields[name])
        except (KeyError, ValueError):
            out[name] = None
    for name in ("from", "to"):
        try:
            out[name] = _iso(datetime.fromtimestamp(int(fields[name]), UTC))
        except (KeyError, ValueError):
            out[name] = None
    return out
