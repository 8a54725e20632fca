"""Use case: observe a cluster through the ports and record what was seen (docs/architecture.md §5 snapshot directory).

:func:`observe` reads everything a decision needs — Kubernetes objects, the AWS inventory and the DCGM
range queries — into an :class:`Observation`: the snapshot directory's documents, in memory, decoded
straight into a ``ClusterSnapshot`` by the live plan (``rightsizer plan --config``, the assessment), its
lists projected page by page to what the plan reads (``project=True``). :func:`record` reads the same
things for ``rightsizer snapshot`` and hands them to a ``SnapshotSink`` as they arrive (the directory
writer projects each object onto the fields the decision reads — no field a decision does not read leaves
the cluster — and writes it at once), so neither path holds a raw list and ``plan --snapshot`` reproduces
the live plan exactly (docs/architecture.md §5, §8).

Fail closed: a denied preflight or any failed Kubernetes list raises, and no observation (hence no plan
and no directory) exists. A metric whose answer is unusable is recorded as it came; the decision then
marks the nodes depending on it ``unknown`` (docs/architecture.md §5).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.dra_fields import claim_fields, slice_fields
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.gpu import is_gpu_node
from rightsizer.domain.health import XID_DOCUMENT, xid_queries
from rightsizer.domain.model import (
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodAddress,
    PodDisruptionBudget,
)
from rightsizer.domain.observation import METRICS_FORMAT, MetricQuery, observation_queries, target_matchers
from rightsizer.domain.usage import ACTIVITY_METRICS, DEVICE_METRICS, UP, target_of
from rightsizer.ports import (
    JSON,
    AccessCheck,
    ClusterReader,
    ListKind,
    MetricsRangeReader,
    NodeGroupInventory,
    SnapshotSink,
    WorkloadWriter,
)
from rightsizer.services.workload_reads import WORKLOAD_READ_CHECKS, holder_namespaces, workload_objects

__all__ = [
    "DRA_READ_CHECKS",
    "METRICS",
    "READ_CHECKS",
    "TIMESTAMPED_METRICS",
    "Observation",
    "ObserveRequest",
    "instance_ids",
    "kubectl_list",
    "metric_documents",
    "metric_queries",
    "observe",
    "record",
    "rfc3339",
    "snapshot_meta",
]

#: Every metric with a ``metrics/<METRIC_NAME>.json`` file (docs/architecture.md §5); format 2 adds files with suffixes
#: (``rightsizer.domain.observation``).
METRICS: Final = (*DEVICE_METRICS, UP)
#: Activity metrics whose newest raw sample time is recorded too (``<metric>.timestamp.json``, sample age).
TIMESTAMPED_METRICS: Final = ACTIVITY_METRICS
#: The verbs the reads use — lists only (infra/k8s/rbac.yaml grants nothing more; tests/integration/test_iam.py).
READ_CHECKS: Final = (
    AccessCheck("list", "nodes"),
    AccessCheck("list", "pods"),
    AccessCheck("list", "poddisruptionbudgets", group="policy"),
    AccessCheck("list", "persistentvolumeclaims"),
    AccessCheck("list", "persistentvolumes"),
)
DRA_READ_CHECKS: Final = tuple(
    AccessCheck("list", resource, group="resource.k8s.io")
    for resource in ("resourceclaims", "resourceslices")
)


@dataclass(frozen=True)
class ObserveRequest:
    """What to observe and how.

    Attributes:
        at: the snapshot instant (aware); metrics cover (at − window_seconds, at].
        window_seconds: the idle window W in seconds (policy ``idle_window``).
        step_seconds: query_range step in seconds (config ``prometheus.step``).
        cluster: the label written to ``snapshot.json`` (EKS cluster name or kubeconfig context).
        region: AWS region written to ``snapshot.json``.
        eks_cluster: EKS cluster name for the node group inventory; None skips the inventory (every
            node is then ``node_group_unknown``: fail safe, nothing is removed).
        job: restrict every series to this Prometheus scrape job (config ``prometheus.job``).
        node_label: config ``prometheus.node_label``, recorded in ``snapshot.json`` for the join.
    """

    at: datetime
    window_seconds: int
    step_seconds: int
    cluster: str
    region: str
    eks_cluster: str | None = None
    job: str | None = None
    node_label: str | None = None


@dataclass(frozen=True)
class Observation:
    """The snapshot directory in memory: relative path → JSON document (``snapshot.json`` included)."""

    documents: Mapping[str, Any]

    @property
    def meta(self) -> JSON:
        """The ``snapshot.json`` document."""
        meta: JSON = self.documents["snapshot.json"]
        return meta


def rfc3339(value: datetime) -> str:
    """``value`` as RFC 3339 in UTC with a ``Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def metric_queries(
    job: str | None = None, *, step_seconds: int = 60, window_seconds: int = 1800
) -> dict[str, str]:
    """Relative snapshot path → PromQL, for every metrics file of a format-2 snapshot (docs/architecture.md §5).

    The queries are ``rightsizer.domain.observation.observation_queries`` (the live plan asks the same); with
    ``job`` every series selector gets ``{job="<job>"}``.
    """
    return {q.path: q.expr(step_seconds, window_seconds) for q in observation_queries(job)}


