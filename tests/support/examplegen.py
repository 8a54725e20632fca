"""Seeded example-snapshot generator: real DCGM scrapes and EKS node objects → snapshot directories (docs/architecture.md §5).

Everything is derived from the copies in ``tests/fixtures/sources`` (see its ``PROVENANCE.md``); nothing is
read from outside the repository, so a user's clone can regenerate the committed demo byte for byte (a
developer tool: it is not part of the installed package)::

    python -m tests.support.examplegen --out DIR [--nodes N] [--seed S] [--scenario demo|scale]

Output (the snapshot directory contract of docs/architecture.md §5, plus two files for people and tests):

- ``snapshot.json`` ``{"taken_at", "window_seconds", "step_seconds", "cluster", "region"}``.
- ``nodes.json``, ``pods.json``, ``pdbs.json``: ``kubectl get -o json`` lists (``kind: List``).
- ``nodegroups.json``: EKS DescribeNodegroup ``.nodegroup`` objects, DescribeAutoScalingGroups groups and the
  DescribeAutoScalingInstances answer for every node's instance (an instance missing there is standalone).
- ``instances.json``: EC2 DescribeInstances ``{"Reservations": [...]}``.
- ``metrics/<METRIC>.json``: Prometheus ``/api/v1/query_range`` matrix responses over
  [taken_at − window, taken_at] at ``step_seconds`` (W/step + 1 points, both ends, like Prometheus 2.x),
  ``metrics/DCGM_FI_DEV_GPU_UTIL.timestamp.json`` (``timestamp()`` of the raw samples, 15 s scrapes).
- ``expected.json`` ``{"<node>": {"verdict", "reasons_include": [code, ...]}}`` and ``PROVENANCE.md``: what
  each node is meant to show under the default policy, and why (docs/architecture.md §3).

Determinism: only ``random.Random(seed)`` is used, every JSON file is written with sorted keys, so the same
arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

Json = dict[str, Any]

DEFAULT_TAKEN_AT = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)
SCENARIOS = ("demo", "scale")
CLUSTER = "demo-cluster"
REGION = "us-east-1"
ACCOUNT = "111122223333"
SCRAPE_INTERVAL_MS = 15_000
EXPORTER_NS = "gpu-operator"
EXPORTER_JOB = "nvidia-dcgm-exporter"
DCGM_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
METRIC_FILES = (*DCGM_METRICS, "up")
TIMESTAMP_METRIC = "DCGM_FI_DEV_GPU_UTIL"
# Kubernetes' random-suffix alphabet (k8s.io/apimachinery/pkg/util/rand): no vowels, no 0/1/3.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# ----------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------


def sources_dir() -> Path:
    """The copies of the shared fixtures the generator reads (``tests/fixtures/sources``)."""
    return Path(__file__).resolve().parents[1] / "fixtures" / "sources"


def _source_text(relative: str) -> str:
    node = sources_dir()
    for part in relative.split("/"):
        node = node / part
    return node.read_text(encoding="utf-8")


def _source_json(relative: str) -> Json:
    loaded: Json = json.loads(_source_text(relative))
    return loaded


_PROM_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}\s+(\S+)$")
_PROM_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class PromSample:
    """One line of Prometheus text exposition: metric name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prom(text: str) -> list[PromSample]:
    """Parse Prometheus text exposition (comments and ``# HELP``/``# TYPE`` skipped) into samples."""
    samples = []
    for line in text.splitlines():
        match = _PROM_LINE.match(line.strip())
        if match is None:
            continue
        labels = dict(_PROM_LABEL.findall(match.group(2)))
        samples.append(PromSample(match.group(1), labels, float(match.group(3))))
    return samples


@dataclass(frozen=True)
class GpuModel:
    """What the generator needs to know about one GPU model, with where each fact comes from.

    ``fb_total_mib`` is DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (MiB) of one physical GPU,
    ``idle_power_w`` the DCGM_FI_DEV_POWER_USAGE (W) of an idle GPU, ``max_power_w`` the board limit.
    """

    catalog_model: str
    model_name: str
    driver: str
    fb_total_mib: int
    idle_power_w: tuple[float, ...]
    max_power_w: float
    pci_bus_ids: tuple[str, ...]
    uuids: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class MigSlot:
    """One MIG instance as the reconstructed p4d scrape shows it (per physical GPU)."""

    profile: str
    gi_id: str
    fb_total_mib: int
    slices: int


@dataclass(frozen=True)
class Sources:
    """Facts read from the packaged scrapes and node objects."""

    models: dict[str, GpuModel]
    mig_layout: tuple[MigSlot, ...]
    mig_pods: dict[tuple[str, str], tuple[str, str, str]]
    mig_fb_used: dict[tuple[str, str], int]
    node_templates: dict[str, Json]
    nfd_cpu_labels: dict[str, str]
    nodegroup_template: Json


def _by_gpu(samples: Iterable[PromSample], name: str) -> dict[str, PromSample]:
    return {s.labels["gpu"]: s for s in samples if s.name == name and "GPU_I_ID" not in s.labels}


def load_sources() -> Sources:
    """Read every packaged source once and derive the per-model facts the scenarios use."""
    a10g = parse_prom(_source_text("dcgm/reconstructed/eks-g5.12xlarge-a10g.prom"))
    h100 = parse_prom(_source_text("dcgm/eks-p5.48xlarge-h100-gpu-operator.prom"))
    mig = parse_prom(_source_text("dcgm/reconstructed/eks-p4d.24xlarge-a100-mig-mixed.prom"))
    docs = parse_prom(_source_text("dcgm/a100-mig-1g.5gb-nvidia-docs.prom"))
    templates = {
        "g5": _source_json("k8s/eks-mng-g5.12xlarge-a10g.node.json"),
        "p4d": _source_json("k8s/eks-mng-p4d.24xlarge-a100-mig-mixed.node.json"),
        "p5": _source_json("k8s/eks-karpenter-p5.48xlarge-h100.node.json"),
    }
    gfd = _source_json("k8s/gfd-labels/h100-mig-disabled-single.node-labels.json")

    a10g_power = _by_gpu(a10g, "DCGM_FI_DEV_POWER_USAGE")
    a10g_util = _by_gpu(a10g, "DCGM_FI_DEV_GPU_UTIL")
    a10g_free = _by_gpu(a10g, "DCGM_FI_DEV_FB_FREE")
    a10g_used = _by_gpu(a10g, "DCGM_FI_DEV_FB_USED")
    # Idle = the GPUs the scrape shows at 0 % with no framebuffer held (gpu2, gpu3: P8 state).
    a10g_idle = tuple(
        a10g_power[g].value for g in sorted(a10g_power) if a10g_util[g].value == 0 and a10g_used[g].value == 0
    )
    a10g_first = a10g_power["0"].labels
    a10g_model = GpuModel(
        catalog_model="NVIDIA A10G",
        model_name=a10g_first["modelName"],
        driver=a10g_first["DCGM_FI_DRIVER_VERSION"],
        fb_total_mib=int(a10g_used["2"].value + a10g_free["2"].value),
        idle_power_w=a10g_idle,
        max_power_w=300.0,
        pci_bus_ids=tuple(a10g_power[g].labels["pci_bus_id"] for g in sorted(a10g_power)),
        uuids=tuple(a10g_power[g].labels["UUID"] for g in sorted(a10g_power)),
        source="dcgm/reconstructed/eks-g5.12xlarge-a10g.prom",
    )
    h100_power = _by_gpu(h100, "DCGM_FI_DEV_POWER_USAGE")
    h100_first = h100_power["0"].labels
    h100_model = GpuModel(
        catalog_model="NVIDIA H100",
        model_name=h100_first["modelName"],
        driver=h100_first["DCGM_FI_DRIVER_VERSION"],
        fb_total_mib=int(templates["p5"]["metadata"]["labels"]["nvidia.com/gpu.memory"]),
        # gpu0 carried a vLLM decode worker (113.6 W); gpus 1-7 are the real idle draw.
        idle_power_w=tuple(h100_power[g].value for g in sorted(h100_power) if g != "0"),
        max_power_w=700.0,
        pci_bus_ids=tuple(h100_power[g].labels["pci_bus_id"] for g in sorted(h100_power)),
        uuids=tuple(h100_power[g].labels["UUID"] for g in sorted(h100_power)),
        source="dcgm/eks-p5.48xlarge-h100-gpu-operator.prom",
    )
    mig_fb_free = [s for s in mig if s.name == "DCGM_FI_DEV_FB_FREE"]
    mig_fb_used = {
        (s.labels["gpu"], s.labels["GPU_I_ID"]): int(s.value) for s in mig if s.name == "DCGM_FI_DEV_FB_USED"
    }
    layout: list[MigSlot] = []
    for s in mig_fb_free:
        if s.labels["gpu"] != "0":
            continue
        gi = s.labels["GPU_I_ID"]
        profile = s.labels["GPU_I_PROFILE"]
        layout.append(MigSlot(profile, gi, int(s.value) + mig_fb_used[("0", gi)], int(profile[0])))
    mig_pods = {
        (s.labels["gpu"], s.labels["GPU_I_ID"]): (
            s.labels["namespace"],
            s.labels["pod"],
            s.labels["container"],
        )
        for s in mig_fb_free
        if "pod" in s.labels
    }
    per_gpu: dict[str, dict[str, str]] = {}
    for s in mig_fb_free:
        per_gpu.setdefault(s.labels["gpu"], s.labels)
    mig_first = per_gpu["0"]
    a100_model = GpuModel(
        catalog_model="NVIDIA A100",
        model_name=mig_first["modelName"],
        driver=mig_first["DCGM_FI_DRIVER_VERSION"],
        # FB_TOTAL 40960 MiB (node label nvidia.com/gpu.memory) minus the driver reservation DCGM leaves out.
        fb_total_mib=int(templates["p4d"]["metadata"]["labels"]["nvidia.com/gpu.memory"]) - 424,
        idle_power_w=(52.0,),
        max_power_w=400.0,
        pci_bus_ids=tuple(per_gpu[g]["pci_bus_id"] for g in sorted(per_gpu)),
        uuids=tuple(per_gpu[g]["UUID"] for g in sorted(per_gpu)),
        source="dcgm/reconstructed/eks-p4d.24xlarge-a100-mig-mixed.prom",
    )
    l4_model = GpuModel(
        catalog_model="NVIDIA L4",
        model_name="NVIDIA L4",
        driver=a10g_model.driver,
        fb_total_mib=a10g_model.fb_total_mib,
        idle_power_w=(16.2,),
        max_power_w=72.0,
        pci_bus_ids=("00000000:31:00.0",),
        uuids=(),
        source="derived from the A10G reconstruction (no L4 scrape in the sources)",
    )
    # The real A100 MIG scrape confirms the label layout used for MIG instances (GPU_I_PROFILE, GPU_I_ID on
    # the parent UUID) and that power/energy are per physical GPU; its values are not needed.
    assert any("GPU_I_ID" in s.labels for s in docs)
    nfd = {k: v for k, v in gfd.items() if k.startswith("feature.node.kubernetes.io/cpu-")}
    return Sources(
        models={"a10g": a10g_model, "h100": h100_model, "a100": a100_model, "l4": l4_model},
        mig_layout=tuple(layout),
        mig_pods=mig_pods,
        mig_fb_used=mig_fb_used,
        node_templates=templates,
        nfd_cpu_labels=nfd,
        nodegroup_template=_source_json("aws/eks-describe-nodegroup-gpu.constructed.json")["nodegroup"],
    )


