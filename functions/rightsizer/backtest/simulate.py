"""Backtest: price a policy on history before turning it on (pure: no I/O, no clock).

Model (docs/backtest.md):

- Simulated time advances in decision steps (``SimModel.step``, default 5 min). At each step the SAME
  ``plan()`` decides on an in-memory ``ClusterSnapshot`` of the nodes present then, whose metric series are
  restricted to the idle window ending at that step. Its ``scale_in`` actions take effect at once.
- A removed node stops costing money. When a removed node's workload becomes active again (a GPU above
  ``activity_threshold_pct``), a replacement is launched at that instant (``demand``) and is Ready
  ``provision_delay`` later (default 5 min); the active GPU-minutes until then are **unserved**. A re-added
  node is a new node (its creation time is the re-add time), so ``node_too_young`` and ``cooldown`` apply
  to it as they would in a cluster.
- **Billed accounting**: EC2 bills an instance from its launch (``RunInstances``; per second for Linux
  on-demand after the first minute), so a removal saves only [removal, demand): while no instance is
  billed for the node. The replacement's provisioning is paid and unserved at once; a longer restore
  delay never raises savings, it only adds unserved GPU-minutes (and keeps the node out of the next
  decisions longer). With a warm pool (``SimModel.warm_pool``) the replacement comes from the pool in the
  pool's own delay and the pooled instance costs its pool price (EBS for ``STOPPED``) while the node is out.
- A removal **regrets** when activity returns within ``regret_horizon`` (default 30 min) of it.
- The **oracle** removes every GPU exactly for its idle time (activity ≤ threshold, from samples) and
  re-adds it instantly: its savings are the ceiling. Missing samples are not idle time for anyone.
- Each node is its own node group (min 0, desired 1) unless a frame carries an ``Inventory``.

Accounting grid: the history's samples sit on a grid of ``resolution`` seconds; the sample at ``g``
stands for the interval (g − resolution, g]. A node costs money while it is present (its frames) and not
removed; GPU-hours are physical GPUs (catalog count, as the plan reports them) × hours.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from rightsizer.backtest.model import (
    NAIVE,
    ORACLE,
    REQUEST_BASED,
    Ceiling,
    Figures,
    Frame,
    History,
    Interval,
    Prepared,
    Removal,
    SimModel,
    Source,
    WarmPoolModel,
    _Indexed,
    _Track,
)
from rightsizer.domain.catalog import Catalog, load_catalog
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.gpu import expected_devices, is_gpu_node
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import (
    AsgInfo,
    ClusterSnapshot,
    Inventory,
    MetricData,
    Node,
    Pod,
    Series,
    SnapshotMeta,
)
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import Window, gpu_activity

__all__ = [
    "NAIVE",
    "ORACLE",
    "REQUEST_BASED",
    "Ceiling",
    "Figures",
    "Frame",
    "History",
    "Interval",
    "Prepared",
    "Removal",
    "SimModel",
    "Source",
    "WarmPoolModel",
    "ceilings",
    "idle_run_lengths",
    "prepare",
    "run_naive",
    "run_oracle",
    "run_policy",
    "run_request_based",
    "snapshot_at",
]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _overlap_many(a0: float, a1: float, intervals: Sequence[Interval]) -> float:
    return sum(_overlap(a0, a1, b0, b1) for b0, b1 in intervals)


def _intersect(a0: float, a1: float, intervals: Sequence[Interval]) -> list[Interval]:
    out = []
    for b0, b1 in intervals:
        lo, hi = max(a0, b0), min(a1, b1)
        if hi > lo:
            out.append((lo, hi))
    return out


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _all_nodes_and_pods(frames: Sequence[Frame]) -> tuple[list[Node], list[Pod]]:
    nodes: dict[str, Node] = {}
    pods: dict[tuple[str, str, str], Pod] = {}
    for f in frames:
        for n in f.nodes:
            nodes[n.name] = n
        for p in f.pods:
            pods[(p.metadata.namespace, p.metadata.name, p.spec.nodeName)] = p
    return list(nodes.values()), list(pods.values())


def _holds_gpu(pod: Pod) -> bool:
    """A pod Cluster Autoscaler / Karpenter count on a GPU node: it requests GPUs and is not finished."""
    return pod.status.phase not in ("Succeeded", "Failed") and pod.gpu_request() > 0


def prepare(history: History, model: SimModel | None = None, *, catalog: Catalog | None = None) -> Prepared:  # noqa: C901 (24): indexing a replayed history, one branch per source kind and gap rule
    """Index a history for simulation: node presence, per-GPU activity on the grid, series by node.

    Args:
        history: frames and metric series (see ``History``).
        model: simulation parameters (defaults of ``SimModel``).
        catalog: the instance catalog (defaults to the packaged one) for GPU counts and prices.

    Returns:
        A ``Prepared`` history; its ``paid_gpu_hours`` / ``oracle_gpu_hours`` are the do-nothing run's
        paid and idle GPU-hours.

    Raises:
        ValueError: when the history has no frames, a non-positive resolution or ``end < start``.
    """
    model = model or SimModel()
    catalog = catalog or load_catalog()
    if not history.frames or history.resolution <= 0 or history.end < history.start:
        raise ValueError("a history needs frames, a positive resolution and end >= start")
    r = history.resolution
    frames = sorted(history.frames, key=lambda f: f.at)
    n_slots = int((history.end - history.start) // r) + 1
    grid = [history.end - (n_slots - 1 - j) * r for j in range(n_slots)]
    window = Window(end=history.end, seconds=n_slots * r, step=r)
    all_nodes, all_pods = _all_nodes_and_pods(frames)
    joiner = NodeJoiner(all_nodes, all_pods, history.node_label)

    # Presence: the frames a node appears in, merged.
    present: dict[str, list[Interval]] = {}
    latest: dict[str, Node] = {}
    holders: dict[str, list[Interval]] = {}
    for k, f in enumerate(frames):
        f_end = frames[k + 1].at if k + 1 < len(frames) else history.end
        if f_end <= f.at:
            continue
        for n in f.nodes:
            if not is_gpu_node(n, catalog):
                continue
            latest[n.name] = n
            spans = present.setdefault(n.name, [])
            if spans and spans[-1][1] == f.at:
                spans[-1] = (spans[-1][0], f_end)
            else:
                spans.append((f.at, f_end))
        for p in f.pods:
            if p.spec.nodeName and _holds_gpu(p):
                spans = holders.setdefault(p.spec.nodeName, [])
                if spans and spans[-1][1] == f.at:
                    spans[-1] = (spans[-1][0], f_end)
                elif not spans or spans[-1] != (f.at, f_end):
                    spans.append((f.at, f_end))

    activity = gpu_activity(history.metrics, joiner, window)
    by_node: dict[str, list[dict[int, float]]] = {}
    for (node_name, _device), slots in sorted(activity.items()):
        by_node.setdefault(node_name, []).append(slots)

    tracks: dict[str, _Track] = {}
    thr = model.activity_threshold_pct
    paid = oracle = 0.0
    for name, node in sorted(latest.items()):
        row = catalog.get(node.instance_type)
        gpus = max(1, expected_devices(node, row).physical)
        devices: list[array[float]] = []
        for slots in by_node.get(name, [])[:gpus]:
            values = array("d", [math.nan]) * n_slots
            for k, v in slots.items():
                values[n_slots - 1 - k] = v
            devices.append(values)
        spans = present[name]
        track = _Track(name, gpus, row.hourly_usd if row else None, spans, devices)
        track.holder_times = holders.get(name, [])
        active: set[int] = set()
        for values in devices:
            for j, v in enumerate(values):
                if v > thr and _overlap_many(grid[j] - r, grid[j], spans) > 0:
                    active.add(j)
        track.active_slots = sorted(active)
        tracks[name] = track
        paid += gpus * sum(b - a for a, b in spans) / 3600
        oracle += _idle_seconds(track, grid, r, thr, spans) / 3600

    steps = []
    t = history.start + model.step
    while t <= history.end + 1e-9:
        steps.append(t)
        t += model.step

    prepared = Prepared(
        history=replace(history, frames=tuple(frames)),
        model=model,
        catalog=catalog,
        grid=grid,
        steps=steps,
        tracks=tracks,
        frame_times=[f.at for f in frames],
        paid_gpu_hours=paid,
        oracle_gpu_hours=oracle,
    )
    for t in steps:
        j = bisect.bisect_right(grid, t) - 1
        act = tot = 0
        for tr in tracks.values():
            if any(a <= t < b for a, b in tr.present):
                tot += tr.gpus
                if j >= 0:
                    act += sum(1 for d in tr.devices if d[j] > thr)
        prepared.active_gpus.append(act)
        prepared.present_gpus.append(tot)
    missing = [n for n, tr in tracks.items() if len(tr.devices) < tr.gpus]
    if missing:
        prepared.notes.append(
            f"{len(missing)} node(s) have fewer GPU series than GPUs; their unseen GPUs never count as idle"
        )
    return prepared


def _idle_seconds(
    track: _Track, grid: Sequence[float], r: int, thr: float, spans: Sequence[Interval]
) -> float:
    """GPU-seconds with a known sample ≤ ``thr`` (percent) overlapping ``spans``."""
    total = 0.0
    for values in track.devices:
        for lo, hi in spans:
            for j in _slot_range(grid, r, lo, hi):
                if values[j] <= thr:
                    total += _overlap(grid[j] - r, grid[j], lo, hi)
    return total


def _slot_range(grid: Sequence[float], r: int, a: float, b: float) -> range:
    """Grid indices whose slot (g − r, g] overlaps [a, b)."""
    lo = bisect.bisect_right(grid, a)
    hi = bisect.bisect_left(grid, b + r)
    return range(lo, min(hi, len(grid)))


# ------------------------------------------------------------------------------------------ strategies


@dataclass
class _State:
    """One run's bookkeeping: every removal so far, the nodes out now (→ back time, None = never), the
    re-add time of nodes that came back, removals per decision step and nodes evaluated by ``plan``."""

    removals: list[Removal] = field(default_factory=list)
    out: dict[str, float | None] = field(default_factory=dict)  # node → back_at (None: never)
    reborn: dict[str, float] = field(default_factory=dict)
    removed_by_step: list[int] = field(default_factory=list)
    evaluations: int = 0


def _release(state: _State, t: float) -> None:
    """Nodes whose replacement is up by ``t`` are present again, as new nodes created at their back time."""
    for name, back in list(state.out.items()):
        if back is not None and back <= t:
            del state.out[name]
            state.reborn[name] = back


def _remove(prep: Prepared, state: _State, name: str, t: float, *, by_pods: bool = False) -> None:
    """Record the removal of ``name`` at ``t``: when demand returns, the node is back ``provision_delay``
    later; the active GPU-minutes in between are unserved."""
    track = prep.tracks[name]
    r = prep.history.resolution
    m = prep.model
    grid = prep.grid
    demand: float | None = None
    j0 = bisect.bisect_right(grid, t)
    k = bisect.bisect_left(track.active_slots, j0)
    if k < len(track.active_slots):
        demand = max(t, grid[track.active_slots[k]] - r)
    if by_pods:
        for a, b in track.holder_times:
            if b > t:
                onset = max(a, t)
                demand = onset if demand is None else min(demand, onset)
                break
    delay = m.warm_pool.provision_delay if m.warm_pool is not None else m.provision_delay
    back = None if demand is None else demand + delay
    # Billed: the replacement is paid from its launch at ``demand``, not from when it is back.
    removed = _intersect(t, demand if demand is not None else prep.history.end, track.present)
    saved = sum(b - a for a, b in removed)
    unserved = 0.0
    if demand is not None and back is not None:
        window = _intersect(demand, back, track.present)
        for values in track.devices:
            for lo, hi in window:
                for j in _slot_range(grid, r, lo, hi):
                    if values[j] > m.activity_threshold_pct:
                        unserved += _overlap(grid[j] - r, grid[j], lo, hi)
    regret = demand is not None and demand - t <= m.regret_horizon
    state.removals.append(Removal(name, t, demand, back, regret, saved, unserved / 60))
    state.out[name] = back


def _figures(prep: Prepared, state: _State, name: str, kind: Literal["policy", "baseline"]) -> Figures:
    """Account a finished run: paid, idle, saved GPU-hours, USD, regrets, unserved GPU-minutes."""
    r = prep.history.resolution
    thr = prep.model.activity_threshold_pct
    saved_gpu_h = usd = unpriced = idle_saved = pool_usd = 0.0
    pool = prep.model.warm_pool
    for rem in state.removals:
        track = prep.tracks[rem.node]
        hours = rem.saved_seconds / 3600
        saved_gpu_h += track.gpus * hours
        if track.hourly_usd is None:
            unpriced += track.gpus * hours
        else:
            usd += track.hourly_usd * hours
        if pool is not None:
            # The pooled instance waits in the pool while the node is out: its pool price is paid.
            pool_usd += pool.hourly_usd(track.hourly_usd) * hours
        idle_saved += _idle_seconds(track, prep.grid, r, thr, _billed_spans(prep, rem)) / 3600
    oracle = prep.oracle_gpu_hours
    weighted: list[tuple[float, float, float]] = []
    for rem in state.removals:
        weighted.extend((a, b, float(prep.tracks[rem.node].gpus)) for a, b in _billed_spans(prep, rem))
    cumulative = _cumulative(prep.steps, weighted)
    return Figures(
        name=name,
        kind=kind,
        gpu_hours_paid=prep.paid_gpu_hours - saved_gpu_h,
        idle_gpu_hours=oracle - idle_saved,
        gpu_hours_saved=saved_gpu_h,
        share_of_oracle=saved_gpu_h / oracle if oracle > 0 else None,
        usd_saved=usd - pool_usd,
        unpriced_gpu_hours_saved=unpriced,
        warm_pool_usd=pool_usd,
        removals=len(state.removals),
        regrets=sum(1 for x in state.removals if x.regret),
        unserved_gpu_minutes=sum(x.unserved_gpu_minutes for x in state.removals),
        readds=sum(1 for x in state.removals if x.back_at is not None),
        plan_evaluations=state.evaluations,
        removed_by_step=tuple(state.removed_by_step),
        saved_by_step=tuple(cumulative),
        log=tuple(state.removals),
    )


def _billed_spans(prep: Prepared, rem: Removal) -> list[Interval]:
    """Where no instance is billed for ``rem.node``: from the removal to the replacement's launch
    (``demand_at``), or to the history's end, inside the node's presence."""
    end = rem.demand_at if rem.demand_at is not None else prep.history.end
    return _intersect(rem.at, end, prep.tracks[rem.node].present)


def _cumulative(steps: Sequence[float], intervals: Iterable[tuple[float, float, float]]) -> list[float]:
    """For each step time t: Σ weight × |[a, b) ∩ (−∞, t]| over ``intervals`` (a, b, weight), in hours.

    Two difference arrays (a slope inside (a, b], a constant after b) keep it linear in steps + intervals.
    """
    n = len(steps)
    slope = [0.0] * (n + 1)
    const = [0.0] * (n + 1)
    for a, b, w in intervals:
        i = bisect.bisect_right(steps, a)
        k = bisect.bisect_right(steps, b)
        slope[i] += w
        slope[k] -= w
        const[i] -= w * a
        const[k] += w * a + w * (b - a)
    out = []
    m = c = 0.0
    for idx, t in enumerate(steps):
        m += slope[idx]
        c += const[idx]
        out.append((m * t + c) / 3600)
    return out


def _frame_index_at(prep: Prepared, t: float) -> int | None:
    k = bisect.bisect_right(prep.frame_times, t) - 1
    return k if k >= 0 else None


def _frame_at(prep: Prepared, t: float) -> Frame | None:
    k = _frame_index_at(prep, t)
    return None if k is None else prep.history.frames[k]


def _slice(series: Series, lo: float, hi: float) -> Series | None:
    a = bisect.bisect_right(series.times, lo)
    b = bisect.bisect_right(series.times, hi)
    if a >= b:
        return None
    return Series(series.labels, series.times[a:b], series.values[a:b])


def _frame_index(prep: Prepared, k: int) -> tuple[_Indexed, _Indexed]:
    """Series of the history joined with frame ``k``'s joiner (all its nodes and pods), cached."""
    cached = prep.frame_series.get(k)
    if cached is None:
        frame = prep.history.frames[k]
        joiner = NodeJoiner(frame.nodes, frame.pods, prep.history.node_label)

        def index(data: Mapping[str, MetricData]) -> _Indexed:
            return {
                name: (md.problem, [(s, joiner.join(s.labels).node) for s in md.series])
                for name, md in data.items()
            }

        cached = (index(prep.history.metrics), index(prep.history.timestamps))
        prep.frame_series[k] = cached
    return cached


