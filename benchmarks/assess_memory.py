"""The assess function's peak memory at N GPU nodes: the metrics alone, and the whole assessment.

Per cluster size N (jobs ``n<N>`` of ``benchmarks/collect_scale.py``'s TSDB: N GPU nodes × 8 A10G, 15 s
scrapes) it measures, each in a FRESH Python process (what a Lambda cold start sees; ``VmHWM``, imports
included, as a Lambda's memory is):

- **metrics only** (the figure before, kept to compare): a ``ClusterSnapshot`` of N bare GPU nodes
  (``tests.builders.gpu_node``, no pods) built in the process, ``collect_live`` unsharded and in device
  shards of ``--shard-nodes`` nodes, then ``plan``;
- **whole**: what the assess Lambda does between its cold start and its decision records: a ``Runtime``
  (``rightsizer.wiring``) whose config points at the Kubernetes API double (kubeconfig context) and at
  the Prometheus, ``Runtime.observe_fresh`` (= ``services.observe.observe_live``: discovery, the preflight, every
  list page by page projected to what the plan reads, then ``live_signals`` with the product's default
  device shards), then ``plan`` as ``services.assess.run_assessment`` calls it. The double serves, from a
  forked child process (its memory is not the client's), N realistic EKS GPU nodes (the repository's
  g5.12xlarge node file as a g5.48xlarge: 8 A10G, ``k8s_objects.resized``) with 15 realistic pods each
  (``k8s_lists_scale.seed``: the EKS DaemonSets, dcgm-exporter, the device plugin, Deployment pods of
  which two hold a GPU, every tenth node a StatefulSet pod with an EBS claim; ~5.7 KiB of JSON a pod),
  named and addressed as the TSDB's series (``node`` label, ``instance`` = InternalIP:9400), so every
  series joins. One difference from the deployed function: the Kubernetes read timeout is 600 s, because
  the double serializes a whole list on its first page (150,000 pods: over 30 s on a loaded machine)
  where the API server reads one page.

Printed per N: peak RSS MiB of each; for the whole run also its client CPU and wall seconds and the
peak and the RSS when the Kubernetes part was done (the ``ClusterSnapshot`` held, before Prometheus is
asked); then the slopes per 1,000 GPU nodes between the sizes. Usage (the TSDB is built by collect_scale when the directory is empty)::

    timeout 5400 flock /tmp/bench.lock .venv/bin/python benchmarks/assess_memory.py \
        --data-dir /tmp/obsperf/big --sizes 100,2000,10000 [--modes metrics,whole]

``benchmarks/collect_scale.py --assess-rss`` prints the same table after its CPU table.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import multiprocessing
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions"), str(ROOT / "benchmarks")]

PODS_PER_NODE = 15
#: g5.48xlarge: 8 A10G, 192 vCPU, 768 GiB (EC2 instance types); what the TSDB's 8 A10G per node are.
INSTANCE = ("g5.48xlarge", 8, "192", 790_000_000)


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


# ------------------------------------------------------------------------------ children (fresh processes)


def metrics_child(url: str, size: int, shard_nodes: int) -> dict[str, float]:
    """The metrics part alone for N bare GPU nodes, in device shards of about ``shard_nodes`` nodes when
    N is larger (0: never): snapshot built in process, ``collect_live``, ``plan``."""
    from tests.builders import snapshot

    from collect_scale import AT, STEP, node_docs
    from rightsizer.adapters import prometheus as prom
    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.observation import DeviceShard, device_shards
    from rightsizer.domain.planner import plan
    from rightsizer.domain.policy import Policy
    from rightsizer.domain.usage import Window

    base = snapshot(node_docs(size), [])
    policy = Policy(max_nodes_per_run=size)
    window = Window.ending(AT, policy.idle_window, STEP)
    shards: tuple[DeviceShard, ...] = ()
    if 0 < shard_nodes < size:  # the product's default without prometheus.node_label
        shards = device_shards(-(-size // shard_nodes))
    before = _status_mib("VmRSS")
    with prom.PrometheusClient(url, timeout=120) as client:
        joiner = NodeJoiner(base.nodes, base.pods, "node")
        signals = prom.collect_live(client, joiner, window, policy, "node", job=f"n{size}", shards=shards)
    result = plan(dataclasses.replace(base, signals=signals), policy)
    assert len(result.nodes) == size and not signals.problems
    return {"before": before, "peak": _status_mib("VmHWM")}


def whole_child(prom_url: str, k8s_url: str, size: int, at_epoch: float) -> dict[str, Any]:
    """The assess Lambda's observation and plan through the composition root, against the double and the
    Prometheus (see the module docstring); its RSS figures (MiB) and what it decided."""
    import time
    from collections import Counter
    from datetime import UTC, datetime

    from rightsizer.adapters.kubernetes import KubernetesCluster
    from rightsizer.config import Config
    from rightsizer.domain.planner import plan
    from rightsizer.services import observe as live
    from rightsizer.wiring.runtime import Runtime

    kubeconfig = Path(tempfile.mkdtemp(prefix="assess-memory-")) / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {k8s_url}\n"
        "users:\n- name: rightsizer\n  user:\n    token: local-test-token\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: rightsizer\n",
        encoding="utf-8",
    )
    config = Config.model_validate(
        {
            "cluster": {"context": "double", "kubeconfig": str(kubeconfig)},
            # Generous bounds: this measures memory on a shared 2-core machine, not latency.
            "prometheus": {"url": prom_url, "step": 60, "job": f"n{size}", "timeout": 300, "deadline": 1800},
            "policy": {"max_nodes_per_run": size},
        }
    )
    runtime = Runtime(config, "lambda")
    # The cached_property's slot: the same adapter as build_cluster_writer, with the double's timeout.
    runtime.__dict__["cluster"] = KubernetesCluster.from_kubeconfig(
        "double", str(kubeconfig), request_timeout=600.0
    )
    figures: dict[str, Any] = {"before": _status_mib("VmRSS")}
    live_signals = live.live_signals

    def probed(*args: Any, **kwargs: Any) -> Any:  # the Kubernetes part is done: the snapshot is held
        figures["k8s_peak"], figures["k8s_rss"] = _status_mib("VmHWM"), _status_mib("VmRSS")
        return live_signals(*args, **kwargs)

    live.live_signals = probed  # type: ignore[assignment]  # observe_live calls it by its module name
    at = datetime.fromtimestamp(at_epoch, UTC)
    cpu, wall = time.process_time(), time.perf_counter()
    snapshot = runtime.observe_fresh(at)
    result = plan(snapshot, runtime.policy(), at, node_label=config.prometheus.node_label)
    figures["peak"] = _status_mib("VmHWM")
    figures["cpu_s"], figures["wall_s"] = time.process_time() - cpu, time.perf_counter() - wall
    signals = snapshot.signals
    assert signals is not None and not signals.problems, signals and signals.problems
    figures.update(
        nodes=len(result.nodes),
        pods=len(snapshot.pods) + len(snapshot.pod_addresses),
        joined=len(signals.devices),
        devices=sum(len(d) for d in signals.devices.values()),
        verdicts=dict(Counter(r.verdict for r in result.nodes)),
    )
    return figures


# ------------------------------------------------------------------------------------ the served cluster


def _serve(size: int, conn: Connection) -> None:
    """Child process: the double serving N GPU nodes named as the TSDB's series, 15 pods each."""
    from tests.support.child_double import answer_commands

    from collect_scale import node_ip, node_name
    from k8s_lists_scale import seed
    from k8s_objects import load_templates, resized
    from rightsizer.testing.k8s import KubernetesDouble

    double = KubernetesDouble(seed=7, resource_api_versions=None)
    template = resized(load_templates()[0][0], *INSTANCE)
    counts = seed(
        double,
        size,
        1.0,
        PODS_PER_NODE,
        name_ip=lambda i: (node_name(size, i), node_ip(size, i)),
        gpu_template=template,
    )
    double.start()
    conn.send((double.base_url, counts))
    answer_commands(double, conn, lambda: len(double.requests))


