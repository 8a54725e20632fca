"""Read a snapshot directory (docs/architecture.md §5 "Snapshot directory (contract)") into a ``ClusterSnapshot``.

Accepts what ``kubectl get -o json`` (kind ``List`` or a typed list), the Prometheus HTTP API and AWS
return, unchanged. A required file that is missing, not JSON or not matching its schema raises
``SnapshotError`` naming the file and the field, and nothing half-loaded is returned. A metrics file that
is unusable only marks its metric as a problem: the nodes depending on it become ``unknown``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveFloat, ValidationError

from rightsizer.adapters.prometheus_answers import answer_problem
from rightsizer.adapters.snapshot_files import read_snapshot_file
from rightsizer.domain.errors import SnapshotError
from rightsizer.domain.health import XID_DOCUMENT
from rightsizer.domain.model import (
    AsgInfo,
    CapacityReservation,
    ClusterSnapshot,
    Ec2Instance,
    Inventory,
    MetricData,
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodAddress,
    PodDisruptionBudget,
    ResourceClaim,
    Series,
    SnapshotMeta,
)
from rightsizer.domain.observation import MetricFiles, file_kind
from rightsizer.domain.prices import PriceBook
from rightsizer.domain.validation import config_error
from rightsizer.domain.workload_model import KubeObject

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class _SnapshotFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    taken_at: AwareDatetime
    window_seconds: int = Field(gt=0)
    step_seconds: int = Field(gt=0)
    cluster: str
    region: str
    metrics_format: int = Field(1, ge=1, le=2)


def _read_json(root: Path, path: Path, *, required: bool) -> Any:
    try:
        data = read_snapshot_file(root, path)
    except FileNotFoundError:
        if required:
            why = _REQUIRED_WHY.get(path.name)
            raise SnapshotError(
                "required file is missing" + (f": {why}" if why else ""), source=str(path)
            ) from None
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"not valid JSON: {exc}", source=str(path)) from exc


def _validation_error(path: Path, prefix: str, exc: ValidationError) -> SnapshotError:
    # every mistake of the file, the first in the message (rightsizer.domain.validation)
    error = config_error(exc, source=str(path), prefix=prefix)
    message = str(error).removeprefix(": ".join(filter(None, (error.source, error.field))) + ": ")
    return SnapshotError(message, source=error.source, field=error.field, problems=error.problems)


def _items(path: Path, data: Any) -> list[Any]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise SnapshotError(
            "expected a Kubernetes list with an 'items' array", source=str(path), field="items"
        )
    return list(data["items"])


def _typed_list(path: Path, data: Any, model: type[M]) -> list[M]:
    out: list[M] = []
    for i, item in enumerate(_items(path, data)):
        if isinstance(item, model):
            # The live plan's documents already hold the projection (services.snapshot, issue 11 item 7).
            out.append(item)
            continue
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            raise _validation_error(path, f"items[{i}]", exc) from exc
    return out


def decode_xid_document(doc: Any) -> dict[str, MetricData]:
    """The ``xid.json`` answers by key (``count``, ``last``: ``domain.health.xid_queries``); an unusable
    answer is a ``problem`` (no evidence), an absent document none at all (older snapshots)."""
    if not isinstance(doc, Mapping):
        return {}
    return {str(key): _parse_matrix(f"xid.{key}", answer) for key, answer in doc.items()}


def _parse_matrix(name: str, data: Any) -> MetricData:
    """A query_range answer → MetricData; an unusable answer becomes ``problem``, never an exception.

    The problem names the error's class and the warnings' own words (``prometheus_answers.answer_problem``:
    ``status_error: <errorType>``, ``warnings: <text>``), so a refusal by size or cost (AMP's 413/422, its
    Query Samples Processed warning; BUG-50) is named in the log, not only as ``partial_response:<metric>``.
    """
    if not isinstance(data, dict):
        return MetricData(name, problem="not_a_response")
    problem = answer_problem(data, "matrix")
    if problem is not None:
        return MetricData(name, problem=problem)
    body = data["data"]
    series: list[Series] = []
    try:
        for item in body["result"]:
            labels = {str(k): str(v) for k, v in item.get("metric", {}).items() if v != ""}
            values = item.get("values") or []
            times, samples = zip(*values, strict=True) if values else ((), ())
            series.append(
                Series(labels=labels, times=tuple(map(float, times)), values=tuple(map(float, samples)))
            )
    except (TypeError, ValueError, IndexError, AttributeError):
        return MetricData(name, problem="malformed_matrix")
    return MetricData(name, tuple(series))


def _load_metrics(root: Path, directory: Path) -> MetricFiles:
    files: MetricFiles = {}
    if not directory.is_dir():
        return files
    for path in sorted(directory.glob("*.json")):
        kind, stem = file_kind(path.name.removesuffix(".json"))
        raw = read_snapshot_file(root, path)  # a file leaving the directory is refused, never unknown
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            files.setdefault(kind, {})[stem] = MetricData(stem, problem="invalid_json")
            continue
        parsed = files.setdefault(kind, {})[stem] = _parse_matrix(stem, data)
        if parsed.problem:
            log.warning("%s unusable (%s): nodes depending on it are unknown", path.name, parsed.problem)
    return files


def _node_selector_names(allocation: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                names.update(str(v) for v in field.get("values") or [])
    return names


def parse_resource_claims(claims: list[Any], slices: list[Any]) -> list[ResourceClaim]:
    """Reduce resource.k8s.io ResourceClaims to the nodes they are allocated on and the pods they serve.

    The node comes from ``status.allocation.nodeSelector`` (matchFields ``metadata.name``) or from the
    ResourceSlice (``spec.nodeName``) whose ``spec.pool.name`` and driver hold an allocated device.
    """
    pool_node: dict[tuple[str, str], str] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("nodeName"):
            pool_node[(spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))] = spec["nodeName"]
    out: list[ResourceClaim] = []
    for c in claims:
        meta = c.get("metadata") or {}
        allocation = (c.get("status") or {}).get("allocation") or {}
        nodes = _node_selector_names(allocation)
        for result in (allocation.get("devices") or {}).get("results") or []:
            node = pool_node.get((result.get("driver", ""), result.get("pool", "")))
            if node:
                nodes.add(node)
        reserved = {
            str(r.get("name"))
            for r in (c.get("status") or {}).get("reservedFor") or []
            if r.get("resource") == "pods" and r.get("name")
        }
        out.append(
            ResourceClaim(
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                nodes=frozenset(nodes),
                reserved_for=frozenset(reserved),
                allocated=bool(allocation),
            )
        )
    return out


class _AsgInstance(BaseModel):
    model_config = ConfigDict(extra="ignore")
    InstanceId: str
    LifecycleState: str = "InService"


class _Tag(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Key: str
    Value: str = ""


class _Asg(BaseModel):
    model_config = ConfigDict(extra="ignore")
    AutoScalingGroupName: str
    MinSize: int
    MaxSize: int
    DesiredCapacity: int
    Instances: list[_AsgInstance] = Field(default_factory=list)
    Tags: list[_Tag] = Field(default_factory=list)


class _AsgMembership(BaseModel):
    model_config = ConfigDict(extra="ignore")
    InstanceId: str
    AutoScalingGroupName: str


class _NodegroupResources(BaseModel):
    model_config = ConfigDict(extra="ignore")
    autoScalingGroups: list[dict[str, Any]] = Field(default_factory=list)


class _Issue(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: str = ""


class _NodegroupHealth(BaseModel):
    model_config = ConfigDict(extra="ignore")
    issues: list[_Issue] = Field(default_factory=list)


class _NodeRepairConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    enabled: bool = False


class _Nodegroup(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodegroupName: str
    resources: _NodegroupResources = Field(default_factory=_NodegroupResources)
    health: _NodegroupHealth = Field(default_factory=_NodegroupHealth)
    nodeRepairConfig: _NodeRepairConfig | None = None


class _NodegroupsFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodegroups: list[_Nodegroup] = Field(default_factory=list)
    autoScalingGroups: list[_Asg] = Field(default_factory=list)
    autoScalingInstances: list[_AsgMembership] = Field(default_factory=list)
    launchActivities: dict[str, AwareDatetime] = Field(default_factory=dict)
    capacityFailures: dict[str, list[AwareDatetime]] = Field(default_factory=dict)
    """Ours: per ASG, start times of launches that failed for InsufficientInstanceCapacity
    (DescribeScalingActivities), newest first; absent in older snapshots."""


class _Ec2Instance(BaseModel):
    model_config = ConfigDict(extra="ignore")
    InstanceId: str
    InstanceType: str
    RootDeviceType: str = "ebs"
    Tags: list[_Tag] = Field(default_factory=list)
    State: dict[str, Any] = Field(default_factory=dict)
    InstanceLifecycle: str = ""
    CapacityReservationId: str | None = None
    Placement: dict[str, Any] = Field(default_factory=dict)


class _Reservation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Instances: list[_Ec2Instance] = Field(default_factory=list)


class _SpotPrice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    InstanceType: str
    AvailabilityZone: str
    SpotPrice: float
    Timestamp: AwareDatetime


class _OnDemandPrices(BaseModel):
    """Our ``OnDemandPrices`` (``PriceBook.document``): the region's on-demand prices and their source."""

    model_config = ConfigDict(extra="ignore")
    Region: str
    Source: Literal["pricing_api", "catalog"]
    FetchedAt: str = ""
    UsdPerHour: dict[str, PositiveFloat] = Field(default_factory=dict)
    Error: str | None = None

    def book(self) -> PriceBook:
        return PriceBook(self.Region, self.Source, self.UsdPerHour, self.FetchedAt, self.Error)


