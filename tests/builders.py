"""Builders for in-memory snapshots: GPU nodes, pods, PDBs and DCGM series (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from rightsizer.domain.model import (
    AsgInfo,
    ClusterSnapshot,
    Inventory,
    MetricData,
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodDisruptionBudget,
    Series,
    SnapshotMeta,
)

AT = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
WINDOW = 1800
STEP = 60


def rfc(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def gpu_node(
    name: str,
    *,
    instance_type: str = "g5.12xlarge",
    gpus: int = 4,
    instance_id: str | None = None,
    ip: str | None = None,
    nodegroup: str | None = "gpu-a10g",
    created: datetime | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node as ``kubectl get -o json`` prints it."""
    iid = instance_id or f"i-{abs(hash(name)) % 16**17:017x}"
    lab = {
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/region": "us-east-1",
        "nvidia.com/gpu.present": "true",
        **({"eks.amazonaws.com/nodegroup": nodegroup} if nodegroup else {}),
        **(labels or {}),
    }
    cap = {"cpu": "48", "memory": "192Gi", "nvidia.com/gpu": str(gpus), **(capacity or {})}
    alloc = {**cap, "cpu": "47", **(allocatable or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": rfc(created or AT - timedelta(days=3)),
            "labels": lab,
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "providerID": f"aws:///us-east-1a/{iid}",
            "unschedulable": unschedulable,
            "taints": taints or [],
        },
        "status": {
            "capacity": cap,
            "allocatable": alloc,
            "addresses": [
                {"type": "InternalIP", "address": ip or f"10.0.{len(name)}.{sum(map(ord, name)) % 250}"}
            ],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def room_node(name: str = "cpu-room", cpu: str = "64", memory: str = "256Gi") -> dict[str, Any]:
    """A Ready CPU Node outside every node group: somewhere for evicted CPU pods to land."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str,
    node: str | None,
    *,
    namespace: str = "default",
    owner: tuple[str, str] | None = ("ReplicaSet", "apps/v1"),
    gpus: int = 0,
    phase: str = "Running",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    env: list[dict[str, Any]] | None = None,
    grace: int | None = None,
    pod_ip: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    cpu: str = "1",
    memory: str = "1Gi",
    extra_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod as ``kubectl get -o json`` prints it; ``owner`` is (kind, apiVersion) or None for a bare pod."""
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "creationTimestamp": rfc(AT - timedelta(hours=5)),
        "labels": dict(labels or {"app": name.split("-")[0]}),
        "annotations": dict(annotations or {}),
    }
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": owner[1], "kind": owner[0], "name": f"{name}-owner", "controller": True}
        ]
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "resources": {"requests": requests, "limits": limits}, "env": env or []}
        ],
        "volumes": volumes or [],
        **({"nodeName": node} if node else {}),
        **({"terminationGracePeriodSeconds": grace} if grace is not None else {}),
        **({"nodeSelector": dict(node_selector)} if node_selector else {}),
        **(extra_spec or {}),
    }
    status: dict[str, Any] = {"phase": phase, "startTime": rfc(AT - timedelta(hours=5))}
    if pod_ip:
        status["podIP"] = pod_ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def exporter_pod(node: str, ip: str, name: str | None = None) -> dict[str, Any]:
    """A dcgm-exporter DaemonSet pod on ``node`` with pod IP ``ip``."""
    return pod(
        name or f"nvidia-dcgm-exporter-{node[-5:]}",
        node,
        namespace="gpu-operator",
        owner=("DaemonSet", "apps/v1"),
        pod_ip=ip,
    )


def pdb(name: str, namespace: str, match: Mapping[str, str], allowed: int) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget with ``status.disruptionsAllowed``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": dict(match)}, "minAvailable": 1},
        "status": {"disruptionsAllowed": allowed},
    }


Shape = Callable[[int], float]
"""Value at step ``i`` (0 = the oldest point of the window)."""


def const(v: float) -> Shape:
    return lambda _i: v


def jitter(base: float, amp: float) -> Shape:
    return lambda i: base + amp * math.sin(i * 1.7)


