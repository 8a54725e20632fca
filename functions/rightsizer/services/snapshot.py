"""Use case: observe a cluster through the ports and record what was seen (docs/architecture.md §5 snapshot directory).

:func:`observe` reads everything a decision needs — Kubernetes objects, the AWS inventory and the DCGM
range queries — into an :class:`Observation`: the snapshot directory's documents, in memory. The CLI
either writes it (:func:`write_snapshot`, ``rightsizer snapshot``) or decodes it straight into a
``ClusterSnapshot`` (``rightsizer plan --config``). The written snapshot is the projection of the same
documents onto the fields the decision reads (``rightsizer.adapters.snapshot_projection``: no field a
decision does not read leaves the cluster), so it reproduces the live plan exactly.

Fail closed: a denied preflight or any failed Kubernetes list raises, and no observation (hence no plan
and no directory) exists. A metric whose answer is unusable is recorded as it came; the decision then
marks the nodes depending on it ``unknown`` (docs/architecture.md §5).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.errors import ConfigError, PermanentError
from rightsizer.domain.gpu import is_gpu_node
from rightsizer.domain.model import (
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodDisruptionBudget,
)
from rightsizer.domain.observation import METRICS_FORMAT, observation_queries
from rightsizer.domain.usage import ACTIVITY_METRICS, DEVICE_METRICS, UP
from rightsizer.ports import JSON, AccessCheck, ClusterReader, MetricsRangeReader, NodeGroupInventory

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
    "rfc3339",
    "snapshot_meta",
    "write_snapshot",
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


def _pod_projection(gpu_nodes: frozenset[str]) -> Callable[[JSON], Pod]:
    """What the plan reads of a pod: all of it (as the ``Pod`` model keeps it) when it is bound to a GPU
    node or not bound at all (pending pods can want a GPU node); otherwise only what the series join
    reads (namespace, name, node, phase, pod IP)."""

    def project(item: JSON) -> Pod:
        spec, status = item.get("spec") or {}, item.get("status") or {}
        node = spec.get("nodeName")
        if not node or node in gpu_nodes:
            return Pod.model_validate(item)
        meta = item.get("metadata") or {}
        return Pod.model_validate(
            {
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
                "spec": {"nodeName": node},
                "status": {"phase": status.get("phase"), "podIP": status.get("podIP")},
            }
        )

    return project


def _projected_documents(cluster: ClusterReader) -> tuple[list[Node], dict[str, Any]]:
    """The Kubernetes documents of a live plan, projected page by page (issue 11 item 7): the typed
    objects the plan reads instead of the raw lists (``snapshot_dir`` accepts either)."""
    nodes = cluster.list_projected("nodes", Node.model_validate)
    catalog = load_catalog()
    gpu_nodes = frozenset(n.name for n in nodes if is_gpu_node(n, catalog))
    documents = {
        "nodes.json": kubectl_list(nodes),
        "pods.json": kubectl_list(cluster.list_projected("pods", _pod_projection(gpu_nodes))),
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
    ``join.node_series_matchers``) over (at − W, at] at the request's step, by relative path."""
    documents: dict[str, Any] = {}
    end = float(int(request.at.timestamp()))
    for query in observation_queries(request.job, scope):
        start, stop = query.span(end, request.window_seconds, request.step_seconds)
        expr = query.expr(request.step_seconds, request.window_seconds)
        answer = metrics.query_range_raw(expr, start, stop, float(request.step_seconds))
        documents[query.path] = json.loads(answer) if isinstance(answer, bytes | bytearray) else answer
    return documents


def observe(
    cluster: ClusterReader,
    inventory: NodeGroupInventory | None,
    metrics: MetricsRangeReader | None,
    request: ObserveRequest,
    *,
    project: bool = False,
) -> Observation:
    """Read the cluster, its node groups and its DCGM metrics into an :class:`Observation`.

    Order: discovery (is ``resource.k8s.io`` served?), one ``SelfSubjectAccessReview`` per read
    permission, then the Kubernetes lists (⌈N/page⌉ calls each), the AWS inventory for the nodes'
    instances, and the 15 ``observation_queries`` (metrics format 2: every raw sample of (at − W, at]
    counted, ``rightsizer.domain.observation``) at the configured step.

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
    dra = cluster.served_resource_api()
    checks = READ_CHECKS + (DRA_READ_CHECKS if dra else ())
    denied = cluster.preflight(checks)
    if denied:
        raise PermanentError(
            f"{cluster.identity()} may not "
            + ", ".join(c.describe() for c in denied)
            + ": nothing was read and nothing is decided. Remedy: bind the ClusterRole rightsizer-read "
            "(infra/k8s/rbac.yaml) to the identity's group (EKS access entry group rightsizer-read)."
        )
    documents: dict[str, Any] = {"snapshot.json": snapshot_meta(request)}
    if project:
        typed, kubernetes = _projected_documents(cluster)
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
    if dra:
        documents["resourceclaims.json"] = kubectl_list(cluster.list_resource_claims())
        documents["resourceslices.json"] = kubectl_list(cluster.list_resource_slices())
    if inventory is not None and request.eks_cluster:
        documents["nodegroups.json"] = inventory.describe(ids, request.eks_cluster)
        documents["instances.json"] = inventory.describe_instances(ids)
    if metrics is not None:
        documents.update(metric_documents(metrics, request))
    return Observation(documents)


def require_free_output(out: str | Path) -> Path:
    """``out`` as a path, when it does not exist or is an empty directory.

    Raises:
        ConfigError: ``out`` exists and is not an empty directory (names ``--out``).
    """
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not an empty directory", field="--out")
    return target


def write_snapshot(
    observation: Observation, out: str | Path, *, project: Callable[[Mapping[str, Any]], Mapping[str, Any]]
) -> Path:
    """Write the observation, reduced by ``project``, as a snapshot directory at ``out``, atomically.

    ``project`` is the allowlist projection (``rightsizer.adapters.snapshot_projection.project_documents``
    in the CLI): it is required, so nothing writes a snapshot with fields no decision reads.

    Files go to a temporary directory beside ``out`` which is then renamed onto it, so ``out`` either
    does not exist or holds a complete snapshot — never half of one. An existing empty ``out`` is
    replaced.

    Raises:
        ConfigError: ``out`` exists and is not an empty directory (names ``--out``).
    """
    target = require_free_output(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for relative, document in sorted(project(observation.documents).items()):
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as fh:
                json.dump(document, fh, indent=2, ensure_ascii=False)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
        # The directory keeps mkdtemp's 0700: a snapshot names every node, pod and instance; sharing
        # it is the operator's deliberate act.
        # rename(2) replaces an empty directory atomically; a non-empty one was refused above.
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
