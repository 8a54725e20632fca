"""A stateful Kubernetes API server double, served over real HTTP on 127.0.0.1.

The demo and the integration tests point the official ``kubernetes`` client (or httpx) at
``KubernetesDouble().start()`` instead of patching clients, so the adapters are exercised down to the
wire: paths, query parameters, content types, status codes and ``Status`` bodies.

Semantics covered (what GPU Rightsizer calls):

- Resources: core/v1 ``nodes`` (cluster-scoped), ``pods``, ``events``; policy/v1 ``poddisruptionbudgets``;
  apps/v1 ``daemonsets`` (get/list); resource.k8s.io ``resourceclaims`` and ``resourceslices`` (get/list)
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
  Conflict), ``application/merge-patch+json``, ``application/strategic-merge-patch+json`` (merge semantics;
  ``$patch: delete|replace`` honoured, other ``$`` directives ignored, lists replaced wholesale, which is
  what the API does for ``spec.taints``) and ``application/json-patch+json`` (add, remove, replace, move,
  copy, test; a failure answers 422 Invalid). Writes to the main resource keep ``status`` unchanged, as for
  any resource with a status subresource. PodDisruptionBudget spec changes bump ``metadata.generation``.
- Pods: graceful deletion (``deletionTimestamp`` = now + grace, ``deletionGracePeriodSeconds``; grace from
  DeleteOptions, else ``spec.terminationGracePeriodSeconds``, else 30 s); unscheduled and terminal pods and
  a grace of 0 go at once; UID and resourceVersion preconditions.
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

Deliberately not covered: watch (``watch=true`` answers 400), server-side apply, strategic merge keys for
lists (e.g. ``status.conditions``), field managers, admission, validation of object schemas, namespaces as
objects, finalizers, ``dryRun``, ``propagationPolicy``, consistent reads at a requested ``resourceVersion``,
protobuf/CBOR, and scheduling by resource requests. Continue tokens expire (410 Expired) only once 64 newer
paginations have started; inject a 410 to test that path. A PDB with neither ``minAvailable`` nor
``maxUnavailable`` desires 0 healthy pods. Authentication (401) is checked before injected responses.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import http.server
import json
import math
import random
import re
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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


# --------------------------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether an object with ``labels`` satisfies this requirement."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # Like the API server, != and notin also match objects that lack the key.
        return not present or value not in self.values


_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"[-A-Za-z0-9_.]*"
_SET_RE = re.compile(rf"^\s*({_LABEL_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_LABEL_KEY})\s*(==|!=|=)\s*({_LABEL_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_LABEL_KEY})\s*$")


def parse_label_selector(selector: str) -> list[_Requirement]:
    """Parse a ``labelSelector`` query value; raise ``ApiError`` 400 when it is malformed."""
    requirements: list[_Requirement] = []
    for part in _split_outside_parens(selector):
        if not part.strip():
            continue
        if m := _SET_RE.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            requirements.append(_Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_RE.match(part):
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append(_Requirement(m.group(1), op, frozenset({m.group(3)})))
        elif m := _EXISTS_RE.match(part):
            requirements.append(_Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
        else:
            raise ApiError(400, f"unable to parse requirement: {part.strip()!r}")
    return requirements


def _split_outside_parens(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def label_selector_matches(selector: JSON | None, labels: dict[str, str]) -> bool:
    """Whether a structured ``LabelSelector`` (matchLabels/matchExpressions) selects ``labels``.

    A missing selector selects nothing; an empty one selects everything (policy/v1 PDB semantics).
    """
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        requirement = _Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or []))
        if not requirement.matches(labels):
            return False
    return True


def _field_value(obj: JSON, path: str) -> str:
    current: Any = obj
    for part in _FIELD_ALIASES.get(path, path).split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(selector: str, res: _Resource) -> list[tuple[str, bool, str]]:
    """Parse a ``fieldSelector`` into (field, equal?, value) terms for resource ``res``."""
    allowed = res.fields | {"metadata.name"} | ({"metadata.namespace"} if res.namespaced else set())
    terms = []
    for part in selector.split(","):
        if not part.strip():
            continue
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, f"invalid selector: {part!r}; can't understand {part!r}")
        if m.group(1) not in allowed:
            raise ApiError(400, f"field label not supported: {m.group(1)}")
        terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return terms


# ----------------------------------------------------------------------------------------------- patches


class _Delete:
    """Marker returned by a strategic merge ``$patch: delete``."""


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """Apply an RFC 7386 JSON merge patch; with ``strategic``, honour ``$patch`` and drop ``$`` keys."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if strategic:
        directive = patch.get("$patch")
        if directive == "delete":
            return _Delete()
        if directive == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        merged = merge_patch(result.get(key), value, strategic=strategic)
        if isinstance(merged, _Delete):
            result.pop(key, None)
        else:
            result[key] = merged
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer: {path!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    current = doc
    for token in tokens[:-1]:
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            raise ApiError(422, f"doc is missing path: {path!r}")
    return current, tokens[-1]


def _pointer_get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, f"doc is missing path: {path!r}")


