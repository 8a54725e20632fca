"""What the double's controllers do: eviction against PodDisruptionBudgets, graceful pod deletion, workload
controllers recreating pods, scheduling, the disruption controller's PDB status, DRA version shapes."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from rightsizer.testing.k8s.api import (
    _RESOURCES,
    DEFAULT_GRACE_SECONDS,
    DRA_GROUP,
    JSON,
    ApiError,
    _Response,
    _Target,
    controller_object,
    rfc3339,
)
from rightsizer.testing.k8s.selectors import label_selector_matches
from rightsizer.testing.k8s.store import _Store

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


class _Controllers(_Store):
    """Eviction, pod lifecycle and the controllers that react to it (called with the lock held)."""

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
        # deletionTimestamp is the deadline; containers that exit on SIGTERM let the kubelet go sooner.
        stop = grace if self._exit_s is None else min(float(grace), self._exit_s)
        self._deadlines[pod["metadata"]["uid"]] = (now + stop, key)
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
        known = controller_object(old)
        if (
            known is not None
            and (old["metadata"].get("namespace") or "default", owner.get("name"))
            not in (self._store[known[0]])
        ):
            return  # its controller object is gone (orphaned pod): nothing recreates it
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

    def _kubelet_confirms(self, pod: JSON) -> bool:
        """Whether a pod past its grace period can go: no finalizers left and its node's kubelet is there to
        confirm the containers stopped (Ready condition not False/Unknown). Otherwise it stays terminating."""
        if pod["metadata"].get("finalizers"):
            return False
        node = self._store["nodes"].get(("", (pod.get("spec") or {}).get("nodeName") or ""))
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")

    def _reap_locked(self) -> None:
        now = self.now()
        for uid, (deadline, key) in sorted(self._deadlines.items(), key=lambda item: item[1][0]):
            pod = self._store["pods"].get(key)
            if deadline > now:
                break
            if pod is not None and pod["metadata"]["uid"] == uid:
                if not self._kubelet_confirms(pod):
                    continue  # stuck terminating: it stays until its node is deleted (pod GC)
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
