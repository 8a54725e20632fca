"""``rightsizer backtest --snapshot-series`` replays metrics format 2 snapshots (issue 11).

GIVEN three snapshots that ``rightsizer snapshot`` wrote five minutes apart (format 2: facts over each
snapshot's own idle window) of a cluster on the Kubernetes double, moto and a real Prometheus with
backfilled DCGM series, and the live plan (``plan --config``) at each of those instants,
WHEN the series is replayed,
THEN the replay decides at each snapshot's instant, and every node it still has gets exactly the live
verdict and reasons (at the first snapshot, before any simulated removal, the whole plan is the live one),
AND the idle node the first decision removes is gone from the later ones, and the CLI reports the removal.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.backtest.model import SimModel
from rightsizer.backtest.simulate import prepare, run_policy
from rightsizer.backtest.snapshot_series import read_snapshot_series
from rightsizer.cli import read_policy_file
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.plan import Plan
from rightsizer.domain.policy import Policy
from tests.builders import AT, rfc
from tests.integration.test_snapshot_cli import double, prometheus, run, seed_cluster, write_config

if TYPE_CHECKING:
    from rightsizer.testing.k8s import KubernetesDouble
    from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration
__all__ = ["double", "prometheus"]  # fixtures shared with test_snapshot_cli

TIMES = [AT - timedelta(minutes=10), AT - timedelta(minutes=5), AT]


def test_a_format_2_series_replays_to_the_live_verdicts_at_each_snapshot(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    gpu_cluster: BuiltCluster,
    prometheus: PrometheusServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    config = write_config(tmp_path, double, moto_server, prometheus.url, gpu_cluster.cluster)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "max_nodes_per_run: 10\nmax_nodes_per_node_group: 10\ncooldown: 0s\n", encoding="utf-8"
    )
    series = tmp_path / "snaps"
    live: dict[float, dict[str, Any]] = {}
    for t in TIMES:
        code, _, err = run(
            ["snapshot", "--config", str(config), "--out", str(series / rfc(t)), "--at", rfc(t)], capsys
        )
        assert code == 0, err
        code, out, err = run(
            ["plan", "--config", str(config), "--policy", str(policy_file), "--at", rfc(t), "--json"], capsys
        )
        assert code == 0, err
        live[t.timestamp()] = json.loads(out)

    # WHEN the series is replayed with the same policy
    source = read_snapshot_series(series)
    assert len(source.history.recorded) == 3
    plans: dict[float, Plan] = {}
    figures = run_policy(
        prepare(source.history, SimModel(step=300)),
        read_policy_file(str(policy_file)),
        "policy",
        on_plan=lambda at, p: plans.__setitem__(at, p),
    )

    # THEN it decided at each snapshot's instant
    assert sorted(plans) == sorted(live)
    first = min(plans)
    replay = plans[first].to_json_dict()
    assert replay["nodes"] == live[first]["nodes"]  # before any removal: the live plan, row for row
    assert replay["actions"] == live[first]["actions"]
    removed = {a.node for a in plans[first].actions if a.kind == "scale_in"}
    assert "gpu-idle-2" in removed
    verdicts = {n["node"]: n["verdict"] for n in live[first]["nodes"]}
    assert verdicts["gpu-busy"] != "idle" and verdicts["gpu-idle-2"] == "idle"
    # AND later decisions judge the nodes still there on the same facts as the live plan; removed ones are
    # gone, and the only difference is the one the simulated removal makes: the group is smaller
    for at in sorted(plans)[1:]:
        replayed = {n["node"]: _facts(n) for n in plans[at].to_json_dict()["nodes"]}
        assert not removed & set(replayed)
        expected = {n["node"]: _facts(n) for n in live[at]["nodes"] if n["node"] in replayed}
        assert set(expected) == set(replayed) and replayed == expected
    assert {r.node for r in figures.log} == removed

    # AND a policy with another idle window is refused: the snapshots' facts cover their own window only
    with pytest.raises(ConfigError) as refused:
        run_policy(prepare(source.history), Policy(idle_window=3600), "longer")
    assert refused.value.field == "idle_window"

    # AND the CLI replays the same series and reports the removal
    code, out, err = run(
        ["backtest", "--snapshot-series", str(series), "--policy", str(policy_file), "--json"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    assert any("metrics format 2" in note for note in doc["source"]["notes"])
    runs = {r["name"]: r for r in doc["runs"] if r["kind"] == "policy"}
    assert runs and all(r["removals"] == len(removed) for r in runs.values()), runs


def _facts(row: dict[str, Any]) -> dict[str, Any]:
    """A plan row without the reasons a simulated removal adds (the node group at its minimum size)."""
    kept = [r for r in row["reasons"] if not r.startswith("node_group_at_min_size:")]
    return {**row, "reasons": kept}