class _StatusEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Code: str
    Description: str = ""


class _InstanceStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")
    InstanceId: str
    Events: list[_StatusEvent] = Field(default_factory=list)


class _CapacityReservation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    CapacityReservationId: str
    InstanceType: str = ""
    TotalInstanceCount: int = 0
    AvailableInstanceCount: int = 0
    State: str = "active"
    EndDate: AwareDatetime | None = None
    ReservationType: str = "default"


class _InstancesFile(BaseModel):
    """DescribeInstances ``Reservations`` plus our ``SpotPriceHistory`` (DescribeSpotPriceHistory, Linux),
    ``OnDemandPrices`` (Price List Query API GetProducts), ``InstanceStatuses`` (DescribeInstanceStatus
    scheduled events) and ``CapacityReservations`` (DescribeCapacityReservations); each absent in older
    snapshots."""

    model_config = ConfigDict(extra="ignore")
    Reservations: list[_Reservation] = Field(default_factory=list)
    SpotPriceHistory: list[_SpotPrice] = Field(default_factory=list)
    OnDemandPrices: _OnDemandPrices | None = None
    InstanceStatuses: list[_InstanceStatus] = Field(default_factory=list)
    CapacityReservations: list[_CapacityReservation] = Field(default_factory=list)


#: A scheduled event's ``Description`` starts so once it no longer lies ahead (EC2 DescribeInstanceStatus).
_PAST_EVENT = ("[Completed]", "[Canceled]")


