"""Every raw DCGM sample counts, whatever the step (issue 11, metrics format 2), on a real Prometheus 2.x.

GIVEN DCGM series backfilled into Prometheus with promtool (15 s scrapes, off the step grid),
WHEN the live path (``collect_live``) reads them at several steps,
THEN a GPU that works 40 s of every minute — quiet on the minute, exactly where the step points fall —
reads busy at every step (15 s, 30 s, the default 60 s, 5 min), and per-device facts equal the facts
computed in plain Python from the raw samples on randomized fleets with gaps, NaN, MIG instances,
pod-label changes and exporter restarts.

The reference (``reference_signals``) is written from the contract in docs/policy.md "How a node is judged",
not from ``domain.observation``: per step [t − step, t] (a range selector's bounds, issue 33) the maximum of every finite raw sample, coverage =
steps holding one, maxima over every finite sample, non-finite = any NaN/±Inf raw sample in the window,
freshness = the newest raw sample, judged against the scrape interval = W ÷ the scrape attempts of the
device's own exporter (its ``up`` samples), liveness = the counter's samples differ, framebuffer total =
average used + average free.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.adapters.prometheus import PrometheusClient, collect_live
from rightsizer.domain.join import NodeJoiner
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
    DeviceKey,
    Window,
)
from tests.builders import AT, WINDOW, exporter_pod, gpu_node, snapshot

if TYPE_CHECKING:
    from tests.support.prometheus_server import Sample

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

END = AT.timestamp()
JOB = "dcgm"
LOOKBACK = 300.0
Families = dict[str, list[tuple[dict[str, str], list["Sample"]]]]


def periodic_busy(t: float) -> bool:
    """Busy 40 s of every minute; quiet the 20 s around the minute ([:50, :10)), where step points fall."""
    return not (t % 60 >= 50 or t % 60 < 10)


def raw_times(phase: float, scrape: float = 15.0) -> list[float]:
    start = END - WINDOW - 600 + phase
    return [round(start + scrape * k, 3) for k in range(int((WINDOW + 600) / scrape))]


def one_gpu_node(families: Families, name: str, index: int, busy: Callable[[float], bool]) -> dict[str, Any]:
    labels = {
        "gpu": "0",
        "UUID": f"GPU-{name}",
        "modelName": "NVIDIA A10G",
        "Hostname": f"nvidia-dcgm-exporter-{index:05d}",
        "instance": f"10.1.{index}.10:9400",
        "job": JOB,
        "node": name,
    }
    times = raw_times(7.0)  # scrapes at :07, :22, :37, :52 — the last before each minute is quiet
    shapes: dict[str, Callable[[bool], float]] = {
        GPU_UTIL: lambda b: 85.0 if b else 0.0,
        FB_USED: lambda b: 15000.0 if b else 300.0,
        FB_FREE: lambda b: 7000.0 if b else 21700.0,
        POWER: lambda b: 180.0 if b else 27.0,
    }
    for metric, shape in shapes.items():
        families.setdefault(metric, []).append((labels, [(t, shape(busy(t))) for t in times]))
    energy = [(t, 9.8e10 + (t - times[0]) * 27_000.0) for t in times]
    families.setdefault(ENERGY, []).append((labels, energy))
    families.setdefault(UP, []).append(
        ({"instance": labels["instance"], "job": JOB}, [(t, 1.0) for t in times])
    )
    return gpu_node(name, instance_type="g5.2xlarge", gpus=1, ip=f"10.0.{index}.5")


@pytest.fixture(scope="module")
def periodic_server(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    families: Families = {}
    nodes = [
        one_gpu_node(families, "gpu-periodic", 1, periodic_busy),
        one_gpu_node(families, "gpu-quiet", 2, lambda _t: False),
    ]

    def write(path: Any) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(families))

    server = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("prom"), write_openmetrics=write)
    yield server, nodes
    server.stop()


@pytest.mark.parametrize("step", [15, 30, 60, 300])
def test_a_gpu_quiet_only_on_the_minute_reads_busy_at_every_step(periodic_server: Any, step: int) -> None:
    server, nodes = periodic_server
    policy = Policy()
    base = snapshot(nodes, [], {})
    window = Window.ending(AT, policy.idle_window, step)
    with PrometheusClient(server.url) as client:
        signals = collect_live(client, NodeJoiner(base.nodes, base.pods, "node"), window, policy, "node")
    at_step = dataclasses.replace(
        base, meta=dataclasses.replace(base.meta, step_seconds=step), signals=signals
    )
    rows = {n.node: n for n in plan(at_step, policy).nodes}
    periodic, quiet = rows["gpu-periodic"], rows["gpu-quiet"]
    # THEN the periodic GPU is busy on its measured maxima, fully covered
    assert periodic.verdict != "idle", periodic.reasons
    assert periodic.gpu_activity_max_pct == 85.0
    assert periodic.fb_used_max_mib == 15000.0
    assert "activity_above_threshold:85%" in periodic.reasons
    assert periodic.coverage == 1.0
    # AND the same exporter shape with no work is idle (the comparison is not vacuous)
    assert quiet.verdict == "idle", quiet.reasons


# ------------------------------------------------------------------------------- randomized fleets


@dataclass
class Fleet:
    """Nodes, pods and raw samples: ``raw[metric][device key] = [(t, v)]`` over every series of a device."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    families: Families = field(default_factory=dict)
    raw: dict[str, dict[DeviceKey, list[tuple[float, float]]]] = field(default_factory=dict)
    up: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    by_labels: dict[tuple[str, DeviceKey], dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = (
        field(default_factory=dict)
    )

    def series(
        self, metric: str, key: DeviceKey, labels: dict[str, str], samples: list[tuple[float, float]]
    ) -> None:
        if samples:
            self.families.setdefault(metric, []).append((labels, samples))
            self.raw.setdefault(metric, {}).setdefault(key, []).extend(samples)
            self.by_labels.setdefault((metric, key), {})[tuple(sorted(labels.items()))] = samples


def generate(rng: random.Random, prefix: str, count: int, first_index: int) -> Fleet:
    fleet = Fleet()
    for i in range(count):
        index = first_index + i
        name = f"{prefix}-{i}"
        ip = f"10.2.{index}.10"
        exporter = f"nvidia-dcgm-exporter-{index:05d}"
        mig = rng.random() < 0.3
        gpus = rng.randint(1, 3)
        capacity = {"nvidia.com/mig-1g.5gb": "2"} if mig else None
        fleet.nodes.append(
            gpu_node(
                name,
                instance_type="p4d.24xlarge" if mig else "g5.12xlarge",
                gpus=gpus,
                ip=f"10.3.{index}.5",
                capacity=capacity,
            )
        )
        fleet.pods.append(exporter_pod(name, ip, exporter))
        if rng.random() < 0.25:  # scrapes on the step grid: samples on step points and at end − W
            times = raw_times(0.0)
        else:
            times = raw_times(rng.uniform(0.5, 14.5))
            times = [round(t + rng.uniform(-0.4, 0.4), 3) for t in times]
        # the exporter is down for a while on some nodes (up == 0, no DCGM samples)
        down = (END - rng.uniform(100, WINDOW), 0.0)
        down = (down[0], down[0] + rng.choice([0.0, 0.0, 90.0, 400.0]))
        ups = [(t, 0.0 if down[0] <= t < down[1] else 1.0) for t in times]
        fleet.families.setdefault(UP, []).append(({"instance": f"{ip}:9400", "job": JOB}, ups))
        fleet.up[name] = ups
        alive = [t for t in times if not (down[0] <= t < down[1])]
        for g in range(gpus):
            add_device(fleet, rng, name, g, exporter, ip, alive, mig_parent=mig and g == 0)
    return fleet


def add_device(
    fleet: Fleet,
    rng: random.Random,
    node: str,
    g: int,
    exporter: str,
    ip: str,
    alive: list[float],
    *,
    mig_parent: bool,
) -> None:
    """One GPU's raw samples: missed scrapes, maybe a long gap, a busy burst, NaN, a pod-label change,
    an exporter restart (counter reset) or a frozen counter; a MIG parent gets two 1g.5gb instances."""
    uuid = f"GPU-{node}-{g}"
    base = {
        "gpu": str(g),
        "UUID": uuid,
        "Hostname": exporter,
        "instance": f"{ip}:9400",
        "job": JOB,
        "node": node,
    }
    key: DeviceKey = (node, uuid, "")
    ts = [t for t in alive if rng.random() > 0.05]  # sporadic missed scrapes
    if rng.random() < 0.3:  # a long gap on this GPU
        gap = END - rng.uniform(0, WINDOW)
        width = rng.uniform(60, 600)
        ts = [t for t in ts if not (gap <= t < gap + width)]
    change = END - rng.uniform(0, WINDOW) if rng.random() < 0.3 else math.inf
    restart = END - rng.uniform(0, WINDOW) if rng.random() < 0.2 else math.inf
    frozen = rng.random() < 0.1
    busy_from, busy_to = sorted(END - rng.uniform(0, WINDOW + 300) for _ in range(2))
    level = rng.choice([0.0, 2.0, 35.0, 90.0])
    p_nan = rng.choice([0.0, 0.0, 0.0, 0.02])
    with_prof = rng.random() < 0.5
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for t in ts:
        labels = base
        if change < math.inf:  # the workload on this GPU changed: a second series of the same device
            labels = {**base, "namespace": "ml", "pod": "job-a" if t < change else "job-b"}
        util = level if busy_from <= t < busy_to else float(rng.randint(0, 3))
        values = {
            FB_USED: 300.0 + rng.randint(0, 1) * 9000.0,
            POWER: rng.uniform(25.0, 60.0),
        }
        if not mig_parent:
            values[GPU_UTIL] = util
            if with_prof:
                values[PROF_ACTIVE] = util / 100.0 + rng.uniform(0, 0.01)
        values = {m: math.nan if rng.random() < p_nan else v for m, v in values.items()}
        values[FB_FREE] = 23028.0 - values[FB_USED] if math.isfinite(values[FB_USED]) else math.nan
        for metric, v in values.items():
            series.setdefault((metric, tuple(sorted(labels.items()))), []).append((t, v))
        if frozen:
            energy = 7.7e10
        elif t >= restart:
            energy = 1000.0 + (t - restart) * 30_000.0
        else:
            energy = 9.8e10 + (t - alive[0]) * 30_000.0
        series.setdefault((ENERGY, tuple(sorted(base.items()))), []).append((t, energy))
        if mig_parent:
            for gi in ("13", "14"):
                mlabels = tuple(sorted({**base, "GPU_I_ID": gi, "GPU_I_PROFILE": "1g.5gb"}.items()))
                prof = math.nan if rng.random() < p_nan else util / 100.0
                for metric, v in ((PROF_ACTIVE, prof), (GPU_UTIL, 100.0), (FB_USED, 12.0), (FB_FREE, 4852.0)):
                    series.setdefault((metric, mlabels), []).append((t, v))
    for (metric, labels), samples in series.items():
        gi = dict(labels).get("GPU_I_ID", "")
        fleet.series(metric, (node, uuid, gi) if gi else key, dict(labels), samples)


def _slots(t: float, window: Window) -> list[int]:
    """The steps whose range [t_k − step, t_k] holds ``t`` (t_k = end − k·step): a range selector's
    bounds, both ends included, so a sample on a step point is in both its steps and the sample at the
    window's first instant is in the oldest (issue 33)."""
    n = window.seconds // window.step
    return [k for k in range(n) if window.end - (k + 1) * window.step <= t <= window.end - k * window.step]


def _in_window(t: float, window: Window) -> bool:
    return window.end - window.seconds <= t <= window.end


def _slot_max(samples: list[tuple[float, float]], window: Window) -> dict[int, float]:
    out: dict[int, float] = {}
    for t, v in samples:
        for k in _slots(t, window):
            if math.isfinite(v) and (k not in out or v > out[k]):
                out[k] = v
    return out


def reference_signals(fleet: Fleet, window: Window, threshold: float) -> dict[DeviceKey, dict[str, Any]]:
    """The contract, in plain Python, from the raw samples (docs/policy.md "How a node is judged")."""
    n = window.seconds // window.step
    raw = fleet.raw
    in_window = {
        m: {k: [s for s in v if _in_window(s[0], window)] for k, v in per.items()} for m, per in raw.items()
    }
    present = {m: {k for k, v in per.items() if v} for m, per in in_window.items()}
    keys = present.get(PROF_ACTIVE, set()) | {k for k in present.get(GPU_UTIL, set()) if not k[2]}
    out: dict[DeviceKey, dict[str, Any]] = {}
    for key in keys:
        node, device, gi = key
        parent = (node, device, "")
        names = (PROF_ACTIVE,) if gi else (GPU_UTIL, PROF_ACTIVE)
        per_name = {}
        for name in names:
            if key in present.get(name, ()):
                scale = 100.0 if name == PROF_ACTIVE else 1.0
                per_name[name] = {k: v * scale for k, v in _slot_max(in_window[name][key], window).items()}
        slots: dict[int, float] = {}
        for values in per_name.values():
            for k, v in values.items():
                slots[k] = max(v, slots.get(k, v))
        bad = {m for m in names if any(not math.isfinite(v) for _, v in in_window.get(m, {}).get(key, []))}
        fb_key = key if key in present.get(FB_USED, ()) else parent
        bad |= {
            m
            for m in (FB_USED, FB_FREE)
            if any(not math.isfinite(v) for _, v in in_window.get(m, {}).get(fb_key, []))
        }
        bad |= {
            m
            for m in (POWER, ENERGY)
            if any(not math.isfinite(v) for _, v in in_window.get(m, {}).get(parent, []))
        }
        newest = [
            t
            for m in (GPU_UTIL, PROF_ACTIVE)
            for t, _ in raw.get(m, {}).get(key, [])
            if END - LOOKBACK < t <= END
        ]
        fb = _slot_max(in_window.get(FB_USED, {}).get(fb_key, []), window)
        power = _slot_max(in_window.get(POWER, {}).get(parent, []), window)
        raw_energy = [v for _, v in in_window.get(ENERGY, {}).get(parent, [])]
        raw_power = [v for _, v in in_window.get(POWER, {}).get(parent, [])]
        if raw_energy:  # the counter moved: its samples differ (a non-finite sample decides nothing)
            moved = all(math.isfinite(v) for v in raw_energy) and len(set(raw_energy)) > 1
            liveness = "moving" if moved else "frozen"
        elif raw_power:
            moved = all(math.isfinite(v) for v in raw_power) and len(set(raw_power)) > 1
            liveness = "moving" if moved else "frozen"
        else:
            liveness = "absent"
        # one up sample per scrape attempt of the device's exporter (failed ones too) in the window
        attempts = [t for t, _ in fleet.up.get(node, []) if _in_window(t, window)]
        prof, util = per_name.get(PROF_ACTIVE), per_name.get(GPU_UTIL)
        disagree = bool(prof and util and any(abs(prof[k] - util[k]) > 50 for k in prof.keys() & util.keys()))
        out[key] = {
            "activity_max_pct": max(slots.values()) if slots else None,
            "coverage": min(1.0, len(slots) / n),
            "active_steps": frozenset(k for k, v in slots.items() if v > threshold),
            "signals_disagree": disagree,
            "non_finite": bad,
            "newest_sample": max(newest) if newest else None,
            "has_fb": fb_key in present.get(FB_USED, ()),
            "fb_used_max_mib": max(fb.values()) if fb else None,
            "fb_total_mib": average_total(fleet, fb_key),
            "has_power": parent in present.get(POWER, ()),
            "power_max_w": max(power.values()) if power else None,
            "liveness": liveness,
            "sample_interval_s": window.seconds / len(attempts) if len(attempts) >= 2 else None,
        }
    return out


def average_total(fleet: Fleet, key: DeviceKey) -> float | None:
    """avg(FB_USED) + avg(FB_FREE) over the window of each series of the device (its memory); the largest."""
    totals = []
    for labels, used in fleet.by_labels.get((FB_USED, key), {}).items():
        free = fleet.by_labels.get((FB_FREE, key), {}).get(labels, [])
        u = [v for t, v in used if END - WINDOW <= t <= END]
        f = [v for t, v in free if END - WINDOW <= t <= END]
        if u and f and math.isfinite(total := sum(u) / len(u) + sum(f) / len(f)):
            totals.append(total)
    return max(totals) if totals else None


def reference_up(fleet: Fleet, window: Window) -> dict[str, float]:
    n = window.seconds // window.step
    return {node: sum(1 for v in _slot_max(s, window).values() if v == 1) / n for node, s in fleet.up.items()}


@pytest.fixture(scope="module")
def fleets(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    generated = [generate(random.Random(seed), f"f{seed}", 6, 10 * seed) for seed in range(1, 5)]
    families: Families = {}
    for fleet in generated:
        for metric, series in fleet.families.items():
            families.setdefault(metric, []).extend(series)

    def write(path: Any) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(families))

    server = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("fleets"), write_openmetrics=write)
    yield server, generated
    server.stop()


