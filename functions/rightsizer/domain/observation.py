"""Metrics format 2: what an observation asks Prometheus, and what its answers say per device.

One set of queries (``observation_queries``) serves both paths: ``rightsizer snapshot`` records their
answers as files and ``plan --snapshot`` reads them back; the live plan (``adapters.prometheus.
collect_live``) asks them and hands the answers over in memory. ``signals_from_observation`` turns the
answers into ``DeviceSignals`` for both, so a snapshot replays to the live verdicts.

Fidelity contract: every fact covers *all raw samples* of its interval, whatever the step.

- Activity (``GPU_UTIL``, ``PROF_GR_ENGINE_ACTIVE``) and ``up`` per step: ``max_over_time(m[step − 1ms])``
  at every step point t, the maximum of the raw samples in (t − step, t]; a step is covered when it holds a
  finite sample. Coverage, active steps and the PROF/UTIL disagreement are counted on these points.
- Framebuffer used and power over the window: ``max_over_time(m[W − 1ms])`` at the end.
- Liveness (energy counter, else power) and their non-finite samples: ``stddev_over_time(m[W − 1ms])`` —
  0 for a counter that never moved, > 0 when it moved, NaN when a sample is NaN or ±Inf.
- Framebuffer total and its non-finite samples: ``avg_over_time(m[W − 1ms])`` of ``FB_USED`` and
  ``FB_FREE`` — used + free is the device's constant memory, so the averages add up to it; an average is
  NaN/±Inf exactly when a sample is.
- Non-finite activity samples: ``(sum_over_time(m[W − 1ms]) * 0) != 0`` keeps only the series with a
  NaN/±Inf sample (a sum is non-finite exactly then), with no self-join.
- Freshness: ``timestamp(m)`` at the end, the newest raw sample's own time.

Every query reads raw samples straight from the TSDB with no aggregation or join, each family at most
twice, so the engine stays near the floor of reading each sample once; no fact comes from Prometheus'
5-minute lookback except the newest-sample time, which is about the newest sample by definition.

DCGM fields (NVIDIA dcgm-exporter ``default-counters.csv`` / ``dcp-metrics-included.csv``): percent, ratio,
MiB, W, mJ (see ``rightsizer.domain.usage``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from rightsizer.domain.join import JoinResult, NodeJoiner
from rightsizer.domain.model import MetricData, Series
from rightsizer.domain.usage import (
    ACTIVITY_METRICS,
    DEVICE_METRICS,
    DISAGREE_POINTS,
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
    CollectedSignals,
    DeviceKey,
    DeviceSignals,
    UnmappedSeries,
    Window,
)

#: Observation format ``rightsizer snapshot`` writes (``snapshot.json`` ``metrics_format``; absent = 1).
METRICS_FORMAT = 2

Kind = Literal["step", "max", "stddev", "avg", "timestamp", "nonfinite"]
#: Metrics whose ``metrics/<M>.json`` is a per-step matrix (the others' is one point at the end).
STEP_METRICS = (GPU_UTIL, PROF_ACTIVE, UP)
#: kind → (file suffix, metrics asked).
KINDS: Mapping[Kind, tuple[str, tuple[str, ...]]] = {
    "step": ("", STEP_METRICS),
    "max": ("", (FB_USED, POWER)),
    "stddev": (".stddev", (POWER, ENERGY)),
    "avg": (".avg", (FB_USED, FB_FREE)),
    "timestamp": (".timestamp", ACTIVITY_METRICS),
    "nonfinite": (".nonfinite", ACTIVITY_METRICS),
}
#: File suffix → kind (``metrics/<M><suffix>.json``); "" holds both per-step and window maxima.
SUFFIX_KINDS = {suffix: kind for kind, (suffix, _) in KINDS.items() if kind != "max"}

MetricFiles = dict[str, dict[str, MetricData]]
"""kind (``step`` also holding the window maxima, ``stddev``, ``avg``, ``timestamp``, ``nonfinite``)
→ metric name → its answer."""


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _selector(metric: str, job: str | None, matchers: str = "") -> str:
    inner = ",".join(m for m in ((f"job={_quote(job)}" if job else ""), matchers) if m)
    return f"{metric}{{{inner}}}" if inner else metric


def _open_range(seconds: float) -> str:
    # Prometheus 2.x ranges include both ends; one millisecond less than the interval makes them
    # (t − interval, t] at the TSDB's millisecond resolution (Prometheus 3 ranges are left-open already).
    return f"[{round(seconds * 1000) - 1}ms]"


@dataclass(frozen=True, slots=True)
class MetricQuery:
    """One query of an observation and the snapshot file that records its answer.

    ``kind`` says what it asks (module docstring); ``metric`` is the metric it feeds (a failed answer
    makes that metric a problem); ``job`` restricts the selector to one scrape job.
    """

    metric: str
    kind: Kind
    job: str | None = None

    @property
    def path(self) -> str:
        """The snapshot file, ``metrics/<metric><suffix>.json``."""
        return f"metrics/{self.metric}{KINDS[self.kind][0]}.json"

    @property
    def per_step(self) -> bool:
        """True when evaluated at every step point (``query_range`` over the window)."""
        return self.kind == "step"

    @property
    def splittable(self) -> bool:
        """True when answers over sub-windows merge exactly into the window's answer: per-step points
        (disjoint), maxima (max of maxima) and non-finite sums (a sample is in some sub-window)."""
        return self.kind in ("step", "max", "nonfinite")

    def span(self, end: float, range_seconds: float, step_seconds: float) -> tuple[float, float]:
        """(start, end) of the ``query_range`` answering this query for (end − range_seconds, end].

        Per-step queries run at end − k·step for k = 0 … range/step − 1 (Prometheus includes both ends
        of [start, end], the window excludes its left end); the others at ``end`` only (one point).
        """
        return (end - range_seconds + step_seconds, end) if self.per_step else (end, end)

    def expr(self, step_seconds: float, range_seconds: float, matchers: str = "") -> str:
        """The PromQL text for a step of ``step_seconds`` and a window (or sub-window) of ``range_seconds``;
        ``matchers`` (PromQL label matchers, e.g. a ``SeriesShard``'s) narrow the selector further."""
        sel = _selector(self.metric, self.job, matchers)
        if self.kind == "step":
            return f"max_over_time({sel}{_open_range(step_seconds)})"
        if self.kind == "max":
            return f"max_over_time({sel}{_open_range(range_seconds)})"
        if self.kind in ("stddev", "avg"):
            return f"{self.kind}_over_time({sel}{_open_range(range_seconds)})"
        if self.kind == "timestamp":
            return f"timestamp({sel})"
        return f"(sum_over_time({sel}{_open_range(range_seconds)}) * 0) != 0"


def observation_queries(job: str | None = None) -> tuple[MetricQuery, ...]:
    """Every query of an observation, in snapshot file order; their number is a constant (13)."""
    return tuple(MetricQuery(m, kind, job) for kind, (_, metrics) in KINDS.items() for m in metrics)


#: RE2 metacharacters. Escaping only these keeps a shard's ``a|b|c`` a plain set of literals, which
#: Prometheus answers with one index lookup per value instead of a regex run over every label value
#: (``findSetMatches`` in prometheus/tsdb, 2.x); escaping anything else (``\\-``) would lose that.
_REGEX_META = frozenset(".+*?()|[]{}^$\\")


def _regex_literal(value: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in value)


@dataclass(frozen=True, slots=True)
class SeriesShard:
    """A series shard: the series whose ``label`` (config ``prometheus.node_label``) is one of ``nodes``.

    Shards of one collection hold disjoint node sets, so their answers are disjoint sets of series and
    merge by plain union into the unsharded answer; a shard that fails leaves only its nodes without data.
    """

    label: str
    nodes: tuple[str, ...]

    def matcher(self) -> str:
        """``label=~"n1|n2|…"`` with each name's regex metacharacters escaped (an exact-match set)."""
        return f"{self.label}=~{_quote('|'.join(_regex_literal(n) for n in self.nodes))}"


def series_shards(label: str, nodes: Iterable[str], per_shard: int) -> tuple[SeriesShard, ...]:
    """Node names (sorted, deduplicated) cut into shards of at most ``per_shard`` (≥ 1) nodes each.

    Raises:
        ValueError: ``per_shard`` < 1.
    """
    if per_shard < 1:
        raise ValueError(f"per_shard must be ≥ 1, got {per_shard}")
    names = sorted(set(nodes))
    return tuple(SeriesShard(label, tuple(names[i : i + per_shard])) for i in range(0, len(names), per_shard))


def file_kind(stem: str) -> tuple[str, str]:
    """(kind, metric) of a metrics file stem: ``DCGM_FI_DEV_GPU_UTIL.timestamp`` → (timestamp, …);
    a stem without a known suffix is ``step`` (per-step or window maxima, and every format-1 matrix)."""
    for suffix, kind in SUFFIX_KINDS.items():
        if suffix and stem.endswith(suffix):
            return kind, stem.removesuffix(suffix)
    return "step", stem


def _device_key(node: str, labels: Mapping[str, str]) -> DeviceKey:
    return (node, labels.get("UUID") or labels.get("gpu") or "", labels.get("GPU_I_ID") or "")


class _Grouped:
    """The answers of one kind joined to devices: metric → device key → series."""

    def __init__(
        self,
        files: Mapping[str, MetricData],
        joiner: NodeJoiner,
        unmapped: list[UnmappedSeries] | None,
        joined: dict[tuple[tuple[str, str], ...], JoinResult],
    ) -> None:
        self.by_metric: dict[str, dict[DeviceKey, list[Series]]] = {}
        self.labels: dict[DeviceKey, Mapping[str, str]] = {}
        for name, data in files.items():
            if data.problem:
                continue
            per_key = self.by_metric.setdefault(name, {})
            for s in data.series:
                # One series shows up in several answers with the same labels: join it once.
                ident = tuple(s.labels.items())
                result = joined.get(ident)
                if result is None:
                    result = joined[ident] = joiner.join(s.labels)
                if result.node is None:
                    if unmapped is not None:
                        reason = f"series_unmapped:{result.reason}"
                        unmapped.append(UnmappedSeries(name, dict(s.labels), reason))
                    continue
                key = _device_key(result.node, s.labels)
                per_key.setdefault(key, []).append(s)
                self.labels.setdefault(key, s.labels)

    def series(self, metric: str, key: DeviceKey) -> list[Series]:
        return self.by_metric.get(metric, {}).get(key, [])

    def has(self, metric: str, key: DeviceKey) -> bool:
        return key in self.by_metric.get(metric, {})

    def values(self, metric: str, key: DeviceKey) -> list[float]:
        return [v for s in self.series(metric, key) for v in s.values]


def _per_step(series: Iterable[Series], window: Window) -> tuple[dict[int, float], bool]:
    """Merge per-step points of one device's series by max: (finite value by step slot, any non-finite).

    Slots as ``Window.step_index`` (0 = the window's end), inlined: this loop sees every point.
    """
    finite: dict[int, float] = {}
    bad = False
    end, start, step = window.end, window.start, max(window.step, 1)
    last = window.expected_points - 1
    isfinite = math.isfinite
    for s in series:
        for t, v in zip(s.times, s.values, strict=True):
            if not (start < t <= end):
                continue
            if not isfinite(v):
                bad = True
                continue
            slot = min(round((end - t) / step), last)
            if v > finite.get(slot, -math.inf):
                finite[slot] = v
    return finite, bad


def signals_from_observation(
    files: Mapping[str, Mapping[str, MetricData]],
    joiner: NodeJoiner,
    window: Window,
    activity_threshold_pct: float,
) -> CollectedSignals:
    """Per-device signals from the answers of ``observation_queries`` (snapshot files or live answers).

    Args:
        files: ``MetricFiles`` (kind → metric → answer); missing answers are simply absent, answers with
            a ``problem`` make their metric a problem (⇒ ``partial_response`` ⇒ unknown).
        joiner: resolves series labels to nodes (docs/architecture.md §3 join); unjoinable series of the main answers
            are listed in ``unmapped``.
        window: the idle window.
        activity_threshold_pct: the policy's ``gpu_activity_max_pct`` (percent) for ``active_steps``.

    Returns:
        ``CollectedSignals``: a device per activity series (a MIG instance through the profiling metric
        only, BUG-02), with coverage, maxima, freshness, liveness and non-finite findings.
    """
    problems = tuple(sorted({d.name for kind in files.values() for d in kind.values() if d.problem}))
    unmapped: list[UnmappedSeries] = []
    joined: dict[tuple[tuple[str, str], ...], JoinResult] = {}
    main = _Grouped(files.get("step", {}), joiner, unmapped, joined)
    # POWER's spread repeats the series of its maximum: only ENERGY's unjoinable series are new here.
    energy_unmapped: list[UnmappedSeries] = []
    stddev = _Grouped(files.get("stddev", {}), joiner, energy_unmapped, joined)
    unmapped = [u for u in unmapped if u.metric != UP] + [u for u in energy_unmapped if u.metric == ENERGY]
    averages = _Grouped(files.get("avg", {}), joiner, None, joined)
    stamps = _Grouped(files.get("timestamp", {}), joiner, None, joined)
    nonfinite = _Grouped(files.get("nonfinite", {}), joiner, None, joined)

    activity_keys = set(main.by_metric.get(PROF_ACTIVE, {})) | {
        k for k in main.by_metric.get(GPU_UTIL, {}) if not k[2]
    }
    devices: dict[str, list[DeviceSignals]] = {}
    for key in sorted(activity_keys):
        node, device, gi = key
        parent = (node, device, "")
        sig = DeviceSignals(node=node, device=device, gpu_instance=gi)
        labels = main.labels.get(key, {})
        sig.mig_profile = labels.get("GPU_I_PROFILE") or None
        sig.exporter = labels.get("instance") or labels.get("Hostname") or ""
        bad: list[str] = []
        names = (PROF_ACTIVE,) if gi else ACTIVITY_METRICS
        per_metric: dict[str, dict[int, float]] = {}
        for name in names:
            if not main.has(name, key):
                continue
            finite, any_bad = _per_step(main.series(name, key), window)
            scale = 100.0 if name == PROF_ACTIVE else 1.0
            per_metric[name] = {slot: v * scale for slot, v in finite.items()}
            if any_bad or nonfinite.has(name, key):
                bad.append(name)
        slots: dict[int, float] = {}
        for values in per_metric.values():
            for slot, v in values.items():
                slots[slot] = max(v, slots.get(slot, v))
        prof, util = per_metric.get(PROF_ACTIVE), per_metric.get(GPU_UTIL)
        if prof is not None and util is not None:
            sig.signals_disagree = any(
                abs(prof[k] - util[k]) > DISAGREE_POINTS for k in prof.keys() & util.keys()
            )
        sig.activity_points = len(slots)
        sig.coverage = min(1.0, len(slots) / window.expected_points)
        sig.activity_max_pct = max(slots.values()) if slots else None
        sig.active_steps = frozenset(slot for slot, v in slots.items() if v > activity_threshold_pct)
        times = [t for n in ACTIVITY_METRICS for t in stamps.values(n, key)]
        if any(not math.isfinite(t) for t in times):
            bad.extend(f"timestamp({n})" for n in ACTIVITY_METRICS if stamps.has(n, key))
        finite_times = [t for t in times if math.isfinite(t) and t <= window.end]
        sig.newest_sample = max(finite_times) if finite_times else None

        fb_key = key if main.has(FB_USED, key) else parent
        if main.has(FB_USED, fb_key):
            sig.has_fb = True
            used = main.values(FB_USED, fb_key)
            sig.fb_used_max_mib = _window_max(used)
            if any(not math.isfinite(v) for v in (*used, *averages.values(FB_USED, fb_key))):
                bad.append(FB_USED)
            if any(not math.isfinite(v) for v in averages.values(FB_FREE, fb_key)):
                bad.append(FB_FREE)
            sig.fb_total_mib = _fb_total(averages, fb_key)

        if main.has(POWER, parent):
            sig.has_power = True
            power = main.values(POWER, parent)
            sig.power_max_w = _window_max(power)
            spread = stddev.values(POWER, parent)
            if any(not math.isfinite(v) for v in (*power, *spread)):
                bad.append(POWER)
        energy = stddev.values(ENERGY, parent)
        if stddev.has(ENERGY, parent):
            if any(not math.isfinite(v) for v in energy):
                bad.append(ENERGY)
            sig.liveness = "moving" if any(math.isfinite(v) and v > 0 for v in energy) else "frozen"
        elif stddev.has(POWER, parent):
            spread = stddev.values(POWER, parent)
            sig.liveness = "moving" if any(math.isfinite(v) and v > 0 for v in spread) else "frozen"
        sig.non_finite = tuple(dict.fromkeys(bad))
        devices.setdefault(node, []).append(sig)

    up_series: dict[str, list[Series]] = {}
    for key, series in main.by_metric.get(UP, {}).items():
        up_series.setdefault(key[0], []).extend(series)
    up_coverage: dict[str, float] = {}
    for node, series in up_series.items():
        # Merged per step (max) over every ``up`` series of the node.
        finite, any_bad = _per_step(series, window)
        up_coverage[node] = min(1.0, sum(1 for v in finite.values() if v == 1) / window.expected_points)
        if any_bad:  # a non-finite ``up`` is not a scrape result: the node's data is unknown
            for sig in devices.get(node, ()):
                sig.non_finite = (*sig.non_finite, UP)

    main_files = {
        **{m: files.get("step", {}).get(m) for m in (GPU_UTIL, PROF_ACTIVE, FB_USED, POWER)},
        FB_FREE: files.get("avg", {}).get(FB_FREE),
        ENERGY: files.get("stddev", {}).get(ENERGY),
    }
    present = frozenset(m for m in DEVICE_METRICS if (d := main_files.get(m)) is not None and not d.problem)
    unmapped.sort(key=lambda u: (u.metric, sorted(u.labels.items())))
    return CollectedSignals(devices, up_coverage, unmapped, problems, present)


def _window_max(points: Iterable[float]) -> float | None:
    """The maximum of window (or sub-window) maxima; None when there is none, or when one is +Inf.

    ``max_over_time`` returns +Inf when the interval holds +Inf, and NaN only when every sample is NaN;
    ignoring NaN/−Inf points and giving up on +Inf makes the answer the same however the window was
    split (the device is ``non_finite`` then anyway).
    """
    values = list(points)
    if any(v == math.inf for v in values):
        return None
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else None


def _fb_total(averages: _Grouped, key: DeviceKey) -> float | None:
    """avg(FB_USED) + avg(FB_FREE) of one series (same labels) — the device's memory — largest over series."""

    def ident(s: Series) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(s.labels.items()))

    free = {ident(s): s for s in averages.series(FB_FREE, key)}
    totals = []
    for s in averages.series(FB_USED, key):
        other = free.get(ident(s))
        if other is not None and s.values and other.values:
            total = s.values[-1] + other.values[-1]
            if math.isfinite(total):
                totals.append(total)
    return max(totals) if totals else None
