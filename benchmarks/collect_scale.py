"""Live collection at scale: server-side aggregation (``collect_live``) vs one query set per node.

Backfills one real Prometheus (Debian ``prometheus`` + ``promtool tsdb create-blocks-from openmetrics``)
with three disjoint clusters — 100, 1,000 and 2,000 nodes × 8 GPUs (job ``n100``/``n1000``/``n2000``),
35 minutes at 60 s resolution, every 10th node busy — then for each cluster runs

- ``collect_live``: the constant set of queries (``live_queries``) filtered by job;
- per node: the same queries with an extra ``node="<name>"`` matcher, answers merged client-side;

and prints queries issued, response bytes, wall time (median of 3), Prometheus engine time of those
queries (``stats=all`` → ``data.stats.timings.evalTotalTime``), client peak memory (tracemalloc), and the
ratios. Both methods run 4 queries in flight. Run: ``.venv/bin/python benchmarks/collect_scale.py``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from tests.builders import AT, gpu_node  # noqa: E402
from tests.support.prometheus_server import find_binaries, start_prometheus  # noqa: E402

from rightsizer.adapters import prometheus as prom  # noqa: E402
from rightsizer.domain.join import NodeJoiner  # noqa: E402
from rightsizer.domain.model import Node  # noqa: E402
from rightsizer.domain.policy import Policy  # noqa: E402
from rightsizer.domain.usage import Window  # noqa: E402

SIZES = (100, 1000, 2000)
GPUS = 8
STEP = 60
WINDOW = 1800
END = AT.timestamp()
TIMES = [END - WINDOW - 300 + 5 + STEP * k for k in range((WINDOW + 300) // STEP)]


def node_name(size: int, i: int) -> str:
    return f"n{size}-gpu-{i:05d}"


def write_openmetrics(path: Path) -> None:
    """Stream the three clusters' DCGM families (each family contiguous, as OpenMetrics requires)."""
    metrics = (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    )
    with path.open("w", encoding="utf-8") as f:
        for metric in (*metrics, "up"):
            f.write(f"# TYPE {metric} gauge\n")
            for size in SIZES:
                for i in range(size):
                    name = node_name(size, i)
                    ip = f"10.{size % 251}.{i // 250}.{i % 250}"
                    busy = i % 10 == 0
                    if metric == "up":
                        lab = f'instance="{ip}:9400",job="n{size}",node="{name}"'
                        f.writelines(f"up{{{lab}}} 1 {t:.0f}\n" for t in TIMES)
                        continue
                    for g in range(GPUS):
                        lab = (
                            f'Hostname="nvidia-dcgm-exporter-{i:05d}",UUID="GPU-{size}-{i}-{g}",gpu="{g}",'
                            f'instance="{ip}:9400",job="n{size}",modelName="NVIDIA A10G",node="{name}"'
                        )
                        for k, t in enumerate(TIMES):
                            v = _value(metric, busy and g < 3, k, t)
                            f.write(f"{metric}{{{lab}}} {v} {t:.0f}\n")
        f.write("# EOF\n")


def _value(metric: str, busy: bool, k: int, t: float) -> str:
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return "87" if busy else "0"
    if metric == "DCGM_FI_DEV_FB_USED":
        return "18000" if busy else "300"
    if metric == "DCGM_FI_DEV_FB_FREE":
        return "5028" if busy else "22728"
    if metric == "DCGM_FI_DEV_POWER_USAGE":
        return "240" if busy else f"{27 + (k % 3) * 0.25:g}"
    return f"{9.8e10 + k * (240 if busy else 27) * 60e3:.0f}"


def joiner_for(size: int) -> NodeJoiner:
    nodes = [Node.model_validate(gpu_node(node_name(size, i), gpus=GPUS)) for i in range(size)]
    return NodeJoiner(nodes, [])


def live(client: prom.PrometheusClient, size: int, joiner: NodeJoiner, window: Window, policy: Policy) -> Any:
    return prom.collect_live(client, joiner, window, policy, job=f"n{size}")