def kubectl_list(items: Iterable[Any]) -> JSON:
    """Wrap objects in the ``List`` document ``kubectl get -o json`` prints for several objects."""
    return {"apiVersion": "v1", "items": list(items), "kind": "List", "metadata": {"resourceVersion": ""}}


def instance_ids(nodes: Sequence[JSON]) -> list[str]:
    """The EC2 instance ids of the Nodes' ``spec.providerID`` (``aws:///<zone>/<id>``), sorted, once each."""
    ids: list[str] = []
    for item in nodes:
        provider = str((item.get("spec") or {}).get("providerID") or "")
        # Same parsing as the decision uses (Node.instance_id), without validating the whole node.
        stub = Node.model_validate({"metadata": {"name": "-"}, "spec": {"providerID": provider}})
        if stub.instance_id:
            ids.append(stub.instance_id)
    return sorted(set(ids))


def _lean_pod(item: JSON, gpu_nodes: frozenset[str]) -> JSON:
    """What the plan reads of a pod: all of it when it is bound to a GPU node or not bound at all (pending
    pods can want a GPU node); otherwise only what the series join reads (namespace, name, node, phase,
    pod IP). The live plan validates the result, ``rightsizer snapshot`` writes it (projected)."""
    spec, status = item.get("spec") or {}, item.get("status") or {}
    node = spec.get("nodeName")
    if not node or node in gpu_nodes:
        return item
    meta = item.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"nodeName": node},
        "status": {"phase": status.get("phase"), "podIP": status.get("podIP")},
    }


def _address_or_pod(gpu_nodes: frozenset[str]) -> Callable[[Pod], Pod | PodAddress]:
    """The live plan's pods: the compact ``Pod`` (``ClusterReader.list_models``: the fields the rules
    read, equal parts made once) when it is bound to a GPU node or not bound at all, otherwise only the
    :class:`PodAddress` the series join reads (``PodAddress.of`` interns namespace and node names, so the
    many pods of one node or namespace share one string): issue 11 item 7.

    Finished pods (``Succeeded``, ``Failed``) are listed too, though no drain or placement rule counts
    them: a DCGM series attributed to a pod that finished inside the idle window still joins its node by
    that pod's name (``domain.join``), so a ``status.phase`` field selector could change a verdict."""

    def project(pod: Pod) -> Pod | PodAddress:
        node = pod.spec.nodeName
        if not node or node in gpu_nodes:
            return pod
        return PodAddress.of(pod) or pod  # bound, so it always has an address

    return project


