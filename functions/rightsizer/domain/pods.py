"""Pod classification for a drain: an ordered chain of pure filters (kubectl drain first, then our safety).

Modelled on kubectl's ``pkg/drain`` filters: each filter looks at one pod and either ignores it (it is not
evicted), lets it through, or blocks the node with a reason code and a message naming the policy switch
that would change the outcome (docs/architecture.md §3 "Pods"). Where kubectl, Cluster Autoscaler and Karpenter agree we
agree (their public test tables are ported in ``tests/unit/test_parity_*.py``; docs/operations.md "Parity"):

- finished pods never block; terminating pods never block (they are waited for, never evicted again);
- DaemonSet and mirror pods, and pods that tolerate our cordon's taint (they would come straight back),
  are not evicted — but a do-not-disrupt annotation or a PodDisruptionBudget on them still blocks
  (Karpenter ``IsDisruptable``);
- a pod without a controller of a kind that recreates pods is a bare pod (Cluster Autoscaler
  ``replicated``: unknown custom kinds block unless their group is in ``replicated_owner_groups``), and so
  is a pod whose controller object no longer exists (Cluster Autoscaler ``replicacount``/``customcontroller``:
  the drain reads each owner back, :func:`controllers_to_check`), a DaemonSet pod included;
- ``cluster-autoscaler.kubernetes.io/safe-to-evict: "true"`` opts a pod in past the bare-pod, system-pod,
  batch and local-data (not node-pinned) rules; ``safe-to-evict-local-volumes`` names disposable volumes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from rightsizer.domain.go_duration import parse_go_duration
from rightsizer.domain.model import (
    ANN_DO_NOT_DISRUPT,
    Node,
    Pod,
    PodDisruptionBudget,
    ResourceClaim,
    is_gpu_resource,
)
from rightsizer.domain.policy import Policy
from rightsizer.domain.volumes import UNKNOWN_VOLUMES, VolumeFacts, volume_local_data

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CA_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
CA_SAFE_TO_EVICT_LOCAL_VOLUMES = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"
#: A custom controller's pod that is to be treated as a DaemonSet pod (Cluster Autoscaler ``IsDaemonSetPod``).
CA_DAEMONSET_POD = "cluster-autoscaler.kubernetes.io/daemonset-pod"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
#: Controller kinds that recreate a pod elsewhere, matched by kind as Cluster Autoscaler's ``replicated``
#: rule does; batch and other custom owners are recognised by API group from the policy.
REPLICATING_KINDS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController", "Job", "DaemonSet"})
#: Controllers whose existence the drain checks (uncached GET of the ownerReference target), by (API group,
#: kind) → resource plural; the RBAC verb is ``get`` on each (``infra/k8s/rbac.yaml``, ClusterRole
#: ``rightsizer``). Custom controllers (``replicated_owner_groups``) are trusted as declared: reading them
#: would need RBAC on resources we cannot know in advance.
READABLE_CONTROLLERS: Mapping[tuple[str, str], str] = {
    ("apps", "ReplicaSet"): "replicasets",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "DaemonSet"): "daemonsets",
    ("batch", "Job"): "jobs",
    ("", "ReplicationController"): "replicationcontrollers",
}
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_NO_DEVICES = frozenset({"", "void", "none"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a pod gives: ``code`` (docs/architecture.md §3 reason code), ``pod`` (ns/name) and a human message."""

    code: str
    pod: str
    message: str
    detail: str = ""
    """Appended to the reason when set (the PodDisruptionBudget names of ``pdb_blocks``/``multiple_pdbs``)."""

    @property
    def reason(self) -> str:
        """``code:namespace/name`` (``code:namespace/name:detail``) as it appears in a plan's reasons."""
        return f"{self.code}:{self.pod}:{self.detail}" if self.detail else f"{self.code}:{self.pod}"


@dataclass(frozen=True, slots=True)
class PodClassification:
    """The outcome for one pod: ``ignored`` (with why) or to be evicted, plus every blocking finding.

    ``gpu_holder`` is a finding kept apart because it blocks only while ``evict_idle_gpu_holders`` is off.
    """

    pod: Pod
    ignored: str | None
    findings: tuple[Finding, ...]
    gpu_holder: Finding | None

    @property
    def evictable(self) -> bool:
        """True when the pod is to be evicted and nothing blocks it."""
        return self.ignored is None and not self.findings and self.gpu_holder is None