@dataclass(frozen=True)
class InstanceType:
    """Catalog facts (ec2-gpu-instances.csv rows, us-east-1 Linux on-demand) for the types used here."""

    name: str
    vcpu: int
    memory_gib: int
    allocatable_cpu: str
    allocatable_memory_mi: int
    gpus: int
    model: str | None
    max_pods: int
    template: str
    usd_per_hour: float


INSTANCE_TYPES = {
    t.name: t
    for t in (
        InstanceType("g5.12xlarge", 48, 192, "47810m", 173400, 4, "a10g", 234, "g5", 5.672),
        InstanceType("g5.4xlarge", 16, 64, "15890m", 57691, 1, "a10g", 234, "g5", 1.624),
        InstanceType("g5.xlarge", 4, 16, "3920m", 14162, 1, "a10g", 58, "g5", 1.006),
        InstanceType("g6.xlarge", 4, 16, "3920m", 14162, 1, "l4", 58, "g5", 0.8048),
        InstanceType("p4d.24xlarge", 96, 1152, "95690m", 1082712, 8, "a100", 737, "p4d", 21.957642),
        InstanceType("p5.48xlarge", 192, 2048, "191450m", 1938410, 8, "h100", 100, "p5", 55.04),
        # Not a GPU type (no catalog row): the system node group's instances.
        InstanceType("m6i.xlarge", 4, 16, "3920m", 14162, 0, None, 58, "g5", 0.192),
    )
}

_GPU_LABELS = {
    "a10g": {"product": "NVIDIA-A10G", "family": "ampere", "major": "8", "minor": "6", "memory": "23028"},
    "l4": {"product": "NVIDIA-L4", "family": "ada-lovelace", "major": "8", "minor": "9", "memory": "23034"},
}


# ----------------------------------------------------------------------------------------------------------
# Cast: what each node is and how its devices behave
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Load:
    """Behaviour of one device over the window.

    ``activity_pct`` is the mean activity of a busy device (DCGM_FI_DEV_GPU_UTIL %, and ≈ 100 ×
    DCGM_FI_PROF_GR_ENGINE_ACTIVE); ``fb_used_mib`` the framebuffer it holds; ``workload`` the
    (namespace, pod, container) the exporter attributes it to.
    """

    busy: bool = False
    activity_pct: float = 0.0
    fb_used_mib: int = 0
    workload: tuple[str, str, str] | None = None


@dataclass
class Device:
    """A series-bearing device: a physical GPU, or a MIG instance (``gi_id`` set) of one."""

    gpu: int
    uuid: str
    pci_bus_id: str
    fb_total_mib: int
    load: Load
    gi_id: str | None = None
    profile: str | None = None
    slices: int = 0


@dataclass
class NodeCast:
    """One node of a scenario: identity, placement, devices, exporter health and the intended verdict."""

    name: str
    ip: str
    instance_id: str
    az: str
    itype: InstanceType
    owner: str  # "mng" | "karpenter" | "standalone"
    group: str | None
    created: datetime
    devices: list[Device] = field(default_factory=list)
    missing_gpus: tuple[int, ...] = ()
    exporter_state: str = "ok"  # "ok" | "frozen" | "down"
    down_seconds: int = 0
    hostname_is_pod: bool = True
    spot: bool = False
    mig: bool = False
    exporter_pod: str = ""
    exporter_ip: str = ""
    lag_ms: int = 0
    workloads: list[Json] = field(default_factory=list)
    verdict: str = ""
    reasons: tuple[str, ...] = ()
    why: str = ""


class Ids:
    """Seeded identifiers: instance ids, UUIDs, IPs and Kubernetes name suffixes, never repeated."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._ips: set[str] = set()
        self._names: set[str] = set()

    def hex(self, n: int) -> str:
        """``n`` lowercase hex digits."""
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def uuid(self) -> str:
        """A version-4 UUID string."""
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def gpu_uuid(self) -> str:
        """A GPU UUID as nvidia-smi/DCGM print it."""
        return f"GPU-{self.uuid()}"

    def instance_id(self) -> str:
        """An EC2 instance id (17 hex digits)."""
        return f"i-0{self.hex(16)}"

    def suffix(self, n: int = 5) -> str:
        """A Kubernetes generateName suffix."""
        return "".join(self.rng.choice(_SUFFIX_ALPHABET) for _ in range(n))

    def name(self, prefix: str) -> str:
        """``prefix-<suffix>``, never handed out twice: 27⁵ suffixes collide within a few thousand draws,
        and two exporter pods of one name would make the pod-label join ambiguous."""
        while True:
            candidate = f"{prefix}-{self.suffix()}"
            if candidate not in self._names:
                self._names.add(candidate)
                return candidate

    def ip(self, second: int) -> str:
        """An unused private IPv4 address in 10.<second>.0.0/16 (VPC CNI gives pods VPC addresses)."""
        while True:
            addr = f"10.{second}.{self.rng.randint(1, 254)}.{self.rng.randint(4, 254)}"
            if addr not in self._ips:
                self._ips.add(addr)
                return addr


def _node_name(ip: str) -> str:
    return f"ip-{ip.replace('.', '-')}.ec2.internal"


def _ts(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _aws_ts(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _physical_devices(ids: Ids, model: GpuModel, count: int, *, real_uuids: bool = False) -> list[Device]:
    devices = []
    for i in range(count):
        uuid_ = model.uuids[i] if real_uuids and i < len(model.uuids) else ids.gpu_uuid()
        pci = model.pci_bus_ids[i % len(model.pci_bus_ids)]
        devices.append(Device(i, uuid_, pci, model.fb_total_mib, Load()))
    return devices


def _new_node(
    ids: Ids,
    taken_at: datetime,
    itype: str,
    *,
    owner: str,
    group: str | None,
    age: timedelta,
    az: str = "us-east-1a",
    subnet: int = 0,
) -> NodeCast:
    ip = ids.ip(subnet)
    return NodeCast(
        name=_node_name(ip),
        ip=ip,
        instance_id=ids.instance_id(),
        az=az,
        itype=INSTANCE_TYPES[itype],
        owner=owner,
        group=group,
        # Nodes join at odd times of day; whole days would make every age tie-break look contrived.
        created=taken_at - age - timedelta(seconds=ids.rng.randint(0, 6 * 3600)),
    )


def _workload_pod(
    ids: Ids,
    node: NodeCast,
    *,
    namespace: str,
    name: str | None = None,
    app: str,
    owner_kind: str,
    owner_api: str = "apps/v1",
    owner_name: str | None = None,
    container: str,
    image: str,
    requests: dict[str, str],
    gpu_resource: str | None = None,
    gpus: int = 0,
    started: datetime,
    extra_spec: Json | None = None,
) -> Json:
    """A Running workload pod on ``node`` with the given controller and resource requests."""
    if name is None:
        # A ReplicaSet's pods carry its pod-template hash between the Deployment name and the suffix.
        name = ids.name(f"{app}-{ids.hex(10)[:9]}" if owner_kind == "ReplicaSet" else app)
    limits = {}
    reqs = dict(requests)
    if gpu_resource and gpus:
        reqs[gpu_resource] = str(gpus)
        limits[gpu_resource] = str(gpus)
    resources: Json = {"requests": reqs}
    if limits:
        resources["limits"] = limits
    if owner_name is None:
        owner_name = name.rsplit("-", 1)[0] if owner_kind in ("ReplicaSet", "Job") else app
    pod = _pod(
        ids,
        node,
        name=name,
        namespace=namespace,
        labels={"app": app},
        owner=(owner_api, owner_kind, owner_name),
        containers=[{"name": container, "image": image, "resources": resources}],
        pod_ip=ids.ip(node_subnet(node)),
        started=started,
        restart_policy="OnFailure" if owner_kind == "Job" else "Always",
        extra_spec=extra_spec,
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    node.workloads.append(pod)
    return pod


def node_subnet(node: NodeCast) -> int:
    """The second octet of the node's VPC range; pods get addresses from the same range."""
    return int(node.ip.split(".")[1])


def _pod(
    ids: Ids,
    node: NodeCast,
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: tuple[str, str, str],
    containers: list[Json],
    pod_ip: str,
    started: datetime,
    restart_policy: str = "Always",
    extra_spec: Json | None = None,
    tolerations: list[Json] | None = None,
    host_network: bool = False,
) -> Json:
    api, kind, owner_name = owner
    spec: Json = {
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "nodeName": node.name,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": restart_policy,
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": tolerations or [],
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"path": "token"}}]},
            }
        ],
    }
    if host_network:
        spec["hostNetwork"] = True
    if extra_spec:
        spec.update(extra_spec)
    requests = [c.get("resources", {}).get("requests", {}) for c in containers]
    qos = "Burstable" if any(requests) else "BestEffort"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "creationTimestamp": _ts(started),
            "labels": labels,
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": api,
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": kind,
                    "name": owner_name,
                    "uid": ids.uuid(),
                }
            ],
            "uid": ids.uuid(),
        },
        "spec": spec,
        "status": {
            "conditions": [
                {"lastTransitionTime": _ts(started + timedelta(seconds=9)), "status": "True", "type": "Ready"}
            ],
            "hostIP": node.ip,
            "hostIPs": [{"ip": node.ip}],
            "phase": "Running",
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "qosClass": qos,
            "startTime": _ts(started),
        },
    }