def _window_metrics(indexed: _Indexed, present: set[str], lo: float, hi: float) -> dict[str, MetricData]:
    """Every series restricted to (lo, hi]; unusable metrics stay unusable.

    A series the frame's joiner maps to a node that is not in the snapshot (removed) is left out: with
    fewer nodes and pods every join method can only find fewer nodes, so the plan could only list it as
    unmapped, which changes no verdict. Series the frame maps to no node (unmatched or ambiguous) are kept
    and joined by the plan itself.
    """
    out: dict[str, MetricData] = {}
    for name, (problem, items) in indexed.items():
        if problem:
            out[name] = MetricData(name, problem=problem)
            continue
        kept = []
        for s, node in items:
            if node is not None and node not in present:
                continue
            cut = _slice(s, lo, hi)
            if cut is not None:
                kept.append(cut)
        out[name] = MetricData(name, tuple(kept))
    return out


def _own_groups(nodes: Iterable[Node]) -> Inventory:
    """Each node its own Auto Scaling group (min 0, desired 1), named after the node."""
    groups: dict[str, AsgInfo] = {}
    membership: dict[str, str] = {}
    for n in nodes:
        iid = n.instance_id
        if iid is None:
            continue
        groups[n.name] = AsgInfo(name=n.name, min_size=0, max_size=1, desired=1, instances={iid: "InService"})
        membership[iid] = n.name
    return Inventory(known=True, groups=groups, asg_of_instance=membership)


