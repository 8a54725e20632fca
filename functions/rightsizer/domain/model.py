"""Snapshot data: the subset of Kubernetes, AWS and Prometheus objects the decision reads.

Kubernetes objects are validated with pydantic from exactly what ``kubectl get -o json`` prints (unknown
fields are ignored, camelCase names kept so error paths match the JSON). AWS inventory keeps the
DescribeAutoScalingGroups / DescribeAutoScalingInstances / DescribeNodegroup shapes. Metrics are the
``/api/v1/query_range`` matrices of the Prometheus HTTP API.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

# The AWS inventory types live in their own module; model keeps the names its importers use.
from rightsizer.domain.inventory import AsgInfo as AsgInfo
from rightsizer.domain.inventory import CapacityReservation as CapacityReservation
from rightsizer.domain.inventory import Ec2Instance as Ec2Instance
from rightsizer.domain.inventory import Inventory as Inventory
from rightsizer.domain.quantity import parse_count

if TYPE_CHECKING:
    from rightsizer.domain.workload_model import KubeObject

GPU_RESOURCE = "nvidia.com/gpu"
GPU_SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

ANN_CORDONED_BY = "rightsizer.io/cordoned-by"
ANN_CORDONED_AT = "rightsizer.io/cordoned-at"
ANN_DO_NOT_DISRUPT = "rightsizer.io/do-not-disrupt"
TAG_RESIZE = "rightsizer.io/resize"
#: Opt-in tag of a node group (its Auto Scaling group for scale-in, its EKS node group for off-hours
#: sizing): nothing is removed from or resized in a group without it. The IAM policies of the drain and
#: off-hours roles carry the same condition (template.yaml), so the check here refuses before a cordon
#: what AWS would deny after the drain.
TAG_ENABLED = "rightsizer.io/enabled"
#: The label EKS puts on every Node of a managed node group: the group's name.
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
#: The cluster tag EKS puts on a managed node group's Auto Scaling group (self-managed groups must carry it).
TAG_EKS_CLUSTER = "eks:cluster-name"


def opt_in_refusal(tags: dict[str, str], cluster: str | None, *, asg: bool) -> str | None:
    """Why the group may not be scaled in or resized, or None when it opted in.

    A group opted in when it carries ``rightsizer.io/enabled=true`` and — for an Auto Scaling group — the
    tag ``eks:cluster-name=<cluster>`` (EKS node groups are scoped to their cluster by their ARN). System
    and foreign node groups therefore stay untouched unless someone tagged them on purpose; the same two
    conditions gate ``TerminateInstanceInAutoScalingGroup`` and ``UpdateNodegroupConfig`` in IAM.

    Returns:
        ``not_opted_in:rightsizer.io/enabled`` or ``not_opted_in:eks:cluster-name``, or None.
    """
    if tags.get(TAG_ENABLED) != "true":
        return f"not_opted_in:{TAG_ENABLED}"
    if asg and (cluster is None or tags.get(TAG_EKS_CLUSTER) != cluster):
        return f"not_opted_in:{TAG_EKS_CLUSTER}"
    return None


@dataclass(frozen=True, slots=True)
class GroupSizes:
    """A node group's sizes, in instances: Auto Scaling ``MinSize`` / ``DesiredCapacity`` / ``MaxSize``,
    which EKS mirrors as ``scalingConfig`` ``minSize`` / ``desiredSize`` / ``maxSize``.

    The one sizes type of the code base: read from an Auto Scaling group, sent to
    ``UpdateNodegroupConfig``, saved before an off-hours scale-down and restored after it.

    Raises:
        ValueError: a size is not an integer, or ``0 ≤ min ≤ desired ≤ max`` does not hold (the order
            both AWS APIs enforce; checked here so that no inconsistent sizes ever reach them).
    """

    min: int
    desired: int
    max: int

    def __post_init__(self) -> None:
        for name in ("min", "desired", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"size {name} must be an integer, got {value!r}")
        if not 0 <= self.min <= self.desired <= self.max:
            raise ValueError(f"sizes must satisfy 0 ≤ min ≤ desired ≤ max, got {self}")


#: Signal families a metrics source can provide (docs/architecture.md §3 "Signals"). A snapshot declares the ones its
#: source carries; the decision skips — never fails — the rules of a family the source does not carry.
SIGNAL_ACTIVITY = "activity"
SIGNAL_FRAMEBUFFER = "framebuffer"
SIGNAL_POWER = "power"
SIGNAL_LIVENESS = "liveness"
ALL_SIGNALS: frozenset[str] = frozenset({SIGNAL_ACTIVITY, SIGNAL_FRAMEBUFFER, SIGNAL_POWER, SIGNAL_LIVENESS})


def is_gpu_resource(name: str) -> bool:
    """True for ``nvidia.com/gpu``, ``nvidia.com/gpu.shared`` and ``nvidia.com/mig-*`` resource names."""
    return name in (GPU_RESOURCE, GPU_SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


class _K8s(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class OwnerReference(_K8s):
    """metadata.ownerReferences[] (Kubernetes API meta/v1 OwnerReference)."""

    apiVersion: str = ""
    kind: str
    name: str
    controller: bool | None = None
    uid: str = ""

    @property
    def group(self) -> str:
        """The owner's API group (``""`` for the core group)."""
        return self.apiVersion.rpartition("/")[0] if "/" in self.apiVersion else ""