def _projected_documents(
    cluster: ClusterReader, on_nodes: Callable[[Sequence[Node]], None] | None = None
) -> tuple[list[Node], dict[str, Any]]:
    """The Kubernetes documents of a live plan, projected page by page (issue 11 item 7) and decoded from
    each page's bytes (issue 33 item 2): the typed objects the plan reads instead of the raw lists
    (``snapshot_dir`` accepts either). ``on_nodes`` is told the Nodes before the Pods are listed."""
    nodes = cluster.list_models(Node, _same)
    if on_nodes is not None:
        on_nodes(nodes)
    catalog = load_catalog()
    gpu_nodes = frozenset(n.name for n in nodes if is_gpu_node(n, catalog))
    pods = cluster.list_models(Pod, _address_or_pod(gpu_nodes))
    documents = {
        "nodes.json": kubectl_list(nodes),
        "pods.json": kubectl_list(pods),
        "pdbs.json": kubectl_list(
            cluster.list_projected("poddisruptionbudgets", PodDisruptionBudget.model_validate)
        ),
        "persistentvolumeclaims.json": kubectl_list(
            cluster.list_projected("persistentvolumeclaims", PersistentVolumeClaim.model_validate)
        ),
        "persistentvolumes.json": kubectl_list(
            cluster.list_projected("persistentvolumes", PersistentVolume.model_validate)
        ),
    }
    return nodes, documents


def _same(node: Node) -> Node:
    return node


def snapshot_meta(request: ObserveRequest) -> JSON:
    """The ``snapshot.json`` document of an observation made for ``request`` (docs/architecture.md §5)."""
    meta: JSON = {
        "taken_at": rfc3339(request.at),
        "window_seconds": request.window_seconds,
        "step_seconds": request.step_seconds,
        "cluster": request.cluster,
        "region": request.region,
        "metrics_format": METRICS_FORMAT,
    }
    if request.node_label:
        # Not in the contract's field list; the loader ignores unknown fields, plan --snapshot reads it.
        meta["node_label"] = request.node_label
    return meta