def _daemonset_pods(ids: Ids, node: NodeCast, *, full: bool) -> list[Json]:
    """The DaemonSet pods every GPU node runs; the dcgm-exporter pod's IP is the scrape target."""
    started = node.created + timedelta(seconds=40)
    node.exporter_pod = ids.name("nvidia-dcgm-exporter")
    node.exporter_ip = ids.ip(node_subnet(node))
    gpu_tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    exporter = _pod(
        ids,
        node,
        name=node.exporter_pod,
        namespace=EXPORTER_NS,
        labels={"app": "nvidia-dcgm-exporter"},
        owner=("apps/v1", "DaemonSet", "nvidia-dcgm-exporter"),
        containers=[
            {
                "name": "nvidia-dcgm-exporter",
                "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
                "ports": [{"containerPort": 9400, "name": "metrics", "protocol": "TCP"}],
                # Why the trap is realistic: the operator runs the exporter privileged under the nvidia
                # runtime class, so a GPU-holder check that forgets to skip DaemonSet pods protects every node.
                "securityContext": {"privileged": True},
            }
        ],
        pod_ip=node.exporter_ip,
        started=started,
        tolerations=gpu_tol,
        extra_spec={
            "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
            "priorityClassName": "system-node-critical",
            "runtimeClassName": "nvidia",
            "serviceAccountName": "nvidia-dcgm-exporter",
        },
    )
    pods = [exporter]
    if not full:
        return pods
    pods.append(
        _pod(
            ids,
            node,
            name=ids.name("nvidia-device-plugin-daemonset"),
            namespace=EXPORTER_NS,
            labels={"app": "nvidia-device-plugin-daemonset"},
            owner=("apps/v1", "DaemonSet", "nvidia-device-plugin-daemonset"),
            containers=[
                {"name": "nvidia-device-plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}
            ],
            pod_ip=ids.ip(node_subnet(node)),
            started=started,
            tolerations=gpu_tol,
            extra_spec={"priorityClassName": "system-node-critical", "runtimeClassName": "nvidia"},
        )
    )
    for app, image in (
        ("aws-node", "602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon-k8s-cni:v1.19.2-eksbuild.1"),
        ("kube-proxy", "602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/kube-proxy:v1.31.3-eksbuild.2"),
    ):
        pods.append(
            _pod(
                ids,
                node,
                name=ids.name(app),
                namespace="kube-system",
                labels={"k8s-app": app},
                owner=("apps/v1", "DaemonSet", app),
                containers=[{"name": app, "image": image, "resources": {"requests": {"cpu": "25m"}}}],
                pod_ip=node.ip,
                started=started - timedelta(seconds=30),
                tolerations=[{"operator": "Exists"}],
                host_network=True,
                extra_spec={"priorityClassName": "system-node-critical"},
            )
        )
    return pods


# A busy node's reasons in code-list order: thresholds crossed, and its GPU-requesting pod (docs/architecture.md §3 keeps
# "every reason from every check, whatever the verdict", so the holder shows even though the GPU is busy).
_BUSY_HOLDER = ("activity_above_threshold", "fb_above_threshold", "power_above_idle", "idle_gpu_holder")

# ----------------------------------------------------------------------------------------------------------
# Demo scenario
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    """Everything a scenario produces before rendering."""

    nodes: list[NodeCast]
    pods: list[Json]
    pdbs: list[Json]
    groups: list[dict[str, Any]]
    notes: list[str]
    power_decimals: int
    nfd_labels: bool
    title: str


def _mng_group(name: str, itype: str, min_size: int, max_size: int, spot: bool = False) -> dict[str, Any]:
    return {"name": name, "itype": itype, "min": min_size, "max": max_size, "spot": spot}


def build_demo(src: Sources, ids: Ids, taken_at: datetime) -> Scenario:
    """The demo cast: one node per behaviour the planner must get right (docs/architecture.md §3, BUG-01/02/04/05)."""
    a10g, l4, a100, h100 = (src.models[k] for k in ("a10g", "l4", "a100", "h100"))
    day = timedelta(days=1)
    nodes: list[NodeCast] = []
    pods: list[Json] = []

    def add(node: NodeCast, devices: list[Device], **kw: Any) -> NodeCast:
        node.devices = devices
        for key, value in kw.items():
            setattr(node, key, value)
        nodes.append(node)
        pods.extend(_daemonset_pods(ids, node, full=True))
        return node

    # --- gpu-a10g (g5.12xlarge, 4× A10G) -----------------------------------------------------------------
    idle1 = add(
        _new_node(ids, taken_at, "g5.12xlarge", owner="mng", group="gpu-a10g", age=41 * day),
        _physical_devices(ids, a10g, 4),
        verdict="idle",
        reasons=("idle_window_clean",),
        why="All 4 A10G idle for the whole window (util 0-2 %, FB 0 MiB, ~27 W), only DaemonSet pods, "
        "energy moving, up == 1, group desired 5 > min 1. It takes the single disruption-budget slot: it saves "
        "the most per hour among the idle nodes ($5.672 vs $1.006 for the gpu-dev g5.xlarge nodes), and it "
        "is the older of the two idle a10g nodes (same price, 0 pods to evict, then oldest).",
    )
    idle2 = add(
        _new_node(ids, taken_at, "g5.12xlarge", owner="mng", group="gpu-a10g", age=9 * day),
        _physical_devices(ids, a10g, 4),
        verdict="protected",
        reasons=("disruption_budget_exhausted",),
        why="Exactly as idle as the first idle node, but max_nodes_per_run = max_nodes_per_node_group = 1: "
        f"the budget slot went to {idle1.name} (older), so this one is idle by metrics yet protected "
        "(docs/architecture.md §3: 'disruption budget used up' is a protected reason).",
    )
    busy = add(
        _new_node(ids, taken_at, "g5.12xlarge", owner="mng", group="gpu-a10g", age=17 * day, az="us-east-1b"),
        _physical_devices(ids, a10g, 4),
        verdict="busy",
        reasons=_BUSY_HOLDER,
    )
    vllm = _workload_pod(
        ids,
        busy,
        namespace="llm-serving",
        app="vllm-llama3-8b",
        owner_kind="ReplicaSet",
        container="vllm",
        image="vllm/vllm-openai:v0.10.1",
        requests={"cpu": "16", "memory": "128Gi"},
        gpu_resource="nvidia.com/gpu",
        gpus=4,
        started=taken_at - 3 * day,
    )
    for dev in busy.devices:
        dev.load = Load(True, 85.0, 20480, ("llm-serving", vllm["metadata"]["name"], "vllm"))
    busy.why = (
        "vLLM (tensor parallel 4) keeps all 4 A10G at ~85 % with 20 GiB FB each. No cheaper shape fits: "
        "4 GPUs × 20480 MiB × 1.2 headroom exceeds the A10G/L4 22888 MiB, and every 4-GPU type with more "
        "memory (g6e.12xlarge, g7.24xlarge, ...) costs more than g5.12xlarge."
    )
    under = add(
        _new_node(ids, taken_at, "g5.12xlarge", owner="mng", group="gpu-a10g", age=23 * day, az="us-east-1b"),
        _physical_devices(ids, a10g, 4, real_uuids=True),
        verdict="underutilized",
        reasons=_BUSY_HOLDER,
    )
    qwen = _workload_pod(
        ids,
        under,
        namespace="llm-serving",
        name="vllm-qwen-7b-6d9f8b7c4-x2k9p",
        app="vllm-qwen-7b",
        owner_kind="ReplicaSet",
        container="vllm",
        image="vllm/vllm-openai:v0.10.1",
        requests={"cpu": "3", "memory": "12Gi"},
        gpu_resource="nvidia.com/gpu",
        gpus=1,
        started=taken_at - 5 * day,
    )
    under.devices[0].load = Load(True, 72.0, 9216, ("llm-serving", qwen["metadata"]["name"], "vllm"))
    under.why = (
        "1 of 4 A10G busy (~72 %, ~9 GiB FB, the pod of the g5 scrape), GPUs 1-3 idle. Peak: 1 active GPU, "
        "9.2 GiB × 1.2 = 11 GiB, requests 3 CPU / 12 Gi: g5.xlarge (1× A10G, 3920m, 14162Mi, $1.006/h) "
        "fits and is cheaper than g5.12xlarge ($5.672/h) → recommend (managed node group)."
    )
    add(
        _new_node(ids, taken_at, "g5.12xlarge", owner="mng", group="gpu-a10g", age=12 * day, az="us-east-1b"),
        _physical_devices(ids, a10g, 4),
        missing_gpus=(2, 3),
        verdict="unknown",
        reasons=("no_series", "coverage_below_min"),
        why="BUG-05: the exporter reports only GPUs 0-1 (GPUs 2-3 dropped after an XID 79 'fallen off the "
        "bus'; the device plugin still advertises 4, so capacity = allocatable = 4). The two visible GPUs "
        "are idle and up == 1, but two expected devices have no series → node coverage 0 → unknown. "
        "Missing is never zero.",
    )

    # --- gpu-l4 (g6.xlarge, 1× L4) ------------------------------------------------------------------------
    nb = add(
        _new_node(ids, taken_at, "g6.xlarge", owner="mng", group="gpu-l4", age=6 * day, subnet=1),
        _physical_devices(ids, l4, 1),
        verdict="protected",
        reasons=("idle_gpu_holder",),
    )
    nb_pod = _workload_pod(
        ids,
        nb,
        namespace="ml-notebooks",
        name="jupyter-alice-0",
        app="jupyter-alice",
        owner_kind="StatefulSet",
        owner_name="jupyter-alice",
        container="notebook",
        image="kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.0",
        requests={"cpu": "1", "memory": "4Gi"},
        gpu_resource="nvidia.com/gpu",
        gpus=1,
        started=taken_at - 2 * day,
        extra_spec={
            "volumes": [
                {"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace-jupyter-alice"}},
            ]
        },
    )
    nb.devices[0].load = Load(False, 0.0, 512, ("ml-notebooks", nb_pod["metadata"]["name"], "notebook"))
    nb.why = (
        "Idle by metrics (util 0-2 %, 512 MiB CUDA context < 1024 MiB, ~18 W) but the Kubeflow notebook "
        "jupyter-alice-0 requests nvidia.com/gpu: 1 → GPU holder (evict_idle_gpu_holders is off)."
    )
    job_node = add(
        _new_node(ids, taken_at, "g6.xlarge", owner="mng", group="gpu-l4", age=5 * day, subnet=1),
        _physical_devices(ids, l4, 1),
        verdict="protected",
        reasons=("running_batch_pod",),
    )
    _workload_pod(
        ids,
        job_node,
        namespace="data",
        name=ids.name("embeddings-backfill-29361840"),
        app="embeddings-backfill",
        owner_kind="Job",
        owner_api="batch/v1",
        owner_name="embeddings-backfill-29361840",
        container="backfill",
        image="python:3.12-slim",
        requests={"cpu": "2", "memory": "6Gi"},
        started=taken_at - timedelta(hours=3),
    )
    job_node.why = (
        "GPU idle, but a CPU-only CronJob pod (owner Job, batch/v1) that tolerates the GPU taint is Running "
        "on it: a running Job pod blocks unless evict_running_jobs. It requests no GPU, so it is not a holder."
    )
    pdb_node = add(
        _new_node(ids, taken_at, "g6.xlarge", owner="mng", group="gpu-l4", age=8 * day, subnet=1),
        _physical_devices(ids, l4, 1),
        verdict="protected",
        reasons=("idle_gpu_holder", "pdb_blocks"),
    )
    rr = _workload_pod(
        ids,
        pdb_node,
        namespace="search",
        app="reranker",
        owner_kind="ReplicaSet",
        container="server",
        image="ghcr.io/huggingface/text-embeddings-inference:1.8",
        requests={"cpu": "1", "memory": "3Gi"},
        gpu_resource="nvidia.com/gpu",
        gpus=1,
        started=taken_at - 4 * day,
    )
    pdb_node.devices[0].load = Load(False, 0.0, 700, ("search", rr["metadata"]["name"], "server"))
    pdb_node.why = (
        "Idle by metrics (a small reranker holds 700 MiB, no traffic) but its single-replica Deployment "
        "pod requests nvidia.com/gpu (idle_gpu_holder) and is matched by PodDisruptionBudget search/reranker "
        "(minAvailable 1, disruptionsAllowed 0 → pdb_blocks). Exactly these two reasons."
    )
    add(
        _new_node(ids, taken_at, "g6.xlarge", owner="mng", group="gpu-l4", age=15 * day, subnet=1),
        _physical_devices(ids, l4, 1),
        exporter_state="frozen",
        verdict="unknown",
        reasons=("exporter_frozen",),
        why="BUG-04: the exporter lost its hostengine and keeps serving the last values: util 0, power and "
        "energy flat to the mJ for the whole window while Prometheus still scrapes it (up == 1, fresh "
        "timestamps). A powered GPU always accumulates energy → frozen → unknown.",
    )

    # --- p4d-mig (p4d.24xlarge spot, MIG mixed: 8 × (3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb)) -----------------
    mig = add(
        _new_node(ids, taken_at, "p4d.24xlarge", owner="mng", group="p4d-mig", age=3 * day, az="us-east-1c"),
        [],
        spot=True,
        mig=True,
        hostname_is_pod=False,
        verdict="busy",
        reasons=(
            "activity_above_threshold",
            "fb_above_threshold",
            "power_above_idle",
            "idle_gpu_holder",
            "running_batch_pod",
            "spot_priced_on_demand",
        ),
    )
    # (requests, owner apiVersion, owner kind, owner name, app label) of the p4d scrape's pods. Requests are
    # sized so no cheaper catalog type fits (Σ ≈ 996 Gi > g7e.24xlarge's 940 Gi): busy, not underutilized.
    mig_meta: dict[str, tuple[dict[str, str], str, str, str, str]] = {
        "bert-finetune-worker-0": (
            {"cpu": "64", "memory": "900Gi"},
            "kubeflow.org/v1",
            "PyTorchJob",
            "bert-finetune",
            "bert-finetune",
        ),
        "sweep-trial-42": ({"cpu": "8", "memory": "64Gi"}, "batch/v1", "Job", "sweep-trial-42", "sweep"),
    }
    for (_gpu, gi), (ns, pod_name, container) in sorted(src.mig_pods.items()):
        slot = next(s for s in src.mig_layout if s.gi_id == gi)
        default = (
            {"cpu": "4", "memory": "16Gi"},
            "apps/v1",
            "ReplicaSet",
            pod_name.rsplit("-", 1)[0],
            pod_name.rsplit("-", 2)[0],
        )
        reqs, api, kind, owner_name, app = mig_meta.get(pod_name, default)
        _workload_pod(
            ids,
            mig,
            namespace=ns,
            name=pod_name,
            app=app,
            owner_kind=kind,
            owner_api=api,
            owner_name=owner_name,
            container=container,
            image="nvcr.io/nvidia/pytorch:25.01-py3"
            if ns != "inference"
            else "nvcr.io/nvidia/tritonserver:25.01",
            requests=reqs,
            gpu_resource=f"nvidia.com/mig-{slot.profile}",
            gpus=1,
            started=taken_at - timedelta(hours=20),
        )
    for gpu in range(8):
        for slot in src.mig_layout:
            used = src.mig_fb_used.get((str(gpu), slot.gi_id), 0)
            workload = src.mig_pods.get((str(gpu), slot.gi_id))
            busy_slot = workload is not None and workload[1] == "bert-finetune-worker-0"
            mig.devices.append(
                Device(
                    gpu,
                    a100.uuids[gpu],
                    a100.pci_bus_ids[gpu],
                    slot.fb_total_mib,
                    Load(busy_slot, 71.0 if busy_slot else 0.0, used, workload),
                    gi_id=slot.gi_id,
                    profile=slot.profile,
                    slices=slot.slices,
                )
            )
    mig.why = (
        "BUG-02: MIG mixed strategy, 32 MIG instances (capacity mig-3g.20gb 8, mig-2g.10gb 8, mig-1g.5gb 16). "
        "GPU 0 / GI 2 (3g.20gb, bert-finetune-worker-0) is ~71 % active in DCGM_FI_PROF_GR_ENGINE_ACTIVE "
        "while DCGM_FI_DEV_GPU_UTIL of every instance is pinned at 0 (ignored on MIG instances, so no "
        "signals_disagree is required); its GPU draws ~190 W. All four pods of the p4d scrape request a MIG "
        "device (holders); the PyTorchJob (kubeflow.org) and the Job (Katib trial) are running batch pods; "
        "the node is spot, priced on demand. Requests (≈ 996 Gi memory) fit no cheaper catalog type."
    )

    # --- Karpenter p5 ------------------------------------------------------------------------------------
    add(
        _new_node(
            ids,
            taken_at,
            "p5.48xlarge",
            owner="karpenter",
            group=None,
            age=2 * day,
            az="us-east-1e",
            subnet=2,
        ),
        _physical_devices(ids, h100, 8, real_uuids=True),
        hostname_is_pod=False,
        verdict="protected",
        reasons=("karpenter_owned",),
        why="The p5 of the real aicr scrape, its vLLM decode worker scaled away: all 8 H100 idle at their "
        "real idle draw (65.7-68.7 W), only DaemonSets. Label karpenter.sh/nodepool=gpu-h100 → Karpenter's "
        "consolidation owns it; we leave it alone.",
    )

    # --- standalone g5.4xlarge ---------------------------------------------------------------------------
    solo = add(
        _new_node(ids, taken_at, "g5.4xlarge", owner="standalone", group=None, age=60 * day, subnet=3),
        _physical_devices(ids, a10g, 1),
        verdict="underutilized",
        reasons=_BUSY_HOLDER,
    )
    emb = _workload_pod(
        ids,
        solo,
        namespace="search",
        app="embedding-api",
        owner_kind="ReplicaSet",
        container="server",
        image="ghcr.io/huggingface/text-embeddings-inference:1.8",
        requests={"cpu": "2", "memory": "8Gi"},
        gpu_resource="nvidia.com/gpu",
        gpus=1,
        started=taken_at - 10 * day,
    )
    solo.devices[0].load = Load(True, 64.0, 6144, ("search", emb["metadata"]["name"], "server"))
    solo.why = (
        "Self-managed g5.4xlarge, not in any Auto Scaling group (absent from autoScalingInstances → "
        "standalone), EC2 tag rightsizer.io/resize=allowed. One A10G ~64 % busy with 6 GiB FB, requests "
        "2 CPU / 8 Gi → g5.xlarge fits ($1.006 < $1.624/h): recommend by default, resize_instance with "
        "allow_resize: true."
    )

    # --- system node group (not a GPU node: must not appear in the plan) --------------------------------
    system = _new_node(ids, taken_at, "m6i.xlarge", owner="mng", group="system", age=90 * day, subnet=4)
    nodes.append(system)
    pods.extend(_system_pods(ids, system, taken_at))

    # --- gpu-dev (g5.xlarge, 1× A10G): the off-hours group of the demo --------------------------------------
    # Drawn after every other node so that adding it left the names and IPs of the older cast unchanged.
    dev_nodes = [
        add(
            _new_node(ids, taken_at, "g5.xlarge", owner="mng", group="gpu-dev", age=age, az=az, subnet=5),
            _physical_devices(ids, a10g, 1),
            verdict="protected",
            reasons=("disruption_budget_exhausted",),
            why=f"Development node, idle for the whole window (one A10G at 0-2 %, FB 0 MiB, ~27 W), only "
            f"DaemonSet pods, group gpu-dev desired 2 > min 0. Idle by metrics, but the single budget slot "
            f"goes to {idle1.name}, which saves more per hour ($5.672 vs $1.006). The demo's off-hours "
            "schedule scales this group to zero and back.",
        )
        for age, az in ((4 * day, "us-east-1a"), (4 * day, "us-east-1b"))
    ]

    pdbs = [
        _pdb(ids, "search", "reranker", {"app": "reranker"}, min_available=1, healthy=1, allowed=0),
        _pdb(ids, "kube-system", "coredns", {"k8s-app": "kube-dns"}, max_unavailable=1, healthy=2, allowed=1),
    ]
    for node in nodes:
        pods.extend(node.workloads)
    groups = [
        _mng_group("gpu-a10g", "g5.12xlarge", 1, 8),
        _mng_group("gpu-l4", "g6.xlarge", 0, 6),
        _mng_group("p4d-mig", "p4d.24xlarge", 0, 2, spot=True),
        _mng_group("system", "m6i.xlarge", 1, 3),
        _mng_group("gpu-dev", "g5.xlarge", 0, 2),
    ]
    notes = [
        f"Two idle a10g nodes compete for one disruption-budget slot: {idle1.name} is chosen (older), "
        f"{idle2.name} is protected with disruption_budget_exhausted. With max_nodes_per_run: 2 and "
        "max_nodes_per_node_group: 2 both would be idle.",
        f"{system.name} (m6i.xlarge, node group system) has no GPU: it must not appear in the plan.",
        f"Node group gpu-dev ({', '.join(n.name for n in dev_nodes)}; g5.xlarge, min 0 / desired 2 / max 2) "
        "is idle by metrics but loses the budget slot to the a10g node (higher price first); `rightsizer "
        "demo` uses it for the off-hours down/up cycle, which restores desired 2 exactly.",
        "Hostname is the exporter pod name on the g5/g6 nodes (BUG-01): join by the `node` label, the "
        "`instance` IP → exporter pod → spec.nodeName, or the `pod` label; never by Hostname. On the p4d and "
        "p5 nodes Hostname is the node name.",
        "Series not attributed to a workload carry the exporter pod's own namespace/pod/container (as in the "
        "real aicr capture); attributed series carry the workload's.",
    ]
    return Scenario(nodes, pods, pdbs, groups, notes, 3, True, "demo")


