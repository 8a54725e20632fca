"""The Kubernetes double's wire vocabulary: resources it serves, ``Status`` errors, request records."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
_Key = tuple[str, str]  # (namespace or "", name)
Clock = Callable[[], float]
#: ``placement(new_pod, nodes, previous_node_name) -> node name or None``.
Placement = Callable[[JSON, Sequence[JSON], str | None], str | None]

DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first, as API version priority orders them
DEFAULT_GRACE_SECONDS = 30
_RECREATED_BY_DEFAULT = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet"})
# The suffix alphabet of generateName (k8s.io/apimachinery/pkg/util/rand): no vowels, no look-alikes.
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the double saw it; ``status`` is the answer (None while it is being served).

    ``headers`` keys are lower-case; ``body`` is the parsed JSON, or the raw text when it is not JSON.
    """

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]
    at: float
    status: int | None = None

    def param(self, name: str) -> str | None:
        """The first value of query parameter ``name``, or None."""
        values = self.query.get(name)
        return values[0] if values else None


@dataclass(frozen=True)
class _Resource:
    plural: str
    kind: str
    group: str
    namespaced: bool
    verbs: frozenset[str]
    fields: frozenset[str]
    has_status: bool

    def api_version(self, version: str) -> str:
        """``apiVersion`` of this resource in ``version`` (``v1`` or ``<group>/<version>``)."""
        return f"{self.group}/{version}" if self.group else version


_WRITE = frozenset({"get", "list", "create", "update", "patch", "delete"})
_READ = frozenset({"get", "list"})
# Field selectors each resource supports beyond metadata.name/metadata.namespace (from the API server's
# field label conversion functions).
_POD_FIELDS = (
    "spec.nodeName spec.restartPolicy spec.schedulerName spec.serviceAccountName spec.hostNetwork "
    "status.phase status.podIP status.nominatedNodeName"
)
_EVENT_FIELDS = (
    "involvedObject.kind involvedObject.namespace involvedObject.name involvedObject.uid "
    "involvedObject.apiVersion involvedObject.resourceVersion involvedObject.fieldPath "
    "reason reportingComponent source type"
)
_RESOURCES: dict[str, _Resource] = {
    r.plural: r
    for r in (
        _Resource("nodes", "Node", "", False, _WRITE, frozenset({"spec.unschedulable"}), True),
        _Resource("pods", "Pod", "", True, _WRITE, frozenset(_POD_FIELDS.split()), True),
        _Resource("events", "Event", "", True, _WRITE, frozenset(_EVENT_FIELDS.split()), False),
        _Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy", True, _WRITE, frozenset(), True),
        _Resource("daemonsets", "DaemonSet", "apps", True, _READ, frozenset(), True),
        _Resource("replicasets", "ReplicaSet", "apps", True, _READ, frozenset(), True),
        _Resource("statefulsets", "StatefulSet", "apps", True, _WRITE, frozenset(), True),
        # Workload scale-to-zero (issue 32): owners, their scale subresource (SCALE_RESOURCES), autoscalers.
        _Resource("deployments", "Deployment", "apps", True, _WRITE, frozenset(), True),
        _Resource("notebooks", "Notebook", "kubeflow.org", True, _WRITE, frozenset(), True),
        _Resource(
            "inferenceservices", "InferenceService", "serving.kserve.io", True, _WRITE, frozenset(), True
        ),
        _Resource(
            "leaderworkersets", "LeaderWorkerSet", "leaderworkerset.x-k8s.io", True, _WRITE, frozenset(), True
        ),
        _Resource(
            "horizontalpodautoscalers",
            "HorizontalPodAutoscaler",
            "autoscaling",
            True,
            _WRITE,
            frozenset(),
            True,
        ),
        _Resource("scaledobjects", "ScaledObject", "keda.sh", True, _WRITE, frozenset(), True),
        _Resource("jobs", "Job", "batch", True, _READ, frozenset(), True),
        _Resource("replicationcontrollers", "ReplicationController", "", True, _READ, frozenset(), True),
        _Resource("persistentvolumeclaims", "PersistentVolumeClaim", "", True, _WRITE, frozenset(), True),
        _Resource("persistentvolumes", "PersistentVolume", "", False, _WRITE, frozenset(), True),
        _Resource("resourceclaims", "ResourceClaim", DRA_GROUP, True, _READ, frozenset(), True),
        _Resource(
            "resourceslices",
            "ResourceSlice",
            DRA_GROUP,
            False,
            _READ,
            frozenset({"spec.nodeName", "spec.driver"}),
            False,
        ),
    )
}