def _events(statuses: list[_InstanceStatus]) -> dict[str, tuple[str, ...]]:
    return {
        s.InstanceId: tuple(e.Code for e in s.Events if not e.Description.startswith(_PAST_EVENT))
        for s in statuses
    }


def _reservations(items: list[_CapacityReservation]) -> dict[str, CapacityReservation]:
    return {
        r.CapacityReservationId: CapacityReservation(
            reservation_id=r.CapacityReservationId,
            kind="capacity_block" if r.ReservationType == "capacity-block" else "odcr",
            instance_type=r.InstanceType,
            total=r.TotalInstanceCount,
            available=r.AvailableInstanceCount,
            state=r.State,
            end=r.EndDate,
        )
        for r in items
    }


def _spot_prices(history: list[_SpotPrice]) -> dict[tuple[str, str], float]:
    """The newest price per (type, zone): DescribeSpotPriceHistory answers newest first, but not always."""
    newest: dict[tuple[str, str], _SpotPrice] = {}
    for item in history:
        key = (item.InstanceType, item.AvailabilityZone)
        if key not in newest or item.Timestamp > newest[key].Timestamp:
            newest[key] = item
    return {key: item.SpotPrice for key, item in newest.items()}


def _inventory(path: Path, data: Any, instances_path: Path, instances_data: Any) -> Inventory:
    if data is None:
        return Inventory()
    try:
        parsed = _NodegroupsFile.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(path, "", exc) from exc
    managed = {str(asg.get("name")): ng for ng in parsed.nodegroups for asg in ng.resources.autoScalingGroups}
    groups: dict[str, AsgInfo] = {}
    membership: dict[str, str] = {}
    for asg in parsed.autoScalingGroups:
        tags = {t.Key: t.Value for t in asg.Tags}
        name = asg.AutoScalingGroupName
        ng = managed.get(name)
        groups[name] = AsgInfo(
            name=name,
            min_size=asg.MinSize,
            max_size=asg.MaxSize,
            desired=asg.DesiredCapacity,
            instances={i.InstanceId: i.LifecycleState for i in asg.Instances},
            nodegroup=(ng.nodegroupName if ng is not None else None) or tags.get("eks:nodegroup-name"),
            tags=tags,
            last_launch=parsed.launchActivities.get(name),
            capacity_failures=tuple(parsed.capacityFailures.get(name, ())),
            nodegroup_issues=tuple(i.code for i in ng.health.issues) if ng is not None else (),
            node_repair=ng is not None and ng.nodeRepairConfig is not None and ng.nodeRepairConfig.enabled,
        )
        for inst in asg.Instances:
            membership[inst.InstanceId] = name
    for m in parsed.autoScalingInstances:
        membership[m.InstanceId] = m.AutoScalingGroupName
    instances: dict[str, Ec2Instance] | None = None
    if instances_data is not None:
        try:
            inst_file = _InstancesFile.model_validate(instances_data)
        except ValidationError as exc:
            raise _validation_error(instances_path, "", exc) from exc
        events = _events(inst_file.InstanceStatuses)
        reservations = _reservations(inst_file.CapacityReservations)
        instances = {
            i.InstanceId: Ec2Instance(
                instance_id=i.InstanceId,
                instance_type=i.InstanceType,
                tags={t.Key: t.Value for t in i.Tags},
                root_device_type=i.RootDeviceType,
                state=str(i.State.get("Name", "")),
                lifecycle=i.InstanceLifecycle,
                capacity_reservation_id=i.CapacityReservationId,
                availability_zone=str(i.Placement.get("AvailabilityZone", "")),
                events=events.get(i.InstanceId, ()),
            )
            for r in inst_file.Reservations
            for i in r.Instances
        }
        spot = _spot_prices(inst_file.SpotPriceHistory)
        on_demand = inst_file.OnDemandPrices.book() if inst_file.OnDemandPrices is not None else None
    else:
        spot, on_demand, reservations = {}, None, {}
    return Inventory(
        known=True,
        groups=groups,
        asg_of_instance=membership,
        instances=instances,
        spot_prices=spot,
        on_demand=on_demand,
        reservations=reservations,
    )


