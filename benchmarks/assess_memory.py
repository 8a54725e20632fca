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
  list page by page projected to what the plan reads, and, from the moment the Nodes are listed, the
  ``live_signals`` queries with the product's default device shards in a thread), then ``plan`` as ``services.assess.run_assessment`` calls it. The double serves, from a
  forked child process (its memory is not the client's), N realistic EKS GPU nodes (the repository's
  g5.12xlarge node file as a g5.48xlarge: 8 A10G, ``k8s_objects.resized``) with 15 realistic pods each
  (``k8s_lists_scale.seed``: the EKS DaemonSets, dcgm-exporter, the device plugin, Deployment pods of
  which two hold a GPU, every tenth node a StatefulSet pod with an EBS claim; ~5.7 KiB of JSON a pod),
  named and addressed as the TSDB's series (``node`` label, ``instance`` = InternalIP:9400, each node's
  dcgm-exporter pod named as its series' ``pod`` label), so every series joins its node and only it (a
  hash-suffixed exporter pod name that happened to read as another node's made 2 of 10,000 nodes'
  series ambiguous, 14 of 30,000: the join rightly refused them). Two differences from the deployed
  function: the Kubernetes read timeout is 600 s, and the double **encodes its lists before the clock
  starts** (``KubernetesDouble.encode_lists``; the same bytes it would encode per request): a real API
  server encodes on its own machines, while the double's Python encoding of 150,000 pods took
  ~60 CPU-s on this machine's cores beside the client (``--double-encodes``: as before, measured).

Printed per N: peak RSS MiB of each; for the whole run also the client's CPU, Prometheus' CPU (``/proc``
of its pid) and the double's, the wall seconds with the load average before the run, the peak and the
RSS when the Kubernetes read was done (the ``ClusterSnapshot`` held, with the Prometheus answers read
ahead meanwhile, at most ``prometheus_ahead.READ_AHEAD_BYTES``), and a timeline: each step between two
marks (the Kubernetes read, the metrics collection — in a thread from the moment the Nodes are listed —,
the XID queries, the join handed over to the collection, the plan) with its wall and every process's
CPU seconds; then the slopes per 1,000 GPU nodes between the sizes.
The join check (every node joined a series) fails the run when it does not hold. Usage (the TSDB is
built by collect_scale when the directory is empty; ``--data-dir`` may be repeated, each size read from
the TSDB that holds it, one Prometheus at a time)::

    timeout 5400 flock /tmp/bench.lock .venv/bin/python benchmarks/assess_memory.py \
        --data-dir /tmp/cs33p/d2000 --data-dir /tmp/cs33p/d10000 --sizes 2000,10000 --modes whole

``benchmarks/collect_scale.py --assess-rss`` prints the same table after its CPU table.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions"), str(ROOT / "benchmarks")]

CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far, from ``/proc/<pid>/stat``."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of proc(5)


