"""A label / annotation / tag map that records which keys the code under test looks up.

Used by the allowlist tests (``test_snapshot_projection``, ``test_series_labels``): a key the decision
reads must be kept by the projection, and nothing else is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RecordingMap(dict[str, str]):
    """A ``dict`` that adds every key looked up (``get``, ``[]``, ``in``) to ``log``; iterating it (a copy)
    is not a read."""

    def __init__(self, data: Mapping[str, str], log: set[str]) -> None:
        super().__init__(data)
        self.log = log

    def get(self, key: Any, default: Any = None) -> Any:
        self.log.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.log.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.log.add(str(key))
        return super().__contains__(key)