def _shrink(inventory: Inventory, removed_instances: set[str]) -> Inventory:
    """The inventory with the simulated removals applied (DesiredCapacity decremented per removal)."""
    if not removed_instances:
        return inventory
    groups = {}
    for name, g in inventory.groups.items():
        gone = removed_instances & set(g.instances)
        if gone:
            g = replace(
                g,
                desired=g.desired - len(gone),
                instances={i: s for i, s in g.instances.items() if i not in gone},
            )
        groups[name] = g
    return replace(inventory, groups=groups)


def _reborn_node(node: Node, at: float) -> Node:
    meta = node.metadata.model_copy(update={"creationTimestamp": _utc(at)})
    return node.model_copy(update={"metadata": meta})


def _apply_removals(
    prep: Prepared,
    frame: Frame,
    state_out: Mapping[str, float | None],
    reborn: Mapping[str, float],
) -> tuple[tuple[Node, ...], tuple[Pod, ...], Inventory]:
    """The frame's nodes minus removed ones (re-added nodes carry their re-add time as
    ``creationTimestamp``), their pods, and the inventory with the removals applied."""
    nodes = []
    removed_instances: set[str] = set()
    for n in frame.nodes:
        if n.name in state_out:
            if n.instance_id:
                removed_instances.add(n.instance_id)
            continue
        back = reborn.get(n.name)
        created = n.metadata.creationTimestamp
        if back is not None and (created is None or created.timestamp() < back):
            key = (n.name, back)
            if key not in prep.reborn_nodes:
                prep.reborn_nodes[key] = _reborn_node(n, back)
            n = prep.reborn_nodes[key]
        nodes.append(n)
    names = {n.name for n in nodes}
    pods = tuple(p for p in frame.pods if not p.spec.nodeName or p.spec.nodeName in names)
    inventory = _own_groups(nodes) if frame.inventory is None else _shrink(frame.inventory, removed_instances)
    return tuple(nodes), pods, inventory


