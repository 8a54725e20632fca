"""Nodes and Pods decoded straight from a list page's bytes into the plan's models (issue 33 item 2).

The assessment reads every Node and every Pod of the cluster: at 10,000 GPU nodes, 150,000 pods of ~5.7 KB
of JSON each. Parsing each page into Python dicts (``json.loads``) and validating every pod with pydantic
(``domain.pod_parts.CompactObjects``) cost ~55 of the assessment's 76 client CPU-seconds there
(docs/performance.md). Here msgspec (a maintained C decoder, already the Prometheus answers' decoder)
decodes a page into structs that declare only the fields the models declare: every other field of the
API server's JSON (``managedFields``, container statuses, probes, images, …) is skipped in C, never made
a Python object. The structs are generated from ``domain.model`` itself, so a field added to a model is
read without a second schema to keep in step; a struct field is required exactly when the model's is, and
msgspec checks each value's type (a malformed object fails its page with the path of the bad field).

What the structs give is then made the same compact ``Node`` and ``Pod`` objects ``CompactObjects`` makes
from dicts (``tests/integration/test_kubernetes_models.py`` proves them equal, object for object):

* **Read keys only** (``domain.read_fields``): annotations and container env cut to the keys a rule reads,
  a pod's volumes to those with a source a rule reads (``pod_parts.READ_VOLUME_SOURCES``), a node's
  addresses to ``InternalIP``; a pod's ``uid``, ``resourceVersion`` and ``creationTimestamp`` and a node's
  ``uid`` and ``resourceVersion`` are not decoded at all (nothing on the plan's path reads them).
* **Equal parts once**: each part of ``pod_parts.SHARED`` (containers, tolerations, labels, owners,
  conditions, capacities, taints, …) is made a model once per distinct value — the value's own compact
  JSON is its key — and every later equal part is that object; names repeated by thousands of objects
  are interned. Models are built with ``model_construct`` (msgspec already checked every type; the models
  have no validators) and one shared set of given fields per distinct set, as ``CompactObjects`` does.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Final, Generic, TypeVar, Union

import msgspec
from pydantic import AwareDatetime, BaseModel

from rightsizer.domain.model import (
    Container,
    Node,
    NodeSpec,
    NodeStatus,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
)
from rightsizer.domain.pod_parts import READ_VOLUME_SOURCES, SHARED
from rightsizer.domain.read_fields import ENV_NAMES, NODE_ANNOTATIONS, POD_ANNOTATIONS

__all__ = ["ModelPages", "Page", "object_struct"]

M = TypeVar("M", Node, Pod)
T = TypeVar("T")
_UNSET: Final = msgspec.UNSET

#: Fields of a model never decoded, per (kind, model): nothing on the plan's path reads them.
_UNREAD: Final[dict[tuple[type[BaseModel], type[BaseModel]], frozenset[str]]] = {
    (Pod, ObjectMeta): frozenset({"uid", "resourceVersion", "creationTimestamp"}),
    (Node, ObjectMeta): frozenset({"uid", "resourceVersion"}),
}


# ------------------------------------------------------------------------------------------ the structs


class _ListMeta(msgspec.Struct, gc=False):
    continue_: str = msgspec.field(default="", name="continue")


class Page(msgspec.Struct, Generic[T], gc=False):
    """One page of a list answer: its items (None when the server sends ``null``) and continue token."""

    items: list[T] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


@functools.cache
def _hints(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s field annotations, resolved (a field's ``FieldInfo.annotation`` can still be a forward
    reference to a model defined further down ``domain.model``)."""
    return typing.get_type_hints(model)


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _struct_type(annotation: Any, structs: dict[type[BaseModel], Any]) -> Any:
    """The msgspec type decoding what ``annotation`` validates (models → generated structs)."""
    members = _members(annotation)
    if len(members) > 1:
        return Union[tuple(_struct_type(m, structs) for m in members)]  # noqa: UP007 (built at runtime)
    (member,) = members
    if member is AwareDatetime:
        return Annotated[datetime, msgspec.Meta(tz=True)]
    if isinstance(member, type) and issubclass(member, BaseModel):
        return _struct_of(member, frozenset(), structs)
    origin, args = typing.get_origin(member), typing.get_args(member)
    if origin is list:
        return list[_struct_type(args[0], structs)]  # type: ignore[misc]
    if origin is dict:
        return dict[args[0], _struct_type(args[1], structs)]  # type: ignore[misc,valid-type]
    if member in (str, int, float, bool, type(None)) or member is Any:
        return member
    raise TypeError(f"no msgspec type for {member!r}: teach kubernetes_models._struct_type")