#: Files a snapshot cannot be decided without. ``pdbs.json`` is one: read as "no PodDisruptionBudgets" its
#: absence would let a replay drain pods the cluster protects (``rightsizer snapshot`` always writes it;
#: a cluster without budgets has ``{"items": []}``). The optional ones below are absent conservatively:
#: PVCs/PVs count every claim as node-local data, no inventory removes nothing, and so on.
REQUIRED_FILES = ("snapshot.json", "nodes.json", "pods.json", "pdbs.json")
#: Why a required file is required, said when it is missing.
_REQUIRED_WHY = {
    "pdbs.json": "without it no PodDisruptionBudget would protect a pod; re-capture the snapshot, or write "
    '{"items": []} if the cluster has none',
}
OPTIONAL_FILES = (
    "persistentvolumeclaims.json",
    "persistentvolumes.json",
    "resourceclaims.json",
    "resourceslices.json",
    "nodegroups.json",
    "instances.json",
    XID_DOCUMENT,
    "workloads.json",
)
#: Kinds of ``workloads.json`` that scale others (the rest are owners of pods, ``domain.workloads``).
AUTOSCALER_KINDS = frozenset({"HorizontalPodAutoscaler", "ScaledObject"})


def snapshot_from_documents(
    docs: Mapping[str, Any],
    *,
    root: Path,
    node_label: str | None = None,
    metric_files: MetricFiles | None = None,
) -> ClusterSnapshot:
    """Decode the documents of a snapshot directory (relative path → parsed JSON) into a ``ClusterSnapshot``.

    The one decoder of both paths: ``load_snapshot`` (files on disk) and the live ``plan --config``
    (documents in memory), so the two cannot drift. ``metric_files``, when given, replaces the decoding
    of ``metrics/*.json`` documents; ``node_label`` defaults to the one ``snapshot.json`` records.

    Raises:
        SnapshotError: a required document is missing, or a document does not match its schema (names the
            file under ``root`` and the field).
    """
    for name in REQUIRED_FILES:
        if docs.get(name) is None:
            why = _REQUIRED_WHY.get(name)
            raise SnapshotError(
                "required file is missing" + (f": {why}" if why else ""), source=str(root / name)
            )
    try:
        meta = _SnapshotFile.model_validate(docs["snapshot.json"])
    except ValidationError as exc:
        raise _validation_error(root / "snapshot.json", "", exc) from exc
    nodes = _typed_list(root / "nodes.json", docs["nodes.json"], Node)
    pod_items = _items(root / "pods.json", docs["pods.json"])
    # The live plan's pods of non-GPU nodes come as what the join reads (services.snapshot, issue 11 item 7).
    addresses = [item for item in pod_items if isinstance(item, PodAddress)]
    if addresses:
        pod_items = [item for item in pod_items if not isinstance(item, PodAddress)]
    pods = _typed_list(root / "pods.json", {"items": pod_items}, Pod)
    pdbs = _typed_list(root / "pdbs.json", docs["pdbs.json"], PodDisruptionBudget)
    pvc_data, pv_data = docs.get("persistentvolumeclaims.json"), docs.get("persistentvolumes.json")
    pvcs = (
        _typed_list(root / "persistentvolumeclaims.json", pvc_data, PersistentVolumeClaim)
        if pvc_data is not None
        else []
    )
    pvs = (
        _typed_list(root / "persistentvolumes.json", pv_data, PersistentVolume) if pv_data is not None else []
    )
    claims_data, slices_data = docs.get("resourceclaims.json"), docs.get("resourceslices.json")
    claims = parse_resource_claims(
        _items(root / "resourceclaims.json", claims_data) if claims_data is not None else [],
        _items(root / "resourceslices.json", slices_data) if slices_data is not None else [],
    )
    inventory = _inventory(
        root / "nodegroups.json",
        docs.get("nodegroups.json"),
        root / "instances.json",
        docs.get("instances.json"),
    )
    workload_data = docs.get("workloads.json")
    workload_objects = (
        _typed_list(root / "workloads.json", workload_data, KubeObject) if workload_data is not None else []
    )
    if metric_files is None:
        metric_files = {}
        for path in sorted(p for p in docs if p.startswith("metrics/") and p.endswith(".json")):
            kind, stem = file_kind(path.removeprefix("metrics/").removesuffix(".json"))
            metric_files.setdefault(kind, {})[stem] = _parse_matrix(stem, docs[path])
    recorded = docs["snapshot.json"].get("node_label") if isinstance(docs["snapshot.json"], dict) else None

    return ClusterSnapshot(
        meta=SnapshotMeta(
            taken_at=meta.taken_at,
            window_seconds=meta.window_seconds,
            step_seconds=meta.step_seconds,
            cluster=meta.cluster,
            region=meta.region,
            metrics_format=meta.metrics_format,
        ),
        nodes=tuple(nodes),
        pods=tuple(pods),
        pdbs=tuple(pdbs),
        resource_claims=tuple(claims),
        pvcs=tuple(pvcs),
        pvs=tuple(pvs),
        # Both lists or neither: a snapshot with only one of them cannot resolve a claim to its volume.
        volumes_known=pvc_data is not None and pv_data is not None,
        inventory=inventory,
        metrics=metric_files.get("step", {}),
        timestamps=metric_files.get("timestamp", {}),
        metric_extras={k: v for k, v in metric_files.items() if k not in ("step", "timestamp")},
        node_label=node_label or (str(recorded) if recorded else None),
        pod_addresses=tuple(addresses),
        xid_answers=decode_xid_document(docs.get(XID_DOCUMENT)),
        owners=tuple(o for o in workload_objects if o.kind not in AUTOSCALER_KINDS),
        autoscalers=tuple(o for o in workload_objects if o.kind in AUTOSCALER_KINDS),
    )


