"""Validate-one-node benchmark (issue 11 item 5): the drain's fresh assessment of one node costs the same
whatever the cluster's size.

For each size N (default 100 and 2,000 GPU nodes, each with its dcgm-exporter pod and two workload pods in
three namespaces with PodDisruptionBudgets, one zonal EBS volume), the Kubernetes API double runs in a
child process (so its own CPU is not the client's) and a real Prometheus 2.x holds one A10G's DCGM series
per node (60 s scrapes; ``tests.support.prometheus_server``). It then times, in this process:

- ``node``: the drain's assessor (``wiring.builders.build_assessor`` → ``services.observe.observe_node_live``), what validate and
  revalidate run now;
- ``cluster``: the whole cluster's observation and plan (``services.observe.observe_live``), what they ran before.

Prints per method and size: Kubernetes requests, PromQL queries, client CPU seconds (``process_time`` of
this process: adapters, JSON, the join and the plan), wall seconds (medians of ``--runs``), and the ratio
of the largest to the smallest size. Usage::

    .venv/bin/python benchmarks/validate_scale.py [--sizes 100,2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

import httpx  # noqa: E402
from botocore.credentials import ReadOnlyCredentials  # noqa: E402
from tests.builders import AT  # noqa: E402
from tests.integration.test_node_view import JOB, Families, fill, name, series  # noqa: E402
from tests.support.child_double import answer_commands  # noqa: E402
from tests.support.prometheus_server import find_binaries, openmetrics_lines, start_prometheus  # noqa: E402
from tests.support.rbac import function_role  # noqa: E402

from rightsizer.adapters.eks_auth import EksTokenSource  # noqa: E402
from rightsizer.adapters.kubernetes import KubernetesCluster  # noqa: E402
from rightsizer.adapters.prometheus import PrometheusClient  # noqa: E402
from rightsizer.config import Config  # noqa: E402
from rightsizer.domain.planner import plan  # noqa: E402
from rightsizer.domain.policy import Policy  # noqa: E402
from rightsizer.services import observe as live  # noqa: E402
from rightsizer.testing.k8s import KubernetesDouble  # noqa: E402
from rightsizer.wiring import builders  # noqa: E402

NODE = 3  # the node judged: it has a zonal volume, so the witness search runs too


def _serve(nodes: int, conn: Connection) -> None:
    """Child process: the double with ``nodes`` nodes; answers "count", "clear", "bind", "stop" on ``conn``."""
    double = KubernetesDouble(seed=11, resource_api_versions=None)
    double.start()
    fill(double, nodes)
    conn.send(double.base_url)
    answer_commands(double, conn, lambda: len(double.requests))


class Counting(httpx.HTTPTransport):
    """A real transport counting the requests it sends (PromQL queries)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        return super().handle_request(request)


def _measure(
    run: Callable[[], Any], conn: Connection, transport: Counting, runs: int, function: str
) -> tuple[int, int, float, float]:
    """(Kubernetes requests, Prometheus queries, CPU s, wall s) of one ``run`` under ``function``'s
    Kubernetes identity (its ClusterRoles of infra/k8s/rbac.yaml), medians over ``runs``."""
    conn.send(("bind", function_role(function)))
    conn.recv()
    cpu, wall, k8s, prom = [], [], [], []
    for _ in range(runs):
        conn.send("clear")
        conn.recv()
        transport.count = 0
        c0, w0 = time.process_time(), time.perf_counter()
        run()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        conn.send("count")
        k8s.append(conn.recv())
        prom.append(transport.count)
    return (
        int(statistics.median(k8s)),
        int(statistics.median(prom)),
        statistics.median(cpu),
        statistics.median(wall),
    )


def _one_size(
    size: int, prometheus_url: str, conn: Connection, runs: int
) -> dict[tuple[str, int], tuple[int, int, float, float]]:
    """Both methods against the double behind ``conn`` (its base URL comes first) and ``prometheus_url``."""
    policy = Policy(dry_run=False)
    at = AT + timedelta(seconds=30)
    cluster = KubernetesCluster.for_eks(
        conn.recv(), EksTokenSource("prod", "us-east-1", lambda: ReadOnlyCredentials("AKID", "s", None))
    )
    config = Config.model_validate(
        {
            "cluster": {"name": "prod", "region": "us-east-1"},
            "prometheus": {"url": prometheus_url, "job": JOB},
        }
    )
    transport = Counting()
    observers = builders.live_observers(cluster, None, PrometheusClient(prometheus_url, transport=transport))
    assessor = builders.build_assessor(config, policy, observers)

    def whole() -> Any:
        return plan(live.observe_live(config, policy, observers, at), policy, at).node(name(NODE))

    return {
        # each under the identity that runs it: validate is the drain's, the whole cluster the assessment's
        ("node", size): _measure(
            lambda: assessor.assess_node(name(NODE), at), conn, transport, runs, "drain"
        ),
        ("cluster", size): _measure(whole, conn, transport, runs, "assess"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,2000", help="GPU nodes per cluster, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per method and size (medians)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if min(sizes) <= NODE:
        parser.error(f"--sizes: every size must exceed {NODE} (node {NODE} is the one judged)")
    binaries = find_binaries()
    if binaries is None:
        sys.exit("prometheus/promtool not found (apt-get install prometheus)")
    ctx = multiprocessing.get_context("fork")
    rows: dict[tuple[str, int], tuple[int, int, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="validate-scale-") as tmp:
        for size in sizes:
            families: Families = {}
            for i in range(size):
                series(families, i, busy=i % 2 == 1, scrape=60)

            def write(path: Path, families: Families = families) -> None:
                with path.open("w", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in openmetrics_lines(families))

            server = start_prometheus(binaries, Path(tmp) / f"prom-{size}", write_openmetrics=write)
            del families
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_serve, args=(size, child), daemon=True)
            process.start()
            try:
                rows.update(_one_size(size, server.url, parent, args.runs))
            finally:
                parent.send("stop")
                parent.recv()
                process.join(timeout=30)
                server.stop()
    print("| method | nodes | Kubernetes requests | PromQL queries | client CPU s | wall s |")
    print("|---|---|---|---|---|---|")
    for (method, size), (k8s, prom, cpu, wall) in sorted(rows.items()):
        print(f"| {method} | {size:,} | {k8s} | {prom} | {cpu:.3f} | {wall:.3f} |")
    small, large = min(sizes), max(sizes)
    for method in ("node", "cluster"):
        a, b = rows[(method, small)], rows[(method, large)]
        print(
            f"{method}: {large:,} vs {small:,} nodes — requests ×{b[0] / a[0]:.2f}, "
            f"CPU ×{b[2] / max(a[2], 1e-9):.2f}, wall ×{b[3] / max(a[3], 1e-9):.2f}"
        )


if __name__ == "__main__":
    main()