@pytest.mark.parametrize("step", [15, 60, 300])
def test_live_facts_equal_plain_python_facts_on_random_fleets(fleets: Any, step: int) -> None:
    server, generated = fleets
    policy = Policy()
    window = Window.ending(AT, WINDOW, step)
    for fleet in generated:
        base = snapshot(fleet.nodes, fleet.pods, {})
        joiner = NodeJoiner(base.nodes, base.pods)
        with PrometheusClient(server.url) as client:
            got = collect_live(client, joiner, window, policy, split_seconds=600)
        expected = reference_signals(fleet, window, policy.gpu_activity_max_pct)
        seen = {(d.node, d.device, d.gpu_instance): d for ds in got.devices.values() for d in ds}
        assert set(seen) == set(expected)
        for key, facts in expected.items():
            d = seen[key]
            actual = {name: getattr(d, name) for name in facts}
            actual["non_finite"] = set(d.non_finite)
            for name, tolerance in (("newest_sample", 1e-3), ("fb_total_mib", 1e-6)):
                if facts[name] is not None:
                    assert actual[name] == pytest.approx(facts[name], abs=tolerance), (key, name)
                    actual[name] = facts[name]
            assert actual == facts, key
        up = reference_up(fleet, window)
        assert {k: v for k, v in got.up_coverage.items()} == pytest.approx(up)
    # AND the fleets exercise what they claim to (the equality is not vacuous)
    everything = [f for fleet in generated for f in reference_signals(fleet, window, 5.0).values()]
    assert any(f["non_finite"] for f in everything)
    assert any(f["coverage"] < 0.9 for f in everything)
    assert any(f["liveness"] == "frozen" for f in everything)
    assert any(f["activity_max_pct"] and f["activity_max_pct"] > 30 for f in everything)
    assert any(k[2] for fleet in generated for k in reference_signals(fleet, window, 5.0))


