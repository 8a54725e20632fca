"""Kubernetes adapter: complete, paginated reads (``ClusterReader``) and the few writes a drain makes
(``ClusterWriter``: cordon, uncordon, policy/v1 Eviction, Events on nodes).

Built on the official ``kubernetes`` client, imported lazily inside this module's functions: the package
costs ~0.7 s on first import and the webhook, which imports nothing of Kubernetes (docs/architecture.md §8), must not
pay it. Responses are read raw (``_preload_content=False``) and parsed with ``json``: that is exactly the
API server's JSON — what ``kubectl get -o json`` prints — including fields newer than the client's models,
RFC 3339 timestamps unchanged (``sanitize_for_serialization`` rewrites ``Z`` as ``+00:00`` and drops
unknown fields) and several times faster than deserializing into models and back. The assessment's
Node and Pod lists (:meth:`KubernetesCluster.list_models`) skip the dicts too: each page's bytes are
decoded by msgspec straight into the plan's compact models (:mod:`rightsizer.adapters.kubernetes_models`).

Authentication: either a kubeconfig context (CLI; exec plugins such as ``aws eks get-token`` keep working)
or, on EKS from Lambda, the endpoint and CA from ``eks:DescribeCluster`` and a bearer token from
:class:`rightsizer.adapters.eks_auth.EksTokenSource`, looked up before every request (so it is rebuilt
when older than 10 min). A 401 rebuilds the credentials once and retries the same idempotent request; a
second consecutive 401 — or any 403 — is a :class:`KubernetesAccessError` (a ``PermanentError``) naming
the identity, the refused verb and resource, and the remedy (BUG-31). Nothing is returned from a partial
list: any failure raises. The request machinery (401 retry, pagination, error translation) is
:mod:`rightsizer.adapters.kubernetes_transport`; reading answers and the remedies,
:mod:`rightsizer.adapters.kubernetes_errors`; Node reads by name and the drain's writes (cordon, uncordon,
Eviction, Events), :mod:`rightsizer.adapters.kubernetes_writes`.

RBAC verbs needed (docs/architecture.md §5 "Names", ``infra/k8s/rbac.yaml``). Reading (``ClusterReader``; ClusterRole
``rightsizer-read``, the assess function):

- ``get``, ``list`` on ``nodes``, ``pods`` and ``poddisruptionbudgets.policy``;
- ``list`` on ``persistentvolumeclaims`` and ``persistentvolumes`` (where the pods' data lives);
- ``get``, ``list`` on ``resourceclaims`` and ``resourceslices`` in ``resource.k8s.io`` (when served);
- ``create`` on ``selfsubjectaccessreviews.authorization.k8s.io`` (the preflight; every authenticated
  user has it through ``system:basic-user``); discovery (``/apis``) comes with ``system:discovery``.

Acting (``ClusterWriter``; ClusterRole ``rightsizer``, the drain and off-hours functions):

- ``get``, ``patch`` on ``nodes`` (cordon/uncordon: one JSON merge patch guarded by ``resourceVersion``);
- ``list`` on ``pods`` (``fieldSelector=spec.nodeName=<node>``; :meth:`KubernetesCluster.get_pod` needs
  ``get`` and is not called by the drain);
- ``create`` on ``pods/eviction`` (policy/v1 Eviction; never ``delete`` on ``pods``);
- ``list`` on ``poddisruptionbudgets.policy``;
- ``list`` on ``nodes`` and ``get`` on ``persistentvolumeclaims``, ``persistentvolumes`` (node-local data is
  re-checked before the cordon and at every eviction round);
- ``get`` on ``replicasets``, ``statefulsets``, ``daemonsets`` (``apps``), ``jobs`` (``batch``) and
  ``replicationcontrollers``: the controllers the node's pods name, read back at the same moments (a pod
  whose controller is gone is a bare pod);
- ``create`` on ``events`` (core/v1, namespace ``default``, where node Events live).

Writes and 401: a 401 is answered before authorization and admission, so the request had no effect
and resending it with a rebuilt token is safe for a PATCH or an Eviction POST too.

IAM actions: none in this module (``eks:DescribeCluster`` is in :mod:`rightsizer.adapters.eks_auth`); the
IAM identity must have an EKS access entry in group ``rightsizer-read`` (or an ``aws-auth`` mapping).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import msgspec

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes_errors import (
    KubernetesAccessError,
)
from rightsizer.adapters.kubernetes_models import ModelPages
from rightsizer.adapters.kubernetes_transport import DEFAULT_PAGE_SIZE, client_module
from rightsizer.adapters.kubernetes_workloads import KubernetesWorkloadWrites
from rightsizer.adapters.kubernetes_writes import (
    EVENT_COMPONENT,
    EVENT_NAMESPACE,
    KubernetesNodeWrites,
    checked_name,
)
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import Node, Pod
from rightsizer.domain.pods import READABLE_CONTROLLERS
from rightsizer.gc_pause import cyclic_gc_paused
from rightsizer.ports import JSON, AccessCheck, ListKind

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DRA_GROUP",
    "DRA_VERSIONS",
    "EVENT_COMPONENT",
    "EVENT_NAMESPACE",
    "KubernetesAccessError",
    "KubernetesCluster",
]

log = logging.getLogger(__name__)


DRA_GROUP: Final = "resource.k8s.io"
#: Newest first: the first one the server lists in ``/apis`` is used (docs/architecture.md §5 "Kubernetes API versions").
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
#: Nodes per page of :meth:`KubernetesCluster.find_node` (a search usually ends on its first page).
FIND_PAGE_SIZE: Final = 20

#: How each readable controller is read: resource plural -> (client API class, read method).
_CONTROLLER_READS: Final = {
    "replicasets": ("AppsV1Api", "read_namespaced_replica_set"),
    "statefulsets": ("AppsV1Api", "read_namespaced_stateful_set"),
    "daemonsets": ("AppsV1Api", "read_namespaced_daemon_set"),
    "jobs": ("BatchV1Api", "read_namespaced_job"),
    "replicationcontrollers": ("CoreV1Api", "read_namespaced_replication_controller"),
}


#: kind → object ``kind`` of its items.
_KINDS: Final[dict[str, str]] = {
    "nodes": "Node",
    "pods": "Pod",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "persistentvolumes": "PersistentVolume",
    "resourceclaims": "ResourceClaim",
    "resourceslices": "ResourceSlice",
}
#: kind → (API group, version, the client's all-namespaces list method).
_CORE_LISTS: Final[dict[str, tuple[str, str, str]]] = {
    "nodes": ("", "v1", "list_node"),
    "pods": ("", "v1", "list_pod_for_all_namespaces"),
    "poddisruptionbudgets": ("policy", "v1", "list_pod_disruption_budget_for_all_namespaces"),
    "persistentvolumeclaims": ("", "v1", "list_persistent_volume_claim_for_all_namespaces"),
    "persistentvolumes": ("", "v1", "list_persistent_volume"),
}
T = TypeVar("T")
M = TypeVar("M", Node, Pod)


def _selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    """The client's keyword arguments for the selectors given: an empty one is not sent at all."""
    chosen = {"label_selector": label_selector, "field_selector": field_selector}
    return {key: value for key, value in chosen.items() if value}