@dataclass(frozen=True)
class PodContext:
    """What the filters may consult besides the pod: policy, PDBs, DRA claims on the node, the time, and
    the PersistentVolumeClaims/PersistentVolumes/Nodes behind the pod's volumes (unknown by default, which
    makes every claim node-local: a caller that forgets them stays safe)."""

    policy: Policy
    pdbs: Sequence[PodDisruptionBudget]
    claims_on_node: Mapping[str, ResourceClaim]
    at: datetime
    volumes: VolumeFacts = UNKNOWN_VOLUMES
    gone_controllers: frozenset[ControllerRef] = frozenset()
    """Controllers read back and found missing (404): their pods are bare. Empty when not read (the planner's snapshot): a controller named by a pod is then presumed live."""
    pdb_index: Mapping[str, Sequence[PodDisruptionBudget]] | None = field(
        default=None, compare=False, repr=False
    )
    """``pdbs`` by namespace (``pdbs_by_namespace``), built once by a caller that makes a context per node
    of a large cluster (the planner); None: built from ``pdbs`` when first needed."""

    def namespace_pdbs(self, namespace: str) -> Sequence[PodDisruptionBudget]:
        """The PodDisruptionBudgets of ``namespace``, in ``pdbs`` order (a policy/v1 PDB selects pods of its
        own namespace only): matching each pod against every PDB of the cluster made a plan of 150,000
        pods and hundreds of PDBs quadratic."""
        index = self.pdb_index
        if index is None:
            index = pdbs_by_namespace(self.pdbs)
            object.__setattr__(self, "pdb_index", index)  # a cache of ``pdbs``, not a new fact
        return index.get(namespace, ())


def pdbs_by_namespace(pdbs: Iterable[PodDisruptionBudget]) -> dict[str, list[PodDisruptionBudget]]:
    """PodDisruptionBudgets grouped by ``metadata.namespace``, each group in the given order."""
    out: dict[str, list[PodDisruptionBudget]] = {}
    for pdb in pdbs:
        out.setdefault(pdb.metadata.namespace, []).append(pdb)
    return out


class ControllerRef(NamedTuple):
    """The controller a pod names (``metadata.ownerReferences[controller=true]``), in the pod's namespace."""

    namespace: str
    group: str
    kind: str
    name: str
    uid: str

    @property
    def resource(self) -> str:
        """The resource plural to GET (``replicasets``), from :data:`READABLE_CONTROLLERS`."""
        return READABLE_CONTROLLERS[(self.group, self.kind)]

    def gone(self, found: Mapping[str, Any] | None) -> bool:
        """Whether the object read back (None: 404) is missing. By name, as Cluster Autoscaler's
        ``replicacount`` rule checks: a controller recreated under the same name adopts the pods."""
        return found is None


def controller_of(pod: Pod) -> ControllerRef | None:
    """The pod's controller as a :class:`ControllerRef`, or None without one."""
    ref = pod.controller
    if ref is None:
        return None
    return ControllerRef(pod.metadata.namespace, ref.group, ref.kind, ref.name, ref.uid)


def controllers_to_check(pods: Iterable[Pod]) -> list[ControllerRef]:
    """The distinct controllers of :data:`READABLE_CONTROLLERS` kinds the drain must read back: those of
    pods that are neither finished nor terminating (only they are evicted or block), sorted."""
    refs = set()
    for pod in pods:
        ref = controller_of(pod)
        if (
            ref is not None
            and (ref.group, ref.kind) in READABLE_CONTROLLERS
            and pod.status.phase not in ("Succeeded", "Failed")
            and pod.metadata.deletionTimestamp is None
        ):
            refs.add(ref)
    return sorted(refs)


def _gone(pod: Pod, ctx: PodContext) -> ControllerRef | None:
    ref = controller_of(pod)
    return ref if ref is not None and ref in ctx.gone_controllers else None


IgnoreFilter = Callable[[Pod], str | None]
BlockFilter = Callable[[Pod, PodContext], Finding | None]


def _terminal(pod: Pod) -> str | None:
    return "terminal_phase" if pod.status.phase in ("Succeeded", "Failed") else None


def _mirror(pod: Pod) -> str | None:
    return "mirror_pod" if MIRROR_ANNOTATION in pod.metadata.annotations else None


def _daemonset(pod: Pod) -> str | None:
    ref = pod.controller
    if ref is not None and (
        ref.kind == "DaemonSet" or pod.metadata.annotations.get(CA_DAEMONSET_POD) == "true"
    ):
        return "daemonset_pod"
    return None


def _terminating(pod: Pod) -> str | None:
    return "terminating" if pod.metadata.deletionTimestamp is not None else None


