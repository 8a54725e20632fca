"""``rightsizer snapshot`` and ``rightsizer plan --config`` against real servers.

The Kubernetes API double (HTTP), a moto server (EKS, Auto Scaling, EC2) and a real Prometheus 2.x with
backfilled DCGM series (``tests/support/prometheus_server.py``). The end-to-end test checks the contract
that makes snapshots useful: ``snapshot`` + ``plan --snapshot`` decides exactly like ``plan --config`` on
the same data (the live plan aggregates in Prometheus with ``collect_live``; the snapshot records
``query_range`` matrices and interprets them offline).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter
from rightsizer.cli import main
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.health import xid_queries
from rightsizer.services.snapshot import METRICS, ObserveRequest, metric_queries, observe
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
from tests.builders import AT, STEP, WINDOW, gpu_node, rfc
from tests.support.planted_cluster import (
    END,
    JOB,
    NODES,
    dcgm_families,
    node_ip,
    run,
    seed_cluster,
    snapshot_and_plans,
    static_tokens,
    write_config,
)
from tests.support.pricing_double import PricingDouble

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

# Re-exported for the tests that import them from here (the set-up lives in tests/support/planted_cluster.py).
__all__ = ["JOB", "NODES", "dcgm_families", "node_ip", "seed_cluster", "static_tokens", "write_config"]

# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=7, resource_api_versions=None) as d:
        yield d


@pytest.fixture
def prometheus(prometheus_factory: Any) -> PrometheusServer:
    server: PrometheusServer = prometheus_factory(dcgm_families())
    return server


# ---------------------------------------------------------------------------------------- end to end


def test_snapshot_then_plan_reproduces_the_live_plan(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus: PrometheusServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN a cluster on the double whose nodes are the moto node group's instances, and DCGM history
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    prices = PricingDouble().start()  # the region's prices, read while snapshotting, must replay offline
    request.addfinalizer(prices.stop)
    config = write_config(
        tmp_path,
        double,
        moto_server,
        prometheus.url,
        gpu_cluster.cluster,
        pricing_endpoint_url=prices.endpoint_url,
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_nodes_per_run: 10\nmax_nodes_per_node_group: 10\ncooldown: 0s\n", encoding="utf-8")
    out = tmp_path / "snap"

    # WHEN the cluster is snapshotted, planned from the snapshot, and planned live, all at AT
    from_snapshot, live = snapshot_and_plans(config, policy, out, capsys)

    # THEN both plans are the same document
    snap_doc, live_doc = json.loads(from_snapshot), json.loads(live)
    assert live_doc == snap_doc

    # AND the equality is not vacuous: inventory, metrics and verdicts all made it through
    rows = {n["node"]: n for n in live_doc["nodes"]}
    assert set(rows) == set(NODES)
    ids = gpu_cluster.nodegroups["gpu-a10g"].instance_ids
    assert [rows[name]["instance_id"] for name in NODES] == list(ids)
    assert {r["node_group"] for r in rows.values()} == {"gpu-a10g"}
    assert rows["gpu-idle-2"]["verdict"] == "idle", rows["gpu-idle-2"]
    assert rows["gpu-busy"]["gpu_activity_max_pct"] == 85.0
    assert rows["gpu-busy"]["fb_used_max_mib"] == 15000.0
    assert rows["gpu-busy"]["verdict"] != "idle"
    assert rows["gpu-busy"]["coverage"] == 1.0
    assert any(a["kind"] == "scale_in" and a["node"] == "gpu-idle-2" for a in live_doc["actions"])

    # AND the directory is the docs/architecture.md §5 layout
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert names == sorted(
        [
            "snapshot.json",
            "nodes.json",
            "pods.json",
            "pdbs.json",
            "persistentvolumeclaims.json",
            "persistentvolumes.json",
            "nodegroups.json",
            "instances.json",
            "xid.json",
            "workloads.json",
            *(p for p in metric_queries()),
        ]
    )
    meta = json.loads((out / "snapshot.json").read_text())
    assert meta == {
        "taken_at": rfc(AT),
        "window_seconds": WINDOW,
        "step_seconds": STEP,
        "cluster": gpu_cluster.cluster,
        "region": "us-east-1",
        "metrics_format": 2,
    }
    nodes = json.loads((out / "nodes.json").read_text())
    assert (nodes["kind"], nodes["apiVersion"]) == ("List", "v1")
    util = json.loads((out / "metrics/DCGM_FI_DEV_GPU_UTIL.json").read_text())
    assert util["status"] == "success" and util["data"]["resultType"] == "matrix"
    assert len(util["data"]["result"][0]["values"]) == WINDOW // STEP
    assert util["data"]["result"][0]["values"][-1][0] == END  # (at − W, at]: right end included
    assert not (out / "resourceclaims.json").exists()  # DRA not served
    assert load_snapshot(out).inventory.known
    book = json.loads((out / "instances.json").read_text())["OnDemandPrices"]
    assert (book["Region"], book["Source"], book["UsdPerHour"]["g5.2xlarge"]) == (
        "us-east-1",
        "pricing_api",
        1.212,
    )
    assert prices.requests, "the snapshot asked the Price List Query API"


def test_snapshot_keeps_only_the_env_the_decision_reads_and_drops_managed_fields(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus: PrometheusServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, prometheus.url, gpu_cluster.cluster)
    out = tmp_path / "snap"

    code, _, err = run(["snapshot", "--config", str(config), "--out", str(out), "--at", rfc(AT)], capsys)
    assert code == 0, err

    pods = {p["metadata"]["name"]: p for p in json.loads((out / "pods.json").read_text())["items"]}
    # Only NVIDIA_VISIBLE_DEVICES is read (domain.pods.gpu_use_outside_requests): the rest is not written.
    assert pods["trainer-0"]["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    ]
    assert pods["trainer-0"]["spec"]["initContainers"][0]["env"] == []
    everything = "".join(p.read_text() for p in out.rglob("*.json"))
    assert "s3cr3t" not in everything
    assert "managedFields" not in everything
    assert not [r for r in double.requests if "secrets" in r.path]  # Secrets are never read


def test_dra_objects_are_written_only_when_served(
    tmp_path: Path, double: KubernetesDouble, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a cluster serving resource.k8s.io v1beta1 (no AWS inventory, no metrics needed)
    double.set_resource_api_versions(["v1beta1"])
    double.add_node(gpu_node("gpu-0", instance_type="g5.2xlarge", gpus=1))
    reader = KubernetesCluster.for_eks(double.base_url, static_tokens(), page_size=2)
    request = ObserveRequest(at=AT, window_seconds=WINDOW, step_seconds=STEP, cluster="c", region="us-east-1")

    observation = observe(reader, None, _NoMetrics(), request)

    assert observation.documents["resourceclaims.json"]["items"] == []
    assert observation.documents["resourceslices.json"]["kind"] == "List"
    double.set_resource_api_versions(None)
    reader = KubernetesCluster.for_eks(double.base_url, static_tokens())
    assert "resourceclaims.json" not in observe(reader, None, _NoMetrics(), request).documents


# -------------------------------------------------------------------------------------- atomic write


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    # GIVEN a snapshot being written whose last document cannot be serialized
    out = tmp_path / "snap"

    # WHEN writing fails part-way THEN neither the directory nor a staging directory remains
    with pytest.raises(TypeError), SnapshotDirectoryWriter(out) as writer:
        writer.begin("nodes.json")
        writer.add("nodes.json", gpu_node("gpu-0", instance_type="g5.2xlarge", gpus=1))
        writer.put("snapshot.json", {"taken_at": rfc(AT)})
        writer.put("zz/last.json", {1j: 1})
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_a_non_empty_target_and_replaces_an_empty_one(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--out"):
        SnapshotDirectoryWriter(taken)
    assert (taken / "keep.txt").read_text() == "mine"

    empty = tmp_path / "empty"
    empty.mkdir()
    with SnapshotDirectoryWriter(empty) as writer:
        writer.put("snapshot.json", {})
        writer.put("metrics/up.json", b'{"status":"success","stats":{"secret":1}}')
        writer.commit()
    assert sorted(p.name for p in empty.rglob("*.json")) == ["snapshot.json", "up.json"]
    assert json.loads((empty / "metrics/up.json").read_text()) == {"status": "success"}  # projected


def test_a_failing_source_writes_no_directory(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN Prometheus is unreachable (nothing listens on the configured URL)
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, "http://127.0.0.1:9", gpu_cluster.cluster)
    out = tmp_path / "snap"

    code, _, err = run(["snapshot", "--config", str(config), "--out", str(out), "--at", rfc(AT)], capsys)

    assert code == 1, err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".snap")]


# ------------------------------------------------------------------------------- fail closed, exit 2


def test_denied_read_permission_fails_closed_naming_identity_and_verb(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    double.deny("list", "pods")
    config = write_config(tmp_path, double, moto_server, "http://127.0.0.1:9", gpu_cluster.cluster)
    out = tmp_path / "snap"

    code, stdout, err = run(["snapshot", "--config", str(config), "--out", str(out)], capsys)
    assert code == 1
    assert "kubeconfig context double (user rightsizer) may not list pods" in err
    assert not out.exists()
    assert not [r for r in double.requests if r.path == "/api/v1/nodes"]  # nothing read before preflight

    code, stdout, err = run(["plan", "--config", str(config), "--json"], capsys)
    assert code == 1 and stdout == ""
    assert "may not list pods" in err


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("cluster:\n  name: c\nprometheus:\n  urll: http://x\n", "prometheus.urll"),
        (
            "cluster:\n  name: c\nprometheus:\n  step: 2h\n",
            "policy.idle_window: 1800 s is shorter than prometheus.step",
        ),
        ("prometheus:\n  url: http://x\n", "cluster"),
    ],
)
def test_bad_config_exits_2_naming_file_and_key(
    tmp_path: Path, body: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(body, encoding="utf-8")
    for argv in (
        ["snapshot", "--config", str(config), "--out", str(tmp_path / "o")],
        ["plan", "--config", str(config)],
    ):
        code, stdout, err = run(argv, capsys)
        assert code == 2, err
        assert str(config) in err and key in err
        assert stdout == ""
    assert not (tmp_path / "o").exists()


def test_snapshot_and_config_are_mutually_exclusive_for_plan(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["plan", "--snapshot", "a", "--config", "b"])
    assert caught.value.code == 2


# ------------------------------------------------------------------------------------------- helpers


class _NoMetrics:
    """A metrics port that answers every query with an empty matrix."""

    def query_range_raw(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        xid = [q.expr(int(step), WINDOW) for q in xid_queries().values()]
        assert expr in [*metric_queries(step_seconds=int(step), window_seconds=WINDOW).values(), *xid]
        return {"status": "success", "data": {"resultType": "matrix", "result": []}}


def test_metric_queries_filter_by_job_and_cover_the_contract() -> None:
    queries = metric_queries('gpu "ops"', step_seconds=60, window_seconds=1800)
    assert queries["metrics/up.json"] == 'max_over_time(up{job="gpu \\"ops\\""}[60s])'
    assert (
        queries["metrics/DCGM_FI_DEV_GPU_UTIL.timestamp.json"]
        == 'timestamp(DCGM_FI_DEV_GPU_UTIL{job="gpu \\"ops\\""})'
    )
    assert (
        queries["metrics/DCGM_FI_DEV_GPU_UTIL.nonfinite.json"]
        == '(sum_over_time(DCGM_FI_DEV_GPU_UTIL{job="gpu \\"ops\\""}[1800s]) * 0) != 0'
    )
    assert queries["metrics/DCGM_FI_DEV_FB_FREE.avg.json"] == (
        'avg_over_time(DCGM_FI_DEV_FB_FREE{job="gpu \\"ops\\""}[1800s])'
    )
    assert (
        queries["metrics/DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION.stddev.json"]
        == 'stddev_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{job="gpu \\"ops\\""}[1800s])'
    )
    assert queries["metrics/DCGM_FI_DEV_FB_USED.json"] == (
        'max_over_time(DCGM_FI_DEV_FB_USED{job="gpu \\"ops\\""}[1800s])'
    )
    assert len(queries) == 14
    assert {p.split("/")[1].split(".")[0] for p in queries} == set(METRICS)