class Timeline:
    """Marks of one assessment: wall offset (s) and the CPU seconds of the client, of Prometheus and of the
    Kubernetes API double at each named instant (``mark``); thread-safe."""

    def __init__(self, prom_pid: int | None, double_pid: int | None) -> None:
        import threading
        import time

        self._pids = (prom_pid, double_pid)
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.marks: list[tuple[str, float, float, float, float]] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        import time

        cpu = time.process_time()
        prom, double = (_cpu_s(pid) for pid in self._pids)
        with self._lock:
            self.marks.append((name, time.perf_counter() - self._t0, cpu, prom, double))

    def timed(self, name: str, fn: Any) -> Any:
        """``fn`` wrapped to mark ``<name> start`` and ``<name> end`` around each call."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.mark(f"{name} start")
            try:
                return fn(*args, **kwargs)
            finally:
                self.mark(f"{name} end")

        return wrapper


def whole_child(
    prom_url: str,
    k8s_url: str,
    size: int,
    at_epoch: float,
    prom_pid: int | None,
    double_pid: int | None,
    series: bool = True,
) -> dict[str, Any]:
    """The assess Lambda's observation and plan through the composition root, against the double and the
    Prometheus (see the module docstring); its RSS figures (MiB), its timeline and what it decided."""
    from collections import Counter
    from datetime import UTC, datetime

    from rightsizer.adapters.kubernetes import KubernetesCluster
    from rightsizer.config import Config
    from rightsizer.domain.planner import plan
    from rightsizer.services import observe as live
    from rightsizer.services import snapshot as snapshots
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
    observe = snapshots.observe

    def probed(*args: Any, **kwargs: Any) -> Any:  # the Kubernetes part is done: the snapshot is held
        try:
            return observe(*args, **kwargs)
        finally:
            figures["k8s_peak"], figures["k8s_rss"] = _status_mib("VmHWM"), _status_mib("VmRSS")

    at = datetime.fromtimestamp(at_epoch, UTC)
    timeline = Timeline(prom_pid, double_pid)
    # observe_live calls these by their modules' names; the metrics run in a thread of their own from the
    # moment the Nodes are listed (services.observe._MetricsAhead), finish hands them the join
    snapshots.observe = timeline.timed("kubernetes", probed)  # type: ignore[assignment]
    live._with_xids = timeline.timed("xids", live._with_xids)  # type: ignore[assignment]
    live._MetricsAhead.finish = timeline.timed("join handed over", live._MetricsAhead.finish)  # type: ignore[method-assign]
    runtime.__dict__["observers"] = dataclasses.replace(
        runtime.observers, collect=timeline.timed("metrics", runtime.observers.collect)
    )
    snapshot = runtime.observe_fresh(at)
    timeline.mark("plan start")
    result = plan(snapshot, runtime.policy(), at, node_label=config.prometheus.node_label)
    timeline.mark("plan end")
    figures["peak"] = _status_mib("VmHWM")
    end = timeline.marks[-1]
    start = timeline.marks[0]
    figures["cpu_s"], figures["wall_s"] = end[2] - start[2], end[1] - start[1]
    figures["prom_cpu_s"], figures["double_cpu_s"] = end[3] - start[3], end[4] - start[4]
    figures["marks"] = timeline.marks
    signals = snapshot.signals
    assert signals is not None and (not series or not signals.problems), signals and signals.problems
    figures.update(
        nodes=len(result.nodes),
        pods=len(snapshot.pods) + len(snapshot.pod_addresses),
        joined=len(signals.devices),
        devices=sum(len(d) for d in signals.devices.values()),
        verdicts=dict(Counter(r.verdict for r in result.nodes)),
        unmapped=len(signals.unmapped),
    )
    return figures


def _print_timeline(marks: list[list[Any]]) -> None:
    """Each step between two marks: its wall seconds and the CPU seconds each process spent in it."""
    print(f"{'':8}{'from → to':<44}{'wall s':>8}{'client':>8}{'Prom':>8}{'double':>8}  CPU s")
    for (a, t0, c0, p0, d0), (b, t1, c1, p1, d1) in itertools.pairwise(marks):
        print(f"{'':8}{a + ' → ' + b:<44}{t1 - t0:8.2f}{c1 - c0:8.2f}{p1 - p0:8.2f}{d1 - d0:8.2f}")


# ------------------------------------------------------------------------------------ the served cluster


#: The lists the assessment reads whole (``services.snapshot``): encoded before the clock starts.
LISTS = (
    "/api/v1/nodes",
    "/api/v1/pods",
    "/apis/policy/v1/poddisruptionbudgets",
    "/api/v1/persistentvolumeclaims",
    "/api/v1/persistentvolumes",
)


def _serve(size: int, encode: bool, conn: Connection) -> None:
    """Child process: the double serving N GPU nodes named as the TSDB's series, 15 pods each; with
    ``encode``, its lists encoded before it serves (``KubernetesDouble.encode_lists``)."""
    from tests.support.child_double import answer_commands

    from collect_scale import exporter_pod, node_ip, node_name
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
        exporter_pod=exporter_pod,
    )
    if encode:
        double.encode_lists(*LISTS)
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


def _whole(
    prom_url: str,
    prom_pid: int | None,
    size: int,
    at_epoch: float,
    timeout: float,
    encode: bool,
    series: bool,
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(size, encode, child), daemon=True)
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
                "--prom-pid",
                str(prom_pid or 0),
                "--double-pid",
                str(process.pid),
                *([] if series else ["--no-series"]),
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
    prom_pid: int | None = None,
    shard_nodes: int = 1000,
    modes: tuple[str, ...] = ("metrics", "whole"),
    timeout: float = 2400,
    encode_lists: bool = True,
    series: bool = True,
) -> None:
    """Print the peak RSS table (see the module docstring) for the Prometheus at ``url``; without
    ``series`` (a size no TSDB holds) the whole assessment's Kubernetes read and plan only."""
    from collect_scale import AT

    print("\nassess peak RSS MiB (each a fresh process; VmHWM, imports included):", flush=True)
    columns: dict[str, list[tuple[int, float]]] = {}
    failed: list[int] = []
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
            load = os.getloadavg()[0]
            f = _whole(url, prom_pid, size, AT.timestamp(), timeout, encode_lists, series)
            name = "whole assessment" if series else "no series: Kubernetes + plan"
            columns.setdefault(name, []).append((size, f["peak"]))
            columns.setdefault(f"  of which Kubernetes ({name})", []).append((size, f["k8s_peak"]))
            print(
                f"{size:>6} GPU nodes  {name:<30} peak {f['peak']:6.0f}  (imports {f['before']:4.0f}; "
                f"Kubernetes read: peak {f['k8s_peak']:.0f}, then {f['k8s_rss']:.0f} held; client CPU "
                f"{f['cpu_s']:.1f} s, wall {f['wall_s']:.1f} s; {f['pods']:,} pods, "
                f"{f['devices']:,} devices joined, {f['requests']} Kubernetes requests, verdicts {f['verdicts']})",
                flush=True,
            )
            print(
                f"{'':8}whole: client CPU {f['cpu_s']:.1f} s, Prometheus CPU {f['prom_cpu_s']:.1f} s, double CPU "
                f"{f['double_cpu_s']:.1f} s, wall {f['wall_s']:.1f} s (load average before: {load:.2f}); "
                f"join check: {f['joined']:,} of {f['nodes']:,} nodes joined a series, {f['unmapped']} series unmapped"
            )
            _print_timeline(f["marks"])
            if series and not f["nodes"] == f["joined"] == size:
                failed.append(size)
    for label, rows in columns.items():
        for (n0, r0), (n1, r1) in itertools.pairwise(rows):
            print(
                f"  {label}: {n0}->{n1} GPU nodes: {(r1 - r0) / (n1 - n0) * 1000:.0f} MiB per 1,000 GPU nodes"
            )
    if failed:
        sys.exit(f"join check failed at {failed} GPU nodes: not every node joined its series")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100,2000", help="GPU node counts, comma-separated (jobs of the TSDB)"
    )
    parser.add_argument(
        "--data-dir",
        action="append",
        default=[],
        help="collect_scale's TSDB (reused; backfilled when empty); repeat for TSDBs of other sizes",
    )
    parser.add_argument("--modes", default="metrics,whole", help="metrics (alone), whole (the assessment)")
    parser.add_argument(
        "--shard-nodes", type=int, default=1000, help="GPU nodes per device shard (metrics only)"
    )
    parser.add_argument("--timeout", type=float, default=2400, help="seconds per measured process")
    parser.add_argument(
        "--double-encodes",
        action="store_true",
        help="the double encodes each list when asked (as before), not before the clock starts",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # metrics | whole
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--k8s", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--prom-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--double-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-series", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--without-series",
        default="",
        help="GPU node counts (comma-separated) no TSDB holds: the Kubernetes read and the plan only, "
        "against the last TSDB's Prometheus (no series: every node unknown; the metrics part not measured)",
    )
    args = parser.parse_args()
    if args.child == "metrics":
        print(json.dumps(metrics_child(args.url, args.size, args.shard_nodes)))
        return 0
    if args.child == "whole":
        figures = whole_child(
            args.url, args.k8s, args.size, args.at, args.prom_pid, args.double_pid, not args.no_series
        )
        print(json.dumps(figures))
        return 0
    from collect_scale import find_binaries, start

    sizes = tuple(int(s) for s in args.sizes.split(","))
    binaries = find_binaries()
    if binaries is None:
        print("prometheus/promtool not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="assess-memory-") as tmp:
        groups = _tsdbs([Path(d) for d in args.data_dir] or [Path(tmp)], sizes)
        bare = tuple(int(s) for s in args.without_series.split(",") if s)
        for k, (root, held) in enumerate(groups):
            server = start(binaries, root, held, 2)
            try:
                assess_rss(
                    server.url,
                    held,
                    prom_pid=server.process.pid,
                    shard_nodes=args.shard_nodes,
                    modes=tuple(args.modes.split(",")),
                    timeout=args.timeout,
                    encode_lists=not args.double_encodes,
                )
                if bare and k == len(groups) - 1:
                    assess_rss(
                        server.url,
                        bare,
                        prom_pid=server.process.pid,
                        modes=("whole",),
                        timeout=args.timeout,
                        encode_lists=not args.double_encodes,
                        series=False,
                    )
            finally:
                server.stop()
    return 0


def _tsdbs(roots: list[Path], sizes: tuple[int, ...]) -> list[tuple[Path, tuple[int, ...]]]:
    """Which TSDB serves which sizes: each size from the first directory whose ``collect_scale.json``
    holds it; sizes no directory holds are backfilled into the last directory given (when it is empty)."""
    held: dict[Path, list[int]] = {}
    for size in sizes:
        marker: Path | None = None
        for root in roots:
            file = root / "collect_scale.json"
            if file.is_file() and size in json.loads(file.read_text()).get("sizes", []):
                marker = root
                break
        held.setdefault(marker or roots[-1], []).append(size)
    return [(root, tuple(group)) for root, group in held.items()]


if __name__ == "__main__":
    raise SystemExit(main())
