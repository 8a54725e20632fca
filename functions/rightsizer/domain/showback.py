"""Showback: who holds idle GPUs, in GPU-hours and USD (docs/architecture.md §3 "Showback", issue 32).

A **hold** is a pod the planner already names a GPU holder (``idle_gpu_holder``, ``domain.pods.gpu_holding``)
on a node whose every expected device was idle for the whole idle window (``GpuAssessment.idle``): the
GPUs it reserves did no work. Nothing here is a verdict: a hold is reported whatever the node's verdict
(protected by the holder itself, or idle when ``evict_idle_gpu_holders`` is on).

Per hold (pure arithmetic, no clock):

- ``share`` of the node = the pod's GPU units (``Pod.gpu_request``: ``nvidia.com/gpu``, ``.shared``,
  ``mig-*`` from requests or limits) ÷ the node's GPU capacity units (Σ ``status.capacity`` of those
  resources; the physical GPU count when the node lists none). A holder with no counted units (a DRA
  claim, a privileged container, ``NVIDIA_VISIBLE_DEVICES``) takes an equal part of what the counted
  holders leave; the shares of one node never exceed 1.
- ``gpus`` = share × the node's physical GPUs; ``hourly_usd`` = share × the node's USD per hour.
- ``hours`` = the part of the idle window the pod held them: min(window, at − the pod's ``startTime``).
- ``gpu_hours`` = gpus × hours; ``usd`` = hourly_usd × hours (None when the node is not priced or is a
  reserved instance, whose idle hours are paid for either way and cost no extra USD here).

Holds are summed per namespace and per value of a team label (policy ``showback_team_label``, default
``team``; pods without it count under ``(none)``), as Kubecost allocates a node's cost to its pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from rightsizer.domain.model import Node, Pod, is_gpu_resource
from rightsizer.domain.quantity import parse_count

__all__ = [
    "NO_TEAM",
    "Hold",
    "HolderReport",
    "NodeHolders",
    "Showback",
    "ShowbackRow",
    "idle_holds",
    "shares",
    "showback",
]

#: The team of a pod without the team label.
NO_TEAM = "(none)"


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HolderReport(_Out):
    """One pod holding idle GPUs: where, whose, how many GPUs (fractional for a share), for how long (hours,
    within the idle window) and what it cost (USD per hour now, USD over ``hours``; None when unpriced)."""

    pod: str
    namespace: str
    team: str
    node: str
    gpus: float
    hours: float
    gpu_hours: float
    hourly_usd: float | None
    usd: float | None


class ShowbackRow(_Out):
    """Idle holds summed for one namespace or team: pods, GPUs, GPU-hours, USD per hour and USD (USD over
    the rows' hours; the unpriced holds are left out of the USD and counted in ``unpriced``)."""

    key: str
    pods: int
    gpus: float
    gpu_hours: float
    hourly_usd: float
    usd: float
    unpriced: int


class Showback(_Out):
    """The plan's showback: the idle window it covers (hours), the team label read, the holders, and their
    sums per namespace and per team (sorted by USD, highest first, then key)."""

    window_hours: float
    team_label: str
    holders: list[HolderReport]
    by_namespace: list[ShowbackRow]
    by_team: list[ShowbackRow]
    gpu_hours: float
    usd: float


@dataclass(frozen=True, slots=True)
class NodeHolders:
    """What showback needs of one GPU node: the node, its physical GPUs, its USD per hour (None: unpriced
    or reserved), whether every device was idle for the whole window, and its GPU-holding pods."""

    node: Node
    physical_gpus: int
    hourly_usd: float | None
    idle: bool
    holders: Sequence[Pod]


@dataclass(frozen=True, slots=True)
class Hold:
    """A pod's share of one idle node (0 < share ≤ 1) and the seconds it held it within the window."""

    pod: Pod
    node: NodeHolders
    share: float
    seconds: float


def _capacity_units(node: Node, physical: int) -> float:
    units = sum(parse_count(v) for k, v in node.status.capacity.items() if is_gpu_resource(k))
    return float(units or physical or 1)


def shares(n: NodeHolders) -> dict[str, float]:
    """Each holder's share of node ``n`` (pod key → 0 < share ≤ 1; module docstring), idle or not."""
    capacity = _capacity_units(n.node, n.physical_gpus)
    counted = {p.key: min(p.gpu_request() / capacity, 1.0) for p in n.holders if p.gpu_request() > 0}
    uncounted = [p for p in n.holders if p.key not in counted]
    total = sum(counted.values())
    out = {k: v / total if total > 1.0 else v for k, v in counted.items()}
    left = max(0.0, 1.0 - total)
    out.update({p.key: left / len(uncounted) for p in uncounted})
    return {k: v for k, v in out.items() if v > 0}


def idle_holds(nodes: Iterable[NodeHolders], at: datetime, window_seconds: int) -> list[Hold]:
    """The holds of idle GPUs on ``nodes`` at ``at`` (aware) over the last ``window_seconds``.

    Returns:
        One ``Hold`` per holder pod of every idle node, in the order given.
    """
    out: list[Hold] = []
    for n in nodes:
        if not n.idle or not n.holders:
            continue
        share = shares(n)
        for p in n.holders:
            if p.key not in share:
                continue
            started = p.status.startTime or p.metadata.creationTimestamp
            held = window_seconds if started is None else (at - started).total_seconds()
            out.append(Hold(p, n, share[p.key], float(min(max(held, 0.0), window_seconds))))
    return out


def _rows(reports: Sequence[HolderReport], key: str) -> list[ShowbackRow]:
    groups: dict[str, list[HolderReport]] = {}
    for r in reports:
        groups.setdefault(getattr(r, key), []).append(r)
    rows = [
        ShowbackRow(
            key=k,
            pods=len(rs),
            gpus=round(sum(r.gpus for r in rs), 6),
            gpu_hours=round(sum(r.gpu_hours for r in rs), 6),
            hourly_usd=round(sum(r.hourly_usd or 0.0 for r in rs), 6),
            usd=round(sum(r.usd or 0.0 for r in rs), 6),
            unpriced=sum(1 for r in rs if r.usd is None),
        )
        for k, rs in groups.items()
    ]
    return sorted(rows, key=lambda r: (-r.usd, -r.gpu_hours, r.key))


def showback(nodes: Iterable[NodeHolders], at: datetime, window_seconds: int, team_label: str) -> Showback:
    """Idle GPU-hours and USD per holder, namespace and team (module docstring for the arithmetic).

    Args:
        nodes: every GPU node with its holders, idleness and price (``domain.planner`` builds them).
        at: the decision instant (aware).
        window_seconds: the idle window (policy ``idle_window``, seconds).
        team_label: the pod label naming the team (policy ``showback_team_label``).
    """
    reports = []
    for h in idle_holds(nodes, at, window_seconds):
        hours = h.seconds / 3600.0
        gpus = h.share * h.node.physical_gpus
        hourly = None if h.node.hourly_usd is None else h.share * h.node.hourly_usd
        reports.append(
            HolderReport(
                pod=h.pod.key,
                namespace=h.pod.metadata.namespace,
                team=h.pod.metadata.labels.get(team_label) or NO_TEAM,
                node=h.node.node.name,
                gpus=round(gpus, 6),
                hours=round(hours, 6),
                gpu_hours=round(gpus * hours, 6),
                hourly_usd=None if hourly is None else round(hourly, 6),
                usd=None if hourly is None else round(hourly * hours, 6),
            )
        )
    reports.sort(key=lambda r: (-(r.usd or 0.0), r.pod))
    return Showback(
        window_hours=window_seconds / 3600.0,
        team_label=team_label,
        holders=reports,
        by_namespace=_rows(reports, "namespace"),
        by_team=_rows(reports, "team"),
        gpu_hours=round(sum(r.gpu_hours for r in reports), 6),
        usd=round(sum(r.usd or 0.0 for r in reports), 6),
    )
