"""DCGM series of a snapshot served as a Prometheus range-query API (``MetricsRangeReader``) for the demo.

Test and demo support only (docs/architecture.md §7): :class:`SnapshotMetrics` answers the range queries of
:func:`rightsizer.services.snapshot.observe` from a snapshot's ``metrics/*.json``, shifted to now, extended
past the snapshot as time goes on, stopped for nodes that left and cloned for nodes that joined
(:mod:`rightsizer.testing.node_lifecycle`). Split out of :mod:`rightsizer.testing.demo_env` unchanged.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from rightsizer.domain.usage import ENERGY, GPU_UTIL

__all__ = ["LOOKBACK_MS", "SnapshotMetrics", "seeded_uuid4"]

JSON = dict[str, Any]

#: Prometheus' default lookback: an instant evaluation sees the newest sample at most this old (ms).
LOOKBACK_MS: Final = 300_000
#: Counters keep increasing when a series is extended past the snapshot or cloned for a new node.
_COUNTERS: Final = frozenset({ENERGY})


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _format_value(value: float) -> str:
    """A sample value as Prometheus writes it (Go ``FormatFloat(v, 'f', -1, 64)``: no exponent)."""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return str(int(value))
    text = repr(value)
    if "e" in text or "E" in text:
        text = f"{value:.17f}".rstrip("0").rstrip(".")
    return text


def _json_time(ms: int) -> int | float:
    """A query_range timestamp: seconds, fractional only when needed (as Prometheus marshals it)."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