def _pointer_remove(doc: Any, path: str) -> Any:
    value = _pointer_get(doc, path)
    parent, last = _resolve_parent(doc, _pointer(path), path)
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return value


def _pointer_add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    if replace:
        _pointer_get(doc, path)
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(422, f"index out of range in {path!r}")
    else:
        raise ApiError(422, f"doc is missing path: {path!r}")
    return doc


def json_patch(document: JSON, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch to a copy of ``document``; raise ``ApiError`` 422 on any failure."""
    if not isinstance(operations, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    doc: Any = copy.deepcopy(document)
    for operation in operations:
        op, path = operation.get("op"), operation.get("path")
        if not isinstance(path, str):
            raise ApiError(422, f"operation {operation!r} has no path")
        if op == "test":
            if _pointer_get(doc, path) != operation.get("value"):
                raise ApiError(
                    422,
                    "the server rejected our request due to an error in our request "
                    f"(testing value {path} failed: test failed)",
                )
        elif op in ("add", "replace"):
            doc = _pointer_add(doc, path, copy.deepcopy(operation.get("value")), replace=op == "replace")
        elif op == "remove":
            _pointer_remove(doc, path)
        elif op in ("move", "copy"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise ApiError(422, f"operation {operation!r} has no from")
            value = _pointer_remove(doc, source) if op == "move" else copy.deepcopy(_pointer_get(doc, source))
            doc = _pointer_add(doc, path, value, replace=False)
        else:
            raise ApiError(422, f"unexpected JSON patch operation {op!r}")
    return doc


# ----------------------------------------------------------------------------------- DRA version shapes


def _dra_to(obj: JSON, version: str) -> JSON:
    """Convert a v1-shaped DRA object to ``version`` (v1beta1 wraps devices in ``basic`` and unwraps
    ``exactly``)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{DRA_GROUP}/{version}"
    if version != "v1beta1":
        return out
    spec = out.get("spec") or {}
    if out.get("kind") == "ResourceSlice" and isinstance(spec.get("devices"), list):
        spec["devices"] = [
            {"name": d.get("name"), "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in spec["devices"]
        ]
    requests = (spec.get("devices") or {}).get("requests") if out.get("kind") == "ResourceClaim" else None
    if isinstance(requests, list):
        spec["devices"]["requests"] = [
            {"name": r.get("name"), **r["exactly"]} if "exactly" in r else r for r in requests
        ]
    return out


def _dra_from(obj: JSON) -> JSON:
    """Normalise a DRA object of any served version to the v1 shape the double stores."""
    out = copy.deepcopy(obj)
    if not str(out.get("apiVersion", "")).endswith("/v1beta1"):
        return out
    spec = out.get("spec") or {}
    if out.get("kind") == "ResourceSlice" and isinstance(spec.get("devices"), list):
        spec["devices"] = [{"name": d.get("name"), **(d.get("basic") or {})} for d in spec["devices"]]
    requests = (spec.get("devices") or {}).get("requests") if out.get("kind") == "ResourceClaim" else None
    if isinstance(requests, list):
        spec["devices"]["requests"] = [
            r
            if "firstAvailable" in r
            else {"name": r.get("name"), "exactly": {k: v for k, v in r.items() if k != "name"}}
            for r in requests
        ]
    out["apiVersion"] = f"{DRA_GROUP}/v1"
    return out


# ------------------------------------------------------------------------------------------- scheduling


def _node_ready(node: JSON) -> bool:
    conditions = (node.get("status") or {}).get("conditions")
    if not conditions:
        return True  # hand-written test nodes often carry no status at all
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerates(pod: JSON, taint: JSON) -> bool:
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def first_fit(pod: JSON, nodes: Sequence[JSON], previous_node: str | None) -> str | None:
    """Default placement: the first node by name that is Ready, schedulable, not ``previous_node``,
    matches the pod's ``nodeSelector`` and whose NoSchedule/NoExecute taints the pod tolerates."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        if name == previous_node or (node.get("spec") or {}).get("unschedulable") or not _node_ready(node):
            continue
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        taints = (node.get("spec") or {}).get("taints") or []
        if all(_tolerates(pod, t) for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")):
            return str(name)
    return None


# ----------------------------------------------------------------------------------------------- double


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
    items: list[JSON]
    counted: bool


class KubernetesDouble:
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
        """
        self._clock: Clock = clock or time.time
        self._time_scale = time_scale
        self._epoch = self._clock()
        self._offset = 0.0
        self._placement: Placement = placement or first_fit
        self._replacement_start = replacement_start_seconds
        self._denied: set[tuple[str, str, str, str]] = set(denied)
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

    def add_pod(self, obj: JSON) -> JSON:
        """Store (or replace) a Pod; ``status.phase`` defaults to Running when scheduled, else Pending."""
        return self._add("pods", obj)

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

    def add_resource_claim(self, obj: JSON) -> JSON:
        """Store (or replace) a ResourceClaim of any resource.k8s.io version (kept in the v1 shape)."""
        return self._add("resourceclaims", _dra_from(obj))

    def add_resource_slice(self, obj: JSON) -> JSON:
        """Store (or replace) a ResourceSlice of any resource.k8s.io version (kept in the v1 shape)."""
        return self._add("resourceslices", _dra_from(obj))

    def add_event(self, obj: JSON) -> JSON:
        """Store (or replace) a core/v1 Event."""
        return self._add("events", obj)

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

    # --------------------------------------------------------------------------------------- time

    def now(self) -> float:
        """The double's clock in epoch seconds."""
        return self._epoch + (self._clock() - self._epoch) * self._time_scale + self._offset

    def advance(self, seconds: float) -> None:
        """Move the double's clock forward and reap what expired."""
        with self._lock:
            self._offset += seconds
            self._reap_locked()

    def reap(self) -> None:
        """Remove pods whose grace period ended, recreate and schedule controller pods, refresh PDBs."""
        with self._lock:
            self._reap_locked()

    # ------------------------------------------------------------------------------------ serving

    def _handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> _Response:
        split = urlsplit(raw_path)
        try:
            body: Any = json.loads(raw_body) if raw_body else None
        except ValueError:
            body = raw_body.decode("utf-8", "replace")
        request = RecordedRequest(
            method, split.path, parse_qs(split.query, keep_blank_values=True), body, headers, self.now()
        )
        try:
            # Hooks run outside the lock: they may be slow (moto) or call back into the double.
            for hook in list(self._hooks):
                hook(request)
            with self._lock:
                response = self._answer(request)
        except ApiError as error:
            response = _Response(error.code, error.body)
        except Exception as error:  # a bug in the double or a hook must not look like a dropped connection
            with self._lock:
                self._internal_errors.append(traceback.format_exc())
            response = _Response(500, status_body(500, f"Internal error occurred: {error!r}"))
        with self._lock:
            self._requests.append(dataclasses.replace(request, status=response.status))
        return response

    def _answer(self, request: RecordedRequest) -> _Response:
        if self._tokens is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token.strip() not in self._tokens:
                return _Response(401, status_body(401, "Unauthorized"))
        for injection in self._injections:
            if injection.method in ("*", request.method) and injection.pattern.search(request.path):
                if injection.remaining is not None:
                    injection.remaining -= 1
                    if injection.remaining <= 0:
                        self._injections.remove(injection)
                body = injection.body
                if body is None:
                    body = status_body(injection.status, f"injected {injection.status}")
                return _Response(injection.status, body, dict(injection.headers))
        self._reap_locked()
        return self._route(request)

    def _route(self, request: RecordedRequest) -> _Response:
        path = request.path.rstrip("/") or "/"
        if path == "/version":
            major, minor = self._server_version
            return _Response(
                200,
                {
                    "major": str(major),
                    "minor": str(minor),
                    "emulationMajor": str(major),
                    "emulationMinor": str(minor),
                    "gitVersion": f"v{major}.{minor}.0-eks-double",
                    "gitCommit": "0" * 40,
                    "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.24.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if path == "/api":
            return _Response(
                200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if path == "/apis":
            groups = [self._api_group(g) for g in self._served_groups()]
            return _Response(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if segments[0] == "apis" and len(segments) == 2 and segments[1] in self._served_groups():
            return _Response(200, {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(segments[1])})
        if segments[:2] == ["api", "v1"] and len(segments) == 2:
            return _Response(200, self._resource_list("", "v1"))
        if (
            segments[0] == "apis"
            and len(segments) == 3
            and segments[2] in self._served_groups().get(segments[1], ())
        ):
            return _Response(200, self._resource_list(segments[1], segments[2]))
        if request.method == "POST" and path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            return self._access_review(request.body)
        target = self._target(segments)
        verb = self._verb(request, target)
        self._authorize(verb, target)
        if target.subresource == "eviction" and request.method == "POST":
            return self._evict(target, request.body)
        if target.subresource is not None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        if verb not in target.res.verbs:
            raise ApiError(
                405, f"{verb} is not supported on {_qualified(target.res)} by the Kubernetes double"
            )
        handler: Callable[[_Target, RecordedRequest], _Response] = getattr(self, f"_serve_{verb}")
        return handler(target, request)

    def _served_groups(self) -> dict[str, tuple[str, ...]]:
        groups: dict[str, tuple[str, ...]] = {
            "apps": ("v1",),
            "policy": ("v1",),
            "authorization.k8s.io": ("v1",),
        }
        if self._dra_versions:
            groups[DRA_GROUP] = self._dra_versions
        return groups

    def _api_group(self, name: str) -> JSON:
        versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in self._served_groups()[name]]
        return {"name": name, "versions": versions, "preferredVersion": versions[0]}

    def _resource_list(self, group: str, version: str) -> JSON:
        resources: list[JSON] = [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": sorted(r.verbs),
            }
            for r in _RESOURCES.values()
            if r.group == group
        ]
        if group == "":
            resources.append(
                {
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Eviction",
                    "group": "policy",
                    "version": "v1",
                    "verbs": ["create"],
                }
            )
        if group == "authorization.k8s.io":
            resources.append(
                {
                    "name": "selfsubjectaccessreviews",
                    "singularName": "selfsubjectaccessreview",
                    "namespaced": False,
                    "kind": "SelfSubjectAccessReview",
                    "verbs": ["create"],
                }
            )
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    def _target(self, segments: list[str]) -> _Target:
        not_found = ApiError(404, "the server could not find the requested resource", details={})
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif segments[0] == "apis" and len(segments) >= 4:
            group, version, rest = segments[1], segments[2], segments[3:]
            if version not in self._served_groups().get(group, ()):
                raise not_found
        else:
            raise not_found
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        res = _RESOURCES.get(rest[0]) if rest else None
        if (
            res is None
            or res.group != group
            or len(rest) > 3
            or (namespace is not None and not res.namespaced)
        ):
            raise not_found
        return _Target(
            res, version, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        )

    @staticmethod
    def _verb(request: RecordedRequest, target: _Target) -> str:
        if request.method == "GET":
            if request.param("watch") in ("true", "1"):
                raise ApiError(400, "watch is not supported by the Kubernetes double")
            return "get" if target.name else "list"
        verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if request.method not in verbs or (request.method != "POST" and not target.name):
            raise ApiError(405, f"{request.method} is not allowed here")
        if request.method == "POST" and target.name and target.subresource is None:
            raise ApiError(405, "POST is not allowed on a named object")
        return verbs[request.method]

    def _is_denied(self, verb: str, resource: str, subresource: str, group: str) -> bool:
        wanted = (verb, resource, subresource, group)
        return any(all(d in ("*", w) for d, w in zip(rule, wanted, strict=True)) for rule in self._denied)

    def _authorize(self, verb: str, target: _Target) -> None:
        res = target.res
        subresource = target.subresource or ""
        if not self._enforce_denials or not self._is_denied(verb, res.plural, subresource, res.group):
            return
        resource = f"{res.plural}/{subresource}" if subresource else res.plural
        where = f' in the namespace "{target.namespace}"' if target.namespace else " at the cluster scope"
        subject = f'{_qualified(res)} "{target.name}"' if target.name else _qualified(res)
        raise ApiError(
            403,
            f'{subject} is forbidden: User "{self._user}" cannot {verb} resource "{resource}" '
            f'in API group "{res.group}"{where}',
            details={
                "name": target.name or "",
                "kind": res.plural,
                **({"group": res.group} if res.group else {}),
            },
        )

    def _access_review(self, body: Any) -> _Response:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise ApiError(400, "SelfSubjectAccessReview needs a spec")
        attributes = body["spec"].get("resourceAttributes")
        review = copy.deepcopy(body)
        review.setdefault("apiVersion", "authorization.k8s.io/v1")
        review.setdefault("kind", "SelfSubjectAccessReview")
        review.setdefault("metadata", {})["creationTimestamp"] = None
        if isinstance(attributes, dict):
            wanted = tuple(str(attributes.get(k) or "") for k in ("verb", "resource", "subresource", "group"))
            denied = self._is_denied(*wanted)
        else:
            denied = False  # non-resource URLs are not part of the deny-list
        review["status"] = {"allowed": not denied}
        if denied:
            review["status"].update(denied=True, reason="denied by the Kubernetes double's deny-list")
        return _Response(201, review)

    # ------------------------------------------------------------------------------ verb handlers

    def _present(self, target: _Target, obj: JSON, *, in_list: bool = False) -> JSON:
        shown = _dra_to(obj, target.version) if target.res.group == DRA_GROUP else copy.deepcopy(obj)
        if in_list:
            shown.pop("kind", None)
            shown.pop("apiVersion", None)
        return shown

    def _lookup(self, target: _Target) -> tuple[tuple[str, str], JSON]:
        key = (target.namespace or "", target.name or "")
        if target.res.namespaced and target.namespace is None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        found = self._store[target.res.plural].get(key)
        if found is None:
            raise _not_found(target.res, target.name or "")
        return key, found

    def _serve_get(self, target: _Target, request: RecordedRequest) -> _Response:
        return _Response(200, self._present(target, self._lookup(target)[1]))

    def _serve_list(self, target: _Target, request: RecordedRequest) -> _Response:
        if target.name is not None:
            raise ApiError(405, "list needs a collection path")
        try:
            limit = int(request.param("limit") or 0)
        except ValueError as error:
            raise ApiError(400, f"invalid limit: {error}") from error
        token = request.param("continue")
        if token:
            snapshot_id, offset = self._decode_continue(token)
            snapshot = self._pages.get(snapshot_id)
            if snapshot is None:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter.",
                )
        else:
            snapshot_id, offset = uuid.uuid4().hex, 0
            snapshot = self._snapshot(target, request)
        end = offset + limit if limit > 0 else len(snapshot.items)
        metadata: JSON = {"resourceVersion": snapshot.resource_version}
        if end < len(snapshot.items):
            self._pages[snapshot_id] = snapshot
            while len(self._pages) > 64:  # abandoned paginations must not grow without bound
                self._pages.pop(next(iter(self._pages)))
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps({"id": snapshot_id, "offset": end, "rv": snapshot.resource_version}).encode()
            ).decode()
            if snapshot.counted:
                metadata["remainingItemCount"] = len(snapshot.items) - end
        res = target.res
        return _Response(
            200,
            {
                "kind": f"{res.kind}List",
                "apiVersion": res.api_version(target.version),
                "metadata": metadata,
                "items": copy.deepcopy(snapshot.items[offset:end]),
            },
        )

    @staticmethod
    def _decode_continue(token: str) -> tuple[str, int]:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(decoded["id"]), int(decoded["offset"])
        except (ValueError, KeyError, TypeError) as error:
            raise ApiError(400, f"continue key is not valid: {error}") from error

    def _snapshot(self, target: _Target, request: RecordedRequest) -> _PageSnapshot:
        labels = parse_label_selector(request.param("labelSelector") or "")
        fields = parse_field_selector(request.param("fieldSelector") or "", target.res)
        items = []
        for (namespace, _), obj in sorted(self._store[target.res.plural].items()):
            if target.namespace is not None and namespace != target.namespace:
                continue
            object_labels = obj["metadata"].get("labels") or {}
            if not all(r.matches(object_labels) for r in labels):
                continue
            if all((_field_value(obj, f) == value) == equal for f, equal, value in fields):
                items.append(self._present(target, obj, in_list=True))
        return _PageSnapshot(str(self._rv), items, counted=not labels and not fields)

    def _serve_create(self, target: _Target, request: RecordedRequest) -> _Response:
        res, body = target.res, request.body
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        body_namespace = (body.get("metadata") or {}).get("namespace")
        if res.namespaced and target.namespace is None:
            raise ApiError(405, f"create {res.plural} needs a namespaced path")
        if body_namespace and target.namespace and body_namespace != target.namespace:
            raise ApiError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        obj = self._prepare_new(res, copy.deepcopy(body), target.namespace)
        key = self._key(res, obj)
        if key in self._store[res.plural]:
            details: JSON = {"name": key[1], "kind": res.plural}
            raise ApiError(
                409, f'{_qualified(res)} "{key[1]}" already exists', reason="AlreadyExists", details=details
            )
        self._bump(obj)
        self._store[res.plural][key] = obj
        self._touched(res)
        return _Response(201, self._present(target, obj))

    def _serve_update(self, target: _Target, request: RecordedRequest) -> _Response:
        key, current = self._lookup(target)
        if not isinstance(request.body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        name = (request.body.get("metadata") or {}).get("name")
        if name != target.name:
            raise ApiError(
                400, f"the name of the object ({name}) does not match the name on the URL ({target.name})"
            )
        return self._commit(target, key, current, copy.deepcopy(request.body))

    def _serve_patch(self, target: _Target, request: RecordedRequest) -> _Response:
        key, current = self._lookup(target)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json-patch+json":
            patched = json_patch(current, request.body)
        elif content_type == "application/merge-patch+json":
            patched = merge_patch(current, request.body)
        elif content_type == "application/strategic-merge-patch+json":
            patched = merge_patch(current, request.body, strategic=True)
        else:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format ({content_type or 'none'}) - accepted media "
                "types include: application/json-patch+json, application/merge-patch+json, "
                "application/strategic-merge-patch+json",
            )
        if not isinstance(patched, dict):
            raise ApiError(422, "the patch did not produce an object")
        return self._commit(target, key, current, patched)

    def _commit(self, target: _Target, key: tuple[str, str], current: JSON, new: JSON) -> _Response:
        """Finish an update or patch: resourceVersion precondition, immutable fields, status, generation."""
        res = target.res
        wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise _conflict(res, key[1], _STALE)
        meta = new.setdefault("metadata", {})
        for immutable in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if immutable in current["metadata"]:
                meta[immutable] = current["metadata"][immutable]
            else:
                meta.pop(immutable, None)
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        if res.has_status:
            # Writes to the main resource never change status; that is the status subresource's job.
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        if "generation" in meta and new.get("spec") != current.get("spec"):
            meta["generation"] = int(meta["generation"]) + 1
        self._bump(new)
        self._store[res.plural][key] = new
        self._touched(res)
        if res.plural == "poddisruptionbudgets":
            self._reap_locked()
        return _Response(200, self._present(target, self._store[res.plural][key]))

    def _serve_delete(self, target: _Target, request: RecordedRequest) -> _Response:
        key, current = self._lookup(target)
        options = request.body if isinstance(request.body, dict) else {}
        self._check_preconditions(target.res, current, options.get("preconditions") or {})
        res = target.res
        if res.plural == "pods":
            grace_param = request.param("gracePeriodSeconds")
            if grace_param is not None and not grace_param.lstrip("-").isdigit():
                raise ApiError(400, f"invalid gracePeriodSeconds: {grace_param!r}")
            grace = options.get("gracePeriodSeconds", int(grace_param) if grace_param else None)
            self._delete_pod(key, current, grace)
            remaining = self._store["pods"].get(key)
            shown = (
                remaining
                if remaining is not None and remaining["metadata"]["uid"] == current["metadata"]["uid"]
                else current
            )
            return _Response(200, self._present(target, shown))
        del self._store[res.plural][key]
        self._frozen_pdbs.discard(key)
        self._bump()
        self._touched(res)
        details = {"name": key[1], "kind": res.plural, "uid": current["metadata"]["uid"]}
        return _Response(
            200,
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details},
        )

    def _check_preconditions(self, res: _Resource, obj: JSON, preconditions: JSON) -> None:
        meta = obj["metadata"]
        uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
        if uid and uid != meta["uid"]:
            raise _conflict(
                res,
                meta["name"],
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}",
            )
        if rv and rv != meta["resourceVersion"]:
            raise _conflict(
                res,
                meta["name"],
                f"Precondition failed: ResourceVersion in precondition: {rv}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )

    # ---------------------------------------------------------------------------------- eviction

    def _evict(self, target: _Target, body: Any) -> _Response:
        pods = _RESOURCES["pods"]
        if target.res is not pods or target.namespace is None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        eviction = body if isinstance(body, dict) else {}
        named = (eviction.get("metadata") or {}).get("name")
        if named and named != target.name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        key, pod = self._lookup(target)
        options = eviction.get("deleteOptions") or {}
        # Checked before any budget is spent, so a stale UID never costs a disruption.
        self._check_preconditions(pods, pod, options.get("preconditions") or {})
        grace = options.get("gracePeriodSeconds")
        phase = (pod.get("status") or {}).get("phase")
        if pod["metadata"].get("deletionTimestamp") or phase in ("Pending", "Succeeded", "Failed"):
            self._delete_pod(key, pod, grace)
            return self._evicted()
        budgets = self._matching_pdbs(pod)
        if len(budgets) > 1:
            message = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            raise ApiError(
                500, f"Internal error occurred: {message}", details={"causes": [{"message": message}]}
            )
        if budgets:
            self._spend_budget(budgets[0], pod)
        self._delete_pod(key, pod, grace)
        return self._evicted()

    @staticmethod
    def _evicted() -> _Response:
        return _Response(
            201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        )

    def _matching_pdbs(self, pod: JSON) -> list[JSON]:
        namespace = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        return [
            pdb
            for (pdb_namespace, _), pdb in sorted(self._store["poddisruptionbudgets"].items())
            if pdb_namespace == namespace
            and label_selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]

    def _spend_budget(self, pdb: JSON, pod: JSON) -> None:
        """The eviction subresource's checkAndDecrement, including the unhealthy-pod policy."""
        name = pdb["metadata"]["name"]
        status = pdb.setdefault("status", {})
        current, desired = int(status.get("currentHealthy", 0)), int(status.get("desiredHealthy", 0))
        if not _pod_ready(pod):
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            if policy == "AlwaysAllow" or (current >= desired > 0):
                return
        too_many = "Cannot evict pod as it would violate the pod's disruption budget."
        observed = status.get("observedGeneration")
        if observed is not None and int(observed) < int(pdb["metadata"].get("generation", 1)):
            cause = f"The disruption budget {name} is still being processed by the server."
            raise ApiError(
                429, too_many, details={"causes": [{"reason": "DisruptionBudget", "message": cause}]}
            )
        allowed = int(status.get("disruptionsAllowed", 0))
        if allowed < 0:
            raise ApiError(403, "pdb disruptions allowed is negative")
        if allowed == 0:
            cause = f"The disruption budget {name} needs {desired} healthy pods and has {current} currently"
            raise ApiError(
                429, too_many, details={"causes": [{"reason": "DisruptionBudget", "message": cause}]}
            )
        status["disruptionsAllowed"] = allowed - 1
        status.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = rfc3339(self.now())
        self._bump(pdb)

    # ------------------------------------------------------------------------- pods and controllers

    def _delete_pod(self, key: tuple[str, str], pod: JSON, grace: int | None) -> None:
        """Start (or shorten) a graceful deletion; unscheduled, terminal and zero-grace pods go at once."""
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        grace = max(0, int(grace))
        now = self.now()
        uid = meta["uid"]
        if meta.get("deletionTimestamp"):
            if grace == 0:
                self._remove_pod(key)
            elif uid in self._deadlines and now + grace < self._deadlines[uid][0]:
                self._begin_termination(pod, key, now, grace)
            return
        if (
            grace == 0
            or not spec.get("nodeName")
            or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            self._remove_pod(key)
            return
        self._begin_termination(pod, key, now, grace)
        owner = _controller_of(pod)
        if owner is not None and owner.get("kind") == "ReplicaSet":
            self._recreate(pod)

    def _begin_termination(self, pod: JSON, key: tuple[str, str], now: float, grace: int) -> None:
        pod["metadata"]["deletionTimestamp"] = rfc3339(now + grace)
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        self._deadlines[pod["metadata"]["uid"]] = (now + grace, key)
        self._bump(pod)
        self._pdbs_dirty = True

    def _remove_pod(self, key: tuple[str, str]) -> None:
        pod = self._store["pods"].pop(key)
        uid = pod["metadata"]["uid"]
        for index in (self._deadlines, self._unplaced, self._starting):
            index.pop(uid, None)
        self._bump()
        self._pdbs_dirty = True
        if uid in self._replaced:
            self._replaced.discard(uid)
        else:
            self._recreate(pod)

    def _recreate(self, old: JSON) -> None:
        """Play the owning controller: a new pod (new UID) replaces ``old``, placed by ``placement``."""
        owner = _controller_of(old)
        if owner is None or owner.get("kind") not in self._recreated_kinds:
            return
        kind = owner["kind"]
        previous_node = (old.get("spec") or {}).get("nodeName")
        if kind == "DaemonSet" and ("", previous_node) not in self._store["nodes"]:
            return  # a DaemonSet pod belongs to its node; a deleted node gets no replacement
        new = copy.deepcopy(old)
        meta = new["metadata"]
        for transient in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "uid",
            "creationTimestamp",
        ):
            meta.pop(transient, None)
        namespace = meta["namespace"]
        if kind != "StatefulSet":
            prefix = meta.get("generateName") or f"{owner.get('name', meta['name'])}-"
            meta["name"] = self._unique_name(prefix, namespace)
        new["spec"].pop("nodeName", None)
        qos = (old.get("status") or {}).get("qosClass")
        new["status"] = {"phase": "Pending", **({"qosClass": qos} if qos else {})}
        self._prepare_new(_RESOURCES["pods"], new, namespace)
        key = (namespace, meta["name"])
        if key in self._store["pods"]:
            return  # a StatefulSet pod of that name already came back
        if old["metadata"]["uid"] in self._deadlines:
            self._replaced.add(old["metadata"]["uid"])
        if kind == "DaemonSet":
            self._bind(new, key, str(previous_node))
        else:
            nodes = [copy.deepcopy(n) for _, n in sorted(self._store["nodes"].items())]
            chosen = self._placement(copy.deepcopy(new), nodes, previous_node)
            if chosen is not None and ("", chosen) in self._store["nodes"]:
                self._bind(new, key, chosen)
            else:
                self._unplaced[meta["uid"]] = (key, previous_node)
                new["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f"0/{len(nodes)} nodes are available.",
                        "lastTransitionTime": rfc3339(self.now()),
                    }
                ]
        self._bump(new)
        self._store["pods"][key] = new
        self._pdbs_dirty = True

    def _unique_name(self, prefix: str, namespace: str) -> str:
        while True:
            name = prefix + "".join(self._rng.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if (namespace, name) not in self._store["pods"]:
                return name

    def _bind(self, pod: JSON, key: tuple[str, str], node: str) -> None:
        pod["spec"]["nodeName"] = node
        now = self.now()
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(now)}
        pod["status"]["conditions"] = [scheduled]
        if self._replacement_start > 0:
            self._starting[pod["metadata"]["uid"]] = (now + self._replacement_start, key)
        else:
            self._set_running(pod, ready=True)

    def _set_running(self, pod: JSON, *, ready: bool) -> None:
        status = pod.setdefault("status", {})
        now = rfc3339(self.now())
        status["phase"] = "Running"
        status.setdefault("startTime", now)
        flag = "True" if ready else "False"
        kept = [
            c for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady")
        ]
        status["conditions"] = [
            *kept,
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ]

    def _reap_locked(self) -> None:
        now = self.now()
        for uid, (deadline, key) in sorted(self._deadlines.items(), key=lambda item: item[1][0]):
            pod = self._store["pods"].get(key)
            if deadline > now:
                break
            if pod is not None and pod["metadata"]["uid"] == uid:
                self._remove_pod(key)
            else:
                self._deadlines.pop(uid, None)
        for uid, (key, avoid) in list(self._unplaced.items()):
            pod = self._store["pods"].get(key)
            if pod is None or pod["metadata"]["uid"] != uid:
                self._unplaced.pop(uid, None)
                continue
            nodes = [copy.deepcopy(n) for _, n in sorted(self._store["nodes"].items())]
            chosen = self._placement(copy.deepcopy(pod), nodes, avoid)
            if chosen is not None and ("", chosen) in self._store["nodes"]:
                del self._unplaced[uid]
                self._bind(pod, key, chosen)
                self._bump(pod)
                self._pdbs_dirty = True
        for uid, (ready_at, key) in list(self._starting.items()):
            pod = self._store["pods"].get(key)
            if pod is None or pod["metadata"]["uid"] != uid:
                self._starting.pop(uid, None)
            elif ready_at <= now:
                del self._starting[uid]
                self._set_running(pod, ready=True)
                self._bump(pod)
                self._pdbs_dirty = True
        if self._pdbs_dirty:
            self._refresh_pdbs()

    def _refresh_pdbs(self) -> None:
        """Play the disruption controller for every PDB whose status is managed."""
        self._pdbs_dirty = False
        for key, pdb in self._store["poddisruptionbudgets"].items():
            if key in self._frozen_pdbs:
                continue
            old = pdb.get("status") or {}
            computed = self._pdb_status(pdb, old)
            if computed != old:
                pdb["status"] = computed
                self._bump(pdb)

    def _pdb_status(self, pdb: JSON, old: JSON) -> JSON:
        namespace = pdb["metadata"]["namespace"]
        selector = (pdb.get("spec") or {}).get("selector")
        matched = [
            p
            for (pod_namespace, _), p in self._store["pods"].items()
            if pod_namespace == namespace
            and label_selector_matches(selector, p["metadata"].get("labels") or {})
        ]
        # A terminating ReplicaSet pod already has its replacement; counting both would inflate the scale.
        expected = sum(1 for p in matched if p["metadata"]["uid"] not in self._replaced)
        healthy = sum(
            1
            for p in matched
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
            and _pod_ready(p)
        )
        spec = pdb.get("spec") or {}
        if spec.get("maxUnavailable") is not None:
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        elif spec.get("minAvailable") is not None:
            desired = _scaled(spec["minAvailable"], expected)
        else:
            desired = 0
        allowed = max(0, healthy - desired)
        generation = int(pdb["metadata"].get("generation", 1))
        flag = "True" if allowed > 0 else "False"
        previous = next(
            (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None
        )
        condition = {
            "type": "DisruptionAllowed",
            "status": flag,
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": previous.get("lastTransitionTime") or rfc3339(self.now())
            if previous and previous.get("status") == flag
            else rfc3339(self.now()),
        }
        return {
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [condition],
        }

    # ----------------------------------------------------------------------------------- plumbing

    def _prepare_new(self, res: _Resource, obj: JSON, namespace: str | None) -> JSON:
        """Fill what the API server fills on create (no resourceVersion yet: the caller bumps on store)."""
        if res.group == DRA_GROUP:
            obj["apiVersion"] = f"{DRA_GROUP}/v1"
        obj.setdefault("apiVersion", res.api_version("v1"))
        obj["kind"] = obj.get("kind") or res.kind
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta["namespace"] = meta.get("namespace") or namespace or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    f'{res.kind} "" is invalid: metadata.name: Required value: name or generateName is required',
                )
            meta["name"] = self._unique_name(meta["generateName"], meta.get("namespace", ""))
        meta.setdefault("uid", str(uuid.UUID(int=self._rng.getrandbits(128), version=4)))
        meta.setdefault("creationTimestamp", rfc3339(self.now()))
        if res.plural in ("poddisruptionbudgets", "daemonsets"):
            meta.setdefault("generation", 1)
        # Go never omits non-pointer structs, so a real server always shows spec and status objects.
        if res.plural != "events":
            obj.setdefault("spec", {})
        if res.has_status:
            obj["status"] = {**_STATUS_DEFAULTS.get(res.plural, {}), **(obj.get("status") or {})}
        if res.plural == "pods":
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Running" if (obj.get("spec") or {}).get("nodeName") else "Pending")
        return obj

    @staticmethod
    def _key(res: _Resource, obj: JSON) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace", "") if res.namespaced else "", meta["name"])

    def _bump(self, obj: JSON | None = None) -> None:
        self._rv += 1
        if obj is not None:
            obj["metadata"]["resourceVersion"] = str(self._rv)

    def _touched(self, res: _Resource) -> None:
        if res.plural in ("pods", "poddisruptionbudgets"):
            self._pdbs_dirty = True