def per_node(
    client: prom.PrometheusClient, size: int, joiner: NodeJoiner, window: Window, policy: Policy
) -> Any:
    """The same queries once per node (``node="<name>"`` added to every selector), merged client-side."""
    job = f'job="n{size}"'
    queries = prom.live_queries(window, policy.gpu_activity_max_pct, job=f"n{size}")
    start, end = prom.range_points(window)
    work = [(q, node_name(size, i)) for i in range(size) for q in queries]

    def run(item: tuple[prom.LiveQuery, str]) -> tuple[prom.LiveQuery, list[Any] | None]:
        q, node = item
        expr = q.expr.replace(job, f'{job},node="{node}"')
        try:
            if q.range:
                answer = client.query_range(expr, start, end, window.step)
            else:
                answer = client.query(expr, window.end)
        except (prom.PrometheusUnavailable, prom.PrometheusQueryError):
            return q, None
        if prom.answer_problem(answer, "matrix" if q.range else "vector"):
            return q, None
        return q, prom._parse(answer)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, work))
    answers: dict[str, list[Any]] = {}
    problems: set[str] = set()
    for q, samples in results:
        if samples is None:
            problems.update(q.metrics)
        else:
            answers.setdefault(q.key, []).extend(samples)
    _, device_by = prom._labels(None)
    return prom._assemble(answers, frozenset(problems), joiner, window, device_by)


def measure(method: Callable[..., Any], url: str, size: int, joiner: NodeJoiner) -> dict[str, float]:
    policy = Policy()
    window = Window(end=END, seconds=WINDOW, step=STEP)
    walls: list[float] = []
    last: dict[str, float] = {}
    for _ in range(3):
        with prom.PrometheusClient(url, stats=True, timeout=120) as client:
            tracemalloc.start()
            t0 = time.perf_counter()
            signals = method(client, size, joiner, window, policy)
            wall = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert not signals.problems, signals.problems
        assert len(signals.devices) == size, (len(signals.devices), size)
        walls.append(wall)
        last = {
            "queries": client.stats.requests,
            "bytes": client.stats.response_bytes,
            "engine_s": client.stats.engine_seconds,
            "peak_mib": peak / 2**20,
        }
    return {**last, "wall_s": statistics.median(walls)}


def main() -> int:
    binaries = find_binaries()
    if binaries is None:
        print("prometheus/promtool not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="collect-scale-") as tmp:
        t0 = time.perf_counter()
        server = start_prometheus(binaries, Path(tmp), write_openmetrics=write_openmetrics)
        print(
            f"backfill + start: {time.perf_counter() - t0:.1f} s ({sum(SIZES)} nodes × {GPUS} GPUs, "
            f"{len(TIMES)} points at {STEP} s)"
        )
        try:
            header = f"{'nodes':>6} {'method':<9} {'queries':>8} {'resp MiB':>9} {'wall s':>8} {'engine s':>9} {'peak MiB':>9}"
            print(header)
            rows: list[tuple[int, dict[str, float], dict[str, float]]] = []
            for size in SIZES:
                joiner = joiner_for(size)
                a = measure(live, server.url, size, joiner)
                b = measure(per_node, server.url, size, joiner)
                for label, r in (("live", a), ("per-node", b)):
                    print(
                        f"{size:>6} {label:<9} {r['queries']:>8.0f} {r['bytes'] / 2**20:>9.2f} {r['wall_s']:>8.2f} "
                        f"{r['engine_s']:>9.2f} {r['peak_mib']:>9.1f}"
                    )
                rows.append((size, a, b))
            print("\nratios per-node ÷ live:")
            for size, a, b in rows:
                print(
                    f"{size:>6} nodes: queries ×{b['queries'] / a['queries']:.0f}, bytes ×{b['bytes'] / a['bytes']:.2f}, "
                    f"wall ×{b['wall_s'] / a['wall_s']:.1f}, engine ×{b['engine_s'] / max(a['engine_s'], 1e-9):.1f}, "
                    f"peak memory ×{b['peak_mib'] / a['peak_mib']:.2f}; "
                    f"live client overhead = wall − engine = {a['wall_s'] - a['engine_s']:.2f} s"
                )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