class ObjectMeta(_K8s):
    """metadata of any Kubernetes object."""

    name: str
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    creationTimestamp: AwareDatetime | None = None
    deletionTimestamp: AwareDatetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    ownerReferences: list[OwnerReference] = Field(default_factory=list)


class Taint(_K8s):
    """spec.taints[] of a Node."""

    key: str
    value: str = ""
    effect: str = ""


class NodeAddress(_K8s):
    """status.addresses[] of a Node."""

    type: str
    address: str


class NodeCondition(_K8s):
    """status.conditions[] of a Node (``reason``: CamelCase cause, e.g. the EKS node monitoring agent's
    ``AcceleratedHardwareReady`` reasons, ``domain.health``)."""

    type: str
    status: str
    reason: str = ""


class NodeSelectorRequirement(_K8s):
    """matchExpressions[] / matchFields[] of a NodeSelectorTerm (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""

    key: str
    operator: str
    values: list[str] = Field(default_factory=list)

    def matches(self, value: str | None) -> bool:
        """Kubernetes node selector semantics for one requirement; ``value`` None when the key is absent."""
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if op == "Gt" else have < want
        return False


class NodeSelectorTerm(_K8s):
    """One term of a NodeSelector: every expression and field requirement must hold."""

    matchExpressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    matchFields: list[NodeSelectorRequirement] = Field(default_factory=list)


class NodeSelector(_K8s):
    """A core/v1 NodeSelector: the terms are ORed; an empty term list matches no node."""

    nodeSelectorTerms: list[NodeSelectorTerm] = Field(default_factory=list)

    def matches(self, node: Node) -> bool:
        """True when some term matches the node's labels (``matchFields`` support ``metadata.name``)."""
        for term in self.nodeSelectorTerms:
            if not term.matchExpressions and not term.matchFields:
                continue  # an empty term matches nothing (core/v1 NodeSelectorTerm)
            fields = {"metadata.name": node.name}
            if all(r.matches(node.labels.get(r.key)) for r in term.matchExpressions) and all(
                r.matches(fields.get(r.key)) for r in term.matchFields
            ):
                return True
        return False


class NodeSpec(_K8s):
    """spec of a Node."""

    unschedulable: bool = False
    taints: list[Taint] = Field(default_factory=list)
    providerID: str = ""


class NodeStatus(_K8s):
    """status of a Node; quantities stay strings as the API sends them."""

    capacity: dict[str, str] = Field(default_factory=dict)
    allocatable: dict[str, str] = Field(default_factory=dict)
    addresses: list[NodeAddress] = Field(default_factory=list)
    conditions: list[NodeCondition] = Field(default_factory=list)