def snapshot_at(
    prep: Prepared,
    state_out: Mapping[str, float | None],
    reborn: Mapping[str, float],
    t: float,
    window_seconds: int,
) -> ClusterSnapshot | None:
    """The in-memory snapshot ``plan`` sees at decision time ``t``: the frame's nodes minus removed ones
    (re-added nodes carry their re-add time as ``creationTimestamp``), their pods, the inventory with the
    removals applied, and every series restricted to (t − ``window_seconds``, t].

    Returns None when no frame covers ``t``.
    """
    k = _frame_index_at(prep, t)
    if k is None:
        return None
    nodes, pods, inventory = _apply_removals(prep, prep.history.frames[k], state_out, reborn)
    frame = prep.history.frames[k]
    names = {n.name for n in nodes}
    h = prep.history
    lo = t - window_seconds
    series, timestamps = _frame_index(prep, k)
    return ClusterSnapshot(
        meta=SnapshotMeta(
            taken_at=_utc(t),
            window_seconds=window_seconds,
            step_seconds=h.resolution,
            cluster=h.cluster,
            region=h.region,
        ),
        nodes=nodes,
        pods=pods,
        pdbs=frame.pdbs,
        resource_claims=frame.resource_claims,
        inventory=inventory,
        metrics=_window_metrics(series, names, lo, t),
        timestamps=_window_metrics(timestamps, names, lo, t),
        node_label=h.node_label,
        signal_set=h.signal_set,
    )