def _tolerates_cordon(pod: Pod) -> str | None:
    """Pods tolerating ``node.kubernetes.io/unschedulable:NoSchedule`` come back onto the cordoned node
    (Karpenter ``ToleratesDisruptedNoScheduleTaint``: not evicted, not waited for)."""
    for tol in pod.spec.tolerations:
        if tol.effect not in (None, "", "NoSchedule"):
            continue
        if (tol.operator == "Exists" and tol.key in (None, "", UNSCHEDULABLE_TAINT)) or (
            tol.key == UNSCHEDULABLE_TAINT and tol.operator != "Exists"
        ):
            return "tolerates_cordon"
    return None


IGNORE_FILTERS: tuple[IgnoreFilter, ...] = (_terminal, _mirror, _daemonset, _terminating, _tolerates_cordon)
"""Pods never evicted: finished, mirror (static), DaemonSet, already terminating (waited for by the
drain), and pods that tolerate the cordon. Only finished pods skip the blocking filters entirely."""


def _safe_to_evict(pod: Pod) -> bool:
    return pod.metadata.annotations.get(CA_SAFE_TO_EVICT) == "true"


def _replicated(pod: Pod, ctx: PodContext) -> bool:
    ref = pod.controller
    if ref is None or _gone(pod, ctx) is not None:
        return False
    return (
        ref.kind in REPLICATING_KINDS
        or ref.group in ctx.policy.batch_owner_groups
        or ref.group in ctx.policy.replicated_owner_groups
    )


def _bare(pod: Pod, ctx: PodContext) -> Finding | None:
    if ctx.policy.allow_bare_pods or _safe_to_evict(pod) or _replicated(pod, ctx):
        return None
    ref, gone = pod.controller, _gone(pod, ctx)
    if ref is None:
        why = "no controller will recreate it"
    elif gone is not None:
        why = f"its controller {gone.kind} {gone.name} no longer exists, so nothing will recreate it"
    else:
        why = (
            f"its controller {ref.kind}.{ref.group or 'core'} {ref.name} is not known to recreate pods "
            "(add its API group to replicated_owner_groups)"
        )
    return Finding("bare_pod", pod.key, f"{why}; set allow_bare_pods: true to evict")


def _safe_local_volumes(pod: Pod) -> set[str]:
    """Volumes the pod's owner declared disposable (Cluster Autoscaler ``safe-to-evict-local-volumes``)."""
    listed = pod.metadata.annotations.get(CA_SAFE_TO_EVICT_LOCAL_VOLUMES, "")
    return {name.strip() for name in listed.split(",") if name.strip()}


def _emptydir(pod: Pod, ctx: PodContext) -> Finding | None:
    safe = _safe_local_volumes(pod)
    if _safe_to_evict(pod):
        return None
    if (
        any(v.emptyDir is not None and v.name not in safe for v in pod.spec.volumes)
        and not ctx.policy.delete_emptydir_data
    ):
        return Finding(
            "local_storage", pod.key, "emptyDir data would be lost; set delete_emptydir_data: true to evict"
        )
    return None


def _node_local(pod: Pod, ctx: PodContext) -> Finding | None:
    """Data that lives on the node (``domain.volumes``): evicting loses it or strands the pod Pending."""
    if ctx.policy.evict_node_local_data:
        return None
    safe = _safe_local_volumes(pod)
    for volume in pod.spec.volumes:
        why = volume_local_data(pod, volume, ctx.volumes)
        # The opt-ins name volumes whose *data* may go; a claim pinned to this node would strand the pod.
        opted_in = volume.name in safe or _safe_to_evict(pod)
        if why and not (opted_in and volume.persistentVolumeClaim is None):
            return Finding(
                "local_storage",
                pod.key,
                f"{why}: its data stays on this node; set evict_node_local_data: true to evict",
            )
    return None


def _matching_pdbs(pod: Pod, ctx: PodContext) -> list[PodDisruptionBudget]:
    return [pdb for pdb in ctx.namespace_pdbs(pod.metadata.namespace) if pdb.selects(pod)]


def _system(pod: Pod, ctx: PodContext) -> Finding | None:
    if (
        pod.metadata.namespace == "kube-system"
        and not ctx.policy.evict_system_pods
        and not _safe_to_evict(pod)
        and not _matching_pdbs(pod, ctx)
    ):
        return Finding(
            "system_pod",
            pod.key,
            "kube-system pod without a PodDisruptionBudget; set evict_system_pods: true to evict",
        )
    return None


def _batch(pod: Pod, ctx: PodContext) -> Finding | None:
    if ctx.policy.evict_running_jobs or _safe_to_evict(pod):
        return None
    groups = set(ctx.policy.batch_owner_groups)
    for ref in pod.metadata.ownerReferences:
        if (ref.kind in ("Job", "CronJob") and ref.group in ("batch", "")) or ref.group in groups:
            return Finding(
                "running_batch_pod",
                pod.key,
                f"owned by {ref.kind} {ref.name}; set evict_running_jobs: true to evict running batch work",
            )
    return None


