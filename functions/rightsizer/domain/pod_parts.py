"""Equal parts of many pods, stored once (issue 11 item 7: the live plan's memory at ~150,000 pods).

The pods of one Deployment carry the same containers, tolerations, labels, owner and conditions (the
models keep a condition's type and status only); validated separately they are separate objects, ~12 KB
a pod. :class:`SharedPodParts` swaps each such part of a validated ``Pod`` for the first equal one it saw,
so a GPU node's pods cost what makes them different. The models are frozen, so sharing is invisible to
readers: the pod compares and decides exactly as before.
"""

from __future__ import annotations

from typing import Any

from rightsizer.domain.model import Pod

#: (section, field) of a Pod whose values are shared between pods when equal.
SHARED_FIELDS = (
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("metadata", "ownerReferences"),
    ("spec", "containers"),
    ("spec", "initContainers"),
    ("spec", "tolerations"),
    ("spec", "nodeSelector"),
    ("status", "conditions"),
)


class SharedPodParts:
    """Pods whose equal parts are one object each (``SHARED_FIELDS``); one instance per observation.

    The table grows with the distinct parts (about one entry per pod template and node), not the pods.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], Any] = {}

    def pod(self, pod: Pod) -> Pod:
        """``pod`` with every part in ``SHARED_FIELDS`` replaced by the equal one seen first (an equal
        ``Pod``; ``pod`` itself when nothing was shared)."""
        sections: dict[str, Any] = {}
        for section, name in SHARED_FIELDS:
            current = sections.get(section) or getattr(pod, section)
            value = getattr(current, name)
            if not value:
                continue
            key = (section, name, _key(value))
            shared = self._seen.setdefault(key, value)
            if shared is not value:
                sections[section] = current.model_copy(update={name: shared})
        return pod.model_copy(update=sections) if sections else pod


def _key(value: Any) -> str:
    """A text equal for equal values: models by their JSON, dicts by their sorted items."""
    if isinstance(value, dict):
        return repr(sorted(value.items()))
    return "[" + ",".join(item.model_dump_json() for item in value) + "]"