def load_snapshot(directory: str | Path, *, node_label: str | None = None) -> ClusterSnapshot:
    """Load and validate a snapshot directory.

    Args:
        directory: the snapshot directory (docs/architecture.md §5 layout).
        node_label: the series label carrying the node name (config ``prometheus.node_label``); defaults
            to the one ``snapshot.json`` records.

    Returns:
        A fully validated ``ClusterSnapshot``.

    Raises:
        SnapshotError: a required file (``snapshot.json``, ``nodes.json``, ``pods.json``) is missing, or any
            present Kubernetes/AWS file is not JSON or does not match its schema; any file (metrics
            included) is a symbolic link leaving the directory, not a regular file, or over
            ``snapshot_files.MAX_FILE_BYTES``; the message names the file and the field.
    """
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError("not a directory", source=str(root))
    docs = {name: _read_json(root, root / name, required=True) for name in REQUIRED_FILES}
    docs.update({name: _read_json(root, root / name, required=False) for name in OPTIONAL_FILES})
    snapshot = snapshot_from_documents(
        docs, root=root, node_label=node_label, metric_files=_load_metrics(root, root / "metrics")
    )
    # A loaded snapshot is long-lived and holds millions of sample tuples; freezing them keeps the cyclic
    # GC from rescanning them on every later allocation (plan time grew superlinearly without it).
    gc.freeze()
    return snapshot