def times(at: datetime = AT, window: int = WINDOW, step: int = STEP) -> list[float]:
    """Prometheus 2.x range: both ends, W/step + 1 points."""
    end = at.timestamp()
    return [end - window + k * step for k in range(window // step + 1)]


def series(labels: Mapping[str, str], shape: Shape, ts: list[float] | None = None) -> Series:
    ts = ts or times()
    return Series(dict(labels), tuple(ts), tuple(shape(i) for i in range(len(ts))))


_ZERO = const(0.0)
_FB = jitter(300, 2)
_POWER = jitter(27, 1)


def device_series(
    labels: Mapping[str, str],
    *,
    util: Shape | None = _ZERO,
    prof: Shape | None = None,
    fb_used: Shape | None = _FB,
    fb_total: float = 23028,
    power: Shape | None = _POWER,
    energy: str | None = "moving",
    ts: list[float] | None = None,
) -> dict[str, list[Series]]:
    """One device's DCGM series by metric name (units: percent, ratio, MiB, W, mJ)."""
    out: dict[str, list[Series]] = {}
    if util is not None:
        out["DCGM_FI_DEV_GPU_UTIL"] = [series(labels, util, ts)]
    if prof is not None:
        out["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = [series(labels, prof, ts)]
    if fb_used is not None:
        out["DCGM_FI_DEV_FB_USED"] = [series(labels, fb_used, ts)]
        used = fb_used
        out["DCGM_FI_DEV_FB_FREE"] = [series(labels, lambda i: fb_total - used(i), ts)]
    if power is not None:
        out["DCGM_FI_DEV_POWER_USAGE"] = [series(labels, power, ts)]
    if energy == "moving":
        out["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = [series(labels, lambda i: 9.8e10 + i * 1.6e6, ts)]
    elif energy == "frozen":
        out["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = [series(labels, const(9.8e10), ts)]
    return out


def merge_metrics(*parts: Mapping[str, list[Series]]) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


def node_devices(
    node: str, gpus: int = 4, *, per_gpu: Mapping[int, Mapping[str, Any]] | None = None, **common: Any
) -> dict[str, list[Series]]:
    """Series for every GPU of ``node`` labelled ``node``/``gpu``/``UUID``; ``per_gpu`` overrides by index."""
    parts = []
    for g in range(gpus):
        labels = {"node": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}
        kwargs = {**common, **((per_gpu or {}).get(g, {}))}
        parts.append(device_series(labels, **kwargs))
    return merge_metrics(*parts)


def asg(
    name: str,
    instances: Iterable[str],
    *,
    min_size: int = 0,
    desired: int | None = None,
    max_size: int = 10,
    nodegroup: str | None = None,
) -> AsgInfo:
    ids = list(instances)
    return AsgInfo(
        name=name,
        min_size=min_size,
        max_size=max_size,
        desired=len(ids) if desired is None else desired,
        instances={i: "InService" for i in ids},
        nodegroup=nodegroup,
    )


def pvc(name: str, volume: str | None, *, namespace: str = "default") -> dict[str, Any]:
    """A PersistentVolumeClaim bound to PersistentVolume ``volume`` (None: still Pending)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-pvc-{namespace}-{name}"},
        "spec": {"volumeName": volume or "", "storageClassName": "standard"},
        "status": {"phase": "Bound" if volume else "Pending"},
    }


def pv(
    name: str,
    *,
    local_path: str | None = None,
    host_path: str | None = None,
    affinity: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """A PersistentVolume: ``local`` or ``hostPath`` source, or a CSI volume; ``affinity`` is a required
    node affinity {label key: allowed values} (``metadata.name`` goes to matchFields)."""
    spec: dict[str, Any] = {"capacity": {"storage": "100Gi"}, "storageClassName": "standard"}
    if local_path:
        spec["local"] = {"path": local_path}
    elif host_path:
        spec["hostPath"] = {"path": host_path}
    else:
        spec["csi"] = {"driver": "ebs.csi.aws.com", "volumeHandle": f"vol-{name}"}
    if affinity:
        exprs = [
            {"key": k, "operator": "In", "values": v} for k, v in affinity.items() if k != "metadata.name"
        ]
        fields = [
            {"key": k, "operator": "In", "values": v} for k, v in affinity.items() if k == "metadata.name"
        ]
        term = {
            **({"matchExpressions": exprs} if exprs else {}),
            **({"matchFields": fields} if fields else {}),
        }
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [term]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def claim_volume(claim: str, name: str = "data") -> dict[str, Any]:
    """A pod volume mounting PersistentVolumeClaim ``claim``."""
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def snapshot(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]] | None = None,
    metrics: Mapping[str, list[Series]] | None = None,
    *,
    pdbs: list[dict[str, Any]] | None = None,
    groups: list[AsgInfo] | None = None,
    standalone: Iterable[str] = (),
    inventory_known: bool = True,
    problems: Mapping[str, str] | None = None,
    timestamps: Mapping[str, list[Series]] | None = None,
    at: datetime = AT,
    pvcs: list[dict[str, Any]] | None = None,
    pvs: list[dict[str, Any]] | None = None,
    volumes_known: bool = True,
    room: bool = False,
) -> ClusterSnapshot:
    """A validated ClusterSnapshot. Without ``groups`` every node is put in one ASG per nodegroup label;
    ``room`` adds a CPU node (no GPU, in no node group) with room for the pods a drain moves elsewhere."""
    node_objs = tuple(Node.model_validate(n) for n in [*nodes, *([room_node()] if room else [])])
    if groups is None:
        by_group: dict[str, list[str]] = {}
        for n in node_objs:
            ng = n.labels.get("eks.amazonaws.com/nodegroup")
            if ng and n.instance_id:
                by_group.setdefault(ng, []).append(n.instance_id)
        groups = [asg(f"eks-{ng}-asg", ids, nodegroup=ng) for ng, ids in by_group.items()]
    membership = {i: g.name for g in groups for i in g.instances}
    metric_data = {k: MetricData(k, tuple(v)) for k, v in (metrics or {}).items()}
    for name, problem in (problems or {}).items():
        metric_data[name] = MetricData(name, problem=problem)
    return ClusterSnapshot(
        meta=SnapshotMeta(
            taken_at=at, window_seconds=WINDOW, step_seconds=STEP, cluster="demo", region="us-east-1"
        ),
        nodes=node_objs,
        pods=tuple(Pod.model_validate(p) for p in (pods or [])),
        pdbs=tuple(PodDisruptionBudget.model_validate(p) for p in (pdbs or [])),
        pvcs=tuple(PersistentVolumeClaim.model_validate(p) for p in (pvcs or [])),
        pvs=tuple(PersistentVolume.model_validate(p) for p in (pvs or [])),
        volumes_known=volumes_known,
        inventory=Inventory(
            known=inventory_known, groups={g.name: g for g in groups}, asg_of_instance=membership
        ),
        metrics=metric_data,
        timestamps={k: MetricData(k, tuple(v)) for k, v in (timestamps or {}).items()},
    )


def write_snapshot_dir(
    path: Any,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    metrics: Mapping[str, list[Series]],
    *,
    groups: list[AsgInfo] | None = None,
    at: datetime = AT,
    pdbs: list[dict[str, Any]] | None = None,
) -> Any:
    """Write a docs/architecture.md §5 snapshot directory (kubectl Lists, query_range matrices, nodegroups.json)."""
    import json
    from pathlib import Path

    root = Path(path)
    (root / "metrics").mkdir(parents=True, exist_ok=True)
    meta = {
        "taken_at": rfc(at),
        "window_seconds": WINDOW,
        "step_seconds": STEP,
        "cluster": "demo",
        "region": "us-east-1",
    }
    (root / "snapshot.json").write_text(json.dumps(meta))
    (root / "nodes.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (root / "pods.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    (root / "pdbs.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pdbs or []}))
    if groups is None:
        snap = snapshot(nodes, pods, {})
        groups = list(snap.inventory.groups.values())
    ng = {
        "nodegroups": [
            {"nodegroupName": g.nodegroup, "resources": {"autoScalingGroups": [{"name": g.name}]}}
            for g in groups
            if g.nodegroup
        ],
        "autoScalingGroups": [
            {
                "AutoScalingGroupName": g.name,
                "MinSize": g.min_size,
                "MaxSize": g.max_size,
                "DesiredCapacity": g.desired,
                "Instances": [{"InstanceId": i, "LifecycleState": s} for i, s in g.instances.items()],
            }
            for g in groups
        ],
        "autoScalingInstances": [
            {"InstanceId": i, "AutoScalingGroupName": g.name} for g in groups for i in g.instances
        ],
    }
    (root / "nodegroups.json").write_text(json.dumps(ng))
    for name, items in metrics.items():
        body = {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {
                        "metric": {"__name__": name, **s.labels},
                        "values": [
                            [t, repr(v) if v == v else "NaN"] for t, v in zip(s.times, s.values, strict=True)
                        ],
                    }
                    for s in items
                ],
            },
        }
        (root / "metrics" / f"{name}.json").write_text(json.dumps(body))
    return root


#: Reason codes that name who priced a node (every priced node has one), not why it got its verdict.
PRICE_SOURCE_CODES = frozenset({"priced_on_demand"})


def verdict_reasons(reasons: Iterable[str]) -> list[str]:
    """``reasons`` without the price-source ones (:data:`PRICE_SOURCE_CODES`), in order."""
    return [r for r in reasons if r.split(":", 1)[0] not in PRICE_SOURCE_CODES]
