"""The cluster package (``infra/k8s`` base + components, ``infra/overlays``) as users install it.

GIVEN the overlays rendered by the real ``kubectl kustomize``
THEN every document is valid, strictly: built-in kinds by ``kubernetes-validate --strict``, custom
resources by the vendored Prometheus Operator / KEDA CRD schemas (``tests/fixtures/crd-schemas``);
AND the rules (PrometheusRule and the plain file) pass ``promtool check rules`` and the shipped
promtool unit tests; the plain scrape job passes ``promtool check config``;
AND the alert's ``namespace`` label follows the overlay's namespace (the AlertmanagerConfig's);
AND the dcgm-exporter ServiceMonitor relabels ``__meta_kubernetes_pod_node_name`` into ``node``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.binaries import require_binary
from tests.support.cluster_package import (
    BASE,
    COMPONENTS,
    KUBE_PROMETHEUS_STACK,
    PLAIN_PROMETHEUS,
    alert_rule,
    find,
    kustomize,
    plain_files,
)
from tests.support.crd_schema import crd_errors, schema_for

pytestmark = pytest.mark.integration

KUBERNETES_VERSION = "1.32"


def run(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def kubernetes_validate(docs: list[dict[str, Any]], tmp_path: Path) -> str:
    """``kubernetes-validate --strict`` on the built-in kinds of ``docs``; its output (fails on any ERROR)."""
    binary = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert binary, "kubernetes-validate is in the [dev] extra"
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return run(binary, "--strict", "-k", KUBERNETES_VERSION, str(path))


@pytest.mark.parametrize("overlay", [BASE, KUBE_PROMETHEUS_STACK, PLAIN_PROMETHEUS], ids=lambda p: p.name)
def test_every_rendered_document_is_strictly_valid(overlay: Path, tmp_path: Path) -> None:
    docs = kustomize(overlay)
    custom = [d for d in docs if schema_for(d["apiVersion"], d["kind"]) is not None]
    core = [d for d in docs if d not in custom]
    out = kubernetes_validate(core, tmp_path)
    # every built-in document was validated (no "schema not found" pass), every custom one has a schema
    assert out.count("INFO") == len(core) and "WARN" not in out, out
    assert {(d["kind"], crd_errors(d) == []) for d in custom} == {(d["kind"], True) for d in custom}
    assert {d["kind"] for d in docs} >= {"ClusterRole", "ClusterRoleBinding"}


def test_strict_validation_rejects_unknown_fields(tmp_path: Path) -> None:
    """The checks can fail: a misspelt field is an error on both paths."""
    docs = kustomize(KUBE_PROMETHEUS_STACK)
    amc = find(docs, "AlertmanagerConfig", "gpu-rightsizer")
    amc["spec"]["route"]["groupby"] = amc["spec"]["route"].pop("groupBy")
    assert any("groupby" in e for e in crd_errors(amc))
    rule = find(docs, "PrometheusRule", "gpu-rightsizer")
    rule["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    assert crd_errors(rule)
    with pytest.raises(LookupError):
        crd_errors({"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}})
    role = find(docs, "ClusterRole", "rightsizer")
    role["rules"][0]["verb"] = ["get"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(role))
    binary = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert binary
    proc = subprocess.run(
        [binary, "--strict", "-k", KUBERNETES_VERSION, str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "verb" in proc.stdout, proc.stdout


def test_kube_prometheus_stack_overlay_contents() -> None:
    docs = kustomize(KUBE_PROMETHEUS_STACK)
    rule = find(docs, "PrometheusRule", "gpu-rightsizer")
    amc = find(docs, "AlertmanagerConfig", "gpu-rightsizer")
    monitor = find(docs, "ServiceMonitor", "nvidia-dcgm-exporter-node")
    for doc in (rule, amc, monitor):
        assert doc["metadata"]["namespace"] == "monitoring"
    # kube-prometheus-stack's ruleSelector / serviceMonitorSelector match release=<release name>
    assert rule["metadata"]["labels"]["release"] == monitor["metadata"]["labels"]["release"]
    assert alert_rule(rule["spec"])["labels"]["namespace"] == amc["metadata"]["namespace"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "gpu-metrics"  # the GPU Operator's dcgm-exporter Service port
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in (endpoint["relabelings"])
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    secret_refs = {
        (ref["name"], ref["key"])
        for hook in amc["spec"]["receivers"][0]["webhookConfigs"]
        for ref in (hook["urlSecret"], hook["httpConfig"]["authorization"]["credentials"])
    }
    assert secret_refs == {("gpu-rightsizer-webhook", "url"), ("gpu-rightsizer-webhook", "token")}
    # cluster-scoped RBAC is untouched by the namespace
    assert all("namespace" not in d["metadata"] for d in docs if d["kind"].startswith("Cluster"))


def test_alert_namespace_label_follows_the_overlay_namespace(tmp_path: Path) -> None:
    """A user who installs into another namespace edits `namespace:` only; the replacement moves the label."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    text = (KUBE_PROMETHEUS_STACK / "kustomization.yaml").read_text()
    text = text.replace("namespace: monitoring", "namespace: observability")
    text = text.replace("../../k8s", os.path.relpath(BASE, overlay))
    (overlay / "kustomization.yaml").write_text(text)
    docs = kustomize(overlay)
    rule = find(docs, "PrometheusRule", "gpu-rightsizer")
    assert alert_rule(rule["spec"])["labels"]["namespace"] == "observability"
    assert find(docs, "AlertmanagerConfig", "gpu-rightsizer")["metadata"]["namespace"] == "observability"