def recorded_at(
    prep: Prepared, state_out: Mapping[str, float | None], reborn: Mapping[str, float], t: float
) -> ClusterSnapshot | None:
    """The newest recorded (metrics format 2) snapshot taken in (t − step, t], as ``plan`` sees it after
    the simulated removals: its own metrics files (facts over its own idle window), its nodes minus
    removed ones, their pods, its inventory with the removals applied. None when none was taken then."""
    taken = [
        (s.meta.taken_at.timestamp(), k)
        for k, s in enumerate(prep.history.recorded)
        if t - prep.model.step < s.meta.taken_at.timestamp() <= t
    ]
    if not taken:
        return None
    at, k = max(taken)
    recorded = prep.history.recorded[k]
    frame_index = _frame_index_at(prep, at)
    frame = prep.history.frames[frame_index] if frame_index is not None else None
    if frame is None:
        return None
    nodes, pods, inventory = _apply_removals(prep, frame, state_out, reborn)
    return replace(recorded, nodes=nodes, pods=pods, inventory=inventory)


def run_policy(
    prep: Prepared, policy: Policy, name: str, *, on_plan: Callable[[float, Plan], None] | None = None
) -> Figures:
    """Replay ``policy``: at every decision step, ``plan()`` on the snapshot of that step; each
    ``scale_in`` it returns removes its node (see the module's model).

    A history of recorded (metrics format 2) snapshots is decided only at the steps a snapshot was taken
    in, at that snapshot's instant, on its own facts (``recorded_at``).

    Args:
        prep: the prepared history.
        policy: the policy to price (its ``idle_window`` sets the metric window of each snapshot).
        name: the label of this run in the report.
        on_plan: called with (decision time, plan) for every plan the replay makes (the report's
            per-decision view and tests).

    Returns:
        ``Figures`` (GPU-hours, USD, removals, regrets, unserved GPU-minutes).

    Raises:
        ConfigError: a recorded history replayed with an ``idle_window`` other than the one its
            snapshots recorded (field ``idle_window``): their facts cover that window only.
    """
    windows = {s.meta.window_seconds for s in prep.history.recorded}
    if windows and windows != {int(policy.idle_window)}:
        raise ConfigError(
            f"metrics format 2 snapshots record facts over an idle window of {sorted(windows)} s; a policy "
            f"with idle_window {int(policy.idle_window)} s cannot be judged on them (use --prometheus, "
            "or snapshots taken with that window)",
            field="idle_window",
        )
    state = _State()
    for t in prep.steps:
        _release(state, t)
        if prep.history.recorded:
            snap = recorded_at(prep, state.out, state.reborn, t)
            at = snap.meta.taken_at if snap is not None else _utc(t)
        else:
            snap = snapshot_at(prep, state.out, state.reborn, t, policy.idle_window)
            at = _utc(t)
        removed = 0
        if snap is not None and snap.nodes:
            # A trace is GPU utilisation alone: no node's cpu, memory or readiness, so where an evicted pod
            # would land is not knowable; the replay prices removals (its regrets count the misses).
            result = plan(snap, policy, at, catalog=prep.catalog, placement=False)
            if on_plan is not None:
                on_plan(at.timestamp(), result)
            state.evaluations += len(result.nodes)
            for action in result.actions:
                if action.kind == "scale_in" and action.node in prep.tracks:
                    _remove(prep, state, action.node, t)
                    removed += 1
        state.removed_by_step.append(removed)
    return _figures(prep, state, name, "policy")


