"""RBAC as the code uses it: the ClusterRoles of each function identity, and the verbs its requests used.

A function's identity is its role's EKS access entry (``template.yaml``: ``KubernetesGroups``), bound by the
ClusterRoleBindings of ``infra/k8s/rbac.yaml`` to ClusterRoles. :func:`function_role` merges those
ClusterRoles into the one the Kubernetes double enforces (``KubernetesDouble.bind_cluster_role``: a request
no rule grants answers 403); :func:`attributes` maps a request the double recorded to RBAC's (API group,
resource[/subresource], verb), and :func:`unused` lists the granted (group, resource, verb) triples no
request used.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rightsizer.testing.k8s import RecordedRequest
from tests.support.iam import load_template

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "infra" / "k8s" / "rbac.yaml"
#: The Lambda function of each role that has an EKS access entry (template.yaml).
FUNCTION_ROLES = {
    "assess": "AssessRole",
    "drain": "DrainRole",
    "offhours": "OffhoursRole",
    "webhook": "AlertWebhookRole",
}

Triple = tuple[str, str, str]  # (API group, resource or resource/subresource, verb)


def _documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text(encoding="utf-8")) if d]


def groups_of(function: str, conditions: frozenset[str] = frozenset()) -> list[str]:
    """The Kubernetes groups of ``function``'s access entry; [] when it has none (the webhook).
    ``conditions``: the template conditions that hold (an ``Fn::If`` of groups is resolved with them)."""
    role = FUNCTION_ROLES[function]
    for resource in load_template()["Resources"].values():
        if resource["Type"] == "AWS::EKS::AccessEntry" and resource["Properties"]["PrincipalArn"] == {
            "Fn::GetAtt": [role, "Arn"]
        }:
            groups = resource["Properties"]["KubernetesGroups"]
            if isinstance(groups, dict):
                condition, when, otherwise = groups["Fn::If"]
                groups = when if condition in conditions else otherwise
            return list(groups)
    return []


def cluster_roles_of(function: str, conditions: frozenset[str] = frozenset()) -> list[str]:
    """Names of the ClusterRoles bound (ClusterRoleBinding, subject kind Group) to ``function``'s groups."""
    groups = set(groups_of(function, conditions))
    return sorted(
        d["roleRef"]["name"]
        for d in _documents()
        if d["kind"] == "ClusterRoleBinding"
        and any(s.get("kind") == "Group" and s.get("name") in groups for s in d.get("subjects") or ())
    )


def function_role(function: str, conditions: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One ClusterRole with the rules of every ClusterRole bound to ``function`` (empty for the webhook)."""
    names = set(cluster_roles_of(function, conditions))
    rules = [
        r
        for d in _documents()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] in names
        for r in d["rules"]
    ]
    return {"kind": "ClusterRole", "metadata": {"name": f"{function}-effective"}, "rules": rules}


def function_role_named(name: str) -> dict[str, Any]:
    """The ClusterRole ``name`` of infra/k8s/rbac.yaml."""
    return next(d for d in _documents() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


def grants(role: dict[str, Any]) -> set[Triple]:
    """Every (group, resource, verb) the role's rules grant (no wildcards in ours: checked)."""
    found: set[Triple] = set()
    for rule in role["rules"]:
        for part in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[part], f"wildcard in {rule}"
        found |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return found


def attributes(request: RecordedRequest) -> Triple | None:
    """RBAC's (group, resource[/subresource], verb) of a resource request; None for non-resource URLs
    (``/version``, discovery), which every authenticated user may read."""
    parts = [p for p in request.path.split("?")[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource (a Namespace object itself would be rest[:2])
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    if request.method == "GET":
        verb = "watch" if request.param("watch") in ("true", "1") else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[request.method]
    return group, f"{resource}/{sub}" if sub else resource, verb


def used(requests: Iterable[RecordedRequest]) -> set[Triple]:
    """The triples of the answered resource requests."""
    return {a for r in requests if r.status is not None and (a := attributes(r)) is not None}


def unused(role: dict[str, Any], requests: Iterable[RecordedRequest]) -> list[Triple]:
    """The role's grants no request used, sorted."""
    return sorted(grants(role) - used(requests))
