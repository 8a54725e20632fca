"""The Kubernetes double's object store: one map per resource, a global resourceVersion, the clock."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable

from rightsizer.testing.k8s.api import (
    _NAME_SUFFIX_ALPHABET,
    _STATUS_DEFAULTS,
    DRA_GROUP,
    JSON,
    ApiError,
    Clock,
    Placement,
    RecordedRequest,
    _conflict,
    _Injection,
    _Key,
    _not_found,
    _PageSnapshot,
    _Resource,
    _Target,
    rfc3339,
)


class _Store:
    """The state every layer of the double shares (set by ``KubernetesDouble.__init__``) and its plumbing."""

    _clock: Clock
    _time_scale: float
    _epoch: float
    _offset: float
    _placement: Placement
    _replacement_start: float
    _denied: set[tuple[str, str, str, str]]
    _rules: list[tuple[frozenset[str], frozenset[str], frozenset[str]]] | None
    _enforce_denials: bool
    _server_version: tuple[int, int]
    _user: str
    _rng: random.Random
    _lock: threading.RLock
    _store: dict[str, dict[tuple[str, str], JSON]]
    _rv: int
    _dra_versions: tuple[str, ...]
    _recreated_kinds: set[str]
    _deadlines: dict[str, tuple[float, _Key]]
    _exit_s: float | None
    _replaced: set[str]
    _unplaced: dict[str, tuple[_Key, str | None]]
    _starting: dict[str, tuple[float, _Key]]
    _frozen_pdbs: set[tuple[str, str]]
    _pdbs_dirty: bool
    _pages: dict[str, _PageSnapshot]
    _encoded: dict[tuple[str, ...], _PageSnapshot]
    _tokens: set[str] | None
    _injections: list[_Injection]
    _requests: list[RecordedRequest]
    _hooks: list[Callable[[RecordedRequest], None]]
    _internal_errors: list[str]

    # --------------------------------------------------------------------------------------- time

    def now(self) -> float:
        """The double's clock in epoch seconds."""
        return self._epoch + (self._clock() - self._epoch) * self._time_scale + self._offset

    def _lookup(self, target: _Target) -> tuple[tuple[str, str], JSON]:
        key = (target.namespace or "", target.name or "")
        if target.res.namespaced and target.namespace is None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        found = self._store[target.res.plural].get(key)
        if found is None:
            raise _not_found(target.res, target.name or "")
        return key, found

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

    def _unique_name(self, prefix: str, namespace: str) -> str:
        while True:
            name = prefix + "".join(self._rng.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if (namespace, name) not in self._store["pods"]:
                return name

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
