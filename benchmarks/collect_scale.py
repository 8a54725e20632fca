"""Live collection at scale: the product's live path vs a naive-aggregation anchor vs the floor.

Backfills one real Prometheus (Debian ``prometheus`` + ``promtool tsdb create-blocks-from openmetrics``)
with disjoint clusters of N GPU nodes × 8 GPUs (jobs ``n<N>``), 15 s scrapes over the 30-minute window
plus 5 minutes, every 10th node busy on 3 GPUs, then for each cluster measures, in this one process:

- **live**: ``collect_live`` — what ``plan --config`` and the assess Lambda run (metrics format 2,
  one query in flight while the answers are small, 4 once one is over 1 MiB), ending in per-device ``DeviceSignals``;
- **sharded**: the same in series shards of ``--shard-nodes`` GPU nodes (``node=~"…"``), what the
  product does with ``prometheus.node_label`` set on a fleet larger than ``prometheus.shard_nodes``;
  only for N > ``--shard-nodes``;
- **devices**: the same in device shards by GPU index (``gpu=~"0|8"``, ``device_shards``), the product's
  default without ``node_label``; only for N > ``--shard-nodes``;
- **uuids** (only when asked in ``--methods``): device shards by the last hex digit of the GPU UUID
  (``UUID=~"(?s:.*)[08]"``), the default before, kept to compare (this data's UUIDs end in the GPU
  index 0-7, so only 8 of 16 such shards hold series; real UUIDs spread over all 16);
- **anchor**: three aggregated instant queries that answer "max util / max FB / samples per node"
  (``max by (node) (max_over_time(m[W]))``, ``count by (node) (count_over_time(m[W]))``) — what a naive
  dashboard would ask, with none of the product's evidence checks;
- **floor**: each needed series family read once, ``count(count_over_time(m[W]))`` (6 DCGM families
  and ``up``): the least any faithful reader must make the TSDB do.

``--shard-nodes`` may list several sizes (``1000,2500,5000``): each sharded method then runs once per
size, named ``<method>/<shards>`` (its shard count at that N).

``--interleave`` (with ``--repeat k``) runs the methods of one size in turn, k rounds, so a change of
the machine's load during the run hits every method alike (compare methods this way on a shared
machine); each keeps its run of least total CPU, and every run is printed (``<method>#<round>``). With
``--repeat 3`` or more, the ratios are printed a second time from each method's medians.

For each it prints: requests, response MiB, wall s, the slowest single request (wall s) and the slowest
single query's engine time (``stats=all`` → ``evalTotalTime``), Prometheus CPU s (``/proc/<pid>/stat``
utime + stime, with a full Go GC of the server forced before and after each run through ``/debug/pprof/heap?gc=1``,
less the cost of one such GC with nothing to collect: each run starts from the same GC pacer state and
pays for the collections its own garbage causes, not for those of the run before it), engine s (summed), client CPU s (``time.process_time``, all threads), total CPU s
(Prometheus + client), client peak RSS MiB (``VmHWM`` after resetting it through
``/proc/self/clear_refs``), then the ratios to the floor and to the anchor. Each method runs
``--repeat`` times (least total CPU kept); the floor first runs once unmeasured so every method meets a
warm page cache.

The anchor and the floor keep as many queries in flight as the live path does at that size (counted in
an unmeasured live run first: one at a time at 100 nodes, whose answers are small, 4 from 2,000 up):
engine time is wall time inside Prometheus, and queries asked together contend for its cores, so the
engine times of methods asked with different concurrency would not compare (at 100 nodes the floor's
6 queries read 138–144 ms of engine time 4 at a time and 77 ms one at a time, for the same CPU).

``--inner k`` (default ``auto``: ⌈2,000 / N⌉, so 20 at 100 nodes and 1 from 2,000 up) makes each
measured sample run the method k times in a row, each run with its own client, and prints per-run
figures (requests, MiB, wall, CPU and engine seconds summed over the sample and divided by k; the
slowest request and query and the peak RSS over the sample). At 100 nodes one run costs Prometheus a
few 10 ms clock ticks of ``/proc`` accounting (``CLK_TCK``), so one run's ratio is mostly rounding; k
runs make it k times as many ticks. The GC fence encloses the whole sample.

``--anatomy`` then asks each request of the live path and each family of the floor alone, serially,
GC-fenced, and prints each one's Prometheus CPU and answer size: where the live path's cost goes beyond
the floor (a family's series selected once per query, each query's labelled answer encoded).

``--assess-rss`` then prints ``benchmarks/assess_memory.py``'s table for the same sizes: per N, the peak
RSS of fresh processes doing the metrics part alone (N bare GPU nodes, ``collect_live``, ``plan``) and
the whole assessment (the Kubernetes lists of N realistic GPU nodes with 15 pods each from the API double,
then the metrics in device shards, then ``plan``, through ``rightsizer.wiring``), and the slopes per
1,000 GPU nodes — the figure behind the assess function's ``MemorySize``.

Run: ``.venv/bin/python benchmarks/collect_scale.py [--sizes 100,2000] [--repeat 1] [--inner auto] [--assess-rss]
[--data-dir DIR]``. ``--data-dir`` keeps the TSDB for a later run (backfilled only when empty; the
sizes must then be the same). 10,000 nodes need ~70 M samples (~12 GB of OpenMetrics text streamed to
disk, promtool needs several GB of memory and many minutes): size the machine first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

from tests.builders import AT, gpu_node  # noqa: E402
from tests.support.prometheus_server import (  # noqa: E402
    PrometheusBinaries,
    PrometheusServer,
    find_binaries,
    start_prometheus,
)

from rightsizer.adapters import prometheus as prom  # noqa: E402
from rightsizer.domain.join import NodeJoiner  # noqa: E402
from rightsizer.domain.model import Node  # noqa: E402
from rightsizer.domain.observation import DeviceShard, Shard, device_shards, series_shards  # noqa: E402
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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def node_name(size: int, i: int) -> str:
    return f"n{size}-gpu-{i:05d}"


def node_ip(size: int, i: int) -> str:
    """The InternalIP of node ``i`` of cluster ``size`` (its exporter's ``instance`` is ``<ip>:9400``)."""
    return f"10.{size % 251}.{i // 250}.{i % 250}"


def exporter_pod(i: int) -> str:
    """The name of node ``i``'s dcgm-exporter pod, as its series' ``pod`` label gives it."""
    return f"nvidia-dcgm-exporter-{i:05d}"


#: Labels of a series as dcgm-exporter 3.x behind the GPU Operator's ServiceMonitor writes them
#: (``/work/shared/data/prometheus/eks-p5-h100-instant-query-DCGM_FI_DEV_GPU_UTIL.json``, a real EKS p5
#: answer: the device's ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
#: ``DCGM_FI_DRIVER_VERSION``; the scrape target's ``container``/``namespace``/``pod``/``instance``/``job``)
#: plus the ``node`` label a relabelling adds (the product's ``prometheus.node_label``).
def series_labels(size: int, i: int, g: int) -> str:
    """The label text of GPU ``g`` of node ``i`` of cluster ``size`` (sorted by name, as Prometheus keeps them)."""
    uuid = f"{size:08x}-{i:04x}-{g:04x}-{(i * 8 + g) % 65536:04x}-{(size * 131 + i * 8 + g):012x}"
    return (
        f'DCGM_FI_DRIVER_VERSION="535.161.08",Hostname="{exporter_pod(i)}",UUID="GPU-{uuid}",'
        f'container="nvidia-dcgm-exporter",device="nvidia{g}",gpu="{g}",instance="{node_ip(size, i)}:9400",'
        f'job="n{size}",modelName="NVIDIA A10G",namespace="gpu-operator",node="{node_name(size, i)}",'
        f'pci_bus_id="00000000:{0x10 + g * 16:02X}:00.0",pod="{exporter_pod(i)}"'
    )


def write_openmetrics(path: Path, parts: list[tuple[int, range]]) -> None:
    """Stream the nodes ``parts`` names (cluster size, node indices) as OpenMetrics, each family
    contiguous (as OpenMetrics requires)."""
    stamps = [f" {t:.0f}\n" for t in TIMES]
    with path.open("w", encoding="utf-8", buffering=1 << 20) as f:
        for metric in (*FAMILIES, "up"):
            f.write(f"# TYPE {metric} gauge\n")
            for size, nodes in parts:
                for i in nodes:
                    name = node_name(size, i)
                    ip = node_ip(size, i)
                    if metric == "up":
                        prefix = f'up{{instance="{ip}:9400",job="n{size}",node="{name}"}} 1'
                        f.writelines(prefix + s for s in stamps)
                        continue
                    for g in range(GPUS):
                        busy = i % 10 == 0 and g < 3
                        prefix = f"{metric}{{{series_labels(size, i, g)}}} "
                        f.writelines(prefix + _value(metric, busy, k) + s for k, s in enumerate(stamps))
        f.write("# EOF\n")


def _value(metric: str, busy: bool, k: int) -> str:
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return "87" if busy else str(k % 3)
    if metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
        return "0.85" if busy else f"{(k % 3) * 0.005:g}"
    if metric == "DCGM_FI_DEV_FB_USED":
        return "18000" if busy else "300"
    if metric == "DCGM_FI_DEV_FB_FREE":
        return "5028" if busy else "22728"
    if metric == "DCGM_FI_DEV_POWER_USAGE":
        return "240" if busy else f"{27 + (k % 3) * 0.25:g}"
    return f"{9.8e10 + k * (240 if busy else 27) * SCRAPE * 1e3:.0f}"


def node_docs(size: int) -> list[dict[str, object]]:
    return [gpu_node(node_name(size, i), instance_type="g5.48xlarge", gpus=GPUS) for i in range(size)]


def joiner_for(size: int) -> NodeJoiner:
    return NodeJoiner([Node.model_validate(n) for n in node_docs(size)], [], "node")


# ------------------------------------------------------------------------------------------ methods

SHARD_NODES = 1000  # --shard-nodes (the size a sharded method runs with)
Method = Callable[[prom.PrometheusClient, int, NodeJoiner], int]


def live(client: prom.PrometheusClient, size: int, joiner: NodeJoiner) -> int:
    window = Window(end=END, seconds=WINDOW, step=STEP)
    signals = prom.collect_live(client, joiner, window, Policy(), "node", job=f"n{size}")
    assert not signals.problems, signals.problems
    assert len(signals.devices) == size, (len(signals.devices), size)
    return sum(len(d) for d in signals.devices.values())


def _collect_sharded(
    client: prom.PrometheusClient,
    size: int,
    joiner: NodeJoiner,
    shards: tuple[Shard, ...],
    node_label: str | None,
) -> int:
    window = Window(end=END, seconds=WINDOW, step=STEP)
    signals = prom.collect_live(client, joiner, window, Policy(), node_label, job=f"n{size}", shards=shards)
    assert not signals.problems and not signals.node_problems, (signals.problems, signals.node_problems)
    assert len(signals.devices) == size, (len(signals.devices), size)
    return sum(len(d) for d in signals.devices.values())


def _node_shards(size: int) -> tuple[Shard, ...]:
    return series_shards("node", [node_name(size, i) for i in range(size)], SHARD_NODES)


def sharded(client: prom.PrometheusClient, size: int, joiner: NodeJoiner) -> int:
    return _collect_sharded(client, size, joiner, _node_shards(size), "node")


def devices(client: prom.PrometheusClient, size: int, joiner: NodeJoiner) -> int:
    """The default without ``prometheus.node_label``: device shards by GPU index (``device_shards``)."""
    return _collect_sharded(client, size, joiner, device_shards(-(-size // SHARD_NODES)), None)


@dataclasses.dataclass(frozen=True, slots=True)
class UuidShard(DeviceShard):
    """The device shard of before (kept to compare): the series whose ``UUID`` ends in one of the hex
    digits ``indices``; ``rest`` those ending otherwise or without a ``UUID``."""

    @property
    def label(self) -> str:
        return "UUID"

    def matcher(self) -> str:
        if self.rest:
            return f'UUID!~"(?s:.*)[{"".join(self.others)}]"'
        return f'UUID=~"(?s:.*)[{"".join(self.indices)}]"'

    def holds(self, index: str) -> bool:
        last = index[-1:]
        return not (last and last in self.others) if self.rest else bool(last) and last in self.indices


def uuid_shards(count: int) -> tuple[Shard, ...]:
    """``device_shards`` of before: by the UUID's last hex digit d, shard i holding d mod n = i."""
    n = len(device_shards(count))
    digits = [tuple("0123456789abcdef"[j] for j in range(i, 16, n)) for i in range(n)]
    others = tuple(d for g in digits[:-1] for d in g)
    return (
        (*(UuidShard(g) for g in digits[:-1]), UuidShard(digits[-1], rest=True, others=others)) if n else ()
    )


def uuids(client: prom.PrometheusClient, size: int, joiner: NodeJoiner) -> int:
    """Device shards by the GPU UUID's last hex digit, the default before (compared)."""
    return _collect_sharded(client, size, joiner, uuid_shards(-(-size // SHARD_NODES)), None)


def shard_count(name: str, size: int) -> int:
    """How many shards the sharded method ``name`` uses at ``size`` nodes (``SHARD_NODES`` per shard)."""
    if name == "sharded":
        return len(_node_shards(size))
    return len(device_shards(-(-size // SHARD_NODES)))


IN_FLIGHT = 4  # queries the anchor and the floor keep in flight: as many as the live path at this size


class PeakClient(prom.PrometheusClient):
    """A ``PrometheusClient`` that records the most requests it had in flight at once (``peak``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peak = 0
        self._now = 0
        self._count_lock = threading.Lock()

    def _post(self, *args: Any, **kwargs: Any) -> httpx.Response:
        with self._count_lock:
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            return super()._post(*args, **kwargs)
        finally:
            with self._count_lock:
                self._now -= 1


def _instant(client: prom.PrometheusClient, exprs: list[str]) -> int:
    def run(expr: str) -> int:
        answer = client.query(expr, END)
        assert prom.answer_problem(answer, "vector") is None, answer
        return len(answer["data"]["result"])

    if IN_FLIGHT <= 1:
        return sum(map(run, exprs))
    with ThreadPoolExecutor(max_workers=IN_FLIGHT) as pool:
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


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mib() -> float:
    return _status_mib("VmHWM")


def _server_gc(url: str) -> None:
    """A full Go garbage collection in Prometheus (``net/http/pprof``: ``heap?gc=1`` runs ``runtime.GC()``
    before writing the profile), so garbage a run leaves is collected, and charged, inside that run."""
    httpx.get(f"{url}/debug/pprof/heap", params={"gc": "1", "debug": "1"}, timeout=120).raise_for_status()


def inner_runs(spec: str, size: int) -> int:
    """Runs per measured sample at ``size`` nodes: ``spec`` a count, or ``auto`` — ⌈``AUTO_INNER_NODES`` /
    size⌉, so a sample of a small cluster makes Prometheus read about as many series as one of 2,000
    nodes (the floor ≈ 2 CPU-s, 200 clock ticks) instead of a few ticks; 1 from 2,000 nodes up."""
    if spec == "auto":
        return max(1, -(-AUTO_INNER_NODES // size))
    k = int(spec)
    if k < 1:
        raise SystemExit(f"--inner must be ≥ 1 or auto, not {spec}")
    return k


AUTO_INNER_NODES = 2000
PER_RUN = ("requests", "resp_mib", "wall_s", "prom_cpu_s", "engine_s", "client_cpu_s", "total_cpu_s")


def measure(
    method: Method,
    server: PrometheusServer,
    size: int,
    joiner: NodeJoiner,
    repeat: int,
    inner: int = 1,
) -> dict[str, float]:
    """The least-total-CPU sample of ``repeat``; each sample runs ``method`` ``inner`` times back to back,
    each run with its own client (as each assessment builds one), and reports per-run figures (the sums
    of ``PER_RUN`` over the sample divided by ``inner``; the slowest request and query and the peak RSS
    over the sample). The Go GC fence is around the whole sample: garbage of run i collected during run
    i+1 is charged to the same sample, and the closing forced GC collects the last run's."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        clients = [prom.PrometheusClient(server.url, stats=True, timeout=120) for _ in range(inner)]
        try:
            gc.collect()  # the client's cyclic garbage of earlier samples is not this sample's
            _server_gc(server.url)
            g0 = _proc_cpu(server.process.pid)
            _server_gc(server.url)  # the price of the closing GC alone, taken off below
            idle_gc = _proc_cpu(server.process.pid) - g0
            _reset_peak_rss()
            p0, c0, t0 = _proc_cpu(server.process.pid), time.process_time(), time.perf_counter()
            answered = 0
            try:
                for client in clients:
                    answered = method(client, size, joiner)
            except (AssertionError, prom.PrometheusError) as exc:  # e.g. a query past the timeout
                print(f"{size:>6} {method.__name__:<14} FAILED: {str(exc)[:300]}", flush=True)
                answered = -1
            wall = time.perf_counter() - t0
            client_cpu = time.process_time() - c0
            _server_gc(server.url)
            stats = [c.stats for c in clients]
            figures = {
                "requests": float(sum(s.requests for s in stats)),
                "resp_mib": sum(s.response_bytes for s in stats) / 2**20,
                "wall_s": wall,
                "slowest_s": max(s.slowest_request_seconds for s in stats),
                "slowest_eng_s": max(s.slowest_engine_seconds for s in stats),
                "prom_cpu_s": _proc_cpu(server.process.pid) - p0 - idle_gc,
                "engine_s": sum(s.engine_seconds for s in stats),
                "client_cpu_s": client_cpu,
                "peak_rss_mib": _peak_rss_mib(),
                "answered": float(answered),
            }
            figures["total_cpu_s"] = figures["prom_cpu_s"] + figures["client_cpu_s"]
            for key in PER_RUN:
                figures[key] /= inner
        finally:
            for client in clients:
                client.close()
        if not best or figures["total_cpu_s"] < best["total_cpu_s"]:
            best = figures
    return best


COLS = (
    "requests",
    "resp_mib",
    "wall_s",
    "slowest_s",
    "slowest_eng_s",
    "prom_cpu_s",
    "engine_s",
    "client_cpu_s",
    "total_cpu_s",
    "peak_rss_mib",
)


def anatomy(server: PrometheusServer, size: int, repeat: int) -> None:
    """``--anatomy``: each request of the live path (``plan_queries``) and each family of the floor asked
    alone, serially, GC-fenced like ``measure``: Prometheus CPU s (least of ``repeat``) and answer MiB.

    Shows where the live path's Prometheus CPU goes beyond the floor: per query, the selection of a
    family's series (what the floor pays once per family), the window pass, the answer's encoding."""
    window = Window(end=END, seconds=WINDOW, step=STEP)
    pid = server.process.pid

    def cost(expr: str, start: float, end: float) -> tuple[float, float]:
        best, size_mib = float("inf"), 0.0
        with prom.PrometheusClient(server.url, timeout=600) as client:
            for _ in range(repeat):
                _server_gc(server.url)
                g0 = _proc_cpu(pid)
                _server_gc(server.url)
                idle = _proc_cpu(pid) - g0
                p0 = _proc_cpu(pid)
                body = client.query_range_bytes(expr, start, end, STEP)
                _server_gc(server.url)
                best = min(best, _proc_cpu(pid) - p0 - idle)
                size_mib = len(body) / 2**20
        return best, size_mib

    print(f"\nanatomy at {size} nodes (Prometheus CPU s, least of {repeat}; answer MiB):")
    live_total = 0.0
    for task in prom.plan_queries(window, job=f"n{size}"):
        cpu, mib = cost(task.expr(STEP), *task.span(STEP))
        live_total += cpu
        print(f"{size:>6} live  {cpu:6.2f} {mib:8.2f}  {task.query.path}", flush=True)
    floor_total = 0.0
    for m in (*FAMILIES, "up"):
        cpu, mib = cost(f'count(count_over_time({m}{{job="n{size}"}}[{WINDOW}s]))', END, END)
        floor_total += cpu
        print(f"{size:>6} floor {cpu:6.2f} {mib:8.2f}  {m}", flush=True)
    print(
        f"{size:>6} live {live_total:.2f} / floor {floor_total:.2f} = {_ratio(live_total, floor_total)} (serial)"
    )
    # One query per family carrying two window aggregates (``or`` of two functions, a marker label on one):
    # each function still selects the family's series apart, and ``or`` adds a label-set join.
    sel = f'DCGM_FI_DEV_FB_USED{{job="n{size}"}}[{WINDOW}s]'
    combined = f'max_over_time({sel}) or label_replace(avg_over_time({sel}), "fact", "avg", "", "")'
    for name, expr in (
        ("max alone", f"max_over_time({sel})"),
        ("avg alone", f"avg_over_time({sel})"),
        ("max or avg", combined),
    ):
        cpu, mib = cost(expr, END, END)
        print(f"{size:>6} FB_USED {name:<10} {cpu:6.2f} {mib:8.2f}", flush=True)


def _ratio(a: float, b: float) -> str:
    return f"×{a / b:.2f}" if b > 1e-9 else "—"


def print_ratios(rows: list[tuple[int, dict[str, dict[str, float]]]], kind: str = "least total") -> None:
    print(f"\nratios (total CPU = Prometheus CPU + client CPU; each method's {kind}):")
    print(
        f"{'nodes':>6} {'method':<14} {'engine/floor':>13} {'promCPU/floor':>14} {'total/floor':>12} {'total/anchor':>13}"
    )
    for size, r in rows:
        f = r["floor"]
        for name, m in r.items():
            if name == "floor":
                continue
            to_anchor = _ratio(m["total_cpu_s"], r["anchor"]["total_cpu_s"]) if "anchor" in r else "—"
            print(
                f"{size:>6} {name:<14} {_ratio(m['engine_s'], f['engine_s']):>13} "
                f"{_ratio(m['prom_cpu_s'], f['prom_cpu_s']):>14} {_ratio(m['total_cpu_s'], f['total_cpu_s']):>12} "
                f"{to_anchor:>13}"
            )


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over ``runs`` (the samples of one method), ``total_cpu_s`` included: with the
    floor's least sample as the divisor, one lucky floor sample moves every ratio (±20 % at 100 nodes)."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


# Bump when write_openmetrics writes different series: a kept TSDB of another version is refused.
DATA_VERSION = 2  # 2: the engine-active family, dcgm-exporter's real label set
CHUNK_NODES = 1000  # nodes per OpenMetrics chunk (one promtool process each)


def _chunks(sizes: tuple[int, ...]) -> list[list[tuple[int, range]]]:
    """The clusters' nodes in chunks of at most ``CHUNK_NODES``."""
    flat = [
        (size, range(lo, min(lo + CHUNK_NODES, size))) for size in sizes for lo in range(0, size, CHUNK_NODES)
    ]
    chunks: list[list[tuple[int, range]]] = [[]]
    for size, nodes in flat:
        if sum(len(r) for _, r in chunks[-1]) + len(nodes) > CHUNK_NODES:
            chunks.append([])
        chunks[-1].append((size, nodes))
    return chunks


def backfill_parallel(binaries: PrometheusBinaries, root: Path, sizes: tuple[int, ...], jobs: int) -> None:
    """Backfill ``root/data`` in node chunks: Python writes chunk k+1 while promtool turns chunk k into a
    block (at most ``jobs`` promtool processes at once, each bounded to 1 h); the blocks (same time range,
    disjoint series) are then moved into one data directory, where Prometheus merges them by vertical
    compaction (``compact_blocks``)."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen[bytes], Path, Path]] = []

    def reap(proc: subprocess.Popen[bytes], om: Path, out: Path) -> None:
        try:
            rc = proc.wait(timeout=3600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"promtool on {om} did not finish within 1 h") from None
        om.unlink()
        if rc != 0:
            raise RuntimeError(f"promtool backfill of {om} failed ({rc}); see {out}.log")
        for block in out.iterdir():
            block.rename(data / block.name)
        out.rmdir()

    try:
        for k, parts in enumerate(_chunks(sizes)):
            om, out = root / f"chunk{k}.om.txt", root / f"chunk{k}"
            t0 = time.perf_counter()
            write_openmetrics(om, parts)
            print(
                f"  chunk {k}: {sum(len(r) for _, r in parts)} nodes written in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            while len(running) >= jobs:
                reap(*running.pop(0))
            out.mkdir()
            with (root / f"chunk{k}.log").open("wb") as log:
                cmd = [binaries.promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(out)]
                running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), om, out))
        while running:
            reap(*running.pop(0))
    finally:
        for proc, _, _ in running:
            proc.kill()
            proc.wait()


def compact_blocks(binaries: PrometheusBinaries, root: Path, timeout: float = 1800) -> None:
    """Start Prometheus on ``root/data`` until its compactor has merged the overlapping blocks into one
    (it runs a minute after start), then stop it, so every measured query reads one block."""
    data = root / "data"

    def blocks() -> int:
        return sum(1 for b in data.iterdir() if (b / "meta.json").is_file())

    if blocks() <= 1:
        return
    server = start_prometheus(binaries, root)
    try:
        deadline = time.monotonic() + timeout
        while blocks() > 1 or any(b.name.endswith(".tmp-for-creation") for b in data.iterdir()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not merge {blocks()} blocks within {timeout:.0f} s")
            time.sleep(5)
    finally:
        server.stop()


def start(binaries: PrometheusBinaries, root: Path, sizes: tuple[int, ...], jobs: int) -> PrometheusServer:
    """Prometheus on the TSDB in ``root`` — reused when ``root/collect_scale.json`` says it holds these
    sizes (or more) at this ``DATA_VERSION``, else backfilled anew."""
    marker = root / "collect_scale.json"
    want = {"version": DATA_VERSION, "sizes": list(sizes), "gpus": GPUS, "scrapes": len(TIMES)}
    data = root / "data"
    kept = json.loads(marker.read_text()) if marker.is_file() else {}
    if kept and {**kept, "sizes": want["sizes"]} == want and set(sizes) <= set(kept["sizes"]):
        print(f"reusing the TSDB in {data}")
        return start_prometheus(binaries, root)
    if data.exists() and any(data.iterdir()):
        raise SystemExit(f"{data} holds another data set ({marker.name} differs); remove it first")
    root.mkdir(parents=True, exist_ok=True)
    backfill_parallel(binaries, root, sizes, jobs)
    compact_blocks(binaries, root)
    marker.write_text(json.dumps(want))
    return start_prometheus(binaries, root)


def main(argv: list[str] | None = None) -> int:
    global SHARD_NODES, IN_FLIGHT
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="100,2000", help="GPU node counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per method (least total CPU kept)")
    parser.add_argument(
        "--shard-nodes",
        default=str(SHARD_NODES),
        help="GPU nodes per series shard (comma-separated: a sweep)",
    )
    parser.add_argument("--data-dir", help="keep/reuse the backfilled TSDB here")
    parser.add_argument(
        "--methods", default="anchor,live,sharded,devices", help="besides the floor, comma-separated"
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="with --repeat k: run the methods of a size in turn k times (A B A B …), each keeping its least",
    )
    parser.add_argument(
        "--inner",
        default="auto",
        help="runs of a method per measured sample, figures per run (auto: ⌈2000 / N⌉, 1 from 2,000 nodes)",
    )
    parser.add_argument(
        "--anatomy", action="store_true", help="also cost each live query and floor family alone, serially"
    )
    parser.add_argument("--backfill-jobs", type=int, default=2, help="promtool processes at once")
    parser.add_argument("--backfill-only", action="store_true", help="build (or check) the TSDB and stop")
    parser.add_argument(
        "--assess-rss", action="store_true", help="also measure assess peak RSS per N (assess_memory.py)"
    )
    args = parser.parse_args(argv)
    sweep = [int(s) for s in args.shard_nodes.split(",")]
    SHARD_NODES = sweep[0]
    sizes = tuple(int(s) for s in args.sizes.split(","))
    binaries = find_binaries()
    if binaries is None:
        print("prometheus/promtool not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="collect-scale-") as tmp:
        t0 = time.perf_counter()
        server = start(binaries, Path(args.data_dir or tmp), sizes, args.backfill_jobs)
        if args.backfill_only:
            server.stop()
            print(f"backfilled in {time.perf_counter() - t0:.0f} s")
            return 0
        samples = sum(sizes) * (GPUS * len(FAMILIES) + 1) * len(TIMES)
        print(
            f"backfill + start: {time.perf_counter() - t0:.0f} s — {sum(sizes)} nodes × {GPUS} GPUs, "
            f"{len(TIMES)} scrapes at {SCRAPE} s, {samples / 1e6:.1f} M samples; window {WINDOW} s, step {STEP} s"
        )
        try:
            print(f"{'nodes':>6} {'method':<14} " + " ".join(f"{c:>13}" for c in COLS))
            rows: list[tuple[int, dict[str, dict[str, float]]]] = []
            medians: list[tuple[int, dict[str, dict[str, float]]]] = []
            for size in sizes:
                joiner = joiner_for(size)
                IN_FLIGHT = 4
                with prom.PrometheusClient(server.url, timeout=600) as warm:
                    floor(warm, size, joiner)  # warm the page cache
                with PeakClient(server.url, timeout=600) as peak:
                    live(peak, size, joiner)  # how many queries the product keeps in flight here
                IN_FLIGHT = peak.peak
                print(
                    f"{size:>6} the live path keeps {IN_FLIGHT} queries in flight: so do the anchor and the floor"
                )
                asked = args.methods.split(",")
                methods: list[tuple[str, Method]] = [("floor", floor), ("anchor", anchor), ("live", live)]
                methods = [(n, fn) for n, fn in methods if n == "floor" or n in asked]
                runs: list[tuple[str, Method, int]] = [(name, fn, sweep[0]) for name, fn in methods]
                for per_shard in sweep:
                    SHARD_NODES = per_shard
                    for name, fn in (("sharded", sharded), ("devices", devices), ("uuids", uuids)):
                        label = f"{name}/{shard_count(name, size)}" if len(sweep) > 1 else name
                        # the same shard count as an earlier size of the sweep runs once
                        if name in asked and size > per_shard and label not in {r[0] for r in runs}:
                            runs.append((label, fn, per_shard))
                rounds, each = (args.repeat, 1) if args.interleave else (1, args.repeat)
                inner = inner_runs(args.inner, size)
                if inner > 1:
                    print(
                        f"{size:>6} each sample runs a method {inner} times in a row; figures per run",
                        flush=True,
                    )
                results: dict[str, dict[str, float]] = {}
                samples: dict[str, list[dict[str, float]]] = {}
                for k in range(rounds):
                    for label, fn, per_shard in runs:  # interleaved: load drift hits every method alike
                        SHARD_NODES = per_shard
                        r = measure(fn, server, size, joiner, each, inner)
                        samples.setdefault(label, []).append(r)
                        if label not in results or r["total_cpu_s"] < results[label]["total_cpu_s"]:
                            results[label] = r
                        shown = f"{label}#{k + 1}" if rounds > 1 else label
                        digits = 3 if inner > 1 else 2  # per-run figures of a small cluster are ms
                        print(
                            f"{size:>6} {shown:<14} " + " ".join(f"{r[c]:>13.{digits}f}" for c in COLS),
                            flush=True,
                        )
                SHARD_NODES = sweep[0]
                rows.append((size, results))
                medians.append((size, {label: _medians(runs_) for label, runs_ in samples.items()}))
            print_ratios(rows)
            if args.repeat >= 3:
                print_ratios(medians, "median of its samples, figure by figure")
            if args.anatomy:
                for size in sizes:
                    anatomy(server, size, max(1, args.repeat))
            if args.assess_rss:
                from assess_memory import assess_rss

                assess_rss(server.url, sizes, shard_nodes=sweep[0])
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
