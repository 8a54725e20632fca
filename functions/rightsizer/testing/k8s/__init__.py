"""A stateful Kubernetes API server double over real HTTP on 127.0.0.1 (test and demo support).

Read :mod:`rightsizer.testing.k8s.double` first (what it covers and what it deliberately does not); the
parts follow the API server's own: ``api`` (resources, ``Status`` errors), ``selectors``, ``patch`` (JSON
merge patch only, the one format the product sends), ``store``, ``controllers`` (eviction, PDB status,
workload controllers, scheduling) and ``server`` (routing, verbs, HTTP).
"""

from rightsizer.testing.k8s.api import (
    DEFAULT_GRACE_SECONDS,
    DRA_VERSIONS,
    JSON,
    ApiError,
    Placement,
    RecordedRequest,
    rfc3339,
    status_body,
)
from rightsizer.testing.k8s.controllers import first_fit
from rightsizer.testing.k8s.double import KubernetesDouble
from rightsizer.testing.k8s.patch import merge_patch
from rightsizer.testing.k8s.selectors import (
    label_selector_matches,
    parse_field_selector,
    parse_label_selector,
    selected,
)

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DRA_VERSIONS",
    "JSON",
    "ApiError",
    "KubernetesDouble",
    "Placement",
    "RecordedRequest",
    "first_fit",
    "label_selector_matches",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
    "rfc3339",
    "selected",
    "status_body",
]