def _controller_of(pod: JSON) -> JSON | None:
    owners = pod["metadata"].get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), owners[0] if owners else None)


def _pod_ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions")
    ready = next((c for c in conditions or [] if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"  # no Ready condition: hand-written, take as ready


def _scaled(value: int | str, total: int) -> int:
    """An IntOrString against ``total``; percentages round up, as the disruption controller does."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


# ------------------------------------------------------------------------------------------------ HTTP


class _Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 keeps urllib3's and httpx's pooled connections alive, as against a real API server.
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        server = self.server
        assert isinstance(server, _Server)
        response = server.double._handle(self.command, self.path, headers, raw)
        if isinstance(response.body, bytes | str):
            payload = response.body.encode() if isinstance(response.body, str) else response.body
            content_type = "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(response.body).encode(), "application/json"
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if not any(name.lower() == "content-type" for name in response.headers):
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    # http.server dispatches on do_<METHOD>; every verb goes through the same double.
    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output clean; the double's request log is the record."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], double: KubernetesDouble) -> None:
        self.double = double
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Unblock handler threads parked on idle keep-alive connections."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-request are normal in tests; bugs surface as 500s in ``internal_errors``."""


__all__ = [
    "DRA_VERSIONS",
    "ApiError",
    "KubernetesDouble",
    "Placement",
    "RecordedRequest",
    "first_fit",
    "json_patch",
    "label_selector_matches",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
    "rfc3339",
    "status_body",
]
