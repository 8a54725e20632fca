"""Measured restore delay (issue 30): how long a scale-out of a managed node group takes to serve.

For every scale-out the product causes or observes on a group it manages (an off-hours restore, a
scale-out after one of its removals) one :class:`RestoreTiming` records the milestones of each new node:

``requested`` (the desired-size change: our ``UpdateNodegroupConfig``, or the scaling activity's start)
→ ``instance_running`` (EC2 ``LaunchTime``, DescribeInstances) → ``node_ready`` (the Node's ``Ready``
condition ``lastTransitionTime``) → ``gpu_allocatable`` (first seen with allocatable GPUs: the device
plugin has registered, BUG-20; no API stamps it, so it is the first observation, at most one tick late)
→ ``first_gpu_pod_ready`` (the ``Ready`` condition of the first pod requesting a GPU on the node).

EC2 bills from ``instance_running``; the workload waits until ``first_gpu_pod_ready`` (or, with no GPU
pod yet, ``gpu_allocatable``, else ``node_ready``): that is the delay the backtest's ``--provision-delay
measured`` uses.
Timings are kept in the ledger (kind ``scale_node_group``, step ``scaled_out``, one entry per node) in a
compact ``key=value`` reason (:meth:`RestoreTiming.reason` / :func:`timing_from_reason`); p50/p95 per node
group come from :func:`delay_stats`.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

__all__ = [
    "MILESTONES",
    "TIMING_STEP",
    "DelayStats",
    "RestoreTiming",
    "Start",
    "delay_stats",
    "nearest_rank",
    "timing_from_reason",
]

#: Ledger step of a recorded scale-out timing (kind ``scale_node_group``).
TIMING_STEP: Final = "scaled_out"
#: The milestones after ``requested``, in the order they happen.
MILESTONES: Final = ("instance_running", "node_ready", "gpu_allocatable", "first_gpu_pod_ready")
Milestone = Literal["instance_running", "node_ready", "gpu_allocatable", "first_gpu_pod_ready"]
Start = Literal["warm", "cold", "unknown"]
"""Where the instance came from: a warm pool (``warm``), a fresh launch (``cold``), or not known."""


def _rfc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class RestoreTiming:
    """The milestones of one node of one scale-out (aware instants; None = not reached or not known).

    ``cause``: ``offhours_restore`` (our restore) or ``scale_out`` (a scale-out we observed after a
    removal of ours); ``start``: warm pool or cold launch.
    """

    node_group: str
    node: str
    cause: str
    requested_at: datetime
    instance_running_at: datetime | None = None
    node_ready_at: datetime | None = None
    gpu_allocatable_at: datetime | None = None
    first_gpu_pod_ready_at: datetime | None = None
    start: Start = "unknown"

    def at(self, milestone: Milestone) -> datetime | None:
        """The instant of ``milestone``."""
        value: datetime | None = getattr(self, f"{milestone}_at")
        return value

    def seconds(self, milestone: Milestone) -> float | None:
        """Seconds from ``requested`` to ``milestone`` (never negative: a node seen Ready before the
        request we measured from counts 0), None when not reached."""
        at = self.at(milestone)
        return None if at is None else max(0.0, (at - self.requested_at).total_seconds())

    @property
    def serving_seconds(self) -> float | None:
        """Seconds until the workload could run: first GPU pod Ready, else GPUs allocatable, else Node
        Ready (a lower bound, when no GPU pod came to show when the GPUs were allocatable)."""
        for m in ("first_gpu_pod_ready", "gpu_allocatable", "node_ready"):
            s = self.seconds(m)
            if s is not None:
                return s
        return None

    @property
    def complete(self) -> bool:
        """The node became Ready (it is only recorded with allocatable GPUs, BUG-27)."""
        return self.node_ready_at is not None

    def reason(self) -> str:
        """The ledger reason: ``cause=… start=… requested=RFC3339 <milestone>=+seconds …`` (milestones
        not reached are left out)."""
        parts = [f"cause={self.cause}", f"start={self.start}", f"requested={_rfc(self.requested_at)}"]
        for m in MILESTONES:
            s = self.seconds(m)
            if s is not None:
                parts.append(f"{m}=+{s:.0f}")
        return " ".join(parts)


def timing_from_reason(node_group: str, node: str, reason: str) -> RestoreTiming | None:
    """Parse :meth:`RestoreTiming.reason`; None when ``reason`` is not one (an older or foreign entry)."""
    fields = dict(part.split("=", 1) for part in reason.split() if "=" in part)
    try:
        requested = datetime.fromisoformat(fields["requested"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    if requested.tzinfo is None:
        return None
    at: dict[str, datetime | None] = {}
    for m in MILESTONES:
        raw = fields.get(m)
        try:
            at[m] = None if raw is None else requested + timedelta(seconds=float(raw.lstrip("+")))
        except ValueError:
            return None
    start = fields.get("start", "unknown")
    return RestoreTiming(
        node_group=node_group,
        node=node,
        cause=fields.get("cause", "scale_out"),
        requested_at=requested,
        instance_running_at=at["instance_running"],
        node_ready_at=at["node_ready"],
        gpu_allocatable_at=at["gpu_allocatable"],
        first_gpu_pod_ready_at=at["first_gpu_pod_ready"],
        start=start if start in ("warm", "cold") else "unknown",  # type: ignore[arg-type]
    )


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0 < q ≤ 1) by the nearest-rank method (a value that was measured), or None."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class DelayStats:
    """p50/p95 seconds from the desired-size change to each milestone, over ``count`` measured nodes of
    ``node_group`` (``warm`` of them from a warm pool); ``serving`` is what the backtest uses."""

    node_group: str
    count: int
    warm: int
    p50: dict[str, float]
    p95: dict[str, float]
    serving_p50: float | None
    serving_p95: float | None


def delay_stats(timings: Iterable[RestoreTiming], *, last: int = 50) -> dict[str, DelayStats]:
    """Per node group, p50/p95 (nearest rank) of each milestone over its newest ``last`` complete
    timings. Incomplete timings (never Ready) are left out: they are overdue restores, reported by
    ``RestoreOverdue``, not delays."""
    by_group: dict[str, list[RestoreTiming]] = {}
    for t in sorted(timings, key=lambda t: t.requested_at):
        if t.complete:
            by_group.setdefault(t.node_group, []).append(t)
    out: dict[str, DelayStats] = {}
    for group, items in sorted(by_group.items()):
        items = items[-last:]
        p50: dict[str, float] = {}
        p95: dict[str, float] = {}
        for m in MILESTONES:
            values = [s for t in items if (s := t.seconds(m)) is not None]
            lo, hi = nearest_rank(values, 0.5), nearest_rank(values, 0.95)
            if lo is not None and hi is not None:
                p50[m], p95[m] = lo, hi
        serving = [s for t in items if (s := t.serving_seconds) is not None]
        out[group] = DelayStats(
            group,
            len(items),
            sum(1 for t in items if t.start == "warm"),
            p50,
            p95,
            nearest_rank(serving, 0.5),
            nearest_rank(serving, 0.95),
        )
    return out
