"""GPUNodeIdle reaches the webhook under kube-prometheus-stack's defaults (docs/architecture.md §4, issue 16).

GIVEN kube-prometheus-stack's default Alertmanager configuration (``tests/fixtures/kube-prometheus-stack``)
and the AlertmanagerConfig the overlay renders, merged as the Prometheus Operator does
(``tests.support.operator_route``, ported from the operator and checked against its golden files)
THEN ``amtool config routes test`` sends the alert — with the labels of the rendered PrometheusRule — to
the rightsizer's receiver under every alertmanagerConfigMatcherStrategy, and the labels the rule had
before this package (no ``namespace``) to ``null``;
AND a real Alertmanager delivers it to a webhook with the bearer token from the Secret, while
kube-prometheus-stack's InfoInhibitor is firing in the same namespace (which silences severity=info);
AND promtool shows the rule itself does not make InfoInhibitor fire.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.binaries import require_binary
from tests.support.cluster_package import KUBE_PROMETHEUS_STACK, alert_rule, find, kustomize, plain_files
from tests.support.e2e_cluster import start_alertmanager
from tests.support.operator_route import STRATEGIES, generate, kube_prometheus_stack_config
from tests.support.promtool_test import promtool_unit_test
from tests.support.webhook_sink import WebhookSink

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube-prometheus-stack"
RECEIVER = "monitoring/gpu-rightsizer/gpu-rightsizer"
TOKEN = "route-test-token-8d1e"


def rendered() -> tuple[dict[str, Any], dict[str, str]]:
    """The overlay's AlertmanagerConfig and the labels its PrometheusRule gives a firing GPUNodeIdle."""
    docs = kustomize(KUBE_PROMETHEUS_STACK)
    amc = find(docs, "AlertmanagerConfig", "gpu-rightsizer")
    rule = alert_rule(find(docs, "PrometheusRule", "gpu-rightsizer")["spec"])
    return amc, {"alertname": rule["alert"], **rule["labels"], "node": "ip-10-0-1-17.ec2.internal"}


def secrets(url: str = "https://example.lambda-url.us-east-1.on.aws/") -> dict[tuple[str, str, str], str]:
    return {
        ("monitoring", "gpu-rightsizer-webhook", "url"): url,
        ("monitoring", "gpu-rightsizer-webhook", "token"): TOKEN,
    }


def run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def routes_test(amtool: str, config: Path, labels: dict[str, str]) -> str:
    """``amtool config routes test``: the receiver(s) an alert with ``labels`` is routed to."""
    return run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        *(f"{k}={v}" for k, v in labels.items()),
    )


# --- the port against prometheus-operator's own golden files -------------------------------------------

# pkg/alertmanager/amcfg_test.go @ 6adcebc5076c34f4f55f8f5f7b1e528929373ac7, "skeleton base, simple CR" and
# its namespaceMatcher variants; expected outputs are the goldens skeleton_base_simple_CR.golden,
# skeleton_base_simple_CR_with_namespaceMatcher_disabled.golden,
# skeleton_base_{same,diff}_namespace_simple_CR_with_namespaceMatcher_disabled_other_namespaces.golden.
_SIMPLE_CR = {
    "metadata": {"name": "myamc", "namespace": "mynamespace"},
    "spec": {"route": {"receiver": "test", "groupBy": ["job"]}, "receivers": [{"name": "test"}]},
}


def _golden(receiver: str, matchers: list[str] | None) -> dict[str, Any]:
    route: dict[str, Any] = {"receiver": receiver, "group_by": ["job"], "continue": True}
    if matchers:
        route["matchers"] = matchers
    return {
        "route": {"receiver": "null", "routes": [route]},
        "receivers": [{"name": "null"}, {"name": receiver}],
    }


@pytest.mark.parametrize(
    ("strategy", "am_namespace", "namespace", "expected"),
    [
        (
            "OnNamespace",
            "monitoring",
            "mynamespace",
            _golden("mynamespace/myamc/test", ['namespace="mynamespace"']),
        ),
        ("None", "monitoring", "mynamespace", _golden("mynamespace/myamc/test", None)),
        (
            "OnNamespaceExceptForAlertmanagerNamespace",
            "alertmanager-namespace",
            "alertmanager-namespace",
            _golden("alertmanager-namespace/myamc/test", None),
        ),
        (
            "OnNamespaceExceptForAlertmanagerNamespace",
            "alertmanager-namespace",
            "mynamespace",
            _golden("mynamespace/myamc/test", ['namespace="mynamespace"']),
        ),
    ],
)
def test_port_reproduces_the_operator_goldens(
    strategy: str, am_namespace: str, namespace: str, expected: dict[str, Any]
) -> None:
    cr = json.loads(json.dumps(_SIMPLE_CR))
    cr["metadata"]["namespace"] = namespace
    base = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    assert generate(base, [cr], {}, strategy=strategy, alertmanager_namespace=am_namespace) == expected


def test_port_refuses_fields_it_does_not_know() -> None:
    cr = json.loads(json.dumps(_SIMPLE_CR))
    cr["spec"]["route"]["activeTimeIntervals"] = ["business-hours"]
    with pytest.raises(NotImplementedError, match="activeTimeIntervals"):
        generate({"route": {"receiver": "null"}, "receivers": []}, [cr], {})