def _present_names(prep: Prepared, state: _State, t: float) -> list[str]:
    frame = _frame_at(prep, t)
    if frame is None:
        return []
    return [n.name for n in frame.nodes if n.name in prep.tracks and n.name not in state.out]


def _run_rule(
    prep: Prepared, name: str, removable: Callable[[str, float, _State], bool], *, by_pods: bool
) -> Figures:
    state = _State()
    for t in prep.steps:
        _release(state, t)
        removed = 0
        for node in _present_names(prep, state, t):
            state.evaluations += 1
            if removable(node, t, state):
                _remove(prep, state, node, t, by_pods=by_pods)
                removed += 1
        state.removed_by_step.append(removed)
    return _figures(prep, state, name, "baseline")


def run_naive(prep: Prepared) -> Figures:
    """The naive-threshold baseline: remove a node as soon as its newest sample (the grid slot holding
    the decision time) is known and ≤ the threshold on every GPU. No window, no protections."""
    thr = prep.model.activity_threshold_pct

    def removable(node: str, t: float, _state: _State) -> bool:
        track = prep.tracks[node]
        j = bisect.bisect_right(prep.grid, t) - 1
        if j < 0 or len(track.devices) < track.gpus:
            return False
        return all(values[j] <= thr for values in track.devices)

    return _run_rule(prep, NAIVE, removable, by_pods=False)


