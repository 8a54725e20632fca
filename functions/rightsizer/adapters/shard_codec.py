"""A sharded run's objects read back from their bytes (issue 33 item 3): every Node ``prepare`` wrote and
each shard's partial, decoded straight into the plan's compact models.

At 100,000 GPU nodes the merge reads 1.5 million pods from the partials. Parsing them into Python dicts
(``json.loads``) and validating each through ``CompactObjects`` was ~60 % of the merge's CPU; here the
Kubernetes list reader's own decoder (``adapters.kubernetes_models``: msgspec structs generated from
``domain.model``, equal parts made once) decodes them from the bytes, the same compact ``Pod`` and ``Node``
objects the unsharded assessment's ``list_models`` makes. The rest of a partial (run, shard, signals, XID
facts) is small and validated by the partial's own schema (``domain.shard.PARTIAL_CODEC``).

Formats (``domain.shard.PARTIAL_FORMAT``): 2 is strict JSON with ``"format": 2``; 1 (no ``format`` field,
the previous release, whose shard may have written a partial of a run this release merges) wrote
non-finite floats as bare ``NaN``/``Infinity``, which only Python's ``json`` reads: it is parsed so, and its
pods converted into the same structs (``msgspec.convert``). Any other format is refused
(``ShardsIncomplete``, naming it): a partial of a newer release is not guessed at.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Final

import msgspec
from pydantic import ValidationError

from rightsizer.adapters.kubernetes_models import ModelPages, object_struct
from rightsizer.domain.model import Node, Pod
from rightsizer.domain.shard import PARTIAL_CODEC, PARTIAL_FORMAT, ShardPartial, ShardsIncomplete
from rightsizer.gc_pause import cyclic_gc_paused

#: Partial formats this release reads.
READS_FORMATS: Final = frozenset({1, PARTIAL_FORMAT})
#: Fields every partial carries (both formats write every field; format 1 has no ``format``). A body
#: without one was cut or made by hand: its defaults would read as facts (no ``pods``: a shard whose
#: nodes run nothing), so it is refused naming the field; a missing object is never permission.
WIRE_FIELDS: Final = tuple(f.name for f in dataclasses.fields(ShardPartial) if f.name != "format")


def _envelope() -> Any:
    """A partial's top level: its pods as structs, every other field of ``ShardPartial`` as plain values
    (validated by ``PARTIAL_CODEC``; a field added to the partial is read without a change here), each
    required but ``format``."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        (name, Any) for name in WIRE_FIELDS if name != "pods"
    ]
    fields.append(("pods", list[object_struct(Pod)]))  # type: ignore[misc]
    fields.append(("format", Any, msgspec.UNSET))
    return msgspec.defstruct("_Partial", fields, kw_only=True, gc=False)


class _Format(msgspec.Struct):
    format: Any = 1


_FORMAT: Final = msgspec.json.Decoder(_Format)


def _format_of(body: bytes) -> Any:
    """A partial's ``format`` (1 when it has none), None when the body is not a JSON object."""
    try:
        return _FORMAT.decode(body).format
    except msgspec.DecodeError:  # NaN constants (format 1, or a newer format that kept them)
        try:
            document = json.loads(body)
        except ValueError:
            return None
    return document.get("format", 1) if isinstance(document, dict) else None


def _readable(found: Any) -> None:
    """Refuse a partial of a ``found`` format this release does not read (None: unknown, let pass)."""
    if found is not None and (type(found) is not int or found not in READS_FORMATS):  # not true, 2.0
        raise ShardsIncomplete(
            f"a partial is in format {found!r}; this release reads formats "
            f"{', '.join(map(str, sorted(READS_FORMATS)))} (a newer release's shard wrote it: "
            "let that release merge the run)"
        )


class RunDecoder:
    """Decodes one run's objects; equal parts of every Node and Pod it reads are made once across all of
    them (use one instance per merge, then :meth:`close`).

    Raises (``nodes``, ``partial``):
        ShardsIncomplete: the body is not a Nodes array or a partial (names the bad field's path), or a
            partial of a format this release does not read.
    """

    def __init__(self) -> None:
        # lean: the merge's memory binds before its CPU (6.6 of 10 GB, 178 of 900 s at 100,000 GPU nodes)
        self._nodes = ModelPages(Node, lean=True)
        self._pods = ModelPages(Pod, lean=True)
        self._node_list = msgspec.json.Decoder(list[object_struct(Node)])  # type: ignore[misc]
        self._partial = msgspec.json.Decoder(_envelope())
        self._pod_structs: Any = list[object_struct(Pod)]  # type: ignore[misc]

    def nodes(self, body: bytes) -> list[Node]:
        """A run's Nodes object (a JSON array of ``Node``, ``services.shard.NODES_CODEC``)."""
        try:
            structs = self._node_list.decode(body)
        except msgspec.DecodeError as exc:
            raise ShardsIncomplete(f"the run's Nodes object is not a Node array: {exc}") from exc
        with cyclic_gc_paused():
            return self._nodes.models(structs)

    def partial(self, body: bytes) -> ShardPartial:
        """A shard's partial (``PARTIAL_CODEC``'s JSON, format 1 or 2), its pods compact."""
        with cyclic_gc_paused():
            try:
                fields, structs = self._fields(body)
            except (msgspec.ValidationError, ValueError) as exc:
                _readable(_format_of(body))  # a newer format's new shape is refused for its format
                raise ShardsIncomplete(f"a partial is malformed: {exc}") from exc
            _readable(fields.get("format", 1))
            try:
                partial = PARTIAL_CODEC.validate_python({"format": 1, **fields})
            except ValidationError as exc:
                raise ShardsIncomplete(f"a partial is malformed: {exc}") from exc
            return dataclasses.replace(partial, pods=tuple(self._pods.models(structs)))

    def _fields(self, body: bytes) -> tuple[dict[str, Any], list[Any]]:
        """(the partial's fields but its pods, as plain values; its pods as structs).

        Raises:
            msgspec.ValidationError: a pod is malformed (the message names its path); ValueError: the
                body is not a JSON object.
        """
        try:
            envelope = self._partial.decode(body)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:  # not strict JSON: format 1's NaN / Infinity constants
            fields = json.loads(body)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object") from None
            if missing := [name for name in WIRE_FIELDS if name not in fields]:
                raise ValueError(f"Object missing required field `{missing[0]}`") from None
            pods = fields.pop("pods", [])
            return fields, msgspec.convert(pods, self._pod_structs)
        fields = {
            name: value
            for name in envelope.__struct_fields__
            if (value := getattr(envelope, name)) is not msgspec.UNSET
        }
        return fields, fields.pop("pods")

    def close(self) -> None:
        """Release the tables of equal parts (the decoded objects stay valid)."""
        self._nodes.close()
        self._pods.close()
