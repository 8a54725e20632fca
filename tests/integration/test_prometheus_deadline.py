"""Loud failure against the real Prometheus (issue 27 item 1).

Before: the client sent ``timeout=<budget>s`` with a fraction (``29.667s``) whenever the cycle deadline cut a
query's timeout short; Prometheus answers that with 400 ``bad_data`` ("cannot parse … to a valid
duration"), so with ``timeout`` = ``deadline`` every query after the first failed, every node came out
``unknown`` and ``plan`` exited 0. Now every duration is whole seconds or milliseconds, and an assessment
whose queries mostly failed fails: exit 1 with one line naming how many queries failed and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.builders import AT, rfc
from tests.support.planted_cluster import dcgm_families, run, seed_cluster, write_config

if TYPE_CHECKING:
    from rightsizer.testing.k8s import KubernetesDouble
    from rightsizer.testing.moto_eks import BuiltCluster, MotoServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration


@pytest.fixture
def double() -> Any:
    from rightsizer.testing.k8s import KubernetesDouble

    with KubernetesDouble(seed=7, resource_api_versions=None) as d:
        yield d


def config_with(path: Path, timeout: str, deadline: str) -> Path:
    text = path.read_text(encoding="utf-8").replace(
        "prometheus:\n", f"prometheus:\n  timeout: {timeout}\n  deadline: {deadline}\n", 1
    )
    path.write_text(text, encoding="utf-8")
    return path


def test_a_timeout_equal_to_the_deadline_reads_every_metric_from_real_prometheus(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus_factory: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN the real Prometheus 2.x holding the planted cluster's DCGM series, timeout == deadline
    server = prometheus_factory(dcgm_families())
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, server.url, gpu_cluster.cluster)
    config_with(config, "60s", "60s")

    # WHEN the live plan runs: every request's timeout is what is left of the deadline (a fraction)
    code, out, err = run(["plan", "--config", str(config), "--at", rfc(AT), "--json"], capsys)

    # THEN Prometheus accepted every query: no metric is a problem on any node
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    assert nodes
    reasons = [r for n in nodes for r in n["reasons"]]
    assert not [r for r in reasons if r.startswith("partial_response")], reasons
    assert "cannot parse" not in err


def test_a_prometheus_refusing_most_queries_fails_the_plan_in_one_line(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus_factory: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN a real Prometheus that refuses every query loading more than one sample (422 execution)
    server = prometheus_factory(dcgm_families(), extra_args=["--query.max-samples=1"])
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, server.url, gpu_cluster.cluster)

    # WHEN the live plan runs
    code, out, err = run(["plan", "--config", str(config), "--at", rfc(AT), "--json"], capsys)

    # THEN it fails (exit 1) with one line saying how many queries failed and Prometheus' own reason,
    # and prints no plan of unknown nodes
    assert code == 1, err
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("rightsizer: failed: "), err
    assert " of 14 Prometheus queries failed, first metrics/" in last
    assert "too many samples" in last
    assert "Traceback" not in err
