"""A stateful Kubernetes API server double, served over real HTTP on 127.0.0.1.

The demo and the integration tests point the official ``kubernetes`` client (or httpx) at
``KubernetesDouble().start()`` instead of patching clients, so the adapters are exercised down to the
wire: paths, query parameters, content types, status codes and ``Status`` bodies.

Semantics covered (what GPU Rightsizer calls):

- Resources: core/v1 ``nodes`` and ``persistentvolumes`` (cluster-scoped), ``pods``, ``events``,
  ``persistentvolumeclaims``; policy/v1 ``poddisruptionbudgets``; the controllers apps/v1 ``daemonsets``,
  ``replicasets``, ``statefulsets``, batch/v1 ``jobs`` and core/v1 ``replicationcontrollers`` (get/list:
  ``add_pod`` creates the controller a pod names unless told not to, ``delete_controller`` removes it, and
  only pods whose controller exists are recreated); resource.k8s.io ``resourceclaims`` and ``resourceslices`` (get/list)
  in any configured subset of ``v1``, ``v1beta2``, ``v1beta1`` (or not served at all). DRA objects are
  stored in the v1 shape and converted on the way out for v1beta1 (``devices[].basic`` and
  ``requests[].exactly`` are the only structural differences the product reads).
- Discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``
  (legacy, non-aggregated documents; aggregated discovery ``Accept`` headers get the legacy form).
- Reads: get; list at all-namespace and namespaced paths with ``labelSelector`` (``=``, ``==``, ``!=``,
  ``in``, ``notin``, ``key``, ``!key``), ``fieldSelector`` (``=``, ``==``, ``!=`` over the fields the real
  server supports for that resource, ``metadata.name`` and ``metadata.namespace`` everywhere),
  ``limit``/``continue`` pagination over a consistent snapshot taken by the first page (opaque token,
  ``remainingItemCount`` when no selector is used), list ``metadata.resourceVersion``. As on the real
  server, list items carry no ``kind``/``apiVersion``.
- Writes: one global ``resourceVersion`` counter bumped by every write; create (POST; ``generateName``;
  409 AlreadyExists), update (PUT) and patch with ``metadata.resourceVersion`` preconditions (409
  Conflict). Patches are ``application/merge-patch+json`` (RFC 7386), the one format the product sends;
  any other patch type is 415 UnsupportedMediaType. Writes to the main resource keep ``status`` unchanged,
  as for any resource with a status subresource. PodDisruptionBudget spec changes bump
  ``metadata.generation``.
- Pods: graceful deletion (``deletionTimestamp`` = now + grace, ``deletionGracePeriodSeconds``; grace from
  DeleteOptions, else ``spec.terminationGracePeriodSeconds``, else 30 s); unscheduled and terminal pods and
  a grace of 0 go at once; UID and resourceVersion preconditions. By default the containers use their whole
  grace period (the worst case); ``container_exit_seconds`` makes them exit that long after SIGTERM, so the
  kubelet removes the pod before ``deletionTimestamp``, as it does for a workload that handles SIGTERM. A pod
  past that stays terminating while it has ``metadata.finalizers`` or its node is NotReady (no kubelet
  confirms the stop), until its node is deleted.
- Eviction (policy/v1): 201 with a Success ``Status``; 404; 409 on a UID precondition mismatch (checked
  before any budget is spent); Pending, terminal and terminating pods skip the budget; 500 InternalError for
  a pod matched by more than one PodDisruptionBudget; 429 TooManyRequests with a ``DisruptionBudget`` cause
  when ``status.disruptionsAllowed`` is 0 or the budget's status is older than its generation; 403 when
  negative; not-ready pods follow ``unhealthyPodEvictionPolicy`` (IfHealthyBudget, AlwaysAllow).
- Disruption controller: PDB status (expectedPods, currentHealthy, desiredHealthy, disruptionsAllowed,
  observedGeneration, the DisruptionAllowed condition) is recomputed after pod changes from
  ``minAvailable``/``maxUnavailable`` (integer or percent, rounded up) over matching pods that are Running,
  not terminating and not marked unready. ``add_pdb(obj, managed_status=False)`` freezes a status instead
  (only evictions decrement it), to simulate a lagging controller.
- Workload controllers: a pod owned by a ReplicaSet gets a replacement (new UID, new random name suffix)
  as soon as it starts terminating, as the ReplicaSet controller ignores terminating pods; StatefulSet pods
  (same name) and DaemonSet pods (same node) come back once the old pod is gone. The node is chosen by a
  pluggable placement function (default: the first Ready, schedulable node by name other than the old one,
  honouring ``nodeSelector`` and NoSchedule/NoExecute taints); without one the pod stays Pending and is
  retried on every later request. Owner kinds that are recreated are configurable.
- Time: an injectable clock (epoch seconds), a ``time_scale`` and ``advance(seconds)``; expired pods are
  reaped lazily on every request and by ``reap()``. No background threads besides the HTTP server.
- Node lifecycle: ``delete_node(name)`` (its pods go as pod garbage collection would), and ``on_request``
  hooks called before each request is served, e.g. to follow EC2 instance state.
- Authorization: ``SelfSubjectAccessReview`` answers from a deny-list of (verb, resource, subresource,
  group); by default the same deny-list is enforced on real requests (403 Forbidden, like RBAC).
- Faults: a bearer-token mode (401 for any token not accepted; tokens can be revoked mid-run), queued
  injected responses per method and path regex (``times`` or forever), and a request log.

Deliberately not covered: watch (``watch=true`` answers 400), server-side apply, JSON patch and strategic
merge patch, field managers, admission, validation of object schemas, namespaces as
objects, finalizer removal by controllers, ``dryRun``, ``propagationPolicy``, consistent reads at a requested ``resourceVersion``,
protobuf/CBOR, and scheduling by resource requests. Continue tokens expire (410 Expired) only once 64 newer
paginations have started; inject a 410 to test that path. A PDB with neither ``minAvailable`` nor
``maxUnavailable`` desires 0 healthy pods. Authentication (401) is checked before injected responses.
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from rightsizer.testing.k8s.api import (
    _RECREATED_BY_DEFAULT,
    _RESOURCES,
    DRA_VERSIONS,
    JSON,
    Clock,
    Placement,
    RecordedRequest,
    _Injection,
    _Key,
    _PageSnapshot,
    controller_object,
)
from rightsizer.testing.k8s.controllers import _dra_from, first_fit
from rightsizer.testing.k8s.server import _list_key, _Server, _Serving


class KubernetesDouble(_Serving):
    """A stateful Kubernetes API server double on ``http://127.0.0.1:<port>``; see the module docstring.

    Every public method is thread-safe; objects go in and come out as plain dicts shaped like
    ``kubectl get -o json`` output, and come out as copies.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        time_scale: float = 1.0,
        resource_api_versions: Iterable[str] | None = ("v1",),
        placement: Placement | None = None,
        replacement_start_seconds: float = 0.0,
        denied: Iterable[tuple[str, str, str, str]] = (),
        enforce_denials: bool = True,
        server_version: tuple[int, int] = (1, 33),
        user: str = "rightsizer",
        seed: int | None = None,
        container_exit_seconds: float | None = None,
    ) -> None:
        """Create an empty cluster (no server yet; see ``start``).

        Args:
            clock: epoch seconds; defaults to ``time.time``.
            time_scale: how many double-seconds pass per clock second (e.g. 60 runs grace periods 60×).
            resource_api_versions: served versions of resource.k8s.io among v1/v1beta2/v1beta1; None or
                empty when the group is not served.
            placement: chooses the node of a replacement pod; defaults to ``first_fit``.
            replacement_start_seconds: seconds a scheduled replacement stays Pending before Running/Ready.
            denied: (verb, resource, subresource, group) tuples the caller is not allowed; ``*`` matches any.
            enforce_denials: also answer 403 to real requests the deny-list forbids, as RBAC would.
            server_version: (major, minor) reported by ``/version``.
            user: the user name in Forbidden messages.
            seed: makes generated UIDs and name suffixes reproducible.
            container_exit_seconds: seconds a terminating pod's containers take to exit after SIGTERM (capped
                by its grace period); None = they use the whole grace period.
        """
        self._clock: Clock = clock or time.time
        self._time_scale = time_scale
        self._exit_s = container_exit_seconds
        self._epoch = self._clock()
        self._offset = 0.0
        self._placement: Placement = placement or first_fit
        self._replacement_start = replacement_start_seconds
        self._denied: set[tuple[str, str, str, str]] = set(denied)
        self._rules: list[tuple[frozenset[str], frozenset[str], frozenset[str]]] | None = None
        self._enforce_denials = enforce_denials
        self._server_version = server_version
        self._user = user
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._store: dict[str, dict[tuple[str, str], JSON]] = {plural: {} for plural in _RESOURCES}
        self._rv = 1000
        self._dra_versions: tuple[str, ...] = ()
        self.set_resource_api_versions(resource_api_versions)
        self._recreated_kinds = set(_RECREATED_BY_DEFAULT)
        self._deadlines: dict[str, tuple[float, _Key]] = {}  # pod uid -> (when it is gone, its key)
        self._replaced: set[str] = set()  # uids of terminating pods whose replacement already exists
        self._unplaced: dict[str, tuple[_Key, str | None]] = {}  # replacement uid -> (key, node to avoid)
        self._starting: dict[str, tuple[float, _Key]] = {}  # replacement uid -> (when Running, key)
        self._frozen_pdbs: set[tuple[str, str]] = set()
        self._pdbs_dirty = False
        self._pages: dict[str, _PageSnapshot] = {}
        self._encoded: dict[tuple[str, ...], _PageSnapshot] = {}  # encode_lists
        self._tokens: set[str] | None = None
        self._injections: list[_Injection] = []
        self._requests: list[RecordedRequest] = []
        self._hooks: list[Callable[[RecordedRequest], None]] = []
        self._internal_errors: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (``port`` 0 picks a free one) and return the base URL."""
        if self._server is None:
            self._server = _Server(("127.0.0.1", port), self)
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving and close open keep-alive connections; state is kept."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.close_connections()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server."""
        if self._server is None:
            raise RuntimeError("the Kubernetes double is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def encode_lists(self, *paths: str) -> None:
        """Encode the unselected lists at ``paths`` (collection paths such as ``/api/v1/pods``) now and
        answer them from these bytes for as long as the store does not change (any write bumps the
        resourceVersion, and the next list is encoded anew); answers are the same bytes either way.

        For benchmarks, before their clock starts: a real API server encodes its lists on its own
        machines, so the double's Python encoding (~0.4 CPU-ms a 5.7 KiB pod) is no cost of the client
        under test. Raises ``ApiError`` (404) for a path that names no served collection.
        """
        with self._lock:
            for path in paths:
                target = self._target([part for part in path.split("/") if part])
                self._encoded[_list_key(target, "", "")] = self._encode_list(target, "", "")

    def __enter__(self) -> KubernetesDouble:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @classmethod
    def from_snapshot_dir(cls, path: str | Path, **kwargs: Any) -> KubernetesDouble:
        """Load ``nodes.json``, ``pods.json`` and the optional ``pdbs.json``, ``resourceclaims.json`` and
        ``resourceslices.json`` (kubectl ``List`` or typed list JSON) from a snapshot directory.

        Without an explicit ``resource_api_versions`` the DRA group is served in the versions the files
        use (v1 when they are empty), or not at all when both files are absent, as the snapshot contract
        says.
        """
        directory = Path(path)

        def items(name: str) -> list[JSON] | None:
            file = directory / name
            if not file.exists():
                return None
            return list(json.loads(file.read_text()).get("items") or [])

        claims, slices = items("resourceclaims.json"), items("resourceslices.json")
        if "resource_api_versions" not in kwargs:
            found = {str(o.get("apiVersion", "")).rpartition("/")[2] for o in (claims or []) + (slices or [])}
            served = [v for v in DRA_VERSIONS if v in found] or ["v1"]
            kwargs["resource_api_versions"] = None if claims is None and slices is None else served
        double = cls(**kwargs)
        for node in items("nodes.json") or []:
            double.add_node(node)
        for pod in items("pods.json") or []:
            double.add_pod(pod)
        for pdb in items("pdbs.json") or []:
            double.add_pdb(pdb)
        for claim in claims or []:
            double.add_resource_claim(claim)
        for resource_slice in slices or []:
            double.add_resource_slice(resource_slice)
        return double

    # ------------------------------------------------------------------------------------ seeding

    def add_node(self, obj: JSON) -> JSON:
        """Store (or replace) a Node; returns the stored copy with uid, resourceVersion and timestamps."""
        return self._add("nodes", obj)

    def add_pod(self, obj: JSON, *, controller: bool = True) -> JSON:
        """Store (or replace) a Pod; ``status.phase`` defaults to Running when scheduled, else Pending.

        With ``controller`` the ReplicaSet, StatefulSet, DaemonSet, Job or ReplicationController the pod
        names is created too when missing (a pod with a controller exists because its controller made it);
        without, the pod's controller stays as it is (absent: an orphan).
        """
        with self._lock:
            owner = controller_object(obj) if controller else None
            if owner is not None:
                plural, owner_obj = owner
                key = (owner_obj["metadata"]["namespace"], owner_obj["metadata"]["name"])
                if key not in self._store[plural]:
                    self._add(plural, owner_obj)
            return self._add("pods", obj)

    def delete_controller(self, namespace: str, plural: str, name: str) -> bool:
        """Delete a controller object (``replicasets``, ``jobs``, ...) with its pods orphaned, as
        ``kubectl delete --cascade=orphan`` does; returns whether it existed."""
        with self._lock:
            gone = self._store[plural].pop((namespace, name), None) is not None
            if gone:
                self._touched(_RESOURCES[plural])
            return gone

    def add_pdb(self, obj: JSON, *, managed_status: bool = True) -> JSON:
        """Store (or replace) a policy/v1 PodDisruptionBudget.

        With ``managed_status`` the double computes its status from the pods, as the disruption controller
        does; without, the given status is kept and only accepted evictions decrement it.
        """
        with self._lock:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace") or "default", meta.get("name", ""))
            (self._frozen_pdbs.discard if managed_status else self._frozen_pdbs.add)(key)
            return self._add("poddisruptionbudgets", obj)

    def add_daemonset(self, obj: JSON) -> JSON:
        """Store (or replace) an apps/v1 DaemonSet."""
        return self._add("daemonsets", obj)

    def add_pvc(self, obj: JSON) -> JSON:
        """Store a core/v1 PersistentVolumeClaim (namespaced)."""
        return self._add("persistentvolumeclaims", obj)

    def add_pv(self, obj: JSON) -> JSON:
        """Store a core/v1 PersistentVolume (cluster-scoped)."""
        return self._add("persistentvolumes", obj)

    def add_resource_claim(self, obj: JSON) -> JSON:
        """Store (or replace) a ResourceClaim of any resource.k8s.io version (kept in the v1 shape)."""
        return self._add("resourceclaims", _dra_from(obj))

    def add_resource_slice(self, obj: JSON) -> JSON:
        """Store (or replace) a ResourceSlice of any resource.k8s.io version (kept in the v1 shape)."""
        return self._add("resourceslices", _dra_from(obj))

    def add_event(self, obj: JSON) -> JSON:
        """Store (or replace) a core/v1 Event."""
        return self._add("events", obj)

    def add_object(self, plural: str, obj: JSON) -> JSON:
        """Store (or replace) an object of any served resource (``deployments``, ``notebooks``,
        ``scaledobjects``...); returns it as stored (uid, resourceVersion, creationTimestamp set)."""
        return self._add(plural, obj)

    def get_object(self, plural: str, namespace: str, name: str) -> JSON | None:
        """The object ``namespace/name`` of ``plural``, or None."""
        return self._get(plural, namespace, name)

    def _add(self, plural: str, obj: JSON) -> JSON:
        res = _RESOURCES[plural]
        with self._lock:
            stored = self._prepare_new(res, copy.deepcopy(obj), (obj.get("metadata") or {}).get("namespace"))
            key = self._key(res, stored)
            previous = self._store[plural].get(key)
            if previous is not None and "uid" not in (obj.get("metadata") or {}):
                stored["metadata"]["uid"] = previous["metadata"]["uid"]
                stored["metadata"]["creationTimestamp"] = previous["metadata"]["creationTimestamp"]
            self._bump(stored)
            self._store[plural][key] = stored
            deleting = stored["metadata"].get("deletionTimestamp") if plural == "pods" else None
            if deleting:
                deadline = datetime.fromisoformat(deleting.replace("Z", "+00:00")).timestamp()
                self._deadlines[stored["metadata"]["uid"]] = (deadline, key)
            self._touched(res)
            return copy.deepcopy(stored)

    # ------------------------------------------------------------------------------------ reading

    def get_node(self, name: str) -> JSON | None:
        """The Node ``name``, or None."""
        return self._get("nodes", "", name)

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The Pod ``namespace/name`` (terminating ones included), or None once it is gone."""
        return self._get("pods", namespace, name)

    def get_pdb(self, namespace: str, name: str) -> JSON | None:
        """The PodDisruptionBudget ``namespace/name`` with its current status, or None."""
        return self._get("poddisruptionbudgets", namespace, name)

    def _get(self, plural: str, namespace: str, name: str) -> JSON | None:
        with self._lock:
            self._reap_locked()
            found = self._store[plural].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list_nodes(self) -> list[JSON]:
        """All Nodes, by name."""
        return self._list("nodes")

    def list_pods(self, node: str | None = None) -> list[JSON]:
        """All Pods by namespace and name, or only those bound to ``node``."""
        return [p for p in self._list("pods") if node is None or p.get("spec", {}).get("nodeName") == node]

    def list_pdbs(self) -> list[JSON]:
        """All PodDisruptionBudgets with their current status."""
        return self._list("poddisruptionbudgets")

    def events(self, *, involved_name: str | None = None, reason: str | None = None) -> list[JSON]:
        """Stored Events in creation order, optionally only those about ``involved_name`` or with ``reason``."""
        with self._lock:
            found = [
                copy.deepcopy(e)
                for e in self._store["events"].values()
                if (involved_name is None or (e.get("involvedObject") or {}).get("name") == involved_name)
                and (reason is None or e.get("reason") == reason)
            ]
        return found

    def _list(self, plural: str) -> list[JSON]:
        with self._lock:
            self._reap_locked()
            return [copy.deepcopy(o) for _, o in sorted(self._store[plural].items())]

    @property
    def resource_version(self) -> int:
        """The global resourceVersion counter (the last write's version)."""
        with self._lock:
            return self._rv

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request served so far, in the order the answers were written."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        """Forget the request log."""
        with self._lock:
            self._requests.clear()

    @property
    def internal_errors(self) -> list[str]:
        """Tracebacks of bugs in the double itself (answered as 500); tests may assert it stays empty."""
        with self._lock:
            return list(self._internal_errors)

    # ---------------------------------------------------------------------------------- mutating

    def delete_node(self, name: str, *, delete_pods: bool = True) -> bool:
        """Remove Node ``name`` (an instance terminated); with ``delete_pods`` its pods go at once, as pod
        garbage collection would, and their controllers recreate them elsewhere. Returns whether it existed.
        """
        with self._lock:
            if self._store["nodes"].pop(("", name), None) is None:
                return False
            self._bump()
            if delete_pods:
                for key, pod in list(self._store["pods"].items()):
                    if pod.get("spec", {}).get("nodeName") == name:
                        self._remove_pod(key)
            self._reap_locked()
            return True

    def set_pod_ready(self, namespace: str, name: str, ready: bool = True) -> JSON:
        """Set a pod Running with its Ready condition ``ready`` (as the kubelet would report it)."""
        with self._lock:
            pod = self._store["pods"].get((namespace, name))
            if pod is None:
                raise KeyError(f"pod {namespace}/{name} not found")
            self._set_running(pod, ready=ready)
            self._bump(pod)
            self._pdbs_dirty = True
            self._reap_locked()
            return copy.deepcopy(pod)

    def set_resource_api_versions(self, versions: Iterable[str] | None) -> None:
        """Serve resource.k8s.io in ``versions`` (any of v1, v1beta2, v1beta1); None or empty: not served."""
        chosen = tuple(v for v in DRA_VERSIONS if v in set(versions or ()))
        unknown = set(versions or ()) - set(DRA_VERSIONS)
        if unknown:
            raise ValueError(f"unsupported resource.k8s.io versions: {sorted(unknown)}")
        with self._lock:
            self._dra_versions = chosen

    def set_recreated_owner_kinds(self, kinds: Iterable[str]) -> None:
        """Owner kinds whose pods come back after eviction (default ReplicaSet, StatefulSet, DaemonSet)."""
        with self._lock:
            self._recreated_kinds = set(kinds)

    def on_request(self, hook: Callable[[RecordedRequest], None]) -> None:
        """Call ``hook(request)`` before each request is served, outside the double's lock, so it may call
        back into the double (e.g. ``delete_node``) or into other services (e.g. moto's EC2)."""
        with self._lock:
            self._hooks.append(hook)

    # ------------------------------------------------------------------------------------- faults

    def inject(
        self,
        method: str,
        path_regex: str,
        status: int,
        body: Any = None,
        times: int | None = 1,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` (None: every) ``method`` requests whose path matches ``path_regex``
        (``re.search``) with ``status`` and ``body`` (default: a ``Status`` for that code) instead of
        serving them. Injections are consumed first-in first-out; ``method`` ``*`` matches any."""
        with self._lock:
            self._injections.append(
                _Injection(method.upper(), re.compile(path_regex), status, body, dict(headers or {}), times)
            )

    def clear_injections(self) -> None:
        """Drop every pending injected response."""
        with self._lock:
            self._injections.clear()

    def accept_tokens(self, *tokens: str) -> None:
        """Require ``Authorization: Bearer <token>`` with one of ``tokens`` (adds to those accepted)."""
        with self._lock:
            self._tokens = (self._tokens or set()) | set(tokens)

    def revoke_token(self, token: str) -> None:
        """Stop accepting ``token`` (it expired); requests carrying it now get 401."""
        with self._lock:
            if self._tokens is not None:
                self._tokens.discard(token)

    def disable_auth(self) -> None:
        """Accept every request again, with or without a token."""
        with self._lock:
            self._tokens = None

    def deny(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        """Deny (verb, resource, subresource, group) to the caller; ``*`` matches any value."""
        with self._lock:
            self._denied.add((verb, resource, subresource, group))

    def allow(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        """Undo a ``deny`` with the same arguments."""
        with self._lock:
            self._denied.discard((verb, resource, subresource, group))

    def bind_cluster_role(self, role: JSON | None) -> None:
        """Authorize as RBAC would with exactly this rbac.authorization.k8s.io/v1 ClusterRole bound: a
        request no rule grants (``apiGroups`` × ``resources`` — ``pods/eviction`` for a subresource — ×
        ``verbs``, ``*`` matching any) answers 403, and so does its SelfSubjectAccessReview. The
        deny-list still applies on top. None removes the binding (everything allowed again)."""
        with self._lock:
            self._rules = None
            if role is not None:
                self._rules = [
                    (frozenset(r.get("apiGroups") or ()), frozenset(r.get("resources") or ()),
                     frozenset(r.get("verbs") or ()))
                    for r in role.get("rules") or ()
                ]  # fmt: skip

    def advance(self, seconds: float) -> None:
        """Move the double's clock forward and reap what expired."""
        with self._lock:
            self._offset += seconds
            self._reap_locked()

    def reap(self) -> None:
        """Remove pods whose grace period ended, recreate and schedule controller pods, refresh PDBs."""
        with self._lock:
            self._reap_locked()