class Node(_K8s):
    """A core/v1 Node."""

    metadata: ObjectMeta
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)

    @property
    def name(self) -> str:
        """metadata.name."""
        return self.metadata.name

    @property
    def labels(self) -> dict[str, str]:
        """metadata.labels."""
        return self.metadata.labels

    @property
    def instance_type(self) -> str | None:
        """``node.kubernetes.io/instance-type`` (or the beta label)."""
        return self.labels.get("node.kubernetes.io/instance-type") or self.labels.get(
            "beta.kubernetes.io/instance-type"
        )

    @property
    def instance_id(self) -> str | None:
        """EC2 instance id from ``spec.providerID`` (``aws:///us-east-1a/i-0abc`` → ``i-0abc``)."""
        provider = self.spec.providerID
        if not provider.startswith("aws://"):
            return None
        tail = provider.rsplit("/", 1)[-1]
        return tail if tail.startswith("i-") else None

    @property
    def internal_ips(self) -> list[str]:
        """status.addresses of type InternalIP."""
        return [a.address for a in self.status.addresses if a.type == "InternalIP"]

    def capacity_count(self, resource: str) -> int:
        """Capacity of an extended resource as an integer (0 when absent)."""
        return parse_count(self.status.capacity.get(resource))

    def allocatable_count(self, resource: str) -> int:
        """Allocatable of an extended resource as an integer (0 when absent)."""
        return parse_count(self.status.allocatable.get(resource))


class EnvVar(_K8s):
    """A container env entry; ``valueFrom`` is kept opaque."""

    name: str
    value: str | None = None
    valueFrom: dict[str, Any] | None = None


class ResourceRequirements(_K8s):
    """Container resources."""

    requests: dict[str, str | int | float] = Field(default_factory=dict)
    limits: dict[str, str | int | float] = Field(default_factory=dict)


class SecurityContext(_K8s):
    """Container securityContext (only ``privileged`` matters here)."""

    privileged: bool | None = None


class ContainerPort(_K8s):
    """containers[].ports[]: only a ``hostPort`` claims something on the node (core/v1 ContainerPort)."""

    containerPort: int = 0
    hostPort: int | None = None
    hostIP: str = ""
    protocol: str = "TCP"


class Container(_K8s):
    """A container or init container."""

    name: str = ""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    ports: list[ContainerPort] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    envFrom: list[dict[str, Any]] = Field(default_factory=list)
    securityContext: SecurityContext | None = None


class PvcSource(_K8s):
    """``persistentVolumeClaim`` of a pod volume."""

    claimName: str


class Volume(_K8s):
    """A pod volume: which source it uses matters (``emptyDir``, ``hostPath``, a PersistentVolumeClaim,
    a generic ``ephemeral`` volume); the sources' contents are kept opaque."""

    name: str = ""
    emptyDir: dict[str, Any] | None = None
    hostPath: dict[str, Any] | None = None
    persistentVolumeClaim: PvcSource | None = None
    ephemeral: dict[str, Any] | None = None


class Toleration(_K8s):
    """spec.tolerations[]."""

    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None


class PodResourceClaim(_K8s):
    """spec.resourceClaims[] (DRA)."""

    name: str
    resourceClaimName: str | None = None
    resourceClaimTemplateName: str | None = None


class PodAffinityTerm(_K8s):
    """A required (anti-)affinity term: pods matching ``labelSelector`` in ``namespaces`` (empty: the pod's
    own; ``namespaceSelector`` ``{}``: every namespace) sharing the node's ``topologyKey`` label value."""

    labelSelector: LabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)
    namespaceSelector: LabelSelector | None = None
    topologyKey: str = ""
    matchLabelKeys: list[str] = Field(default_factory=list)
    mismatchLabelKeys: list[str] = Field(default_factory=list)


class PodAffinity(_K8s):
    """podAffinity / podAntiAffinity; only the required terms constrain a placement."""

    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] = Field(default_factory=list)


