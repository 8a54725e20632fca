"""The live plan's Nodes and Pods, compact (issue 11 item 7: the assessment's memory at 10,000 GPU nodes and
~150,000 pods).

The models (``domain.model``) already declare only the fields a decision reads, but three things made a
validated object far larger than what it says: open maps kept whole (every label, annotation and env entry
the API server and the admission chain add), equal parts validated again for every pod (the containers,
tolerations, labels, owner and conditions of one template), and pydantic's own bookkeeping per instance
(a ``set`` of the fields given, ~0.2-0.7 KB, on each of the four models of a pod). :class:`CompactObjects`
projects each raw object before it is validated and shares what repeats after:

* **Read keys only** (``domain.read_fields``, the snapshot writer's allowlist): annotations and container
  env are cut to the keys a rule reads; a pod keeps only the volumes a rule looks at (``emptyDir``,
  ``hostPath``, a claim, a generic ephemeral volume: ``domain.pods``, ``domain.volumes``), not the
  projected service-account token every pod carries under its own name; nothing reads a pod's ``uid``,
  ``resourceVersion`` or ``creationTimestamp`` on the plan's path (the drain re-reads its node's pods whole,
  ``services.node_view``), nor a node's ``uid``, ``resourceVersion`` or addresses other than ``InternalIP``. Labels stay whole: selectors of the
  same observation (PodDisruptionBudgets, pods' ``nodeSelector``, volume affinity, the policy's
  ``node_selector``) compare keys no list names.
* **Equal parts once**: each part in ``SHARED`` (containers, tolerations, labels, owners, conditions,
  capacities, taints, empty lists) is swapped for the first equal one seen, names repeated by thousands of
  objects (namespaces, node names, phases, label keys and values) are interned, and models are rebuilt
  with one shared set of given fields per distinct set (``model_construct(_fields_set=…)``).

Every object is validated from the projected JSON exactly as before (a malformed item fails the same
way), and the models are frozen and never mutated, so sharing is invisible: a plan from these objects
equals the plan from whole ones (``tests/integration/test_paged_lists.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from rightsizer.domain.model import Node, Pod
from rightsizer.domain.read_fields import ENV_NAMES, NODE_ANNOTATIONS, POD_ANNOTATIONS

JSON = dict[str, Any]
M = TypeVar("M", bound=BaseModel)

#: Volume sources a rule reads (``domain.pods._emptydir``, ``domain.volumes.volume_local_data``); a
#: volume with none of them (projected token, ConfigMap, Secret, downward API) decides nothing.
READ_VOLUME_SOURCES = ("emptyDir", "hostPath", "persistentVolumeClaim", "ephemeral")
#: Metadata no rule on the plan's path reads (the drain and resize re-read their node's pods whole).
_POD_META_UNREAD = ("uid", "resourceVersion", "creationTimestamp")
_NODE_META_UNREAD = ("uid", "resourceVersion")

#: (model, field) whose values are shared between objects when equal.
SHARED: dict[str, tuple[str, ...]] = {
    "ObjectMeta": ("labels", "annotations", "ownerReferences"),
    "PodSpec": (
        "containers",
        "initContainers",
        "volumes",
        "tolerations",
        "nodeSelector",
        "resourceClaims",
    ),
    "PodStatus": ("conditions", "resourceClaimStatuses"),
    "NodeSpec": ("taints",),
    "NodeStatus": ("capacity", "allocatable", "conditions"),
}


class CompactObjects:
    """Nodes and Pods validated from their read fields, with equal parts stored once; one per observation.

    The tables grow with the distinct parts (about one entry per pod template, instance type and node),
    not with the objects.
    """

    def __init__(self) -> None:
        self._parts: dict[tuple[str, str, int], list[Any]] = {}
        self._fields_sets: dict[frozenset[str], set[str]] = {}

    def node(self, item: JSON) -> Node:
        """The ``Node`` of a ``kubectl get -o json`` item: every label, the annotations a rule reads
        (``NODE_ANNOTATIONS``), equal parts shared.

        Raises:
            pydantic.ValidationError: the item is not a Node (as ``Node.model_validate`` raises).
        """
        lean = _with(_with(item, "metadata", _node_meta), "status", _node_status)
        node = Node.model_validate(lean)
        return self._rebuilt(node, {"metadata": self._shared(node.metadata)} | self._sections(node))

    def pod(self, item: JSON) -> Pod:
        """The ``Pod`` of a ``kubectl get -o json`` item: the annotations, env entries and volumes a rule
        reads, every label, equal parts shared.

        Raises:
            pydantic.ValidationError: the item is not a Pod (as ``Pod.model_validate`` raises).
        """
        lean = _with(_with(_with(item, "metadata", _pod_meta), "spec", _pod_spec), "status", _pod_status)
        pod = Pod.model_validate(lean)
        return self._rebuilt(pod, {"metadata": self._shared(pod.metadata)} | self._sections(pod))

    def _sections(self, obj: Node | Pod) -> dict[str, Any]:
        return {"spec": self._shared(obj.spec), "status": self._shared(obj.status)}

    def _shared(self, model: M) -> M:
        """``model`` with each ``SHARED`` part replaced by the equal one seen first."""
        kind = type(model).__name__
        values = {name: getattr(model, name) for name in type(model).model_fields}
        for name in SHARED.get(kind, ()):
            values[name] = self._part(kind, name, values[name])
        return self._rebuilt(model, values)

    def _part(self, kind: str, name: str, value: Any) -> Any:
        """The first part seen equal to ``value``. Parts are found by a hash of their text, not the text:
        most parts are one template's and few, but a node's labels are its own, and their text kept
        as a key would cost more than the labels."""
        bucket = self._parts.setdefault((kind, name, hash(_key(value))), [])
        for seen in bucket:
            if seen == value:
                return seen
        bucket.append(value)
        return value

    def _rebuilt(self, model: M, values: dict[str, Any]) -> M:
        # The given-fields set is pydantic's per instance (model_fields_set): one shared set per distinct
        # set. Models are frozen, and pydantic copies the set before changing it (model_copy).
        given = model.model_fields_set
        shared = self._fields_sets.setdefault(frozenset(given), set(given))
        return type(model).model_construct(_fields_set=shared, **values)


def _with(item: JSON, section: str, project: Any) -> JSON:
    """``item`` with ``item[section]`` projected (unchanged when it is not an object: the model reports it)."""
    value = item.get(section)
    if not isinstance(value, Mapping):
        return item
    return {**item, section: project(value)}


def _intern(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _interned_map(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {_intern(k): _intern(v) for k, v in value.items()}


def _kept(value: Any, keys: frozenset[str]) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {_intern(k): v for k, v in value.items() if k in keys}


def _meta(
    meta: Mapping[str, Any], unread: tuple[str, ...], interned: str, annotations: frozenset[str]
) -> JSON:
    """``metadata`` without the ``unread`` keys, the ``interned`` name (a node's name, a pod's namespace)
    and every label interned, the annotations cut to those a rule reads."""
    out = {k: v for k, v in meta.items() if k not in unread}
    if interned in meta:
        out[interned] = _intern(meta[interned])
    if "labels" in meta:
        out["labels"] = _interned_map(meta["labels"])
    if "annotations" in meta:
        out["annotations"] = _kept(meta["annotations"], annotations)
    return out


def _node_meta(meta: Mapping[str, Any]) -> JSON:
    return _meta(meta, _NODE_META_UNREAD, "name", NODE_ANNOTATIONS)


def _pod_meta(meta: Mapping[str, Any]) -> JSON:
    return _meta(meta, _POD_META_UNREAD, "namespace", POD_ANNOTATIONS)


def _node_status(status: Mapping[str, Any]) -> JSON:
    out = dict(status)
    addresses = status.get("addresses")
    if isinstance(addresses, list):
        # The plan's series join reads only Node.internal_ips; a node's DNS names are not kept (the one-node
        # read, which matches every address, reads its node whole: services.node_view).
        out["addresses"] = [
            a for a in addresses if not isinstance(a, Mapping) or a.get("type") == "InternalIP"
        ]
    return out


def _pod_status(status: Mapping[str, Any]) -> JSON:
    return {**status, "phase": _intern(status["phase"])} if "phase" in status else dict(status)


def _pod_spec(spec: Mapping[str, Any]) -> JSON:
    out = dict(spec)
    if "nodeName" in spec:
        out["nodeName"] = _intern(spec["nodeName"])
    volumes = spec.get("volumes")
    if isinstance(volumes, list):
        out["volumes"] = [
            v for v in volumes if not isinstance(v, Mapping) or any(s in v for s in READ_VOLUME_SOURCES)
        ]
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if isinstance(containers, list):
            out[key] = [_container(c) for c in containers]
    return out


def _container(container: Any) -> Any:
    if not isinstance(container, Mapping) or not isinstance(container.get("env"), list):
        return container
    env = [e for e in container["env"] if not isinstance(e, Mapping) or e.get("name") in ENV_NAMES]
    return {**container, "env": env}


def _key(value: Any) -> str:
    """A text equal for equal values: models by their JSON, dicts by their sorted items."""
    if isinstance(value, dict):
        return repr(sorted(value.items()))
    return "[" + ",".join(item.model_dump_json() for item in value) + "]"