def run_request_based(prep: Prepared) -> Figures:
    """The request-based baseline (Cluster Autoscaler / Karpenter): a node is used while a pod requesting
    a GPU is bound to it; it is removed once no such pod was bound for ``request_unneeded`` seconds (and
    the node is at least that old), and wanted again when a GPU pod or GPU activity returns."""
    unneeded = prep.model.request_unneeded

    def removable(node: str, t: float, state: _State) -> bool:
        track = prep.tracks[node]
        since = max(state.reborn.get(node, -math.inf), track.present[0][0])
        if t - since < unneeded:
            return False
        return _overlap_many(t - unneeded, t, track.holder_times) == 0

    return _run_rule(prep, REQUEST_BASED, removable, by_pods=True)


def run_oracle(prep: Prepared) -> Figures:
    """The oracle: every GPU removed exactly for its idle time and re-added instantly (the ceiling).

    ``removals`` counts its idle runs; it never regrets and leaves nothing unserved.
    """
    r = prep.history.resolution
    thr = prep.model.activity_threshold_pct
    usd = unpriced = 0.0
    runs = 0
    for track in prep.tracks.values():
        hours = _idle_seconds(track, prep.grid, r, thr, track.present) / 3600
        if track.hourly_usd is None:
            unpriced += hours
        else:
            usd += track.hourly_usd / track.gpus * hours
        runs += sum(len(x) for x in _idle_runs(prep, track))
    oracle = prep.oracle_gpu_hours
    weighted: list[tuple[float, float, float]] = []
    for track in prep.tracks.values():
        for values in track.devices:
            for lo, hi in track.present:
                for j in _slot_range(prep.grid, r, lo, hi):
                    if values[j] <= thr:
                        a, b = max(prep.grid[j] - r, lo), min(prep.grid[j], hi)
                        if b > a:
                            weighted.append((a, b, 1.0))
    cumulative = _cumulative(prep.steps, weighted)
    return Figures(
        name=ORACLE,
        kind="oracle",
        gpu_hours_paid=prep.paid_gpu_hours - oracle,
        idle_gpu_hours=0.0,
        gpu_hours_saved=oracle,
        share_of_oracle=1.0 if oracle > 0 else None,
        usd_saved=usd,
        unpriced_gpu_hours_saved=unpriced,
        removals=runs,
        regrets=0,
        unserved_gpu_minutes=0.0,
        saved_by_step=tuple(cumulative),
        removed_by_step=tuple(0 for _ in prep.steps),
    )


