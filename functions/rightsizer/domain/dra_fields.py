"""What the decision reads of DRA objects (``resource.k8s.io`` ResourceClaims and ResourceSlices): the
fields ``adapters.snapshot_dir.parse_resource_claims`` reads, for the snapshot written to disk
(``adapters.snapshot_projection``) and the live plan's lists, projected page by page (issue 11 item 7).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CLAIM_SHAPE", "SLICE_SHAPE", "claim_fields", "pick", "slice_fields"]


def pick(value: Any, shape: Mapping[str, Any]) -> Any:
    """Keep the keys of ``shape`` (nested dict = recurse, list element shape = each item, None = leaf)."""
    if isinstance(value, list):
        return [pick(v, shape) for v in value]
    if not isinstance(value, Mapping):
        return value
    return {k: (value[k] if sub is None else pick(value[k], sub)) for k, sub in shape.items() if k in value}


#: What ``snapshot_dir.parse_resource_claims`` reads of ResourceClaims (any served version).
CLAIM_SHAPE: Final = {
    "metadata": {"name": None, "namespace": None},
    "status": {
        "allocation": {
            "nodeSelector": {
                "nodeSelectorTerms": {"matchFields": {"key": None, "operator": None, "values": None}}
            },
            "devices": {"results": {"driver": None, "pool": None}},
        },
        "reservedFor": {"resource": None, "name": None},
    },
}
#: ... and of ResourceSlices.
SLICE_SHAPE: Final = {
    "metadata": {"name": None},
    "spec": {"nodeName": None, "driver": None, "pool": {"name": None}},
}


def claim_fields(obj: Mapping[str, Any]) -> Any:
    """A ResourceClaim reduced to ``CLAIM_SHAPE`` (an allocation with nothing else read stays a fact)."""
    out = pick(obj, CLAIM_SHAPE)
    allocation = (obj.get("status") or {}).get("allocation")
    if allocation and not out.get("status", {}).get("allocation"):
        out["status"]["allocation"] = {"devices": {}}  # allocated, with nothing else read: keep the fact
    return out


def slice_fields(obj: Mapping[str, Any]) -> Any:
    """A ResourceSlice reduced to ``SLICE_SHAPE``."""
    return pick(obj, SLICE_SHAPE)
