"""Live collection at scale: the product's live path vs a naive-aggregation anchor vs the floor.

Backfills one real Prometheus (Debian ``prometheus`` + ``promtool tsdb create-blocks-from openmetrics``)
with disjoint clusters of N GPU nodes × 8 GPUs (jobs ``n<N>``), 15 s scrapes over the 30-minute window
plus 5 minutes, every 10th node busy on 3 GPUs, then for each cluster measures, in this one process:

- **live**: ``collect_live`` — what ``plan --config`` and the assess Lambda run (metrics format 2,
  sub-windows of 15 minutes, 4 queries in flight), ending in per-device ``DeviceSignals``;
- **anchor**: three aggregated instant queries that answer "max util / max FB / samples per node"
  (``max by (node) (max_over_time(m[W]))``, ``count by (node) (count_over_time(m[W]))``) — what a naive
  dashboard would ask, with none of the product's evidence checks;
- **floor**: each needed series family read once, ``count(count_over_time(m[W]))`` (5 DCGM families
  and ``up``): the least any faithful reader must make the TSDB do.

For each it prints: queries, response MiB, wall s, Prometheus CPU s (``/proc/<pid>/stat`` utime + stime),
engine s (``stats=all`` → ``evalTotalTime``, summed), client CPU s (``time.process_time``), client peak
RSS MiB (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), then the ratios to the floor.
Each method runs ``--repeat`` times (best figure kept); the floor first runs once unmeasured so every
method meets a warm page cache.

Run: ``.venv/bin/python benchmarks/collect_scale.py [--sizes 100,2000,10000] [--repeat 2]``. 10,000 nodes
need ~70 M samples (~6 GB of OpenMetrics text streamed to disk, promtool takes minutes): size the
machine first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from tests.builders import AT, gpu_node  # noqa: E402
from tests.support.prometheus_server import PrometheusServer, find_binaries, start_prometheus  # noqa: E402

from rightsizer.adapters import prometheus as prom  # noqa: E402
from rightsizer.domain.join import NodeJoiner  # noqa: E402
from rightsizer.domain.model import Node  # noqa: E402
from rightsizer.domain.policy import Policy  # noqa: E402
from rightsizer.domain.usage import Window  # noqa: E402

GPUS = 8
SCRAPE = 15
STEP = 60
WINDOW = 1800
END = AT.timestamp()
# Scrapes off the step grid (phase 7 s), from 5 minutes before the window to its end.
TIMES = [END - WINDOW - 300 + 7 + SCRAPE * k for k in range((WINDOW + 300) // SCRAPE)]
FAMILIES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def node_name(size: int, i: int) -> str:
    return f"n{size}-gpu-{i:05d}"


def write_openmetrics(path: Path, sizes: tuple[int, ...]) -> None:
    """Stream the clusters' families (each family contiguous, as OpenMetrics requires)."""
    stamps = [f" {t:.0f}\n" for t in TIMES]
    with path.open("w", encoding="utf-8", buffering=1 << 20) as f:
        for metric in (*FAMILIES, "up"):
            f.write(f"# TYPE {metric} gauge\n")
            for size in sizes:
                for i in range(size):
                    name = node_name(size, i)
                    ip = f"10.{size % 251}.{i // 250}.{i % 250}"
                    if metric == "up":
                        prefix = f'up{{instance="{ip}:9400",job="n{size}",node="{name}"}} 1'
                        f.writelines(prefix + s for s in stamps)
                        continue
                    for g in range(GPUS):
                        busy = i % 10 == 0 and g < 3
                        lab = (
                            f'Hostname="nvidia-dcgm-exporter-{i:05d}",UUID="GPU-{size}-{i}-{g}",gpu="{g}",'
                            f'instance="{ip}:9400",job="n{size}",modelName="NVIDIA A10G",node="{name}"'
                        )
                        prefix = f"{metric}{{{lab}}} "
                        f.writelines(prefix + _value(metric, busy, k) + s for k, s in enumerate(stamps))
        f.write("# EOF\n")


def _value(metric: str, busy: bool, k: int) -> str:
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return "87" if busy else str(k % 3)
    if metric == "DCGM_FI_DEV_FB_USED":
        return "18000" if busy else "300"
    if metric == "DCGM_FI_DEV_FB_FREE":
        return "5028" if busy else "22728"
    if metric == "DCGM_FI_DEV_POWER_USAGE":
        return "240" if busy else f"{27 + (k % 3) * 0.25:g}"
    return f"{9.8e10 + k * (240 if busy else 27) * SCRAPE * 1e3:.0f}"


def joiner_for(size: int) -> NodeJoiner:
    nodes = [Node.model_validate(gpu_node(node_name(size, i), gpus=GPUS)) for i in range(size)]
    return NodeJoiner(nodes, [])


# ------------------------------------------------------------------------------------------ methods


def live(client: prom.PrometheusClient, size: int, joiner: NodeJoiner) -> int:
    window = Window(end=END, seconds=WINDOW, step=STEP)
    signals = prom.collect_live(client, joiner, window, Policy(), job=f"n{size}")
    assert not signals.problems, signals.problems
    assert len(signals.devices) == size, (len(signals.devices), size)
    return sum(len(d) for d in signals.devices.values())