def _idle_runs(prep: Prepared, track: _Track) -> list[list[float]]:
    """Per GPU, the lengths (seconds) of maximal runs of consecutive idle slots inside the node's presence;
    an unknown or active slot ends a run."""
    r = prep.history.resolution
    thr = prep.model.activity_threshold_pct
    out = []
    for values in track.devices:
        runs: list[float] = []
        current = 0.0
        for j, v in enumerate(values):
            seconds = _overlap_many(prep.grid[j] - r, prep.grid[j], track.present)
            if v <= thr and seconds > 0:
                current += seconds
            elif current:
                runs.append(current)
                current = 0.0
        if current:
            runs.append(current)
        out.append(runs)
    return out


def idle_run_lengths(prep: Prepared) -> list[float]:
    """Lengths (seconds) of every GPU's idle runs: maximal runs of consecutive samples ≤ the threshold
    inside the node's presence (an unknown or active sample ends a run)."""
    return [x for track in prep.tracks.values() for runs in _idle_runs(prep, track) for x in runs]


def ceilings(prep: Prepared, windows: Iterable[int]) -> list[Ceiling]:
    """For each idle window W (seconds): the share of idle GPU time inside idle runs longer than W, and the
    share reachable by a W-window policy (Σ max(0, run − W) ÷ idle time). Idle runs in the Alibaba trace
    are short (median ~2 min), so these bound what any windowed policy can save."""
    lengths = idle_run_lengths(prep)
    total = sum(lengths)
    out = []
    for w in windows:
        inside = sum(x for x in lengths if x > w)
        reach = sum(x - w for x in lengths if x > w)
        out.append(Ceiling(w, inside / total if total else 0.0, reach / total if total else 0.0))
    return out
