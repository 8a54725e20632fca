"""Label and field selectors as the API server parses and matches them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rightsizer.testing.k8s.api import _FIELD_ALIASES, _RESOURCES, JSON, ApiError, _Resource

# --------------------------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether an object with ``labels`` satisfies this requirement."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # Like the API server, != and notin also match objects that lack the key.
        return not present or value not in self.values


_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"[-A-Za-z0-9_.]*"
_SET_RE = re.compile(rf"^\s*({_LABEL_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_LABEL_KEY})\s*(==|!=|=)\s*({_LABEL_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_LABEL_KEY})\s*$")


def parse_label_selector(selector: str) -> list[_Requirement]:
    """Parse a ``labelSelector`` query value; raise ``ApiError`` 400 when it is malformed."""
    requirements: list[_Requirement] = []
    for part in _split_outside_parens(selector):
        if not part.strip():
            continue
        if m := _SET_RE.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            requirements.append(_Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_RE.match(part):
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append(_Requirement(m.group(1), op, frozenset({m.group(3)})))
        elif m := _EXISTS_RE.match(part):
            requirements.append(_Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
        else:
            raise ApiError(400, f"unable to parse requirement: {part.strip()!r}")
    return requirements


def _split_outside_parens(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def label_selector_matches(selector: JSON | None, labels: dict[str, str]) -> bool:
    """Whether a structured ``LabelSelector`` (matchLabels/matchExpressions) selects ``labels``.

    A missing selector selects nothing; an empty one selects everything (policy/v1 PDB semantics).
    """
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        requirement = _Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or []))
        if not requirement.matches(labels):
            return False
    return True


def _field_value(obj: JSON, path: str) -> str:
    current: Any = obj
    for part in _FIELD_ALIASES.get(path, path).split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(selector: str, res: _Resource) -> list[tuple[str, bool, str]]:
    """Parse a ``fieldSelector`` into (field, equal?, value) terms for resource ``res``."""
    allowed = res.fields | {"metadata.name"} | ({"metadata.namespace"} if res.namespaced else set())
    terms = []
    for part in selector.split(","):
        if not part.strip():
            continue
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, f"invalid selector: {part!r}; can't understand {part!r}")
        if m.group(1) not in allowed:
            raise ApiError(400, f"field label not supported: {m.group(1)}")
        terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return terms


def selected(obj: JSON, label_selector: str = "", field_selector: str = "", plural: str = "nodes") -> bool:
    """Whether a list of ``plural`` with these ``labelSelector``/``fieldSelector`` values includes ``obj``.

    Raises:
        ApiError: 400 for a malformed selector or a field the resource does not support.
    """
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not all(r.matches(labels) for r in parse_label_selector(label_selector)):
        return False
    terms = parse_field_selector(field_selector, _RESOURCES[plural])
    return all((_field_value(obj, path) == value) == equal for path, equal, value in terms)
