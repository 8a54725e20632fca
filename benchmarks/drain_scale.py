"""Drain scaling benchmark (issue "Act"): drain wall time tracks the longest grace period, not the sum.

A node with 10, 50 and 200 pods (ReplicaSet-owned, each with a 5 s termination grace period) is drained
through the real drain workflow: the Kubernetes adapter over HTTP against the Kubernetes API double
(which keeps each evicted pod until its grace period has passed, and recreates it on another node),
bounded-concurrency evictions, waiting by UID. AWS and state are in-memory fakes: this measures the drain.
Prints the median wall time of several runs per size, and the sum of grace periods for comparison.
Usage: ``.venv/bin/python benchmarks/drain_scale.py [--sizes 10,50,200] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeNodeScaler
from rightsizer.testing.k8s import KubernetesDouble

GRACE_S = 5
TOKEN = "bench-token"


class IdleAssessor:
    """Every node is idle (the decision is not what this benchmark measures)."""

    def assess_node(self, node: str, now: datetime) -> NodeReport:
        return NodeReport(
            node=node, verdict="idle", reasons=["idle_window_clean"], node_group="bench", instance_id="i-0",
            instance_type="g5.xlarge", gpus=1, gpu_activity_max_pct=0.0, fb_used_max_mib=0.0, coverage=1.0,
            hourly_usd=1.006,
        )  # fmt: skip


def _node(name: str, instance: str) -> dict[str, object]:
    created = (datetime.now(UTC) - timedelta(days=2)).isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": created, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"providerID": f"aws:///us-east-1a/{instance}"},
        "status": {
            "capacity": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi", "pods": "500"},
            "allocatable": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi", "pods": "500"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _pod(i: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"web-{i}",
            "namespace": "bench",
            "labels": {"app": "web"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web",
                    "controller": True,
                    "uid": "rs",
                }
            ],
        },
        "spec": {
            "nodeName": "gpu-1",
            "terminationGracePeriodSeconds": GRACE_S,
            "containers": [{"name": "c"}],
        },
        "status": {"phase": "Running"},
    }


def drain_once(pods: int, tmp: Path) -> float:
    with KubernetesDouble(seed=1) as double:
        double.accept_tokens(TOKEN)
        double.add_node(_node("gpu-1", "i-1"))
        double.add_node(_node("spare-1", "i-9"))
        for i in range(pods):
            double.add_pod(_pod(i))
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: bench\n"
            f"clusters:\n- name: bench\n  cluster:\n    server: {double.base_url}\n"
            f"users:\n- name: bench\n  user:\n    token: {TOKEN}\n"
            "contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n"
        )
        cluster = KubernetesCluster.from_kubeconfig("bench", str(kubeconfig))
        scaler = FakeNodeScaler()
        scaler.add_group("bench-asg", min_size=0, desired=2, max_size=4, instance_ids=["i-1", "i-9"])
        policy = Policy(dry_run=False, drain_timeout="10m")
        workflow = DrainWorkflow(
            DrainDeps(cluster, scaler, IdleAssessor(), MemoryState("bench"), policy, dry_run=False)
        )
        runner = InProcessRunner(workflow, sleep=time.sleep)
        started = time.perf_counter()
        runner.start(DrainRequest("gpu-1", f"bench-{pods}"))
        elapsed = time.perf_counter() - started
        result = runner.results[f"bench-{pods}"]
        if result.status != "succeeded" or scaler.terminated != ["i-1"]:
            raise SystemExit(f"drain of {pods} pods ended {result.status}: {result.message}")
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,50,200")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            times = [drain_once(n, Path(tmp)) for _ in range(args.runs)]
            median = statistics.median(times)
            print(
                f"{n:>4} pods x {GRACE_S} s grace: drain {median:6.2f} s (median of {args.runs}; "
                f"min {min(times):.2f}, max {max(times):.2f}); sum of grace periods {n * GRACE_S} s; "
                f"ratio to the longest grace period {median / GRACE_S:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
