"""Where a backtest's history comes from (``rightsizer backtest``): a utilisation trace, a directory of
snapshot directories, or a live Prometheus (DCGM series by chunked ``query_range``, node inventory from
kube-state-metrics). Each reader returns a ``rightsizer.backtest.simulate.History``; nothing here decides.
The snapshot-series reader is ``rightsizer.backtest.snapshot_series``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from rightsizer.backtest.simulate import Frame, History, Source
from rightsizer.domain.catalog import Catalog, load_catalog
from rightsizer.domain.errors import ConfigError, PermanentError, SnapshotError
from rightsizer.domain.join import NODE_NAME_LABELS
from rightsizer.domain.model import (
    SIGNAL_ACTIVITY,
    MetricData,
    Node,
    Pod,
    Series,
)
from rightsizer.domain.usage import ENERGY, FB_FREE, FB_USED, GPU_UTIL, POWER, PROF_ACTIVE, UP
from rightsizer.domain.validation import validation_problems

#: The packaged copy of the Alibaba GenAI 2026 per-pod GPU duty-cycle trace (see its LICENSE-NOTICE.md).
TRACE_NAME = "alibaba-genai-2026"
TRACE_FILE = "pod_gpu_duty_cycle_anon.csv.gz"
TRACE_COLUMNS = ("value", "timestamp_anon", "container_ip")
TRACE_NAMESPACE = "genai"


def packaged_trace() -> Path:
    """Path of the packaged trace (``rightsizer/data/traces/alibaba-genai-2026/…csv.gz``)."""
    return Path(str(resources.files("rightsizer") / "data" / "traces" / TRACE_NAME / TRACE_FILE))


def _rfc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _fake_instance_id(seed: str) -> str:
    # Own-node-group accounting needs an instance id per node; derived from the name so it is stable.
    return "i-" + hashlib.sha256(seed.encode()).hexdigest()[:17]


def _gpu_node(
    name: str, *, instance_type: str | None, gpus: int, region: str, created: float, instance_id: str
) -> Node:
    labels = {
        "kubernetes.io/hostname": name,
        "topology.kubernetes.io/region": region,
        "nvidia.com/gpu.present": "true",
    }
    if instance_type:
        labels["node.kubernetes.io/instance-type"] = instance_type
    return Node.model_validate(
        {
            "metadata": {"name": name, "creationTimestamp": _rfc(created), "labels": labels},
            "spec": {"providerID": f"aws:///{region}a/{instance_id}"},
            "status": {
                "capacity": {"nvidia.com/gpu": str(gpus)},
                "allocatable": {"nvidia.com/gpu": str(gpus)},
            },
        }
    )


# ------------------------------------------------------------------------------------------------ trace


def read_trace(
    path: str | Path,
    *,
    instance_type: str = "g5.xlarge",
    region: str = "us-east-1",
    catalog: Catalog | None = None,
) -> Source:
    """Read a per-pod GPU utilisation trace (Alibaba GenAI 2026 ``pod_gpu_duty_cycle_anon.csv(.gz)``).

    Columns ``value`` (GPU utilisation, percent), ``timestamp_anon`` (Unix seconds, shifted),
    ``container_ip`` (pod id). Each pod becomes one single-GPU node of ``instance_type``, present from its
    first to its last sample, its own node group, running one inference-server pod that requests the GPU
    (a ReplicaSet pod: it holds its GPU). Activity is ``DCGM_FI_DEV_GPU_UTIL`` of that GPU; the source
    declares the signal set ``{activity}``.

    Raises:
        ConfigError: unreadable file, missing columns, a bad number, or an instance type that is not a
            single-GPU type of the catalog.
    """
    catalog = catalog or load_catalog()
    row = catalog.get(instance_type)
    if row is None or row.gpu_count != 1:
        raise ConfigError(
            f"{instance_type!r} is not a single-GPU instance type of the catalog", field="--instance-type"
        )
    p = Path(path)
    samples: dict[str, dict[float, float]] = {}
    try:
        raw = p.read_bytes()
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read trace: {exc}", source=str(p)) from exc
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not set(TRACE_COLUMNS) <= set(reader.fieldnames):
        raise ConfigError(f"a trace needs the columns {', '.join(TRACE_COLUMNS)}", source=str(p))
    for line, rec in enumerate(reader, start=2):
        try:
            t, v = float(rec["timestamp_anon"]), float(rec["value"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"line {line}: not a number", source=str(p), field="value") from exc
        pod = rec["container_ip"]
        if not pod or pod in ("None", "NULL"):
            continue
        samples.setdefault(pod, {})[t] = v
    if not samples:
        raise ConfigError("the trace holds no samples", source=str(p))
    times = sorted({t for per in samples.values() for t in per})
    gaps = [b - a for a, b in itertools.pairwise(times)]
    resolution = max(1, round(statistics.median(gaps))) if gaps else 60
    short = _short_names(sorted(samples))
    nodes: dict[str, tuple[Node, Pod, float, float]] = {}
    series: list[Series] = []
    for pod_id, per in sorted(samples.items()):
        name = f"gpu-{short[pod_id]}"
        ts = sorted(per)
        born, gone = ts[0], ts[-1]
        node = _gpu_node(
            name,
            instance_type=instance_type,
            gpus=1,
            region=region,
            created=born,
            instance_id=_fake_instance_id(pod_id),
        )
        pod = Pod.model_validate(
            {
                "metadata": {
                    "name": f"infer-{short[pod_id]}",
                    "namespace": TRACE_NAMESPACE,
                    "labels": {"app": "infer"},
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "infer", "controller": True}
                    ],
                },
                "spec": {
                    "nodeName": name,
                    "containers": [
                        {
                            "name": "server",
                            "resources": {
                                "requests": {"nvidia.com/gpu": "1"},
                                "limits": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                },
                "status": {"phase": "Running", "startTime": _rfc(born)},
            }
        )
        nodes[name] = (node, pod, born, gone)
        labels = {"node": name, "gpu": "0", "UUID": f"GPU-{pod_id}"}
        series.append(Series(labels, tuple(ts), tuple(per[t] for t in ts)))
    start, end = times[0], times[-1]
    history = History(
        cluster=f"trace:{TRACE_NAME}" if p.name == TRACE_FILE else f"trace:{p.name}",
        region=region,
        start=start,
        end=end,
        resolution=resolution,
        frames=_lifetime_frames({k: (v[0], v[1], v[2], v[3]) for k, v in nodes.items()}, end),
        metrics={GPU_UTIL: MetricData(GPU_UTIL, tuple(series))},
        signal_set=frozenset({SIGNAL_ACTIVITY}),
    )
    hours = (end - start) / 3600
    return Source(
        kind="trace",
        description=f"{p.name}: {len(nodes)} pods as single-GPU {instance_type} nodes, "
        f"{resolution} s samples, {hours:.1f} h",
        history=history,
        inventory="trace",
        notes=(
            "activity-only: the trace carries GPU utilisation only; framebuffer, power and liveness rules "
            "are skipped (not failed)",
            "every pod is an inference server holding its GPU: the default policy protects it "
            "(idle_gpu_holder); the scale-to-zero policy sets evict_idle_gpu_holders: true",
        ),
    )


def _short_names(ids: Sequence[str]) -> dict[str, str]:
    """The shortest hex prefix (≥ 8) that keeps every pod id distinct, as node-name suffixes."""
    for n in range(8, 65):
        prefixes = {i: "".join(c for c in i.lower() if c.isalnum())[:n] for i in ids}
        if len(set(prefixes.values())) == len(ids):
            return prefixes
    return {i: hashlib.sha256(i.encode()).hexdigest() for i in ids}


def _lifetime_frames(nodes: Mapping[str, tuple[Node, Pod, float, float]], end: float) -> tuple[Frame, ...]:
    """Frames at every birth and death: a node is present in [first sample, last sample)."""
    cuts = sorted({b for _, _, b, _ in nodes.values()} | {g for _, _, _, g in nodes.values() if g < end})
    frames = []
    for at in cuts:
        alive = [(n, p) for n, p, b, g in nodes.values() if b <= at < g or (g == end and b <= at)]
        frames.append(Frame(at=at, nodes=tuple(n for n, _ in alive), pods=tuple(p for _, p in alive)))
    return tuple(frames)


def _to_metric_data(
    merged: Mapping[str, Mapping[tuple[tuple[str, str], ...], Mapping[float, float]]],
) -> dict[str, MetricData]:
    out: dict[str, MetricData] = {}
    for name, per in merged.items():
        series = []
        for labels, points in per.items():
            ts = sorted(points)
            series.append(Series(dict(labels), tuple(ts), tuple(points[t] for t in ts)))
        out[name] = MetricData(name, tuple(series))
    return out


# ------------------------------------------------------------------------------------------- prometheus


class RangeQuerier(Protocol):
    """What the Prometheus source needs: ``PrometheusClient.query_range``."""

    def query_range(
        self, expr: str, start: float | datetime, end: float | datetime, step: float
    ) -> dict[str, Any]:
        """A ``/api/v1/query_range`` answer (raises on HTTP/API errors)."""
        ...


#: DCGM fields fetched for the history (docs/architecture.md §5 metric names).
DCGM_METRICS = (GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY, UP)
#: kube-state-metrics label names (``kube_node_labels`` sanitises ``.``/``/``/``-`` to ``_``) → Node labels.
KSM_NODE_LABELS = {
    "label_node_kubernetes_io_instance_type": "node.kubernetes.io/instance-type",
    "label_beta_kubernetes_io_instance_type": "beta.kubernetes.io/instance-type",
    "label_topology_kubernetes_io_region": "topology.kubernetes.io/region",
    "label_eks_amazonaws_com_nodegroup": "eks.amazonaws.com/nodegroup",
    "label_eks_amazonaws_com_capacity_type": "eks.amazonaws.com/capacityType",
    "label_eks_amazonaws_com_capacitytype": "eks.amazonaws.com/capacityType",
    "label_karpenter_sh_nodepool": "karpenter.sh/nodepool",
    "label_karpenter_sh_capacity_type": "karpenter.sh/capacity-type",
    "label_nvidia_com_gpu_present": "nvidia.com/gpu.present",
    "label_nvidia_com_gpu_count": "nvidia.com/gpu.count",
    "label_nvidia_com_gpu_product": "nvidia.com/gpu.product",
    "label_nvidia_com_gpu_replicas": "nvidia.com/gpu.replicas",
    "label_nvidia_com_mig_strategy": "nvidia.com/mig.strategy",
    "label_nvidia_com_mig_config": "nvidia.com/mig.config",
    "label_rightsizer_io_do_not_disrupt": "rightsizer.io/do-not-disrupt",
}
GPU_RESOURCES_RE = "nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.*"


def _selector(metric: str, job: str | None, extra: str = "") -> str:
    matchers = [m for m in (extra, f'job="{job}"' if job else "") if m]
    return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


@dataclass
class _Fetched:
    """Series by label set, merged over chunks: labels → {t: v}."""

    series: dict[tuple[tuple[str, str], ...], dict[float, float]] = field(default_factory=dict)
    problem: str | None = None


#: The longest span (s) one backtest ``query_range`` request covers: Amazon Managed Service for Prometheus
#: refuses queries with a day range of 32 days or more unless they are range queries, and limits the data
#: one range query scans per 24-hour interval (AMP user guide, "Amazon Managed Service for Prometheus
#: service quotas"; robusta-dev/krr#522, BUG-50). Requests are split below 32 days whatever the server.
MAX_QUERY_SPAN_S = 31 * 86_400


def fetch_range(
    client: RangeQuerier, expr: str, start: float, end: float, step: int, *, max_points: int = 10_000
) -> _Fetched:
    """``query_range`` over [start, end] in chunks of at most ``max_points`` points per series (Prometheus
    refuses more than 11,000) and at most ``MAX_QUERY_SPAN_S`` (AMP), merged per label set. Chunks do not
    overlap, so no point is fetched twice.

    An answer that is not a ``success`` matrix, carries warnings (their text is kept: AMP's Query Samples
    Processed warning, Thanos partial results) or is refused (``PermanentError``: AMP's 413 "response
    larger than the max", 422 "aggregated data size limit") makes the whole fetch a ``problem`` naming the
    chunk (``chunk 3 of 6: …``): its metric then becomes ``partial_response`` for every node. A history
    with a hole in one chunk is never treated as complete, and nothing is filled with zeros.
    """
    out = _Fetched()
    span = min(step * (max_points - 1), max(step, MAX_QUERY_SPAN_S // step * step))
    chunks = max(1, math.ceil((end - start + step) / (span + step)))
    t = start
    index = 0
    while t <= end:
        index += 1
        chunk_end = min(end, t + span)
        try:
            answer = client.query_range(expr, t, chunk_end, step)
        except PermanentError as exc:
            out.problem = f"chunk {index} of {chunks} refused: {exc}"[:300]
            return out
        data = answer.get("data") if isinstance(answer, dict) else None
        if (
            not isinstance(answer, dict)
            or answer.get("status") != "success"
            or answer.get("warnings")
            or not isinstance(data, dict)
            or data.get("resultType") != "matrix"
        ):
            warnings = answer.get("warnings") if isinstance(answer, dict) else None
            if warnings and not isinstance(warnings, list):
                warnings = [warnings]
            said = f"warnings: {'; '.join(map(str, warnings))}" if warnings else "not_a_matrix"
            out.problem = f"chunk {index} of {chunks}: {said}"[:300]
            return out
        for item in data.get("result") or []:
            labels = tuple(
                sorted(
                    (str(k), str(v))
                    for k, v in (item.get("metric") or {}).items()
                    if k != "__name__" and v != ""
                )
            )
            points = out.series.setdefault(labels, {})
            for ts, value in item.get("values") or []:
                points[float(ts)] = float(value)
        t = chunk_end + step
    return out


def _as_metric(name: str, fetched: _Fetched) -> MetricData:
    if fetched.problem:
        return MetricData(name, problem=fetched.problem)
    return _to_metric_data({name: fetched.series})[name]


def fetch_prometheus_history(
    client: RangeQuerier,
    *,
    start: datetime,
    end: datetime,
    step: int,
    cluster: str,
    region: str,
    node_label: str | None = None,
    job: str | None = None,
    inventory_step: int = 300,
    instance_type: str | None = None,
    max_points: int = 10_000,
) -> Source:
    """A history from a live Prometheus: DCGM series (chunked ``query_range`` at ``step`` seconds) and the
    node inventory from kube-state-metrics (``kube_node_info``, ``kube_node_labels``, ``kube_pod_info``,
    ``kube_pod_container_resource_requests`` and ``kube_node_status_capacity``/``allocatable`` for GPU
    resources, at ``inventory_step`` seconds) where present; otherwise the nodes named by the DCGM series
    (node-name labels), present from their first to their last sample, with no pods — said so in the
    notes. ``instance_type`` prices nodes whose type is unknown (no kube-state-metrics label).

    Times are aligned down/up to multiples of ``step`` so the range points match the plan's step slots.

    Raises:
        ConfigError: ``end`` not after ``start``.
        PrometheusUnavailable / PrometheusQueryError: the server failed or refused a query.
    """
    t0 = math.floor(start.timestamp() / step) * step
    t1 = math.ceil(end.timestamp() / step) * step
    if t1 <= t0:
        raise ConfigError("--to must be after --from", field="--to")
    metrics: dict[str, MetricData] = {}
    for name in DCGM_METRICS:
        metrics[name] = _as_metric(
            name, fetch_range(client, _selector(name, job), t0, t1, step, max_points=max_points)
        )
    timestamps: dict[str, MetricData] = {}
    for name in (GPU_UTIL, PROF_ACTIVE):
        fetched = fetch_range(
            client, f"timestamp({_selector(name, job)})", t0, t1, step, max_points=max_points
        )
        timestamps[name] = _as_metric(name, fetched)
    inv_step = max(step, inventory_step)
    ksm = {
        "node_info": fetch_range(client, "kube_node_info", t0, t1, inv_step, max_points=max_points),
        "node_labels": fetch_range(client, "kube_node_labels", t0, t1, inv_step, max_points=max_points),
        "pod_info": fetch_range(client, "kube_pod_info", t0, t1, inv_step, max_points=max_points),
        "requests": fetch_range(
            client,
            f'kube_pod_container_resource_requests{{resource=~"{GPU_RESOURCES_RE}"}}',
            t0,
            t1,
            inv_step,
            max_points=max_points,
        ),
        "capacity": fetch_range(
            client,
            f'kube_node_status_capacity{{resource=~"{GPU_RESOURCES_RE}"}}',
            t0,
            t1,
            inv_step,
            max_points=max_points,
        ),
        "allocatable": fetch_range(
            client,
            f'kube_node_status_allocatable{{resource=~"{GPU_RESOURCES_RE}"}}',
            t0,
            t1,
            inv_step,
            max_points=max_points,
        ),
    }
    notes: list[str] = []
    if t1 - t0 > MAX_QUERY_SPAN_S:
        notes.append(
            f"each query_range request spans at most {MAX_QUERY_SPAN_S // 86_400} days (Amazon Managed "
            "Service for Prometheus refuses longer day ranges): the period was read in chunks"
        )
    for name, md in metrics.items():
        if md.problem:
            notes.append(f"{name}: unusable answer ({md.problem}); every node is unknown")
    if ksm["node_info"].series and not ksm["node_info"].problem:
        frames = _ksm_frames(ksm, t0, t1, inv_step, region, instance_type)
        inventory = "kube-state-metrics"
        if not ksm["pod_info"].series:
            notes.append("no kube_pod_info series: pods (GPU holders, protections) are not modelled")
    else:
        frames = _dcgm_frames(metrics, node_label, region, instance_type, t1)
        inventory = "dcgm-series"
        notes.append(
            "node inventory: nodes named by the DCGM series (no kube-state-metrics kube_node_info series); "
            "no pods are known, so pod protections and the request-based baseline are not modelled"
        )
    if not frames:
        raise ConfigError("no GPU nodes found in Prometheus for that period", field="--from")
    history = History(
        cluster=cluster,
        region=region,
        start=float(t0),
        end=float(t1),
        resolution=step,
        frames=frames,
        metrics=metrics,
        timestamps=timestamps,
        node_label=node_label,
    )
    return Source(
        kind="prometheus",
        description=f"Prometheus {_rfc(t0)} .. {_rfc(t1)}, step {step} s",
        history=history,
        inventory=inventory,
        notes=tuple(notes),
    )


def _at(fetched: _Fetched, t: float) -> Iterable[tuple[dict[str, str], float]]:
    for labels, points in fetched.series.items():
        if t in points:
            yield dict(labels), points[t]


def _ksm_frames(
    ksm: Mapping[str, _Fetched], t0: float, t1: float, step: int, region: str, instance_type: str | None
) -> tuple[Frame, ...]:
    """Frames from kube-state-metrics at every inventory step; consecutive equal frames are merged."""
    node_cache: dict[tuple[Any, ...], Node] = {}
    pod_cache: dict[tuple[Any, ...], Pod] = {}
    frames: list[Frame] = []
    last_key: tuple[Any, ...] | None = None
    t = t0
    while t <= t1:
        infos = {lab.get("node", ""): lab for lab, _ in _at(ksm["node_info"], t) if lab.get("node")}
        labels_by_node = {lab["node"]: lab for lab, _ in _at(ksm["node_labels"], t) if lab.get("node")}
        cap: dict[str, dict[str, str]] = {}
        alloc: dict[str, dict[str, str]] = {}
        for target, key in ((cap, "capacity"), (alloc, "allocatable")):
            for lab, v in _at(ksm[key], t):
                if lab.get("node"):
                    target.setdefault(lab["node"], {})[_resource(lab.get("resource", ""))] = str(int(v))
        nodes = []
        for name in sorted(infos):
            node_key = (
                name,
                tuple(sorted(infos[name].items())),
                tuple(sorted(labels_by_node.get(name, {}).items())),
                tuple(sorted(cap.get(name, {}).items())),
                tuple(sorted(alloc.get(name, {}).items())),
            )
            node = node_cache.get(node_key)
            if node is None:
                node = _ksm_node(
                    name,
                    infos[name],
                    labels_by_node.get(name, {}),
                    cap.get(name, {}),
                    alloc.get(name, {}),
                    region,
                    instance_type,
                )
                node_cache[node_key] = node
            nodes.append(node)
        requests: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        for lab, v in _at(ksm["requests"], t):
            pod_key = (lab.get("namespace", ""), lab.get("pod", ""))
            requests.setdefault(pod_key, {}).setdefault(lab.get("container", "main"), {})[
                _resource(lab.get("resource", ""))
            ] = str(int(v))
        pods = []
        for lab, _ in sorted(_at(ksm["pod_info"], t), key=lambda x: sorted(x[0].items())):
            pod_key = (lab.get("namespace", ""), lab.get("pod", ""))
            req = requests.get(pod_key, {})
            pod_cache_key = (
                tuple(sorted(lab.items())),
                tuple(sorted((c, tuple(sorted(r.items()))) for c, r in req.items())),
            )
            pod = pod_cache.get(pod_cache_key)
            if pod is None:
                pod = _ksm_pod(lab, req)
                pod_cache[pod_cache_key] = pod
            pods.append(pod)
        frame_key = (tuple(id(n) for n in nodes), tuple(id(p) for p in pods))
        if frame_key != last_key:
            frames.append(Frame(at=float(t), nodes=tuple(nodes), pods=tuple(pods)))
            last_key = frame_key
        t += step
    return tuple(frames)


def _resource(ksm_name: str) -> str:
    """kube-state-metrics resource names (``nvidia_com_gpu``, ``nvidia_com_mig_1g_5gb``) → Kubernetes ones."""
    if ksm_name.startswith("nvidia_com_mig_"):
        return "nvidia.com/mig-" + ksm_name.removeprefix("nvidia_com_mig_").replace("_", ".")
    if ksm_name == "nvidia_com_gpu_shared":
        return "nvidia.com/gpu.shared"
    if ksm_name == "nvidia_com_gpu":
        return "nvidia.com/gpu"
    return ksm_name


def _ksm_node(
    name: str,
    info: Mapping[str, str],
    ksm_labels: Mapping[str, str],
    capacity: Mapping[str, str],
    allocatable: Mapping[str, str],
    region: str,
    instance_type: str | None,
) -> Node:
    labels = {"kubernetes.io/hostname": name}
    for k, v in ksm_labels.items():
        if k in KSM_NODE_LABELS:
            labels[KSM_NODE_LABELS[k]] = v
    labels.setdefault("topology.kubernetes.io/region", region)
    if instance_type and not labels.get("node.kubernetes.io/instance-type"):
        labels["node.kubernetes.io/instance-type"] = instance_type
    addresses = [{"type": "InternalIP", "address": info["internal_ip"]}] if info.get("internal_ip") else []
    try:
        return Node.model_validate(
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": info.get("provider_id", "")},
                "status": {
                    "capacity": dict(capacity),
                    "allocatable": dict(allocatable or capacity),
                    "addresses": addresses,
                },
            }
        )
    except ValidationError as exc:
        problems = validation_problems(exc, source=None)
        raise SnapshotError(
            f"kube_node_info for {name}: {'; '.join(problems)}", source="prometheus", problems=problems
        ) from exc


def _ksm_pod(info: Mapping[str, str], requests: Mapping[str, Mapping[str, str]]) -> Pod:
    owner_kind = info.get("created_by_kind", "")
    owners = (
        [
            {
                "apiVersion": _owner_api(owner_kind),
                "kind": owner_kind,
                "name": info.get("created_by_name", ""),
                "controller": True,
            }
        ]
        if owner_kind and owner_kind != "<none>"
        else []
    )
    containers = [{"name": c, "resources": {"requests": dict(r)}} for c, r in sorted(requests.items())] or [
        {"name": "main"}
    ]
    node = info.get("node", "")
    return Pod.model_validate(
        {
            "metadata": {
                "name": info.get("pod", ""),
                "namespace": info.get("namespace", ""),
                "ownerReferences": owners,
            },
            "spec": {
                "nodeName": node,
                "containers": containers,
                "priorityClassName": info.get("priority_class") or None,
            },
            "status": {"phase": "Running" if node else "Pending", "podIP": info.get("pod_ip") or None},
        }
    )


def _owner_api(kind: str) -> str:
    return {
        "ReplicaSet": "apps/v1",
        "StatefulSet": "apps/v1",
        "DaemonSet": "apps/v1",
        "Job": "batch/v1",
        "Node": "v1",
    }.get(kind, "v1")


def _dcgm_frames(
    metrics: Mapping[str, MetricData],
    node_label: str | None,
    region: str,
    instance_type: str | None,
    end: float,
) -> tuple[Frame, ...]:
    """Without kube-state-metrics: one node per node-name label value on the activity series, present
    from its first to its last sample, with as many GPUs as distinct devices (``UUID`` or ``gpu``)."""
    labels_order = tuple(dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS]))
    seen: dict[str, tuple[float, float, set[str]]] = {}
    for name in (GPU_UTIL, PROF_ACTIVE):
        md = metrics.get(name)
        if md is None or md.problem:
            continue
        for s in md.series:
            node = next((s.labels[k] for k in labels_order if s.labels.get(k)), None)
            finite = [t for t, v in zip(s.times, s.values, strict=True) if math.isfinite(v)]
            if node is None or not finite:
                continue
            first, last, devices = seen.get(node, (math.inf, -math.inf, set()))
            devices.add(s.labels.get("UUID") or s.labels.get("gpu") or "0")
            seen[node] = (min(first, finite[0]), max(last, finite[-1]), devices)
    catalog = load_catalog()
    row = catalog.get(instance_type)
    members: dict[str, tuple[Node, Pod | None, float, float]] = {}
    for name, (first, last, devices) in seen.items():
        gpus = row.gpu_count if row is not None else len(devices)
        gpu_node = _gpu_node(
            name,
            instance_type=instance_type,
            gpus=gpus,
            region=region,
            created=first,
            instance_id=_fake_instance_id(name),
        )
        members[name] = (gpu_node, None, first, last if last < end else end)
    cuts = sorted({b for _, _, b, _ in members.values()} | {g for _, _, _, g in members.values() if g < end})
    frames = []
    for at in cuts:
        alive = [n for n, _, b, g in members.values() if b <= at < g or (g == end and b <= at)]
        frames.append(Frame(at=at, nodes=tuple(alive)))
    return tuple(frames)