# --- amtool on the generated configuration --------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "am_namespace"),
    [(s, "monitoring") for s in STRATEGIES] + [("OnNamespaceExceptForAlertmanagerNamespace", "prometheus")],
)
def test_generated_route_sends_the_alert_to_the_webhook(
    strategy: str, am_namespace: str, tmp_path: Path
) -> None:
    amtool = require_binary("amtool")
    amc, labels = rendered()
    config = kube_prometheus_stack_config(
        [amc], secrets(), strategy=strategy, alertmanager_namespace=am_namespace
    )
    path = tmp_path / "alertmanager.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert "SUCCESS" in run(amtool, "check-config", str(path))
    assert routes_test(amtool, path, labels) == RECEIVER
    [hook] = next(r for r in config["receivers"] if r["name"] == RECEIVER)["webhook_configs"]
    assert hook["http_config"]["authorization"] == {"type": "Bearer", "credentials": TOKEN}
    assert hook["send_resolved"] is True
    # the operator's matcher is the only thing between the alert and `null`: the class of the old bug
    if 'namespace="monitoring"' in config["route"]["routes"][0].get("matchers", []):
        without_namespace = {k: v for k, v in labels.items() if k != "namespace"}
        assert routes_test(amtool, path, without_namespace) == "null"


# --- a real Alertmanager delivers, InfoInhibitor or not -------------------------------------------------


@pytest.mark.slow
def test_real_alertmanager_delivers_while_info_inhibitor_fires(
    tmp_path: Path,
) -> None:
    binary = require_binary("alertmanager")
    with WebhookSink() as webhook_sink:
        amc, labels = rendered()
        config = kube_prometheus_stack_config([amc], secrets(webhook_sink.url))
        # the generated route waits 30 s before the first notification; nothing else changes
        config["route"]["routes"][0].update({"group_wait": "0s", "group_interval": "1s"})
        path = tmp_path / "alertmanager.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        alertmanager = start_alertmanager(binary, tmp_path / "am", path)
        try:
            info_labels = {**labels, "severity": "info", "node": "ip-10-0-9-9.ec2.internal"}
            inhibitor = {"alertname": "InfoInhibitor", "namespace": "monitoring", "severity": "none"}
            api = f"{alertmanager.url}/api/v2/alerts"
            # InfoInhibitor fires first (as in a cluster, where it is always firing in a namespace with info alerts)
            httpx.post(api, json=[{"labels": inhibitor}], timeout=10).raise_for_status()
            deadline = time.monotonic() + 30
            while not httpx.get(api, timeout=10).json() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)  # the inhibitor's cache subscribes to the alert store asynchronously
            httpx.post(api, json=[{"labels": labels}, {"labels": info_labels}], timeout=10).raise_for_status()
            while labels["node"] not in webhook_sink.nodes() and time.monotonic() < deadline:
                time.sleep(0.2)
            states = {
                a["labels"].get("node", a["labels"]["alertname"]): a["status"]["state"]
                for a in httpx.get(api, timeout=10).json()
            }
            assert states == {
                "InfoInhibitor": "suppressed",  # the chart's last inhibit rule silences InfoInhibitor itself
                labels["node"]: "active",
                info_labels["node"]: "suppressed",  # the control: a severity=info GPUNodeIdle is inhibited
            }, alertmanager.log_tail()
            assert webhook_sink.nodes() == {labels["node"]}, alertmanager.log_tail()
            authorization, payload = webhook_sink.received[0]
            assert authorization == f"Bearer {TOKEN}"
            assert payload["receiver"] == RECEIVER and payload["status"] == "firing"
        finally:
            alertmanager.stop()


def test_the_rule_does_not_make_info_inhibitor_fire(tmp_path: Path) -> None:
    """kube-prometheus-stack's InfoInhibitor fires for any severity=info alert; ours must not feed it."""
    rules = plain_files()["gpu-idle-rules.yaml"]
    info = (FIXTURES / "info-inhibitor.rules.yaml").read_text()
    idle = [
        {"series": 'DCGM_FI_DEV_GPU_UTIL{node="gpu-a",gpu="0"}', "values": "0x50"},
        {"series": 'DCGM_FI_DEV_FB_USED{node="gpu-a",gpu="0"}', "values": "0x50"},
    ]

    def unit_test(rule_text: str, expected: list[dict[str, Any]]) -> str:
        files = {"gpu-idle-rules.yaml": rule_text, "info.yaml": info}
        proc = promtool_unit_test(
            tmp_path, idle, rule_files=files, alerts=[("35m", "InfoInhibitor", expected)]
        )
        return "" if proc.returncode == 0 else proc.stdout + proc.stderr

    assert unit_test(rules, []) == ""
    # the control: with severity=info (the label before this package) InfoInhibitor fires in `monitoring`
    fires = [{"exp_labels": {"namespace": "monitoring", "severity": "none"}}]
    assert unit_test(rules.replace("severity: none", "severity: info"), fires) == ""