def _system_pods(ids: Ids, node: NodeCast, taken_at: datetime) -> list[Json]:
    pods = []
    for app in ("aws-node", "kube-proxy"):
        pods.append(
            _pod(
                ids,
                node,
                name=ids.name(app),
                namespace="kube-system",
                labels={"k8s-app": app},
                owner=("apps/v1", "DaemonSet", app),
                containers=[{"name": app, "image": f"{app}:eks", "resources": {"requests": {"cpu": "25m"}}}],
                pod_ip=node.ip,
                started=node.created,
                host_network=True,
                tolerations=[{"operator": "Exists"}],
            )
        )
    for _ in range(2):
        pods.append(
            _pod(
                ids,
                node,
                name=ids.name("coredns-5b9dfbf96"),
                namespace="kube-system",
                labels={"k8s-app": "kube-dns"},
                owner=("apps/v1", "ReplicaSet", "coredns-5b9dfbf96"),
                containers=[
                    {
                        "name": "coredns",
                        "image": "coredns:v1.11.4-eksbuild.2",
                        "resources": {"requests": {"cpu": "100m", "memory": "70Mi"}},
                    }
                ],
                pod_ip=ids.ip(node_subnet(node)),
                started=taken_at - timedelta(days=30),
            )
        )
    return pods