def _struct_of(model: type[BaseModel], unread: frozenset[str], structs: dict[type[BaseModel], Any]) -> Any:
    """A msgspec struct with ``model``'s fields but ``unread``: required where the model's is, otherwise
    ``UNSET`` when absent (so the model's own default and given-fields set apply)."""
    if not unread and model in structs:
        return structs[model]
    fields: list[tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        if name in unread:
            continue
        kind = _struct_type(_hints(model)[name], structs)
        if info.is_required():
            fields.append((name, kind, msgspec.NODEFAULT))
        else:
            fields.append((name, Union[kind, msgspec.UnsetType], _UNSET))  # noqa: UP007
    struct = msgspec.defstruct(f"_{model.__name__}", fields, kw_only=True, gc=False)
    if not unread:
        structs[model] = struct
    return struct


@functools.cache
def _kind_struct(kind: type[BaseModel]) -> Any:
    structs: dict[type[BaseModel], Any] = {}
    meta = _struct_of(ObjectMeta, _UNREAD[(kind, ObjectMeta)], structs)
    fields: list[tuple[str, Any, Any]] = []
    for name, info in kind.model_fields.items():
        value = meta if name == "metadata" else _struct_type(_hints(kind)[name], structs)
        if info.is_required():
            fields.append((name, value, msgspec.NODEFAULT))
        else:
            fields.append((name, Union[value, msgspec.UnsetType], _UNSET))  # noqa: UP007
    return msgspec.defstruct(f"_{kind.__name__}", fields, kw_only=True, gc=False)


@functools.cache
def _decoder(kind: type[BaseModel]) -> Any:
    """The page decoder of ``kind``, made on first use (generating the structs is not free: it is not
    paid by a cold start that never lists)."""
    return msgspec.json.Decoder(Page[_kind_struct(kind)])  # type: ignore[misc]


def object_struct(kind: type[BaseModel]) -> Any:
    """The msgspec struct one ``kind`` (``Node`` or ``Pod``) object decodes into, for a document that
    embeds objects in its own shape (a shard's partial, ``adapters.shard_codec``); made on first use and
    shared with the list pages' decoder. :meth:`ModelPages.models` makes the compact models of them."""
    return _kind_struct(kind)


# ------------------------------------------------------------------------------------- struct → model


def _intern(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _interned_map(value: Mapping[str, str]) -> dict[str, str]:
    intern = sys.intern
    return {intern(k): intern(v) for k, v in value.items()}


def _read_keys(keys: frozenset[str]) -> Callable[[Any], Any]:
    return lambda value: {sys.intern(k): v for k, v in value.items() if k in keys}


_SOURCES: Final = operator.attrgetter(*READ_VOLUME_SOURCES)
_NO_SOURCE: Final = (_UNSET,) * len(READ_VOLUME_SOURCES)


def _read_volume(volume: Any) -> bool:
    """Whether a decoded volume has a source a rule reads (``UNSET`` equals only itself)."""
    return bool(_SOURCES(volume) != _NO_SOURCE)


#: Per (kind, model, field): what of a decoded value the plan reads (the rest is dropped before the model
#: is made), as ``CompactObjects`` projects a dict.
_FILTERS: Final[dict[tuple[type[BaseModel], type[BaseModel], str], Callable[[Any], Any]]] = {
    (Pod, ObjectMeta, "annotations"): _read_keys(POD_ANNOTATIONS),
    (Node, ObjectMeta, "annotations"): _read_keys(NODE_ANNOTATIONS),
    (Node, ObjectMeta, "labels"): _interned_map,
    (Pod, ObjectMeta, "namespace"): _intern,
    (Node, ObjectMeta, "name"): _intern,
    (Pod, PodSpec, "nodeName"): _intern,
    (Pod, PodSpec, "volumes"): lambda volumes: [v for v in volumes if _read_volume(v)],
    (Pod, Container, "env"): lambda env: [e for e in env if e.name in ENV_NAMES],
    (Node, NodeStatus, "addresses"): lambda addresses: [a for a in addresses if a.type == "InternalIP"],
}
_INTERNED_FIELDS: Final = frozenset({("PodStatus", "phase")})
#: Parts ``SHARED`` names that are one object's own here: a node's labels (its hostname, its zone…) are
#: nearly always its own, and keeping their text as a key would cost more than they do.
_OWN: Final = frozenset({(Node, ObjectMeta, "labels")})
#: Per (kind, model): the fields each object has of its own; the others it shares with the objects of
#: its template (a Deployment's pods, an instance type's nodes), made once per distinct template.
_OWN_FIELDS: Final[dict[tuple[type[BaseModel], type[BaseModel]], frozenset[str]]] = {
    (Pod, ObjectMeta): frozenset({"name", "deletionTimestamp"}),
    (Pod, PodSpec): frozenset({"nodeName"}),
    (Pod, PodStatus): frozenset({"podIP", "startTime"}),
    (Node, NodeSpec): frozenset({"providerID"}),
    (Node, NodeStatus): frozenset({"addresses"}),
}


_Step = tuple[str, int, Callable[[Any], Any] | None, Callable[[Any], Any] | None, dict[bytes, Any]]
_OwnStep = tuple[int, str, Callable[[Any], Any] | None, Callable[[Any], Any] | None]
_Template = tuple[
    dict[str, Any],
    list[tuple[str, Callable[[Any], Any]]],
    list[_OwnStep],
    dict[bytes, tuple[dict[str, Any], int]],
]
_PLAIN, _KEEP, _CONVERT, _SHARED = 0, 1, 2, 3


def _constructed(model: type[BaseModel], values: dict[str, Any], fields_set: set[str]) -> Any:
    """``model.model_construct(_fields_set=fields_set, **values)`` for ``values`` holding every field,
    without its per-field loop (a third of this module's CPU at 150,000 pods): the same four attributes
    set the same way (pydantic 2 ``BaseModel.model_construct``; ``tests/integration/test_kubernetes_models.py``
    compares the two). The models are frozen, ``extra="ignore"``, with no private attributes or
    ``model_post_init``."""
    obj = model.__new__(model)
    _set = object.__setattr__
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _lean_constructed(model: type[BaseModel], values: dict[str, Any], fields_set: set[str]) -> Any:
    """:func:`_constructed` with each field set as an attribute, so the instance's ``__dict__`` is a
    key-sharing dict (PEP 412: the model class keeps the keys once, each object its values only): ~25 %
    less memory per pod, ~13 % more CPU to make it (one partial of 15,000 pods, CPython 3.11). The same
    four attributes, equal values."""
    obj = model.__new__(model)
    _set = object.__setattr__
    for name, value in values.items():
        _set(obj, name, value)
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


class _Models:
    """Turns decoded structs of one kind into compact models; its tables live as long as one read."""

    def __init__(self, kind: type[BaseModel], *, lean: bool = False) -> None:
        self._kind = kind
        self._construct = _lean_constructed if lean else _constructed
        self._sets: dict[tuple[type[BaseModel], int], set[str]] = {}
        self._plans: dict[type[BaseModel], list[_Step]] = {}
        self._defaults: dict[type[BaseModel], dict[str, Any]] = {}
        self._encode = msgspec.json.Encoder().encode
        self._astuple = msgspec.structs.astuple
        self._own: dict[type[BaseModel], _Template] = {}

    def model(self, model: type[BaseModel], struct: Any) -> Any:
        """The ``model`` of a decoded struct."""
        plan = self._plans.get(model) or self._plan(model)
        own = self._own.get(model)
        if own is None:
            values, given = self._values(model, plan, struct)
        else:
            # One object's own fields on a copy of the template its other fields share with its kin
            # (a pod's spec but its node, its status but its IP and start): one lookup where every
            # field would be read, filtered and looked up again.
            replaced, kept, steps, templates = own
            # What the plan does not read is out of the key too (a pod's own token volume, its CNI's
            # annotations): the filters are idempotent, so the template's values are the same.
            for name, keep in kept:
                value = getattr(struct, name)
                replaced[name] = value if value is _UNSET else keep(value)
            shape = msgspec.structs.replace(struct, **replaced)
            key = self._encode(shape)
            template = templates.get(key)
            if template is None:
                template = templates[key] = self._values(model, plan, shape)
            values, given = template[0].copy(), template[1]
            for index, name, own_keep, own_convert in steps:
                value = getattr(struct, name)
                if value is _UNSET:
                    continue
                given |= 2 << index
                if own_keep is not None:
                    value = own_keep(value)
                if own_convert is not None and value is not None:
                    value = own_convert(value)
                values[name] = value
        fields_set = self._sets.get((model, given))
        if fields_set is None:
            names = [step[0] for i, step in enumerate(plan) if given & (2 << i)]
            fields_set = self._sets[(model, given)] = set(names)
        return self._construct(model, values, fields_set)

    def _values(self, model: type[BaseModel], plan: list[_Step], struct: Any) -> tuple[dict[str, Any], int]:
        """(every field's value, the bits of the fields the struct gives: ``2 << index`` in ``plan``)."""
        values = self._defaults[model].copy()
        given = 0
        bit = 1
        for (name, mode, keep, convert, parts), value in zip(plan, self._astuple(struct), strict=True):
            bit <<= 1
            if value is _UNSET:
                continue
            given |= bit
            if keep is not None:
                value = keep(value)
            if mode == _SHARED:
                key = self._encode(value)
                part = parts.get(key)
                if part is None:
                    part = parts[key] = value if convert is None or value is None else convert(value)
                value = part
            elif mode == _CONVERT and value is not None:
                value = convert(value)  # type: ignore[misc]
            values[name] = value
        return values, given

    def clear(self) -> None:
        """Forget every table (the converters refer back to this object: without this, only the cyclic
        garbage collector would free the tables of a finished read)."""
        self._plans.clear()
        self._own.clear()
        self._sets.clear()

    def _plan(self, model: type[BaseModel]) -> list[_Step]:
        """One step per decoded field of ``model``, in the struct's order: how its value is kept, made
        a model, shared."""
        plan: list[_Step] = []
        defaults: dict[str, Any] = {}
        unread = _UNREAD.get((self._kind, model), frozenset())
        for name, info in model.model_fields.items():
            if not info.is_required():
                defaults[name] = info.get_default(call_default_factory=True)
            if name in unread:
                continue
            keep = _FILTERS.get((self._kind, model, name))
            if (model.__name__, name) in _INTERNED_FIELDS:
                keep = _intern
            shared = name in SHARED.get(model.__name__, ()) and (self._kind, model, name) not in _OWN
            convert = self._converter(_hints(model)[name])
            mode = _SHARED if shared else _CONVERT if convert is not None else _KEEP if keep else _PLAIN
            plan.append((name, mode, keep, convert, {}))
        self._defaults[model] = defaults
        self._plans[model] = plan
        own = _OWN_FIELDS.get((self._kind, model))
        if own is not None:
            steps = [(i, step[0], step[2], step[3]) for i, step in enumerate(plan) if step[0] in own]
            kept = [(step[0], step[2]) for step in plan if step[0] not in own and step[2] is not None]
            self._own[model] = ({name: _UNSET for name in own}, kept, steps, {})
        return plan

    def _converter(self, annotation: Any) -> Callable[[Any], Any] | None:
        """How a decoded value of ``annotation`` becomes the model's value (None: as it is)."""
        members = [m for m in _members(annotation) if m is not type(None)]
        if len(members) > 1:
            return None  # unions of scalars (str | int | float)
        (member,) = members
        if isinstance(member, type) and issubclass(member, BaseModel):
            return lambda struct: self.model(member, struct)
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is list:
            each = self._converter(args[0])
            return None if each is None else lambda values: [each(v) for v in values]
        if origin is dict:
            value = self._converter(args[1])
            return None if value is None else lambda values: {k: value(v) for k, v in values.items()}
        return None


class ModelPages(Generic[M]):
    """Decodes the list pages of one read of ``kind`` (``Node`` or ``Pod``) into compact models.

    Raises (``page``):
        msgspec.DecodeError: the page is not JSON; msgspec.ValidationError: an object lacks a required
        field or has a value of the wrong type (the message names its path, ``$.items[3].metadata``).

    ``lean``: models whose ``__dict__`` shares its keys with the class (:func:`_lean_constructed`), for a
    reader that holds more objects than it has CPU to spare (the sharded merge's 1.5 million pods).
    """

    def __init__(self, kind: type[M], *, lean: bool = False) -> None:
        self.kind: type[M] = kind
        self._decode = _decoder(kind).decode
        self._models = _Models(kind, lean=lean)

    def page(self, data: bytes) -> tuple[list[M], str | None]:
        """(the page's objects, its continue token or None)."""
        page = self._decode(data)
        return self.models(page.items or ()), page.metadata.continue_ or None

    def models(self, structs: Iterable[Any]) -> list[M]:
        """The compact models of objects decoded into :func:`object_struct` of ``kind`` (equal parts
        shared with every object this instance made)."""
        model, kind = self._models.model, self.kind
        return [model(kind, struct) for struct in structs]

    def close(self) -> None:
        """Release the tables of equal parts (call when the read is over; pages can still be decoded)."""
        self._models.clear()
