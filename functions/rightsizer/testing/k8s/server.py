"""The double's HTTP side: routing, discovery, authorization and the verb handlers, over a threaded server."""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import http.server
import json
import socket
import threading
import traceback
import uuid
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from rightsizer.testing.k8s.api import (
    _RESOURCES,
    _STALE,
    DRA_GROUP,
    JSON,
    SCALE_RESOURCES,
    WORKLOAD_GROUPS,
    ApiError,
    RecordedRequest,
    _conflict,
    _PageSnapshot,
    _qualified,
    _Response,
    _Target,
    status_body,
)
from rightsizer.testing.k8s.controllers import _Controllers, _dra_to
from rightsizer.testing.k8s.patch import merge_patch
from rightsizer.testing.k8s.selectors import _field_value, parse_field_selector, parse_label_selector


class _Serving(_Controllers):
    """Requests in, ``_Response`` out: authentication, injected faults, routing, verbs."""

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
        if (
            target.subresource == "scale"
            and target.res.plural in SCALE_RESOURCES
            and verb in ("get", "patch")
        ):
            return self._scale(target, request, verb)
        if target.subresource is not None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        if verb not in target.res.verbs:
            raise ApiError(
                405, f"{verb} is not supported on {_qualified(target.res)} by the Kubernetes double"
            )
        handler: Callable[[_Target, RecordedRequest], _Response] = getattr(self, f"_serve_{verb}")
        return handler(target, request)

    def _scale(self, target: _Target, request: RecordedRequest, verb: str) -> _Response:
        """The ``scale`` subresource: an autoscaling/v1 Scale read from and written to ``spec.replicas``
        (JSON merge patch only, as :meth:`_serve_patch`)."""
        key, current = self._lookup(target)
        if verb == "patch":
            content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "application/merge-patch+json":
                raise ApiError(
                    415, f"the double accepts application/merge-patch+json only, not {content_type}"
                )
            replicas = ((request.body or {}).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "spec.replicas must be an integer >= 0")
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["replicas"] = replicas
            self._commit(target, key, current, new)
            current = self._store[target.res.plural][key]
        meta = current["metadata"]
        body = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "spec": {"replicas": (current.get("spec") or {}).get("replicas", 1)},
            "status": {"replicas": (current.get("status") or {}).get("replicas", 0)},
        }
        return _Response(200, body)

    def _served_groups(self) -> dict[str, tuple[str, ...]]:
        groups: dict[str, tuple[str, ...]] = {
            "apps": ("v1",),
            "batch": ("v1",),
            "policy": ("v1",),
            "authorization.k8s.io": ("v1",),
        }
        if self._dra_versions:
            groups[DRA_GROUP] = self._dra_versions
        return {**groups, **WORKLOAD_GROUPS}

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
        if any(all(d in ("*", w) for d, w in zip(rule, wanted, strict=True)) for rule in self._denied):
            return True
        if self._rules is None or (group, resource) == ("authorization.k8s.io", "selfsubjectaccessreviews"):
            return False  # every authenticated user may review itself (system:basic-user)
        name = f"{resource}/{subresource}" if subresource else resource
        return not any(
            (group in groups or "*" in groups) and (name in resources or "*" in resources)
            and (verb in verbs or "*" in verbs)
            for groups, resources, verbs in self._rules
        )  # fmt: skip

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

    def _present(self, target: _Target, obj: JSON) -> JSON:
        return _dra_to(obj, target.version) if target.res.group == DRA_GROUP else copy.deepcopy(obj)

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
        else:
            self._pages.pop(snapshot_id, None)  # no token names it any more: a finished list holds nothing
        if end < len(snapshot.items):
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps({"id": snapshot_id, "offset": end, "rv": snapshot.resource_version}).encode()
            ).decode()
            if snapshot.counted:
                metadata["remainingItemCount"] = len(snapshot.items) - end
        res = target.res
        head = json.dumps(
            {"kind": f"{res.kind}List", "apiVersion": res.api_version(target.version), "metadata": metadata}
        )
        # The items' own JSON, joined as json.dumps would write the list: byte for byte the same answer
        # as decoding and re-encoding them, without doing either (150,000 pods a list, issue 33).
        body = b"".join((head[:-1].encode(), b', "items": [', b", ".join(snapshot.items[offset:end]), b"]}"))
        return _Response(200, body, {"Content-Type": "application/json"})

    @staticmethod
    def _decode_continue(token: str) -> tuple[str, int]:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(decoded["id"]), int(decoded["offset"])
        except (ValueError, KeyError, TypeError) as error:
            raise ApiError(400, f"continue key is not valid: {error}") from error

    def _snapshot(self, target: _Target, request: RecordedRequest) -> _PageSnapshot:
        labels, fields = request.param("labelSelector") or "", request.param("fieldSelector") or ""
        encoded = self._encoded.get(_list_key(target, labels, fields))
        if encoded is not None and encoded.resource_version == str(self._rv):
            return encoded
        if encoded is not None:  # the store changed since: every encoded list is stale
            self._encoded.clear()
        return self._encode_list(target, labels, fields)

    def _encode_list(self, target: _Target, label_selector: str, field_selector: str) -> _PageSnapshot:
        """Every object ``target``'s list selects, each serialized as it is now."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, target.res)
        items = []
        for (namespace, _), obj in sorted(self._store[target.res.plural].items()):
            if target.namespace is not None and namespace != target.namespace:
                continue
            object_labels = obj["metadata"].get("labels") or {}
            if not all(r.matches(object_labels) for r in labels):
                continue
            if all((_field_value(obj, f) == value) == equal for f, equal, value in fields):
                # Serialized: an immutable copy at ~1/5 of a deep copy's memory (150,000 pods, issue 11).
                shown = _dra_to(obj, target.version) if target.res.group == DRA_GROUP else obj
                items.append(json.dumps({k: v for k, v in shown.items() if k not in _LIST_OMITS}).encode())
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
        # The product sends JSON merge patches only (adapters/kubernetes.py); a JSON patch or a strategic
        # merge patch is answered as a server that does not speak them would, so a change that starts
        # sending one fails in tests instead of being half-emulated.
        if content_type != "application/merge-patch+json":
            raise ApiError(
                415,
                f"the body of the request was in an unknown format ({content_type or 'none'}) - the double "
                "accepts application/merge-patch+json only",
            )
        patched = merge_patch(current, request.body)
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


# ------------------------------------------------------------------------------------------------ HTTP


def _list_key(target: _Target, label_selector: str, field_selector: str) -> tuple[str, ...]:
    """What makes two list requests answer the same items at one resourceVersion."""
    return (target.res.plural, target.namespace or "", target.version, label_selector, field_selector)


#: As on the real server, list items carry no ``kind``/``apiVersion``.
_LIST_OMITS: Final = frozenset({"kind", "apiVersion"})


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

    def __init__(self, address: tuple[str, int], double: _Serving) -> None:
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
