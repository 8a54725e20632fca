"""Placement simulation scaling (issue 29): the check that guards every drain must not make a plan quadratic.

For N GPU nodes (8 GPUs each, seed 7: 0-8 GPUs requested by 1-GPU and 2-GPU pods, plus CPU-only pods,
about 15 pods a node, a quarter of the nodes with a required anti-affinity pod and one zone spread
workload) prints the CPU seconds (``time.process_time``) of:

* build — ``ClusterPlacement.state``: every pod's demand, the target indexes, Pending pods settled;
* trials — emptying the ``--trials`` least-used nodes one after another (each kept when it fits, as the
  planner's consolidation does), and how many fit;

Usage: ``.venv/bin/python benchmarks/placement_scale.py [--sizes 2000,10000] [--trials 100]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.builders: the snapshot builders

from tests.builders import gpu_node, pod, snapshot

from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.placement_cluster import ClusterPlacement
from rightsizer.domain.volumes import VolumeFacts

ZONE = "topology.kubernetes.io/zone"


def cluster(n: int, seed: int = 7) -> ClusterSnapshot:
    """``n`` 8-GPU nodes in three zones with their pods (module docstring)."""
    rng = random.Random(seed)
    nodes, pods = [], []
    for i in range(n):
        name = f"gpu-{i:05d}"
        nodes.append(gpu_node(name, instance_type="p4d.24xlarge", gpus=8, labels={ZONE: "abc"[i % 3]}))
        used = rng.randint(0, 8)
        k = 0
        while used > 0:
            g = 2 if used >= 2 and rng.random() < 0.3 else 1
            pods.append(
                pod(f"train-{i}-{k}", name, gpus=g, cpu="4", memory="16Gi", labels={"app": f"t{k % 7}"})
            )
            used -= g
            k += 1
        for c in range(15 - k):
            pods.append(
                pod(f"side-{i}-{c}", name, cpu="250m", memory="512Mi", labels={"app": f"side{c % 5}"})
            )
        if i % 4 == 0:
            anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
            ]}}}  # fmt: skip
            pods.append(pod(f"db-{i}", name, cpu="1", labels={"app": "db"}, extra_spec=anti))
        if i % 10 == 0:
            spread = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                      "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}  # fmt: skip
            pods.append(pod(f"web-{i}", name, cpu="500m", labels={"app": "web"}, extra_spec=spread))
    return snapshot(nodes, pods, {})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        snap = cluster(n)
        gc.freeze()  # as load_snapshot does: the long-lived snapshot is not rescanned by the cyclic GC
        volumes = VolumeFacts.of(snap.pvcs, snap.pvs, snap.nodes)
        started = time.process_time()
        checker = ClusterPlacement(snap, volumes)
        _ = checker.state
        build = time.process_time() - started
        by_node: dict[str, list] = {}
        for p in snap.pods:
            by_node.setdefault(p.spec.nodeName, []).append(p)
        least = sorted(by_node, key=lambda name: (sum(p.gpu_request() for p in by_node[name]), name))
        started = time.process_time()
        fit = 0
        for name in least[: args.trials]:
            if checker.trial([name], by_node[name]).ok:
                checker.keep()
                fit += 1
            else:
                checker.undo()
        trials = time.process_time() - started
        gc.unfreeze()
        print(
            f"{n:>6} nodes {len(snap.pods):>7} pods  build {build:6.2f} CPU-s  "
            f"{args.trials} trials {trials:6.2f} CPU-s ({fit} emptied)",
            flush=True,
        )


if __name__ == "__main__":
    main()