def metric_documents(
    metrics: MetricsRangeReader, request: ObserveRequest, scope: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The format-2 metrics files: each ``observation_queries`` answer (``scope``: one node's series,
    ``join.node_series_matchers``) over (at − W, at] at the request's step, by relative path.

    With ``scope``, the ``up`` count of a target the node's activity series name but the matchers did not
    select is asked by its name (``observation.target_matchers``) and added to ``metrics/up.count.json``,
    as ``collect_live`` does; a failed answer there replaces that file, and a failed scoped count is kept
    (either way the count is then a problem)."""
    documents: dict[str, Any] = {}
    end = float(int(request.at.timestamp()))

    def ask(query: MetricQuery) -> Any:
        start, stop = query.span(end, request.window_seconds, request.step_seconds)
        expr = query.expr(request.step_seconds, request.window_seconds)
        answer = metrics.query_range_raw(expr, start, stop, float(request.step_seconds))
        return json.loads(answer) if isinstance(answer, bytes | bytearray) else answer

    for query in observation_queries(request.job, scope):
        documents[query.path] = ask(query)
    counted = MetricQuery(UP, "count").path
    have = _series(documents[counted])
    # a failed scoped count stays failed (collect_live keeps it a problem): nothing by name stands in for it
    if scope and have is not None and (targets := _uncounted_targets(documents, counted)):
        extra = ask(MetricQuery(UP, "count", request.job, target_matchers(targets)))
        found = _series(extra)
        documents[counted] = extra if found is None else _with_series(extra, have + found)
    return documents


def _series(answer: Any) -> list[Any] | None:
    """The series of a successful matrix answer, None for anything else."""
    data = answer.get("data") if isinstance(answer, dict) and answer.get("status") == "success" else None
    result = data.get("result") if isinstance(data, dict) else None
    return result if isinstance(result, list) else None


def _with_series(answer: dict[str, Any], series: list[Any]) -> dict[str, Any]:
    return {**answer, "data": {**answer["data"], "result": series}}


def _uncounted_targets(documents: Mapping[str, Any], counted: str) -> set[tuple[str, str]]:
    """Targets (``usage.target_of``) of the activity series in ``documents`` whose ``up`` has no count in
    ``documents[counted]``."""
    named = {
        target
        for q in observation_queries()
        if q.per_step and q.metric != UP
        for s in _series(documents.get(q.path)) or ()
        if isinstance(s, dict) and (target := target_of(s.get("metric") or {})) is not None
    }
    have = {
        target_of(s.get("metric") or {}) for s in _series(documents.get(counted)) or () if isinstance(s, dict)
    }
    return named - have


def xid_document(metrics: MetricsRangeReader, request: ObserveRequest, scope: tuple[str, ...] = ()) -> JSON:
    """The ``xid.json`` document (issue 28): ``{"count": …, "last": …}``, the answers of
    ``domain.health.xid_queries`` over (at − W, at] (dcgm-exporter ``DCGM_EXP_XID_ERRORS_COUNT`` per step,
    ``DCGM_FI_DEV_XID_ERRORS`` window maximum); ``scope`` as in :func:`metric_documents`."""
    end = float(int(request.at.timestamp()))
    document: JSON = {}
    for key, query in xid_queries(request.job, scope).items():
        start, stop = query.span(end, request.window_seconds, request.step_seconds)
        expr = query.expr(request.step_seconds, request.window_seconds)
        answer = metrics.query_range_raw(expr, start, stop, float(request.step_seconds))
        document[key] = json.loads(answer) if isinstance(answer, bytes | bytearray) else answer
    return document


def observe(
    cluster: ClusterReader,
    inventory: NodeGroupInventory | None,
    metrics: MetricsRangeReader | None,
    request: ObserveRequest,
    *,
    project: bool = False,
    on_nodes: Callable[[Sequence[Node]], None] | None = None,
) -> Observation:
    """Read the cluster, its node groups and its DCGM metrics into an :class:`Observation`.

    Order: discovery (is ``resource.k8s.io`` served?), one ``SelfSubjectAccessReview`` per read
    permission, then the Kubernetes lists (⌈N/page⌉ calls each), the AWS inventory for the nodes'
    instances, and the 14 ``observation_queries`` (metrics format 2: every raw sample of (at − W, at]
    counted, ``rightsizer.domain.observation``) at the configured step. With ``project``, ``on_nodes`` is
    told the typed Nodes as soon as they are listed (the live plan starts its Prometheus queries then).

    Returns:
        Documents ``snapshot.json``, ``nodes.json``, ``pods.json``, ``pdbs.json``,
        ``persistentvolumeclaims.json``, ``persistentvolumes.json`` (kubectl ``List``),
        ``resourceclaims.json`` / ``resourceslices.json`` only when DRA is served, ``nodegroups.json`` and
        ``instances.json`` when ``inventory`` and ``request.eks_cluster`` are given, and the metrics files
        when ``metrics`` is given (the live plan passes None: it aggregates in the server instead).

    Raises:
        PermanentError: a read permission is denied (names the identity, the verbs and the remedy), or
            any adapter's permanent failure (401 twice, 403).
        TransientError: any list, AWS call or query failed for a reason worth retrying.
    """
    if request.at.tzinfo is None:
        raise ValueError("observe() needs an aware datetime")
    dra = _preflight(cluster)
    documents: dict[str, Any] = {"snapshot.json": snapshot_meta(request)}
    if project:
        typed, kubernetes = _projected_documents(cluster, on_nodes)
        ids = sorted({n.instance_id for n in typed if n.instance_id})
    else:
        nodes = cluster.list_nodes()
        ids = instance_ids(nodes)
        kubernetes = {
            "nodes.json": kubectl_list(nodes),
            "pods.json": kubectl_list(cluster.list_pods()),
            "pdbs.json": kubectl_list(cluster.list_pdbs()),
            "persistentvolumeclaims.json": kubectl_list(cluster.list_persistent_volume_claims()),
            "persistentvolumes.json": kubectl_list(cluster.list_persistent_volumes()),
        }
    documents.update(kubernetes)
    documents.update(
        _workload_documents(cluster, documents["nodes.json"]["items"], documents["pods.json"]["items"])
    )
    if dra and project:
        # What parse_resource_claims reads, page by page: no raw DRA list is held either.
        documents["resourceclaims.json"] = kubectl_list(
            cluster.list_projected("resourceclaims", claim_fields)
        )
        documents["resourceslices.json"] = kubectl_list(
            cluster.list_projected("resourceslices", slice_fields)
        )
    elif dra:
        documents["resourceclaims.json"] = kubectl_list(cluster.list_resource_claims())
        documents["resourceslices.json"] = kubectl_list(cluster.list_resource_slices())
    if inventory is not None and request.eks_cluster:
        documents["nodegroups.json"] = inventory.describe(ids, request.eks_cluster)
        documents["instances.json"] = inventory.describe_instances(ids)
    if metrics is not None:
        documents.update(metric_documents(metrics, request))
        documents[XID_DOCUMENT] = xid_document(metrics, request)
    return Observation(documents)


def _workload_documents(cluster: ClusterReader, nodes: Sequence[Any], pods: Sequence[Any]) -> dict[str, Any]:
    """``workloads.json``: the owners, HPAs and ScaledObjects in the namespaces of GPU-holding pods (issue
    32, ``services.workload_reads``), of the kinds the identity may list (asked first); no document when
    no GPU node runs a GPU holder, or the reader cannot read workloads."""
    if not isinstance(cluster, WorkloadWriter):
        return {}
    catalog = load_catalog()
    typed_nodes = [n if isinstance(n, Node) else Node.model_validate(n) for n in nodes]
    gpu_nodes = frozenset(n.name for n in typed_nodes if is_gpu_node(n, catalog))
    on_gpu = [
        p if isinstance(p, Pod) else Pod.model_validate(p)
        for p in pods
        if not isinstance(p, PodAddress)
        and ((p.spec.nodeName if isinstance(p, Pod) else (p.get("spec") or {}).get("nodeName")) in gpu_nodes)
    ]
    namespaces = holder_namespaces(on_gpu, gpu_nodes)
    if not namespaces:
        return {}
    denied = set(cluster.preflight(list(WORKLOAD_READ_CHECKS.values())))
    kinds = [k for k, check in WORKLOAD_READ_CHECKS.items() if check not in denied]
    return {"workloads.json": kubectl_list(workload_objects(cluster, namespaces, kinds))}


class ReadAccessDenied(PermanentError):
    """The cluster's RBAC denies a read the observation needs (the preflight's SelfSubjectAccessReviews)."""


def _preflight(cluster: ClusterReader) -> bool:
    """Whether DRA is served, after asking for every read permission the observation needs.

    Raises:
        PermanentError: a permission is denied (names the identity, the verbs and the remedy); nothing
            was listed.
    """
    dra = cluster.served_resource_api() is not None
    checks = READ_CHECKS + (DRA_READ_CHECKS if dra else ())
    denied = cluster.preflight(checks)
    if denied:
        raise ReadAccessDenied(
            f"{cluster.identity()} may not "
            + ", ".join(c.describe() for c in denied)
            + ": nothing was read and nothing is decided. Remedy: bind the ClusterRole rightsizer-read "
            "(infra/k8s/rbac.yaml) to the identity's group (EKS access entry group rightsizer-read)."
        )
    return dra


def _stream(
    cluster: ClusterReader,
    kind: ListKind,
    path: str,
    sink: SnapshotSink,
    transform: Callable[[JSON], JSON] | None = None,
) -> None:
    """List ``kind`` page by page into the sink's list ``path`` (started over if the list restarts)."""

    def write(item: JSON) -> None:
        sink.add(path, transform(item) if transform is not None else item)

    sink.begin(path)
    cluster.list_projected(kind, write, restart=lambda: sink.begin(path))


