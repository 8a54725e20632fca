"""Kubernetes adapter: complete, paginated reads of nodes, pods, PDBs and DRA objects (``ClusterReader``).

Built on the official ``kubernetes`` client, imported lazily inside this module's functions: the package
costs ~0.7 s on first import and the webhook, which imports nothing of Kubernetes (design §8), must not
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
list: any failure raises.

RBAC verbs needed (ClusterRole ``rightsizer-read``, design §5 "Names"):

- ``get``, ``list`` on ``nodes``, ``pods`` and ``poddisruptionbudgets.policy``;
- ``get``, ``list`` on ``resourceclaims`` and ``resourceslices`` in ``resource.k8s.io`` (when served);
- ``create`` on ``selfsubjectaccessreviews.authorization.k8s.io`` (the preflight; every authenticated
  user has it through ``system:basic-user``); discovery (``/apis``) comes with ``system:discovery``.

IAM actions: none in this module (``eks:DescribeCluster`` is in :mod:`rightsizer.adapters.eks_auth`); the
IAM identity must have an EKS access entry in group ``rightsizer-read`` (or an ``aws-auth`` mapping).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.domain.errors import PermanentError, TransientError
from rightsizer.ports import JSON, AccessCheck

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DRA_GROUP",
    "DRA_VERSIONS",
    "KubernetesAccessError",
    "KubernetesCluster",
]

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE: Final = 500
DRA_GROUP: Final = "resource.k8s.io"
#: Newest first: the first one the server lists in ``/apis`` is used (design §5 "Kubernetes API versions").
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")

_REMEDY_401 = (
    "give this identity access to the cluster: an EKS access entry (authentication mode API or "
    "API_AND_CONFIG_MAP) with Kubernetes group rightsizer-read, or an aws-auth ConfigMap mapRoles entry"
)
_REMEDY_403 = "bind the ClusterRole rightsizer-read (infra/k8s/rbac.yaml) to the identity's Kubernetes group"


class KubernetesAccessError(PermanentError):
    """The API server refused us: 401 twice in a row (unknown identity) or 403 (RBAC).

    ``identity`` is who we are (an IAM ARN on EKS), ``check`` the refused verb/resource, ``status`` the
    HTTP status; the message ends with the remedy.
    """

    def __init__(self, message: str, *, identity: str, check: AccessCheck, status: int) -> None:
        self.identity = identity
        self.check = check
        self.status = status
        super().__init__(message)


def _client_module() -> Any:
    # Imported here, not at module top: see the module docstring (cold start of the webhook).
    import kubernetes.client

    return kubernetes.client


def _status_message(exc: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or b"{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or "").strip() if isinstance(body, dict) else ""


def _retry_after(exc: Any, default: float) -> float:
    headers = getattr(exc, "headers", None) or {}
    try:
        return float(headers.get("Retry-After", default))
    except (TypeError, ValueError):
        return default


class KubernetesCluster:
    """``ClusterReader`` over the official client; one instance per cluster and run (or Lambda cold start).

    Construct with :meth:`for_eks` or :meth:`from_kubeconfig`; the generic constructor takes ``connect``,
    which builds a fresh ``kubernetes.client.ApiClient`` (called lazily and again after a 401).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        reauthenticate: Callable[[], None] | None = None,
        identity: Callable[[], str] | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
    ) -> None:
        """Args:
        connect: builds an ``ApiClient`` (host, TLS, credentials).
        reauthenticate: drops cached credentials after a 401 (e.g. ``EksTokenSource.invalidate``).
        identity: who we are, for error messages (an IAM ARN on EKS).
        page_size: ``limit`` of every list call (items per page).
        request_timeout: read timeout per request in seconds.
        """
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self._connect = connect
        self._reauthenticate = reauthenticate
        self._identity = identity
        self.page_size = page_size
        self._timeout = (min(10.0, request_timeout), request_timeout)
        self._api: Any = None
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
    ) -> KubernetesCluster:
        """An EKS cluster at ``endpoint`` (``eks:DescribeCluster``), authenticated with ``tokens``.

        Args:
            endpoint: API server URL (``https://…eks.amazonaws.com``; ``http://127.0.0.1:…`` in tests).
            tokens: the bearer token source; its ``token()`` is consulted before every request.
            ca_file: PEM bundle that signs the server certificate (see ``eks_auth.write_ca_bundle``).
        """

        def connect() -> Any:
            k8s = _client_module()
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
        )

    @classmethod
    def from_kubeconfig(
        cls,
        context: str | None = None,
        config_file: str | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: float = 30.0,
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

        return cls(connect, identity=identity, page_size=page_size, request_timeout=request_timeout)

    # ----------------------------------------------------------------------------- ClusterReader

    def identity(self) -> str:
        """Who the cluster sees us as (an IAM ARN with EKS tokens, a kubeconfig user otherwise)."""
        return self._identity() if self._identity else "<unknown identity>"

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
            _client_module()
            .AuthorizationV1Api(api)
            .create_self_subject_access_review(
                body=body, _preload_content=False, _request_timeout=self._timeout
            )
        )

    def list_nodes(self) -> list[JSON]:
        """All core/v1 Nodes (``GET /api/v1/nodes``, paginated)."""
        return self._list(
            AccessCheck("list", "nodes"),
            "Node",
            "v1",
            lambda api, **page: _client_module().CoreV1Api(api).list_node(**page),
        )

    def list_pods(self) -> list[JSON]:
        """All core/v1 Pods of all namespaces (``GET /api/v1/pods``, paginated)."""
        return self._list(
            AccessCheck("list", "pods"),
            "Pod",
            "v1",
            lambda api, **page: _client_module().CoreV1Api(api).list_pod_for_all_namespaces(**page),
        )

    def list_pdbs(self) -> list[JSON]:
        """All policy/v1 PodDisruptionBudgets (``GET /apis/policy/v1/poddisruptionbudgets``, paginated)."""
        return self._list(
            AccessCheck("list", "poddisruptionbudgets", group="policy"),
            "PodDisruptionBudget",
            "policy/v1",
            lambda api, **page: (
                _client_module().PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces(**page)
            ),
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
                        _client_module()
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

    def list_resource_claims(self) -> list[JSON]:
        """All ResourceClaims in the served version, unstructured; ``[]`` when DRA is not served."""
        return self._list_dra("resourceclaims", "ResourceClaim")

    def list_resource_slices(self) -> list[JSON]:
        """All ResourceSlices in the served version, unstructured; ``[]`` when DRA is not served."""
        return self._list_dra("resourceslices", "ResourceSlice")

    # --------------------------------------------------------------------------------- internals

    def _list_dra(self, plural: str, kind: str) -> list[JSON]:
        group_version = self.served_resource_api()
        if group_version is None:
            return []
        version = group_version.rpartition("/")[2]
        return self._list(
            AccessCheck("list", plural, group=DRA_GROUP),
            kind,
            group_version,
            lambda api, **page: (
                _client_module()
                .CustomObjectsApi(api)
                .list_cluster_custom_object(DRA_GROUP, version, plural, **page)
            ),
        )

    def _list(self, check: AccessCheck, kind: str, api_version: str, call: Callable[..., Any]) -> list[JSON]:
        """Every item of a list call, following ``continue`` tokens; ⌈N/page_size⌉ requests.

        A 410 Expired continue token restarts the list once from the beginning (as client-go's pager
        does), so the result is still one consistent list, never a splice of two.
        """
        for attempt in (1, 2):
            items: list[JSON] = []
            token: str | None = None
            try:
                while True:
                    page = self._json(
                        check,
                        functools.partial(
                            call,
                            limit=self.page_size,
                            _continue=token,
                            _preload_content=False,
                            _request_timeout=self._timeout,
                        ),
                        expired_ok=token is not None,
                    )
                    version = str(page.get("apiVersion") or api_version)
                    for item in page.get("items") or []:
                        # The API server omits kind/apiVersion on list items; kubectl adds them back.
                        items.append({"apiVersion": version, "kind": kind, **item})
                    token = (page.get("metadata") or {}).get("continue") or None
                    if token is None:
                        return items
            except _Expired as exc:
                if attempt == 2:
                    raise TransientError(
                        f"{check.describe()}: continue token expired twice", retry_after=1.0
                    ) from exc
                log.info("%s: continue token expired (410); listing again from the start", check.describe())
        raise AssertionError("unreachable")

    def _client(self) -> Any:
        if self._api is None:
            self._api = self._connect()
        return self._api

    def _json(self, check: AccessCheck, send: Callable[[Any], Any], *, expired_ok: bool = False) -> JSON:
        """Send one idempotent request and parse its JSON, retrying once after a 401 with new credentials."""
        k8s = _client_module()
        import urllib3

        for attempt in (1, 2):
            try:
                response = send(self._client())
                data = response.data
                break
            except k8s.ApiException as exc:
                if exc.status == 401 and attempt == 1:
                    log.info(
                        "%s: 401 Unauthorized; rebuilding credentials and retrying once", check.describe()
                    )
                    if self._reauthenticate is not None:
                        self._reauthenticate()
                    self._api = None  # kubeconfig mode: re-read it (exec plugins run again)
                    continue
                if exc.status == 410 and expired_ok:
                    raise _Expired(check.describe()) from exc
                raise self._translate(exc, check, second_401=attempt == 2) from exc
            except urllib3.exceptions.HTTPError as exc:
                raise TransientError(f"{check.describe()}: {exc}", retry_after=5.0) from exc
        else:  # pragma: no cover - the loop either breaks, continues once, or raises
            raise AssertionError("unreachable")
        try:
            parsed = json.loads(data)
        except (TypeError, ValueError) as exc:
            raise TransientError(f"{check.describe()}: the answer is not JSON") from exc
        if not isinstance(parsed, dict):
            raise TransientError(f"{check.describe()}: the answer is not a JSON object")
        return parsed

    def _translate(self, exc: Any, check: AccessCheck, *, second_401: bool) -> Exception:
        status = int(exc.status or 0)
        message = _status_message(exc)
        if status == 401:
            who = self.identity()
            again = " again with freshly built credentials" if second_401 else ""
            return KubernetesAccessError(
                f"Kubernetes API answered 401 Unauthorized to {check.describe()}{again}: the cluster does "
                f"not recognise {who}. Remedy: {_REMEDY_401}.",
                identity=who,
                check=check,
                status=401,
            )
        if status == 403:
            who = self.identity()
            return KubernetesAccessError(
                f"Kubernetes API answered 403 Forbidden: {who} may not {check.describe()} ({message}). "
                f"Remedy: {_REMEDY_403}.",
                identity=who,
                check=check,
                status=403,
            )
        if status == 429 or status >= 500:
            return TransientError(
                f"{check.describe()}: HTTP {status} {message}", retry_after=_retry_after(exc, 5.0)
            )
        if status == 0:
            # The client reports TLS failures as status 0: retrying cannot fix a wrong CA bundle.
            return PermanentError(f"{check.describe()}: {exc.reason} (check the cluster CA bundle)")
        return PermanentError(f"{check.describe()}: HTTP {status} {message}")


class _Expired(Exception):
    """A continue token expired (410 Gone); internal signal to restart a list."""