def _pdb(
    ids: Ids,
    namespace: str,
    name: str,
    selector: dict[str, str],
    *,
    min_available: int | None = None,
    max_unavailable: int | None = None,
    healthy: int,
    allowed: int,
) -> Json:
    spec: Json = {"selector": {"matchLabels": selector}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    desired = min_available if min_available is not None else healthy - (max_unavailable or 0)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"generation": 1, "name": name, "namespace": namespace, "uid": ids.uuid()},
        "spec": spec,
        "status": {
            "conditions": [
                {
                    "status": "True" if allowed else "False",
                    "type": "DisruptionAllowed",
                    "reason": "SufficientPods" if allowed else "InsufficientPods",
                }
            ],
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "expectedPods": healthy,
            "observedGeneration": 1,
        },
    }


# ----------------------------------------------------------------------------------------------------------
# Scale scenario
# ----------------------------------------------------------------------------------------------------------


def build_scale(src: Sources, ids: Ids, taken_at: datetime, n_nodes: int) -> Scenario:
    """``n_nodes`` p4d.24xlarge (8× A100, MIG off) in managed node groups of ≤ 50: ~70 % idle, ~18 % busy,
    ~6 % underutilized, ~6 % unknown (frozen exporter, or exporter down for the last 12 minutes)."""
    a100 = src.models["a100"]
    rng = ids.rng
    nodes: list[NodeCast] = []
    pods: list[Json] = []
    groups: list[dict[str, Any]] = []
    group_size = 50
    for g in range((n_nodes + group_size - 1) // group_size):
        groups.append(_mng_group(f"gpu-p4d-{g:03d}", "p4d.24xlarge", 0, group_size + 10))
    for i in range(n_nodes):
        group = groups[i // group_size]["name"]
        age = timedelta(days=rng.randint(1, 60), seconds=rng.randint(0, 86_399))
        node = _new_node(
            ids,
            taken_at,
            "p4d.24xlarge",
            owner="mng",
            group=group,
            age=age,
            az=("us-east-1a", "us-east-1b", "us-east-1c")[i % 3],
            subnet=16 + (i % 16),
        )
        node.devices = _physical_devices(ids, a100, 8)
        pods.extend(_daemonset_pods(ids, node, full=False))
        roll = rng.random()
        if roll < 0.70:
            node.verdict, node.reasons = "idle", ("idle_window_clean",)
        elif roll < 0.88:
            node.verdict, node.reasons = "busy", (*_BUSY_HOLDER, "running_batch_pod")
            pod = _workload_pod(
                ids,
                node,
                namespace="training",
                app=f"llm-pretrain-{i:05d}",
                owner_kind="PyTorchJob",
                owner_api="kubeflow.org/v1",
                owner_name=f"llm-pretrain-{i:05d}",
                container="pytorch",
                name=f"llm-pretrain-{i:05d}-worker-0",
                image="nvcr.io/nvidia/pytorch:25.01-py3",
                requests={"cpu": "80", "memory": "900Gi"},
                gpu_resource="nvidia.com/gpu",
                gpus=8,
                started=taken_at - timedelta(hours=rng.randint(2, 40)),
            )
            # All 8 GPUs at ≥ 38 GiB: 8 × 38 GiB × 1.2 fits no cheaper catalog type, so busy, not underutilized.
            for dev in node.devices:
                dev.load = Load(
                    True,
                    rng.uniform(75, 92),
                    rng.randint(38_000, 39_800),
                    ("training", pod["metadata"]["name"], "pytorch"),
                )
        elif roll < 0.94:
            node.verdict, node.reasons = "underutilized", _BUSY_HOLDER
            pod = _workload_pod(
                ids,
                node,
                namespace="inference",
                app=f"embedder-{i:05d}",
                owner_kind="ReplicaSet",
                container="server",
                image="nvcr.io/nvidia/tritonserver:25.01",
                requests={"cpu": "2", "memory": "8Gi"},
                gpu_resource="nvidia.com/gpu",
                gpus=1,
                started=taken_at - timedelta(days=1),
            )
            node.devices[0].load = Load(
                True,
                rng.uniform(60, 80),
                rng.randint(9_000, 10_500),
                ("inference", pod["metadata"]["name"], "server"),
            )
        elif roll < 0.97:
            node.exporter_state = "frozen"
            node.verdict, node.reasons = "unknown", ("exporter_frozen",)
        else:
            node.exporter_state, node.down_seconds = "down", 720
            node.verdict, node.reasons = "unknown", ("coverage_below_min", "stale_metrics")
        nodes.append(node)
        pods.extend(node.workloads)
    # The planner chooses one idle node per run (default budget): highest price, fewest pods, oldest, name.
    idle = sorted((n for n in nodes if n.verdict == "idle"), key=lambda n: (n.created, n.name))
    for n in idle[1:]:
        n.verdict, n.reasons = "protected", ("disruption_budget_exhausted",)
    notes = [
        f"{n_nodes} p4d.24xlarge nodes × 8 A100 = {8 * n_nodes} devices per DCGM metric, "
        f"{len(groups)} managed node groups of ≤ {group_size}.",
        "Idle by metrics: ~70 %; under the default budget (1 node per run) only the oldest is `idle`, the "
        "rest are `protected` (disruption_budget_exhausted).",
        "Unknown: frozen exporters (flat energy), and exporters down for the last 12 minutes (up 0, series "
        "end, coverage 0.6, newest sample 12 min old).",
        "Power is rounded to 0.1 W to keep the files small.",
    ]
    return Scenario(nodes, pods, [], groups, notes, 1, False, "scale")


# ----------------------------------------------------------------------------------------------------------
# Kubernetes and AWS objects
# ----------------------------------------------------------------------------------------------------------


def _node_object(src: Sources, node: NodeCast, ids: Ids, nfd: bool, taken_at: datetime) -> Json:
    """A Node derived from the packaged node JSON of the same family, renamed and made consistent."""
    it = node.itype
    tpl = src.node_templates[it.template]
    obj: Json = json.loads(json.dumps(tpl))
    meta, labels = obj["metadata"], obj["metadata"]["labels"]
    meta["name"] = node.name
    meta["uid"] = ids.uuid()
    meta["resourceVersion"] = str(ids.rng.randint(1_000_000, 99_999_999))
    meta["creationTimestamp"] = _ts(node.created)
    ann = meta.setdefault("annotations", {})
    ann["alpha.kubernetes.io/provided-node-ip"] = node.ip
    if "csi.volume.kubernetes.io/nodeid" in ann:
        ann["csi.volume.kubernetes.io/nodeid"] = json.dumps({"ebs.csi.aws.com": node.instance_id})
    zone_id = {"a": "use1-az1", "b": "use1-az2", "c": "use1-az6", "e": "use1-az3"}[node.az[-1]]
    for key in ("failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone"):
        labels[key] = node.az
    labels["topology.k8s.aws/zone-id"] = zone_id
    if "topology.ebs.csi.aws.com/zone" in labels:
        labels["topology.ebs.csi.aws.com/zone"] = node.az
    labels["topology.kubernetes.io/region"] = REGION
    labels["failure-domain.beta.kubernetes.io/region"] = REGION
    labels["kubernetes.io/hostname"] = node.name
    labels["node.kubernetes.io/instance-type"] = it.name
    labels["beta.kubernetes.io/instance-type"] = it.name
    if node.owner == "mng":
        labels["eks.amazonaws.com/nodegroup"] = node.group
        labels["eks.amazonaws.com/capacityType"] = "SPOT" if node.spot else "ON_DEMAND"
        if "alpha.eksctl.io/nodegroup-name" in labels:
            labels["alpha.eksctl.io/nodegroup-name"] = node.group
    else:
        for key in [k for k in labels if k.startswith(("eks.amazonaws.com/", "alpha.eksctl.io/"))]:
            del labels[key]
    if it.model is None:
        for key in [
            k for k in labels if k.startswith(("nvidia.com/", "feature.node.kubernetes.io/pci-10de"))
        ]:
            del labels[key]
        labels["workload"] = "system"
        obj["spec"].pop("taints", None)
    elif it.model in _GPU_LABELS:
        gl = _GPU_LABELS[it.model]
        labels["nvidia.com/gpu.count"] = str(it.gpus)
        labels["nvidia.com/gpu.product"] = gl["product"]
        labels["nvidia.com/gpu.family"] = gl["family"]
        labels["nvidia.com/gpu.memory"] = gl["memory"]
        labels["nvidia.com/gpu.compute.major"] = gl["major"]
        labels["nvidia.com/gpu.compute.minor"] = gl["minor"]
    if it.model is not None:
        labels["nvidia.com/gpu.machine"] = it.name
    if it.template == "p4d" and not node.mig:
        # The template is MIG mixed; a scale node runs with MIG disabled (whole GPUs).
        for key in [k for k in labels if k.startswith("nvidia.com/mig-")]:
            del labels[key]
        labels["nvidia.com/mig.config"] = "all-disabled"
        labels["nvidia.com/mig.strategy"] = "single"
        labels["eks.amazonaws.com/capacityType"] = "ON_DEMAND"
    if nfd and it.template in ("p4d", "p5"):
        labels.update(src.nfd_cpu_labels)
    obj["spec"]["providerID"] = f"aws:///{node.az}/{node.instance_id}"
    status = obj["status"]
    status["addresses"] = [
        {"address": node.ip, "type": "InternalIP"},
        {"address": node.name, "type": "InternalDNS"},
        {"address": node.name, "type": "Hostname"},
    ]
    mem_ki = it.memory_gib * 1024 * 1024 * 972 // 1000  # what the kernel reports of the instance's RAM
    capacity = {k: v for k, v in status["capacity"].items() if not k.startswith("nvidia.com/")}
    capacity.update({"cpu": str(it.vcpu), "memory": f"{mem_ki}Ki", "pods": str(it.max_pods)})
    allocatable = {k: v for k, v in status["allocatable"].items() if not k.startswith("nvidia.com/")}
    allocatable.update(
        {
            "cpu": it.allocatable_cpu,
            "memory": f"{it.allocatable_memory_mi * 1024}Ki",
            "pods": str(it.max_pods),
        }
    )
    if it.gpus:
        gpu_res: dict[str, str] = {}
        if node.mig:
            gpu_res = {k: v for k, v in status["capacity"].items() if k.startswith("nvidia.com/")}
        else:
            gpu_res = {"nvidia.com/gpu": str(it.gpus)}
        capacity.update(gpu_res)
        allocatable.update(gpu_res)
    if it.template == "g5":
        # g5/g6 have no EFA on these sizes; p4d/p5 keep the template's vpc.amazonaws.com/efa.
        capacity.pop("vpc.amazonaws.com/efa", None)
        allocatable.pop("vpc.amazonaws.com/efa", None)
    status["capacity"], status["allocatable"] = capacity, allocatable
    heartbeat = _ts(taken_at - timedelta(seconds=25))
    for cond in status["conditions"]:
        cond["lastHeartbeatTime"] = heartbeat
        cond["lastTransitionTime"] = _ts(
            node.created + timedelta(seconds=5 if cond["type"] != "Ready" else 27)
        )
    info = status["nodeInfo"]
    info["bootID"] = ids.uuid()
    info["machineID"] = f"ec2{ids.hex(29)}"
    info["systemUUID"] = f"ec2{ids.uuid()[3:]}"
    return obj


def _nodegroup_objects(
    src: Sources, scenario: Scenario, taken_at: datetime, ids: Ids
) -> tuple[list[Json], list[Json], list[Json]]:
    """EKS DescribeNodegroup objects, their Auto Scaling groups and the DescribeAutoScalingInstances answer."""
    nodegroups: list[Json] = []
    asgs: list[Json] = []
    asg_instances: list[Json] = []
    for group in scenario.groups:
        name, itype = group["name"], group["itype"]
        members = sorted((n for n in scenario.nodes if n.group == name), key=lambda n: n.name)
        ng_uuid = ids.uuid()
        asg_name = f"eks-{name}-{ng_uuid}"
        created = min(n.created for n in members) - timedelta(minutes=4)
        lt = {
            "LaunchTemplateId": f"lt-0{ids.hex(16)}",
            "LaunchTemplateName": f"eks-{ng_uuid}",
            "Version": "1",
        }
        ng: Json = json.loads(json.dumps(src.nodegroup_template))
        ng.update(
            {
                "nodegroupName": name,
                "nodegroupArn": f"arn:aws:eks:{REGION}:{ACCOUNT}:nodegroup/{CLUSTER}/{name}/{ng_uuid}",
                "clusterName": CLUSTER,
                "createdAt": created.isoformat(timespec="microseconds"),
                "modifiedAt": (taken_at - timedelta(days=1)).isoformat(timespec="microseconds"),
                "capacityType": "SPOT" if group["spot"] else "ON_DEMAND",
                "scalingConfig": {
                    "minSize": group["min"],
                    "maxSize": group["max"],
                    "desiredSize": len(members),
                },
                "instanceTypes": [itype],
                "resources": {"autoScalingGroups": [{"name": asg_name}]},
                "launchTemplate": {
                    "id": lt["LaunchTemplateId"],
                    "name": lt["LaunchTemplateName"],
                    "version": "1",
                },
            }
        )
        if INSTANCE_TYPES[itype].model is None:
            ng["amiType"] = "AL2023_x86_64_STANDARD"
            ng["labels"] = {"workload": "system"}
            ng["taints"] = []
        nodegroups.append(ng)
        instances = [
            {
                "AvailabilityZone": n.az,
                "HealthStatus": "Healthy",
                "InstanceId": n.instance_id,
                "InstanceType": itype,
                "LaunchTemplate": lt,
                "LifecycleState": "InService",
                "ProtectedFromScaleIn": False,
            }
            for n in members
        ]
        tags = {
            "eks:cluster-name": CLUSTER,
            "eks:nodegroup-name": name,
            "k8s.io/cluster-autoscaler/enabled": "true",
            f"k8s.io/cluster-autoscaler/{CLUSTER}": "owned",
            f"kubernetes.io/cluster/{CLUSTER}": "owned",
        }
        asgs.append(
            {
                "AutoScalingGroupARN": f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:{ids.uuid()}:"
                f"autoScalingGroupName/{asg_name}",
                "AutoScalingGroupName": asg_name,
                "AvailabilityZones": sorted({n.az for n in members}),
                "CapacityRebalance": bool(group["spot"]),
                "CreatedTime": _aws_ts(created),
                "DefaultCooldown": 300,
                "DesiredCapacity": len(members),
                "EnabledMetrics": [],
                "HealthCheckGracePeriod": 15,
                "HealthCheckType": "EC2",
                "Instances": instances,
                "LoadBalancerNames": [],
                "MaxSize": group["max"],
                "MinSize": group["min"],
                "MixedInstancesPolicy": {
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": lt,
                        "Overrides": [{"InstanceType": itype}],
                    },
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": 0,
                        "OnDemandPercentageAboveBaseCapacity": 0 if group["spot"] else 100,
                        "SpotAllocationStrategy": "capacity-optimized",
                    },
                },
                "NewInstancesProtectedFromScaleIn": False,
                "ServiceLinkedRoleARN": f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/"
                "autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
                "SuspendedProcesses": [],
                "Tags": [
                    {
                        "Key": k,
                        "PropagateAtLaunch": True,
                        "ResourceId": asg_name,
                        "ResourceType": "auto-scaling-group",
                        "Value": v,
                    }
                    for k, v in sorted(tags.items())
                ],
                "TargetGroupARNs": [],
                "TerminationPolicies": ["AllocationStrategy", "OldestLaunchTemplate", "OldestInstance"],
                "VPCZoneIdentifier": "subnet-0a1b2c3d4e5f60001,subnet-0a1b2c3d4e5f60002",
            }
        )
        asg_instances.extend(
            {
                "AutoScalingGroupName": asg_name,
                "AvailabilityZone": n.az,
                "HealthStatus": "HEALTHY",
                "InstanceId": n.instance_id,
                "InstanceType": itype,
                "LaunchTemplate": lt,
                "LifecycleState": "InService",
                "ProtectedFromScaleIn": False,
            }
            for n in members
        )
    return nodegroups, asgs, asg_instances