class KubernetesCluster(KubernetesNodeWrites, KubernetesWorkloadWrites):
    """``ClusterReader`` and ``ClusterWriter`` over the official client; one instance per cluster and run
    (or Lambda cold start).

    Construct with :meth:`for_eks` or :meth:`from_kubeconfig`; the generic constructor takes ``connect``,
    which builds a fresh ``kubernetes.client.ApiClient`` (called lazily and again after a 401). Reads and
    writes share the connection, the token refresh and the error translation.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        reauthenticate: Callable[[], None] | None = None,
        identity: Callable[[], str] | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """Args: as :class:`KubernetesTransport`, plus ``clock``: aware "now" for Event timestamps
        (default: the system clock in UTC)."""
        super().__init__(
            connect,
            reauthenticate=reauthenticate,
            identity=identity,
            page_size=page_size,
            request_timeout=request_timeout,
        )
        self._clock = clock or (lambda: datetime.now(UTC))
        self._dra: tuple[str | None] | None = None  # discovered once per instance

    # ------------------------------------------------------------------------------ construction

    @classmethod
    def for_eks(
        cls,
        endpoint: str,
        tokens: EksTokenSource,
        *,
        ca_file: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
        clock: Callable[[], datetime] | None = None,
    ) -> KubernetesCluster:
        """An EKS cluster at ``endpoint`` (``eks:DescribeCluster``), authenticated with ``tokens``.

        Args:
            endpoint: API server URL (``https://…eks.amazonaws.com``; ``http://127.0.0.1:…`` in tests).
            tokens: the bearer token source; its ``token()`` is consulted before every request.
            ca_file: PEM bundle that signs the server certificate (see ``eks_auth.write_ca_bundle``).
            clock: aware "now" for Event timestamps (default: the system clock).
        """

        def connect() -> Any:
            k8s = client_module()
            config = k8s.Configuration(host=endpoint.rstrip("/"))
            config.ssl_ca_cert = ca_file
            # The key must exist for the client to ask for it; the hook fills in the current token
            # on every request, which is where the 10-minute refresh happens.
            config.api_key = {"BearerToken": ""}
            config.api_key_prefix = {"BearerToken": "Bearer"}

            def refresh(cfg: Any) -> None:
                cfg.api_key["BearerToken"] = tokens.token()

            config.refresh_api_key_hook = refresh
            return k8s.ApiClient(configuration=config)

        return cls(
            connect,
            reauthenticate=tokens.invalidate,
            identity=tokens.identity,
            page_size=page_size,
            request_timeout=request_timeout,
            clock=clock,
        )

    @classmethod
    def from_kubeconfig(
        cls,
        context: str | None = None,
        config_file: str | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
        clock: Callable[[], datetime] | None = None,
    ) -> KubernetesCluster:
        """A cluster from a kubeconfig ``context`` (default: the current one) in ``config_file``
        (default ``$KUBECONFIG`` or ``~/.kube/config``). After a 401 the kubeconfig is read again, which
        re-runs exec credential plugins.

        Raises (on first use):
            ConfigError: the kubeconfig or the context does not exist.
        """

        def connect() -> Any:
            from kubernetes.config import ConfigException, new_client_from_config

            from rightsizer.domain.errors import ConfigError

            try:
                return new_client_from_config(config_file=config_file, context=context)
            except (ConfigException, OSError) as exc:
                raise ConfigError(f"kubeconfig: {exc}", field="cluster.context") from exc

        def identity() -> str:
            from kubernetes.config import list_kube_config_contexts

            try:
                contexts, active = list_kube_config_contexts(config_file=config_file)
            except Exception:  # only decorates another error message: never fail here
                return f"kubeconfig context {context or '<current>'}"
            chosen = next((c for c in contexts if c.get("name") == context), active) or {}
            user = (chosen.get("context") or {}).get("user", "?")
            return f"kubeconfig context {chosen.get('name', context)} (user {user})"

        return cls(
            connect, identity=identity, page_size=page_size, request_timeout=request_timeout, clock=clock
        )

    # ----------------------------------------------------------------------------- ClusterReader

    def preflight(self, checks: Sequence[AccessCheck]) -> list[AccessCheck]:
        """Return the checks the API server denies (``SelfSubjectAccessReview``, one per check).

        Raises:
            KubernetesAccessError: we cannot even ask (401 twice, or 403 on the review itself).
            TransientError: 429, 5xx, network.
        """
        denied: list[AccessCheck] = []
        for check in checks:
            attributes = {"verb": check.verb, "resource": check.resource, "group": check.group}
            if check.subresource:
                attributes["subresource"] = check.subresource
            body = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            }
            answer = self._json(
                AccessCheck("create", "selfsubjectaccessreviews", group="authorization.k8s.io"),
                functools.partial(self._review, body=body),
            )
            if not (answer.get("status") or {}).get("allowed", False):
                denied.append(check)
        return denied

    def _review(self, api: Any, *, body: JSON) -> Any:
        return (
            client_module()
            .AuthorizationV1Api(api)
            .create_self_subject_access_review(
                body=body, _preload_content=False, _request_timeout=self._timeout
            )
        )

    def list_nodes(self, *, label_selector: str = "", field_selector: str = "") -> list[JSON]:
        """core/v1 Nodes (``GET /api/v1/nodes``, paginated), all of them unless selectors are given.

        Args:
            label_selector: a Kubernetes label selector (``key in (a,b),!key``), "" for none.
            field_selector: a Node field selector (``metadata.name!=x,spec.unschedulable=false``).
        """
        return self._list(
            AccessCheck("list", "nodes"),
            "Node",
            "v1",
            lambda api, **page: (
                client_module().CoreV1Api(api).list_node(**_selectors(label_selector, field_selector), **page)
            ),
        )

    def find_node(
        self, accept: Callable[[JSON], bool], *, label_selector: str = "", field_selector: str = ""
    ) -> JSON | None:
        """The first Node the selectors list (in the server's order) for which ``accept`` is true, or None.

        Pages of ``FIND_PAGE_SIZE`` Nodes are read until one is accepted, so a search whose selectors
        already say most of it costs one small request whatever the cluster's size (the drain's
        "is this volume reachable from another node?", issue 11 item 5).
        """
        found = self._collect(
            AccessCheck("list", "nodes"),
            "Node",
            "v1",
            lambda api, **page: (
                client_module().CoreV1Api(api).list_node(**_selectors(label_selector, field_selector), **page)
            ),
            lambda item: item if accept(item) else None,
            enough=bool,
            page_size=FIND_PAGE_SIZE,
        )
        return found[0] if found else None

    def list_pods(self, *, namespace: str | None = None, field_selector: str = "") -> list[JSON]:
        """core/v1 Pods (paginated): of all namespaces (``GET /api/v1/pods``) or of ``namespace``
        (``GET /api/v1/namespaces/{ns}/pods``), all of them unless ``field_selector`` says which
        (``spec.nodeName=x``, ``status.podIP=10.0.0.1``, ``spec.nodeName=,status.phase=Pending``)."""

        def call(api: Any, **page: Any) -> Any:
            core = client_module().CoreV1Api(api)
            if namespace is None:
                return core.list_pod_for_all_namespaces(**_selectors("", field_selector), **page)
            return core.list_namespaced_pod(namespace, **_selectors("", field_selector), **page)

        return self._list(AccessCheck("list", "pods"), "Pod", "v1", call)

    def list_pdbs(self, namespace: str | None = None) -> list[JSON]:
        """policy/v1 PodDisruptionBudgets (paginated) of all namespaces
        (``GET /apis/policy/v1/poddisruptionbudgets``) or of ``namespace`` — a budget selects pods of its
        own namespace only, so the pods of a few namespaces need only those namespaces' budgets."""

        def call(api: Any, **page: Any) -> Any:
            policy = client_module().PolicyV1Api(api)
            if namespace is None:
                return policy.list_pod_disruption_budget_for_all_namespaces(**page)
            return policy.list_namespaced_pod_disruption_budget(namespace, **page)

        return self._list(
            AccessCheck("list", "poddisruptionbudgets", group="policy"),
            "PodDisruptionBudget",
            "policy/v1",
            call,
        )

    def list_persistent_volume_claims(self) -> list[JSON]:
        """All core/v1 PersistentVolumeClaims (``GET /api/v1/persistentvolumeclaims``, paginated)."""
        return self._list(
            AccessCheck("list", "persistentvolumeclaims"),
            "PersistentVolumeClaim",
            "v1",
            lambda api, **page: (
                client_module().CoreV1Api(api).list_persistent_volume_claim_for_all_namespaces(**page)
            ),
        )

    def list_persistent_volumes(self) -> list[JSON]:
        """All core/v1 PersistentVolumes (``GET /api/v1/persistentvolumes``, paginated)."""
        return self._list(
            AccessCheck("list", "persistentvolumes"),
            "PersistentVolume",
            "v1",
            lambda api, **page: client_module().CoreV1Api(api).list_persistent_volume(**page),
        )

    def list_projected(
        self,
        kind: ListKind,
        project: Callable[[JSON], T | None],
        *,
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``project`` keeps of every object of ``kind`` in the cluster, read page by page.

        Each page (``page_size`` items) is projected as it arrives and released before the next one is
        requested (``KubernetesTransport._collect``), so the client never holds more than one raw page:
        the assessment's memory grows with what it keeps (issue 11 item 7), not with the raw lists.
        ``project`` gets each item in kubectl form and returns what to keep, or None to drop it; when an
        expired continue token (410) restarts the list, ``restart`` is called before the first item is
        projected again. DRA kinds answer ``[]`` when ``resource.k8s.io`` is not served.
        """
        if kind in ("resourceclaims", "resourceslices"):
            group_version = self.served_resource_api()
            if group_version is None:
                return []
            version = group_version.rpartition("/")[2]
            return self._collect(
                AccessCheck("list", kind, group=DRA_GROUP),
                _KINDS[kind],
                group_version,
                lambda api, **page: (
                    client_module()
                    .CustomObjectsApi(api)
                    .list_cluster_custom_object(DRA_GROUP, version, kind, **page)
                ),
                project,
                restart=restart,
            )
        group, version, method = _CORE_LISTS[kind]
        api_class = "PolicyV1Api" if group == "policy" else "CoreV1Api"
        return self._collect(
            AccessCheck("list", kind, group=group),
            _KINDS[kind],
            f"{group}/{version}" if group else version,
            lambda api, **page: getattr(getattr(client_module(), api_class)(api), method)(**page),
            project,
            restart=restart,
        )

    def list_models(
        self,
        kind: type[M],
        project: Callable[[M], T | None],
        *,
        label_selector: str = "",
        field_selector: str = "",
        restart: Callable[[], None] | None = None,
    ) -> list[T]:
        """What ``project`` keeps of every ``Node`` or ``Pod`` the selectors list (``GET /api/v1/nodes``,
        ``GET /api/v1/pods``), each page decoded from its bytes straight into compact models
        (:mod:`rightsizer.adapters.kubernetes_models`: only the fields the models declare are decoded,
        equal parts made once) and released before the next page is requested.

        Args:
            kind: ``Node`` or ``Pod``.
            project: what to keep of each object, None to drop it (a shard keeps its own nodes' pods).
            label_selector, field_selector: as the API server takes them (``status.phase!=Failed``).
            restart: called when an expired continue token (410) starts the list over.

        Raises:
            TransientError: a page is not JSON or an object in it is malformed (its path is named); and
                every read's errors (:class:`KubernetesAccessError` for 401 twice or 403).
        """
        plural, method = ("nodes", "list_node") if kind is Node else ("pods", "list_pod_for_all_namespaces")
        check = AccessCheck("list", plural)
        pages = ModelPages(kind)

        def decode(data: bytes) -> tuple[list[T], str | None]:
            try:
                objects, token = pages.page(data)
            except msgspec.DecodeError as exc:  # ValidationError included: a type or a required field
                raise TransientError(
                    f"{check.describe()}: the answer is not a {kind.__name__} list: {exc}"
                ) from exc
            return [kept for obj in objects if (kept := project(obj)) is not None], token

        def call(api: Any, **page: Any) -> Any:
            lister = getattr(client_module().CoreV1Api(api), method)
            return lister(**_selectors(label_selector, field_selector), **page)

        # The cyclic collector would rescan the growing heap of models every few hundred objects made (a
        # quarter of the read's CPU at 30,000 pods); what is made here is acyclic.
        try:
            with cyclic_gc_paused():
                return self._pages(check, call, decode, restart=restart)
        finally:
            pages.close()

    def served_resource_api(self) -> str | None:
        """The newest served ``resource.k8s.io`` version (``"resource.k8s.io/v1"``) or None (``GET /apis``).

        Discovered once per instance. Raises like every read: without discovery we could not tell
        "DRA not served" from "DRA hidden from us".
        """
        if self._dra is None:
            groups = (
                self._json(
                    AccessCheck("get", "apis"),
                    lambda api: (
                        client_module()
                        .ApisApi(api)
                        .get_api_versions(_preload_content=False, _request_timeout=self._timeout)
                    ),
                ).get("groups")
                or []
            )
            served = {
                str(v.get("version"))
                for g in groups
                if g.get("name") == DRA_GROUP
                for v in g.get("versions") or []
            }
            version = next((v for v in DRA_VERSIONS if v in served), None)
            self._dra = (f"{DRA_GROUP}/{version}" if version else None,)
            log.debug("resource.k8s.io served versions %s; using %s", sorted(served), self._dra[0])
        return self._dra[0]

    def list_resource_claims(self, namespace: str | None = None) -> list[JSON]:
        """ResourceClaims in the served version, unstructured, of all namespaces or of ``namespace``;
        ``[]`` when DRA is not served."""
        return self._list_dra("resourceclaims", "ResourceClaim", namespace=namespace)

    def list_resource_slices(self, field_selector: str = "") -> list[JSON]:
        """ResourceSlices in the served version, unstructured (``spec.nodeName=x``: one node's);
        ``[]`` when DRA is not served."""
        return self._list_dra("resourceslices", "ResourceSlice", field_selector=field_selector)

    # ----------------------------------------------------------------------------- ClusterWriter

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim (``GET /api/v1/namespaces/{ns}/persistentvolumeclaims/{name}``), or
        None on 404."""
        checked_name(name, namespace=namespace)
        answer = self._call(
            AccessCheck("get", "persistentvolumeclaims"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .read_namespaced_persistent_volume_claim(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                )
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def get_persistent_volume(self, name: str) -> JSON | None:
        """The PersistentVolume (``GET /api/v1/persistentvolumes/{name}``), or None on 404."""
        checked_name(name)
        answer = self._call(
            AccessCheck("get", "persistentvolumes"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .read_persistent_volume(name, _preload_content=False, _request_timeout=self._timeout)
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def list_pods_on_node(self, node: str) -> list[JSON]:
        """Pods of all namespaces bound to ``node`` (``GET /api/v1/pods?fieldSelector=spec.nodeName=…``,
        paginated, uncached), terminating ones included, each in kubectl form (``kind``/``apiVersion``)."""
        selector = f"spec.nodeName={checked_name(node)}"
        return self._list(
            AccessCheck("list", "pods"),
            "Pod",
            "v1",
            lambda api, **page: (
                client_module().CoreV1Api(api).list_pod_for_all_namespaces(field_selector=selector, **page)
            ),
        )

    def get_controller(self, namespace: str, group: str, kind: str, name: str) -> JSON | None:
        """The controller a pod names (``GET /apis/apps/v1/namespaces/{ns}/replicasets/{name}`` and the like,
        uncached), or None on 404. (``group``, ``kind``) must be in ``READABLE_CONTROLLERS``.

        Raises:
            ValueError: a kind this adapter does not read (no RBAC is granted for it).
        """
        resource = READABLE_CONTROLLERS.get((group, kind))
        if resource is None:
            raise ValueError(f"cannot read controller kind {kind}.{group or 'core'}")
        checked_name(name, namespace=namespace)
        api_class, method = _CONTROLLER_READS[resource]
        answer = self._call(
            AccessCheck("get", resource, group=group),
            lambda api: getattr(getattr(client_module(), api_class)(api), method)(
                name, namespace, _preload_content=False, _request_timeout=self._timeout
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The Pod (``GET /api/v1/namespaces/{ns}/pods/{name}``, uncached), or None on 404.

        A pod inside its termination grace period is still returned, with ``metadata.deletionTimestamp``
        set: it is gone only when this answers None (or another UID) — BUG-17.
        """
        checked_name(name, namespace=namespace)
        answer = self._call(
            AccessCheck("get", "pods"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=self._timeout)
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    # --------------------------------------------------------------------------------- internals

    def _list_dra(
        self, plural: str, kind: str, *, namespace: str | None = None, field_selector: str = ""
    ) -> list[JSON]:
        group_version = self.served_resource_api()
        if group_version is None:
            return []
        version = group_version.rpartition("/")[2]

        def call(api: Any, **page: Any) -> Any:
            custom = client_module().CustomObjectsApi(api)
            if namespace is None:
                return custom.list_cluster_custom_object(
                    DRA_GROUP, version, plural, **_selectors("", field_selector), **page
                )
            return custom.list_namespaced_custom_object(
                DRA_GROUP, version, namespace, plural, **_selectors("", field_selector), **page
            )

        return self._list(AccessCheck("list", plural, group=DRA_GROUP), kind, group_version, call)
