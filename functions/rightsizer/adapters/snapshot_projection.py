"""Project a snapshot's documents onto the fields the decision reads (issue 14 "Snapshots by projection").

A snapshot is made to be attached to bug reports, so what it keeps is an allowlist, not a blocklist: a
field is written only when a decision reads it, and secrets cannot leak through fields nobody thought of
(container ``command``/``args``, probe headers, lifecycle hooks, ``last-applied-configuration``, …).

* **Fields** come from the models the snapshot is decoded with (``rightsizer.domain.model`` for the
  Kubernetes kinds, ``rightsizer.adapters.snapshot_dir`` for the AWS files): a key survives only when the
  model declares it, recursively. A field the model keeps opaque (``dict[str, Any]``: ``hostPath``,
  ``emptyDir``, ``ephemeral``, ``valueFrom``, ``envFrom`` items) is read for its presence only and is
  written as ``{}``.
* **Map keys** (labels, annotations, AWS tags, container env) are kept only when listed (``domain.read_fields``, the tags below) — every
  entry names the code that reads it, and ``tests/unit/test_snapshot_projection.py`` proves each one is
  read — plus the label keys a selector *in the same snapshot* or the policy's ``node_selector`` compares
  (PodDisruptionBudget selectors → pod labels; pod ``nodeSelector`` and PersistentVolume node affinity →
  node labels).
* DRA objects keep what ``parse_resource_claims`` reads.
* Metrics files (``metrics/*.json``, Prometheus ``query_range`` answers) keep what ``snapshot_dir``
  decodes — ``status``, an error's ``errorType`` (not its text), ``warnings``, ``data.resultType`` and
  per series its ``values`` — and of each
  series' labels only ``domain.observation_signals.series_label_keys`` (the join's, with the
  ``node_label`` recorded in ``snapshot.json``, the device's, the MIG profile, the exporter): the labels an
  exporter adds (pod labels, ``label_*``, driver and model names) never decide, so they are not written.
  The live plan reads the same labels only (``ObservationReducer``), so both decide alike.

Projection never changes a decision: ``plan --snapshot`` on the projected directory decides exactly like
``plan --config`` on the live objects (``tests/integration/test_snapshot_secrets.py``).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Union

from pydantic import BaseModel

from rightsizer.adapters.snapshot_dir import (
    _Asg,
    _Ec2Instance,
    _InstancesFile,
    _NodegroupResources,
    _NodegroupsFile,
)
from rightsizer.domain.dra_fields import claim_fields as _claim
from rightsizer.domain.dra_fields import pick as _pick
from rightsizer.domain.dra_fields import slice_fields as _slice
from rightsizer.domain.health import XID_DOCUMENT, XID_LABEL
from rightsizer.domain.model import (
    TAG_EKS_CLUSTER,
    TAG_ENABLED,
    TAG_RESIZE,
    Container,
    Node,
    ObjectMeta,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodDisruptionBudget,
)
from rightsizer.domain.observation_signals import read_labels, series_label_keys
from rightsizer.domain.read_fields import (
    ENV_NAMES,
    NODE_ANNOTATIONS,
    NODE_LABELS,
    POD_ANNOTATIONS,
    POD_LABELS,
)

__all__ = [
    "ASG_TAGS",
    "ENV_NAMES",
    "INSTANCE_TAGS",
    "NODE_ANNOTATIONS",
    "NODE_LABELS",
    "POD_ANNOTATIONS",
    "POD_LABELS",
    "PagedProjection",
    "project_answer",
    "project_documents",
    "project_object",
]

#: Auto Scaling group tags read: the opt-in pair (``domain.model.opt_in_refusal``) and the node group
#: name of a self-managed group (``snapshot_dir._inventory``).
ASG_TAGS: Final = frozenset({TAG_ENABLED, TAG_EKS_CLUSTER, "eks:nodegroup-name"})
#: EC2 instance tags read: the resize opt-in (``domain.recommend``).
INSTANCE_TAGS: Final = frozenset({TAG_RESIZE})

Rule = Callable[[Any], Any]


def _keys(mapping: Any, keep: Iterable[str]) -> dict[str, Any]:
    if not isinstance(mapping, Mapping):
        return {}
    allowed = set(keep)
    return {k: v for k, v in mapping.items() if k in allowed}


def _tags(tags: Any, keep: frozenset[str]) -> list[Any]:
    return [
        {"Key": t["Key"], "Value": t.get("Value", "")}
        for t in tags or []
        if isinstance(t, Mapping) and t.get("Key") in keep
    ]


def _unwrap(annotation: Any) -> list[Any]:
    """The non-None members of a union annotation, or the annotation itself."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _by_type(value: Any, annotation: Any, rules: Mapping[tuple[type, str], Rule]) -> Any:
    for member in _unwrap(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            if isinstance(value, Mapping):
                return _model(value, member, rules)
            continue
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is list and isinstance(value, list):
            return [_by_type(item, args[0], rules) for item in value]
        if origin is dict and isinstance(value, Mapping):
            if args and args[1] is Any:
                return {}  # opaque: read for its presence only
            return {k: _by_type(v, args[1], rules) for k, v in value.items()}
        if member is Any:
            return {} if isinstance(value, Mapping) else value
    if isinstance(value, Mapping | list):
        return type(value)()  # a shape the model does not expect: the decoder reports it, nothing leaks
    return value


def _model(data: Mapping[str, Any], model: type[BaseModel], rules: Mapping[tuple[type, str], Rule]) -> Any:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in data:
            continue
        rule = rules.get((model, key))
        out[key] = rule(data[key]) if rule is not None else _by_type(data[key], info.annotation, rules)
    return out


def project_object(
    obj: Mapping[str, Any], model: type[BaseModel], rules: Mapping[tuple[type, str], Rule]
) -> Any:
    """``obj`` reduced to the fields ``model`` declares (recursively), with ``rules`` overriding fields.

    Args:
        obj: a JSON object as the API returned it (Kubernetes object, AWS answer).
        model: the pydantic model the snapshot decoder validates it with.
        rules: ``(model class, JSON key)`` → function giving the value to keep for that key.

    Returns:
        A new JSON object; ``obj`` is not changed. ``apiVersion``/``kind`` are kept when present.
    """
    out = _model(obj, model, rules)
    for key in ("apiVersion", "kind"):
        if key in obj:
            out[key] = obj[key]
    return out


def _env(entries: Any) -> list[Any]:
    kept = []
    for entry in entries or []:
        if isinstance(entry, Mapping) and entry.get("name") in ENV_NAMES:
            item: dict[str, Any] = {"name": entry["name"]}
            if "value" in entry:
                item["value"] = entry["value"]
            if entry.get("valueFrom") is not None:
                item["valueFrom"] = {}
            kept.append(item)
    return kept


def _meta(labels: Iterable[str] | None, annotations: Iterable[str]) -> Rule:
    """The ObjectMeta rule: label keys in ``labels`` (None: every label, a draft), annotations by key."""
    keep_labels = None if labels is None else frozenset(labels)
    keep_annotations = frozenset(annotations)

    def rule(meta: Any) -> Any:
        if not isinstance(meta, Mapping):
            return meta
        out = _model(meta, ObjectMeta, {})
        if "labels" in out and keep_labels is not None:
            out["labels"] = _keys(meta.get("labels"), keep_labels)
        elif "labels" in out:
            labels = meta.get("labels")
            out["labels"] = dict(labels) if isinstance(labels, Mapping) else {}
        if "annotations" in out:
            out["annotations"] = _keys(meta.get("annotations"), keep_annotations)
        return out

    return rule


def _items(doc: Any) -> list[Any]:
    items = doc.get("items") if isinstance(doc, Mapping) else None
    return [i for i in items or [] if isinstance(i, Mapping)]


def _selector_keys(selector: Any) -> set[str]:
    if not isinstance(selector, Mapping):
        return set()
    keys = set(selector.get("matchLabels") or {})
    keys |= {e.get("key") for e in selector.get("matchExpressions") or [] if isinstance(e, Mapping)}
    return {k for k in keys if isinstance(k, str)}


def _node_selector_keys(selector: Any) -> set[str]:
    if not isinstance(selector, Mapping):
        return set()
    return {
        e["key"]
        for term in selector.get("nodeSelectorTerms") or []
        if isinstance(term, Mapping)
        for e in term.get("matchExpressions") or []
        if isinstance(e, Mapping) and isinstance(e.get("key"), str)
    }


def _pdb_pod_keys(pdb: Mapping[str, Any]) -> set[str]:
    """Pod label keys a PodDisruptionBudget's selector compares."""
    return _selector_keys((pdb.get("spec") or {}).get("selector"))


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _scheduling_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The required pod (anti-)affinity terms and the topology spread constraints of a pod."""
    spec = _object(pod.get("spec"))
    affinity = _object(spec.get("affinity"))
    terms: list[Mapping[str, Any]] = []
    for kind in ("podAffinity", "podAntiAffinity"):
        part = _object(affinity.get(kind))
        terms += [
            t
            for t in part.get("requiredDuringSchedulingIgnoredDuringExecution") or []
            if isinstance(t, Mapping)
        ]
    spread = spec.get("topologySpreadConstraints") or []
    return terms + [c for c in spread if isinstance(c, Mapping)]


def _pod_node_keys(pod: Mapping[str, Any]) -> set[str]:
    """Node label keys a pod's ``nodeSelector`` (``pending_gpu_pods``, ``domain.placement``), required node
    affinity and the topology keys of its pod (anti-)affinity and spread constraints compare."""
    spec = _object(pod.get("spec"))
    keys = {k for k in _object(spec.get("nodeSelector")) if isinstance(k, str)}
    node_affinity = _object(_object(spec.get("affinity")).get("nodeAffinity"))
    keys |= _node_selector_keys(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    keys |= {t["topologyKey"] for t in _scheduling_terms(pod) if isinstance(t.get("topologyKey"), str)}
    return keys


def _pod_own_keys(pod: Mapping[str, Any]) -> set[str]:
    """Pod label keys the pod's own (anti-)affinity and spread selectors compare (``domain.placement``):
    kept on the pod itself, so pods of one template see each other in a replay. A selector naming
    another template's labels is not followed (pods are written page by page, each once)."""
    keys: set[str] = set()
    for term in _scheduling_terms(pod):
        keys |= _selector_keys(term.get("labelSelector"))
        keys |= {k for k in term.get("matchLabelKeys") or [] if isinstance(k, str)}
    return keys


def _pv_node_keys(pv: Mapping[str, Any]) -> set[str]:
    """Node label keys a PersistentVolume's required node affinity compares (``local_storage``)."""
    affinity = (pv.get("spec") or {}).get("nodeAffinity") or {}
    return _node_selector_keys(affinity.get("required") if isinstance(affinity, Mapping) else None)


def _referenced_labels(
    docs: Mapping[str, Any], policy_node_labels: Iterable[str]
) -> tuple[set[str], set[str]]:
    """(node label keys, pod label keys) that selectors in these documents or the policy compare."""
    pod_keys: set[str] = set()
    for pdb in _items(docs.get("pdbs.json")):
        pod_keys |= _pdb_pod_keys(pdb)
    node_keys = set(policy_node_labels)
    for pod in _items(docs.get("pods.json")):
        node_keys |= _pod_node_keys(pod)
    for pv in _items(docs.get("persistentvolumes.json")):
        node_keys |= _pv_node_keys(pv)
    return node_keys, pod_keys


def _kube_list(doc: Any, model: type[BaseModel], rules: Mapping[tuple[type, str], Rule]) -> Any:
    if not isinstance(doc, Mapping):
        return doc
    out = {k: doc[k] for k in ("apiVersion", "kind") if k in doc}
    out["metadata"] = {"resourceVersion": ""}
    out["items"] = [project_object(item, model, rules) for item in _items(doc)]
    return out


def _dra_list(doc: Any, project: Rule) -> Any:
    if not isinstance(doc, Mapping):
        return doc
    return {
        "apiVersion": doc.get("apiVersion", "v1"),
        "kind": doc.get("kind", "List"),
        "metadata": {"resourceVersion": ""},
        "items": [project(item) for item in _items(doc)],
    }


#: The AWS fields whose model type is opaque or a tag list: what ``snapshot_dir._inventory`` reads of them.
_AWS_RULES: Final[dict[tuple[type, str], Rule]] = {
    (_Asg, "Tags"): lambda tags: _tags(tags, ASG_TAGS),
    (_NodegroupResources, "autoScalingGroups"): lambda groups: _pick(groups, {"name": None}),
    (_Ec2Instance, "Tags"): lambda tags: _tags(tags, INSTANCE_TAGS),
    (_Ec2Instance, "State"): lambda state: _pick(state, {"Name": None}),
    (_Ec2Instance, "Placement"): lambda place: _pick(place, {"AvailabilityZone": None}),
}


def _series(item: Any, keep: frozenset[str]) -> Any:
    if not isinstance(item, Mapping):
        return None  # the decoder finds it malformed either way; its content is not written
    metric = item.get("metric", {})
    out: dict[str, Any] = {"metric": read_labels(metric, keep) if isinstance(metric, Mapping) else None}
    if "values" in item:
        out["values"] = item["values"]
    return out


_ERROR_TYPE: Final = re.compile(r"[A-Za-z0-9_]{1,40}")


def project_answer(answer: Any, keep: frozenset[str]) -> Any:
    """A Prometheus ``query_range`` answer reduced to what ``snapshot_dir`` decodes: ``status``, an error
    answer's ``errorType`` (a short token; the ``error`` text is not kept) and the ``warnings`` (they make
    the metric a problem, and both are logged: BUG-50), ``data.resultType`` and per series its ``values``
    and the labels in ``keep`` (``series_label_keys``). Not a JSON object: ``None``."""
    if not isinstance(answer, Mapping):
        return None
    out = {k: answer[k] for k in ("status", "warnings") if k in answer}
    error_type = answer.get("errorType")
    if isinstance(error_type, str) and _ERROR_TYPE.fullmatch(error_type):
        # The class of a refusal (timeout, execution, http_413), never its text: an error text can echo
        # series labels ("duplicate series for the match group {…}").
        out["errorType"] = error_type
    data = answer.get("data")
    if isinstance(data, Mapping):
        body: dict[str, Any] = {k: data[k] for k in ("resultType",) if k in data}
        result = data.get("result")
        if "result" in data:
            body["result"] = [_series(i, keep) for i in result] if isinstance(result, list) else None
        out["data"] = body
    elif "data" in answer:
        out["data"] = None
    return out


def project_documents(
    docs: Mapping[str, Any], *, policy_node_labels: Iterable[str] = (), policy_pod_labels: Iterable[str] = ()
) -> dict[str, Any]:
    """Every document of a snapshot reduced to what the decision reads (module docstring).

    Args:
        docs: relative path → JSON document, as ``services.snapshot.observe`` returns them.
        policy_node_labels: label keys the policy's ``node_selector`` compares (kept on nodes).
        policy_pod_labels: pod label keys the policy reads (``showback_team_label``; kept on pods).

    Returns:
        A new mapping with the same paths; ``snapshot.json`` is unchanged; ``metrics/*`` keep the series
        labels of ``series_label_keys`` for the ``node_label`` ``snapshot.json`` records.
    """
    node_keys, pod_keys = _referenced_labels(docs, policy_node_labels)
    pod_keys |= set(policy_pod_labels)
    meta = docs.get("snapshot.json")
    node_label = meta.get("node_label") if isinstance(meta, Mapping) else None
    series_keys = series_label_keys(str(node_label) if node_label else None)
    rules = _rules(NODE_LABELS | node_keys, pod_keys)
    out: dict[str, Any] = {}
    for path, doc in docs.items():
        if path == "pods.json" and isinstance(doc, Mapping):
            pods = _kube_list({**doc, "items": []}, Pod, rules)
            pods["items"] = [
                project_object(item, Pod, _rules(NODE_LABELS | node_keys, pod_keys | _pod_own_keys(item)))
                for item in _items(doc)
            ]
            out[path] = pods
        elif path in _MODELS:
            out[path] = _kube_list(doc, _MODELS[path], rules)
        elif path == "resourceclaims.json":
            out[path] = _dra_list(doc, _claim)
        elif path == "resourceslices.json":
            out[path] = _dra_list(doc, _slice)
        else:
            out[path] = _document(path, doc, rules, series_keys)
    return out


#: The Kubernetes list documents and the models their items are decoded with.
_MODELS: Final[dict[str, type[BaseModel]]] = {
    "nodes.json": Node,
    "pods.json": Pod,
    "pdbs.json": PodDisruptionBudget,
    "persistentvolumeclaims.json": PersistentVolumeClaim,
    "persistentvolumes.json": PersistentVolume,
}


def _rules(node_labels: Iterable[str] | None, pod_keys: Iterable[str]) -> dict[tuple[type, str], Rule]:
    """The field rules of a snapshot keeping ``node_labels`` (None: all, a draft) and pod label keys
    ``POD_LABELS`` plus ``pod_keys``."""
    return {
        (Node, "metadata"): _meta(node_labels, NODE_ANNOTATIONS),
        (Pod, "metadata"): _meta(POD_LABELS | frozenset(pod_keys), POD_ANNOTATIONS),
        (PodDisruptionBudget, "metadata"): _meta((), ()),
        (PersistentVolume, "metadata"): _meta((), ()),
        (PersistentVolumeClaim, "metadata"): _meta((), ()),
        # env is kept by name (ENV_NAMES), never by its model: the model would keep every value.
        (Container, "env"): _env,
        **_AWS_RULES,
    }


def _document(
    path: str, doc: Any, rules: Mapping[tuple[type, str], Rule], series_keys: frozenset[str]
) -> Any:
    """A whole document that is not a Kubernetes list: the AWS files and the metrics answers projected,
    the rest (``snapshot.json``) as it is."""
    if path == "nodegroups.json" and isinstance(doc, Mapping):
        return project_object(doc, _NodegroupsFile, rules)
    if path == "instances.json" and isinstance(doc, Mapping):
        return project_object(doc, _InstancesFile, rules)
    if path.startswith("metrics/"):
        return project_answer(doc, series_keys)
    if path == XID_DOCUMENT and isinstance(doc, Mapping):
        return {k: project_answer(v, series_keys | {XID_LABEL}) for k, v in doc.items()}
    return doc


class PagedProjection:
    """:func:`project_documents`, one object at a time: for a snapshot written while the cluster is read
    page by page (``rightsizer snapshot``, issue 11 item 7), so no list is ever whole in memory.

    Which label keys survive depends on other objects of the same snapshot (module docstring). So the
    caller projects PodDisruptionBudgets before any pod (their selectors name the pod labels kept), and
    nodes in two stages: :meth:`node_draft` keeps every label while the rest is read, :meth:`node_final`
    keeps the node label keys that pods, PersistentVolumes and the policy compare, once all of them were
    projected. The result equals :func:`project_documents` of the same objects.

    Raises:
        RuntimeError: a budget after a pod, or a pod or PersistentVolume after a final node — a label the
            decision compares could be lost.
    """

    def __init__(
        self,
        policy_node_labels: Iterable[str] = (),
        node_label: str | None = None,
        policy_pod_labels: Iterable[str] = (),
    ) -> None:
        self._series_keys = series_label_keys(node_label)
        self._node_keys = set(policy_node_labels)
        self._pod_keys: set[str] = set(policy_pod_labels)
        self._pods_started = False
        self._final: dict[tuple[type, str], Rule] | None = None
        self._draft = _rules(None, ())

    def item(self, path: str, obj: Mapping[str, Any]) -> Any:
        """One item of the list document ``path`` (not ``nodes.json``: see :meth:`node_draft`), projected."""
        if path == "pdbs.json":
            if self._pods_started:
                raise RuntimeError("PodDisruptionBudgets must be projected before pods")
            self._pod_keys |= _pdb_pod_keys(obj)
        elif path in ("pods.json", "persistentvolumes.json"):
            if self._final is not None:
                raise RuntimeError(f"{path} projected after the nodes were finished")
            self._pods_started = self._pods_started or path == "pods.json"
            self._node_keys |= _pod_node_keys(obj) if path == "pods.json" else _pv_node_keys(obj)
        if path == "resourceclaims.json":
            return _claim(obj)
        if path == "resourceslices.json":
            return _slice(obj)
        if path == "workloads.json":
            return obj  # projected by its reader (services.workload_reads.project)
        if path not in _MODELS or path == "nodes.json":
            raise ValueError(f"not a list document of items: {path}")
        own = _pod_own_keys(obj) if path == "pods.json" else set()
        return project_object(obj, _MODELS[path], _rules((), self._pod_keys | own))

    def node_draft(self, obj: Mapping[str, Any]) -> Any:
        """A Node reduced to its model's fields, every label kept (smaller than the raw object; finished by
        :meth:`node_final`)."""
        return project_object(obj, Node, self._draft)

    def node_final(self, draft: Mapping[str, Any]) -> Any:
        """A drafted Node with only the label keys the decision reads or this snapshot's selectors compare."""
        if self._final is None:
            self._final = _rules(NODE_LABELS | self._node_keys, self._pod_keys)
        return project_object(draft, Node, self._final)

    def document(self, path: str, doc: Any) -> Any:
        """A whole document (``snapshot.json``, ``nodegroups.json``, ``instances.json``, a metrics answer
        with the series labels of ``series_label_keys`` for ``node_label``), projected."""
        return _document(path, doc, self._draft, self._series_keys)
