"""The shipped scrape relabeling gives every dcgm-exporter series its Kubernetes node (issue 16, BUG-01).

GIVEN a local dcgm-exporter endpoint whose series carry only dcgm-exporter's own labels (``Hostname`` is
the exporter pod's name) and service-discovery targets carrying the ``__meta_kubernetes_*`` labels
Kubernetes pod discovery sets — the exporter pod on node ``ip-10-0-1-17.ec2.internal`` and, on the same
address, a pod of another app
WHEN a real Prometheus scrapes them with (a) the plain overlay's ``scrape-dcgm-exporter.yaml`` job and
(b) the kube-prometheus-stack overlay's ServiceMonitor relabelings (as the operator writes them into the
scrape config)
THEN every DCGM series carries ``node="ip-10-0-1-17.ec2.internal"`` and (a) keeps only the exporter pod.

Debian builds Prometheus without Kubernetes discovery, so the targets come from ``file_sd`` with the same
``__meta_kubernetes_*`` labels; the relabeling, which is what is under test, runs unchanged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.binaries import require_binary
from tests.support.cluster_package import KUBE_PROMETHEUS_STACK, find, kustomize, plain_files
from tests.support.e2e_cluster import DcgmExporter, GpuNode, free_port, start_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "ip-10-0-1-17.ec2.internal"
EXPORTER_POD = "nvidia-dcgm-exporter-7xk2p"


def targets(address: str) -> list[dict[str, Any]]:
    """Two pod targets on ``address`` as Kubernetes pod discovery labels them."""

    def pod(name: str, app: str, port_name: str) -> dict[str, Any]:
        return {
            "targets": [address],
            "labels": {
                "__meta_kubernetes_namespace": "gpu-operator",
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_node_name": NODE,
                "__meta_kubernetes_pod_label_app": app,
                "__meta_kubernetes_pod_container_port_name": port_name,
            },
        }

    return [
        pod(EXPORTER_POD, "nvidia-dcgm-exporter", "metrics"),
        pod("gpu-feature-discovery-x", "gfd", "metrics"),
    ]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def service_monitor_relabel_configs() -> list[dict[str, Any]]:
    """The rendered ServiceMonitor's endpoint ``relabelings`` in prometheus.yml spelling (the operator
    copies them into the job's ``relabel_configs`` after its own)."""
    monitor = find(kustomize(KUBE_PROMETHEUS_STACK), "ServiceMonitor", "nvidia-dcgm-exporter-node")
    [endpoint] = monitor["spec"]["endpoints"]
    return [{_snake(k): v for k, v in r.items()} for r in endpoint["relabelings"]]


def scrape_and_query(tmp_path: Path, job: dict[str, Any], address: str) -> list[dict[str, Any]]:
    """Run Prometheus with ``job`` (file_sd over :func:`targets`) until DCGM_FI_DEV_GPU_UTIL is stored;
    every series of that name it then has."""
    binary = require_binary("prometheus")
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump(targets(address)))
    job = {**job, "scrape_interval": "1s", "scrape_timeout": "1s"}
    job.pop("kubernetes_sd_configs", None)
    job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.yaml")], "refresh_interval": "1s"}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    port = free_port()
    argv = [
        binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    prometheus = start_process("prometheus", argv, port, tmp_path / "prometheus.log")
    try:
        deadline = time.monotonic() + 30
        while True:
            answer = httpx.post(
                f"{prometheus.url}/api/v1/query", data={"query": "DCGM_FI_DEV_GPU_UTIL"}, timeout=5
            ).json()
            result: list[dict[str, Any]] = answer["data"]["result"]
            if result or time.monotonic() > deadline:
                time.sleep(2)  # the second target, if kept, is scraped by now too
                answer = httpx.post(
                    f"{prometheus.url}/api/v1/query", data={"query": "DCGM_FI_DEV_GPU_UTIL"}, timeout=5
                ).json()
                series: list[dict[str, Any]] = answer["data"]["result"]
                assert series, prometheus.log_tail()
                return series
            time.sleep(0.3)
    finally:
        prometheus.stop()


@pytest.fixture
def exporter_address() -> Iterator[str]:
    bare = GpuNode(NODE, "i-0abc", "10.0.1.17", EXPORTER_POD, "10.0.1.40", "GPU-a0", relabelled=False)
    exporter = DcgmExporter([bare], {NODE: "idle"}).start()
    yield exporter.target
    exporter.stop()


def test_plain_scrape_job_adds_node_and_keeps_only_the_exporter(
    exporter_address: str, tmp_path: Path
) -> None:
    [job] = yaml.safe_load(plain_files()["scrape-dcgm-exporter.yaml"])["scrape_configs"]
    series = scrape_and_query(tmp_path, job, exporter_address)
    assert [s["metric"]["node"] for s in series] == [NODE]
    assert {s["metric"]["pod"] for s in series} == {EXPORTER_POD}
    assert series[0]["metric"]["Hostname"] == EXPORTER_POD  # dcgm-exporter's own label, not the node


def test_service_monitor_relabelings_add_node(exporter_address: str, tmp_path: Path) -> None:
    job = {"job_name": "serviceMonitor/monitoring/nvidia-dcgm-exporter-node/0"}
    job["relabel_configs"] = service_monitor_relabel_configs()
    series = scrape_and_query(tmp_path, job, exporter_address)
    assert series and {s["metric"]["node"] for s in series} == {NODE}
