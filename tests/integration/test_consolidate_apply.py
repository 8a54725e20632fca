"""A consolidation end to end through the CLI (issue 29), as a user runs it (subprocesses).

GIVEN EKS cluster ``prod-eks`` on moto (node group ``gpu-a10g``: min 1, desired 3, g5.2xlarge, one A10G
each), the Kubernetes double holding its three Nodes, whose replacement pods the double places like the
scheduler does for GPUs (the first node by name, other than the old one, with a free ``nvidia.com/gpu``),
a real Prometheus holding their dcgm-exporter series, and the test policy with ``consolidation:
idle_holders``:

- node 0 runs a notebook pod that holds its GPU and leaves it idle (an idle GPU holder: no scale-in);
- node 1 runs a training pod whose GPU is busy (full);
- node 2 is idle and empty but marked ``rightsizer.io/do-not-disrupt`` (not removed, still schedulable).

WHEN ``rightsizer plan`` runs THEN it proposes ``consolidate`` node 0 with the move notebook → node 2;
WHEN ``rightsizer apply --execute`` runs THEN node 0 is drained and its instance removed (desired 3 → 2),
and the notebook's replacement pod lands on node 2, where the plan said.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.testing.k8s import KubernetesDouble, first_fit
from rightsizer.testing.k8s.api import Placement
from tests.integration.test_apply import run_cli
from tests.support.e2e_cluster import (
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


def _gpus(obj: dict[str, Any]) -> int:
    containers = (obj.get("spec") or {}).get("containers") or []
    return sum(
        int((c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0)) for c in containers
    )


def gpu_first_fit(double: KubernetesDouble) -> Placement:
    """The double's ``first_fit`` among the nodes with a free GPU for the pod (allocatable minus the
    requests of the pods bound there), as kube-scheduler's NodeResourcesFit filters them."""

    def place(pod: dict[str, Any], nodes: Any, previous: str | None) -> str | None:
        want = _gpus(pod)
        used: dict[str, int] = {}
        for other in double.list_pods():
            node = (other.get("spec") or {}).get("nodeName")
            if node and (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + _gpus(other)
        room = [
            n
            for n in nodes
            if int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) - used.get(n["metadata"]["name"], 0)
            >= want
        ]
        return first_fit(pod, room, previous)

    return place


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[GpuCluster]:
    notebook = ExtraPod("notebook-5f7c9-q8wzt", 0, {"gpus": 1, "cpu": "2", "memory": "8Gi"})
    trainer = ExtraPod("trainer-7d9f5-x2kqp", 1, {"gpus": 1, "cpu": "6", "memory": "24Gi"})
    with gpu_cluster(
        tmp_path,
        nodes=3,
        extra_pods=[notebook, trainer],
        node_annotations={2: {"rightsizer.io/do-not-disrupt": "true"}},
        placement=gpu_first_fit,
    ) as (built, _exporter):
        yield built


@pytest.fixture
def config_file(
    cluster: GpuCluster, prometheus_factory: Callable[..., PrometheusServer], tmp_path: Path
) -> Path:
    now = time.time()
    times = [float(int(now)) - 120 + k for k in range(720)]
    holder, busy, spare = cluster.nodes
    server = prometheus_factory(dcgm_families([(holder, "idle"), (busy, "busy"), (spare, "idle")], times))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY_FILE.read_text(encoding="utf-8") + "consolidation: idle_holders\n", encoding="utf-8"
    )
    return write_config(tmp_path / "config.yaml", cluster, server.url, policy=policy)


def test_consolidation_drains_removes_and_the_pods_land_where_the_plan_said(
    cluster: GpuCluster, config_file: Path
) -> None:
    holder, busy, spare = cluster.nodes
    code, planned, err = run_cli("plan", "--config", str(config_file), "--json")
    assert code == 0, err[-3000:]
    [action] = [a for a in planned["actions"] if a["kind"] == "consolidate"]
    assert action["node"] == holder.name and action["instance_id"] == holder.instance_id
    assert action["moves"] == [{"pod": "default/notebook-5f7c9-q8wzt", "to": spare.name}]
    assert action["hourly_savings_usd"] == pytest.approx(1.212)
    assert not [a for a in planned["actions"] if a["kind"] == "scale_in"]

    code, out, err = run_cli("apply", "--config", str(config_file), "--json", "--execute")

    assert code == 0, err[-3000:]
    [(execution_id, outcome)] = out["workflows"].items()
    assert outcome["status"] == "succeeded", (outcome, err[-3000:])
    assert execution_id.startswith(holder.name)
    # THEN exactly the consolidated node's instance left the group, which shrank by one
    group = cluster.asg()
    assert group["DesiredCapacity"] == 2
    assert cluster.in_service() == {busy.instance_id, spare.instance_id}
    # AND the notebook's controller recreated it where the plan said
    replacements = [
        p
        for p in cluster.double.list_pods()
        if any(
            o.get("name") == "notebook-5f7c9-q8wzt-owner" for o in p["metadata"].get("ownerReferences", [])
        )
        and not p["metadata"].get("deletionTimestamp")
    ]
    assert [p["spec"].get("nodeName") for p in replacements] == [spare.name]
    # AND the busy node and its trainer were left alone
    trainer = cluster.double.get_pod("default", "trainer-7d9f5-x2kqp")
    assert trainer is not None and trainer["spec"]["nodeName"] == busy.name
    evicted = [r.path for r in cluster.double.requests if r.path.endswith("/eviction")]
    assert evicted and all("notebook-5f7c9-q8wzt" in path for path in evicted)
