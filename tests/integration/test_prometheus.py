"""The live path against a real Prometheus 2.x: same verdicts as the snapshot path, constant query count.

GIVEN a small cluster whose DCGM series (shaped like the gpu-operator scrapes in ``data/dcgm``: labels
``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname`` = exporter pod, ``instance`` = exporter pod IP,
workload ``namespace``/``pod``/``container``) are backfilled into Prometheus with promtool,
WHEN the snapshot path reads ``query_range`` answers of every metric and the live path runs
``collect_live`` on the same server,
THEN ``plan`` gives the same verdicts, reasons and coverage on both, and the live path issues the same
number of queries for 3 nodes as for 30.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.adapters.prometheus import PrometheusClient, collect_live, plan_queries
from rightsizer.adapters.secrets import resolve_secret
from rightsizer.adapters.snapshot_dir import _parse_matrix
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.observation import (
    METRICS_FORMAT,
    file_kind,
    observation_queries,
    signals_from_observation,
)
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import (
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    POWER,
    PROF_ACTIVE,
    UP,
    Window,
)
from tests.builders import AT, STEP, WINDOW, exporter_pod, gpu_node, pod, snapshot

if TYPE_CHECKING:  # importing it at run time would defeat pytest's assertion rewriting of the plugin
    from tests.support.prometheus_server import PrometheusServer, Sample

pytest_plugins = ["tests.support.prometheus_server", "tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

END = AT.timestamp()
SCRAPE = 15.0
JOB = "gpu-operator/nvidia-dcgm-exporter"
# Raw scrapes are not on step points (phase 7 s), as in life; they span W + 15 min before ``at``.
RAW_TIMES = [END - WINDOW - 900 + 7 + SCRAPE * k for k in range(int((WINDOW + 900) / SCRAPE))]

Value = Callable[[float], float | None]
"""Value at Unix time t, or None for no sample."""


def const(v: float) -> Value:
    return lambda _t: v


ZERO, FB, IDLE_W, ONE = const(0.0), const(300.0), const(27.0), const(1.0)


def energy_counter(watts: float) -> Value:
    start = END - WINDOW - 900
    return lambda t: 9.8e10 + (t - start) * watts * 1000.0  # mJ


class Cluster:
    """Nodes, pods and raw DCGM samples of a test cluster, built device by device."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.families: dict[str, list[tuple[dict[str, str], list[Sample]]]] = {}

    def add(
        self, metric: str, labels: Mapping[str, str], value: Value, times: Iterable[float] = RAW_TIMES
    ) -> None:
        samples: list[Sample] = []
        for t in times:
            v = value(t)
            if v is not None:
                samples.append((t, v))
        if samples:
            self.families.setdefault(metric, []).append((dict(labels), samples))

    def node(
        self, name: str, index: int, *, instance_type: str = "g5.12xlarge", gpus: int = 4, **kw: Any
    ) -> tuple[str, str]:
        """Add a Node and its dcgm-exporter pod; returns (exporter pod name, exporter IP)."""
        ip = f"10.1.{index}.10"
        self.nodes.append(gpu_node(name, instance_type=instance_type, gpus=gpus, ip=f"10.0.{index}.5", **kw))
        exporter = f"nvidia-dcgm-exporter-{index:05d}"
        self.pods.append(exporter_pod(name, ip, exporter))
        return exporter, ip

    def device(
        self,
        exporter: str,
        ip: str,
        gpu: int,
        uuid: str,
        *,
        model: str = "NVIDIA A10G",
        util: Value | None = ZERO,
        prof: Value | None = None,
        fb_used: Value | None = FB,
        fb_total: float = 23028.0,
        power: Value | None = IDLE_W,
        energy: Value | None = None,
        workload: Callable[[float], Mapping[str, str]] | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """One physical GPU's series; ``workload(t)`` gives the pod labels of the sample at t (may change)."""
        base = {
            "gpu": str(gpu),
            "UUID": uuid,
            "device": f"nvidia{gpu}",
            "modelName": model,
            "pci_bus_id": f"00000000:{16 + gpu:02X}:00.0",
            "Hostname": exporter,
            "DCGM_FI_DRIVER_VERSION": "535.183.01",
            "instance": f"{ip}:9400",
            "job": JOB,
            **(extra or {}),
        }
        energy = energy or energy_counter(30.0)
        free = (lambda t: None if (u := fb_used(t)) is None else fb_total - u) if fb_used else None
        for metric, fn in (
            (GPU_UTIL, util),
            (PROF_ACTIVE, prof),
            (FB_USED, fb_used),
            (FB_FREE, free),
            (POWER, power),
            (ENERGY, energy),
        ):
            if fn is None:
                continue
            if workload is None:
                self.add(metric, base, fn)
                continue
            by_labels: dict[tuple[tuple[str, str], ...], list[float]] = {}
            for t in RAW_TIMES:
                by_labels.setdefault(tuple(sorted(workload(t).items())), []).append(t)
            for wl, ts in by_labels.items():
                self.add(metric, {**base, **dict(wl)}, fn, ts)

    def up(self, ip: str, value: Value = ONE) -> None:
        self.add(UP, {"instance": f"{ip}:9400", "job": JOB}, value)


def during(start_s: float, end_s: float, inside: float | None, outside: float | None) -> Value:
    """``inside`` for END-start_s < t ≤ END-end_s (seconds before ``at``), else ``outside``."""
    return lambda t: inside if END - start_s < t <= END - end_s else outside


def build_cluster() -> Cluster:
    c = Cluster()
    # idle: joined through the exporter pod IP (Hostname is the exporter pod's name, BUG-01).
    exp, ip = c.node("gpu-idle", 1)
    for g in range(4):
        c.device(exp, ip, g, f"GPU-idle-{g}", power=lambda t, g=g: 27.0 + g + 0.5 * math.sin(t / 60))
    c.up(ip)
    # busy: GPU 0 trains (workload pod label changes half-way: two series of one device), GPU 1 from -10 min.
    exp, ip = c.node("gpu-busy", 2)
    c.pods.append(pod("train-b", "gpu-busy", namespace="ml", gpus=1, pod_ip="10.1.2.77"))
    c.device(
        exp,
        ip,
        0,
        "GPU-busy-0",
        util=const(85.0),
        fb_used=const(18000.0),
        power=const(250.0),
        workload=lambda t: {
            "namespace": "ml",
            "pod": "train-a" if t < END - 900 else "train-b",
            "container": "main",
        },
    )
    c.device(exp, ip, 1, "GPU-busy-1", util=during(600, 0, 40.0, 0.0), power=during(600, 0, 180.0, 27.0))
    for g in (2, 3):
        c.device(exp, ip, g, f"GPU-busy-{g}")
    c.up(ip)
    # frozen: the exporter serves cached values; the energy counter does not move.
    exp, ip = c.node("gpu-frozen", 3)
    for g in range(4):
        c.device(exp, ip, g, f"GPU-frozen-{g}", energy=const(7.7e10))
    c.up(ip)
    # half: only 2 of 4 GPUs report.
    exp, ip = c.node("gpu-half", 4)
    for g in range(2):
        c.device(exp, ip, g, f"GPU-half-{g}")
    c.up(ip)
    # MIG (mixed): GPU 0 has two 1g.5gb instances (PROF only counts; their GPU_UTIL reads 100, BUG-02).
    exp, ip = c.node(
        "gpu-mig",
        5,
        instance_type="p4d.24xlarge",
        gpus=7,
        capacity={"nvidia.com/mig-1g.5gb": "2"},
        nodegroup="gpu-a100",
    )
    c.device(
        exp,
        ip,
        0,
        "GPU-mig-0",
        model="NVIDIA A100-SXM4-40GB",
        fb_total=40536.0,  # what DCGM reports for an A100-SXM4-40GB (the catalog: 40,960 MiB)
        util=None,
        power=const(60.0),
        extra={"node": "gpu-mig"},
    )
    for gi in ("13", "14"):
        mig = {
            "gpu": "0",
            "UUID": "GPU-mig-0",
            "GPU_I_ID": gi,
            "GPU_I_PROFILE": "1g.5gb",
            "Hostname": exp,
            "instance": f"{ip}:9400",
            "job": JOB,
            "node": "gpu-mig",
        }
        c.add(PROF_ACTIVE, mig, const(0.001))
        c.add(GPU_UTIL, mig, const(100.0))
        c.add(FB_USED, mig, const(12.0))
        c.add(FB_FREE, mig, const(4852.0))
    for g in range(1, 8):
        c.device(
            exp,
            ip,
            g,
            f"GPU-mig-{g}",
            model="NVIDIA A100-SXM4-40GB",
            fb_total=40536.0,  # what DCGM reports for an A100-SXM4-40GB (the catalog: 40,960 MiB)
            prof=const(0.002),
            power=const(55.0),
            extra={"node": "gpu-mig"},
        )
    c.up(ip)
    # gap: the exporter failed scrapes for 10 minutes (up == 0): coverage below min on both paths.
    exp, ip = c.node("gpu-gap", 6)
    for g in range(4):
        c.device(
            exp,
            ip,
            g,
            f"GPU-gap-{g}",
            util=during(1200, 600, None, 0.0),
            fb_used=during(1200, 600, None, 300.0),
            power=during(1200, 600, None, 27.0),
            energy=lambda t: None if END - 1200 < t <= END - 600 else energy_counter(30.0)(t),
        )
    c.up(ip, during(1200, 600, 0.0, 1.0))
    # stale: the exporter stopped 8 minutes ago (still 0.9 coverage through the 5 min lookback).
    exp, ip = c.node("gpu-stale", 7)
    for g in range(4):
        c.device(
            exp,
            ip,
            g,
            f"GPU-stale-{g}",
            util=during(1e9, 480, 0.0, None),
            fb_used=during(1e9, 480, 300.0, None),
            power=during(1e9, 480, 27.0, None),
            energy=lambda t: energy_counter(30.0)(t) if t <= END - 480 else None,
        )
    c.up(ip)
    # non-finite: GPU 2 reports NaN utilization for 2 minutes, GPU 3 +Inf power.
    exp, ip = c.node("gpu-nan", 8)
    for g in range(4):
        util = during(700, 580, math.nan, 0.0) if g == 2 else const(0.0)
        power = during(400, 280, math.inf, 27.0) if g == 3 else const(27.0)
        c.device(exp, ip, g, f"GPU-nan-{g}", util=util, power=power)
    c.up(ip)
    # disagree: PROF says 90 %, GPU_UTIL 10 % on one GPU.
    exp, ip = c.node("gpu-disagree", 9)
    for g in range(4):
        c.device(
            exp,
            ip,
            g,
            f"GPU-dis-{g}",
            prof=const(0.9 if g == 0 else 0.0),
            util=const(10.0 if g == 0 else 0.0),
        )
    c.up(ip)
    # an exporter nobody can place: unmapped on both paths.
    c.device("ghost-exporter", "10.9.9.9", 0, "GPU-ghost-0")
    return c


def snapshot_path(server: PrometheusServer, base: ClusterSnapshot) -> ClusterSnapshot:
    """What ``rightsizer snapshot`` records (``observation_queries``, format 2), decoded as ``plan --snapshot``
    decodes a directory."""
    docs: dict[str, Any] = {}
    with PrometheusClient(server.url) as client:
        for q in observation_queries():
            start, end = q.span(END, WINDOW, STEP)
            docs[q.path] = json.loads(client.query_range_raw(q.expr(STEP, WINDOW), start, end, STEP))
    files: dict[str, dict[str, Any]] = {}
    for path, doc in docs.items():
        kind, stem = file_kind(path.removeprefix("metrics/").removesuffix(".json"))
        files.setdefault(kind, {})[stem] = _parse_matrix(stem, doc)
    problems = [m.problem for kind in files.values() for m in kind.values() if m.problem]
    assert not problems
    meta = dataclasses.replace(base.meta, metrics_format=METRICS_FORMAT)
    extras = {k: v for k, v in files.items() if k not in ("step", "timestamp")}
    return dataclasses.replace(
        base, meta=meta, metrics=files["step"], timestamps=files["timestamp"], metric_extras=extras
    )


def node_rows(p: Any) -> dict[str, tuple[str, list[str], float, float | None, float | None]]:
    return {
        n.node: (n.verdict, n.reasons, n.coverage, n.gpu_activity_max_pct, n.fb_used_max_mib) for n in p.nodes
    }


def base_snapshot(c: Cluster) -> ClusterSnapshot:
    return snapshot(c.nodes, c.pods, {})


def live_snapshot(
    server: PrometheusServer, base: ClusterSnapshot, policy: Policy
) -> tuple[ClusterSnapshot, int]:
    window = Window.ending(AT, policy.idle_window, STEP)
    joiner = NodeJoiner(base.nodes, base.pods)
    with PrometheusClient(server.url) as client:
        signals = collect_live(client, joiner, window, policy)
        requests = client.stats.requests
    return dataclasses.replace(base, signals=signals, source="live"), requests


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return build_cluster()


@pytest.fixture
def server(cluster: Cluster, prometheus_factory: Any) -> PrometheusServer:
    return prometheus_factory(cluster.families)


def test_live_and_snapshot_paths_decide_alike(cluster: Cluster, server: PrometheusServer) -> None:
    # GIVEN the same series behind both paths (a budget large enough that idle nodes show as idle, and no
    # warm floor: the p4d family's default would keep the lone MIG node whatever its evidence)
    policy = Policy(max_nodes_per_run=10, warm_floor={"p4d": 0})
    base = base_snapshot(cluster)
    # WHEN each path feeds plan()
    from_snapshot = plan(snapshot_path(server, base), policy)
    live, _ = live_snapshot(server, base, policy)
    from_live = plan(live, policy)
    # THEN every node gets the same verdict, reasons, coverage and figures
    snap_rows, live_rows = node_rows(from_snapshot), node_rows(from_live)
    assert live_rows == snap_rows
    assert [a.action_id for a in from_live.actions] == [a.action_id for a in from_snapshot.actions]
    assert {u.metric for u in from_live.unmapped} == {u.metric for u in from_snapshot.unmapped}
    # AND the cases are what they claim to be (so equality is not vacuous)
    verdicts = {n: r[0] for n, r in live_rows.items()}
    reasons = {n: " ".join(r[1]) for n, r in live_rows.items()}
    assert verdicts["gpu-idle"] == "idle", "\n".join(f"{k}: {v}" for k, v in live_rows.items())
    assert verdicts["gpu-busy"] in ("busy", "underutilized")
    assert "activity_above_threshold:85%" in reasons["gpu-busy"]
    assert verdicts["gpu-frozen"] == "unknown" and "exporter_frozen" in reasons["gpu-frozen"]
    assert "no_series:2_of_4_devices" in reasons["gpu-half"]
    assert verdicts["gpu-mig"] == "idle", reasons["gpu-mig"]
    assert "coverage_below_min" in reasons["gpu-gap"]
    assert live_rows["gpu-gap"][2] == pytest.approx(20 / 30)  # up == 1 on 20 of 30 steps
    assert "stale_metrics" in reasons["gpu-stale"]
    assert "non_finite:DCGM_FI_DEV_GPU_UTIL" in reasons["gpu-nan"]
    assert "non_finite:DCGM_FI_DEV_POWER_USAGE" in reasons["gpu-nan"]
    assert "signals_disagree" in reasons["gpu-disagree"]
    assert from_live.unmapped, "the ghost exporter is unmapped"


def test_live_devices_match_snapshot_devices_field_by_field(
    cluster: Cluster, server: PrometheusServer
) -> None:
    """Coverage, active step slots and the other per-device signals are equal, not just the verdicts."""
    policy = Policy()
    base = base_snapshot(cluster)
    snap = snapshot_path(server, base)
    window = Window.ending(AT, policy.idle_window, STEP)
    joiner = NodeJoiner(base.nodes, base.pods)
    files = {"step": snap.metrics, "timestamp": snap.timestamps, **snap.metric_extras}
    expected = signals_from_observation(files, joiner, window, policy.gpu_activity_max_pct)
    live, _ = live_snapshot(server, base, policy)
    got = live.signals
    assert got.problems == expected.problems == ()
    assert got.present == expected.present
    assert got.up_coverage == expected.up_coverage
    assert sorted(got.devices) == sorted(expected.devices)
    for node, devices in expected.devices.items():
        assert got.devices[node] == devices, node


def test_query_count_does_not_grow_with_nodes(prometheus_factory: Any) -> None:
    # GIVEN two clusters, 3 and 30 idle nodes
    policy = Policy()
    counts = []
    for n in (3, 30):
        c = Cluster()
        for i in range(n):
            exp, ip = c.node(f"gpu-{i:03d}", 10 + i)
            for g in range(4):
                c.device(exp, ip, g, f"GPU-{i}-{g}")
            c.up(ip)
        server = prometheus_factory(c.families)
        # WHEN the live path collects
        live, requests = live_snapshot(server, base_snapshot(c), policy)
        assert len(live.signals.devices) == n
        counts.append(requests)
    # THEN it sends the same number of requests (one per planned query, no retries)
    window = Window.ending(AT, policy.idle_window, STEP)
    assert counts == [len(plan_queries(window))] * 2


def test_a_server_refusing_queries_makes_metrics_problems_not_holes(
    cluster: Cluster, prometheus_factory: Any
) -> None:
    # GIVEN a real Prometheus that refuses any query loading more than 100 samples (422 execution)
    server = prometheus_factory(cluster.families, extra_args=["--query.max-samples=100"])
    policy = Policy()
    base = base_snapshot(cluster)
    window = Window.ending(AT, policy.idle_window, STEP)
    # WHEN the live path collects
    with PrometheusClient(server.url) as client:
        signals = collect_live(client, NodeJoiner(base.nodes, base.pods), window, policy)
    # THEN every metric is a problem and every GPU node unknown with partial_response — none dropped
    assert set(signals.problems) == {GPU_UTIL, PROF_ACTIVE, FB_USED, FB_FREE, POWER, ENERGY, UP}
    p = plan(dataclasses.replace(base, signals=signals), policy)
    assert len(p.nodes) == len(cluster.nodes)
    assert {n.verdict for n in p.nodes} == {"unknown"}
    assert all(f"partial_response:{GPU_UTIL}" in n.reasons for n in p.nodes)


def test_a_failing_series_shard_makes_only_its_nodes_unknown(prometheus_factory: Any) -> None:
    """Item 3 of issue 11: a shard that still fails makes only the nodes it feeds unknown."""
    from rightsizer.domain.observation import SeriesShard

    # GIVEN 1 node of 1 GPU and 12 nodes of 8 GPUs, every DCGM series labelled with its node, all quiet,
    # on a real Prometheus refusing any query that holds over 1,000 samples (422 execution): the
    # per-step activity answer of the 12-node shard holds 96 series × 30 steps, the 1-node shard's 30
    c = Cluster()
    names = [f"gpu-{i:02d}" for i in range(13)]
    for i, name in enumerate(names):
        gpus = 1 if i == 0 else 8
        exporter, ip = c.node(name, 10 + i, instance_type="g5.xlarge" if i == 0 else "g5.48xlarge", gpus=gpus)
        for g in range(gpus):
            c.device(exporter, ip, g, f"GPU-{i}-{g}", extra={"node": name})
        c.up(ip)
    server = prometheus_factory(c.families, extra_args=["--query.max-samples=1000"])
    policy = Policy(max_nodes_per_run=20)
    base = base_snapshot(c)
    window = Window.ending(AT, policy.idle_window, STEP)
    shards = [SeriesShard("node", (names[0],)), SeriesShard("node", tuple(names[1:]))]
    # WHEN the live path collects in those two series shards
    with PrometheusClient(server.url) as client:
        signals = collect_live(
            client, NodeJoiner(base.nodes, base.pods, "node"), window, policy, "node", shards=shards
        )
    # THEN only the big shard's activity failed, and only for its nodes; the small shard's node is judged
    # on its data (idle), every node of the failed shard is unknown
    assert_only_the_failed_shard_is_unknown(signals, base, policy, ok=names[0], failed=names[1:])
    # AND unsharded, the same server fails the whole activity answer: every node would be unknown
    with PrometheusClient(server.url) as client:
        whole = collect_live(client, NodeJoiner(base.nodes, base.pods, "node"), window, policy, "node")
    assert GPU_UTIL in whole.problems


def assert_only_the_failed_shard_is_unknown(
    signals: Any, base: Any, policy: Policy, *, ok: str, failed: list[str]
) -> None:
    """The activity answer failed for the nodes of ``failed`` only: no whole-metric problem, those nodes
    ``unknown`` with ``partial_response:<GPU_UTIL>``, and the quiet node ``ok`` judged idle on its data."""
    assert signals.problems == ()
    assert set(signals.node_problems) == set(failed)
    assert {m for ms in signals.node_problems.values() for m in ms} == {GPU_UTIL}
    rows = {n.node: n for n in plan(dataclasses.replace(base, signals=signals), policy).nodes}
    assert rows[ok].verdict == "idle", rows[ok].reasons
    for name in failed:
        assert rows[name].verdict == "unknown"
        assert f"partial_response:{GPU_UTIL}" in rows[name].reasons, rows[name].reasons


def add_mig_instances(c: Cluster, exporter: str, ip: str, gpu: int, uuid: str, ids: Iterable[str]) -> None:
    """GPU instances of a MIG-partitioned GPU: each carries its parent's ``gpu`` index and ``UUID``."""
    for gi in ids:
        mig = {"gpu": str(gpu), "UUID": uuid, "GPU_I_ID": gi, "GPU_I_PROFILE": "1g.5gb"}
        mig |= {"Hostname": exporter, "instance": f"{ip}:9400", "job": JOB}
        c.add(PROF_ACTIVE, mig, const(0.001))
        c.add(GPU_UTIL, mig, const(0.0))
        c.add(FB_USED, mig, const(12.0))
        c.add(FB_FREE, mig, const(4852.0))


def test_a_failing_device_shard_makes_only_the_nodes_of_its_gpus_unknown(prometheus_factory: Any) -> None:
    """Series shards without a node-name label (``device_shards``, by GPU index): a shard that fails
    makes only the nodes of the GPUs it holds unknown."""
    from rightsizer.domain.observation import device_shards

    # GIVEN 1 node of 1 GPU (index 0) and 3 nodes of 8 GPUs whose odd GPUs are MIG-partitioned into 2
    # instances each, no node-name label, all quiet, on a real Prometheus refusing any query over 1,000
    # samples: in 2 device shards (even / odd GPU index) the odd shard's per-step activity answer holds
    # (12 GPUs + 24 instances) × 30 steps, the even shard's 13 GPUs × 30
    c = Cluster()
    names = [f"gpu-{i:02d}" for i in range(4)]
    for i, name in enumerate(names):
        gpus = 1 if i == 0 else 8
        exporter, ip = c.node(
            name, 10 + i, instance_type="g5.xlarge" if i == 0 else "p4d.24xlarge", gpus=gpus
        )
        for g in range(gpus):
            c.device(exporter, ip, g, f"GPU-{i:02d}{g}")
            if g % 2:
                add_mig_instances(c, exporter, ip, g, f"GPU-{i:02d}{g}", ("1", "2"))
        c.up(ip)
    server = prometheus_factory(c.families, extra_args=["--query.max-samples=1000"])
    policy = Policy(max_nodes_per_run=20)
    base = base_snapshot(c)
    window = Window.ending(AT, policy.idle_window, STEP)
    shards = device_shards(2)
    # WHEN the live path collects in those two device shards
    with PrometheusClient(server.url) as client:
        signals = collect_live(client, NodeJoiner(base.nodes, base.pods), window, policy, shards=shards)
    # THEN only the odd shard's activity failed, and only for the nodes of its GPUs
    assert_only_the_failed_shard_is_unknown(signals, base, policy, ok=names[0], failed=names[1:])


@pytest.mark.parametrize("count", [2, 4, 16])
def test_device_shards_partition_odd_gpu_labels_exactly_on_prometheus(
    prometheus_factory: Any, count: int
) -> None:
    """GIVEN DCGM series with every ``gpu`` label form a fleet may carry — indices 0-15, 16 and over,
    ``00``, ``x``, none at all — MIG instances (their parent's index), upper-case and non-NVIDIA UUIDs, a
    series without ``UUID``, and a pod-label change, on a real Prometheus
    WHEN the live path collects in device shards (``gpu=~"…"`` sets, the rest a negative set)
    THEN Prometheus puts every series in exactly one shard, the one ``DeviceShard.holds`` names, and the
    merged facts equal the unsharded ones."""
    from rightsizer.domain.observation import device_shards

    c = Cluster()
    exporter, ip = c.node("gpu-a", 1, instance_type="p3dn.24xlarge", gpus=8)
    for g in range(8):
        c.device(exporter, ip, g, f"GPU-{g:x}A{g}-UPPER-CASE-{g:X}F", util=const(10.0 * g))
    add_mig_instances(c, exporter, ip, 1, "GPU-1A1-UPPER-CASE-1F", ("7", "8"))
    exporter, ip = c.node("gpu-b", 2, instance_type="p4d.24xlarge", gpus=8)
    for g, label in enumerate(("8", "15", "16", "31", "00", "x", " 1")):
        c.device(exporter, ip, 0, f"GPU-b-{g}", extra={"gpu": label})
    c.device(exporter, ip, 0, "MIG-b-unlabelled", workload=lambda t: {"pod": "a" if t < END - 600 else "b"})
    for family in c.families.values():  # the last two devices lose their gpu label, one its UUID as well
        for labels, _ in family:
            if labels.get("UUID") == "MIG-b-unlabelled":
                del labels["gpu"]
            if labels.get("UUID") == "GPU-b-6":
                del labels["UUID"]
    c.up(ip)
    server = prometheus_factory(c.families)
    policy = Policy(max_nodes_per_run=20)
    base = base_snapshot(c)
    window = Window.ending(AT, policy.idle_window, STEP)
    shards = device_shards(count)
    joiner = NodeJoiner(base.nodes, base.pods)
    with PrometheusClient(server.url) as client:
        whole = collect_live(client, joiner, window, policy)
        sharded = collect_live(client, joiner, window, policy, shards=shards)
        every = {
            json.dumps(s["metric"], sort_keys=True)
            for s in client.query('{__name__=~"DCGM_.+"}[1h]', END)["data"]["result"]
        }
        held: dict[str, list[int]] = {}
        for i, shard in enumerate(shards):
            for s in client.query(f'{{__name__=~"DCGM_.+",{shard.matcher()}}}[1h]', END)["data"]["result"]:
                held.setdefault(json.dumps(s["metric"], sort_keys=True), []).append(i)
    assert set(held) == every and len(every) > 60
    for series, where in held.items():
        assert len(where) == 1, (series, where)
        assert [i for i, s in enumerate(shards) if s.holds(json.loads(series).get("gpu", ""))] == where, (
            series
        )
    assert len({w[0] for w in held.values()}) > 1  # not vacuous
    assert sharded.devices == whole.devices
    assert sharded.up_coverage == whole.up_coverage
    assert sharded.unmapped == whole.unmapped
    assert (sharded.problems, sharded.present, sharded.node_problems) == (whole.problems, whole.present, {})


def test_ssm_and_secretsmanager_references_resolve_against_moto(moto_server: Any, boto_session: Any) -> None:
    # GIVEN a SecureString parameter and a secret in a moto server (real HTTP, boto3 clients)
    ssm = boto_session.client("ssm", endpoint_url=moto_server.endpoint_url)
    sm = boto_session.client("secretsmanager", endpoint_url=moto_server.endpoint_url)
    ssm.put_parameter(Name="/rightsizer/amp-token", Value="ssm-t0ken", Type="SecureString", Overwrite=True)
    sm.create_secret(Name="rightsizer/prometheus-password", SecretString="sm-pa55")
    # WHEN resolved THEN the decrypted values come back
    assert resolve_secret("ssm:/rightsizer/amp-token", ssm=ssm) == "ssm-t0ken"
    assert resolve_secret("secretsmanager:rightsizer/prometheus-password", secretsmanager=sm) == "sm-pa55"
    # AND a missing one fails closed with a ConfigError naming the field
    from rightsizer.domain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prometheus\.secret"):
        resolve_secret("ssm:/nope", ssm=ssm, field="prometheus.secret")
    with pytest.raises(ConfigError):
        resolve_secret("secretsmanager:nope", secretsmanager=sm)
