"""Ports: what the services need from the outside world, named by capability (style guide "Layout").

Services depend on these Protocols only; adapters (``rightsizer.adapters.*``) implement them and
``rightsizer.wiring`` connects the two. Everything crossing a port is plain data: Kubernetes objects as
the dicts ``kubectl get -o json`` prints, AWS answers in their API shapes, Prometheus answers as the
``/api/v1/query_range`` JSON document — so a snapshot directory (docs/architecture.md §5) is exactly what crossed the
ports, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from rightsizer.domain.model import GroupSizes, Node, Pod
from rightsizer.domain.workload_scale import SavedWorkload

JSON = dict[str, Any]


class AccessCheck(NamedTuple):
    """One Kubernetes authorization question: may the caller ``verb`` the ``resource``?

    Same fields as ``SelfSubjectAccessReview.spec.resourceAttributes``; ``group`` is ``""`` for the core
    group (nodes, pods), ``policy`` for PodDisruptionBudgets, ``resource.k8s.io`` for DRA objects.
    """

    verb: str
    resource: str
    subresource: str = ""
    group: str = ""

    def describe(self) -> str:
        """Human form for error messages: ``list poddisruptionbudgets.policy``, ``create pods/eviction``."""
        name = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {name}.{self.group}" if self.group else f"{self.verb} {name}"


ListKind = Literal[
    "nodes",
    "pods",
    "poddisruptionbudgets",
    "persistentvolumeclaims",
    "persistentvolumes",
    "resourceclaims",
    "resourceslices",
]
"""The collections a ``ClusterReader`` lists (Kubernetes resource plurals)."""
T = TypeVar("T")
M = TypeVar("M", Node, Pod)


class ClusterReader(Protocol):
    """Read access to one Kubernetes cluster, complete or not at all.

    Every ``list_*`` returns all items of the kind, across all namespaces, each a kubectl-JSON dict
    (``apiVersion`` and ``kind`` filled in, as ``kubectl get -o json`` prints them). A list that fails
    part-way raises: callers never see a partial list.

    Raises (every method):
        PermanentError: 401 after one token refresh, or 403 — the message names the identity, the refused
            verb and resource, and the remedy (EKS access entry / aws-auth / RBAC).
        TransientError: 429, 5xx, timeouts and connection failures.
    """

    def identity(self) -> str:
        """Who the cluster sees (an IAM ARN for EKS tokens, the kubeconfig user otherwise)."""
        ...

    def preflight(self, checks: Sequence[AccessCheck]) -> list[AccessCheck]:
        """Ask the API server (``SelfSubjectAccessReview``) about each check; return the denied ones."""
        ...

    def list_nodes(self) -> list[JSON]:
        """core/v1 Nodes."""
        ...

    def list_pods(self) -> list[JSON]:
        """core/v1 Pods of all namespaces."""
        ...

    def list_pdbs(self) -> list[JSON]:
        """policy/v1 PodDisruptionBudgets of all namespaces."""
        ...

    def list_persistent_volume_claims(self) -> list[JSON]:
        """core/v1 PersistentVolumeClaims of all namespaces (where pods' claimed data lives)."""
        ...

    def list_persistent_volumes(self) -> list[JSON]:
        """core/v1 PersistentVolumes (``spec.local``, ``spec.hostPath``, ``spec.nodeAffinity``)."""
        ...

    def list_projected(
        self,
        kind: ListKind,
        project: Callable[[JSON], T | None],
        *,
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``project`` keeps of every object of ``kind`` (None drops it), read page by page so that
        at most one raw page is held at a time (the assessment's projection, issue 11 item 7).
        ``restart`` is called when the list starts over (an expired continue token): whatever ``project``
        did with the items seen so far must be undone."""
        ...

    def list_models(
        self,
        kind: type[M],
        project: Callable[[M], T | None],
        *,
        label_selector: str = "",
        field_selector: str = "",
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``project`` keeps (None drops) of every ``Node`` or ``Pod`` the selectors list, as the
        compact models the plan reads (only what a decision reads, equal parts shared), page by page.
        ``restart`` as in :meth:`list_projected`."""
        ...

    def served_resource_api(self) -> str | None:
        """The newest served ``resource.k8s.io`` group version among v1, v1beta2, v1beta1
        (``"resource.k8s.io/v1"``), or None when DRA is not served (normal on most clusters)."""
        ...

    def list_resource_claims(self) -> list[JSON]:
        """ResourceClaims (unstructured, served version) of all namespaces; ``[]`` when DRA is not served."""
        ...

    def list_resource_slices(self) -> list[JSON]:
        """ResourceSlices (unstructured, served version); ``[]`` when DRA is not served."""
        ...


class MetricsRangeReader(Protocol):
    """Prometheus-compatible range queries (Prometheus, Thanos, Amazon Managed Service for Prometheus)."""

    def query_range_raw(self, expr: str, start: float, end: float, step: float) -> bytes | JSON:
        """Evaluate PromQL ``expr`` at ``start``, ``start + step``, … ``end`` (Unix seconds; step in s).

        Returns:
            The ``/api/v1/query_range`` response document unchanged — its JSON bytes as received
            (``PrometheusClient``) or already parsed — with ``status``, ``data.resultType`` ``matrix``,
            ``data.result`` and optional ``warnings``. An answer with ``status: error`` is returned, not
            raised, so the snapshot records it (docs/architecture.md §5: the metric becomes a problem).

        Raises:
            TransientError / PermanentError: the endpoint could not be reached or refused the caller.
        """
        ...


class SnapshotSink(Protocol):
    """Where ``rightsizer snapshot`` writes a snapshot directory while it reads the cluster
    (``adapters.snapshot_writer.SnapshotDirectoryWriter``; docs/architecture.md §5, §8)."""

    def begin(self, path: str) -> None:
        """Start the kubectl ``List`` document ``path`` (again, discarding its items, after a restart)."""
        ...

    def add(self, path: str, item: JSON) -> None:
        """Append one object (kubectl form) to the list ``path``; the sink projects it."""
        ...

    def put(self, path: str, document: JSON | bytes) -> None:
        """Write the whole document ``path`` (``snapshot.json``, the AWS files, a metrics answer's bytes)."""
        ...


class NodeGroupInventory(Protocol):
    """Node group membership and EC2 facts, in the snapshot's AWS shapes (docs/architecture.md §5)."""

    def describe(self, instance_ids: Sequence[str], cluster: str) -> JSON:
        """The ``nodegroups.json`` document for ``cluster`` and these instances (EKS DescribeNodegroup,
        Auto Scaling DescribeAutoScalingGroups / DescribeAutoScalingInstances)."""
        ...

    def describe_instances(self, instance_ids: Sequence[str]) -> JSON:
        """The ``instances.json`` document (``{"Reservations": [EC2 DescribeInstances …]}``)."""
        ...


# --------------------------------------------------------------------------------------------------
# Act (docs/architecture.md §4): writes to Kubernetes and AWS, fresh decisions, workflow starters
# --------------------------------------------------------------------------------------------------


class EvictionOutcome(NamedTuple):
    """What policy/v1 Eviction answered for one pod (docs/architecture.md §4 "Evict").

    ``status``: ``accepted`` (201), ``gone`` (404), ``uid_mismatch`` (409: the UID precondition failed, the
    pod with that UID is gone), ``blocked`` (429: a PodDisruptionBudget allows no disruption now),
    ``error`` (500, e.g. the pod is matched by several PodDisruptionBudgets). ``message`` is the API
    server's Status message (PDB name and counts for 429); ``retry_after`` seconds when the server said.
    """

    status: str
    message: str = ""
    retry_after: float | None = None


class ClusterWriter(Protocol):
    """Uncached reads and the few writes a drain makes (RBAC group ``rightsizer``).

    Raises (every method):
        PermanentError: 401 after one token refresh, 403 (names identity and verb), validation errors.
        TransientError: 429 on non-eviction calls, 5xx, timeouts.
        StalePlan: 409 Conflict on a node write (someone else changed the node; re-read and re-check).
    """

    def get_node(self, name: str) -> JSON | None:
        """The Node named exactly ``name`` (uncached GET), or None when it does not exist."""
        ...

    def list_nodes(self) -> list[JSON]:
        """core/v1 Nodes (uncached): the members of a node group being replaced."""
        ...

    def find_node(
        self, accept: Callable[[JSON], bool], *, label_selector: str = "", field_selector: str = ""
    ) -> JSON | None:
        """The first Node the selectors list for which ``accept`` is true, or None (uncached, small pages
        read until one is accepted): where else a node-affine PersistentVolume could be reached from."""
        ...

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim (uncached GET), or None on 404."""
        ...

    def get_persistent_volume(self, name: str) -> JSON | None:
        """The PersistentVolume (uncached GET), or None on 404."""
        ...

    def list_pods_on_node(self, node: str) -> list[JSON]:
        """Pods bound to ``node`` (``fieldSelector=spec.nodeName=<node>``, uncached, all namespaces)."""
        ...

    def get_controller(self, namespace: str, group: str, kind: str, name: str) -> JSON | None:
        """The controller a pod names (uncached GET), or None on 404; (``group``, ``kind``) is one of
        ``rightsizer.domain.pods.READABLE_CONTROLLERS`` (ReplicaSet, StatefulSet, DaemonSet in ``apps``,
        Job in ``batch``, ReplicationController in core), anything else raises ``ValueError``."""
        ...

    def list_pdbs(self, namespace: str | None = None) -> list[JSON]:
        """policy/v1 PodDisruptionBudgets of ``namespace`` (uncached; None: of all namespaces)."""
        ...

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The pod (uncached GET), or None on 404."""
        ...

    def cordon(self, node: str, execution_id: str, at: str) -> JSON:
        """Set ``spec.unschedulable=true`` and annotate ``rightsizer.io/cordoned-by=<execution_id>``,
        ``rightsizer.io/cordoned-at=<at>`` (RFC 3339 UTC) in one patch guarded by the node's
        ``resourceVersion``; returns the patched Node. A no-op when the node already carries our
        annotation for this execution."""
        ...

    def uncordon(self, node: str, execution_id: str) -> bool:
        """Undo our cordon — only when ``rightsizer.io/cordoned-by`` equals ``execution_id``: clear
        ``spec.unschedulable`` and remove both annotations. True when uncordoned now; False when the node
        is gone or the cordon is not ours (never uncordon a node a person cordoned)."""
        ...

    def evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        """POST policy/v1 Eviction for the pod with ``deleteOptions.preconditions.uid=<uid>``."""
        ...

    def emit_event(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Record a core/v1 Event on the Node (source ``rightsizer``); best effort, never raises."""
        ...


class SnoozeReader(Protocol):
    """Running snoozes (``ApprovalStore.snoozes``): node → snoozed until (aware)."""

    def snoozes(self, now: datetime) -> dict[str, datetime]:
        """Snoozes running at ``now`` (one read of the cluster's snoozes)."""
        ...


@dataclass(frozen=True, slots=True)
class ScalingGroup:
    """An Auto Scaling group as ``DescribeAutoScalingGroups`` shows it now, reduced to what we act on.

    ``sizes`` are MinSize / DesiredCapacity / MaxSize (instances); ``in_service`` the ids of the members
    whose ``LifecycleState`` is ``InService``; ``members`` the ids of every member in any state (Pending,
    Terminating, Standby …); ``tags`` the group's tags (the opt-in rule reads them).
    """

    name: str
    sizes: GroupSizes
    in_service: frozenset[str]
    members: frozenset[str]
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TerminateResult:
    """Outcome of a targeted scale-in (``TerminateInstanceInAutoScalingGroup``): DesiredCapacity before
    and after (instances); ``already_done`` means no terminate call was made this time (the instance was
    already Terminating/Terminated or gone); ``activity_id`` is the scaling activity AWS started."""

    asg_name: str
    instance_id: str
    desired_before: int
    desired_after: int
    already_done: bool
    activity_id: str | None = None


class ScalingFailure(NamedTuple):
    """One failed Auto Scaling activity (``DescribeScalingActivities``, ``StatusCode`` ``Failed``).

    ``code`` is the AWS error code found in the activity's status message or description (e.g.
    ``InsufficientInstanceCapacity``), None when the message names none; ``started_at`` is aware UTC.
    """

    activity_id: str
    started_at: datetime | None
    status: str
    code: str | None
    message: str


class NodeReader(Protocol):
    """The reads that judge one node without reading the cluster (issue 11 item 5): every call is
    scoped by name, namespace or field selector, so its cost does not grow with the number of nodes.
    :class:`rightsizer.adapters.kubernetes.KubernetesCluster` implements it (RBAC of the ``rightsizer``
    ClusterRole: ``get``/``list`` nodes, ``list`` pods, PodDisruptionBudgets, ResourceClaims and
    ResourceSlices, ``get`` PersistentVolumeClaims and PersistentVolumes).

    Raises (every method): as :class:`ClusterReader`.
    """

    def get_node(self, name: str) -> JSON | None:
        """The Node named exactly ``name`` (``GET /api/v1/nodes/{name}``), or None on 404."""
        ...

    def find_node(
        self, accept: Callable[[JSON], bool], *, label_selector: str = "", field_selector: str = ""
    ) -> JSON | None:
        """The first Node the selectors list for which ``accept`` is true, or None."""
        ...

    def list_pods(self, *, namespace: str | None = None, field_selector: str = "") -> list[JSON]:
        """core/v1 Pods of ``namespace`` (None: all namespaces) matching ``field_selector``
        (``spec.nodeName=x``, ``status.podIP=ip``, ``metadata.name=p``)."""
        ...

    def list_pdbs(self, namespace: str | None = None) -> list[JSON]:
        """policy/v1 PodDisruptionBudgets of ``namespace``."""
        ...

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim, or None on 404."""
        ...

    def get_persistent_volume(self, name: str) -> JSON | None:
        """The PersistentVolume, or None on 404."""
        ...

    def served_resource_api(self) -> str | None:
        """The newest served ``resource.k8s.io`` group version, or None."""
        ...

    def list_resource_claims(self, namespace: str | None = None) -> list[JSON]:
        """ResourceClaims of ``namespace``; ``[]`` when DRA is not served."""
        ...

    def list_resource_slices(self, field_selector: str = "") -> list[JSON]:
        """ResourceSlices matching ``field_selector`` (``spec.nodeName=x``); ``[]`` when DRA is not served."""
        ...


class NodeScaler(Protocol):
    """Auto Scaling: group membership, sizes, targeted scale-in and scaling activities
    (docs/architecture.md §4 "Remove", "Off-hours"). Managed node groups are Auto Scaling groups underneath.

    Raises (every method):
        StalePlan: the group does not exist (any more).
        TransientError: throttling, 5xx, connection failures.
        PermanentError: access denied, validation errors.
    """

    def find_group(self, instance_id: str) -> str | None:
        """The Auto Scaling group of the instance (DescribeAutoScalingInstances), None when standalone."""
        ...

    def describe_group(self, asg_name: str) -> ScalingGroup:
        """Sizes, members and tags of the group, read fresh (DescribeAutoScalingGroups)."""
        ...

    def opt_in_refusal(self, asg_name: str, cluster: str) -> str | None:
        """Why the group may not be scaled in (``rightsizer.domain.model.opt_in_refusal`` over its tags,
        read fresh), or None when it opted in: ``rightsizer.io/enabled=true`` and ``eks:cluster-name``."""
        ...

    def terminate(self, asg_name: str, instance_id: str) -> TerminateResult:
        """``TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True)`` for exactly that
        instance, after checking DesiredCapacity − 1 ≥ MinSize (else ``ActionRefusedError``
        ``node_group_at_min_size``). Never followed by UpdateNodegroupConfig."""
        ...

    def failed_activities(self, asg_name: str, since: datetime) -> list[ScalingFailure]:
        """Failed scaling activities of the group that started at or after ``since`` (aware), newest
        first (``DescribeScalingActivities``)."""
        ...


class InstanceFacts(NamedTuple):
    """What EC2 DescribeInstances says about one instance: ``state`` (``running``, ``stopped`` ...),
    ``instance_type``, ``tags`` and ``lifecycle`` (``InstanceLifecycle``: ``spot``, ``capacity-block``, ``""``)."""

    state: str
    instance_type: str
    tags: dict[str, str]
    lifecycle: str


class InstanceTypeChanger(Protocol):
    """Step-sized EC2 calls of a standalone instance's type change (issue 17); none of them waits."""

    def describe(self, instance_id: str) -> InstanceFacts:
        """The instance's state, type and tags (DescribeInstances); StalePlan when it is gone."""
        ...

    def preflight(self, instance_id: str, target_type: str, *, allow_instance_store_loss: bool) -> None:
        """Refuse (``ActionRefusedError`` naming every failed check) an incompatible change before anything
        is touched: Auto Scaling membership, EBS root, spot, instance-store loss, architecture, GPUs and
        their vendor (driver family), ENA, NVMe, EFA (DescribeAutoScalingInstances, DescribeInstanceTypes)."""
        ...

    def stop(self, instance_id: str) -> None:
        """StopInstances (a stopping or stopped instance is left as it is)."""
        ...

    def set_type(self, instance_id: str, instance_type: str) -> None:
        """ModifyInstanceAttribute ``InstanceType`` (only that attribute) of a stopped instance."""
        ...

    def start(self, instance_id: str) -> None:
        """StartInstances; ``InsufficientInstanceCapacity`` and friends surface as the taxonomy's errors."""
        ...


class Assessor(Protocol):
    """A fresh decision about one node, from live data (used by validate and revalidate)."""

    def assess_node(self, node: str, now: datetime) -> Any:
        """The node's ``NodeReport`` in a plan made now (``rightsizer.domain.plan.NodeReport``), or None
        when the node is not a GPU node of the cluster."""
        ...


class WorkflowStarter(Protocol):
    """Starts drain workflows: Step Functions in production, the in-process runner elsewhere (docs/architecture.md §2)."""

    def start(self, request: Any) -> str:
        """Start a drain for ``request`` (``rightsizer.services.drain.DrainRequest``); returns the
        execution id. Starting the same execution id twice is a no-op returning that id."""
        ...


# --------------------------------------------------------------------------------------------------
# Off-hours (docs/architecture.md §4 "Off-hours", "Node group sizing"): managed node group sizes and their health
# --------------------------------------------------------------------------------------------------


class NodeGroupInfo(NamedTuple):
    """What EKS ``DescribeNodegroup`` says about a managed node group, reduced to what off-hours reads.

    ``asg_name`` is ``resources.autoScalingGroups[0].name`` (None while EKS has not created it yet);
    ``status`` the node group status (``ACTIVE``, ``UPDATING``, ``DEGRADED`` ...); ``tags`` the node group's
    tags (``rightsizer.io/offhours=<schedule>`` selects it); ``health_issues`` the codes of
    ``health.issues[]`` (e.g. ``AsgInstanceLaunchFailures`` during a restore that lacks capacity, BUG-27);
    ``scaling`` the node group's ``scalingConfig`` (what EKS was last told; off-hours reads the sizes that
    count from the Auto Scaling group, :meth:`NodeScaler.describe_group`).
    """

    asg_name: str | None
    status: str
    tags: dict[str, str]
    health_issues: tuple[str, ...] = ()
    scaling: GroupSizes | None = None


@dataclass(frozen=True, slots=True)
class NodeGroupUpdate:
    """Outcome of ``NodeGroupSizer.update_sizes``: the node group's ``scalingConfig`` before and after;
    ``update_id`` of the ``UpdateNodegroupConfig`` call, None when ``already_done`` (sizes already
    matched, no call made); ``attempts`` = reads of the group it took (a busy group is waited for)."""

    cluster: str
    nodegroup: str
    before: GroupSizes
    after: GroupSizes
    update_id: str | None
    already_done: bool
    attempts: int

    @property
    def changed(self) -> bool:
        """True when an ``UpdateNodegroupConfig`` call was made."""
        return not self.already_done


class NodeGroupSizer(Protocol):
    """Managed node group sizing for off-hours (EKS ``UpdateNodegroupConfig``, managed groups only).

    Sizes themselves are read from the Auto Scaling group through :meth:`NodeScaler.describe_group`
    (docs/architecture.md §4: "Sizes are read from the ASG"); this port lists node groups and changes them.

    Raises (every method):
        StalePlan: the node group does not exist (any more).
        TransientError: throttling, 5xx, a group still busy (``ResourceInUseException``, ``UPDATING``).
        PermanentError: access denied, a failed node group, sizes AWS rejects.
        ConfigError: sizes that fail local validation (``maxSize`` 0; no AWS call made).
    """

    def list_nodegroups(self, cluster: str) -> list[str]:
        """Names of the cluster's managed node groups (EKS ``ListNodegroups``, all pages), sorted."""
        ...

    def describe(self, cluster: str, nodegroup: str) -> NodeGroupInfo:
        """The node group's Auto Scaling group name, status, tags, health issue codes and ``scalingConfig``."""
        ...

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        """Set min, desired and max together (``UpdateNodegroupConfig``); no call when they already match."""
        ...


# --------------------------------------------------------------------------------------------------


class ManagedNodeGroup(NamedTuple):
    """A managed node group as EKS ``DescribeNodegroup`` describes it, reduced to what a replacement copies.

    ``scaling`` is its ``scalingConfig`` (``minSize``, ``desiredSize``, ``maxSize``) in instances; ``taints`` are EKS taint objects
    (``{"key", "value", "effect": "NO_SCHEDULE"|...}``); ``launch_template`` is ``{"id", "name",
    "version"}`` or None; ``health_issues`` the codes of ``health.issues[]``; ``asg_name`` the node group's
    Auto Scaling group (None while EKS has not created it).
    """

    name: str
    status: str
    instance_types: tuple[str, ...]
    scaling: GroupSizes
    labels: dict[str, str]
    taints: tuple[dict[str, str], ...]
    subnets: tuple[str, ...]
    node_role: str
    launch_template: dict[str, str] | None
    capacity_type: str | None
    ami_type: str | None
    tags: dict[str, str]
    asg_name: str | None
    health_issues: tuple[str, ...] = ()
    disk_size: int | None = None


class NodeGroupReplacer(Protocol):
    """Creating and deleting managed node groups for a replacement (docs/architecture.md §4).

    Raises (every method):
        TransientError: throttling, 5xx, a group busy (``ResourceInUseException``).
        PermanentError: access denied, parameters AWS rejects.
    """

    def describe_managed(self, cluster: str, nodegroup: str) -> ManagedNodeGroup | None:
        """The node group (EKS ``DescribeNodegroup``), or None when it does not exist."""
        ...

    def create_nodegroup(self, cluster: str, spec: ManagedNodeGroup, client_token: str) -> None:
        """EKS ``CreateNodegroup`` from ``spec`` (status, ASG and health ignored). Idempotent: a group of
        that name already carrying ``spec.tags`` counts as created.

        Raises:
            PermanentError: a different group of that name exists (``nodegroup_name_taken``).
        """
        ...

    def delete_nodegroup(self, cluster: str, nodegroup: str) -> bool:
        """EKS ``DeleteNodegroup``; False when the group does not exist (already deleted)."""
        ...

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        """EKS ``UpdateNodegroupConfig`` with min, desired and max (see :class:`NodeGroupSizer`)."""
        ...


class LaunchTemplateVersions(Protocol):
    """EC2 launch template versions, for a replacement whose old group's template pins the instance type.

    Raises (every method):
        TransientError: throttling, 5xx.
        PermanentError: no such template version; access denied.
    """

    def instance_type(self, template_id: str, version: str) -> str | None:
        """The instance type the version names (EC2 ``DescribeLaunchTemplateVersions``), or None."""
        ...

    def new_version(self, template_id: str, source_version: str, instance_type: str) -> str:
        """A new version: ``source_version`` with only ``InstanceType`` changed (EC2
        ``CreateLaunchTemplateVersion``); returns its version number."""
        ...

    def delete_version(self, template_id: str, version: str) -> bool:
        """Delete one version (EC2 ``DeleteLaunchTemplateVersions``): True when deleted now, False when it
        was already gone."""
        ...


@runtime_checkable
class WorkloadWriter(Protocol):
    """Reads and JSON merge patches of the objects workload scale-to-zero touches (issue 32): the owners
    (Deployment, StatefulSet, LeaderWorkerSet and their ``scale`` subresource, Notebook,
    InferenceService), HorizontalPodAutoscalers and KEDA ScaledObjects — ``domain.workload_model.RESOURCES``.

    Raises (every method):
        PermanentError: 403 (names the verb and resource), 422; TransientError: 5xx, throttling.
    """

    def get_object(
        self, group: str, kind: str, namespace: str, name: str, subresource: str | None = None
    ) -> JSON | None:
        """The object (or its ``scale`` subresource) as the API server has it, or None on 404."""
        ...

    def patch_object(
        self, group: str, kind: str, namespace: str, name: str, subresource: str | None, body: JSON
    ) -> JSON | None:
        """Apply one JSON merge patch (``application/merge-patch+json``); the object after it, None on 404."""
        ...

    def list_objects(
        self, group: str, kind: str, namespace: str, visit: Callable[[JSON], None] | None = None
    ) -> list[JSON]:
        """Every object of (group, kind) in ``namespace``; empty when the API server does not serve the kind
        (a CRD that is not installed). With ``visit``, each object is handed to it page by page instead
        and the answer is empty."""
        ...


class WorkloadSaves(Protocol):
    """Saved states of workloads scaled to zero, per cluster (state table items ``workload#<cluster>`` /
    ``Kind/namespace/name``; no TTL: forgotten only after a restore)."""

    def save_workload(self, saved: SavedWorkload) -> SavedWorkload:
        """Keep ``saved`` unless a state is saved for the workload already; returns the stored one (a
        second scale-down never overwrites the first one's values)."""
        ...

    def get_workload(self, workload: str) -> SavedWorkload | None:
        """The state saved for ``Kind/namespace/name``, or None."""
        ...

    def forget_workload(self, workload: str) -> bool:
        """Delete the saved state (after a restore); True when something was deleted."""
        ...

    def saved_workloads(self) -> list[SavedWorkload]:
        """Every saved state of the cluster, by workload."""
        ...
