"""infra/: the alert rules under promtool, the Alertmanager receiver under amtool, RBAC and CRD shapes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.binaries import require_binary

INFRA = Path(__file__).resolve().parents[2] / "infra"
pytestmark = pytest.mark.integration


def run(*args: str, cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_alert_rules_pass_promtool_unit_tests() -> None:
    promtool = require_binary("promtool")
    out = run(promtool, "test", "rules", "gpu-idle-rules.test.yaml", cwd=INFRA / "prometheus")
    assert "SUCCESS" in out


def test_prometheusrule_carries_the_same_groups_and_checks(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    plain = yaml.safe_load((INFRA / "prometheus" / "gpu-idle-rules.yaml").read_text())
    crd = yaml.safe_load((INFRA / "prometheus" / "prometheusrule.yaml").read_text())
    assert crd["kind"] == "PrometheusRule" and crd["apiVersion"] == "monitoring.coreos.com/v1"
    assert crd["spec"] == plain
    extracted = tmp_path / "rules.yaml"
    extracted.write_text(yaml.safe_dump(crd["spec"]))
    assert "SUCCESS: 3 rules found" in run(promtool, "check", "rules", str(extracted), cwd=tmp_path)


def test_alert_for_matches_default_idle_window_and_carries_node() -> None:
    rules = yaml.safe_load((INFRA / "prometheus" / "gpu-idle-rules.yaml").read_text())
    [alert] = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alert["for"] == "30m"
    assert "node" in alert["annotations"]["summary"]


def test_alertmanager_receiver_checks_with_amtool() -> None:
    amtool = require_binary("amtool")
    assert "SUCCESS" in run(amtool, "check-config", "receiver.yaml", cwd=INFRA / "alertmanager")
    cfg = yaml.safe_load((INFRA / "alertmanager" / "receiver.yaml").read_text())
    hook = cfg["receivers"][1]["webhook_configs"][0]
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"


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
    assert {("", "nodes", "patch"), ("", "pods/eviction", "create"), ("apps", "daemonsets", "get"),
            ("", "events", "create")} <= write  # fmt: skip
    assert ("", "pods", "delete") not in write
    assert grants("rightsizer-pod-delete") == {("", "pods", "delete")}
    assert read <= write
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
    keda = yaml.safe_load((INFRA / "keda" / "scaledobject-gpu-inference.yaml").read_text())
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
    keda = yaml.safe_load((INFRA / "keda" / "scaledobject-gpu-inference.yaml").read_text())
    assert keda["apiVersion"] == "keda.sh/v1alpha1" and keda["kind"] == "ScaledObject"
    return int(keda["spec"]["minReplicaCount"])