# ------------------------------------------------------------------------------------ series shards


@pytest.mark.parametrize(("step", "per_shard"), [(60, 1), (15, 4)])
def test_series_shards_merge_exactly_into_the_unsharded_facts(fleets: Any, step: int, per_shard: int) -> None:
    """GIVEN the randomized fleets (pod-label variants, MIG, NaN, gaps) on a real Prometheus
    WHEN each DCGM query is split into series shards by the ``node`` label (shards of 1 and 4 nodes,
    plus sub-windows)
    THEN every per-device fact, the ``up`` coverage, the unmapped series and the present metrics equal
    the unsharded collection's, and each shard really was asked on its own."""
    from rightsizer.domain.observation import series_shards

    server, generated = fleets
    policy = Policy()
    window = Window.ending(AT, WINDOW, step)
    nodes = [n for fleet in generated for n in fleet.nodes]
    base = snapshot(nodes, [p for fleet in generated for p in fleet.pods], {})
    joiner = NodeJoiner(base.nodes, base.pods, "node")
    shards = series_shards("node", [n.name for n in base.nodes], per_shard)
    assert len(shards) == -(-len(nodes) // per_shard) > 1
    with PrometheusClient(server.url) as client:
        whole = collect_live(client, joiner, window, policy, "node", split_seconds=600)
        before = client.stats.queries
        sharded = collect_live(client, joiner, window, policy, "node", split_seconds=600, shards=shards)
        asked = client.stats.queries - before
    subs = -(-WINDOW // 600)
    assert asked == subs + 1 + (6 + 6 * subs) * len(shards)  # up: per sub-window + its count; per shard 6 + 6
    assert sharded.devices == whole.devices
    assert sharded.up_coverage == whole.up_coverage
    assert sharded.unmapped == whole.unmapped
    assert (sharded.problems, sharded.present, sharded.node_problems) == (whole.problems, whole.present, {})
    assert sum(len(d) for d in whole.devices.values()) > len(nodes)  # not vacuous


@pytest.mark.parametrize(("step", "count"), [(60, 2), (15, 16)])
def test_gpu_index_shards_merge_exactly_into_the_unsharded_facts(fleets: Any, step: int, count: int) -> None:
    """GIVEN the randomized fleets on a real Prometheus, collected without a node-name label
    WHEN each DCGM query is split into device shards by the GPU index (label ``gpu``; what the live plan
    does by default on a large fleet: ``device_shards``), plus sub-windows
    THEN every per-device fact, the ``up`` coverage, the unmapped series and the present metrics equal
    the unsharded collection's; Prometheus puts every DCGM series in exactly one shard; and the
    devices really are spread over several shards."""
    from rightsizer.domain.observation import device_shards

    server, generated = fleets
    policy = Policy()
    window = Window.ending(AT, WINDOW, step)
    nodes = [n for fleet in generated for n in fleet.nodes]
    base = snapshot(nodes, [p for fleet in generated for p in fleet.pods], {})
    joiner = NodeJoiner(base.nodes, base.pods)
    shards = device_shards(count)
    with PrometheusClient(server.url) as client:
        whole = collect_live(client, joiner, window, policy, split_seconds=600)
        sharded = collect_live(client, joiner, window, policy, split_seconds=600, shards=shards)
        # every series in exactly one shard, as Prometheus itself matches the shards' value sets
        dcgm = '{__name__=~"DCGM_.+"}'
        total = client.query(f"count({dcgm})", END)["data"]["result"]
        per_shard = [
            client.query(f'count({{__name__=~"DCGM_.+",{s.matcher()}}}) or vector(0)', END)["data"]["result"]
            for s in shards
        ]
    counts = [int(float(r[0]["value"][1])) for r in per_shard]
    assert sum(counts) == int(float(total[0]["value"][1])) > 0
    assert sum(1 for c in counts if c) > 1  # not vacuous: the fleet's GPUs fall in several shards
    assert sharded.devices == whole.devices
    assert sharded.up_coverage == whole.up_coverage
    assert sharded.unmapped == whole.unmapped
    assert (sharded.problems, sharded.present, sharded.node_problems) == (whole.problems, whole.present, {})
