"""Warm pools for the node groups off-hours takes down (issue 30; the arithmetic is
:mod:`rightsizer.domain.warm_pool`).

For each configured off-hours group: read it (EKS ``DescribeNodegroup``), weigh a STOPPED pool holding the
instances it takes down against the unserved GPU-minutes it saves at ``policy.unserved_gpu_minute_usd``
(restore delays measured by ``services.restore_timing`` when there are any, else 5 min cold and
``WARM_STOPPED_RATIO`` of it warm; down hours and restores per month from the group's schedule over the next
30 days), report the pool's drift from the group's launch template, and — only when asked to apply, the
policy says ``allow_warm_pool: true`` and acting is allowed — set the recommended ``warmPoolConfig``
through ``UpdateNodegroupConfig``. Spot, mixed-instance and custom-AMI groups are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from rightsizer.config import OffhoursConfig
from rightsizer.domain.catalog import Catalog
from rightsizer.domain.errors import RightsizerError
from rightsizer.domain.periods import Period, next_transition, schedule_contains
from rightsizer.domain.policy import Policy
from rightsizer.domain.restore_timing import nearest_rank
from rightsizer.domain.warm_pool import (
    WARM_STOPPED_RATIO,
    PoolInputs,
    PoolRecommendation,
    WarmInstance,
    WarmPoolGroup,
    drift,
    recommend,
)
from rightsizer.services.restore_timing import recorded_timings
from rightsizer.state import LedgerEntry, OffhoursStore

__all__ = ["DEFAULT_COLD_DELAY_S", "WarmPoolPort", "WarmPoolReport", "schedule_month", "warm_pool_reports"]

#: Restore delay assumed until a group's restores are measured (the backtest's default).
DEFAULT_COLD_DELAY_S = 300.0
#: EBS GB per instance assumed when the group names none (a launch template's volumes are not read).
DEFAULT_VOLUME_GB = 100.0


class WarmPoolPort(Protocol):
    """The calls a warm pool decision makes (``rightsizer.adapters.warm_pools.WarmPools``)."""

    def describe(self, cluster: str, nodegroup: str) -> WarmPoolGroup:
        """EKS ``DescribeNodegroup``."""
        ...

    def set_warm_pool(self, cluster: str, nodegroup: str, config: dict[str, Any]) -> str | None:
        """EKS ``UpdateNodegroupConfig`` with ``warmPoolConfig``; the update id."""
        ...

    def warm_instances(self, asg_name: str) -> list[WarmInstance]:
        """Auto Scaling ``DescribeWarmPool`` instances."""
        ...


@dataclass
class WarmPoolReport:
    """One group: the recommendation, the pool it has now, the drift of its warm instances, what was
    applied (``set``, ``already_set``, ``dry_run``, ``not_allowed``, ``refused:<reason>``, or None when
    not asked) and an error."""

    node_group: str
    recommendation: PoolRecommendation | None = None
    current: dict[str, Any] | None = None
    drift: list[str] = field(default_factory=list)
    applied: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (USD per month, GPU-minutes per month)."""
        r = self.recommendation
        return {
            "node_group": self.node_group,
            "recommended": None if r is None else r.config,
            "refusal": None if r is None else r.refusal,
            "usd_per_month": None if r is None else r.usd_per_month,
            "unserved_gpu_minutes_per_month_cold": None if r is None else r.unserved_gpu_minutes_cold,
            "unserved_gpu_minutes_per_month_warm": None if r is None else r.unserved_gpu_minutes_warm,
            "net_usd_per_month": None if r is None else r.value_usd_per_month,
            "notes": [] if r is None else list(r.notes),
            "current": self.current,
            "drift": self.drift,
            "applied": self.applied,
            "error": self.error,
        }


