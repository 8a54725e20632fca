"""Metrics format 2, read back: the answers of ``observation_queries`` reduced to per-device signals.

``ObservationReducer`` takes answers one series at a time — from a snapshot's files
(``signals_from_observation``) or straight from the live path's JSON, sub-window by sub-window and shard
by shard, in any order — and keeps only the per-device facts (per-step maxima, window maxima, spreads,
averages, newest sample, non-finite findings), never the series themselves: memory grows with the
number of devices, not with the answers' size. ``finish`` applies the rules of
``rightsizer.domain.observation`` (the fidelity contract) and returns ``CollectedSignals``.

Answers of one query may arrive split (sub-windows, series shards); each fact merges exactly: per-step
points by their step slot (max), maxima by max (+Inf makes the maximum unknown, as ``max_over_time``
would), non-finite findings by "any". Which series labels speak for a device (its exporter, its MIG
profile) does not depend on arrival order: the first metric of ``STEP_ORDER`` that has the device, then
the smallest label set.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

from rightsizer.domain.join import JoinResult, NodeJoiner, join_label_keys
from rightsizer.domain.model import MetricData
from rightsizer.domain.usage import (
    ACTIVITY_METRICS,
    DEVICE_LABELS,
    DEVICE_METRICS,
    DISAGREE_POINTS,
    ENERGY,
    EXPORTER_LABELS,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    MIG_PROFILE_LABEL,
    POWER,
    PROF_ACTIVE,
    TARGET_LABELS,
    UP,
    CollectedSignals,
    DeviceKey,
    DeviceSignals,
    Target,
    UnmappedSeries,
    Window,
    device_key,
    exporter_of,
    target_of,
)

#: The per-step metrics, in the order that picks the labels speaking for a device (a device is reported
#: only with an activity series, so the window maxima that share the ``step`` file kind never speak).
STEP_ORDER = (GPU_UTIL, PROF_ACTIVE, UP)
_RANK = {m: i for i, m in enumerate(STEP_ORDER)}
LabelKey = tuple[tuple[str, str], ...]
_INF = math.inf
_isfinite = math.isfinite


def _all_finite(values: Sequence[float]) -> bool:
    # A sum of finite values is finite (barring overflow); one NaN/±Inf makes it non-finite. The exact
    # check only runs when the quick one fails.
    return -_INF < sum(values) < _INF or all(map(_isfinite, values))


def series_label_keys(node_label: str | None = None) -> frozenset[str]:
    """Every series label an observation is decided on: the join's (``join.join_label_keys``, with config
    ``prometheus.node_label``), the device's (``usage.DEVICE_LABELS``), the MIG profile, the exporter and
    the scrape target (``usage.TARGET_LABELS``: whose ``up`` count sets the device's scrape interval).

    ``ObservationReducer`` reads nothing else (``read_labels`` drops the rest as a series arrives), and a
    written snapshot's metrics files keep nothing else (``adapters.snapshot_projection``): labels an
    exporter adds (pod labels, ``label_*``, driver versions) never decide, so they never leave the
    cluster, and ``plan --snapshot`` still decides like the live plan (``tests/unit/test_series_labels.py``).
    """
    return frozenset(
        (*join_label_keys(node_label), *DEVICE_LABELS, MIG_PROFILE_LABEL, *EXPORTER_LABELS, *TARGET_LABELS)
    )


def read_labels(labels: Mapping[str, str], keep: frozenset[str]) -> dict[str, str]:
    """``labels`` restricted to ``keep`` (``series_label_keys``), in their order."""
    return {k: v for k, v in labels.items() if k in keep}


class Resolved(NamedTuple):
    """A label set as read (``read_labels``: ``ident``, its (name, value) pairs in order, each pair shared
    by every label set holding it), its node and device, or why it has none; the exporter, MIG profile
    and scrape target it names (``usage.exporter_of``, ``GPU_I_PROFILE``, ``usage.target_of``).

    One is kept per distinct label set of a collection (80,000 devices at 10,000 nodes), so it holds no
    dict of its labels (``labels`` builds one), and ``sorted_ident`` is ``ident`` itself when that is
    sorted already (Prometheus sends label sets sorted by name).
    """

    ident: LabelKey
    node: str | None
    device: DeviceKey | None
    sorted_ident: LabelKey
    reason: str | None
    exporter: str
    mig_profile: str | None
    target: Target | None

    @property
    def labels(self) -> dict[str, str]:
        """The label set as read, as a dict."""
        return dict(self.ident)

    def label(self, name: str) -> str:
        """The value of label ``name``, "" when absent."""
        for key, value in self.ident:
            if key == name:
                return value
        return ""


Row = tuple[Resolved, Sequence[float], Sequence[float]]
"""One series of an answer: its ``Resolved`` labels, its times (Unix s) and its values."""


#: Flags of a device's ``stddev_over_time`` points (``_merge_spread``): a finite point > 0, a non-finite one.
_MOVING, _BAD = 1, 2
_Add = Callable[[DeviceKey, Sequence[float]], None]


@dataclass(slots=True)
class _Steps:
    """Per-step maxima of one metric of one device: the finite maximum by step slot (NaN: no finite
    sample in that step; 8 bytes a step, a dict would take ~60), and whether any point was non-finite."""

    values: array[float]
    bad: bool = False
    empty: bool = True  # no point written yet


class ObservationReducer:
    """Per-device facts of one observation, fed series by series (see the module docstring).

    Args:
        joiner: resolves series labels to nodes (docs/architecture.md §3 join).
        window: the idle window.
        activity_threshold_pct: the policy's ``gpu_activity_max_pct`` (percent) for ``active_steps``.
    """

    def __init__(self, joiner: NodeJoiner, window: Window, activity_threshold_pct: float) -> None:
        self._joiner = joiner
        self._window = window
        self._threshold = float(activity_threshold_pct)
        self._keep = series_label_keys(joiner.node_label)
        # label set as read → with its node and device or why it has none
        self._joined: dict[LabelKey, Resolved] = {}
        # every (name, value) pair met, stored once: label sets share them (a node's name, address and
        # job recur in each of its GPUs' label sets)
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._targets: dict[Target, Target] = {}
        # Step slot of each step point of the window (``Window.step_index``): query_range answers sit
        # on this grid, so one lookup replaces the arithmetic for nearly every point.
        step = max(window.step, 1)
        self._grid = {window.end - k * step: k for k in range(window.expected_points)}
        self._ascending = tuple(sorted(self._grid))  # the step points, oldest first
        self._expected = window.expected_points
        self._empty = array("d", [math.nan]) * self._expected
        self._steps: dict[str, dict[DeviceKey, _Steps]] = {m: {} for m in (GPU_UTIL, PROF_ACTIVE)}
        self._up: dict[str, _Steps] = {}
        self._up_idents: set[LabelKey] = set()  # label sets of ``up`` and its count (never sharded)
        # Window maxima per device (NaN: no finite point; +Inf and any non-finite point in the sets) and
        # spread flags (_MOVING | _BAD): plain floats and small ints, no object per device and metric.
        self._max: dict[str, dict[DeviceKey, float]] = {FB_USED: {}, POWER: {}}
        self._max_inf: dict[str, set[DeviceKey]] = {FB_USED: set(), POWER: set()}
        self._max_bad: dict[str, set[DeviceKey]] = {FB_USED: set(), POWER: set()}
        self._spread: dict[str, dict[DeviceKey, int]] = {POWER: {}, ENERGY: {}}
        # per device, its series' (used, free) averages as a flat list: sorted label set, used, free, …
        # (one series nearly always; a list of 3 takes a third of a dict of one pair)
        self._avg: dict[DeviceKey, list[LabelKey | float | None]] = {}
        self._avg_bad: dict[str, set[DeviceKey]] = {FB_USED: set(), FB_FREE: set()}
        self._newest: dict[DeviceKey, float] = {}  # newest finite sample time ≤ the window's end
        self._stamps_bad: set[DeviceKey] = set()  # a non-finite sample time
        self._stamped: dict[str, set[DeviceKey]] = {m: set() for m in ACTIVITY_METRICS}
        self._nonfinite: dict[str, set[DeviceKey]] = {m: set() for m in ACTIVITY_METRICS}
        self._counts: dict[DeviceKey, float] = {}  # format-2 snapshots before up.count.json
        self._target_counts: dict[Target, float] = {}
        self._samples: dict[DeviceKey, float] = {}  # per device, set by ``finish``
        self._labels: dict[DeviceKey, tuple[int, Resolved]] = {}  # (rank in STEP_ORDER, label set)
        self._unmapped: dict[tuple[str, LabelKey], UnmappedSeries] = {}
        self._answered: set[tuple[str, str]] = set()
        self._failed: set[tuple[str, str]] = set()

    # -- feeding

    def problem(self, kind: str, metric: str) -> None:
        """The answer of (``kind``, ``metric``) is unusable: ``metric`` becomes a problem."""
        self._failed.add((kind, metric))

    def answered(self, kind: str, metric: str) -> None:
        """An answer of (``kind``, ``metric``) arrived (possibly with no series): the metric is exported."""
        self._answered.add((kind, metric))

    def add(
        self,
        kind: str,
        metric: str,
        labels: Mapping[str, str],
        times: Sequence[float],
        values: Sequence[float],
    ) -> None:
        """One series of the answer of (``kind``, ``metric``): ``kind`` as ``observation.Kind``, where
        ``step`` also holds the window maxima of ``FB_USED``/``POWER`` (as in a snapshot's files).

        Only the labels of ``series_label_keys`` are read: series differing in other labels only are one
        series here.
        """
        self.add_resolved(kind, metric, self.resolve(labels), times, values)

    def resolve(self, labels: Mapping[str, str]) -> Resolved:
        """``labels`` read, joined to their node and device, for ``add_resolved``: a caller that meets
        one label set in many answers (up to 14) resolves it once and passes the result each time."""
        read = read_labels(labels, self._keep)
        pairs = self._pairs
        ident = tuple([pairs.setdefault(item, item) for item in read.items()])  # each the one stored copy
        joined = self._joined.get(ident)
        if joined is None:
            joined = self._joined[ident] = self._join(read, ident)
        return joined

    def add_resolved(
        self,
        kind: str,
        metric: str,
        joined: Resolved,
        times: Sequence[float],
        values: Sequence[float],
    ) -> None:
        r"""``add`` for a label set already ``resolve``\ d."""
        self.add_many(kind, metric, ((joined, times, values),))

    def add_many(self, kind: str, metric: str, rows: Iterable[Row]) -> None:
        r"""``add_resolved`` for every series of one answer of (``kind``, ``metric``), each a ``Row``
        (its ``resolve``\ d labels, times in Unix s, values): the work per series is chosen once per
        answer, since an answer holds a series per GPU (16,000 at 2,000 nodes)."""
        if kind == "step" and metric in self._max:
            self._accumulate(kind, metric, rows, self._merge_max(metric))
        elif kind == "step":
            for joined, times, values in rows:
                if joined.node is None or joined.device is None:
                    self._unmapped_series(kind, metric, joined)
                    continue
                self._add_step(metric, joined.node, joined.device, joined, times, values)
        elif kind == "stddev":
            self._accumulate(kind, metric, rows, self._merge_spread(metric))
        elif kind == "avg":
            self._add_averages(metric, rows)
        else:
            for joined, _, values in rows:
                self._add_fact(kind, metric, joined, values)

    def _accumulate(self, kind: str, metric: str, rows: Iterable[Row], add: _Add) -> None:
        """Each series' values merged into its device's fact by ``add`` (window maxima, spreads)."""
        for joined, _, values in rows:
            dev = joined.device
            if dev is None:
                self._unmapped_series(kind, metric, joined)
                continue
            add(dev, values)

    def _merge_max(self, metric: str) -> _Add:
        """Window maxima merged from (sub-)window maxima (``_window_max`` semantics), noting +Inf and any
        non-finite point."""
        table, inf, bad = self._max[metric], self._max_inf[metric], self._max_bad[metric]

        def add(dev: DeviceKey, values: Sequence[float]) -> None:
            top = table.get(dev, math.nan)
            for v in values:
                if _isfinite(v):
                    if not top >= v:  # also when no finite point came yet (NaN)
                        top = v
                else:
                    bad.add(dev)
                    if v == _INF:
                        inf.add(dev)
            table[dev] = top

        return add

    def _merge_spread(self, metric: str) -> _Add:
        """``stddev_over_time`` points of a device: any moving (finite, > 0), any non-finite."""
        table = self._spread[metric]

        def add(dev: DeviceKey, values: Sequence[float]) -> None:
            flags = table.get(dev, 0)
            for v in values:
                if not _isfinite(v):
                    flags |= _BAD
                elif v > 0:
                    flags |= _MOVING
            table[dev] = flags

        return add

    def _unmapped_series(self, kind: str, metric: str, joined: Resolved) -> None:
        # a main answer's series that no node claims is listed (``up`` and the side answers are not)
        if (kind == "step" and metric != UP) or (kind == "stddev" and metric == ENERGY):
            reason = f"series_unmapped:{joined.reason}"
            self._unmapped.setdefault((metric, joined.ident), UnmappedSeries(metric, joined.labels, reason))

    def _add_averages(self, metric: str, rows: Iterable[Row]) -> None:
        # used and free of one series pair up by labels (written in any order by a snapshot)
        side = 1 if metric == FB_USED else 2
        averages, bad = self._avg, self._avg_bad[metric]
        for joined, _, values in rows:
            dev = joined.device
            if dev is None:
                continue
            ident = joined.sorted_ident
            last = values[-1] if values else None
            pairs = averages.get(dev)
            if pairs is None:  # the device's first series (nearly always its only one)
                averages[dev] = [ident, last, None] if side == 1 else [ident, None, last]
            else:
                # the head first: the second average of a device's only series finds it there
                at = (
                    0
                    if pairs[0] == ident
                    else next((i for i in range(3, len(pairs), 3) if pairs[i] == ident), None)
                )
                if at is None:
                    at = len(pairs)
                    pairs += (ident, None, None)
                pairs[at + side] = last
            if not _all_finite(values):
                bad.add(dev)

    def _add_fact(self, kind: str, metric: str, joined: Resolved, values: Sequence[float]) -> None:
        dev = joined.device
        if kind == "count":  # an ``up`` needs no node: its target is what devices find it by
            self._add_count(metric, joined, dev, values)
        elif dev is None:
            return
        elif kind == "timestamp":
            self._stamped[metric].add(dev)
            self._timestamps(dev, values)
        elif kind == "nonfinite":
            self._nonfinite[metric].add(dev)

    def _timestamps(self, dev: DeviceKey, values: Sequence[float]) -> None:
        """Sample times of a device's activity series: the newest finite one in the window, whether any
        was non-finite."""
        if not _all_finite(values):
            self._stamps_bad.add(dev)
        end = self._window.end
        finite = [t for t in values if _isfinite(t) and t <= end]
        if finite:
            newest = max(finite)
            if newest > self._newest.get(dev, -_INF):
                self._newest[dev] = newest

    def _add_count(
        self, metric: str, joined: Resolved, dev: DeviceKey | None, values: Sequence[float]
    ) -> None:
        """Samples in the window of an ``up`` series (scrape attempts of its target), or of a device's
        activity series (format-2 snapshots written before ``up.count.json``); the largest count of a
        target or device wins (a series that began inside the window counts fewer)."""
        if metric == UP:  # an ``up`` label set, counted or not, names no node for a failed shard
            self._up_idents.add(joined.ident)
        finite = [v for v in values if _isfinite(v)]
        if not finite:
            return
        if metric == UP:
            target = joined.target
            if target is not None:
                self._target_counts[target] = max(self._target_counts.get(target, 0.0), max(finite))
        elif dev is not None:
            self._counts[dev] = max(self._counts.get(dev, 0.0), max(finite))

    def _join(self, read: Mapping[str, str], ident: LabelKey) -> Resolved:
        # One label set shows up in up to 14 answers: join it and name its device once.
        result: JoinResult = self._joiner.join(read)
        device = device_key(result.node, read) if result.node is not None else None
        profile = read.get(MIG_PROFILE_LABEL) or None
        ordered = tuple(sorted(ident))
        sorted_ident = ident if ordered == ident else ordered
        target = target_of(read)
        if target is not None:  # shared by the label sets of one exporter
            target = self._targets.setdefault(target, target)
        exporter = exporter_of(read)
        return Resolved(ident, result.node, device, sorted_ident, result.reason, exporter, profile, target)

    def _add_step(
        self,
        metric: str,
        node: str,
        dev: DeviceKey,
        joined: Resolved,
        times: Sequence[float],
        values: Sequence[float],
    ) -> None:
        if metric == UP:
            steps = self._up.get(node)
            if steps is None:
                steps = self._up[node] = _Steps(array("d", self._empty))
            self._up_idents.add(joined.ident)
        else:
            per_dev = self._steps[metric]
            steps = per_dev.get(dev)
            if steps is None:
                steps = per_dev[dev] = _Steps(array("d", self._empty))
        self._per_step(steps, times, values)
        self._speaks(_RANK[metric], dev, joined)

    def _speaks(self, rank: int, dev: DeviceKey, joined: Resolved) -> None:
        # the labels of the first metric of ``STEP_ORDER`` that has the device, then the smallest set
        current = self._labels.get(dev)
        if current is None or (rank, joined.ident) < (current[0], current[1].ident):
            self._labels[dev] = (rank, joined)

    def _per_step(self, steps: _Steps, times: Sequence[float], values: Sequence[float]) -> None:
        """Merge per-step points by max into their slot (``Window.step_index``, inlined: this loop sees
        every point of the per-step answers)."""
        grid = self._grid
        slots = steps.values
        if len(times) != len(values):
            raise ValueError(f"{len(times)} times for {len(values)} values")
        if steps.empty and times and _all_finite(values):
            # The common case, in C: a device's first series, its points a run of consecutive step
            # points (a query_range answer without gaps) — written as one slice, newest slot first.
            first = grid.get(times[0])
            if first is not None:
                ascending = self._ascending
                lo = len(ascending) - 1 - first
                if tuple(times) == ascending[lo : lo + len(times)]:
                    run = array("d", values)
                    run.reverse()  # newest slot first
                    slots[first + 1 - len(times) : first + 1] = run
                    steps.empty = False
                    return
        steps.empty = False
        window = self._window
        for t, v in zip(times, values, strict=True):
            slot = grid.get(t)
            if slot is None:  # off the step grid (hand-made snapshots): Window.step_index's arithmetic
                if not (window.start < t <= window.end):
                    continue
                slot = min(round((window.end - t) / max(window.step, 1)), window.expected_points - 1)
            if not -_INF < v < _INF:  # NaN fails both comparisons
                steps.bad = True
            elif not slots[slot] >= v:  # also when the slot holds no sample yet (NaN)
                slots[slot] = v

    def uncounted_targets(self) -> set[Target]:
        """The scrape targets (``usage.target_of``: ``job``, ``instance``) of the DCGM series joined to a
        node so far whose ``up`` count has not come: a read scoped to one node may not have selected
        their ``up`` (its matchers name the node's addresses and pods, a target may go by another name)."""
        up, counted = self._up_idents, self._target_counts
        return {
            j.target
            for j in self._joined.values()
            if j.device is not None and j.target is not None and j.target not in counted and j.ident not in up
        }

    def nodes_of_series(self, label: str, holds: Callable[[str], bool]) -> set[str]:
        """The nodes of every DCGM series met so far whose ``label`` (\"\" when absent) ``holds``: where a
        failed device shard's devices live (``observation.DeviceShard.label``, ``holds``). ``up`` series
        carry no device label but are never sharded, so they name no node here."""
        nodes: set[str] = set()
        up = self._up_idents
        for joined in self._joined.values():
            if joined.node is None or joined.node in nodes or joined.ident in up:
                continue
            if holds(joined.label(label)):
                nodes.add(joined.node)
        return nodes

    # -- result

    def finish(self) -> CollectedSignals:
        """Per-device signals: a device per activity series (a MIG instance through the profiling metric
        only, BUG-02), with coverage, maxima, freshness, liveness and non-finite findings.

        Call it once: each device's per-step maxima are dropped as its signals are made, so the
        reducer's largest state and the signals do not both peak (80,000 devices at 10,000 nodes).
        """
        prof_steps, util_steps = self._steps[PROF_ACTIVE], self._steps[GPU_UTIL]
        activity_keys = set(prof_steps) | {k for k in util_steps if not k[2]}
        self._samples = self._samples_per_device()
        devices: dict[str, list[DeviceSignals]] = {}
        for key in sorted(activity_keys):
            sig = self._device(key)
            devices.setdefault(key[0], []).append(sig)
        up_coverage: dict[str, float] = {}
        expected = self._window.expected_points
        for node, steps in self._up.items():
            up_coverage[node] = min(1.0, steps.values.count(1.0) / expected)
            if steps.bad:  # a non-finite ``up`` is not a scrape result: the node's data is unknown
                for sig in devices.get(node, ()):
                    sig.non_finite = (*sig.non_finite, UP)
        main_kinds = {FB_FREE: "avg", ENERGY: "stddev"}
        present = frozenset(
            m
            for m in DEVICE_METRICS
            if (kind := (main_kinds.get(m, "step"), m)) in self._answered and kind not in self._failed
        )
        problems = tuple(sorted({m for _, m in self._failed}))
        unmapped = sorted(self._unmapped.values(), key=lambda u: (u.metric, sorted(u.labels.items())))
        return CollectedSignals(devices, up_coverage, unmapped, problems, present)

    def _device(self, key: DeviceKey) -> DeviceSignals:
        node, device, gi = key
        sig = DeviceSignals(node=node, device=device, gpu_instance=gi)
        chosen = self._labels.get(key)
        if chosen is not None:
            sig.mig_profile, sig.exporter = chosen[1].mig_profile, chosen[1].exporter
        bad: list[str] = []
        self._activity(sig, key, bad)
        self._memory_and_power(sig, key, bad)
        if bad:
            sig.non_finite = tuple(dict.fromkeys(bad))
        return sig

    def _activity(self, sig: DeviceSignals, key: DeviceKey, bad: list[str]) -> None:
        """Coverage, maximum, active steps and disagreement from the per-step maxima; freshness."""
        window = self._window
        per_metric: dict[str, array[float] | list[float]] = {}  # slot → maximum, NaN: no finite sample
        for name in (PROF_ACTIVE,) if key[2] else ACTIVITY_METRICS:
            steps = self._steps[name].pop(key, None)  # read once (``finish``)
            if steps is None:
                continue
            # PROF_ACTIVE is a ratio: percent like GPU_UTIL
            per_metric[name] = [v * 100.0 for v in steps.values] if name == PROF_ACTIVE else steps.values
            if steps.bad or key in self._nonfinite[name]:
                bad.append(name)
        prof, util = per_metric.get(PROF_ACTIVE), per_metric.get(GPU_UTIL)
        merged: list[float] = []
        if prof is not None and util is not None:
            # a NaN difference (a step without both) is not > anything
            sig.signals_disagree = any(abs(p - u) > DISAGREE_POINTS for p, u in zip(prof, util, strict=True))
            merged = [p if u != u or p > u else u for p, u in zip(prof, util, strict=True)]
        elif per_metric:
            (only,) = per_metric.values()
            merged = only if isinstance(only, list) else only.tolist()
        # A finite sum: every step holds a (finite) maximum; else the exact filter drops the NaN slots.
        finite = merged if -_INF < sum(merged) < _INF else [v for v in merged if v == v]
        sig.activity_points = len(finite)
        sig.coverage = min(1.0, len(finite) / self._expected)
        top = sig.activity_max_pct = max(finite) if finite else None
        threshold = self._threshold
        if top is not None and top > threshold:
            sig.active_steps = frozenset([slot for slot, v in enumerate(merged) if v > threshold])
        if key in self._stamps_bad:
            bad.extend(f"timestamp({n})" for n in ACTIVITY_METRICS if key in self._stamped[n])
        sig.newest_sample = self._newest.get(key)
        samples = self._samples.get(key, 0.0)
        if samples >= 2:
            # Over-estimates when the series began inside the window: the bound is then looser, never tighter.
            sig.sample_interval_s = window.seconds / samples

    def _samples_per_device(self) -> dict[DeviceKey, float]:
        """Samples in the window that set each device's scrape interval (W ÷ samples): the scrape
        attempts of its own target (``usage.target_of`` of its series; the largest when its series came
        from several, e.g. an exporter restarted at a new address), else its activity series' own count
        in a format-2 snapshot written before ``up.count.json``; absent: the interval is unknown."""
        samples = dict(self._counts)
        if not self._target_counts:
            return samples
        for joined in self._joined.values():
            dev = joined.device
            if dev is None or dev in self._counts:
                continue
            target = joined.target
            count = self._target_counts.get(target) if target is not None else None
            if count is not None and count > samples.get(dev, 0.0):
                samples[dev] = count
        return samples

    def _memory_and_power(self, sig: DeviceSignals, key: DeviceKey, bad: list[str]) -> None:
        """Framebuffer (the instance's own, else its GPU's), power and liveness (the GPU's)."""
        parent = (key[0], key[1], "") if key[2] else key
        fb_key = key if key in self._max[FB_USED] else parent
        fb = self._max[FB_USED].get(fb_key)
        if fb is not None:
            sig.has_fb = True
            sig.fb_used_max_mib = self._window_max(FB_USED, fb_key, fb)
            if fb_key in self._max_bad[FB_USED] or fb_key in self._avg_bad[FB_USED]:
                bad.append(FB_USED)
            if fb_key in self._avg_bad[FB_FREE]:
                bad.append(FB_FREE)
            sig.fb_total_mib = self._fb_total(fb_key)
        power = self._max[POWER].get(parent)
        power_spread = self._spread[POWER].get(parent)
        if power is not None:
            sig.has_power = True
            sig.power_max_w = self._window_max(POWER, parent, power)
            if parent in self._max_bad[POWER] or (power_spread is not None and power_spread & _BAD):
                bad.append(POWER)
        energy = self._spread[ENERGY].get(parent)
        if energy is not None:
            if energy & _BAD:
                bad.append(ENERGY)
            sig.liveness = "moving" if energy & _MOVING else "frozen"
        elif power_spread is not None:
            sig.liveness = "moving" if power_spread & _MOVING else "frozen"

    def _window_max(self, metric: str, key: DeviceKey, top: float) -> float | None:
        """A device's window maximum of ``metric``; None when a point was +Inf (the device is
        ``non_finite`` then) or none was finite."""
        return None if top != top or key in self._max_inf[metric] else top

    def _fb_total(self, key: DeviceKey) -> float | None:
        """avg(FB_USED) + avg(FB_FREE) of one series (same labels) — the device's memory — largest over
        series."""
        totals = []
        pairs = self._avg.get(key, ())
        for used, free in zip(pairs[1::3], pairs[2::3], strict=True):
            if used is not None and free is not None:
                total = cast(float, used) + cast(float, free)
                if _isfinite(total):
                    totals.append(total)
        return max(totals) if totals else None


def signals_from_observation(
    files: Mapping[str, Mapping[str, MetricData]],
    joiner: NodeJoiner,
    window: Window,
    activity_threshold_pct: float,
) -> CollectedSignals:
    """Per-device signals from the answers of ``observation_queries`` (a snapshot's files).

    Args:
        files: ``MetricFiles`` (kind → metric → answer); missing answers are simply absent, answers with
            a ``problem`` make their metric a problem (⇒ ``partial_response`` ⇒ unknown).
        joiner: resolves series labels to nodes (docs/architecture.md §3 join); unjoinable series of the
            main answers are listed in ``unmapped``.
        window: the idle window.
        activity_threshold_pct: the policy's ``gpu_activity_max_pct`` (percent) for ``active_steps``.

    Returns:
        ``CollectedSignals`` (``ObservationReducer.finish``).
    """
    reducer = ObservationReducer(joiner, window, activity_threshold_pct)
    for kind, answers in files.items():
        for name, data in answers.items():
            if data.problem:
                reducer.problem(kind, name)
                continue
            reducer.answered(kind, name)
            for s in data.series:
                reducer.add(kind, name, s.labels, s.times, s.values)
    return reducer.finish()
