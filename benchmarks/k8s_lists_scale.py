"""Kubernetes lists at scale (issue 11 item 7): the memory and CPU of reading 10,000 nodes and ~150,000 pods.

For each size N (default 1,000, 5,000 and 10,000 nodes; ``--gpu-share`` of them GPU nodes, default one in
four; 15 pods per node) the Kubernetes API double (``rightsizer.testing.k8s.KubernetesDouble``: real HTTP,
``limit``/``continue`` pagination over a consistent snapshot, as the API server pages) serves a cluster of
realistic objects (``benchmarks/k8s_objects.py``: the repository's EKS Node composites, ~7 KB each, and
pods with every field the API server fills, ~5.5 KB each) from a child process, so its memory and CPU
are not the client's. Then, each in a FRESH process (the figure a Lambda cold start sees):

- ``live``: the assess function's read — ``services.snapshot.observe(project=True)`` (discovery, the
  preflight, every list page by page, projected to the typed objects the plan reads) decoded into the
  ``ClusterSnapshot`` (``services.observe.snapshot_from_observation``), exactly what ``services.observe.observe_live`` does
  before it asks Prometheus;
- ``snapshot``: ``rightsizer snapshot``'s Kubernetes part — ``services.snapshot.record`` into a
  ``SnapshotDirectoryWriter`` (projected object by object and written as read).

Each prints peak RSS (``VmHWM`` of the process: imports included, as a Lambda's memory is), the peak
above the process' RSS after its imports, CPU seconds (``process_time``: user + system of the read),
wall seconds and the Kubernetes requests the double answered; then the slope per 1,000 nodes (least
squares over the sizes). Pages of 500 (``wiring.builders.build_observers``' default). Usage::

    timeout 3600 flock /tmp/bench.lock .venv/bin/python benchmarks/k8s_lists_scale.py \
        [--sizes 1000,5000,10000] [--gpu-share 0.25] [--pods-per-node 15]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions"), str(ROOT / "benchmarks")]

PAGE_SIZE = 500
NAMESPACES = 20  # team namespaces, each with a PodDisruptionBudget per app
APPS = 6  # Deployments per namespace


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


# ------------------------------------------------------------------------------------ the served cluster


def _ip(i: int, k: int) -> str:
    return f"10.{i // 250 % 250}.{i % 250}.{k}"


def seed(
    double: Any,
    nodes: int,
    gpu_share: float,
    pods_per_node: int,
    *,
    name_ip: Callable[[int], tuple[str, str]] | None = None,
    gpu_template: dict[str, Any] | None = None,
    exporter_pod: Callable[[int], str] | None = None,
) -> dict[str, int]:
    """Fill ``double`` with ``nodes`` nodes (``gpu_share`` GPU nodes, spread evenly) and their pods.

    ``name_ip(i)`` names node ``i`` and gives its InternalIP (default ``ip-10-…ec2.internal``, ``10.a.b.1``;
    ``benchmarks/assess_memory.py`` names them as its TSDB's series do); ``gpu_template`` replaces the
    cycle of ``GPU_TEMPLATES`` for every GPU node; ``exporter_pod(i)`` names node ``i``'s dcgm-exporter pod
    (default: the DaemonSet's hash-suffixed name) as the ``pod`` label of its series does.

    Every node runs the EKS DaemonSets (aws-node, kube-proxy, ebs-csi-node; GPU nodes also the
    dcgm-exporter and the device plugin); the rest of its ``pods_per_node`` are Deployment pods of
    ``NAMESPACES`` × ``APPS`` apps, each app with a PodDisruptionBudget; on GPU nodes two of them hold a
    GPU. Every tenth node runs a StatefulSet pod with an EBS claim (PVC + zonal PV). Returns the counts
    and mean JSON sizes of what was stored.
    """
    from tests.builders import claim_volume, pdb, pv, pvc

    from k8s_objects import GPU_TEMPLATES, load_templates, node, pod

    gpu_templates, cpu_template = load_templates()
    counts = {"nodes": 0, "gpu_nodes": 0, "pods": 0, "pdbs": 0, "pvcs": 0, "node_bytes": 0, "pod_bytes": 0}
    every = round(1 / gpu_share) if gpu_share > 0 else 0
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/{}:v2.14.{}"
    for i in range(nodes):
        is_gpu = every > 0 and i % every == 0
        name, node_ip = (
            name_ip(i) if name_ip else (f"ip-10-{i // 250 % 250}-{i % 250}-1.ec2.internal", _ip(i, 1))
        )
        template = (gpu_template or gpu_templates[i % len(GPU_TEMPLATES)]) if is_gpu else cpu_template
        obj = node(template, name, node_ip, i)
        counts["node_bytes"] += len(json.dumps(obj))
        double.add_node(obj)
        counts["nodes"] += 1
        counts["gpu_nodes"] += is_gpu
        daemonsets = [
            ("aws-node", "kube-system"),
            ("kube-proxy", "kube-system"),
            ("ebs-csi-node", "kube-system"),
        ]
        if is_gpu:
            daemonsets += [("nvidia-dcgm-exporter", "gpu-operator"), ("nvidia-device-plugin", "gpu-operator")]
        node_pods = []
        for k, (app, namespace) in enumerate(daemonsets):
            host_network = namespace == "kube-system"
            suffixed = f"{app}-{zlib.crc32(name.encode()) % 36**5:05x}"
            node_pods.append(
                pod(
                    exporter_pod(i) if exporter_pod and app == "nvidia-dcgm-exporter" else suffixed,
                    namespace,
                    name,
                    node_ip,
                    node_ip if host_network else _ip(i, 10 + k),
                    app=app,
                    owner=("DaemonSet", app),
                    image=image.format(app, 1),
                )
            )
        for k in range(pods_per_node - len(daemonsets)):
            serial = i * pods_per_node + k
            namespace, app = f"team-{serial % NAMESPACES:02d}", f"svc-{serial // NAMESPACES % APPS}"
            owner = f"{app}-7d9f8b6c5d"
            item = pod(
                f"{owner}-{serial:06x}",
                namespace,
                name,
                node_ip,
                _ip(i, 30 + k),
                app=app,
                owner=("ReplicaSet", owner),
                image=image.format(app, 3),
                gpus=1 if is_gpu and k < 2 else 0,
            )
            if i % 10 == 0 and k == 0:  # a StatefulSet pod with an EBS volume
                claim = f"data-{app}-{i}"
                item["metadata"]["ownerReferences"][0].update(kind="StatefulSet", name=app)
                item["spec"]["volumes"].append(claim_volume(claim))
                double.add_pvc(pvc(claim, f"pvc-{i:08d}", namespace=namespace))
                zone = obj["metadata"]["labels"].get("topology.kubernetes.io/zone", "us-east-1a")
                double.add_pv(pv(f"pvc-{i:08d}", affinity={"topology.ebs.csi.aws.com/zone": [zone]}))
                counts["pvcs"] += 1
            node_pods.append(item)
        for item in node_pods:
            counts["pod_bytes"] += len(json.dumps(item))
            double.add_pod(item, controller=False)
            counts["pods"] += 1
    _share_subtrees(double)
    for n in range(NAMESPACES):
        for a in range(APPS):
            double.add_pdb(pdb(f"svc-{a}", f"team-{n:02d}", {"app": f"svc-{a}"}, 1), managed_status=False)
            counts["pdbs"] += 1
    return counts


def _share_subtrees(double: Any) -> None:
    """Store each distinct second-level subtree of the stored Pods and Nodes once (``managedFields``,
    containers, volumes, conditions, …): 150,000 pods then fit the double's process in ~1/4 of the memory.
    Only the double's own memory changes: lists serialize every item afresh, so what is served is the
    same bytes. (Reaches into the double's store: this benchmark only lists, it never writes.)"""
    seen: dict[str, Any] = {}
    for plural in ("pods", "nodes"):
        for obj in double._store[plural].values():
            for section in obj.values():
                if not isinstance(section, dict):
                    continue
                for key, value in section.items():
                    if isinstance(value, dict | list) and key not in ("name", "uid"):
                        section[key] = seen.setdefault(json.dumps(value, sort_keys=True), value)


def _serve(args: tuple[int, float, int], conn: Connection) -> None:
    """Child process: the double with a seeded cluster; answers "count", "clear", "stop" on ``conn``."""
    from tests.support.child_double import answer_commands

    from rightsizer.testing.k8s import KubernetesDouble

    double = KubernetesDouble(seed=7, resource_api_versions=None)
    counts = seed(double, *args)
    double.start()
    conn.send((double.base_url, counts))
    answer_commands(double, conn, lambda: (len(double.requests), _status_kib("VmHWM")))


# ------------------------------------------------------------------------------ one read, fresh process


def measure(mode: str, url: str, out: Path) -> dict[str, float]:
    """Run one read (``live`` or ``snapshot``) against ``url`` in this process; its figures."""
    import kubernetes.client  # noqa: F401  (imports are the cold start, not the read)
    from botocore.credentials import ReadOnlyCredentials
    from tests.builders import AT

    from rightsizer.adapters.eks_auth import EksTokenSource
    from rightsizer.adapters.kubernetes import KubernetesCluster
    from rightsizer.adapters.snapshot_writer import SnapshotDirectoryWriter
    from rightsizer.domain.catalog import load_catalog
    from rightsizer.services.observe import snapshot_from_observation
    from rightsizer.services.snapshot import ObserveRequest, observe, record
    from rightsizer.wiring.builders import decode_live_documents

    load_catalog()
    request = ObserveRequest(at=AT, window_seconds=1800, step_seconds=60, cluster="prod", region="us-east-1")
    cluster = KubernetesCluster.for_eks(
        url,
        EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None)),
        page_size=PAGE_SIZE,
        # The double serializes the whole list for its consistent snapshot on the first page (150,000
        # pods: over 30 s on a loaded machine) where the API server reads one page from etcd.
        request_timeout=600.0,
    )
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS, so the peak below is the read's
    c0, w0 = time.process_time(), time.perf_counter()
    if mode == "live":
        snapshot = snapshot_from_observation(
            observe(cluster, None, None, request, project=True), decode_live_documents
        )
        kept = {"nodes": len(snapshot.nodes), "pods": len(snapshot.pods)}
    else:
        with SnapshotDirectoryWriter(out, policy_node_labels=()) as writer:
            record(cluster, None, None, request, writer)
            writer.commit()
        kept = {"bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())}
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {"base_kib": base, "hwm_kib": _status_kib("VmHWM"), "cpu_s": cpu, "wall_s": wall, **kept}


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000,10000", help="nodes per cluster, comma-separated")
    parser.add_argument("--gpu-share", type=float, default=0.25, help="share of GPU nodes (0-1)")
    parser.add_argument("--pods-per-node", type=int, default=15)
    parser.add_argument("--modes", default="live,snapshot")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per measured read")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # child mode: live|snapshot
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.url, Path(args.out))))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    ctx = multiprocessing.get_context("fork")
    rows: list[tuple[str, int, dict[str, Any], dict[str, float], int]] = []
    print(
        f"pages of {PAGE_SIZE}; GPU share {args.gpu_share:.0%}; {args.pods_per_node} pods per node",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="k8s-lists-") as tmp:
        for size in sizes:
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=_serve, args=((size, args.gpu_share, args.pods_per_node), child), daemon=True
            )
            t0 = time.perf_counter()
            process.start()
            try:
                url, counts = parent.recv()
                print(
                    f"N={size:,}: served {counts['nodes']:,} nodes ({counts['gpu_nodes']:,} GPU, "
                    f"{counts['node_bytes'] / counts['nodes'] / 1024:.1f} KiB each), {counts['pods']:,} pods "
                    f"({counts['pod_bytes'] / counts['pods'] / 1024:.1f} KiB each), {counts['pdbs']} PDBs, "
                    f"{counts['pvcs']} PVCs/PVs; seeded in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
                for mode in modes:
                    parent.send("clear")
                    parent.recv()
                    out = Path(tmp) / f"{mode}-{size}"
                    done = subprocess.run(
                        [sys.executable, __file__, "--measure", mode, "--url", url, "--out", str(out)],
                        capture_output=True,
                        text=True,
                        timeout=args.timeout,
                        check=False,
                    )
                    if done.returncode != 0:
                        sys.exit(f"{mode} at N={size} failed:\n{done.stderr[-3000:]}")
                    figures = json.loads(done.stdout.strip().splitlines()[-1])
                    parent.send("count")
                    requests, server_hwm = parent.recv()
                    rows.append((mode, size, counts, figures, requests))
                    print(
                        f"  {mode:8} peak RSS {figures['hwm_kib'] / 1024:7.1f} MiB "
                        f"(+{(figures['hwm_kib'] - figures['base_kib']) / 1024:6.1f} over imports) "
                        f"CPU {figures['cpu_s']:6.2f} s wall {figures['wall_s']:6.2f} s "
                        f"requests {requests}  (double's peak RSS {server_hwm / 1024:.0f} MiB)",
                        flush=True,
                    )
            finally:
                parent.send("stop")
                parent.recv()
                process.join(timeout=60)
    print()
    print("| read | nodes | GPU nodes | pods | peak RSS MiB | over imports MiB | CPU s | wall s | requests |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, size, counts, f, requests in rows:
        print(
            f"| {mode} | {size:,} | {counts['gpu_nodes']:,} | {counts['pods']:,} | {f['hwm_kib'] / 1024:.1f} | "
            f"{(f['hwm_kib'] - f['base_kib']) / 1024:.1f} | {f['cpu_s']:.2f} | {f['wall_s']:.2f} | {requests} |"
        )
    for mode in modes:
        chosen = [(s, f) for m, s, _, f, _ in rows if m == mode]
        if len(chosen) > 1:
            rss = _slope([(s / 1000, f["hwm_kib"] / 1024) for s, f in chosen])
            cpu = _slope([(s / 1000, f["cpu_s"]) for s, f in chosen])
            print(f"{mode}: slope per 1,000 nodes: peak RSS {rss:+.1f} MiB, CPU {cpu:+.2f} s")


if __name__ == "__main__":
    main()