def _run_child(args: list[str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _whole(prom_url: str, size: int, at_epoch: float, timeout: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(size, child), daemon=True)
    process.start()
    try:
        k8s_url, counts = parent.recv()
        figures = _run_child(
            [
                "--child",
                "whole",
                "--url",
                prom_url,
                "--k8s",
                k8s_url,
                "--size",
                str(size),
                "--at",
                str(at_epoch),
            ],
            timeout,
        )
        parent.send("count")
        figures["requests"] = parent.recv()
        figures["served_pods"] = counts["pods"]
        return figures
    finally:
        parent.send("stop")
        parent.recv()
        process.join(timeout=60)


def assess_rss(
    url: str,
    sizes: tuple[int, ...],
    *,
    shard_nodes: int = 1000,
    modes: tuple[str, ...] = ("metrics", "whole"),
    timeout: float = 2400,
) -> None:
    """Print the peak RSS table (see the module docstring) for the Prometheus at ``url``."""
    from collect_scale import AT

    print("\nassess peak RSS MiB (each a fresh process; VmHWM, imports included):", flush=True)
    columns: dict[str, list[tuple[int, float]]] = {}
    for size in sizes:
        if "metrics" in modes:
            for per, label in ((0, "metrics only, unsharded"), (shard_nodes, "metrics only, device shards")):
                f = _run_child(
                    ["--child", "metrics", "--url", url, "--size", str(size), "--shard-nodes", str(per)],
                    timeout,
                )
                columns.setdefault(label, []).append((size, f["peak"]))
                print(
                    f"{size:>6} GPU nodes  {label:<30} peak {f['peak']:6.0f}  (imports {f['before']:4.0f})",
                    flush=True,
                )
        if "whole" in modes:
            f = _whole(url, size, AT.timestamp(), timeout)
            assert f["nodes"] == f["joined"] == size, f
            columns.setdefault("whole assessment", []).append((size, f["peak"]))
            columns.setdefault("  of which Kubernetes", []).append((size, f["k8s_peak"]))
            print(
                f"{size:>6} GPU nodes  {'whole assessment':<30} peak {f['peak']:6.0f}  (imports {f['before']:4.0f}; "
                f"Kubernetes read: peak {f['k8s_peak']:.0f}, then {f['k8s_rss']:.0f} held; client CPU "
                f"{f['cpu_s']:.1f} s, wall {f['wall_s']:.1f} s; {f['pods']:,} pods, "
                f"{f['devices']:,} devices joined, {f['requests']} Kubernetes requests, verdicts {f['verdicts']})",
                flush=True,
            )
    for label, rows in columns.items():
        for (n0, r0), (n1, r1) in itertools.pairwise(rows):
            print(
                f"  {label}: {n0}->{n1} GPU nodes: {(r1 - r0) / (n1 - n0) * 1000:.0f} MiB per 1,000 GPU nodes"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100,2000", help="GPU node counts, comma-separated (jobs of the TSDB)"
    )
    parser.add_argument("--data-dir", help="collect_scale's TSDB (reused; backfilled when empty)")
    parser.add_argument("--modes", default="metrics,whole", help="metrics (alone), whole (the assessment)")
    parser.add_argument(
        "--shard-nodes", type=int, default=1000, help="GPU nodes per device shard (metrics only)"
    )
    parser.add_argument("--timeout", type=float, default=2400, help="seconds per measured process")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # metrics | whole
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--k8s", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "metrics":
        print(json.dumps(metrics_child(args.url, args.size, args.shard_nodes)))
        return 0
    if args.child == "whole":
        print(json.dumps(whole_child(args.url, args.k8s, args.size, args.at)))
        return 0
    from collect_scale import find_binaries, start

    sizes = tuple(int(s) for s in args.sizes.split(","))
    binaries = find_binaries()
    if binaries is None:
        print("prometheus/promtool not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="assess-memory-") as tmp:
        server = start(binaries, Path(args.data_dir or tmp), sizes, 2)
        try:
            assess_rss(
                server.url,
                sizes,
                shard_nodes=args.shard_nodes,
                modes=tuple(args.modes.split(",")),
                timeout=args.timeout,
            )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