def _reservations(scenario: Scenario, ids: Ids, asg_names: dict[str, str]) -> list[Json]:
    """EC2 DescribeInstances reservations, one per instance, tagged the way EKS/Karpenter tag them."""
    reservations = []
    for n in sorted(scenario.nodes, key=lambda n: n.name):
        tags = {"Name": n.name, f"kubernetes.io/cluster/{CLUSTER}": "owned"}
        if n.owner == "mng" and n.group:
            tags.update(
                {
                    "aws:autoscaling:groupName": asg_names[n.group],
                    "eks:cluster-name": CLUSTER,
                    "eks:nodegroup-name": n.group,
                }
            )
        elif n.owner == "karpenter":
            tags.update(
                {
                    "eks:eks-cluster-name": CLUSTER,
                    "karpenter.k8s.aws/ec2nodeclass": "gpu",
                    "karpenter.sh/nodeclaim": ids.name("gpu-h100"),
                    "karpenter.sh/nodepool": "gpu-h100",
                }
            )
        else:
            tags["rightsizer.io/resize"] = "allowed"
        instance: Json = {
            "AmiLaunchIndex": 0,
            "Architecture": "x86_64",
            "ImageId": f"ami-0{ids.hex(16)}",
            "InstanceId": n.instance_id,
            "InstanceType": n.itype.name,
            "LaunchTime": _aws_ts(n.created - timedelta(seconds=70)),
            "Placement": {"AvailabilityZone": n.az, "Tenancy": "default"},
            "PrivateDnsName": n.name,
            "PrivateIpAddress": n.ip,
            "RootDeviceName": "/dev/xvda",
            "RootDeviceType": "ebs",
            "State": {"Code": 16, "Name": "running"},
            "SubnetId": "subnet-0a1b2c3d4e5f60001",
            "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())],
            "VpcId": "vpc-0a1b2c3d4e5f60001",
        }
        if n.spot:
            instance["InstanceLifecycle"] = "spot"
        reservations.append(
            {"Groups": [], "Instances": [instance], "OwnerId": ACCOUNT, "ReservationId": f"r-0{ids.hex(16)}"}
        )
    return reservations


