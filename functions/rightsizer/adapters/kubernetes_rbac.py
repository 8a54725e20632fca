"""The ClusterRoles of ``infra/k8s/rbac.yaml`` as data, and the remedy a 403 names (BUG-31).

A refused request is answered with the ClusterRole that grants exactly that verb on that resource and the
function whose identity is bound to it — the drain's reads name ``rightsizer`` (its only role), an
assessment's uncordon names ``rightsizer-heal`` — never a role chosen by the verb alone. The Lambda
artifact ships ``functions/`` only, so the manifest's rules are repeated here;
``tests/integration/test_infra.py`` keeps the two equal, both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from rightsizer.ports import AccessCheck

__all__ = ["CLUSTER_ROLES", "ROLE_FUNCTIONS", "granting_roles", "remedy_403"]

#: ClusterRole → its grants as (API group, resource[/subresource], verb), as in infra/k8s/rbac.yaml.
CLUSTER_ROLES: Final[Mapping[str, frozenset[tuple[str, str, str]]]] = {
    "rightsizer-read": frozenset(
        {
            ("", "nodes", "list"),
            ("", "pods", "list"),
            ("policy", "poddisruptionbudgets", "list"),
            ("", "persistentvolumeclaims", "list"),
            ("", "persistentvolumes", "list"),
            ("resource.k8s.io", "resourceclaims", "list"),
            ("resource.k8s.io", "resourceslices", "list"),
            ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
        }
    ),
    "rightsizer": frozenset(
        {
            ("", "nodes", "get"),
            ("", "nodes", "list"),
            ("", "nodes", "patch"),
            ("", "pods", "list"),
            ("", "pods/eviction", "create"),
            ("", "persistentvolumeclaims", "get"),
            ("", "persistentvolumes", "get"),
            ("apps", "replicasets", "get"),
            ("apps", "statefulsets", "get"),
            ("apps", "daemonsets", "get"),
            ("batch", "jobs", "get"),
            ("", "replicationcontrollers", "get"),
            ("", "events", "create"),
            ("policy", "poddisruptionbudgets", "list"),
            ("resource.k8s.io", "resourceclaims", "list"),
            ("resource.k8s.io", "resourceslices", "list"),
        }
    ),
    "rightsizer-replace": frozenset(
        {
            ("", "nodes", "list"),
            ("", "pods", "list"),
            ("policy", "poddisruptionbudgets", "list"),
            ("", "persistentvolumeclaims", "list"),
            ("", "persistentvolumes", "list"),
            ("resource.k8s.io", "resourceclaims", "list"),
            ("resource.k8s.io", "resourceslices", "list"),
            ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
        }
    ),
    "rightsizer-offhours": frozenset(
        {
            ("", "nodes", "list"),
            ("", "pods", "list"),
            ("policy", "poddisruptionbudgets", "list"),
            ("", "persistentvolumeclaims", "list"),
            ("", "persistentvolumes", "list"),
            ("resource.k8s.io", "resourceclaims", "list"),
            ("resource.k8s.io", "resourceslices", "list"),
            ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
        }
    ),
    "rightsizer-heal": frozenset({("", "nodes", "get"), ("", "nodes", "patch"), ("", "events", "create")}),
    "rightsizer-pod-delete": frozenset({("", "pods", "delete")}),
    # Workload scale-to-zero (issue 32): the snapshot's owner reads, scale-down and restore.
    "rightsizer-workloads": frozenset(
        {("apps", "replicasets", "list"), ("autoscaling", "horizontalpodautoscalers", "get")}
        | {("autoscaling", "horizontalpodautoscalers", "list")}
        | {
            (group, resource, verb)
            for group, resource in (
                ("apps", "deployments"),
                ("apps", "statefulsets"),
                ("leaderworkerset.x-k8s.io", "leaderworkersets"),
                ("kubeflow.org", "notebooks"),
                ("serving.kserve.io", "inferenceservices"),
                ("keda.sh", "scaledobjects"),
            )
            for verb in ("get", "list", "patch")
        }
        | {
            ("apps", "deployments/scale", "patch"),
            ("apps", "statefulsets/scale", "patch"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "patch"),
        }
    ),
}

#: ClusterRole → where it is bound: whose EKS access entry group (infra/k8s/rbac.yaml header and bindings).
ROLE_FUNCTIONS: Final[Mapping[str, str]] = {
    "rightsizer-read": "the assess function's EKS access entry group rightsizer-read",
    "rightsizer-heal": "the assess function's EKS access entry group rightsizer-heal",
    "rightsizer": "the drain function's EKS access entry group rightsizer",
    "rightsizer-replace": "the drain function's EKS access entry group rightsizer-replace, with node group "
    "replacement",
    "rightsizer-offhours": "the off-hours function's EKS access entry group rightsizer-offhours",
    "rightsizer-pod-delete": "optional, not bound by the manifest",
    "rightsizer-workloads": "optional: the identity of rightsizer apply/restore, group rightsizer-workloads",
}


def _grant(check: AccessCheck) -> tuple[str, str, str]:
    resource = f"{check.resource}/{check.subresource}" if check.subresource else check.resource
    return check.group, resource, check.verb


def granting_roles(check: AccessCheck) -> list[str]:
    """The ClusterRoles of infra/k8s/rbac.yaml that grant ``check``, in manifest order (maybe none)."""
    wanted = _grant(check)
    return [role for role, grants in CLUSTER_ROLES.items() if wanted in grants]


def remedy_403(check: AccessCheck) -> str:
    """What to bind so that ``check`` is allowed: each ClusterRole granting it with the group it belongs to,
    e.g. ``bind the ClusterRole rightsizer (infra/k8s/rbac.yaml; the drain function's EKS access entry
    group rightsizer) to the identity's Kubernetes group``."""
    roles = granting_roles(check)
    if not roles:
        return (
            f"no ClusterRole of infra/k8s/rbac.yaml grants {check.describe()}: GPU Rightsizer does not "
            "call it (report this as a bug)"
        )
    named = " or ".join(
        f"the ClusterRole {role} (infra/k8s/rbac.yaml; {ROLE_FUNCTIONS[role]})" for role in roles
    )
    return f"bind {named} to the identity's Kubernetes group"
