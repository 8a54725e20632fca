"""The shipped kube-prometheus-stack pieces, end to end, with the GPU Operator's default labels (issue 16).

GIVEN a dcgm-exporter endpoint labelled as the GPU Operator's own ServiceMonitor leaves its series — no
``node``; ``namespace``/``pod`` name the exporter pod, ``Hostname`` is the exporter pod's name — for an idle
node and a busy node, plus one series no pod explains, and kube-state-metrics' ``kube_pod_info`` for the
exporter pods
AND a real Prometheus (Debian) evaluating the PrometheusRule the kube-prometheus-stack overlay renders
(its ``for`` set to 3 s, the idle window being a parameter of the shipped rule)
AND a real Alertmanager running the configuration the Prometheus Operator generates from
kube-prometheus-stack's default configuration and the overlay's AlertmanagerConfig (default matcher
strategy OnNamespace; URL and bearer token from the Secret the README creates)
THEN the webhook receives GPUNodeIdle for the idle node only — named by its Kubernetes node, with the
bearer token — and never an alert without a node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.binaries import require_binary
from tests.support.cluster_package import KUBE_PROMETHEUS_STACK, find, kustomize, rules_with_window
from tests.support.e2e_cluster import free_port, start_alertmanager, start_scraping_prometheus, wait_until
from tests.support.operator_route import kube_prometheus_stack_config
from tests.support.webhook_sink import WebhookSink

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "kps-chain-token-41c2"
EXPORTER_NS = "gpu-operator"
#: node -> (exporter pod, exporter pod IP, GPU_UTIL %, FB_USED MiB)
NODES = {
    "ip-10-0-1-17.ec2.internal": ("nvidia-dcgm-exporter-7xk2p", "10.0.1.40", 0, 312),
    "ip-10-0-2-33.ec2.internal": ("nvidia-dcgm-exporter-q9w4z", "10.0.2.51", 91, 19456),
}
IDLE_NODE = "ip-10-0-1-17.ec2.internal"


def exposition() -> str:
    """What Prometheus stores from the GPU Operator's exporters and kube-state-metrics, as one text."""
    lines = [
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        "# TYPE kube_pod_info gauge",
    ]
    for node, (pod, ip, util, fb) in NODES.items():
        labels = (
            f'gpu="0",UUID="GPU-{pod[-5:]}",device="nvidia0",modelName="NVIDIA A10G",Hostname="{pod}",'
            f'namespace="{EXPORTER_NS}",pod="{pod}",service="nvidia-dcgm-exporter",container="nvidia-dcgm-exporter"'
        )
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}", f"DCGM_FI_DEV_FB_USED{{{labels}}} {fb}"]
        lines.append(
            f'kube_pod_info{{namespace="{EXPORTER_NS}",pod="{pod}",node="{node}",pod_ip="{ip}",'
            f'created_by_kind="DaemonSet",created_by_name="nvidia-dcgm-exporter",uid="uid-{pod[-5:]}"}} 1'
        )
    # idle, but no pod and no node explain it (a static scrape of a host engine): never alerted
    orphan = 'gpu="0",UUID="GPU-orphan",Hostname="localhost"'
    lines += [f"DCGM_FI_DEV_GPU_UTIL{{{orphan}}} 0", f"DCGM_FI_DEV_FB_USED{{{orphan}}} 0"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporter() -> Iterator[str]:
    body = exposition().encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_idle_node_reaches_the_webhook_with_the_shipped_files(exporter: str, tmp_path: Path) -> None:
    prometheus_bin, alertmanager_bin = require_binary("prometheus"), require_binary("alertmanager")
    with WebhookSink() as webhook_sink:
        docs = kustomize(KUBE_PROMETHEUS_STACK)
        rule = find(docs, "PrometheusRule", "gpu-rightsizer")
        amc = find(docs, "AlertmanagerConfig", "gpu-rightsizer")
        rules = tmp_path / "rules.yaml"
        rules.write_text(rules_with_window(yaml.safe_dump(rule["spec"]), "3s"))
        secrets = {("monitoring", "gpu-rightsizer-webhook", "url"): webhook_sink.url}
        secrets[("monitoring", "gpu-rightsizer-webhook", "token")] = TOKEN
        config = kube_prometheus_stack_config([amc], secrets)
        # the shipped route waits 30 s before its first notification; only the waits change here
        config["route"]["routes"][0].update({"group_wait": "0s", "group_interval": "1s"})
        am_config = tmp_path / "alertmanager.yaml"
        am_config.write_text(yaml.safe_dump(config, sort_keys=False))
        alertmanager = start_alertmanager(alertmanager_bin, tmp_path / "am", am_config)
        try:
            (tmp_path / "prom").mkdir()
            prometheus = start_scraping_prometheus(
                prometheus_bin,
                tmp_path / "prom",
                port=free_port(),
                target=exporter,
                rules=rules,
                alertmanager=alertmanager.url.removeprefix("http://"),
            )
            try:
                wait_until(
                    lambda: IDLE_NODE in webhook_sink.nodes(),
                    90,
                    "GPUNodeIdle for the idle node at the webhook",
                    describe=lambda: (
                        f"{webhook_sink.received}\n{prometheus.log_tail()}\n{alertmanager.log_tail()}"
                    ),
                )
                time.sleep(4)  # room for a wrong delivery (the busy node, an empty node name)
            finally:
                prometheus.stop()
        finally:
            alertmanager.stop()
        assert webhook_sink.nodes() == {IDLE_NODE}
        for authorization, alert in webhook_sink.alerts():
            assert authorization == f"Bearer {TOKEN}"
            assert alert["labels"]["alertname"] == "GPUNodeIdle"
            assert alert["labels"]["namespace"] == "monitoring"
        assert {p["receiver"] for _, p in webhook_sink.received} == {
            "monitoring/gpu-rightsizer/gpu-rightsizer"
        }
