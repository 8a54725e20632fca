"""Kubernetes adapter: complete, paginated reads (``ClusterReader``) and the few writes a drain makes
(``ClusterWriter``: cordon, uncordon, policy/v1 Eviction, Events on nodes).

Built on the official ``kubernetes`` client, imported lazily inside this module's functions: the package
costs ~0.7 s on first import and the webhook, which imports nothing of Kubernetes (docs/architecture.md §8), must not
pay it. Responses are read raw (``_preload_content=False``) and parsed with ``json``: that is exactly the
API server's JSON — what ``kubectl get -o json`` prints — including fields newer than the client's models,
RFC 3339 timestamps unchanged (``sanitize_for_serialization`` rewrites ``Z`` as ``+00:00`` and drops
unknown fields) and several times faster than deserializing into models and back.

Authentication: either a kubeconfig context (CLI; exec plugins such as ``aws eks get-token`` keep working)
or, on EKS from Lambda, the endpoint and CA from ``eks:DescribeCluster`` and a bearer token from
:class:`rightsizer.adapters.eks_auth.EksTokenSource`, looked up before every request (so it is rebuilt
when older than 10 min). A 401 rebuilds the credentials once and retries the same idempotent request; a
second consecutive 401 — or any 403 — is a :class:`KubernetesAccessError` (a ``PermanentError``) naming
the identity, the refused verb and resource, and the remedy (BUG-31). Nothing is returned from a partial
list: any failure raises. The request machinery (401 retry, pagination, error translation) is
:mod:`rightsizer.adapters.kubernetes_transport`; reading answers and the remedies,
:mod:`rightsizer.adapters.kubernetes_errors`.

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
import socket
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes_errors import (
    REMEDY_403_WRITE,
    ApiAnswer,
    KubernetesAccessError,
    eviction_retry_after,
    namespace_terminating,
    status_text,
)
from rightsizer.adapters.kubernetes_transport import DEFAULT_PAGE_SIZE, KubernetesTransport, client_module
from rightsizer.domain.errors import PermanentError, StalePlan
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY
from rightsizer.domain.names import dns1123_label_problem, dns1123_subdomain_problem
from rightsizer.domain.pods import READABLE_CONTROLLERS
from rightsizer.ports import JSON, AccessCheck, EvictionOutcome, ListKind

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


def _checked(name: str, *, namespace: str | None = None) -> str:
    """``name`` when it is a valid object name (DNS-1123 subdomain; ``namespace`` a DNS-1123 label).

    A request path or field selector is built only from names the API server could have issued: ``..``
    would address another API path, a comma another field selector (issue 14).

    Raises:
        PermanentError: the name (or namespace) is not valid; no request is made.
    """
    problem = dns1123_subdomain_problem(name)
    if problem is None and namespace is not None:
        problem = dns1123_label_problem(namespace)
    if problem is not None:
        raise PermanentError(
            f"refusing an invalid object name {name[:64]!r} ({problem}): no request was made"
        )
    return name


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
#: Node Events live in ``default``: the API server accepts an Event about a cluster-scoped object only
#: in ``default`` (or ``kube-system``), and ``kubectl describe node`` looks there.
EVENT_NAMESPACE: Final = "default"
#: ``source.component`` and ``reportingComponent`` of every Event we write (docs/architecture.md §4).
EVENT_COMPONENT: Final = "rightsizer"
#: The API server keeps Event messages short (events.k8s.io ``note``: 1 kB); longer ones are cut here.
_EVENT_MESSAGE_LIMIT: Final = 1024
_MERGE_PATCH: Final = "application/merge-patch+json"


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


def _selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    """The client's keyword arguments for the selectors given: an empty one is not sent at all."""
    chosen = {"label_selector": label_selector, "field_selector": field_selector}
    return {key: value for key, value in chosen.items() if value}


