"""The window chosen by price: the savings/unserved frontier of a sweep and its best point.

Each sweep point (an ``idle_window`` value, cold and, when asked, with a warm pool) is a pair (billed USD
saved, unserved GPU-minutes). At the operator's price of an unserved GPU-minute
(``Policy.unserved_gpu_minute_usd``) its **net value** is ``usd_saved − price × unserved_gpu_minutes``
(``usd_saved`` is already net of what a warm pool costs). The best point is the one with the highest net
value; the oracle (every idle GPU-minute saved, nothing unserved) is the ceiling. Regrets are reported, not
priced: their cost is the unserved minutes they leave.

Pure: works on a finished :class:`~rightsizer.backtest.report.BacktestReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rightsizer.backtest.report import BacktestReport, Row

__all__ = [
    "Frontier",
    "FrontierPoint",
    "frontier",
    "frontier_json",
    "recommendation_reason",
    "render_frontier",
]


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One sweep point: ``value`` (e.g. ``30m``), ``warm`` (run with the warm pool), billed ``usd_saved``
    (net of the pool's cost), ``warm_pool_usd`` (that cost), ``unserved_gpu_minutes``, ``regrets`` of
    ``removals``, ``share_of_oracle`` (GPU-hours) and ``net_usd`` at the frontier's price."""

    value: str
    warm: bool
    usd_saved: float
    warm_pool_usd: float
    unserved_gpu_minutes: float
    regrets: int
    removals: int
    share_of_oracle: float | None
    net_usd: float


@dataclass(frozen=True, slots=True)
class Frontier:
    """The sweep's points at ``price`` USD per unserved GPU-minute, the oracle's USD (the ceiling) and
    the best point (highest ``net_usd``; the first of equals, cold before warm); ``best`` is None without
    points."""

    key: str
    price: float
    cold: tuple[FrontierPoint, ...]
    warm: tuple[FrontierPoint, ...]
    oracle_usd: float
    best: FrontierPoint | None


def _point(row: Row, price: float, *, warm: bool) -> FrontierPoint:
    f = row.figures
    return FrontierPoint(
        value=row.sweep_value or f.name,
        warm=warm,
        usd_saved=f.usd_saved,
        warm_pool_usd=f.warm_pool_usd,
        unserved_gpu_minutes=f.unserved_gpu_minutes,
        regrets=f.regrets,
        removals=f.removals,
        share_of_oracle=f.share_of_oracle,
        net_usd=f.usd_saved - price * f.unserved_gpu_minutes,
    )


def frontier(report: BacktestReport, price: float | None = None) -> Frontier | None:
    """The frontier of ``report``'s sweep, or None without a sweep.

    Args:
        report: a finished backtest with a sweep.
        price: USD per unserved GPU-minute; default the swept policy's ``unserved_gpu_minute_usd``.

    Raises:
        ValueError: a negative price.
    """
    if report.sweep is None or not report.sweep_rows:
        return None
    if price is None:
        policy = report.sweep_rows[0].policy
        price = policy.unserved_gpu_minute_usd if policy is not None else 0.0
    if price < 0:
        raise ValueError("the price of an unserved GPU-minute cannot be negative")
    cold = tuple(_point(r, price, warm=False) for r in report.sweep_rows)
    warm = tuple(_point(r, price, warm=True) for r in report.warm_rows)
    best = max([*cold, *warm], key=lambda p: p.net_usd, default=None)
    return Frontier(report.sweep.key, price, cold, warm, report.oracle.usd_saved, best)


def _point_json(p: FrontierPoint) -> dict[str, Any]:
    return {
        "value": p.value,
        "warm_pool": p.warm,
        "usd_saved": p.usd_saved,
        "warm_pool_usd": p.warm_pool_usd,
        "unserved_gpu_minutes": p.unserved_gpu_minutes,
        "regrets": p.regrets,
        "removals": p.removals,
        "share_of_oracle": p.share_of_oracle,
        "net_usd": p.net_usd,
    }


def frontier_json(f: Frontier) -> dict[str, Any]:
    """The frontier as JSON (USD, GPU-minutes; ``best`` names the value and whether it is warm)."""
    return {
        "parameter": f.key,
        "unserved_gpu_minute_usd": f.price,
        "oracle_usd": f.oracle_usd,
        "points": [_point_json(p) for p in (*f.cold, *f.warm)],
        "best": None if f.best is None else {"value": f.best.value, "warm_pool": f.best.warm},
    }


def render_frontier(f: Frontier) -> list[str]:
    """Text lines: one per point (billed USD, unserved GPU-min, regrets, net) and the best one."""
    lines = [
        "",
        f"Frontier of {f.key} at USD {f.price:g} per unserved GPU-minute (billed; oracle USD {f.oracle_usd:,.2f})",
    ]
    width = max(len(p.value) for p in (*f.cold, *f.warm))
    for p in (*f.cold, *f.warm):
        label = f"{p.value.ljust(width)} {'warm' if p.warm else 'cold'}"
        lines.append(
            f"  {label}  USD saved {p.usd_saved:>10,.2f}  unserved GPU-min {p.unserved_gpu_minutes:>8,.0f}  "
            f"regrets {p.regrets:>5}/{p.removals:<5}  net USD {p.net_usd:>10,.2f}"
        )
    if f.best is not None:
        how = "with the warm pool" if f.best.warm else "cold"
        lines.append(f"  best: {f.key}={f.best.value} {how} (net USD {f.best.net_usd:,.2f})")
    return lines


def recommendation_reason(f: Frontier, start: float, end: float) -> str | None:
    """The ledger reason recording the best window of a backtest on the cluster's own history
    (``rightsizer.services.status.recommended_window`` reads it back), or None without a best point."""
    if f.best is None:
        return None
    return (
        f"{f.key}={f.best.value} warm_pool={'true' if f.best.warm else 'false'} net_usd={f.best.net_usd:.2f} "
        f"unserved_gpu_minute_usd={f.price:g} from={int(start)} to={int(end)}"
    )