def _grace(pod: Pod, ctx: PodContext) -> Finding | None:
    if pod.grace_seconds + 60 > ctx.policy.drain_timeout:
        return Finding(
            "grace_exceeds_drain_timeout",
            pod.key,
            f"terminationGracePeriodSeconds {pod.grace_seconds} + 60 s exceeds drain_timeout "
            f"{ctx.policy.drain_timeout} s; raise drain_timeout",
        )
    return None


def _pdb(pod: Pod, ctx: PodContext) -> Finding | None:
    pdbs = _matching_pdbs(pod, ctx)
    names = ",".join(sorted(p.metadata.name for p in pdbs))
    if len(pdbs) > 1:
        return Finding(
            "multiple_pdbs",
            pod.key,
            f"matched by PodDisruptionBudgets {names}; the API server refuses to evict it",
            names,
        )
    if pdbs and pdbs[0].status.disruptionsAllowed <= 0 and not _unhealthy_evictable(pod, pdbs[0]):
        return Finding(
            "pdb_blocks",
            pod.key,
            f"PodDisruptionBudget {names} allows no disruption now",
            names,
        )
    return None


def _unhealthy_evictable(pod: Pod, pdb: PodDisruptionBudget) -> bool:
    """policy/v1 eviction of a pod that is not Ready: allowed regardless of the budget under
    ``unhealthyPodEvictionPolicy: AlwaysAllow``, and under the default ``IfHealthyBudget`` when the
    application is not disrupted (currentHealthy >= desiredHealthy)."""
    if pod.status.phase != "Running":
        return True  # the Eviction API spends no budget on a pod that is not running
    if pod.ready:
        return False
    if pdb.spec.unhealthyPodEvictionPolicy == "AlwaysAllow":
        return True
    return pdb.status.currentHealthy >= pdb.status.desiredHealthy > 0


def pod_do_not_disrupt(pod: Pod, at: datetime) -> str | None:
    """Which do-not-disrupt annotation protects the pod at ``at``, if any (docs/architecture.md §3 family).

    ``karpenter.sh/do-not-disrupt`` may be ``"true"`` or a positive Go duration (``time.ParseDuration``:
    ``90m``, ``1h30m``, ``1.5h``; no days) counted from ``status.startTime``; without a start time the pod
    is protected, and a value that is not a positive duration protects nothing (Karpenter
    ``IsDoNotDisruptActive``).
    """
    ann = pod.metadata.annotations
    if ann.get(ANN_DO_NOT_DISRUPT) == "true":
        return ANN_DO_NOT_DISRUPT
    if ann.get(CA_SAFE_TO_EVICT) == "false":
        return CA_SAFE_TO_EVICT
    karpenter = ann.get(KARPENTER_DO_NOT_DISRUPT)
    if karpenter is not None:
        if karpenter == "true":
            return KARPENTER_DO_NOT_DISRUPT
        try:
            seconds = parse_go_duration(karpenter)
        except ValueError:
            return None
        if seconds <= 0:
            return None
        start = pod.status.startTime
        if start is None or (at - start).total_seconds() < seconds:
            return KARPENTER_DO_NOT_DISRUPT
    return None


def _do_not_disrupt(pod: Pod, ctx: PodContext) -> Finding | None:
    found = pod_do_not_disrupt(pod, ctx.at)
    if found:
        return Finding(
            "do_not_disrupt", pod.key, f"annotated {found}; remove the annotation to allow eviction"
        )
    return None


BLOCK_FILTERS: tuple[BlockFilter, ...] = (
    _bare,
    _emptydir,
    _node_local,
    _system,
    _batch,
    _grace,
    _pdb,
    _do_not_disrupt,
)
"""Filters that block eviction; kubectl drain's (bare, emptyDir) come first, then ours."""