class NodeAffinity(_K8s):
    """nodeAffinity; only the required selector constrains a placement."""

    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class Affinity(_K8s):
    """spec.affinity of a Pod."""

    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class TopologySpreadConstraint(_K8s):
    """spec.topologySpreadConstraints[] (core/v1); only ``whenUnsatisfiable: DoNotSchedule`` filters."""

    maxSkew: int = 1
    topologyKey: str = ""
    whenUnsatisfiable: str = "DoNotSchedule"
    labelSelector: LabelSelector | None = None
    minDomains: int | None = None
    matchLabelKeys: list[str] = Field(default_factory=list)
    nodeAffinityPolicy: str | None = None
    nodeTaintsPolicy: str | None = None


class PodSpec(_K8s):
    """spec of a Pod."""

    nodeName: str = ""
    containers: list[Container] = Field(default_factory=list)
    initContainers: list[Container] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    terminationGracePeriodSeconds: int | None = None
    runtimeClassName: str | None = None
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    resourceClaims: list[PodResourceClaim] = Field(default_factory=list)
    priorityClassName: str | None = None
    schedulerName: str | None = None
    affinity: Affinity | None = None
    topologySpreadConstraints: list[TopologySpreadConstraint] = Field(default_factory=list)
    overhead: dict[str, str | int | float] = Field(default_factory=dict)


class ResourceClaimStatusRef(_K8s):
    """status.resourceClaimStatuses[] (DRA): the generated claim name of a pod's claim."""

    name: str
    resourceClaimName: str | None = None


class PodStatus(_K8s):
    """status of a Pod."""

    phase: str = "Pending"
    podIP: str | None = None
    startTime: AwareDatetime | None = None
    conditions: list[NodeCondition] = Field(default_factory=list)
    resourceClaimStatuses: list[ResourceClaimStatusRef] = Field(default_factory=list)


class Pod(_K8s):
    """A core/v1 Pod."""

    metadata: ObjectMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def controller(self) -> OwnerReference | None:
        """The controlling owner reference, if any."""
        for ref in self.metadata.ownerReferences:
            if ref.controller:
                return ref
        return None

    @property
    def ready(self) -> bool:
        """``status.conditions`` type Ready is True (a pod without conditions counts as ready)."""
        for condition in self.status.conditions:
            if condition.type == "Ready":
                return condition.status == "True"
        return True

    @property
    def grace_seconds(self) -> int:
        """terminationGracePeriodSeconds (Kubernetes default 30 s)."""
        value = self.spec.terminationGracePeriodSeconds
        return 30 if value is None else value

    def all_containers(self) -> list[Container]:
        """Init containers then containers."""
        return [*self.spec.initContainers, *self.spec.containers]

    def gpu_request(self) -> int:
        """GPUs the pod needs: max(sum over containers, max over init containers) of GPU resources."""

        def count(c: Container) -> int:
            total = 0
            for source in (c.resources.limits, c.resources.requests):
                found = sum(parse_count(v) for k, v in source.items() if is_gpu_resource(k))
                total = max(total, found)
            return total

        regular = sum(count(c) for c in self.spec.containers)
        init = max((count(c) for c in self.spec.initContainers), default=0)
        return max(regular, init)


@dataclass(frozen=True, slots=True)
class PodAddress:
    """What the series join reads of a pod no decision reads (one bound to a non-GPU node): its
    namespace and name, its node, and its pod IP when it is Running (``domain.join.NodeJoiner``).

    The live plan keeps these instead of ``Pod`` objects (issue 11 item 7: ~0.2 KB where a validated
    ``Pod`` costs ~2.7 KB, so the assessment's memory follows the GPU nodes' pods, not the cluster's).
    """

    namespace: str
    name: str
    node: str
    ip: str | None = None

    @classmethod
    def of(cls, pod: Pod) -> PodAddress | None:
        """``pod``'s address (``spec.nodeName``; ``status.podIP`` only while ``Running``), None when it is
        bound to no node. Namespace and node names are interned: the many pods of one node or namespace
        share one string."""
        node = pod.spec.nodeName
        if not node:
            return None
        ip = pod.status.podIP if pod.status.phase == "Running" and pod.status.podIP else None
        return cls(sys.intern(pod.metadata.namespace), pod.metadata.name, sys.intern(node), ip)


