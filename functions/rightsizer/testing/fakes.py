"""In-memory ``ClusterWriter`` and ``NodeScaler`` for unit tests of the drain service (sockets blocked).

Both are held to the contract suite ``tests/integration/test_writer_contract.py``, which runs every test
on the fake and on the real adapter — :class:`rightsizer.adapters.kubernetes.KubernetesCluster` against
:class:`rightsizer.testing.k8s.KubernetesDouble` over HTTP, and
:class:`rightsizer.adapters.autoscaling.AutoScalingGroups` against a moto server — so the fakes cannot drift.

:class:`FakeClusterWriter` keeps nodes, pods and PodDisruptionBudgets in memory and answers like the API
server (and the double): cordon/uncordon guarded by ``resourceVersion``; policy/v1 Eviction with the UID
precondition checked first, terminating/Pending/terminal pods skipping the budget, 500 for a pod under
two budgets, 429 naming the budget when ``status.disruptionsAllowed`` is 0 (or the status lags its
generation), the unhealthy-pod eviction policy; accepted evictions start a graceful deletion that ends
when the injectable clock passes ``deletionTimestamp``. PDB status is taken as given and only decremented
by accepted evictions (like ``KubernetesDouble.add_pdb(..., managed_status=False)``), and no controller
recreates evicted pods: add the replacement with :meth:`FakeClusterWriter.add_pod` (a new UID). As in the
double, ``add_pod`` creates the controller a pod names (ReplicaSet, StatefulSet, DaemonSet, Job,
ReplicationController) unless told not to, and :meth:`FakeClusterWriter.delete_controller` removes it.

Extras for tests: scripted eviction answers per pod (:meth:`FakeClusterWriter.script_eviction`, like the
double's ``inject``: they change nothing), a deny-list (403 as RBAC would answer), hooks that run between
a node GET and its PATCH (a concurrent writer, answered 409), and logs of calls, evictions and Events.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from rightsizer.adapters.aws_errors import ActionRefusedError
from rightsizer.adapters.kubernetes import EVENT_COMPONENT, EVENT_NAMESPACE, KubernetesAccessError
from rightsizer.adapters.kubernetes_writes import require_utc_rfc3339
from rightsizer.domain.errors import StalePlan, TransientError
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY, GroupSizes, opt_in_refusal
from rightsizer.domain.pods import READABLE_CONTROLLERS
from rightsizer.ports import JSON, AccessCheck, EvictionOutcome, ScalingFailure, ScalingGroup, TerminateResult
from rightsizer.testing.k8s import DEFAULT_GRACE_SECONDS, label_selector_matches, rfc3339, selected
from rightsizer.testing.k8s.api import controller_object

__all__ = ["FakeClock", "FakeClusterWriter", "FakeNodeScaler"]

Clock = Callable[[], float]
"""Epoch seconds."""
Call = tuple[str, ...]
"""One port call as recorded: the method name, then its arguments as strings."""

_TOO_MANY: Final = "Cannot evict pod as it would violate the pod's disruption budget."
_MULTIPLE_PDBS: Final = (
    "Internal error occurred: This pod has more than one PodDisruptionBudget, which the eviction "
    "subresource does not support."
)


class FakeClock:
    """A hand-moved clock: call it for epoch seconds (the ``clock`` of fakes and of the double)."""

    def __init__(self, start: datetime | float) -> None:
        """Args: start: an aware datetime or epoch seconds."""
        self.t = start.timestamp() if isinstance(start, datetime) else float(start)

    def __call__(self) -> float:
        """The current time in epoch seconds."""
        return self.t

    def now(self) -> datetime:
        """The current time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.t, UTC)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.t += seconds


