"""The cast of a scenario: nodes, their devices and how they behave, seeded identifiers, and the pods,
DaemonSet pods and PodDisruptionBudgets around them."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tests.support.examplegen.sources import (
    _SUFFIX_ALPHABET,
    EXPORTER_NS,
    INSTANCE_TYPES,
    GpuModel,
    InstanceType,
    Json,
)

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