class VolumeNodeAffinity(_K8s):
    """spec.nodeAffinity of a PersistentVolume: the nodes its data can be reached from."""

    required: NodeSelector | None = None


class PersistentVolumeSpec(_K8s):
    """spec of a PersistentVolume, reduced to where its data lives."""

    local: dict[str, Any] | None = None
    hostPath: dict[str, Any] | None = None
    nodeAffinity: VolumeNodeAffinity | None = None
    storageClassName: str = ""


class PersistentVolume(_K8s):
    """A core/v1 PersistentVolume."""

    metadata: ObjectMeta
    spec: PersistentVolumeSpec = Field(default_factory=PersistentVolumeSpec)


class PvcSpec(_K8s):
    """spec of a PersistentVolumeClaim (``volumeName`` is set once bound)."""

    volumeName: str = ""
    storageClassName: str | None = None


class PvcStatus(_K8s):
    """status of a PersistentVolumeClaim."""

    phase: str = "Pending"


class PersistentVolumeClaim(_K8s):
    """A core/v1 PersistentVolumeClaim."""

    metadata: ObjectMeta
    spec: PvcSpec = Field(default_factory=PvcSpec)
    status: PvcStatus = Field(default_factory=PvcStatus)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


class LabelSelectorRequirement(_K8s):
    """matchExpressions[] of a LabelSelector."""

    key: str
    operator: str
    values: list[str] = Field(default_factory=list)


class LabelSelector(_K8s):
    """A meta/v1 LabelSelector."""

    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes label selector semantics (an empty selector matches everything)."""
        for key, value in self.matchLabels.items():
            if labels.get(key) != value:
                return False
        for expr in self.matchExpressions:
            present = expr.key in labels
            if expr.operator == "In" and (not present or labels[expr.key] not in expr.values):
                return False
            if expr.operator == "NotIn" and present and labels[expr.key] in expr.values:
                return False
            if expr.operator == "Exists" and not present:
                return False
            if expr.operator == "DoesNotExist" and present:
                return False
        return True


class PdbSpec(_K8s):
    """spec of a PodDisruptionBudget."""

    selector: LabelSelector | None = None
    minAvailable: int | str | None = None
    maxUnavailable: int | str | None = None
    unhealthyPodEvictionPolicy: str | None = None


class PdbStatus(_K8s):
    """status of a PodDisruptionBudget."""

    disruptionsAllowed: int = 0
    currentHealthy: int = 0
    desiredHealthy: int = 0


class PodDisruptionBudget(_K8s):
    """A policy/v1 PodDisruptionBudget."""

    metadata: ObjectMeta
    spec: PdbSpec = Field(default_factory=PdbSpec)
    status: PdbStatus = Field(default_factory=PdbStatus)

    def selects(self, pod: Pod) -> bool:
        """True when the PDB is in the pod's namespace and its selector matches the pod's labels.

        A PDB with a null selector selects nothing (policy/v1 semantics).
        """
        if self.metadata.namespace != pod.metadata.namespace or self.spec.selector is None:
            return False
        return self.spec.selector.matches(pod.metadata.labels)


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A resource.k8s.io ResourceClaim reduced to what matters: the nodes it is allocated on and its pods.

    ``nodes`` comes from ``status.allocation.nodeSelector`` (matchFields ``metadata.name``) or from the
    ResourceSlices whose pools hold the allocated devices; ``reserved_for`` holds pod names
    (``status.reservedFor[]`` with ``resource: pods``).
    """

    namespace: str
    name: str
    nodes: frozenset[str]
    reserved_for: frozenset[str]
    allocated: bool


