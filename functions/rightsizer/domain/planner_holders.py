"""The planner's parts for workloads and showback (issue 32): device signals over another window, one
node's GPU assessment over a given window, a node's activity class, and the workload verdicts of the plan.
Kept apart from ``domain.planner`` (which calls them) so each stays one job and under the size cap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from rightsizer.domain.catalog import InstanceType
from rightsizer.domain.gpu import GpuAssessment, assess_gpus
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import ClusterSnapshot, Node
from rightsizer.domain.observation import signals_from_observation
from rightsizer.domain.policy import Policy
from rightsizer.domain.showback import NodeHolders, shares
from rightsizer.domain.usage import CollectedSignals, Window, collect_signals
from rightsizer.domain.workloads import Activity, Holder, WorkloadVerdict, judge_workloads

__all__ = ["GpuFacts", "activity_of", "signals_over", "workload_verdicts"]


def signals_over(
    snapshot: ClusterSnapshot, joiner: NodeJoiner, window: Window, policy: Policy
) -> CollectedSignals | None:
    """Device signals over ``window``; None when the snapshot's signals were collected live for another
    window (the live path computes them in Prometheus for the decision window only) or are format-2 facts
    over a shorter window than ``window`` (format 1 holds raw samples and is re-windowed)."""
    if isinstance(snapshot.signals, CollectedSignals):
        if window.seconds == policy.idle_window:
            return snapshot.signals
        longer = snapshot.workload_signals
        return (
            longer
            if isinstance(longer, CollectedSignals) and window.seconds == policy.workloads.idle_window
            else None
        )
    if snapshot.meta.metrics_format >= 2:
        if window.seconds > snapshot.meta.window_seconds:
            return None  # format-2 facts cover their own window only (a replay decides as the live path)
        files = {"step": snapshot.metrics, "timestamp": snapshot.timestamps, **snapshot.metric_extras}
        return signals_from_observation(files, joiner, window, policy.gpu_activity_max_pct)
    return collect_signals(snapshot.metrics, snapshot.timestamps, joiner, window, policy.gpu_activity_max_pct)


def activity_of(assessment: GpuAssessment) -> Activity:
    """``busy`` (a device busy at a step), ``idle`` (every device idle the whole window) or ``unknown``."""
    return "busy" if assessment.busy else "idle" if assessment.idle else "unknown"


@dataclass(frozen=True)
class GpuFacts:
    """What ``assess_gpus`` reads of one node besides the signals and the window."""

    node: Node
    row: InstanceType | None
    ceilings: Mapping[str, float]
    at: datetime
    exporter: str | None
    signal_set: frozenset[str]

    def assess(self, signals: CollectedSignals, window: Window, policy: Policy) -> GpuAssessment:
        name = self.node.name
        return assess_gpus(
            self.node,
            self.row,
            signals.devices.get(name, []),
            policy=policy,
            power_ceilings=self.ceilings,
            window=window,
            at=self.at,
            up_coverage=signals.up_coverage.get(name),
            problems=signals.problems_of(name),
            present=signals.present,
            exporter=self.exporter,
            signal_set=self.signal_set,
        )


def workload_verdicts(
    snapshot: ClusterSnapshot,
    nodes: Sequence[NodeHolders],
    activity: Mapping[str, Activity],
    policy: Policy,
    at: datetime,
) -> list[WorkloadVerdict]:
    """The verdict of every workload owning a GPU-holding pod on a GPU node (``domain.workloads``), each
    pod priced at its share of its node (``domain.showback.shares``; None on a reserved or unpriced node)."""
    holders: list[Holder] = []
    for n in nodes:
        share = shares(n)
        holders += [
            Holder(
                p,
                n.node.name,
                None if n.hourly_usd is None else round(share.get(p.key, 0.0) * n.hourly_usd, 6),
            )
            for p in n.holders
        ]
    return judge_workloads(holders, snapshot.owners, snapshot.autoscalers, activity, policy.workloads, at)