def test_prometheusrule_carries_the_plain_rules_and_both_pass_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    plain = yaml.safe_load(plain_files()["gpu-idle-rules.yaml"])
    rule = find(kustomize(KUBE_PROMETHEUS_STACK), "PrometheusRule", "gpu-rightsizer")
    assert rule["spec"] == plain  # the overlay keeps namespace=monitoring, as the plain file has it
    for name, groups in (("plain.yaml", plain), ("crd.yaml", rule["spec"])):
        (tmp_path / name).write_text(yaml.safe_dump(groups))
        assert "SUCCESS: 9 rules found" in run(promtool, "check", "rules", str(tmp_path / name))


def test_shipped_promtool_unit_tests_pass() -> None:
    promtool = require_binary("promtool")
    out = run(promtool, "test", "rules", "gpu-idle-rules.test.yaml", cwd=COMPONENTS / "plain-prometheus")
    assert "SUCCESS" in out


def test_alert_window_and_labels() -> None:
    alert = alert_rule(yaml.safe_load(plain_files()["gpu-idle-rules.yaml"]))
    assert alert["for"] == "30m"  # the rightsizer's default idle_window
    assert "node" in alert["annotations"]["summary"]
    # kube-prometheus-stack's InfoInhibitor silences severity=info alerts (test_alert_route proves it)
    assert alert["labels"]["severity"] != "info"


def test_plain_scrape_job_and_route_pass_promtool_and_amtool(tmp_path: Path) -> None:
    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    files = plain_files()
    assert set(files) == {"gpu-idle-rules.yaml", "scrape-dcgm-exporter.yaml", "alertmanager-route.yaml"}
    (tmp_path / "gpu-idle-rules.yaml").write_text(files["gpu-idle-rules.yaml"])
    config = {"rule_files": ["gpu-idle-rules.yaml"], **yaml.safe_load(files["scrape-dcgm-exporter.yaml"])}
    [job] = config["scrape_configs"]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in job[
        "relabel_configs"
    ]
    # Debian builds Prometheus without Kubernetes service discovery: check the job with the same relabeling
    # over file_sd (the SD mechanism is the only difference), and kubernetes_sd_configs' shape by name.
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["gpu-operator"]}}]
    (tmp_path / "targets.yaml").write_text("[]")
    job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.yaml")]}]
    del job["kubernetes_sd_configs"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert "SUCCESS" in run(promtool, "check", "config", str(tmp_path / "prometheus.yml"))
    (tmp_path / "alertmanager.yml").write_text(files["alertmanager-route.yaml"])
    assert "SUCCESS" in run(amtool, "check-config", str(tmp_path / "alertmanager.yml"))
    route = yaml.safe_load(files["alertmanager-route.yaml"])
    [hook] = route["receivers"][1]["webhook_configs"]
    assert hook["send_resolved"] is True and hook["http_config"]["authorization"]["type"] == "Bearer"
    # where the Prometheus Operator mounts Alertmanager.spec.secrets: /etc/alertmanager/secrets/<name>/<key>
    assert hook["http_config"]["authorization"]["credentials_file"] == (
        "/etc/alertmanager/secrets/gpu-rightsizer-webhook/token"
    )