@dataclass(frozen=True, slots=True)
class Series:
    """One Prometheus series of a ``query_range`` matrix: labels and parallel time/value arrays.

    ``times`` are Unix seconds; ``values`` floats (NaN and ±Inf kept as Prometheus sent them). Either
    tuples or compact ``array('d')`` (8 bytes a value; the live path parses into those).
    """

    labels: dict[str, str]
    times: Sequence[float]
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class MetricData:
    """A metric's ``query_range`` answer; ``problem`` is set when the answer is unusable (docs/architecture.md §5)."""

    name: str
    series: tuple[Series, ...] = ()
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """snapshot.json: when and where the snapshot was taken; window and step in seconds."""

    taken_at: datetime
    window_seconds: int
    step_seconds: int
    cluster: str
    region: str
    metrics_format: int = 1
    """1: a matrix point is the raw sample Prometheus' lookback shows at the step point (snapshots before
    format 2); 2: every fact covers every raw sample of its interval (``domain.observation``)."""


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything ``plan`` reads (docs/architecture.md §5 snapshot directory), already validated.

    ``metrics`` maps metric name → query_range answer; ``timestamps`` maps metric name → the answer of
    ``timestamp(<metric>)``. ``resource_claims`` is empty when the cluster does not serve DRA.
    """

    meta: SnapshotMeta
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    pdbs: tuple[PodDisruptionBudget, ...] = ()
    resource_claims: tuple[ResourceClaim, ...] = ()
    pvcs: tuple[PersistentVolumeClaim, ...] = ()
    pvs: tuple[PersistentVolume, ...] = ()
    volumes_known: bool = False
    """True when the source carried PersistentVolumeClaims and PersistentVolumes (``pvcs``/``pvs`` are
    then complete); False for older snapshots, where every claim counts as node-local data."""
    inventory: Inventory = field(default_factory=Inventory)
    metrics: dict[str, MetricData] = field(default_factory=dict)
    timestamps: dict[str, MetricData] = field(default_factory=dict)
    metric_extras: dict[str, dict[str, MetricData]] = field(default_factory=dict)
    """Format 2 only: the other answers (``stddev``, ``latest``, ``nonfinite`` → metric → answer), see
    ``rightsizer.domain.observation``."""
    node_label: str | None = None
    pod_addresses: tuple[PodAddress, ...] = ()
    """Live path only: the pods bound to non-GPU nodes, as the series join reads them (``pods`` then
    holds the others); a snapshot directory keeps every pod in ``pods``."""
    xids: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    """Node → (XID codes whose ``DCGM_EXP_XID_ERRORS_COUNT`` rose in the window, codes the stale-prone
    ``DCGM_FI_DEV_XID_ERRORS`` gauge shows): ``domain.health``; when empty, ``plan`` joins ``xid_answers``."""
    xid_answers: Mapping[str, MetricData] = field(default_factory=dict)
    """The ``xid.json`` answers (``count``, ``last``; ``domain.health.xid_queries``), None of them in older
    snapshots."""
    source: Literal["snapshot", "live"] = "snapshot"
    signals: Any = None
    """Live path only: ``rightsizer.domain.usage.CollectedSignals`` computed by PromQL in the server for
    this snapshot's window; when set, ``plan`` uses it instead of interpreting ``metrics``."""
    # Issue 32: ``workloads.json`` (owners of GPU-holding pods up their ownerReferences; HPAs and KEDA
    # ScaledObjects); live only, ``signals`` over ``workloads.idle_window`` when the policy scales workloads.
    owners: tuple[KubeObject, ...] = ()
    autoscalers: tuple[KubeObject, ...] = ()
    workload_signals: Any = None
    signal_set: frozenset[str] = ALL_SIGNALS
    """Signal families the source carries (``ALL_SIGNALS`` for DCGM). A source that carries activity only
    (a utilisation trace, ``rightsizer backtest --trace``) sets ``{"activity"}``: the framebuffer, power and
    liveness rules are then skipped rather than failed; every activity rule (coverage, freshness,
    non-finite samples) still applies."""