def gpu_holding(pod: Pod, claims_on_node: Mapping[str, ResourceClaim]) -> str | None:
    """Why a pod holds a GPU, or None (docs/architecture.md §3 "GPU holders").

    An (init) container requesting a GPU resource, a DRA ResourceClaim allocated on the node, a runtime
    class containing ``nvidia``, a privileged container, or ``NVIDIA_VISIBLE_DEVICES`` set to anything but
    "", "void" or "none" (a ``valueFrom``/``envFrom`` value counts as set, BUG-06).
    """
    for c in pod.all_containers():
        if any(is_gpu_resource(k) for k in (*c.resources.requests, *c.resources.limits)):
            return "requests a GPU resource"
    for ref in pod.spec.resourceClaims:
        name = ref.resourceClaimName
        if name is None:
            name = next(
                (s.resourceClaimName for s in pod.status.resourceClaimStatuses if s.name == ref.name), None
            )
        if name and f"{pod.metadata.namespace}/{name}" in claims_on_node:
            return f"DRA ResourceClaim {name}"
    for claim in claims_on_node.values():
        if claim.namespace == pod.metadata.namespace and pod.metadata.name in claim.reserved_for:
            return f"DRA ResourceClaim {claim.name}"
    if pod.spec.runtimeClassName and "nvidia" in pod.spec.runtimeClassName:
        return f"runtimeClassName {pod.spec.runtimeClassName}"
    for c in pod.all_containers():
        if c.securityContext is not None and c.securityContext.privileged:
            return f"privileged container {c.name}"
        for env in c.env:
            if env.name == NVIDIA_VISIBLE_DEVICES and (
                env.valueFrom is not None or (env.value or "").strip().lower() not in _NO_DEVICES
            ):
                return f"{NVIDIA_VISIBLE_DEVICES}={env.value if env.value is not None else '<valueFrom>'}"
        if c.envFrom:
            return "envFrom may set NVIDIA_VISIBLE_DEVICES"
    return None


ALWAYS_FILTERS: tuple[BlockFilter, ...] = (_pdb, _do_not_disrupt)
"""What still blocks for a pod that is not evicted but alive (DaemonSet, mirror, cordon-tolerating)."""


def classify_pod(pod: Pod, ctx: PodContext) -> PodClassification:
    """Run the filter chain on one pod; every blocking filter is evaluated so every reason is reported."""
    for ignore in IGNORE_FILTERS:
        why = ignore(pod)
        if why == "daemonset_pod" and _gone(pod, ctx) is not None:
            continue  # its DaemonSet is gone: nothing recreates it here or elsewhere, it is a bare pod
        if why:
            if why in ("terminal_phase", "terminating"):
                return PodClassification(pod, why, (), None)
            if why != "tolerates_cordon":
                findings = tuple(f for f in (flt(pod, ctx) for flt in ALWAYS_FILTERS) if f is not None)
                return PodClassification(pod, why, findings, None)
            # Not evicted (it would come back), but its instance still goes: everything that protects a
            # pod's work or data still applies (a GPU job tolerating every taint is still a GPU job).
            return _blocked(pod, ctx, why, tuple(f for f in BLOCK_FILTERS if f is not _grace))
    return _blocked(pod, ctx, None, BLOCK_FILTERS)


def _blocked(
    pod: Pod, ctx: PodContext, ignored: str | None, filters: Sequence[BlockFilter]
) -> PodClassification:
    findings = tuple(f for f in (flt(pod, ctx) for flt in filters) if f is not None)
    holder_why = gpu_holding(pod, ctx.claims_on_node)
    holder = None
    if holder_why:
        switch = "" if ctx.policy.evict_idle_gpu_holders else "; set evict_idle_gpu_holders: true to evict"
        holder = Finding("idle_gpu_holder", pod.key, f"holds a GPU ({holder_why}){switch}")
    return PodClassification(pod, ignored, findings, holder)


def classify_pods(pods: Sequence[Pod], ctx: PodContext) -> list[PodClassification]:
    """Classify every pod bound to one node."""
    return [classify_pod(p, ctx) for p in pods]


def tolerates(pod: Pod, node: Node) -> bool:
    """True when the pod's tolerations cover every NoSchedule/NoExecute taint of the node."""
    for taint in node.spec.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        ok = False
        for tol in pod.spec.tolerations:
            if tol.effect and tol.effect != taint.effect:
                continue
            if tol.operator == "Exists" and (tol.key is None or tol.key == taint.key):
                ok = True
                break
            if tol.key == taint.key and (tol.value or "") == taint.value:
                ok = True
                break
        if not ok:
            return False
    return True


def wants_node(pod: Pod, node: Node) -> bool:
    """A Pending, unscheduled pod requesting GPUs that could land on ``node`` (design ``pending_gpu_pods``).

    nodeSelector must match the node's labels and tolerations must cover its taints; node affinity is
    not evaluated, which errs on the side of keeping the node.
    """
    if pod.status.phase != "Pending" or pod.spec.nodeName or pod.gpu_request() == 0:
        return False
    if any(node.labels.get(k) != v for k, v in pod.spec.nodeSelector.items()):
        return False
    return tolerates(pod, node)