def _pod_ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions")
    ready = next((c for c in conditions or [] if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


class FakeClusterWriter:
    """In-memory ``ClusterWriter`` (ports) with the API server's answers; thread-safe (one re-entrant lock).

    Seed with :meth:`add_node`, :meth:`add_pod`, :meth:`add_pdb` (kubectl-JSON dicts, e.g. from
    ``tests.builders``); every port method returns copies in kubectl form, like the adapter.
    """

    def __init__(
        self, *, clock: Clock | None = None, identity: str = "arn:aws:iam::123456789012:role/fake"
    ) -> None:
        """Args:
        clock: epoch seconds; drives grace periods and Event timestamps (default ``time.time``).
        identity: who the fake cluster sees, named in 403 errors.
        """
        self._clock: Clock = clock or time.time
        self._identity = identity
        self._lock = threading.RLock()
        self._nodes: dict[str, JSON] = {}
        self._pods: dict[tuple[str, str], JSON] = {}
        self._pdbs: dict[tuple[str, str], JSON] = {}
        self._pvcs: dict[tuple[str, str], JSON] = {}
        self._pvs: dict[str, JSON] = {}
        self._controllers: dict[tuple[str, str, str], JSON] = {}  # (plural, namespace, name) -> object
        self._deadlines: dict[str, tuple[float, tuple[str, str]]] = {}  # pod uid -> (gone at, key)
        self._scripts: dict[tuple[str, str], deque[EvictionOutcome | Exception]] = {}
        self._denied: set[tuple[str, str, str, str]] = set()
        self._patch_hooks: list[Callable[[str], None]] = []
        self._rv = 1000
        self._uids = 0
        #: Every port call in order, e.g. ``("evict", "ml", "trainer-2", "<uid>")``.
        self.calls: list[Call] = []
        #: (namespace, name, uid, outcome status) of every eviction answered.
        self.evictions: list[tuple[str, str, str, str]] = []
        #: Events created, in order, shaped as the adapter sends them plus name/uid/resourceVersion.
        self.events: list[JSON] = []

    # ------------------------------------------------------------------------------------ seeding

    def add_node(self, obj: JSON) -> JSON:
        """Store (or replace) a Node; fills uid/creationTimestamp when missing and bumps resourceVersion."""
        with self._lock:
            node = self._prepare(obj, "v1", "Node")
            self._nodes[node["metadata"]["name"]] = node
            return copy.deepcopy(node)

    def add_pod(self, obj: JSON, *, controller: bool = True) -> JSON:
        """Store (or replace) a Pod; ``status.phase`` defaults to Running when bound, else Pending.

        A pod carrying ``metadata.deletionTimestamp`` is terminating and goes when the clock passes it.
        With ``controller`` the controller the pod names is created when missing (as in the double).
        """
        with self._lock:
            owner = controller_object(obj) if controller else None
            if owner is not None:
                plural, owner_obj = owner
                key3 = (plural, owner_obj["metadata"]["namespace"], owner_obj["metadata"]["name"])
                if key3 not in self._controllers:
                    self._controllers[key3] = self._prepare(
                        owner_obj, owner_obj["apiVersion"], owner_obj["kind"]
                    )
            pod = self._prepare(obj, "v1", "Pod")
            meta = pod["metadata"]
            meta.setdefault("namespace", "default")
            status = pod.setdefault("status", {})
            status.setdefault("phase", "Running" if (pod.get("spec") or {}).get("nodeName") else "Pending")
            key = (meta["namespace"], meta["name"])
            self._pods[key] = pod
            if meta.get("deletionTimestamp"):
                deadline = datetime.fromisoformat(
                    meta["deletionTimestamp"].replace("Z", "+00:00")
                ).timestamp()
                self._deadlines[meta["uid"]] = (deadline, key)
            return copy.deepcopy(pod)

    def add_pdb(self, obj: JSON) -> JSON:
        """Store (or replace) a policy/v1 PodDisruptionBudget; its status is kept as given."""
        with self._lock:
            pdb = self._prepare(obj, "policy/v1", "PodDisruptionBudget")
            meta = pdb["metadata"]
            meta.setdefault("namespace", "default")
            meta.setdefault("generation", 1)
            self._pdbs[(meta["namespace"], meta["name"])] = pdb
            return copy.deepcopy(pdb)

    def add_pvc(self, obj: JSON) -> JSON:
        """Store (or replace) a core/v1 PersistentVolumeClaim."""
        with self._lock:
            pvc = self._prepare(obj, "v1", "PersistentVolumeClaim")
            meta = pvc["metadata"]
            meta.setdefault("namespace", "default")
            self._pvcs[(meta["namespace"], meta["name"])] = pvc
            return copy.deepcopy(pvc)

    def add_pv(self, obj: JSON) -> JSON:
        """Store (or replace) a core/v1 PersistentVolume."""
        with self._lock:
            pv = self._prepare(obj, "v1", "PersistentVolume")
            self._pvs[pv["metadata"]["name"]] = pv
            return copy.deepcopy(pv)

    def delete_controller(self, namespace: str, plural: str, name: str) -> bool:
        """Delete a controller object (``replicasets``, ``jobs``, ...), its pods orphaned."""
        with self._lock:
            return self._controllers.pop((plural, namespace, name), None) is not None

    def remove_pod(self, namespace: str, name: str) -> bool:
        """Remove a pod at once (its grace period over); returns whether it existed."""
        with self._lock:
            return self._pods.pop((namespace, name), None) is not None

    def delete_node(self, name: str) -> bool:
        """Remove a Node (its instance is gone) and the pods bound to it; returns whether it existed."""
        with self._lock:
            existed = self._nodes.pop(name, None) is not None
            for key, pod in list(self._pods.items()):
                if (pod.get("spec") or {}).get("nodeName") == name:
                    del self._pods[key]
            return existed

    def update_node(self, name: str, change: Callable[[JSON], None]) -> JSON:
        """Apply ``change`` to the stored Node in place and bump its resourceVersion (someone else's write)."""
        with self._lock:
            node = self._nodes[name]
            change(node)
            self._bump(node)
            return copy.deepcopy(node)

    # ----------------------------------------------------------------------------------- scripting

    def script_eviction(self, namespace: str, name: str, *answers: EvictionOutcome | Exception) -> None:
        """Answer the next evictions of ``namespace/name`` with ``answers`` in order (an exception is
        raised), before any real semantics; like ``KubernetesDouble.inject`` they change no state."""
        with self._lock:
            self._scripts.setdefault((namespace, name), deque()).extend(answers)

    def deny(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        """Refuse (verb, resource, subresource, group) with 403, as RBAC would; ``*`` matches any value."""
        with self._lock:
            self._denied.add((verb, resource, subresource, group))

    def allow(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        """Undo a :meth:`deny` with the same arguments."""
        with self._lock:
            self._denied.discard((verb, resource, subresource, group))

    def before_node_patch(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(node_name)`` between the GET and the PATCH of every cordon/uncordon — where a
        concurrent writer (:meth:`update_node`) makes the guarded patch answer 409."""
        with self._lock:
            self._patch_hooks.append(hook)

    # ------------------------------------------------------------------------------- ClusterWriter

    def get_node(self, name: str) -> JSON | None:
        """The Node ``name``, or None."""
        with self._lock:
            self.calls.append(("get_node", name))
            return self._get_node(name)

    def list_nodes(self) -> list[JSON]:
        """Every Node by name."""
        with self._lock:
            self.calls.append(("list_nodes",))
            self._authorize(AccessCheck("list", "nodes"))
            return [copy.deepcopy(n) for _, n in sorted(self._nodes.items())]

    def find_node(
        self, accept: Callable[[JSON], bool], *, label_selector: str = "", field_selector: str = ""
    ) -> JSON | None:
        """The first Node by name that the selectors (as the API server reads them) and ``accept`` take."""
        with self._lock:
            self.calls.append(("find_node", label_selector, field_selector))
            self._authorize(AccessCheck("list", "nodes"))
            for _, node in sorted(self._nodes.items()):
                if selected(node, label_selector, field_selector) and accept(copy.deepcopy(node)):
                    return copy.deepcopy(node)
            return None

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim, or None."""
        with self._lock:
            self.calls.append(("get_persistent_volume_claim", namespace, name))
            self._authorize(AccessCheck("get", "persistentvolumeclaims"))
            found = self._pvcs.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def get_persistent_volume(self, name: str) -> JSON | None:
        """The PersistentVolume, or None."""
        with self._lock:
            self.calls.append(("get_persistent_volume", name))
            self._authorize(AccessCheck("get", "persistentvolumes"))
            found = self._pvs.get(name)
            return copy.deepcopy(found) if found is not None else None

    def list_pods_on_node(self, node: str) -> list[JSON]:
        """Pods bound to ``node`` by (namespace, name), terminating ones included."""
        with self._lock:
            self.calls.append(("list_pods_on_node", node))
            self._authorize(AccessCheck("list", "pods"))
            self._reap()
            return [
                copy.deepcopy(pod)
                for _, pod in sorted(self._pods.items())
                if (pod.get("spec") or {}).get("nodeName") == node
            ]

    def list_pdbs(self, namespace: str | None = None) -> list[JSON]:
        """Every PodDisruptionBudget (of ``namespace`` when given) by (namespace, name)."""
        with self._lock:
            self.calls.append(("list_pdbs",) if namespace is None else ("list_pdbs", namespace))
            self._authorize(AccessCheck("list", "poddisruptionbudgets", group="policy"))
            return [
                copy.deepcopy(pdb)
                for (ns, _), pdb in sorted(self._pdbs.items())
                if namespace is None or ns == namespace
            ]

    def get_controller(self, namespace: str, group: str, kind: str, name: str) -> JSON | None:
        """The controller object, or None; a kind outside ``READABLE_CONTROLLERS`` is a ValueError."""
        plural = READABLE_CONTROLLERS.get((group, kind))
        if plural is None:
            raise ValueError(f"cannot read controller kind {kind}.{group or 'core'}")
        with self._lock:
            self.calls.append(("get_controller", namespace, plural, name))
            self._authorize(AccessCheck("get", plural, group=group))
            found = self._controllers.get((plural, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The pod (terminating or not), or None once it is gone."""
        with self._lock:
            self.calls.append(("get_pod", namespace, name))
            self._authorize(AccessCheck("get", "pods"))
            self._reap()
            found = self._pods.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def cordon(self, node: str, execution_id: str, at: str) -> JSON:
        """Cordon as the adapter does; raises ``StalePlan`` ``node_not_found`` / ``cordoned_by_other`` /
        ``uncordoned_by_other`` / ``node_changed`` in the same cases (see ``KubernetesCluster.cordon``)."""
        with self._lock:
            self.calls.append(("cordon", node, execution_id, at))
            require_utc_rfc3339(at)
            current = self._get_node(node)
            if current is None:
                raise StalePlan("node_not_found")
            annotations = current["metadata"].get("annotations") or {}
            unschedulable = bool((current.get("spec") or {}).get("unschedulable"))
            if annotations.get(ANN_CORDONED_BY) == execution_id:
                if unschedulable:
                    return current
                raise StalePlan("uncordoned_by_other")
            if unschedulable:
                raise StalePlan("cordoned_by_other")

            def cordoned(stored: JSON) -> None:
                stored["metadata"].setdefault("annotations", {}).update(
                    {ANN_CORDONED_BY: execution_id, ANN_CORDONED_AT: at}
                )
                stored.setdefault("spec", {})["unschedulable"] = True

            status, patched = self._guarded_patch(node, current["metadata"]["resourceVersion"], cordoned)
            if status == 404:
                raise StalePlan("node_not_found")
            if status == 409:
                raise StalePlan("node_changed")
            assert patched is not None
            return patched

    def uncordon(self, node: str, execution_id: str) -> bool:
        """Uncordon only our cordon for ``execution_id``, retrying once on a concurrent change (409)."""
        with self._lock:
            self.calls.append(("uncordon", node, execution_id))

            def uncordoned(stored: JSON) -> None:
                annotations = stored["metadata"].setdefault("annotations", {})
                annotations.pop(ANN_CORDONED_BY, None)
                annotations.pop(ANN_CORDONED_AT, None)
                stored.setdefault("spec", {})["unschedulable"] = False

            for _attempt in (1, 2):
                current = self._get_node(node)
                if current is None:
                    return False
                if (current["metadata"].get("annotations") or {}).get(ANN_CORDONED_BY) != execution_id:
                    return False
                status, _ = self._guarded_patch(node, current["metadata"]["resourceVersion"], uncordoned)
                if status == 404:
                    return False
                if status != 409:
                    return True
            raise StalePlan("node_changed")

    def evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        """policy/v1 Eviction semantics (see the module docstring); scripted answers come first."""
        with self._lock:
            self.calls.append(("evict", namespace, name, uid))
            self._authorize(AccessCheck("create", "pods", "eviction"))
            script = self._scripts.get((namespace, name))
            if script:
                answer = script.popleft()
                if isinstance(answer, Exception):
                    raise answer
                return self._answered(namespace, name, uid, answer)
            self._reap()
            outcome = self._evict(namespace, name, uid)
            return self._answered(namespace, name, uid, outcome)

    def emit_event(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Record an Event shaped as the adapter sends it; a denied ``create events`` is swallowed."""
        with self._lock:
            self.calls.append(("emit_event", node, reason))
            try:
                found = self._get_node(node)
                self._authorize(AccessCheck("create", "events"))
            except KubernetesAccessError:
                return  # best effort, as the adapter: logged there, nothing recorded here
            at = datetime.fromtimestamp(self._clock(), UTC)
            self._uids += 1
            event: JSON = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{node}.{self._uids:x}",
                    "namespace": EVENT_NAMESPACE,
                    "uid": f"fake-event-uid-{self._uids}",
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    **({"uid": found["metadata"]["uid"]} if found else {}),
                },
                "reason": reason,
                "message": message[:1024],
                "type": "Warning" if warning else "Normal",
                "action": reason,
                "source": {"component": EVENT_COMPONENT},
                "reportingComponent": EVENT_COMPONENT,
                "reportingInstance": f"{EVENT_COMPONENT}-fake",
                "firstTimestamp": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "lastTimestamp": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "eventTime": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "count": 1,
            }
            self._bump(event)
            self.events.append(event)

    # ----------------------------------------------------------------------------------- internals

    def _prepare(self, obj: JSON, api_version: str, kind: str) -> JSON:
        stored = copy.deepcopy(obj)
        stored.setdefault("apiVersion", api_version)
        stored.setdefault("kind", kind)
        meta = stored.setdefault("metadata", {})
        if not meta.get("uid"):
            self._uids += 1
            meta["uid"] = f"fake-uid-{self._uids}"
        meta.setdefault("creationTimestamp", rfc3339(self._clock()))
        self._bump(stored)
        return stored

    def _bump(self, obj: JSON) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def _authorize(self, check: AccessCheck) -> None:
        wanted = (check.verb, check.resource, check.subresource, check.group)
        if any(all(d in ("*", w) for d, w in zip(rule, wanted, strict=True)) for rule in self._denied):
            raise KubernetesAccessError(
                f"Kubernetes API answered 403 Forbidden: {self._identity} may not {check.describe()} "
                "(denied by the FakeClusterWriter's deny-list).",
                identity=self._identity,
                check=check,
                status=403,
            )

    def _get_node(self, name: str) -> JSON | None:
        self._authorize(AccessCheck("get", "nodes"))
        found = self._nodes.get(name)
        return copy.deepcopy(found) if found is not None else None

    def _guarded_patch(
        self, node: str, resource_version: str, change: Callable[[JSON], None]
    ) -> tuple[int, JSON | None]:
        """A PATCH carrying ``metadata.resourceVersion``: (404, None), (409, None) or (200, the node)."""
        for hook in list(self._patch_hooks):
            hook(node)
        self._authorize(AccessCheck("patch", "nodes"))
        stored = self._nodes.get(node)
        if stored is None:
            return 404, None
        if stored["metadata"]["resourceVersion"] != resource_version:
            return 409, None
        change(stored)
        self._bump(stored)
        return 200, copy.deepcopy(stored)

    def _answered(self, namespace: str, name: str, uid: str, outcome: EvictionOutcome) -> EvictionOutcome:
        self.evictions.append((namespace, name, uid, outcome.status))
        return outcome

    def _evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        key = (namespace, name)
        pod = self._pods.get(key)
        if pod is None:
            return EvictionOutcome("gone", f'pods "{name}" not found')
        actual = pod["metadata"]["uid"]
        # The UID precondition is checked before any budget is spent, as the API server does.
        if uid and uid != actual:
            return EvictionOutcome(
                "uid_mismatch",
                f'Operation cannot be fulfilled on pods "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {actual}",
            )
        phase = (pod.get("status") or {}).get("phase")
        if pod["metadata"].get("deletionTimestamp") or phase in ("Pending", "Succeeded", "Failed"):
            self._delete_pod(key, pod)
            return EvictionOutcome("accepted")
        budgets = self._matching_pdbs(pod)
        if len(budgets) > 1:
            return EvictionOutcome("error", _MULTIPLE_PDBS)
        if budgets:
            blocked = self._spend_budget(budgets[0], pod)
            if blocked is not None:
                return blocked
        self._delete_pod(key, pod)
        return EvictionOutcome("accepted")

    def _matching_pdbs(self, pod: JSON) -> list[JSON]:
        labels = pod["metadata"].get("labels") or {}
        return [
            pdb
            for (pdb_namespace, _), pdb in sorted(self._pdbs.items())
            if pdb_namespace == pod["metadata"]["namespace"]
            and label_selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]

    def _spend_budget(self, pdb: JSON, pod: JSON) -> EvictionOutcome | None:
        """The Eviction API's check-and-decrement; returns the 429 outcome, or None when spent."""
        name = pdb["metadata"]["name"]
        status = pdb.setdefault("status", {})
        current, desired = int(status.get("currentHealthy", 0)), int(status.get("desiredHealthy", 0))
        if not _pod_ready(pod):
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            if policy == "AlwaysAllow" or current >= desired > 0:
                return None
        observed = status.get("observedGeneration")
        if observed is not None and int(observed) < int(pdb["metadata"].get("generation", 1)):
            return EvictionOutcome(
                "blocked", f"{_TOO_MANY} The disruption budget {name} is still being processed by the server."
            )
        allowed = int(status.get("disruptionsAllowed", 0))
        if allowed <= 0:
            return EvictionOutcome(
                "blocked",
                f"{_TOO_MANY} The disruption budget {name} needs {desired} healthy pods and has {current} currently",
            )
        status["disruptionsAllowed"] = allowed - 1
        status.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = rfc3339(self._clock())
        self._bump(pdb)
        return None

    def _delete_pod(self, key: tuple[str, str], pod: JSON) -> None:
        """Start a graceful deletion; unbound, terminal and zero-grace pods go at once."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return  # already terminating: its deadline stands
        grace = max(0, int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)))
        if (
            grace == 0
            or not spec.get("nodeName")
            or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            del self._pods[key]
            return
        now = self._clock()
        meta["deletionTimestamp"] = rfc3339(now + grace)
        meta["deletionGracePeriodSeconds"] = grace
        self._deadlines[meta["uid"]] = (now + grace, key)
        self._bump(pod)

    def _reap(self) -> None:
        now = self._clock()
        for uid, (deadline, key) in list(self._deadlines.items()):
            if deadline > now:
                continue
            pod = self._pods.get(key)
            if pod is not None and pod["metadata"]["uid"] == uid and not _kubelet_confirms(pod, self._nodes):
                continue  # stuck terminating (finalizers, NotReady node), as in the double
            del self._deadlines[uid]
            if pod is not None and pod["metadata"]["uid"] == uid:
                del self._pods[key]


def _kubelet_confirms(pod: JSON, nodes: Mapping[str, JSON]) -> bool:
    """A pod past its grace period goes only without finalizers and with its node's kubelet Ready."""
    if pod["metadata"].get("finalizers"):
        return False
    node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")


# ------------------------------------------------------------------------------------------ NodeScaler


@dataclass
class _Group:
    min_size: int
    desired: int
    max_size: int
    states: dict[str, str] = field(default_factory=dict)  # instance id -> LifecycleState


class FakeNodeScaler:
    """In-memory ``NodeScaler`` (ports) with ``AutoScalingGroups``' answers; thread-safe.

    A terminated instance leaves its group at once (as on the moto server; AWS shows it Terminating for a
    few minutes, which the adapter treats the same way: already done, not InService).
    """

    def __init__(self) -> None:
        """An empty account; add groups with :meth:`add_group`."""
        self._lock = threading.RLock()
        self._groups: dict[str, _Group] = {}
        self._failures: dict[str, deque[Exception]] = {}
        self._tags: dict[str, dict[str, str] | None] = {}
        #: Every port call in order, e.g. ``("terminate", "eks-gpu-…", "i-0b")``.
        self.calls: list[Call] = []
        #: Instance ids terminated through :meth:`terminate`, in order.
        self.terminated: list[str] = []

    def add_group(
        self,
        name: str,
        *,
        min_size: int,
        desired: int,
        max_size: int,
        instance_ids: Iterable[str],
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Create (or replace) an Auto Scaling group whose instances are all InService. ``tags`` None =
        opted in for any cluster; given, :func:`rightsizer.domain.model.opt_in_refusal` judges them."""
        with self._lock:
            self._groups[name] = _Group(min_size, desired, max_size, dict.fromkeys(instance_ids, "InService"))
            self._tags[name] = None if tags is None else dict(tags)

    def opt_in_refusal(self, asg_name: str, cluster: str) -> str | None:
        """None for a group added without tags; else the domain rule over its tags."""
        with self._lock:
            self.calls.append(("opt_in_refusal", asg_name))
            self._sizes(asg_name)  # StalePlan for an unknown group, as the adapter
            tags = self._tags.get(asg_name)
            return None if tags is None else opt_in_refusal(tags, cluster, asg=True)

    def set_sizes(
        self,
        name: str,
        *,
        min_size: int | None = None,
        desired: int | None = None,
        max_size: int | None = None,
    ) -> None:
        """Change a group's sizes (someone else's UpdateAutoScalingGroup)."""
        with self._lock:
            group = self._groups[name]
            group.min_size = group.min_size if min_size is None else min_size
            group.desired = group.desired if desired is None else desired
            group.max_size = group.max_size if max_size is None else max_size

    def set_state(self, instance_id: str, state: str) -> None:
        """Set a member's LifecycleState (``Pending``, ``Standby``, ``Terminating``…)."""
        with self._lock:
            name = self._member_of(instance_id)
            if name is None:
                raise KeyError(instance_id)
            self._groups[name].states[instance_id] = state

    def fail_next(self, operation: str, error: Exception) -> None:
        """Raise ``error`` from the next call of ``operation`` (``find_group``, ``describe_group``, ``terminate``)."""
        with self._lock:
            self._failures.setdefault(operation, deque()).append(error)

    def find_group(self, instance_id: str) -> str | None:
        """The group of ``instance_id``, or None when standalone or unknown."""
        with self._lock:
            self.calls.append(("find_group", instance_id))
            self._maybe_fail("find_group")
            return self._member_of(instance_id)

    def describe_group(self, asg_name: str) -> ScalingGroup:
        """Sizes, members and tags of the group; ``StalePlan`` when the group is unknown."""
        with self._lock:
            self.calls.append(("describe_group", asg_name))
            self._maybe_fail("describe_group")
            return self._sizes(asg_name)

    def failed_activities(self, asg_name: str, since: datetime) -> list[ScalingFailure]:
        """No launch ever fails in this account: always ``[]``."""
        with self._lock:
            self.calls.append(("failed_activities", asg_name))
            return []

    def terminate(self, asg_name: str, instance_id: str) -> TerminateResult:
        """Targeted scale-in with ``AutoScalingGroups.terminate``'s checks and errors (BUG-23)."""
        with self._lock:
            self.calls.append(("terminate", asg_name, instance_id))
            self._maybe_fail("terminate")
            member_of = self._member_of(instance_id)
            if member_of is None:
                desired = self._groups[asg_name].desired if asg_name in self._groups else 0
                return TerminateResult(asg_name, instance_id, desired, desired, already_done=True)
            if member_of != asg_name:
                raise StalePlan(
                    f"{instance_id} belongs to Auto Scaling group {member_of!r}, not {asg_name!r}"
                )
            group = self._groups[asg_name]
            state = group.states[instance_id]
            if state.startswith(("Terminating", "Terminated")):
                return TerminateResult(asg_name, instance_id, group.desired, group.desired, already_done=True)
            if state.startswith(("Pending", "EnteringStandby")):
                raise TransientError(f"{instance_id} is {state}, not InService yet", retry_after=30.0)
            if state != "InService":
                raise StalePlan(f"{instance_id} is {state} in {asg_name}, not InService")
            if group.desired - 1 < group.min_size:
                raise ActionRefusedError(
                    f"removing {instance_id} would take {asg_name} below MinSize: DesiredCapacity "
                    f"{group.desired} - 1 < MinSize {group.min_size}; lower MinSize first or skip this node",
                    reasons=["node_group_at_min_size"],
                )
            before = group.desired
            del group.states[instance_id]
            group.desired -= 1
            self.terminated.append(instance_id)
            return TerminateResult(asg_name, instance_id, before, group.desired, already_done=False)

    def _sizes(self, asg_name: str) -> ScalingGroup:
        group = self._groups.get(asg_name)
        if group is None:
            raise StalePlan(f"Auto Scaling group {asg_name!r} not found")
        in_service = frozenset(i for i, s in group.states.items() if s == "InService")
        return ScalingGroup(
            asg_name,
            GroupSizes(group.min_size, group.desired, group.max_size),
            in_service,
            frozenset(group.states),
            dict(self._tags.get(asg_name) or {}),
        )

    def _member_of(self, instance_id: str) -> str | None:
        return next((name for name, g in self._groups.items() if instance_id in g.states), None)

    def _maybe_fail(self, operation: str) -> None:
        pending = self._failures.get(operation)
        if pending:
            raise pending.popleft()
