"""From DCGM series to per-device signals (docs/architecture.md §3 "Device identity", "Signals", "Window, coverage").

The shared vocabulary of both observation formats (metric names, ``Window``, ``DeviceSignals``,
``CollectedSignals``) and the interpretation of format-1 snapshots (``collect_signals``: raw ``query_range``
points, one sample per step through Prometheus' lookback), which older snapshots and the packaged examples
use. Format 2 — every raw sample counted, what ``rightsizer snapshot`` and the live plan read today — is
``rightsizer.domain.observation``. Everything after the signals (``rightsizer.domain.gpu``) is shared.

DCGM fields (NVIDIA dcgm-exporter ``default-counters.csv`` / ``dcp-metrics-included.csv``):
``DCGM_FI_DEV_GPU_UTIL`` (percent), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0..1), ``DCGM_FI_DEV_FB_USED``
and ``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
(mJ since boot, monotonic).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

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

DeviceKey = tuple[str, str, str]
"""(node, UUID or gpu index, GPU_I_ID or "") — docs/architecture.md §3 "Device identity"."""


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


@dataclass(slots=True)
class DeviceSignals:
    """What the window says about one device (a physical GPU or a MIG instance).

    Units: activity percent (0..100), framebuffer MiB, power W. ``None`` means no usable sample.
    ``active_steps`` holds the step slots (see ``Window.step_index``) where activity was above the
    policy threshold; ``coverage`` is the share of window steps with a finite activity sample (0..1).
    ``liveness`` is ``moving``, ``frozen`` or ``absent`` (energy counter, else power, docs/architecture.md §3).
    ``sample_interval_s`` is the scrape interval (s) as far as the source shows it, for the freshness
    bound: format 2 window ÷ scrape attempts of the device's target (its ``up`` samples; per-device raw
    samples in snapshots written before); format 1 an upper bound, the shortest gap between the
    distinct raw sample times its ``timestamp`` matrix shows (``_shortest_gap``); None when unknown.
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
    sample_interval_s: float | None = None
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
    """A series no node could be assigned to (docs/architecture.md §5 plan ``unmapped``)."""

    metric: str
    labels: dict[str, str]
    reason: str


@dataclass
class CollectedSignals:
    """Per node: device signals, ``up`` coverage and problems; plus the unmapped series.

    ``up_coverage`` maps node → share of window steps with ``up == 1`` (absent when ``up`` has no series
    for that node). ``problems`` are metric names whose answer was unusable (``partial_response``).
    ``present`` are the device metrics that were exported at all. ``node_problems`` maps a node to the
    metric names whose answer was unusable for that node only (a failed series shard, ``SeriesShard``).
    """

    devices: dict[str, list[DeviceSignals]] = field(default_factory=dict)
    up_coverage: dict[str, float] = field(default_factory=dict)
    unmapped: list[UnmappedSeries] = field(default_factory=list)
    problems: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()
    node_problems: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def problems_of(self, node: str) -> tuple[str, ...]:
        """Metric names unusable for ``node``: the collection-wide ``problems`` and the node's own."""
        return (*self.problems, *self.node_problems.get(node, ()))


#: Series labels naming a device (dcgm-exporter): the GPU's ``UUID``, else its index ``gpu``; the MIG
#: GPU instance ``GPU_I_ID`` (empty for a whole GPU).
DEVICE_LABELS = ("UUID", "gpu", "GPU_I_ID")
#: The MIG profile of a GPU instance's series (dcgm-exporter, e.g. ``1g.5gb``).
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
#: The labels naming the exporter a device's series come from, the first one present.
EXPORTER_LABELS = ("instance", "Hostname")


def device_key(node: str, labels: Mapping[str, str]) -> DeviceKey:
    """(node, ``UUID`` or else ``gpu``, ``GPU_I_ID`` or "") of a series joined to ``node``."""
    uuid, index, instance = DEVICE_LABELS
    return (node, labels.get(uuid) or labels.get(index) or "", labels.get(instance) or "")


def exporter_of(labels: Mapping[str, str]) -> str:
    """The exporter a series comes from: the first ``EXPORTER_LABELS`` value present, else ""."""
    for label in EXPORTER_LABELS:
        if value := labels.get(label):
            return value
    return ""


#: The labels Prometheus gives every series of a scrape target, its ``up`` included (scrape config
#: ``job_name``, the target's address or what relabelling made of it): together they name the target.
TARGET_LABELS = ("job", "instance")
Target = tuple[str, str]


def target_of(labels: Mapping[str, str]) -> Target | None:
    """The scrape target a series comes from, (``job`` or "", ``instance``): the key that finds the
    target's ``up`` for the series; None without an ``instance`` label (no ``up`` can be told apart)."""
    job, instance = TARGET_LABELS
    address = labels.get(instance)
    return (labels.get(job) or "", address) if address else None


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