# ----------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------


def _fmt(value: float, decimals: int) -> str:
    """A value as Prometheus renders it (Go FormatFloat 'f', -1: no trailing zeros), at fixed precision."""
    if decimals == 0:
        return str(round(value))
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return text if text != "-0" else "0"


class _Formatter:
    """``_fmt`` memoised on the rounded value: a 5,000-node run formats millions of repeating values."""

    def __init__(self, decimals: int) -> None:
        self.decimals = decimals
        self.scale = 10**decimals
        self.cache: dict[int, str] = {}

    def __call__(self, value: float) -> str:
        units = round(value * self.scale)
        text = self.cache.get(units)
        if text is None:
            text = self.cache[units] = _fmt(units / self.scale, self.decimals)
        return text


def _ts_json(ms: int) -> str:
    """A timestamp as Prometheus' MarshalTimestamp writes it: seconds, ``.mmm`` only when not whole."""
    sec, frac = divmod(ms, 1000)
    return str(sec) if frac == 0 else f"{sec}.{frac:03d}"


def _ts_value(ms: int) -> str:
    """``timestamp()``'s value (seconds as a float), as Prometheus formats sample values."""
    sec, frac = divmod(ms, 1000)
    return str(sec) if frac == 0 else f"{sec}.{frac:03d}".rstrip("0")


class MatrixWriter:
    """Collects series for one query_range matrix and writes it exactly as ``json.dumps(sort_keys=True)``
    would, but without building per-point Python lists (5,000 nodes × 8 GPUs stay fast)."""

    def __init__(self) -> None:
        self.series: list[tuple[str, str]] = []

    def add(self, metric_json: str, prefixes: Sequence[str], values: Sequence[str]) -> None:
        """Add one series: its labels as sorted compact JSON, ``prefixes[i]`` = ``[<ts>,"`` of ``values[i]``."""
        if not values:
            return
        body = ",".join([p + v + '"]' for p, v in zip(prefixes, values, strict=True)])
        self.series.append((metric_json, '{"metric":' + metric_json + ',"values":[' + body + "]}"))

    def write(self, path: Path) -> None:
        """Write the response, series in Prometheus' matrix order (by label set).

        Sorting on the sorted-key JSON of the labels gives the same order as comparing label pairs: names
        and values are plain ASCII and the closing quote sorts before every character they contain.
        """
        self.series.sort(key=lambda item: item[0])
        with path.open("w", encoding="utf-8") as fh:
            fh.write('{"data":{"result":[')
            fh.write(",".join(s for _, s in self.series))
            fh.write('],"resultType":"matrix"},"status":"success"}')


def _target_labels(node: NodeCast) -> dict[str, str]:
    """Labels Prometheus adds to every series of the node's exporter target (ServiceMonitor + relabel)."""
    return {
        "endpoint": "gpu-metrics",
        "instance": f"{node.exporter_ip}:9400",
        "job": EXPORTER_JOB,
        "node": node.name,
        "service": EXPORTER_JOB,
    }


def _device_labels(node: NodeCast, dev: Device, model: GpuModel, *, instance_level: bool) -> dict[str, str]:
    labels = _target_labels(node)
    labels.update(
        {
            "DCGM_FI_DRIVER_VERSION": model.driver,
            "Hostname": node.exporter_pod if node.hostname_is_pod else node.name,
            "UUID": dev.uuid,
            "device": f"nvidia{dev.gpu}",
            "gpu": str(dev.gpu),
            "modelName": model.model_name,
            "pci_bus_id": dev.pci_bus_id,
        }
    )
    if instance_level and dev.gi_id is not None:
        labels["GPU_I_ID"] = dev.gi_id
        labels["GPU_I_PROFILE"] = dev.profile or ""
    workload = dev.load.workload if instance_level or not node.mig else None
    # Attributed series carry the workload's namespace/pod/container; the others keep the exporter
    # target's own (as the real aicr capture shows), so a pod-label join still lands on the right node.
    ns, pod, container = workload or (EXPORTER_NS, node.exporter_pod, "nvidia-dcgm-exporter")
    labels.update({"namespace": ns, "pod": pod, "container": container})
    return labels


class LabelJson:
    """Sorted compact JSON of one label set, with ``__name__`` spliced in per metric.

    ``__name__`` sorts after the upper-case DCGM/``Hostname``/``UUID`` names and before the lower-case ones,
    so one ``json.dumps`` per device serves every metric (json.dumps dominated 5,000-node runs).
    """

    def __init__(self, labels: dict[str, str]) -> None:
        head = {k: v for k, v in labels.items() if k < "__name__"}
        tail = {k: v for k, v in labels.items() if k > "__name__"}
        self.head = json.dumps(head, sort_keys=True, separators=(",", ":"))[:-1] if head else "{"
        self.tail = json.dumps(tail, sort_keys=True, separators=(",", ":"))[1:] if tail else "}"

    def named(self, name: str) -> str:
        """The JSON with ``"__name__": name``."""
        sep_head = "," if self.head != "{" else ""
        sep_tail = "," if self.tail != "}" else ""
        return f'{self.head}{sep_head}"__name__":"{name}"{sep_tail}{self.tail}'

    def plain(self) -> str:
        """The JSON without ``__name__`` (functions such as ``timestamp()`` drop it)."""
        if self.head == "{" or self.tail == "}":
            return self.head + self.tail
        return self.head + "," + self.tail


_PROF_FMT = _Formatter(4)


def _series_for_device(
    rng: random.Random, dev: Device, model: GpuModel, n: int, frozen: bool
) -> dict[str, list[str]]:
    """Per-step value strings of the per-device metrics (activity, FB) for one device."""
    load = dev.load
    total = dev.fb_total_mib
    if frozen:
        return {
            "DCGM_FI_DEV_GPU_UTIL": ["0"] * n,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ["0"] * n,
            "DCGM_FI_DEV_FB_USED": [str(load.fb_used_mib)] * n,
            "DCGM_FI_DEV_FB_FREE": [str(total - load.fb_used_mib)] * n,
        }
    if load.busy:
        util = [max(60, min(99, round(rng.gauss(load.activity_pct, 4.0)))) for _ in range(n)]
        # GR_ENGINE_ACTIVE runs a few points under GPU_UTIL (the g5 scrape: 87 % vs 0.812).
        prof = [u * rng.uniform(0.90, 0.97) / 100 for u in util]
        fb = [max(0, min(total, load.fb_used_mib + int(rng.random() * 193) - 96)) for _ in range(n)]
    else:
        util = rng.choices((0, 1, 2), weights=(85, 10, 5), k=n)
        prof = [u * rng.uniform(0.4, 0.9) / 100 + int(rng.random() * 9) / 10_000 for u in util]
        # An idle process keeps its allocation; only a held context wobbles by a few MiB.
        held = load.fb_used_mib
        fb = [held + int(rng.random() * 5) for _ in range(n)] if held else [0] * n
    # BUG-02: on MIG instances the driver reports no utilization; dcgm-exporter pins it at 0.
    util_s = ["0"] * n if dev.gi_id is not None else [str(u) for u in util]
    return {
        "DCGM_FI_DEV_GPU_UTIL": util_s,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [_PROF_FMT(p) for p in prof],
        "DCGM_FI_DEV_FB_USED": [str(f) for f in fb],
        "DCGM_FI_DEV_FB_FREE": [str(total - f) for f in fb],
    }


def _power_series(
    rng: random.Random, node: NodeCast, model: GpuModel, gpu: int, devices: list[Device], n: int
) -> list[float]:
    """DCGM_FI_DEV_POWER_USAGE (W) per step of one physical GPU, from the activity of its devices."""
    idle_base = model.idle_power_w[gpu % len(model.idle_power_w)] + rng.uniform(-1.0, 1.0)
    held = any(d.load.fb_used_mib and not d.load.busy for d in devices)
    base = idle_base + (2.0 if held else 0.0)  # a live CUDA context keeps the clocks up a little
    span = model.max_power_w - idle_base
    busy = [d for d in devices if d.load.busy]
    out = []
    for _ in range(n):
        watts = base + rng.uniform(-0.9, 0.9)
        for d in busy:
            share = d.slices / 7 if d.gi_id is not None else 1.0
            scale = (
                1.25 if d.gi_id is not None else 0.7
            )  # a busy MIG slice pulls its memory/clock domains too
            watts += span * share * scale * rng.gauss(d.load.activity_pct, 3.0) / 100
        out.append(min(watts, model.max_power_w))
    return out


