"""Backtest data: the replayed history (frames), the simulation model and the figures a run produces.

See :mod:`rightsizer.backtest.simulate` for the model's rules (docs/backtest.md).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rightsizer.domain.catalog import Catalog
from rightsizer.domain.model import (
    ALL_SIGNALS,
    ClusterSnapshot,
    Inventory,
    MetricData,
    Node,
    Pod,
    PodDisruptionBudget,
    ResourceClaim,
    Series,
)
from rightsizer.domain.warm_pool import ebs_usd_per_hour

Interval = tuple[float, float]
"""[start, end) in Unix seconds."""

_Indexed = dict[str, tuple[str | None, list[tuple[Series, str | None]]]]
"""Metric name → (its problem, [(series, the node the frame's joiner maps it to, or None)])."""

NAIVE = "naive-threshold"
REQUEST_BASED = "request-based"
ORACLE = "oracle"


@dataclass(frozen=True)
class Frame:
    """Kubernetes and AWS state valid from ``at`` (Unix s) until the next frame (or the history's end).

    ``inventory`` None means "each node is its own node group" (an Auto Scaling group of min 0, desired 1
    holding that node's instance).
    """

    at: float
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...] = ()
    pdbs: tuple[PodDisruptionBudget, ...] = ()
    resource_claims: tuple[ResourceClaim, ...] = ()
    inventory: Inventory | None = None


@dataclass(frozen=True)
class History:
    """What a backtest replays: frames of cluster state and the metric series over [start, end].

    Times are Unix seconds. ``resolution`` is the sample spacing of ``metrics`` in seconds (the query
    step; ~57 s for the Alibaba trace). ``metrics`` / ``timestamps`` are ``query_range``-shaped series
    over the whole period (docs/architecture.md §5 metric names). ``signal_set`` declares the signal families the
    source carries (``{"activity"}`` for a utilisation trace). ``recorded`` holds metrics format 2
    snapshots, decided as they are at their own instants (their facts cover their own window only);
    ``metrics`` then holds their per-step activity for the accounting.
    """

    cluster: str
    region: str
    start: float
    end: float
    resolution: int
    frames: tuple[Frame, ...]
    metrics: Mapping[str, MetricData]
    timestamps: Mapping[str, MetricData] = field(default_factory=dict)
    signal_set: frozenset[str] = ALL_SIGNALS
    node_label: str | None = None
    recorded: tuple[ClusterSnapshot, ...] = ()


@dataclass(frozen=True)
class Source:
    """A loaded history and what a report should say about it.

    ``kind``: ``trace`` | ``snapshot-series`` | ``prometheus``; ``inventory``: where the node list came
    from (``trace``, ``snapshots``, ``kube-state-metrics``, ``dcgm-series``); ``notes``: caveats printed
    beside the figures.
    """

    kind: str
    description: str
    history: History
    inventory: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class WarmPoolModel:
    """A warm pool behind every removed node (EKS ``warmPoolConfig``): a replacement comes from the pool
    ``provision_delay`` seconds after demand, and while the node is out its pooled instance costs
    ``pool_fraction`` of the node's hourly price plus ``ebs_usd_per_hour`` (USD per instance-hour).

    ``STOPPED``: EC2 does not bill a stopped instance, only its EBS volumes (fraction 0, the volumes'
    GB-month price ÷ 730); ``RUNNING``: the full instance price (fraction 1) — it saves nothing while
    pooled and only buys the faster restore.
    """

    provision_delay: int
    pool_fraction: float = 0.0
    ebs_usd_per_hour: float = 0.0
    state: str = "STOPPED"

    @classmethod
    def of(cls, state: str, provision_delay: int, *, volume_gb: float = 100.0) -> WarmPoolModel:
        """A pool in ``state`` restoring in ``provision_delay`` seconds; a STOPPED instance costs its
        ``volume_gb`` of gp3 (``rightsizer.domain.warm_pool``), a RUNNING one its full price.

        Raises:
            ValueError: a state other than STOPPED / RUNNING (HIBERNATED is not modelled: Bottlerocket
                cannot hibernate and most GPU instance families cannot), a negative delay or size.
        """
        if provision_delay < 0:
            raise ValueError("a restore delay cannot be negative")
        if state == "STOPPED":
            return cls(provision_delay, 0.0, ebs_usd_per_hour(volume_gb), "STOPPED")
        if state == "RUNNING":
            return cls(provision_delay, 1.0, 0.0, "RUNNING")
        raise ValueError(f"warm pool state {state!r} is not STOPPED or RUNNING")

    def hourly_usd(self, instance_hourly_usd: float | None) -> float:
        """USD per hour one pooled instance costs (its price unknown: the EBS part only)."""
        return self.pool_fraction * (instance_hourly_usd or 0.0) + self.ebs_usd_per_hour


@dataclass(frozen=True)
class SimModel:
    """Simulation parameters (seconds, percent).

    ``provision_delay`` is how long a replacement takes from its launch (the desired-size change at
    demand) to serving (first GPU pod Ready); ``request_unneeded`` is how long a node must have had no
    GPU-requesting pod before the request-based baseline removes it (Cluster Autoscaler's
    ``scale-down-unneeded-time`` default, 10 min); ``warm_pool`` None = cold restores.
    """

    step: int = 300
    provision_delay: int = 300
    regret_horizon: int = 1800
    activity_threshold_pct: float = 5.0
    request_unneeded: int = 600
    warm_pool: WarmPoolModel | None = None


@dataclass(frozen=True)
class Removal:
    """One simulated removal. Times in Unix seconds; ``demand_at`` None when activity never returned.

    ``demand_at`` is also when the replacement is launched and billed from; ``back_at`` when it serves.
    ``saved_seconds`` is how long no instance was billed for the node ([at, demand_at) inside its
    presence); ``unserved_gpu_minutes`` the active GPU-minutes between ``demand_at`` and ``back_at``.
    """

    node: str
    at: float
    demand_at: float | None
    back_at: float | None
    regret: bool
    saved_seconds: float
    unserved_gpu_minutes: float


@dataclass(frozen=True)
class Figures:
    """The priced outcome of one strategy on one history.

    Units: GPU-hours (physical GPUs × hours), USD, GPU-minutes. Savings are billed savings (no instance
    billed for the node). ``share_of_oracle`` = saved ÷ the oracle's saved (None when the oracle saves
    nothing). ``usd_saved`` counts priced nodes only, net of ``warm_pool_usd`` (what a warm pool cost);
    ``unpriced_gpu_hours_saved`` is the part on instance types without a price; ``readds`` counts nodes
    added back because demand returned (cold starts), regretted or not. ``removed_by_step`` /
    ``saved_by_step`` follow ``Prepared.steps``: nodes removed at that step and cumulative GPU-hours saved.
    """

    name: str
    kind: Literal["policy", "baseline", "oracle"]
    gpu_hours_paid: float
    idle_gpu_hours: float
    gpu_hours_saved: float
    share_of_oracle: float | None
    usd_saved: float
    unpriced_gpu_hours_saved: float
    removals: int
    regrets: int
    unserved_gpu_minutes: float
    readds: int = 0
    warm_pool_usd: float = 0.0
    plan_evaluations: int = 0
    removed_by_step: tuple[int, ...] = ()
    saved_by_step: tuple[float, ...] = ()
    log: tuple[Removal, ...] = ()


@dataclass(frozen=True)
class Ceiling:
    """For an idle window W (seconds): the share of idle GPU time inside idle runs longer than W
    (``share``), and the share a W-window policy could at most remove, run length − W (``reachable``)."""

    window: int
    share: float
    reachable: float


@dataclass
class _Track:
    """One node over the history: presence, price and per-GPU activity on the grid."""

    name: str
    gpus: int
    hourly_usd: float | None
    present: list[Interval]
    devices: list[array[float]]
    active_slots: list[int] = field(default_factory=list)
    holder_times: list[Interval] = field(default_factory=list)


@dataclass
class Prepared:
    """A history made ready for repeated simulation (shared by every strategy of one run).

    ``grid`` holds the sample times (Unix s, ascending); ``steps`` the decision times; ``active_gpus`` /
    ``present_gpus`` per step: GPUs above the threshold at that step and GPUs present (do-nothing run).
    ``oracle_gpu_hours`` is the idle GPU-hours of the do-nothing run (the oracle's savings);
    ``paid_gpu_hours`` what the do-nothing run pays.
    """

    history: History
    model: SimModel
    catalog: Catalog
    grid: list[float]
    steps: list[float]
    tracks: dict[str, _Track]
    frame_times: list[float]
    frame_series: dict[int, tuple[_Indexed, _Indexed]] = field(default_factory=dict)
    reborn_nodes: dict[tuple[str, float], Node] = field(default_factory=dict)
    paid_gpu_hours: float = 0.0
    oracle_gpu_hours: float = 0.0
    active_gpus: list[int] = field(default_factory=list)
    present_gpus: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