def record(
    cluster: ClusterReader,
    inventory: NodeGroupInventory | None,
    metrics: MetricsRangeReader | None,
    request: ObserveRequest,
    sink: SnapshotSink,
) -> None:
    """Observe the cluster as :func:`observe` does and write it to ``sink`` while reading
    (``rightsizer snapshot``; docs/architecture.md §5, §8).

    Nothing grows with the cluster but two sets of names: each list page is handed to the sink object by
    object (it projects and writes them) and released before the next page; each metrics answer is
    handed over as received, before the next is asked. Order matters to the projection: nodes first (the GPU nodes decide
    which pods are kept whole — the pods of other nodes keep only what the series join reads, as in the
    live plan), then PodDisruptionBudgets (their selectors name the pod labels kept), volumes, pods, DRA
    objects, the AWS inventory of the nodes' instances, the metrics files, and ``snapshot.json``.

    Raises:
        PermanentError: a read permission is denied, or any adapter's permanent failure.
        TransientError: any list, AWS call or query failed for a reason worth retrying.
        The sink is left as it is; the caller discards it (``SnapshotDirectoryWriter`` as a context
        manager removes everything).
    """
    if request.at.tzinfo is None:
        raise ValueError("record() needs an aware datetime")
    dra = _preflight(cluster)
    catalog = load_catalog()
    gpu_nodes: set[str] = set()
    ids: set[str] = set()

    def node(item: JSON) -> JSON:
        typed = Node.model_validate(item)
        if is_gpu_node(typed, catalog):
            gpu_nodes.add(typed.name)
        if typed.instance_id:
            ids.add(typed.instance_id)
        return item

    def restart_nodes() -> None:
        gpu_nodes.clear()
        ids.clear()
        sink.begin("nodes.json")

    sink.begin("nodes.json")
    cluster.list_projected("nodes", lambda item: sink.add("nodes.json", node(item)), restart=restart_nodes)
    _stream(cluster, "poddisruptionbudgets", "pdbs.json", sink)
    _stream(cluster, "persistentvolumeclaims", "persistentvolumeclaims.json", sink)
    _stream(cluster, "persistentvolumes", "persistentvolumes.json", sink)
    frozen = frozenset(gpu_nodes)
    holders: set[str] = set()

    def pod(item: JSON) -> JSON:
        lean = _lean_pod(item, frozen)
        if lean is item and (item.get("spec") or {}).get("nodeName") in frozen:
            holders.update(holder_namespaces([Pod.model_validate(item)], frozen))
        return lean

    _stream(cluster, "pods", "pods.json", sink, pod)
    if holders and isinstance(cluster, WorkloadWriter):  # as the live plan reads them (issue 32)
        denied = set(cluster.preflight(list(WORKLOAD_READ_CHECKS.values())))
        kinds = [k for k, check in WORKLOAD_READ_CHECKS.items() if check not in denied]
        sink.begin("workloads.json")
        workload_objects(cluster, sorted(holders), kinds, lambda item: sink.add("workloads.json", item))
    if dra:
        _stream(cluster, "resourceclaims", "resourceclaims.json", sink)
        _stream(cluster, "resourceslices", "resourceslices.json", sink)
    if inventory is not None and request.eks_cluster:
        sink.put("nodegroups.json", inventory.describe(sorted(ids), request.eks_cluster))
        sink.put("instances.json", inventory.describe_instances(sorted(ids)))
    if metrics is not None:
        end = float(int(request.at.timestamp()))
        for query in observation_queries(request.job):
            start, stop = query.span(end, request.window_seconds, request.step_seconds)
            expr = query.expr(request.step_seconds, request.window_seconds)
            answer = metrics.query_range_raw(expr, start, stop, float(request.step_seconds))
            sink.put(query.path, bytes(answer) if isinstance(answer, bytes | bytearray) else answer)
        sink.put(XID_DOCUMENT, xid_document(metrics, request))
    sink.put("snapshot.json", snapshot_meta(request))