def _instant(client: prom.PrometheusClient, exprs: list[str]) -> int:
    def run(expr: str) -> int:
        answer = client.query(expr, END)
        assert prom.answer_problem(answer, "vector") is None, answer
        return len(answer["data"]["result"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        return sum(pool.map(run, exprs))


def anchor(client: prom.PrometheusClient, size: int, _joiner: NodeJoiner) -> int:
    sel = f'{{job="n{size}"}}[{WINDOW}s]'
    return _instant(
        client,
        [
            f"max by (node) (max_over_time(DCGM_FI_DEV_GPU_UTIL{sel}))",
            f"max by (node) (max_over_time(DCGM_FI_DEV_FB_USED{sel}))",
            f"count by (node) (count_over_time(DCGM_FI_DEV_GPU_UTIL{sel}))",
        ],
    )


def floor(client: prom.PrometheusClient, size: int, _joiner: NodeJoiner) -> int:
    sel = f'{{job="n{size}"}}[{WINDOW}s]'
    return _instant(client, [f"count(count_over_time({m}{sel}))" for m in (*FAMILIES, "up")])


# ------------------------------------------------------------------------------------------ figures


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat(5))


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux ≥ 4.0)


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(
    method: Callable[[prom.PrometheusClient, int, NodeJoiner], int],
    server: PrometheusServer,
    size: int,
    joiner: NodeJoiner,
    repeat: int,
) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(repeat):
        with prom.PrometheusClient(server.url, stats=True, timeout=120) as client:
            _reset_peak_rss()
            p0, c0, t0 = _proc_cpu(server.process.pid), time.process_time(), time.perf_counter()
            answered = method(client, size, joiner)
            wall = time.perf_counter() - t0
            figures = {
                "queries": float(client.stats.requests),
                "resp_mib": client.stats.response_bytes / 2**20,
                "wall_s": wall,
                "prom_cpu_s": _proc_cpu(server.process.pid) - p0,
                "engine_s": client.stats.engine_seconds,
                "client_cpu_s": time.process_time() - c0,
                "peak_rss_mib": _peak_rss_mib(),
                "answered": float(answered),
            }
        if (
            not best
            or figures["prom_cpu_s"] + figures["client_cpu_s"] < best["prom_cpu_s"] + best["client_cpu_s"]
        ):
            best = figures
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,2000", help="GPU node counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=2, help="runs per method (best kept)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    binaries = find_binaries()
    if binaries is None:
        print("prometheus/promtool not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="collect-scale-") as tmp:
        t0 = time.perf_counter()
        server = start_prometheus(
            binaries, Path(tmp), write_openmetrics=lambda p: write_openmetrics(p, sizes)
        )
        samples = sum(sizes) * (GPUS * len(FAMILIES) + 1) * len(TIMES)
        print(
            f"backfill + start: {time.perf_counter() - t0:.0f} s — {sum(sizes)} nodes × {GPUS} GPUs, "
            f"{len(TIMES)} scrapes at {SCRAPE} s, {samples / 1e6:.1f} M samples; window {WINDOW} s, step {STEP} s"
        )
        try:
            cols = ("queries", "resp_mib", "wall_s", "prom_cpu_s", "engine_s", "client_cpu_s", "peak_rss_mib")
            print(f"{'nodes':>6} {'method':<7} " + " ".join(f"{c:>12}" for c in cols))
            rows: list[tuple[int, dict[str, dict[str, float]]]] = []
            for size in sizes:
                joiner = joiner_for(size)
                floor(prom.PrometheusClient(server.url), size, joiner)  # warm the page cache
                results = {
                    name: measure(fn, server, size, joiner, args.repeat)
                    for name, fn in (("floor", floor), ("anchor", anchor), ("live", live))
                }
                for name, r in results.items():
                    print(f"{size:>6} {name:<7} " + " ".join(f"{r[c]:>12.2f}" for c in cols))
                rows.append((size, results))
            print("\nratios to the floor (total CPU = Prometheus CPU + client CPU):")
            for size, r in rows:
                f = r["floor"]
                total_f = f["prom_cpu_s"] + f["client_cpu_s"]
                for name in ("anchor", "live"):
                    m = r[name]
                    print(
                        f"{size:>6} {name:<7} engine ×{m['engine_s'] / max(f['engine_s'], 1e-9):.2f}  "
                        f"Prometheus CPU ×{m['prom_cpu_s'] / max(f['prom_cpu_s'], 1e-9):.2f}  "
                        f"total CPU ×{(m['prom_cpu_s'] + m['client_cpu_s']) / max(total_f, 1e-9):.2f}  "
                        f"wall ×{m['wall_s'] / max(f['wall_s'], 1e-9):.2f}"
                    )
                per_k = r["live"]["peak_rss_mib"] / size * 1000
                print(
                    f"{size:>6} live peak client RSS {r['live']['peak_rss_mib']:.0f} MiB ≈ {per_k:.0f} MiB per 1,000 nodes"
                )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