def controller_object(pod: JSON) -> tuple[str, JSON] | None:
    """The controller a pod names, as (resource plural, a minimal object of it), when it is a kind the drain
    reads back (``rightsizer.domain.pods.READABLE_CONTROLLERS``); None otherwise. The object carries the
    ownerReference's UID when it has one, so the pod's reference matches it."""
    from rightsizer.domain.pods import READABLE_CONTROLLERS

    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller"):
            continue
        api_version = str(ref.get("apiVersion") or "")
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        plural = READABLE_CONTROLLERS.get((group, str(ref.get("kind"))))
        if plural is None:
            return None
        owner_meta = {"name": ref.get("name"), "namespace": meta.get("namespace") or "default"}
        if ref.get("uid"):
            owner_meta["uid"] = ref["uid"]
        return plural, {"apiVersion": api_version, "kind": ref["kind"], "metadata": owner_meta, "spec": {}}
    return None


#: Resources with a ``scale`` subresource (autoscaling/v1 Scale over ``spec.replicas``).
SCALE_RESOURCES = frozenset({"deployments", "statefulsets", "replicasets", "leaderworkersets"})
#: API groups and versions the double serves besides the built-in ones.
WORKLOAD_GROUPS: dict[str, tuple[str, ...]] = {
    "autoscaling": ("v2", "v1"),
    "kubeflow.org": ("v1",),
    "serving.kserve.io": ("v1beta1",),
    "leaderworkerset.x-k8s.io": ("v1",),
    "keda.sh": ("v1alpha1",),
}


# Status integers Go always serialises (no omitempty); the official client rejects objects without them.
_STATUS_DEFAULTS: dict[str, JSON] = {
    "poddisruptionbudgets": dict.fromkeys(
        ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods"), 0
    ),
    "daemonsets": dict.fromkeys(
        ("currentNumberScheduled", "desiredNumberScheduled", "numberMisscheduled", "numberReady"), 0
    ),
}
# Field selector names that are not a plain path into the object.
_FIELD_ALIASES = {"source": "source.component"}


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` body."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: JSON | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason=reason, details=details)


def status_body(code: int, message: str, *, reason: str | None = None, details: JSON | None = None) -> JSON:
    """A ``Status`` object as the API server writes it for an error ``code``."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def _not_found(res: _Resource, name: str) -> ApiError:
    details: JSON = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return ApiError(404, f'{_qualified(res)} "{name}" not found', details=details)


def _conflict(res: _Resource, name: str, why: str) -> ApiError:
    details: JSON = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return ApiError(
        409, f'Operation cannot be fulfilled on {_qualified(res)} "{name}": {why}', details=details
    )


def _qualified(res: _Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


_STALE = "the object has been modified; please apply your changes to the latest version and try again"


def rfc3339(epoch_seconds: float) -> str:
    """``epoch_seconds`` as the API server writes timestamps (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Injection:
    method: str
    pattern: re.Pattern[str]
    status: int
    body: Any
    headers: dict[str, str]
    remaining: int | None  # None: forever


@dataclass(frozen=True)
class _Target:
    res: _Resource
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass
class _Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _PageSnapshot:
    resource_version: str
    items: list[bytes]  # each item's JSON, as the first page saw it
    counted: bool
