"""``rightsizer apply --config FILE [--execute]`` end to end, as a user runs it (a subprocess).

GIVEN EKS cluster ``prod-eks`` on moto (node group ``gpu-a10g``: min 1, desired 2, g5.2xlarge), the
Kubernetes double holding its two Nodes (providerID = the moto instances), a real Prometheus holding their
dcgm-exporter series (node A idle, node B busy; backfilled with promtool up to beyond now), the DynamoDB
state table and the checked-in test policy (``tests/e2e/policy.yaml``: 10 s idle window, ``dry_run: false``),
WHEN ``rightsizer apply`` runs without ``--execute`` THEN it records a dry run and touches nothing;
WHEN it runs with ``--execute`` THEN it cordons and drains A and terminates exactly A's instance with
``ShouldDecrementDesiredCapacity`` (desired 2 → 1), leaves B alone, writes the ledger and exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.domain.model import ANN_CORDONED_BY
from tests.support.e2e_cluster import (
    AWS_ENV,
    CLUSTER,
    TABLE,
    ExtraPod,
    GpuCluster,
    dcgm_families,
    gpu_cluster,
    wait_until,
    write_config,
)

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[GpuCluster]:
    """Two nodes: ``nodes[0]`` idle (only its exporter pod), ``nodes[1]`` busy with a training pod that
    needs most of the g5.2xlarge (so no smaller shape fits: ``busy``, not ``underutilized``)."""
    trainer = ExtraPod("trainer-7d9f5-x2kqp", 1, {"gpus": 1, "cpu": "6", "memory": "24Gi", "grace": 30})
    with gpu_cluster(tmp_path, nodes=2, extra_pods=[trainer]) as (built, _exporter):
        yield built


@pytest.fixture
def config_file(
    cluster: GpuCluster, prometheus_factory: Callable[..., PrometheusServer], tmp_path: Path
) -> Path:
    now = time.time()
    # One sample a second, as a 1 s scrape would store them, from 2 min ago to 10 min ahead: whenever the
    # subprocess plans, its 10 s window is fully covered and the newest sample is fresh.
    times = [float(int(now)) - 120 + k for k in range(720)]
    idle, busy = cluster.nodes
    families = dcgm_families([(idle, "idle"), (busy, "busy")], times)
    server = prometheus_factory(families)
    return write_config(tmp_path / "config.yaml", cluster, server.url)


def apply(config: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """Run ``rightsizer apply --config FILE --json [extra]``; (exit code, stdout JSON, stderr)."""
    return run_cli("apply", "--config", str(config), "--json", *extra)


def run_cli(*args: str) -> tuple[int, dict[str, Any], str]:
    """Run ``rightsizer ARGS`` as a user would; (exit code, stdout JSON, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "KUBECONFIG"}
    env.update(AWS_ENV)
    done = subprocess.run(
        [sys.executable, "-m", "rightsizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    try:
        document: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        document = {}
    return done.returncode, document, done.stderr


def state(cluster: GpuCluster) -> DynamoDbState:
    return DynamoDbState(cluster.dynamodb, TABLE, CLUSTER)


def test_apply_without_execute_records_a_dry_run_and_touches_nothing(
    cluster: GpuCluster, config_file: Path
) -> None:
    idle, busy = cluster.nodes
    before = {n["metadata"]["name"]: n for n in cluster.double.list_nodes()}

    code, out, err = apply(config_file)

    assert code == 0, err[-3000:]
    assert out["verdicts"] == {"busy": 1, "idle": 1}, err[-3000:]
    assert out["dry_run"] is True  # the policy allows acting; the missing --execute does not
    [(execution_id, outcome)] = out["workflows"].items()
    assert outcome["status"] == "dry_run", outcome
    assert idle.instance_id in outcome["message"] and "desired 2 -> 1" in outcome["message"]
    # THEN nothing changed: both instances in service, desired 2, no cordon, no eviction, no patch
    group = cluster.asg()
    assert group["DesiredCapacity"] == 2
    assert cluster.in_service() == {idle.instance_id, busy.instance_id}
    after = {n["metadata"]["name"]: n for n in cluster.double.list_nodes()}
    for name in (idle.name, busy.name):
        assert not after[name]["spec"].get("unschedulable")
        assert ANN_CORDONED_BY not in after[name]["metadata"].get("annotations", {})
        assert after[name]["metadata"]["resourceVersion"] == before[name]["metadata"]["resourceVersion"]
    writes = [r for r in cluster.double.requests if r.method in ("PATCH", "PUT", "DELETE")]
    assert writes == []
    assert not [r for r in cluster.double.requests if r.path.endswith("/eviction")]
    # AND the ledger says what would have been done
    [entry] = state(cluster).entries(execution_id=execution_id)
    assert (entry.node, entry.instance_id, entry.result, entry.step) == (
        idle.name,
        idle.instance_id,
        "dry_run",
        "validate",
    )
    assert state(cluster).get(idle.name) is None  # lease released


def test_apply_execute_drains_and_removes_exactly_the_idle_node(
    cluster: GpuCluster, config_file: Path
) -> None:
    idle, busy = cluster.nodes

    code, out, err = apply(config_file, "--execute")

    assert code == 0, err[-3000:]
    assert out["dry_run"] is False
    [(execution_id, outcome)] = out["workflows"].items()
    assert outcome["status"] == "succeeded", (outcome, err[-3000:])
    assert execution_id.startswith(idle.name)
    # THEN exactly the idle node's instance left the group, which shrank by one
    group = cluster.asg()
    assert group["DesiredCapacity"] == 1
    assert group["MinSize"] == 1
    assert cluster.in_service() == {busy.instance_id}
    assert cluster.instance_state(idle.instance_id) in ("shutting-down", "terminated")
    assert cluster.instance_state(busy.instance_id) == "running"
    # AND the busy node was never written to
    busy_node = cluster.node(busy.name)
    assert busy_node is not None and not busy_node["spec"].get("unschedulable")
    assert not [r for r in cluster.double.requests if r.method == "PATCH" and r.path.endswith(busy.name)]
    # AND the idle node was found idle, then cordoned by this execution before its instance went (Events
    # tell the story: the assessment's verdict change first, then the drain's)
    reasons = [e["reason"] for e in cluster.double.events(involved_name=idle.name)]
    assert reasons == ["GPUIdle", "CordonedIdle", "ScaledIn"], reasons
    # AND the Node follows its instance away (the node lifecycle controller's job on EKS)
    wait_until(lambda: cluster.node(idle.name) is None, 30, "the idle Node to go with its instance")
    # AND the ledger holds the outcome with its savings (g5.2xlarge, us-east-1: 1.212 USD/h)
    entries = state(cluster).entries(execution_id=execution_id)
    final = entries[-1]
    assert (final.node, final.instance_id, final.step, final.result) == (
        idle.name,
        idle.instance_id,
        "verify",
        "applied",
    )
    assert final.hourly_savings_usd == pytest.approx(1.212)
    assert final.monthly_savings_usd == pytest.approx(1.212 * 730)
    assert state(cluster).get(idle.name) is None
    # AND `rightsizer savings` reads the realized saving back: the hours since removal x 1.212 USD/h
    code, report, err = run_cli("savings", "--config", str(config_file), "--json")
    assert code == 0, err[-3000:]
    [day] = report["days"]
    assert day["node_group"] == final.node_group and day["removals"] == 1
    hours_since = (datetime.fromisoformat(report["at"]) - final.at).total_seconds() / 3600
    assert day["instance_hours"] == pytest.approx(hours_since, abs=1e-6)
    assert day["usd"] == pytest.approx(hours_since * 1.212, abs=1e-6)
