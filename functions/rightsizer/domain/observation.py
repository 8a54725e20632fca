"""Metrics format 2: what an observation asks Prometheus, and what its answers say per device.

One set of queries (``observation_queries``) serves both paths: ``rightsizer snapshot`` records their
answers as files and ``plan --snapshot`` reads them back; the live plan (``adapters.prometheus.
collect_live``) asks them and hands the answers over in memory. ``signals_from_observation`` (``rightsizer.domain.observation_signals``) turns the
answers into ``DeviceSignals`` for both, so a snapshot replays to the live verdicts.

Fidelity contract: every fact covers *all raw samples* of its interval, whatever the step.

- Window bounds are the range selector's own: ``m[W]`` at the end reads [end − W, end] in Prometheus 2.x
  (AMP, Thanos, Mimir alike), so the sample at the window's first instant counts (issue 33; Prometheus 3
  ranges are left-open, and there the window is (end − W, end]). Format-2 snapshots written before read
  ``[W − 1ms]`` ranges; they replay as recorded.
- Activity (``GPU_UTIL``, ``PROF_GR_ENGINE_ACTIVE``) and ``up`` per step: ``max_over_time(m[step])``
  at every step point t, the maximum of the raw samples in [t − step, t] (a sample on a step point is in
  both its steps, the one at end − W in the oldest); a step is covered when it holds a finite sample.
  Coverage, active steps and the PROF/UTIL disagreement are counted on these points.
- Framebuffer used and power over the window: ``max_over_time(m[W])`` at the end.
- Liveness (energy counter, else power) and their non-finite samples: ``stddev_over_time(m[W])`` —
  0 for a counter that never moved, > 0 when it moved, NaN when a sample is NaN or ±Inf.
- Framebuffer total and its non-finite samples: ``avg_over_time(m[W])`` of ``FB_USED`` and
  ``FB_FREE`` — used + free is the device's constant memory, so the averages add up to it; an average is
  NaN/±Inf exactly when a sample is.
- Non-finite activity samples: ``(sum_over_time(m[W]) * 0) != 0`` keeps only the series with a
  NaN/±Inf sample (a sum is non-finite exactly then), with no self-join.
- Freshness: ``timestamp(m)`` at the end, the newest raw sample's own time; the scrape interval it is
  judged against: ``count_over_time(up[W])``, one sample per scrape attempt of each target (failed
  ones too), W ÷ attempts for every device of that target (``usage.target_of``: ``job`` and ``instance``,
  which Prometheus gives the target's DCGM series and its ``up`` alike; ``up.count.json``). One series per
  exporter instead of one per GPU and activity metric: 0.07 instead of 0.48 Prometheus CPU-s at 2,000
  nodes × 8 GPUs. Format-2 snapshots written before it carry per-device ``count_over_time`` of the
  activity metrics (``<M>.count.json``), read as then; a device with neither falls back to the fixed bound.

Every query reads raw samples straight from the TSDB with no aggregation or join, each family at most
twice, so the engine stays near the floor of reading each sample once; no fact comes from Prometheus'
5-minute lookback except the newest-sample time, which is about the newest sample by definition.

DCGM fields (NVIDIA dcgm-exporter ``default-counters.csv`` / ``dcp-metrics-included.csv``): percent, ratio,
MiB, W, mJ (see ``rightsizer.domain.usage``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from rightsizer.domain.join import promql_string
from rightsizer.domain.model import MetricData
from rightsizer.domain.observation_signals import ObservationReducer, signals_from_observation
from rightsizer.domain.usage import (
    ACTIVITY_METRICS,
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
)

__all__ = [
    "KINDS",
    "METRICS_FORMAT",
    "DeviceShard",
    "MetricFiles",
    "MetricQuery",
    "ObservationReducer",
    "SeriesShard",
    "Shard",
    "device_shards",
    "file_kind",
    "observation_queries",
    "series_shards",
    "signals_from_observation",
    "target_matchers",
]

#: Observation format ``rightsizer snapshot`` writes (``snapshot.json`` ``metrics_format``; absent = 1).
METRICS_FORMAT = 2

Kind = Literal["step", "max", "stddev", "avg", "timestamp", "nonfinite", "count"]
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
    "count": (".count", (UP,)),
}
#: File suffix → kind (``metrics/<M><suffix>.json``); "" holds both per-step and window maxima; ``.count``
#: also names the per-device activity counts of format-2 snapshots written before ``up.count.json``.
SUFFIX_KINDS = {suffix: kind for kind, (suffix, _) in KINDS.items() if kind != "max"}

MetricFiles = dict[str, dict[str, MetricData]]
"""kind (``step`` also holding the window maxima, ``stddev``, ``avg``, ``timestamp``, ``nonfinite``)
→ metric name → its answer."""


def _selector(metric: str, job: str | None, matchers: str = "") -> str:
    inner = ",".join(m for m in ((f"job={promql_string(job)}" if job else ""), matchers) if m)
    return f"{metric}{{{inner}}}" if inner else metric


def prometheus_duration(seconds: float) -> str:
    """``seconds`` as a duration every Prometheus-compatible server parses, wherever one goes: the
    ``timeout`` and ``step`` of a request and the range of a selector. Whole seconds (``89s``) when exact,
    else whole milliseconds (``89006ms``), floored to the millisecond so a budget is never exceeded.

    Source: Prometheus ``web/api/v1/api.go`` ``parseDuration`` takes a float or
    ``prometheus/common/model.ParseDuration``, whose units take whole numbers only: ``89.006s`` is a 400
    (``cannot parse "89.006s" to a valid duration``); AMP, Thanos and Mimir parse alike.

    Raises:
        ValueError: ``seconds`` is under one millisecond (not a duration Prometheus accepts).
    """
    ms = int(seconds * 1000 + 1e-6)
    if ms < 1:
        raise ValueError(f"{seconds!r} s is under the 1 ms Prometheus durations are counted in")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _range(seconds: float) -> str:
    # The range selector's own bounds, [t − interval, t] in Prometheus 2.x (AMP, Thanos, Mimir alike):
    # the sample at the window's first instant counts. ``[interval − 1ms]`` (before) dropped it, and
    # with it the maximum of every series whose maximum sat there (issue 33: 13 hosts' activity and
    # 68 hosts' framebuffer at 10,000 nodes). Prometheus 3 ranges are left-open: there the window is
    # (t − W, t], its own range selector's.
    return f"[{prometheus_duration(seconds)}]"


@dataclass(frozen=True, slots=True)
class MetricQuery:
    """One query of an observation and the snapshot file that records its answer.

    ``kind`` says what it asks (module docstring); ``metric`` is the metric it feeds (a failed answer
    makes that metric a problem); ``job`` restricts the selector to one scrape job; ``scope``, when not
    empty, reads only the series one of its label matchers selects (``join.node_series_matchers``: one
    node's series), as the union ``<expr with matcher 1> or <expr with matcher 2> …`` — ``or`` keeps
    one answer per label set, so a series selected twice counts once.
    """

    metric: str
    kind: Kind
    job: str | None = None
    scope: tuple[str, ...] = ()

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
        """(start, end) of the ``query_range`` answering this query for [end − range_seconds, end].

        Per-step queries run at end − k·step for k = 0 … range/step − 1 (Prometheus includes both ends
        of [start, end]; the oldest step's range starts at the window's first instant); the others at
        ``end`` only (one point).
        """
        return (end - range_seconds + step_seconds, end) if self.per_step else (end, end)

    def expr(self, step_seconds: float, range_seconds: float, matchers: str = "") -> str:
        """The PromQL text for a step of ``step_seconds`` and a window (or sub-window) of ``range_seconds``;
        ``matchers`` (PromQL label matchers, e.g. a ``SeriesShard``'s) narrow the selector further; with a
        ``scope``, the union (``or``) of the expression for each of its matchers."""
        if self.scope:
            return " or ".join(
                self._expr(
                    _selector(self.metric, self.job, ",".join(m for m in (matchers, alt) if m)),
                    step_seconds,
                    range_seconds,
                )
                for alt in self.scope
            )
        return self._expr(_selector(self.metric, self.job, matchers), step_seconds, range_seconds)

    def _expr(self, sel: str, step_seconds: float, range_seconds: float) -> str:
        if self.kind == "step":
            return f"max_over_time({sel}{_range(step_seconds)})"
        if self.kind == "max":
            return f"max_over_time({sel}{_range(range_seconds)})"
        if self.kind in ("stddev", "avg"):
            return f"{self.kind}_over_time({sel}{_range(range_seconds)})"
        if self.kind == "timestamp":
            return f"timestamp({sel})"
        if self.kind == "count":
            return f"count_over_time({sel}{_range(range_seconds)})"
        return f"(sum_over_time({sel}{_range(range_seconds)}) * 0) != 0"


def observation_queries(job: str | None = None, scope: tuple[str, ...] = ()) -> tuple[MetricQuery, ...]:
    """Every query of an observation, in snapshot file order; their number is a constant (14).

    ``scope``: label matchers selecting one node's series (``MetricQuery.scope``), () for every series.
    """
    return tuple(MetricQuery(m, kind, job, scope) for kind, (_, metrics) in KINDS.items() for m in metrics)


def target_matchers(targets: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """PromQL label matchers selecting exactly the series of scrape ``targets`` (``usage.target_of``:
    (``job``, ``instance``)): one ``job="…",instance=~"a|b"`` per job, the instances a set of literal
    values (answered from Prometheus' index), as ``MetricQuery.scope`` alternatives."""
    by_job: dict[str, list[str]] = {}
    for job, instance in sorted(set(targets)):
        by_job.setdefault(job, []).append(_regex_literal(instance))
    return tuple(
        f"job={promql_string(job)},instance=~{promql_string('|'.join(instances))}"
        for job, instances in by_job.items()
    )


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
        return f"{self.label}=~{promql_string('|'.join(_regex_literal(n) for n in self.nodes))}"


def series_shards(label: str, nodes: Iterable[str], per_shard: int) -> tuple[SeriesShard, ...]:
    """Node names (sorted, deduplicated) cut into shards of at most ``per_shard`` (≥ 1) nodes each.

    Raises:
        ValueError: ``per_shard`` < 1.
    """
    if per_shard < 1:
        raise ValueError(f"per_shard must be ≥ 1, got {per_shard}")
    names = sorted(set(nodes))
    return tuple(SeriesShard(label, tuple(names[i : i + per_shard])) for i in range(0, len(names), per_shard))


#: dcgm-exporter's label for a GPU's index on its node (``gpu="0"``…; a MIG instance's series carry
#: their parent's): NVIDIA/dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go`` (the label) and
#: ``internal/pkg/collector/gpu_collector.go`` ``toMetric`` (``GPU`` = the device's index, MIG profile and
#: instance id added beside it) @ d5e5f510.
GPU_INDEX_LABEL = "gpu"
#: Most device shards of one collection: one per GPU index 0-15 (AWS GPU instances have at most 16).
MAX_DEVICE_SHARDS = 16


@dataclass(frozen=True, slots=True)
class DeviceShard:
    """A series shard by GPU, for fleets without a node-name label: the series whose GPU index (label
    ``gpu``) is one of ``indices``; the ``rest`` shard also holds every series no other shard of its
    collection holds (an index ≥ 16 or of another form, no ``gpu`` label at all).

    Every DCGM series carries its GPU's index (a MIG instance its parent's), so all series of one
    device — every family, pod-label variant and exporter restart — fall in the same shard, and the
    shards of ``device_shards`` partition the series exactly: their answers merge by plain union.
    A failed shard leaves only its devices without data (``holds``).

    The matchers are sets of literal values (``gpu=~"0|8"``, the rest ``gpu!~"0|8|1|9…"``), which
    Prometheus answers from the index's postings of those few values: no regex runs over every value
    of a label (``findSetMatches`` / ``postingsForMatcher`` in ``tsdb/querier.go``, prometheus v2.42.0
    @ 225c6112). Shards by the GPU ``UUID``'s last hex digit (``UUID=~"(?s:.*)[08]"``, before) ran one
    regex over every UUID of the TSDB per shard and query (``optimizeConcatRegex`` in
    ``model/labels/regexp.go`` spares only literal suffixes, and still runs the regex on every match):
    8.0 against 4.9 Prometheus CPU-s at 2,000 nodes, 26.4–33.5 against 24.2–25.6 at 10,000
    (``benchmarks/collect_scale.py --methods devices,uuids --repeat 2 --interleave``).
    """

    indices: tuple[str, ...]
    rest: bool = False
    others: tuple[str, ...] = ()  # indices of the collection's other shards (``rest`` only)

    @property
    def label(self) -> str:
        """The label that decides the shard (``GPU_INDEX_LABEL``)."""
        return GPU_INDEX_LABEL

    def matcher(self) -> str:
        """``gpu=~"<i>|<j>…"``, or for ``rest`` ``gpu!~"<others>"`` (all series if none)."""
        if self.rest:
            return f'{GPU_INDEX_LABEL}!~"{"|".join(self.others)}"' if self.others else ""
        return f'{GPU_INDEX_LABEL}=~"{"|".join(self.indices)}"'

    def holds(self, index: str) -> bool:
        """True when a series whose ``gpu`` label is ``index`` ("" when absent) is in this shard: the
        ``matcher`` read in Python (Prometheus anchors regexes at both ends)."""
        if self.rest:
            return index not in self.others
        return index in self.indices


def device_shards(count: int) -> tuple[DeviceShard, ...]:
    """At least ``count`` (rounded up to a power of two, at most ``MAX_DEVICE_SHARDS``) device shards
    partitioning every series: shard i holds the GPU indices j (0-15) with j mod n = i, so on nodes of
    up to n GPUs each shard holds at most one GPU per node; the last shard also holds every other
    series. 1 or fewer: no shards.
    """
    n = 1
    while n < min(count, MAX_DEVICE_SHARDS):
        n *= 2
    if n < 2:
        return ()
    groups = [tuple(str(j) for j in range(i, MAX_DEVICE_SHARDS, n)) for i in range(n)]
    others = tuple(j for g in groups[:-1] for j in g)
    return (*(DeviceShard(g) for g in groups[:-1]), DeviceShard(groups[-1], rest=True, others=others))


Shard = SeriesShard | DeviceShard
"""A series shard of either kind."""


def file_kind(stem: str) -> tuple[str, str]:
    """(kind, metric) of a metrics file stem: ``DCGM_FI_DEV_GPU_UTIL.timestamp`` → (timestamp, …);
    a stem without a known suffix is ``step`` (per-step or window maxima, and every format-1 matrix)."""
    for suffix, kind in SUFFIX_KINDS.items():
        if suffix and stem.endswith(suffix):
            return kind, stem.removesuffix(suffix)
    return "step", stem