def _utc_rfc3339(value: str) -> str:
    """Validate ``value`` as an RFC 3339 instant in UTC and return it unchanged (cordoned-at, docs/architecture.md §4)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"cordoned-at must be RFC 3339, got {value!r}") from exc
    if parsed.utcoffset() != timedelta(0):  # None (naive) or another offset
        raise ValueError(f"cordoned-at must be in UTC, got {value!r}")
    return value


def _reporting_instance() -> str:
    # Required by the API server whenever eventTime is set; in Lambda the host name changes per sandbox,
    # which is what "instance" means here.
    return f"{EVENT_COMPONENT}-{socket.gethostname()}"[:128]


class KubernetesCluster(KubernetesTransport):
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

    def list_projected(self, kind: ListKind, project: Callable[[JSON], T | None]) -> list[T]:
        """What ``project`` keeps of every object of ``kind`` in the cluster, read page by page.

        Each page (``page_size`` items) is projected as it arrives and released before the next one is
        requested (``KubernetesTransport._collect``), so the client never holds more than one raw page:
        the assessment's memory grows with what it keeps (issue 11 item 7), not with the raw lists.
        ``project`` gets each item in kubectl form and returns what to keep, or None to drop it.
        DRA kinds answer ``[]`` when ``resource.k8s.io`` is not served.
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
            )
        group, version, method = _CORE_LISTS[kind]
        api_class = "PolicyV1Api" if group == "policy" else "CoreV1Api"
        return self._collect(
            AccessCheck("list", kind, group=group),
            _KINDS[kind],
            f"{group}/{version}" if group else version,
            lambda api, **page: getattr(getattr(client_module(), api_class)(api), method)(**page),
            project,
        )

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

    def get_node(self, name: str) -> JSON | None:
        """The Node named exactly ``name`` (``GET /api/v1/nodes/{name}``, uncached), or None on 404.

        Raises:
            PermanentError: ``name`` is not a DNS-1123 subdomain (no request is made), or 403.
        """
        _checked(name)
        answer = self._call(
            AccessCheck("get", "nodes"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .read_node(name, _preload_content=False, _request_timeout=self._timeout)
            ),
            answered=frozenset({404}),
        )
        return None if answer.status == 404 else answer.body

    def get_persistent_volume_claim(self, namespace: str, name: str) -> JSON | None:
        """The PersistentVolumeClaim (``GET /api/v1/namespaces/{ns}/persistentvolumeclaims/{name}``), or
        None on 404."""
        _checked(name, namespace=namespace)
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
        _checked(name)
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
        selector = f"spec.nodeName={_checked(node)}"
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
        _checked(name, namespace=namespace)
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
        _checked(name, namespace=namespace)
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

    def cordon(self, node: str, execution_id: str, at: str) -> JSON:
        """Cordon ``node`` for ``execution_id``: one JSON merge patch (``PATCH /api/v1/nodes/{name}``) that
        sets ``spec.unschedulable=true`` and the annotations ``rightsizer.io/cordoned-by=<execution_id>`` and
        ``rightsizer.io/cordoned-at=<at>``, guarded by the ``metadata.resourceVersion`` of a fresh GET.

        Args:
            node: the Node's exact name.
            execution_id: the drain workflow's execution id (the annotation value).
            at: RFC 3339 instant in UTC (``2024-05-14T10:00:00Z``).

        Returns:
            The Node as patched; the Node as read, without a write, when it already carries our
            annotation for this execution and is unschedulable (a resumed step).

        Raises:
            StalePlan: ``node_not_found``; ``cordoned_by_other`` (unschedulable without our annotation
                for this execution — a person's or another execution's cordon is never adopted);
                ``uncordoned_by_other`` (our annotation is there but someone made the node schedulable
                again: a person undid our cordon); ``node_changed`` (409: the node changed between our
                GET and our PATCH — re-read and re-check before acting).
            ValueError: ``at`` is not an RFC 3339 UTC instant.
            KubernetesAccessError: 403 on ``get nodes`` / ``patch nodes``, or 401 twice.
        """
        _checked(node)
        _utc_rfc3339(at)
        current = self.get_node(node)
        if current is None:
            raise StalePlan("node_not_found")
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        unschedulable = bool((current.get("spec") or {}).get("unschedulable"))
        owner = annotations.get(ANN_CORDONED_BY)
        if owner == execution_id:
            if unschedulable:
                return current
            log.warning(
                "%s: carries our cordon for %s but is schedulable: someone uncordoned it", node, owner
            )
            raise StalePlan("uncordoned_by_other")
        if unschedulable:
            log.info("%s: already cordoned by %s; not adopting it", node, owner or "someone else")
            raise StalePlan("cordoned_by_other")
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "annotations": {ANN_CORDONED_BY: execution_id, ANN_CORDONED_AT: at},
            },
            "spec": {"unschedulable": True},
        }
        answer = self._patch_node(node, patch)
        if answer.status == 404:
            raise StalePlan("node_not_found")
        if answer.status == 409:
            raise StalePlan("node_changed")
        return answer.body

    def uncordon(self, node: str, execution_id: str) -> bool:
        """Undo our cordon: only when ``rightsizer.io/cordoned-by`` equals ``execution_id``, one JSON merge
        patch guarded by ``resourceVersion`` that removes both annotations (``null``) and sets
        ``spec.unschedulable=false``. A 409 (the node changed meanwhile) re-reads, re-checks and retries once.

        Returns:
            True when this call patched the node; False when the node is gone or the annotation is
            absent or names another execution (a person's cordon is never undone by us).

        Raises:
            StalePlan: ``node_changed`` — 409 twice in a row.
            KubernetesAccessError: 403 on ``get nodes`` / ``patch nodes``, or 401 twice.
        """
        _checked(node)
        for attempt in (1, 2):
            current = self.get_node(node)
            if current is None:
                return False
            annotations = (current.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANN_CORDONED_BY) != execution_id:
                log.info(
                    "%s: cordoned-by is %r, not %r; leaving the node as it is",
                    node,
                    annotations.get(ANN_CORDONED_BY),
                    execution_id,
                )
                return False
            patch = {
                "metadata": {
                    "resourceVersion": current["metadata"]["resourceVersion"],
                    "annotations": {ANN_CORDONED_BY: None, ANN_CORDONED_AT: None},
                },
                "spec": {"unschedulable": False},
            }
            answer = self._patch_node(node, patch)
            if answer.status == 404:
                return False
            if answer.status != 409:
                return True
            log.info("%s: changed while uncordoning (409, attempt %d)", node, attempt)
        raise StalePlan("node_changed")

    def evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        """POST a policy/v1 Eviction (``/api/v1/namespaces/{ns}/pods/{name}/eviction``) with
        ``deleteOptions.preconditions.uid=<uid>``; never a plain DELETE (BUG-14).

        Returns:
            ``accepted`` (201: graceful deletion started — the pod is gone only once :meth:`get_pod`
            answers None, BUG-17); ``gone`` (404); ``uid_mismatch`` (409: the pod with that UID is gone,
            a namesake replaced it); ``blocked`` (429: a PodDisruptionBudget allows no disruption —
            ``message`` names it from the Status causes; ``retry_after`` from ``Retry-After`` or
            ``details.retryAfterSeconds``, None when the server gave none; API Priority and Fairness
            throttling is also a 429 and is equally a reason to wait); ``error`` (500, e.g. the pod is
            matched by more than one PodDisruptionBudget). A 403 whose Status cause is
            ``NamespaceTerminating`` is ``blocked`` too (retry in 5 s): the namespace is being deleted.

        Raises:
            KubernetesAccessError: 403 — names the identity and ``create pods/eviction`` (BUG-31 B) —
                or 401 twice (one 401 rebuilds the token and resends: the first was never admitted).
            TransientError: 502/503/504, timeouts, connection failures (nothing was decided).
            PermanentError: any other status (400/422: a malformed request).
        """
        _checked(name, namespace=namespace)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        answer = self._call(
            AccessCheck("create", "pods", "eviction"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            ),
            answered=frozenset({403, 404, 409, 429, 500}),
        )
        if answer.status in (200, 201):
            return EvictionOutcome("accepted")
        message = status_text(answer.body, f"HTTP {answer.status}")
        if answer.status == 403:
            if namespace_terminating(answer.body):
                # The namespace controller deletes the pod itself; kubectl drain waits for it too.
                return EvictionOutcome("blocked", message, 5.0)
            who = self.identity()
            raise KubernetesAccessError(
                f"Kubernetes API answered 403 Forbidden: {who} may not create pods/eviction ({message}). "
                f"Remedy: {REMEDY_403_WRITE}.",
                identity=who,
                check=AccessCheck("create", "pods", "eviction"),
                status=403,
            )
        if answer.status == 404:
            return EvictionOutcome("gone", message)
        if answer.status == 409:
            return EvictionOutcome("uid_mismatch", message)
        if answer.status == 429:
            return EvictionOutcome("blocked", message, eviction_retry_after(answer.headers, answer.body))
        return EvictionOutcome("error", message)

    def emit_event(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Create a core/v1 Event about the Node (``POST /api/v1/namespaces/default/events``).

        ``involvedObject`` is the Node (kind, name and — read fresh — uid), ``source.component`` and
        ``reportingComponent`` are ``rightsizer``, ``action`` is ``reason``, ``type`` is ``Warning`` or
        ``Normal``; ``firstTimestamp``/``lastTimestamp`` (RFC 3339) and ``eventTime`` (microseconds) come
        from the adapter's clock. Messages longer than 1024 characters are cut.

        Best effort: any failure (403 on ``create events``, 5xx, network) is logged and swallowed — an
        Event informs people and must never change the outcome of a drain.
        """
        try:
            found = self.get_node(node)
            now = self._clock().astimezone(UTC)
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    **({"uid": found["metadata"]["uid"]} if found else {}),
                },
                "reason": reason,
                "message": message[:_EVENT_MESSAGE_LIMIT],
                "type": "Warning" if warning else "Normal",
                "action": reason,
                "source": {"component": EVENT_COMPONENT},
                "reportingComponent": EVENT_COMPONENT,
                "reportingInstance": _reporting_instance(),
                "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "count": 1,
            }
            self._call(
                AccessCheck("create", "events"),
                lambda api: (
                    client_module()
                    .CoreV1Api(api)
                    .create_namespaced_event(
                        EVENT_NAMESPACE, event, _preload_content=False, _request_timeout=self._timeout
                    )
                ),
            )
        except Exception as exc:  # best effort by contract (ports.ClusterWriter.emit_event)
            log.warning("event %s on node %s not recorded: %s", reason, node, exc)

    def _patch_node(self, node: str, patch: JSON) -> ApiAnswer:
        # The client defaults a dict body to json-patch+json (its first content type); a merge patch must
        _checked(node)
        # say so, or the API server would read our object as a malformed list of operations.
        return self._call(
            AccessCheck("patch", "nodes"),
            lambda api: (
                client_module()
                .CoreV1Api(api)
                .patch_node(
                    node,
                    patch,
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            ),
            answered=frozenset({404, 409}),
        )

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