@dataclass(frozen=True)
class _Series:
    """One stored series and how it continues in time.

    Point ``j`` is at ``origin_ms + j * step_ms`` and carries the base sequence's value ``j + index_offset``
    plus ``value_offset``. The base sequence is the snapshot's points; past its end a series whose last
    point is at the snapshot's end repeats its window (counters keep climbing by the window's increase),
    so the demo can run for as long as it likes. ``lag_ms`` is how much the raw scrape behind each point
    is older than the point (the ``timestamp()`` answer); ``stops_ms`` is when the target went away.
    """

    metric: str
    labels: Mapping[str, str]
    values: tuple[float, ...]
    texts: tuple[str, ...]
    origin_ms: int
    step_ms: int
    extendable: bool
    lag_ms: int
    index_offset: int = 0
    value_offset: float = 0.0
    stops_ms: float = math.inf

    @property
    def node(self) -> str:
        """The Kubernetes node the series belongs to (its ``node`` label)."""
        return self.labels.get("node", "")

    def base_value(self, index: int) -> float:
        """Value ``index`` of the base sequence, extended by repeating the window."""
        n = len(self.values)
        if index < n:
            return self.values[index]
        cycles, position = divmod(index, n - 1)
        climb = cycles * (self.values[-1] - self.values[0]) if self.metric in _COUNTERS else 0.0
        return self.values[position] + climb

    def point_at(self, eval_ms: int) -> tuple[int, int] | None:
        """(point index, point time) of the newest point an evaluation at ``eval_ms`` sees, if any."""
        if eval_ms > self.stops_ms or eval_ms < self.origin_ms:
            return None  # gone (stale marker) or not born yet
        index = (eval_ms - self.origin_ms) // self.step_ms
        if not self.extendable:
            index = min(index, len(self.values) - 1 - self.index_offset)
        at = self.origin_ms + index * self.step_ms
        if index < 0 or eval_ms - at >= LOOKBACK_MS:
            return None
        return index, at

    def samples_in(self, lo_ms: int, hi_ms: int) -> list[int]:
        """Indices of the raw samples (point time − ``lag_ms``) in (lo_ms, hi_ms], oldest first."""
        first = max(0, (lo_ms + self.lag_ms - self.origin_ms) // self.step_ms + 1)
        last = (hi_ms + self.lag_ms - self.origin_ms) // self.step_ms
        if not self.extendable:
            last = min(last, len(self.values) - 1 - self.index_offset)
        if self.stops_ms != math.inf:
            last = min(last, int((self.stops_ms + self.lag_ms - self.origin_ms) // self.step_ms))
        return list(range(first, last + 1))

    def value(self, index: int) -> float:
        """Point ``index``'s value."""
        return self.base_value(index + self.index_offset) + self.value_offset

    def text(self, index: int) -> str:
        """Point ``index``'s value as a string (the snapshot's own text where it is unchanged)."""
        base = index + self.index_offset
        if base < len(self.texts) and self.value_offset == 0:
            return self.texts[base]
        return _format_value(self.base_value(base) + self.value_offset)


_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|=|!=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_TIMESTAMP = re.compile(r"^\s*timestamp\s*\((.*)\)\s*$")
_MAX_OVER_TIME = re.compile(r"^\s*max_over_time\s*\((.*)\[(\d+(?:ms|s))\]\s*\)\s*$")
_STDDEV_OVER_TIME = re.compile(r"^\s*stddev_over_time\s*\((.*)\[(\d+(?:ms|s))\]\s*\)\s*$")
_AVG_OVER_TIME = re.compile(r"^\s*avg_over_time\s*\((.*)\[(\d+(?:ms|s))\]\s*\)\s*$")
_COUNT_OVER_TIME = re.compile(r"^\s*count_over_time\s*\((.*)\[(\d+(?:ms|s))\]\s*\)\s*$")
_NONFINITE = re.compile(r"^\s*\(\s*sum_over_time\s*\((.*)\[(\d+(?:ms|s))\]\s*\)\s*\*\s*0\s*\)\s*!=\s*0\s*$")


@dataclass(frozen=True)
class _Query:
    """A parsed expression: ``kind`` (``plain``, ``timestamp``, ``max``, ``stddev``, ``avg``, ``nonfinite``), the
    metric, the label matchers and the range in ms of the ``*_over_time`` function."""

    kind: str
    name: str
    matchers: list[tuple[str, str, str]]
    range_ms: int = 0

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether every matcher (``=``, ``!=``, ``=~``, ``!~``; regexes anchored, as PromQL's) holds."""
        for key, op, value in self.matchers:
            have = labels.get(key, "")
            hit = re.fullmatch(value, have) is not None if op in ("=~", "!~") else have == value
            if hit != (op in ("=", "=~")):
                return False
        return True


def _range_ms(duration: str) -> int:
    """A range selector's duration as ``domain.observation.prometheus_duration`` writes it (``1800s`` or
    ``1799999ms``), in ms. Samples are then read in (t − range, t]: the replayed points are step
    aggregates already, and a closed range would fold the previous step's point into each step."""
    return int(duration[:-2]) if duration.endswith("ms") else int(duration[:-1]) * 1000


def _parse_query(expr: str) -> _Query:
    """The supported expression ``expr`` is (``domain.usage.MetricQuery`` and format-1 snapshots).

    Raises:
        ValueError: anything but ``name``, ``name{l="v", l!="v"}``, ``timestamp(<sel>)``,
            ``max_over_time``/``stddev_over_time``/``avg_over_time(<sel>[<n>ms|<n>s])`` or
            ``(sum_over_time(<sel>[<n>ms|<n>s]) * 0) != 0``.
    """
    kind, inner, range_ms = "plain", expr, 0
    patterns = (
        (_TIMESTAMP, "timestamp"),
        (_MAX_OVER_TIME, "max"),
        (_STDDEV_OVER_TIME, "stddev"),
        (_AVG_OVER_TIME, "avg"),
        (_COUNT_OVER_TIME, "count"),
        (_NONFINITE, "nonfinite"),
    )
    for pattern, name in patterns:
        found = pattern.match(expr)
        if found is not None:
            kind, inner = name, found.group(1)
            range_ms = _range_ms(found.group(2)) if found.lastindex and found.lastindex > 1 else 0
            break
    selector = _SELECTOR.match(inner)
    if selector is None:
        raise ValueError(f"unsupported expression {expr!r}: SnapshotMetrics answers plain selectors")
    matchers: list[tuple[str, str, str]] = []
    body = (selector.group(2) or "").strip()
    pos = 0
    while pos < len(body):
        found = _MATCHER.match(body, pos)
        if found is None:
            raise ValueError(f"unsupported label matcher in {expr!r}: only =, !=, =~ and !~ are answered")
        value = re.sub(r"\\(.)", r"\1", found.group(3))
        matchers.append((found.group(1), found.group(2), value))
        pos = found.end()
    return _Query(kind, selector.group(1), matchers, range_ms)


class SnapshotMetrics:
    """A ``MetricsRangeReader`` over a snapshot directory's ``metrics/*.json``, moved to the present.

    Answers what :func:`rightsizer.services.snapshot.observe` asks (``metric_queries``, format 2):
    ``max_over_time``, ``stddev_over_time``, ``avg_over_time``, ``count_over_time`` (``(<sel>[<n>ms])``),
    ``(sum_over_time(<sel>[<n>ms]) * 0) != 0``, ``timestamp(<sel>)``, and plain selectors, each optionally with ``=``, ``!=``, ``=~`` and ``!~`` label
    matchers (``job``, and one node's labels for the drain's per-node read), and unions ``<a> or <b>``. Each snapshot point is one raw sample, scraped ``lag`` before its point (from the
    ``timestamp`` files). Evaluation follows Prometheus: a selector shows the newest point at most 5
    minutes old, range functions see the raw samples in (t − n, t], nothing after a target went away
    (stale markers), ``__name__`` dropped by functions. Anything else answers ``status: error``
    (``bad_data``), as Prometheus would.

    Every sample is shifted by ``shift_seconds`` = ⌊(now − taken_at) / step⌋ × step, so the snapshot's
    last point lands in the last step before "now" and stays on the snapshot's step grid. Series that
    reach the snapshot's end continue by repeating their window; :meth:`clone_node` gives a node that
    appeared later the series of an existing one (relabelled) from its creation on; :meth:`stop_node`
    ends a removed node's series. Thread-safe.
    """

    def __init__(self, directory: str | Path, *, now: float | None = None) -> None:
        """Load ``directory``'s ``snapshot.json`` and ``metrics/*.json`` and shift them to ``now``.

        Args:
            directory: a snapshot directory (docs/architecture.md §5) with the metrics files.
            now: the demo's "now" in epoch seconds (default: the system clock).
        """
        root = Path(directory)
        meta = _load(root / "snapshot.json")
        taken = datetime.fromisoformat(str(meta["taken_at"]).replace("Z", "+00:00"))
        self.step_seconds = int(meta["step_seconds"])
        self.window_seconds = int(meta["window_seconds"])
        current = time.time() if now is None else now
        step_ms = self.step_seconds * 1000
        snapshot_end_ms = int(taken.timestamp() * 1000)
        # Whole steps, rounded down: the grid stays the snapshot's and no sample lies in the future.
        shift_ms = (int(current * 1000) - snapshot_end_ms) // step_ms * step_ms
        #: Seconds every snapshot time was moved by (apply the same to Kubernetes objects).
        self.shift_seconds = shift_ms / 1000
        #: The snapshot's ``taken_at`` after the shift: the newest sample of every live series.
        self.taken_at = taken + timedelta(milliseconds=shift_ms)
        self._lock = threading.Lock()
        self._rng = random.Random(int(self.taken_at.timestamp()))
        lags = self._lags(root / "metrics")
        self._series: list[_Series] = []
        for path in sorted((root / "metrics").glob("*.json")):
            if path.name.count(".") > 1:  # format-2 files (.timestamp, .stddev, …): not series of their own
                continue
            doc = _load(path)
            for item in doc.get("data", {}).get("result", []):
                points = item.get("values") or []
                if not points:
                    continue
                times = [round(float(t) * 1000) + shift_ms for t, _ in points]
                labels = dict(item.get("metric") or {})
                self._series.append(
                    _Series(
                        metric=str(labels.get("__name__", path.stem)),
                        labels=labels,
                        values=tuple(float(v) for _, v in points),
                        texts=tuple(str(v) for _, v in points),
                        origin_ms=times[0],
                        step_ms=step_ms,
                        # Only series alive at the snapshot's end continue; an exporter that was down
                        # then stays down.
                        extendable=len(times) > 1 and times[-1] == snapshot_end_ms + shift_ms,
                        lag_ms=lags.get(labels.get("instance", ""), 0),
                    )
                )

    @staticmethod
    def _lags(directory: Path) -> dict[str, int]:
        """Scrape lag per exporter target, from ``<metric>.timestamp.json`` (point time − raw time)."""
        lags: dict[str, int] = {}
        for path in sorted(directory.glob("*.timestamp.json")):
            for item in _load(path).get("data", {}).get("result", []):
                instance = (item.get("metric") or {}).get("instance")
                points = item.get("values") or []
                if instance and points:
                    at, raw = points[0]
                    lags.setdefault(instance, round(float(at) * 1000) - round(float(raw) * 1000))
        return lags

    # ---------------------------------------------------------------------------------------- queries

    def query_range_raw(self, expr: str, start: float, end: float, step: float) -> JSON:
        """Evaluate ``expr`` at ``start``, ``start + step``, … ``end`` (epoch seconds) like Prometheus.

        Returns:
            The ``/api/v1/query_range`` document: ``{"status": "success", "data": {"resultType":
            "matrix", "result": [{"metric", "values": [[t, "v"], ...]}]}}``, series ordered by labels;
            ``{"status": "error", "errorType": "bad_data", "error"}`` for an expression it does not answer.
        """
        if " or " in expr:
            # ``a or b``: every series of a, then those of b whose label set a did not answer (PromQL).
            merged: dict[tuple[tuple[str, str], ...], JSON] = {}
            for part in expr.split(" or "):
                answer = self.query_range_raw(part, start, end, step)
                if answer.get("status") != "success":
                    return answer
                for item in answer["data"]["result"]:
                    merged.setdefault(tuple(sorted(item["metric"].items())), item)
            union = [merged[key] for key in sorted(merged)]
            return {"status": "success", "data": {"resultType": "matrix", "result": union}}
        try:
            query = _parse_query(expr)
        except ValueError as exc:
            return {"status": "error", "errorType": "bad_data", "error": str(exc)}
        if step <= 0 or end < start:
            return {"status": "error", "errorType": "bad_data", "error": "invalid range or step"}
        start_ms, end_ms, step_ms = round(start * 1000), round(end * 1000), round(step * 1000)
        evals = range(start_ms, end_ms + 1, step_ms)
        with self._lock:
            chosen = [s for s in self._series if s.metric == query.name and query.selects(s.labels)]
        result: list[JSON] = []
        for series in chosen:
            values = [
                [_json_time(at), text] for at in evals if (text := _evaluate(series, query, at)) is not None
            ]
            if values:
                labels = dict(series.labels)
                if query.kind != "plain":
                    labels.pop("__name__", None)
                result.append({"metric": labels, "values": values})
        result.sort(key=lambda item: sorted(item["metric"].items()))
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}

    # ------------------------------------------------------------------------------- node lifecycle

    def nodes(self) -> set[str]:
        """Nodes with at least one series that has not been stopped."""
        with self._lock:
            return {s.node for s in self._series if s.stops_ms == math.inf and s.node}

    def series_of(self, node: str, metric: str = GPU_UTIL) -> list[Mapping[str, str]]:
        """Label sets of ``node``'s series of ``metric`` that have not been stopped."""
        with self._lock:
            return [
                dict(s.labels)
                for s in self._series
                if s.node == node and s.metric == metric and s.stops_ms == math.inf
            ]

    def is_clean_template(self, node: str) -> bool:
        """Whether ``node`` has live, growing energy counters (a sane model for a new node's series)."""
        with self._lock:
            energy = [s for s in self._series if s.node == node and s.metric == ENERGY and s.extendable]
        return bool(energy) and all(s.values[-1] > s.values[0] for s in energy)

    def stop_node(self, node: str, at: float) -> int:
        """End every series of ``node`` at ``at`` (epoch s), as Prometheus' stale markers do when its target
        disappears; returns how many series were stopped."""
        stopped = 0
        with self._lock:
            for i, series in enumerate(self._series):
                if series.node == node and series.stops_ms == math.inf:
                    self._series[i] = replace(series, stops_ms=at * 1000)
                    stopped += 1
        return stopped

    def clone_node(
        self,
        template: str,
        node: str,
        *,
        since: float,
        exporter_pod: str,
        exporter_ip: str,
        template_exporter_pod: str | None = None,
        pod_renames: Mapping[str, str] | None = None,
    ) -> int:
        """Give ``node`` (created at ``since``, epoch s) the series of ``template``, relabelled.

        Labels rewritten: ``node``; ``instance`` (the new exporter pod's IP, same port); ``Hostname`` and
        ``pod`` where they named the template or its exporter pod; ``UUID`` (a new GPU UUID per template
        GPU). Points start at ``since`` on the same step; energy counters start near zero, as on a freshly
        booted GPU. Only the template's live series are cloned. Returns how many series were added.
        """
        since_ms = int(since) * 1000
        with self._lock:
            sources = [s for s in self._series if s.node == template and s.extendable]
            uuids: dict[str, str] = {}
            added: list[_Series] = []
            for series in sources:
                labels = dict(series.labels)
                labels["node"] = node
                if "instance" in labels:
                    port = labels["instance"].rpartition(":")[2] or "9400"
                    labels["instance"] = f"{exporter_ip}:{port}"
                if labels.get("Hostname") == template:
                    labels["Hostname"] = node
                elif template_exporter_pod and labels.get("Hostname") == template_exporter_pod:
                    labels["Hostname"] = exporter_pod
                if template_exporter_pod and labels.get("pod") == template_exporter_pod:
                    labels["pod"] = exporter_pod
                elif labels.get("pod") in (pod_renames or {}):
                    labels["pod"] = (pod_renames or {})[labels["pod"]]  # a workload pod cloned with the node
                if "UUID" in labels:
                    old = labels["UUID"]
                    if old not in uuids:
                        uuids[old] = f"GPU-{seeded_uuid4(self._rng)}"
                    labels["UUID"] = uuids[old]
                # Continue the template's pattern from where the template is now.
                offset = max(0, (since_ms - series.origin_ms) // series.step_ms)
                value_offset = 0.0
                if series.metric in _COUNTERS:
                    first_step = series.values[1] - series.values[0]
                    value_offset = first_step - series.base_value(offset)
                added.append(
                    replace(
                        series,
                        labels=labels,
                        origin_ms=since_ms,
                        index_offset=offset,
                        value_offset=value_offset,
                        stops_ms=math.inf,
                    )
                )
            self._series.extend(added)
        return len(added)


def _evaluate(series: _Series, query: _Query, at: int) -> str | None:
    """``query``'s value for ``series`` at ``at`` (ms) as Prometheus would print it, or None (no point).

    Raw samples sit ``lag_ms`` before their grid point; ``max_over_time`` keeps NaN only when every
    sample is NaN (Prometheus 2.x), ``sum_over_time(…) * 0 != 0`` keeps only non-finite sums.
    """
    if query.kind in ("plain", "timestamp"):
        found = series.point_at(at)
        if found is None:
            return None
        index, point_ms = found
        return (
            _format_value((point_ms - series.lag_ms) / 1000)
            if query.kind == "timestamp"
            else series.text(index)
        )
    samples = [series.value(i) for i in series.samples_in(at - query.range_ms, at)]
    if not samples:
        return None
    if query.kind == "max":
        top = samples[0]
        for v in samples:
            if v > top or math.isnan(top):
                top = v
        return _format_value(top)
    if query.kind == "avg":
        return _format_value(sum(samples) / len(samples))
    if query.kind == "count":
        return _format_value(float(len(samples)))
    if query.kind == "stddev":
        mean = sum(samples) / len(samples)
        return _format_value(math.sqrt(sum((v - mean) ** 2 for v in samples) / len(samples)))
    total = math.fsum(samples) if all(math.isfinite(v) for v in samples) else sum(samples)
    return None if math.isfinite(total) else "NaN"


def seeded_uuid4(rng: random.Random) -> str:
    """A version-4 UUID drawn from ``rng`` (seeded: the same demo gets the same ids)."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
