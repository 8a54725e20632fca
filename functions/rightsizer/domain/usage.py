"""From DCGM series to per-device signals (design §3 "Device identity", "Signals", "Window, coverage").

Both paths — the snapshot (``rightsizer snapshot`` + ``plan --snapshot``) and the live plan (Prometheus
adapter ``collect_live``) — ask Prometheus the same ``observation_queries`` and turn the answers into
``DeviceSignals`` with the same ``collect_signals``; the verdict rules in ``rightsizer.domain.gpu`` are
shared too, so both paths decide alike.

Fidelity contract (metrics format 2): every per-step fact covers *all raw samples* in that step's interval
(t − step, t]: a point of a metric's matrix is ``max_over_time`` of the raw samples in the interval (the
point exists when the interval holds a sample), non-finite samples are found over every raw sample of the
window (``sum_over_time`` is non-finite exactly when one of its samples is), and freshness is the newest
raw sample's own timestamp. Nothing is read at step points through Prometheus' 5-minute lookback, so a
GPU busy between the step points is never read as idle, whatever the step. Snapshots of format 1 (raw
``query_range`` points, one sample per step through the lookback) are still read as they always were.

DCGM fields (NVIDIA dcgm-exporter ``default-counters.csv`` / ``dcp-metrics-included.csv``):
``DCGM_FI_DEV_GPU_UTIL`` (percent), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0..1), ``DCGM_FI_DEV_FB_USED``
and ``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
(mJ since boot, monotonic).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import MetricData, Series

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
PROF_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
UP = "up"
ACTIVITY_METRICS = (GPU_UTIL, PROF_ACTIVE)
REQUIRED_METRICS = (FB_USED, FB_FREE, POWER)
DEVICE_METRICS = (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY)
DISAGREE_POINTS = 50.0
#: Metrics whose matrix holds per-step facts in a format-2 observation (``max_over_time`` per step).
STEP_METRICS = (*DEVICE_METRICS, UP)
#: Observation format written by ``rightsizer snapshot`` (``snapshot.json`` ``metrics_format``); absent = 1.
METRICS_FORMAT = 2

DeviceKey = tuple[str, str, str]
"""(node, UUID or gpu index, GPU_I_ID or "") — design §3 "Device identity"."""


@dataclass(frozen=True, slots=True)
class Window:
    """The idle window (at − W, at] sampled every ``step`` seconds; times are Unix seconds."""

    end: float
    seconds: int
    step: int

    @property
    def start(self) -> float:
        """The excluded left end of the window."""
        return self.end - self.seconds

    @property
    def expected_points(self) -> int:
        """Step points a fully covered window holds (W / step, at least 1)."""
        return max(1, self.seconds // max(self.step, 1))

    def step_index(self, t: float) -> int | None:
        """0-based step slot of time ``t`` counted back from ``end`` (0 = at), or None outside."""
        if not (self.start < t <= self.end):
            return None
        return min((round((self.end - t) / max(self.step, 1))), self.expected_points - 1)

    @classmethod
    def ending(cls, at: datetime, seconds: int, step: int) -> Window:
        """The window of ``seconds`` ending at ``at``."""
        return cls(end=at.timestamp(), seconds=seconds, step=step)


def _selector(metric: str, job: str | None) -> str:
    if not job:
        return metric
    escaped = job.replace("\\", "\\\\").replace('"', '\\"')
    return f'{metric}{{job="{escaped}"}}'


def _open_range(seconds: float) -> str:
    # Prometheus 2.x ranges include both ends; one millisecond less than the interval makes them
    # (t − interval, t] at the TSDB's millisecond resolution (Prometheus 3 ranges are left-open already).
    return f"[{round(seconds * 1000) - 1}ms]"


@dataclass(frozen=True, slots=True)
class MetricQuery:
    """One query of an observation (format 2) and the snapshot file that records its answer.

    ``path`` is the snapshot file (``metrics/<metric>.json``, ``.timestamp.json``, ``.nonfinite.json``),
    ``metric`` the metric it feeds (a failed answer makes that metric a problem). ``per_step`` queries
    run as ``query_range`` at every step point of the window; the others at the window's end only, with
    ``range_seconds`` the length their range selector must cover (the window, or a sub-window when a
    client splits the window: such answers merge exactly, see ``nonfinite_expr``).
    """

    path: str
    metric: str
    kind: Literal["step", "timestamp", "nonfinite"]
    job: str | None = None

    @property
    def per_step(self) -> bool:
        """True when evaluated at every step point (``query_range`` over the window)."""
        return self.kind == "step"

    def span(self, end: float, range_seconds: float, step_seconds: float) -> tuple[float, float]:
        """(start, end) of the ``query_range`` answering this query for (end − range_seconds, end].

        Per-step queries run at end − k·step for k = 0 … range/step − 1 (Prometheus includes both ends
        of [start, end], the window excludes its left end); the others at ``end`` only (one point).
        """
        return (end - range_seconds + step_seconds, end) if self.per_step else (end, end)

    def expr(self, step_seconds: float, range_seconds: float) -> str:
        """The PromQL text for a step of ``step_seconds`` and a window (or sub-window) of ``range_seconds``.

        - ``step``: ``max_over_time(M[step − 1 ms])``: the maximum of every raw sample in (t − step, t]
          (present when the interval holds a sample; NaN only when all its samples are NaN). Read
          straight from the TSDB with no aggregation or join, so the engine reads each sample once.
        - ``timestamp``: ``timestamp(M)``: the newest raw sample's own time at or before the end.
        - ``nonfinite``: ``sum_over_time(M[W − 1 ms]) * 0 != 0``: the series holding a NaN or ±Inf sample
          in the range, and only those (finite sums give 0 and are dropped) — no self-join.
        """
        sel = _selector(self.metric, self.job)
        if self.kind == "step":
            return f"max_over_time({sel}{_open_range(step_seconds)})"
        if self.kind == "timestamp":
            return f"timestamp({sel})"
        return f"(sum_over_time({sel}{_open_range(range_seconds)}) * 0) != 0"


def observation_queries(job: str | None = None) -> tuple[MetricQuery, ...]:
    """Every query of an observation (format 2), in snapshot file order; the count is constant (15).

    ``job`` restricts every selector to ``{job="<job>"}`` (config ``prometheus.job``): a second exporter
    of the same GPUs, or ``up`` of every other scrape target, would otherwise be read as more devices.
    """
    out = [MetricQuery(f"metrics/{m}.json", m, "step", job) for m in STEP_METRICS]
    out += [MetricQuery(f"metrics/{m}.timestamp.json", m, "timestamp", job) for m in ACTIVITY_METRICS]
    out += [MetricQuery(f"metrics/{m}.nonfinite.json", m, "nonfinite", job) for m in DEVICE_METRICS]
    return tuple(out)


@dataclass(slots=True)
class DeviceSignals:
    """What the window says about one device (a physical GPU or a MIG instance).

    Units: activity percent (0..100), framebuffer MiB, power W. ``None`` means no usable sample.
    ``active_steps`` holds the step slots (see ``Window.step_index``) where activity was above the
    policy threshold; ``coverage`` is the share of window steps with a finite activity sample (0..1).
    ``liveness`` is ``moving``, ``frozen`` or ``absent`` (energy counter, else power, design §3).
    """

    node: str
    device: str
    gpu_instance: str = ""
    mig_profile: str | None = None
    exporter: str = ""
    activity_max_pct: float | None = None
    activity_points: int = 0
    coverage: float = 0.0
    active_steps: frozenset[int] = frozenset()
    fb_used_max_mib: float | None = None
    fb_total_mib: float | None = None
    power_max_w: float | None = None
    newest_sample: float | None = None
    liveness: str = "absent"
    non_finite: tuple[str, ...] = ()
    signals_disagree: bool = False
    has_fb: bool = False
    has_power: bool = False

    @property
    def is_mig(self) -> bool:
        """True for a MIG instance (series carry ``GPU_I_ID``)."""
        return bool(self.gpu_instance)


@dataclass(frozen=True, slots=True)
class UnmappedSeries:
    """A series no node could be assigned to (design §5 plan ``unmapped``)."""

    metric: str
    labels: dict[str, str]
    reason: str


@dataclass
class CollectedSignals:
    """Per node: device signals, ``up`` coverage and problems; plus the unmapped series.

    ``up_coverage`` maps node → share of window steps with ``up == 1`` (absent when ``up`` has no series
    for that node). ``problems`` are metric names whose answer was unusable (``partial_response``).
    ``present`` are the device metrics that were exported at all.
    """

    devices: dict[str, list[DeviceSignals]] = field(default_factory=dict)
    up_coverage: dict[str, float] = field(default_factory=dict)
    unmapped: list[UnmappedSeries] = field(default_factory=list)
    problems: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()


def _device_key(node: str, labels: Mapping[str, str]) -> DeviceKey:
    return (node, labels.get("UUID") or labels.get("gpu") or "", labels.get("GPU_I_ID") or "")


def _merge(
    series: Iterable[Series], window: Window
) -> tuple[dict[int, float], dict[int, float], float | None]:
    """Merge series of one device per step (max); returns (finite by slot, non-finite by slot, newest t)."""
    finite: dict[int, float] = {}
    bad: dict[int, float] = {}
    newest: float | None = None
    for s in series:
        for t, v in zip(s.times, s.values, strict=True):
            slot = window.step_index(t)
            if slot is None:
                continue
            if newest is None or t > newest:
                newest = t
            if math.isfinite(v):
                if slot not in finite or v > finite[slot]:
                    finite[slot] = v
            else:
                bad[slot] = v
    return finite, bad, newest


def collect_signals(
    metrics: Mapping[str, MetricData],
    timestamps: Mapping[str, MetricData],
    joiner: NodeJoiner,
    window: Window,
    activity_threshold_pct: float,
    *,
    nonfinite: Mapping[str, MetricData] | None = None,
    metrics_format: int = 1,
) -> CollectedSignals:
    """Turn an observation's matrices into per-device signals (snapshot and live path alike).

    A matrix point is one step's fact: in format 2 the maximum of every raw sample in (t − step, t]
    (``MetricQuery``), in format 1 (older snapshots) the sample Prometheus' lookback showed at t. Series
    of one device are merged per step by max; a step is covered when it has a finite point.

    Args:
        metrics: metric name → its matrix (missing metrics are simply absent).
        timestamps: metric name → the answer of ``timestamp(<metric>)`` (raw sample times), optional.
        joiner: resolves series labels to nodes (design §3 join).
        window: the idle window.
        activity_threshold_pct: the policy's ``gpu_activity_max_pct`` (percent) for ``active_steps``.
        nonfinite: metric name → the series holding a NaN/±Inf raw sample in the window (format 2); those
            devices get ``non_finite:<metric>``. An unusable answer makes the metric a problem.
        metrics_format: 2 for per-step maxima (freshness then comes from ``timestamps`` only: a step
            point's time is not a sample's), 1 for raw points (a point's time is its sample's).

    Returns:
        ``CollectedSignals``; series that cannot be joined are listed in ``unmapped`` and assigned to
        no node, so a node whose devices lack series ends up ``unknown``.
    """
    nonfinite = nonfinite or {}
    problems = tuple(
        sorted(
            {m.name for m in metrics.values() if m.problem}
            | {m.name for m in timestamps.values() if m.problem}
            | {m.name for m in nonfinite.values() if m.problem}
        )
    )
    grouped: dict[str, dict[DeviceKey, list[Series]]] = {}
    meta: dict[DeviceKey, dict[str, str]] = {}
    unmapped: list[UnmappedSeries] = []
    for name in DEVICE_METRICS:
        data = metrics.get(name)
        if data is None or data.problem:
            continue
        per_key = grouped.setdefault(name, {})
        for s in data.series:
            result = joiner.join(s.labels)
            if result.node is None:
                unmapped.append(UnmappedSeries(name, dict(s.labels), f"series_unmapped:{result.reason}"))
                continue
            key = _device_key(result.node, s.labels)
            per_key.setdefault(key, []).append(s)
            info = meta.setdefault(key, {})
            if s.labels.get("GPU_I_PROFILE"):
                info["profile"] = s.labels["GPU_I_PROFILE"]
            info.setdefault("exporter", s.labels.get("instance") or s.labels.get("Hostname") or "")

    ts_newest: dict[DeviceKey, float] = {}
    ts_bad: dict[DeviceKey, set[str]] = {}
    for name in ACTIVITY_METRICS:
        data = timestamps.get(name)
        if data is None or data.problem:
            continue
        for s in data.series:
            result = joiner.join(s.labels)
            if result.node is None:
                continue
            key = _device_key(result.node, s.labels)
            finite = [
                v for t, v in zip(s.times, s.values, strict=True) if math.isfinite(v) and t <= window.end
            ]
            if finite:
                ts_newest[key] = max(ts_newest.get(key, -math.inf), max(finite))
            if any(
                not math.isfinite(v)
                for t, v in zip(s.times, s.values, strict=True)
                if window.start < t <= window.end
            ):
                # A raw sample time that is NaN/±Inf says nothing about freshness: unknown, never "fresh".
                ts_bad.setdefault(key, set()).add(f"timestamp({name})")

    bad_samples: dict[DeviceKey, set[str]] = {}
    for name, data in nonfinite.items():
        if data.problem:
            continue
        for s in data.series:
            result = joiner.join(s.labels)
            if result.node is not None:
                bad_samples.setdefault(_device_key(result.node, s.labels), set()).add(name)

    # A MIG instance is a device only through the profiling metric (BUG-02): its GPU_UTIL series is ignored.
    activity_keys = set(grouped.get(PROF_ACTIVE, {})) | {k for k in grouped.get(GPU_UTIL, {}) if not k[2]}
    devices: dict[str, list[DeviceSignals]] = {}
    for key in sorted(activity_keys):
        node, device, gi = key
        sig = DeviceSignals(node=node, device=device, gpu_instance=gi)
        sig.mig_profile = meta.get(key, {}).get("profile")
        sig.exporter = meta.get(key, {}).get("exporter", "")
        _activity(sig, key, grouped, window, activity_threshold_pct)
        if metrics_format >= 2:
            sig.newest_sample = None  # a step point's time is the step's end, not a sample's time
        if key in ts_newest:
            sig.newest_sample = ts_newest[key]
        if key in ts_bad:
            sig.non_finite = (*sig.non_finite, *sorted(ts_bad[key]))
        parent = (node, device, "")
        fb_key = key if key in grouped.get(FB_USED, {}) else parent
        _framebuffer(sig, fb_key, grouped, window)
        _power_and_liveness(sig, parent, grouped, window)
        flagged = [
            *(m for m in ((PROF_ACTIVE,) if gi else ACTIVITY_METRICS) if m in bad_samples.get(key, ())),
            *(m for m in (FB_USED, FB_FREE) if m in bad_samples.get(fb_key, ())),
            *(m for m in (POWER, ENERGY) if m in bad_samples.get(parent, ())),
        ]
        sig.non_finite = (*sig.non_finite, *(m for m in flagged if m not in sig.non_finite))
        devices.setdefault(node, []).append(sig)

    up_coverage: dict[str, float] = {}
    up = metrics.get(UP)
    if up is not None and not up.problem:
        per_node: dict[str, list[Series]] = {}
        for s in up.series:
            result = joiner.join(s.labels)
            if result.node is not None:
                per_node.setdefault(result.node, []).append(s)
        for node, series in per_node.items():
            up_points, up_bad, _ = _merge(series, window)
            up_coverage[node] = min(
                1.0, sum(1 for v in up_points.values() if v == 1) / window.expected_points
            )
            if up_bad:
                # A non-finite ``up`` is not a scrape result: the node's data is unknown (non_finite:up).
                for sig in devices.get(node, ()):
                    sig.non_finite = (*sig.non_finite, UP)

    present = frozenset(n for n in DEVICE_METRICS if n in metrics and not metrics[n].problem)
    return CollectedSignals(devices, up_coverage, unmapped, problems, present)


def gpu_activity(
    metrics: Mapping[str, MetricData], joiner: NodeJoiner, window: Window
) -> dict[tuple[str, str], dict[int, float]]:
    """Activity (percent) per physical GPU and window step slot, by the rules ``collect_signals`` uses.

    For accounting over long histories (``rightsizer.domain.backtest``), not for verdicts. Series of one
    device are merged per step (max); a physical GPU's activity is max(100 × PROF, GPU_UTIL); a MIG
    instance counts through PROF only (BUG-02), and a GPU with MIG instances is as active as its most
    active instance (a GPU is free only when every instance is). Non-finite samples and series that no
    node joins are left out, so a slot without a finite sample is simply absent (unknown).

    Args:
        metrics: metric name → query_range answer (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``).
        joiner: resolves series labels to nodes.
        window: the slots (see ``Window.step_index``: 0 = ``window.end``, counting back).

    Returns:
        (node, UUID or gpu index) → {slot: activity percent}.
    """
    grouped: dict[str, dict[DeviceKey, list[Series]]] = {}
    for name in ACTIVITY_METRICS:
        data = metrics.get(name)
        if data is None or data.problem:
            continue
        per_key = grouped.setdefault(name, {})
        for s in data.series:
            node = joiner.join(s.labels).node
            if node is not None:
                per_key.setdefault(_device_key(node, s.labels), []).append(s)
    mig_parents = {(k[0], k[1]) for k in grouped.get(PROF_ACTIVE, {}) if k[2]}
    out: dict[tuple[str, str], dict[int, float]] = {}
    for name in ACTIVITY_METRICS:
        scale = 100.0 if name == PROF_ACTIVE else 1.0
        for key, series in grouped.get(name, {}).items():
            gpu = (key[0], key[1])
            if (key[2] and name != PROF_ACTIVE) or (not key[2] and gpu in mig_parents):
                continue
            finite, _, _ = _merge(series, window)
            slots = out.setdefault(gpu, {})
            for slot, v in finite.items():
                value = v * scale
                if slot not in slots or value > slots[slot]:
                    slots[slot] = value
    return out


def _activity(
    sig: DeviceSignals,
    key: DeviceKey,
    grouped: Mapping[str, Mapping[DeviceKey, list[Series]]],
    window: Window,
    threshold: float,
) -> None:
    # A MIG instance has no usable DCGM_FI_DEV_GPU_UTIL (BUG-02): only the profiling metric counts.
    names = (PROF_ACTIVE,) if sig.is_mig else ACTIVITY_METRICS
    per_metric: dict[str, dict[int, float]] = {}
    non_finite: list[str] = []
    newest: float | None = None
    for name in names:
        series = grouped.get(name, {}).get(key)
        if not series:
            continue
        finite, bad, last = _merge(series, window)
        scale = 100.0 if name == PROF_ACTIVE else 1.0
        per_metric[name] = {slot: v * scale for slot, v in finite.items()}
        if bad:
            non_finite.append(name)
        if last is not None and (newest is None or last > newest):
            newest = last
    slots: dict[int, float] = {}
    for values in per_metric.values():
        for slot, v in values.items():
            if slot not in slots or v > slots[slot]:
                slots[slot] = v
    prof, util = per_metric.get(PROF_ACTIVE), per_metric.get(GPU_UTIL)
    if prof is not None and util is not None:
        sig.signals_disagree = any(
            abs(prof[slot] - util[slot]) > DISAGREE_POINTS for slot in prof.keys() & util.keys()
        )
    sig.non_finite = tuple(non_finite)
    sig.activity_points = len(slots)
    sig.coverage = min(1.0, len(slots) / window.expected_points)
    sig.activity_max_pct = max(slots.values()) if slots else None
    sig.active_steps = frozenset(slot for slot, v in slots.items() if v > threshold)
    sig.newest_sample = newest


def _framebuffer(
    sig: DeviceSignals,
    key: DeviceKey,
    grouped: Mapping[str, Mapping[DeviceKey, list[Series]]],
    window: Window,
) -> None:
    used = grouped.get(FB_USED, {}).get(key)
    if not used:
        return
    sig.has_fb = True
    finite, bad, _ = _merge(used, window)
    if bad:
        sig.non_finite = (*sig.non_finite, FB_USED)
    if finite:
        sig.fb_used_max_mib = max(finite.values())
    free = grouped.get(FB_FREE, {}).get(key)
    if free:
        free_finite, free_bad, _ = _merge(free, window)
        if free_bad:
            sig.non_finite = (*sig.non_finite, FB_FREE)
        totals = [finite[s] + free_finite[s] for s in finite.keys() & free_finite.keys()]
        if totals:
            sig.fb_total_mib = max(totals)


def _power_and_liveness(
    sig: DeviceSignals,
    parent: DeviceKey,
    grouped: Mapping[str, Mapping[DeviceKey, list[Series]]],
    window: Window,
) -> None:
    power = grouped.get(POWER, {}).get(parent)
    power_values: list[float] = []
    if power:
        sig.has_power = True
        finite, bad, _ = _merge(power, window)
        if bad:
            sig.non_finite = (*sig.non_finite, POWER)
        power_values = [finite[s] for s in sorted(finite)]
        if power_values:
            sig.power_max_w = max(power_values)
    energy = grouped.get(ENERGY, {}).get(parent)
    if energy:
        finite, energy_bad, _ = _merge(energy, window)
        if energy_bad:
            sig.non_finite = (*sig.non_finite, ENERGY)
        values = list(finite.values())
        sig.liveness = "moving" if len(set(values)) > 1 else "frozen"
    elif power_values:
        sig.liveness = "moving" if len(set(power_values)) > 1 else "frozen"