def _shortest_gap(sample_times: Iterable[float]) -> float | None:
    """The shortest gap (s) between distinct raw sample times a format-1 ``timestamp(M)`` matrix shows, or
    None with fewer than two.

    Each step point shows the newest raw sample of its lookback, so consecutive distinct values are whole
    multiples of the scrape interval apart: the shortest gap is an upper bound of the interval, exact
    when the interval is at least the step, the step (about) when scrapes are faster — a format-1 snapshot
    does not record the samples between step points. An exporter that stopped shows no new values, so its
    own staleness cannot widen the bound (docs/architecture.md §3 "Window, coverage, freshness").
    """
    distinct = sorted({t for t in sample_times if math.isfinite(t)})
    gaps = [b - a for a, b in itertools.pairwise(distinct)]
    return min(gaps) if gaps else None


def collect_signals(  # noqa: C901 (22): the signals of snapshot range data, step by step (§3)
    metrics: Mapping[str, MetricData],
    timestamps: Mapping[str, MetricData],
    joiner: NodeJoiner,
    window: Window,
    activity_threshold_pct: float,
) -> CollectedSignals:
    """Turn format-1 ``query_range`` matrices into per-device signals (snapshots without ``metrics_format``).

    Args:
        metrics: metric name → its query_range answer (missing metrics are simply absent).
        timestamps: metric name → the answer of ``timestamp(<metric>)`` (raw sample times), optional.
        joiner: resolves series labels to nodes (docs/architecture.md §3 join).
        window: the idle window.
        activity_threshold_pct: the policy's ``gpu_activity_max_pct`` (percent) for ``active_steps``.

    Returns:
        ``CollectedSignals``; series that cannot be joined are listed in ``unmapped`` and assigned to
        no node, so a node whose devices lack series ends up ``unknown``.
    """
    problems = tuple(
        sorted(
            {m.name for m in metrics.values() if m.problem}
            | {m.name for m in timestamps.values() if m.problem}
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
            key = device_key(result.node, s.labels)
            per_key.setdefault(key, []).append(s)
            info = meta.setdefault(key, {})
            if s.labels.get(MIG_PROFILE_LABEL):
                info["profile"] = s.labels[MIG_PROFILE_LABEL]
            info.setdefault("exporter", exporter_of(s.labels))

    ts_newest: dict[DeviceKey, float] = {}
    ts_gap: dict[DeviceKey, float] = {}
    ts_bad: dict[DeviceKey, set[str]] = {}
    for name in ACTIVITY_METRICS:
        data = timestamps.get(name)
        if data is None or data.problem:
            continue
        for s in data.series:
            result = joiner.join(s.labels)
            if result.node is None:
                continue
            key = device_key(result.node, s.labels)
            finite = [
                v for t, v in zip(s.times, s.values, strict=True) if math.isfinite(v) and t <= window.end
            ]
            if finite:
                ts_newest[key] = max(ts_newest.get(key, -math.inf), max(finite))
            gap = _shortest_gap(
                v for t, v in zip(s.times, s.values, strict=True) if window.start < t <= window.end
            )
            if gap is not None:
                ts_gap[key] = min(ts_gap.get(key, math.inf), gap)
            if any(
                not math.isfinite(v)
                for t, v in zip(s.times, s.values, strict=True)
                if window.start < t <= window.end
            ):
                # A raw sample time that is NaN/±Inf says nothing about freshness: unknown, never "fresh".
                ts_bad.setdefault(key, set()).add(f"timestamp({name})")

    # A MIG instance is a device only through the profiling metric (BUG-02): its GPU_UTIL series is ignored.
    activity_keys = set(grouped.get(PROF_ACTIVE, {})) | {k for k in grouped.get(GPU_UTIL, {}) if not k[2]}
    devices: dict[str, list[DeviceSignals]] = {}
    for key in sorted(activity_keys):
        node, device, gi = key
        sig = DeviceSignals(node=node, device=device, gpu_instance=gi)
        sig.mig_profile = meta.get(key, {}).get("profile")
        sig.exporter = meta.get(key, {}).get("exporter", "")
        _activity(sig, key, grouped, window, activity_threshold_pct)
        if key in ts_newest:
            sig.newest_sample = ts_newest[key]
        sig.sample_interval_s = ts_gap.get(key)
        if key in ts_bad:
            sig.non_finite = (*sig.non_finite, *sorted(ts_bad[key]))
        parent = (node, device, "")
        fb_key = key if key in grouped.get(FB_USED, {}) else parent
        _framebuffer(sig, fb_key, grouped, window)
        _power_and_liveness(sig, parent, grouped, window)
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

    For accounting over long histories (``rightsizer.backtest.simulate``), not for verdicts. Series of one
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
                per_key.setdefault(device_key(node, s.labels), []).append(s)
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