def schedule_month(periods: Sequence[Period], now: datetime) -> tuple[float, float]:
    """(hours down, restores) over the 30 days after ``now`` (the schedule's down periods and how many
    of them end)."""
    end = now + timedelta(days=30)
    cursor, down, restores = now, 0.0, 0
    inside = schedule_contains(periods, cursor)
    while cursor < end:
        nxt = next_transition(periods, cursor) or end
        stop = min(nxt, end)
        if inside:
            down += (stop - cursor).total_seconds() / 3600
            if nxt <= end:
                restores += 1
        cursor, inside = stop, not inside
        if nxt >= end:
            break
    return down, float(restores)


def _delays(entries: Sequence[LedgerEntry], group: str) -> tuple[float, float]:
    timings = [t for t in recorded_timings(entries) if t.node_group == group and t.complete]
    cold = nearest_rank(
        [s for t in timings if t.start != "warm" and (s := t.serving_seconds) is not None], 0.5
    )
    warm = nearest_rank(
        [s for t in timings if t.start == "warm" and (s := t.serving_seconds) is not None], 0.5
    )
    cold_s = cold if cold is not None else DEFAULT_COLD_DELAY_S
    return cold_s, warm if warm is not None else cold_s * WARM_STOPPED_RATIO


def _same(current: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    return current is not None and all(current.get(k) == v for k, v in wanted.items())


def warm_pool_reports(
    port: WarmPoolPort,
    *,
    cluster: str,
    offhours: OffhoursConfig,
    policy: Policy,
    catalog: Catalog,
    saved: OffhoursStore,
    entries: Sequence[LedgerEntry],
    now: datetime,
    apply: bool = False,
    acting: bool = False,
) -> list[WarmPoolReport]:
    """A :class:`WarmPoolReport` per configured off-hours group (see the module).

    Args:
        port: the EKS / Auto Scaling calls.
        apply: ``rightsizer apply``: set the recommendation when ``policy.allow_warm_pool``.
        acting: acting is allowed (``--execute`` and ``dry_run: false``); otherwise ``dry_run``.
    """
    reports = []
    for entry in offhours.node_groups:
        report = WarmPoolReport(entry.name)
        reports.append(report)
        try:
            group = port.describe(cluster, entry.name)
            report.current = group.warm_pool
            kept = saved.get_sizes(entry.name)
            instances = kept.sizes.desired if kept is not None else group.desired
            row = catalog.get(group.instance_types[0]) if group.instance_types else None
            cold, warm = _delays(entries, entry.name)
            down, restores = schedule_month(offhours.schedules.get(entry.schedule, []), now)
            rec = recommend(
                PoolInputs(
                    node_group=entry.name,
                    capacity_type=group.capacity_type,
                    instance_types=group.instance_types,
                    ami_type=group.ami_type,
                    instances=instances,
                    gpus=max(1, row.gpu_count) if row else 1,
                    hourly_usd=row.hourly_usd if row else None,
                    volume_gb=float(group.disk_size or DEFAULT_VOLUME_GB),
                    instance_store=bool(row and row.local_nvme_gb),
                    cold_delay_s=cold,
                    warm_delay_s=warm,
                    down_hours_per_month=down,
                    restores_per_month=restores,
                    price=policy.unserved_gpu_minute_usd,
                )
            )
            report.recommendation = rec
            if group.warm_pool and group.warm_pool.get("enabled") and group.asg_name:
                report.drift = drift(group, port.warm_instances(group.asg_name))
            if apply:
                report.applied = _apply(port, cluster, rec, group, policy, acting)
        except RightsizerError as exc:
            report.error = f"{type(exc).__name__}: {exc}"
    return reports


def _apply(
    port: WarmPoolPort,
    cluster: str,
    rec: PoolRecommendation,
    group: WarmPoolGroup,
    policy: Policy,
    acting: bool,
) -> str | None:
    if rec.refusal is not None:
        return f"refused:{rec.refusal}"
    if rec.config is None:
        return None
    if not policy.allow_warm_pool:
        return "not_allowed"
    if _same(group.warm_pool, rec.config):
        return "already_set"
    if not acting:
        return "dry_run"
    port.set_warm_pool(cluster, group.name, rec.config)
    return "set"
