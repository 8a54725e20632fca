"""Plan and act agree through the CLI (issue 25): what ``plan`` lists as executable, ``apply --execute`` does.

GIVEN EKS cluster ``prod-eks`` on moto (node group ``gpu-a10g``, seven g5.2xlarge nodes, min 1), the
Kubernetes double holding their Nodes, a real Prometheus holding their dcgm-exporter series (every node
idle), and on five of the nodes one protection each — a ``hostPath`` volume, a local PersistentVolume, a
PodDisruptionBudget allowing no disruption, a bare pod, a ``karpenter.sh/do-not-disrupt`` pod — the other
two unprotected controls, with a budget of 10 nodes per run (``allow_replace_node_group: true``),
WHEN ``rightsizer plan --config`` runs and then ``rightsizer apply --config --execute``,
THEN the plan lists exactly the controls' ``scale_in`` (protected nodes get no executable action and no
executable savings), every executable action of the plan completes (``succeeded``, never ``abandoned``),
the protected nodes are never cordoned, and no node group is created (``CreateNodegroup`` never called).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rightsizer.domain.model import ANN_CORDONED_BY
from tests.builders import claim_volume, pdb, pv, pvc
from tests.integration.test_apply import run_cli
from tests.support.e2e_cluster import (
    CLUSTER,
    POLICY_FILE,
    ExtraPod,
    GpuCluster,
    dcgm_families,
    gpu_cluster,
    write_config,
)

if TYPE_CHECKING:
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = {"cpu": "100m", "memory": "128Mi", "grace": 0}
#: node index -> the protection its pod carries (the reason code the plan gives it); 5 and 6 are controls.
PROTECTED = {
    0: ("host_path", "local_storage"),
    1: ("local_pv", "local_storage"),
    2: ("pdb", "pdb_blocks"),
    3: ("bare_pod", "bare_pod"),
    4: ("do_not_disrupt", "do_not_disrupt"),
}
CONTROLS = (5, 6)


def extra_pods() -> list[ExtraPod]:
    pods = [
        ExtraPod("cache-0", 0, {**SMALL, "volumes": [{"name": "c", "hostPath": {"path": "/var/cache"}}]}),
        ExtraPod("db-0", 1, {**SMALL, "volumes": [claim_volume("db-data")]}),
        ExtraPod("api-0", 2, {**SMALL, "labels": {"app": "api"}}),
        ExtraPod("debug-0", 3, {**SMALL, "owner": None}),
        ExtraPod("job-0", 4, {**SMALL, "annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    ]
    pods += [ExtraPod(f"web-{i}", i, SMALL) for i in CONTROLS]
    return pods


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[GpuCluster]:
    with gpu_cluster(tmp_path, nodes=7, extra_pods=extra_pods(), sizes=(1, 10)) as (built, _exporter):
        node = built.nodes[1].name
        built.double.add_pvc(pvc("db-data", "pv-local"))
        built.double.add_pv(
            pv("pv-local", local_path="/mnt/nvme", affinity={"kubernetes.io/hostname": [node]})
        )
        built.double.add_pdb(pdb("api", "default", {"app": "api"}, 0))
        yield built


@pytest.fixture
def config_file(
    cluster: GpuCluster, prometheus_factory: Callable[..., PrometheusServer], tmp_path: Path
) -> Path:
    now = time.time()
    times = [float(int(now)) - 120 + k for k in range(720)]
    server = prometheus_factory(dcgm_families([(n, "idle") for n in cluster.nodes], times))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY_FILE.read_text(encoding="utf-8")
        + "max_nodes_per_run: 10\nmax_nodes_per_node_group: 10\nallow_replace_node_group: true\n",
        encoding="utf-8",
    )
    return write_config(tmp_path / "config.yaml", cluster, server.url, policy=policy)


def test_every_executable_action_the_plan_lists_completes_and_protected_nodes_get_none(
    cluster: GpuCluster, config_file: Path
) -> None:
    code, planned, err = run_cli("plan", "--config", str(config_file), "--json")
    assert code == 0, err[-3000:]
    executable = [a for a in planned["actions"] if a["kind"] != "recommend"]
    names = [n.name for n in cluster.nodes]
    assert sorted(a["node"] for a in executable) == sorted(names[i] for i in CONTROLS), planned["actions"]
    assert {a["kind"] for a in executable} == {"scale_in"}
    reports = {r["node"]: r for r in planned["nodes"]}
    for index, (_name, code_) in PROTECTED.items():
        assert any(r.startswith(code_) for r in reports[names[index]]["reasons"]), reports[names[index]]
    saved = sum(a["hourly_savings_usd"] for a in executable)
    assert planned["savings"]["hourly_usd"] == pytest.approx(saved)  # the controls' instances only

    code, applied, err = run_cli("apply", "--config", str(config_file), "--json", "--execute")
    assert code == 0, "\n".join(
        line for line in err.splitlines()[-400:] if "httpx" not in line and "botocore" not in line
    )
    outcomes = applied["workflows"]
    assert len(outcomes) == len(executable), outcomes
    assert {o["status"] for o in outcomes.values()} == {"succeeded"}, outcomes  # never abandoned
    assert cluster.in_service() == {cluster.nodes[i].instance_id for i in PROTECTED}
    for index in PROTECTED:
        node = cluster.node(names[index])
        assert node is not None and not node["spec"].get("unschedulable")
        assert ANN_CORDONED_BY not in (node["metadata"].get("annotations") or {})
    groups = cluster.clients.eks.list_nodegroups(clusterName=CLUSTER)["nodegroups"]
    assert groups == ["gpu-a10g"]  # CreateNodegroup never called
