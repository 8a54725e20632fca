"""``rightsizer backtest --prometheus`` against a real Prometheus 2.x with backfilled history.

GIVEN three hours of DCGM series (raw scrapes every 15 s, off the step grid, exporter-style labels:
``Hostname`` = exporter pod, ``instance`` = exporter pod IP, workload ``namespace``/``pod``) and
kube-state-metrics series for two single-GPU g5.xlarge nodes — node-a busy for an hour then idle, node-b
busy throughout, each running a GPU-holding server pod — backfilled with promtool,
WHEN the backtest fetches the history with chunked ``query_range`` and replays it,
THEN the scale-to-zero policy removes node-a exactly when its 30-min window is clean, the default policy and
the request-based baseline remove nothing, chunking does not change a figure, and without
kube-state-metrics the nodes named by the DCGM series are used and the output says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rightsizer.adapters.prometheus import PrometheusClient
from rightsizer.backtest import simulate as bt
from rightsizer.backtest.report import scale_to_zero_policy
from rightsizer.backtest.sources import fetch_prometheus_history
from rightsizer.cli import main
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.policy import Policy

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer, Sample

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)  # a multiple of the 5-min decision step
START, END = T0.timestamp(), (T0 + timedelta(hours=3)).timestamp()
RAW = [START - 600 + 7 + 15 * k for k in range(int((END - START + 600) / 15) + 1)]
JOB = "gpu-operator/nvidia-dcgm-exporter"
NODES = {
    "node-a": {"ip": "10.0.0.11", "exporter_ip": "10.1.9.11", "id": "i-0aaaaaaaaaaaaaaa1"},
    "node-b": {"ip": "10.0.0.12", "exporter_ip": "10.1.9.12", "id": "i-0bbbbbbbbbbbbbbb2"},
}
IDLE_FROM = START + 3600  # node-a's GPU goes idle after its first hour

Families = dict[str, list[tuple[dict[str, str], list["Sample"]]]]


def _series(value: Callable[[float], float]) -> list[Sample]:
    return [(t, value(t)) for t in RAW]


def dcgm_families(*, node_label: bool) -> Families:
    fam: Families = {}
    for name, n in NODES.items():
        labels = {
            "gpu": "0",
            "UUID": f"GPU-{name}",
            "modelName": "NVIDIA A10G",
            "Hostname": f"nvidia-dcgm-exporter-{name[-1]}x2k9",
            "instance": f"{n['exporter_ip']}:9400",
            "job": JOB,
            "namespace": "ml",
            "pod": f"srv-{name[-1]}",
            "container": "server",
        }
        if node_label:
            labels["kubernetes_node"] = name

        def util(t: float, name: str = name) -> float:
            return 0.0 if name == "node-a" and t >= IDLE_FROM else 60.0

        def fb(t: float, name: str = name) -> float:
            return 300.0 if name == "node-a" and t >= IDLE_FROM else 9000.0

        fam.setdefault("DCGM_FI_DEV_GPU_UTIL", []).append((labels, _series(util)))
        fam.setdefault("DCGM_FI_DEV_FB_USED", []).append((labels, _series(fb)))
        fam.setdefault("DCGM_FI_DEV_FB_FREE", []).append((labels, _series(lambda t, fb=fb: 22888 - fb(t))))
        fam.setdefault("DCGM_FI_DEV_POWER_USAGE", []).append(
            (labels, _series(lambda t: 27.0 + (int(t) % 3) * 0.25))
        )
        fam.setdefault("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", []).append(
            (labels, _series(lambda t: 9.8e10 + (t - RAW[0]) * 27_000.0))
        )
        fam.setdefault("up", []).append(
            ({"instance": f"{n['exporter_ip']}:9400", "job": JOB}, _series(lambda _t: 1.0))
        )
    return fam


def ksm_families() -> Families:
    fam: Families = {}
    ksm = {"job": "kube-state-metrics", "instance": "10.1.0.2:8080"}
    for name, n in NODES.items():
        one = _series(lambda _t: 1.0)
        fam.setdefault("kube_node_info", []).append(
            (
                {**ksm, "node": name, "provider_id": f"aws:///us-east-1a/{n['id']}", "internal_ip": n["ip"]},
                one,
            )
        )
        fam.setdefault("kube_node_labels", []).append(
            ({**ksm, "node": name, "label_node_kubernetes_io_instance_type": "g5.xlarge"}, one)
        )
        for metric in ("kube_node_status_capacity", "kube_node_status_allocatable"):
            fam.setdefault(metric, []).append(
                ({**ksm, "node": name, "resource": "nvidia_com_gpu", "unit": "integer"}, one)
            )
        server = f"srv-{name[-1]}"
        fam.setdefault("kube_pod_info", []).append(
            (
                {
                    **ksm,
                    "namespace": "ml",
                    "pod": server,
                    "node": name,
                    "created_by_kind": "ReplicaSet",
                    "created_by_name": f"{server}-7d9f",
                    "pod_ip": f"10.2.0.{n['ip'][-2:]}",
                },
                one,
            )
        )
        fam["kube_pod_info"].append(
            (
                {
                    **ksm,
                    "namespace": "gpu-operator",
                    "pod": f"nvidia-dcgm-exporter-{name[-1]}x2k9",
                    "node": name,
                    "created_by_kind": "DaemonSet",
                    "created_by_name": "nvidia-dcgm-exporter",
                    "pod_ip": n["exporter_ip"],
                },
                one,
            )
        )
        fam.setdefault("kube_pod_container_resource_requests", []).append(
            (
                {
                    **ksm,
                    "namespace": "ml",
                    "pod": server,
                    "container": "server",
                    "node": name,
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                one,
            )
        )
    return fam


def _source(server: PrometheusServer, **kwargs: object) -> bt.Source:
    with PrometheusClient(server.url) as client:
        return fetch_prometheus_history(
            client,
            start=T0,
            end=T0 + timedelta(hours=3),
            step=60,
            cluster="test",
            region="us-east-1",
            job=None,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
def full_server(prometheus_factory: Callable[..., PrometheusServer]) -> PrometheusServer:
    families: Mapping[str, object] = {**dcgm_families(node_label=False), **ksm_families()}
    return prometheus_factory(families)


def test_backfilled_history_prices_the_policies(full_server: PrometheusServer) -> None:
    source = _source(full_server)
    assert source.inventory == "kube-state-metrics"
    prep = bt.prepare(source.history)
    assert set(prep.tracks) == {"node-a", "node-b"}
    s2z = bt.run_policy(prep, scale_to_zero_policy(), "scale-to-zero")
    # The range point at IDLE_FROM still holds the last busy scrape; (IDLE_FROM, IDLE_FROM + 30 min] is the
    # first clean window.
    assert [(r.node, r.at) for r in s2z.log] == [("node-a", IDLE_FROM + 1800)]
    removed_for = END - (IDLE_FROM + 1800)
    assert s2z.gpu_hours_saved == pytest.approx(removed_for / 3600)
    g5 = load_catalog().get("g5.xlarge")
    assert g5 is not None and g5.hourly_usd is not None
    assert s2z.usd_saved == pytest.approx(g5.hourly_usd * removed_for / 3600)
    assert s2z.regrets == 0 and s2z.unserved_gpu_minutes == 0
    assert bt.run_policy(prep, Policy(), "default").removals == 0  # the server pod holds the GPU
    assert bt.run_request_based(prep).removals == 0
    assert s2z.share_of_oracle == pytest.approx(s2z.gpu_hours_saved / prep.oracle_gpu_hours)

    # Chunked in 50-point pieces (4 chunks for 181 points): the same history, the same figures.
    chunked = bt.prepare(_source(full_server, max_points=50).history)
    assert bt.run_policy(chunked, scale_to_zero_policy(), "s").log == s2z.log
    assert chunked.oracle_gpu_hours == pytest.approx(prep.oracle_gpu_hours)


def test_cli_backtest_prometheus_json(
    full_server: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"cluster: {{context: test}}\nprometheus: {{url: '{full_server.url}', step: 60s}}\n")
    policy = tmp_path / "s2z.yaml"
    policy.write_text("evict_idle_gpu_holders: true\nmax_nodes_per_run: 1000\n")
    code = main(
        [
            "backtest",
            "--prometheus",
            "--config",
            str(config),
            "--from",
            "2026-11-01T06:00:00Z",
            "--to",
            "2026-11-01T09:00:00Z",
            "--policy",
            str(policy),
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["inventory"] == "kube-state-metrics" and doc["source"]["basis"] == "all-signals"
    runs = {r["name"]: r for r in doc["runs"]}
    assert runs["config"]["removals"] == 0
    assert runs["s2z"]["removals"] == 1 and runs["s2z"]["regrets"] == 0
    assert runs["request-based"]["removals"] == 0


def test_without_kube_state_metrics_the_dcgm_series_name_the_nodes(
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    server = prometheus_factory(dcgm_families(node_label=True))
    source = _source(server, node_label="kubernetes_node", instance_type="g5.xlarge")
    assert source.inventory == "dcgm-series"
    assert any("nodes named by the DCGM series" in n for n in source.notes)
    prep = bt.prepare(source.history)
    assert set(prep.tracks) == {"node-a", "node-b"}
    # No pods are known, so nothing protects node-a: the default policy removes it as soon as its window
    # is clean.
    f = bt.run_policy(prep, Policy(), "default")
    assert [(r.node, r.at) for r in f.log] == [("node-a", IDLE_FROM + 1800)]