def render_metrics(
    scenario: Scenario,
    src: Sources,
    rng: random.Random,
    taken_at: datetime,
    window_s: int,
    step_s: int,
    out: Path,
) -> None:
    """Write ``metrics/*.json`` for every GPU node of the scenario.

    Each file is a ``/api/v1/query_range`` response ``{"status": "success", "data": {"resultType":
    "matrix", "result": [{"metric": {labels}, "values": [[<unix s>, "<value>"], ...]}]}}`` with points at
    taken_at − window, …, taken_at (window / step + 1). Per device (physical GPU, or MIG instance with
    ``GPU_I_ID``/``GPU_I_PROFILE``):

    - ``DCGM_FI_DEV_GPU_UTIL`` (field 203, gauge, %): 0–2 idle, 60–99 busy; pinned at 0 on MIG instances.
    - ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (field 1001, gauge, ratio 0..1): a few points under GPU_UTIL / 100;
      the only activity signal of a MIG instance.
    - ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (fields 252 / 251, gauge, MiB): used + free = the
      device's framebuffer.

    Per physical GPU (no ``GPU_I_*`` labels, as dcgm-exporter reports them on MIG GPUs too):

    - ``DCGM_FI_DEV_POWER_USAGE`` (field 155, gauge, W): idle draw ±2 W plus the load of its devices.
    - ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (field 156, counter, mJ): the trapezoid integral of power,
      strictly increasing; flat (like power) when the exporter is frozen.

    Per exporter target: ``up`` (1, or 0 once an exporter is down). ``DCGM_FI_DEV_GPU_UTIL.timestamp.json``
    holds ``timestamp(DCGM_FI_DEV_GPU_UTIL)``: the raw 15 s scrape time behind each step (no ``__name__``).
    A down exporter's series end at its last scrape (Prometheus stale markers); missing GPUs have none.
    """
    end_ms = int(taken_at.timestamp() * 1000)
    n = window_s // step_s + 1
    steps = [end_ms - (n - 1 - i) * step_s * 1000 for i in range(n)]
    prefixes = ["[" + _ts_json(t) + ',"' for t in steps]
    writers = {m: MatrixWriter() for m in (*METRIC_FILES, "timestamp")}
    power_fmt = _Formatter(scenario.power_decimals)
    for node in sorted(scenario.nodes, key=lambda x: x.name):
        if not node.itype.gpus:
            continue
        model = src.models[node.itype.model or ""]
        # Fixed scrape phase per target: with a 15 s interval and a 60 s step the lag is the same each step.
        node.lag_ms = rng.randint(1_200, 13_800)
        live = n
        if node.exporter_state == "down":
            # Stale markers end every series at the first failed scrape: no lookback stretch.
            live = sum(1 for t in steps if t - node.lag_ms < end_ms - node.down_seconds * 1000)
        frozen = node.exporter_state == "frozen"
        up_labels = _target_labels(node) | {
            "container": "nvidia-dcgm-exporter",
            "namespace": EXPORTER_NS,
            "pod": node.exporter_pod,
        }
        writers["up"].add(LabelJson(up_labels).named("up"), prefixes, ["1"] * live + ["0"] * (n - live))
        sample_times = [_ts_value(t - node.lag_ms) for t in steps[:live]]
        by_gpu: dict[int, list[Device]] = {}
        for dev in node.devices:
            by_gpu.setdefault(dev.gpu, []).append(dev)
        for gpu, devices in sorted(by_gpu.items()):
            if gpu in node.missing_gpus:
                continue
            for dev in devices:
                values = _series_for_device(rng, dev, model, n, frozen)
                labels = LabelJson(_device_labels(node, dev, model, instance_level=True))
                for metric, series in values.items():
                    writers[metric].add(labels.named(metric), prefixes[:live], series[:live])
                writers["timestamp"].add(labels.plain(), prefixes[:live], sample_times)
            phys_labels = LabelJson(_device_labels(node, devices[0], model, instance_level=False))
            power = _power_series(rng, node, model, gpu, devices, n)
            uptime_s = (taken_at - node.created).total_seconds() - window_s
            energy = int(uptime_s * (power[0] + 4.0) * 1000 * rng.uniform(0.9, 1.1))
            energies = []
            for i in range(n):
                if i:
                    energy += round((power[i - 1] + power[i]) / 2 * step_s * 1000)
                energies.append(energy)
            if frozen:
                power = [power[0]] * n
                energies = [energies[0]] * n
            writers["DCGM_FI_DEV_POWER_USAGE"].add(
                phys_labels.named("DCGM_FI_DEV_POWER_USAGE"),
                prefixes[:live],
                [power_fmt(p) for p in power[:live]],
            )
            writers["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].add(
                phys_labels.named("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
                prefixes[:live],
                [str(e) for e in energies[:live]],
            )
    metrics_dir = out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for metric in METRIC_FILES:
        writers[metric].write(metrics_dir / f"{metric}.json")
    writers["timestamp"].write(metrics_dir / f"{TIMESTAMP_METRIC}.timestamp.json")


# ----------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------


def _dump(pretty: bool, path: Path, obj: Any) -> None:
    # Indented output goes through json's pure-Python encoder; large (scale) snapshots stay compact.
    text = json.dumps(obj, indent=2, sort_keys=True) if pretty else json.dumps(obj, sort_keys=True)
    path.write_text(text + "\n", encoding="utf-8")


def _k8s_list(items: list[Json]) -> Json:
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def _provenance(scenario: Scenario, taken_at: datetime, window_s: int, step_s: int, seed: int) -> str:
    gpu_nodes = [n for n in sorted(scenario.nodes, key=lambda n: n.name) if n.itype.gpus]
    lines = [
        f"# Example snapshot `{scenario.title}` — provenance and intended verdicts",
        "",
        "Generated by `python -m tests.support.examplegen "
        f"--scenario {scenario.title} --seed {seed}` (taken_at {_ts(taken_at)}, window {window_s} s, step "
        f"{step_s} s). Do not edit by hand: regenerate.",
        "",
        "Sources (see `tests/fixtures/sources/PROVENANCE.md`): DCGM label sets, driver versions, PCI bus "
        "ids, idle power and the MIG layout come from the real p5/H100 scrape (NVIDIA/aicr, Apache-2.0), the "
        "real A100 MIG scrape (NVIDIA/cloud-native-docs, Apache-2.0) and our reconstructed g5/A10G and "
        "p4d/MIG scrapes; node objects are derived from our node JSONs; the nodegroup shape from our "
        "constructed DescribeNodegroup. Values over time are seeded jitter around them, not recordings.",
        "",
        "Verdicts assume the default policy (docs/architecture.md §5): idle window 30 m, activity ≤ 5 %, FB ≤ 1024 MiB, "
        "packaged idle-power ceilings, min_coverage 0.9, max_sample_age 5 m, max_nodes_per_run 1, "
        "max_nodes_per_node_group 1. `expected.json` lists reason codes; a reason `code:detail` matches `code`.",
        "",
    ]
    if scenario.title == "demo":
        lines += ["| node | type | group | verdict | reasons | why |", "|---|---|---|---|---|---|"]
        for n in gpu_nodes:
            group = n.group or ("karpenter nodepool gpu-h100" if n.owner == "karpenter" else "standalone")
            lines.append(
                f"| `{n.name}` | {n.itype.name} | {group} | **{n.verdict}** | "
                f"{', '.join(f'`{r}`' for r in n.reasons)} | {n.why} |"
            )
    else:
        counts: dict[str, int] = {}
        for n in gpu_nodes:
            counts[n.verdict] = counts.get(n.verdict, 0) + 1
        lines += ["| verdict | nodes |", "|---|---|"]
        lines += [f"| {v} | {c} |" for v, c in sorted(counts.items())]
    lines += ["", "Notes:", ""] + [f"- {note}" for note in scenario.notes] + [""]
    return "\n".join(lines)


def generate_snapshot(
    out_dir: Path,
    *,
    scenario: str = "demo",
    nodes: int | None = None,
    seed: int = 7,
    taken_at: datetime = DEFAULT_TAKEN_AT,
    window_seconds: int = 1800,
    step_seconds: int = 60,
) -> Path:
    """Generate a snapshot directory (docs/architecture.md §5) and return its path.

    Args:
        out_dir: directory to write (created; files of the same names are overwritten).
        scenario: ``"demo"`` (the fixed 15-node cast of the committed example; ``nodes`` must be ``None``
            or 15) or ``"scale"`` (``nodes`` p4d.24xlarge × 8 A100, default 100, for benchmarks).
        nodes: node count of the scale scenario.
        seed: seed of the single ``random.Random`` every value is drawn from.
        taken_at: end of the window, timezone-aware (UTC is written).
        window_seconds: the query_range window W (s); W / step + 1 points per live series.
        step_seconds: the query_range step (s); must divide ``window_seconds``.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: unknown scenario, bad node count, naive ``taken_at`` or a step that does not divide W.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, not {scenario!r}")
    if taken_at.tzinfo is None:
        raise ValueError("taken_at must be timezone-aware")
    if step_seconds <= 0 or window_seconds <= 0 or window_seconds % step_seconds:
        raise ValueError("step_seconds must be > 0 and divide window_seconds")
    rng = random.Random(seed)
    ids = Ids(rng)
    src = load_sources()
    if scenario == "demo":
        built = build_demo(src, ids, taken_at)
        if nodes is not None and nodes != len(built.nodes):
            raise ValueError(f"the demo scenario has exactly {len(built.nodes)} nodes; use --scenario scale")
    else:
        count = 100 if nodes is None else nodes
        if count < 1:
            raise ValueError("nodes must be >= 1")
        built = build_scale(src, ids, taken_at, count)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pretty = scenario == "demo"  # the committed demo is read by people; scale snapshots by benchmarks
    node_objs = [
        _node_object(src, n, ids, built.nfd_labels, taken_at)
        for n in sorted(built.nodes, key=lambda n: n.name)
    ]
    nodegroups, asgs, asg_instances = _nodegroup_objects(src, built, taken_at, ids)
    asg_names = {g["nodegroupName"]: g["resources"]["autoScalingGroups"][0]["name"] for g in nodegroups}
    pods = sorted(built.pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    _dump(
        pretty,
        out / "snapshot.json",
        {
            "cluster": CLUSTER,
            "region": REGION,
            "step_seconds": step_seconds,
            "taken_at": _ts(taken_at),
            "window_seconds": window_seconds,
        },
    )
    _dump(pretty, out / "nodes.json", _k8s_list(node_objs))
    _dump(pretty, out / "pods.json", _k8s_list(pods))
    _dump(pretty, out / "pdbs.json", _k8s_list(built.pdbs))
    _dump(
        pretty,
        out / "nodegroups.json",
        {"autoScalingGroups": asgs, "autoScalingInstances": asg_instances, "nodegroups": nodegroups},
    )
    _dump(pretty, out / "instances.json", {"Reservations": _reservations(built, ids, asg_names)})
    render_metrics(built, src, rng, taken_at, window_seconds, step_seconds, out)
    expected = {
        n.name: {"reasons_include": list(n.reasons), "verdict": n.verdict}
        for n in built.nodes
        if n.itype.gpus
    }
    _dump(pretty, out / "expected.json", expected)
    (out / "PROVENANCE.md").write_text(
        _provenance(built, taken_at, window_seconds, step_seconds, seed), encoding="utf-8"
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m tests.support.examplegen --out DIR [--nodes N] [--seed S] [--scenario demo|scale]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.examplegen",
        description="Seeded example snapshot generator (docs/architecture.md §5 snapshot directories).",
    )
    parser.add_argument("--out", required=True, type=Path, help="snapshot directory to write")
    parser.add_argument("--scenario", choices=SCENARIOS, default="demo")
    parser.add_argument("--nodes", type=int, default=None, help="node count (scale scenario; default 100)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        out = generate_snapshot(args.out, scenario=args.scenario, nodes=args.nodes, seed=args.seed)
    except ValueError as exc:
        print(f"examplegen: {exc}", file=sys.stderr)
        return 2
    print(f"examplegen: wrote {out} in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
