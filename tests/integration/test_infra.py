"""infra/: RBAC verbs, the dashboard's and the KEDA example's PromQL (the cluster package as a whole:
``test_cluster_package.py``, the alert route: ``test_alert_route.py``, KEDA scaling: ``test_keda.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

INFRA = Path(__file__).resolve().parents[2] / "infra"
pytestmark = pytest.mark.integration


def test_rbac_grants_exactly_the_documented_verbs() -> None:
    docs = list(yaml.safe_load_all((INFRA / "k8s" / "rbac.yaml").read_text()))
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}

    def grants(role: str) -> set[tuple[str, str, str]]:
        return {
            (group, resource, verb)
            for rule in roles[role]["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    read, write = grants("rightsizer-read"), grants("rightsizer")
    assert ("", "nodes", "patch") not in read and ("", "pods/eviction", "create") not in read
    assert {("", "nodes", "patch"), ("", "pods/eviction", "create"), ("", "events", "create")} <= write
    # exactly what the code calls (tests/integration/test_iam.py proves it both ways): no watch at all
    assert not any(verb == "watch" for _, _, verb in read | write)
    assert ("", "pods", "delete") not in write
    assert grants("rightsizer-pod-delete") == {("", "pods", "delete")}
    # The drain's own role lists no collection of volumes (its reads are one node's): those are the
    # replacement's (rightsizer-replace, bound only with replacement) and the assessment's. It lists Nodes
    # only for a zonal volume's witness search (by label and field selector; RBAC cannot tell a selected
    # list from a whole one), proven used by test_iam's drain flow.
    assert ("", "nodes", "list") in write
    assert read - write == {
        ("", "persistentvolumeclaims", "list"),
        ("", "persistentvolumes", "list"),
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
    }
    assert grants("rightsizer-replace") == read == grants("rightsizer-offhours")
    # The remedy of a 403 (adapters.kubernetes_rbac) names roles from a copy of these rules: kept equal
    from rightsizer.adapters.kubernetes_rbac import CLUSTER_ROLES

    assert {role: grants(role) for role in roles} == {role: set(g) for role, g in CLUSTER_ROLES.items()}
    bindings = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert bindings["rightsizer"]["subjects"][0] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Group",
        "name": "rightsizer",
    }


# --- dashboards and KEDA: every PromQL they carry is valid for a real Prometheus -----------------------

pytest_plugins = ["tests.support.prometheus_server"]
FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"


def _dashboard() -> dict[str, object]:
    import json

    loaded: dict[str, object] = json.loads((INFRA / "dashboards" / "gpu-rightsizer.json").read_text())
    return loaded


def _valid_promql(url: str, expr: str) -> bool:
    import httpx

    answer = httpx.post(f"{url}/api/v1/query", data={"query": expr}, timeout=10).json()
    return bool(answer["status"] == "success")


def test_dashboard_and_keda_promql_evaluate_on_prometheus(prometheus_factory: object) -> None:
    sample = [({"node": "gpu-a", "gpu": "0", "UUID": "GPU-a0"}, [(0.0, 1.0)])]
    server = prometheus_factory({"DCGM_FI_DEV_GPU_UTIL": sample, "DCGM_FI_DEV_FB_USED": sample})  # type: ignore[operator]
    panels = _dashboard()["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"] if "expr" in t]  # type: ignore[attr-defined]
    keda = yaml.safe_load((INFRA / "k8s" / "components" / "keda-example" / "scaledobject.yaml").read_text())
    exprs += [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    assert len(exprs) >= 10
    assert [e for e in exprs if not _valid_promql(server.url, e)] == []


def test_dashboard_cloudwatch_panels_use_metrics_the_functions_emit() -> None:
    panels = _dashboard()["panels"]
    names = {t["metricName"] for p in panels for t in p["targets"] if "metricName" in t}  # type: ignore[attr-defined]
    source = "\n".join(p.read_text() for p in FUNCTIONS.rglob("*.py"))
    assert names and all(f'"{n}"' in source for n in names), names
    assert keda_min_replicas() == 0


def keda_min_replicas() -> int:
    keda = yaml.safe_load((INFRA / "k8s" / "components" / "keda-example" / "scaledobject.yaml").read_text())
    assert keda["apiVersion"] == "keda.sh/v1alpha1" and keda["kind"] == "ScaledObject"
    return int(keda["spec"]["minReplicaCount"])
