"""DCGM series of a scenario as Prometheus ``/api/v1/query_range`` matrix files."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.examplegen.cast import Device, NodeCast
from tests.support.examplegen.scenarios import Scenario
from tests.support.examplegen.sources import (
    EXPORTER_JOB,
    EXPORTER_NS,
    METRIC_FILES,
    TIMESTAMP_METRIC,
    GpuModel,
    Sources,
)

Json = dict[str, Any]

# ----------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------


def _fmt(value: float, decimals: int) -> str:
    """A value as Prometheus renders it (Go FormatFloat 'f', -1: no trailing zeros), at fixed precision."""
    if decimals == 0:
        return str(round(value))
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return text if text != "-0" else "0"


class _Formatter:
    """``_fmt`` memoised on the rounded value: a 5,000-node run formats millions of repeating values."""

    def __init__(self, decimals: int) -> None:
        self.decimals = decimals
        self.scale = 10**decimals
        self.cache: dict[int, str] = {}

    def __call__(self, value: float) -> str:
        units = round(value * self.scale)
        text = self.cache.get(units)
        if text is None:
            text = self.cache[units] = _fmt(units / self.scale, self.decimals)
        return text


def _ts_json(ms: int) -> str:
    """A timestamp as Prometheus' MarshalTimestamp writes it: seconds, ``.mmm`` only when not whole."""
    sec, frac = divmod(ms, 1000)
    return str(sec) if frac == 0 else f"{sec}.{frac:03d}"


def _ts_value(ms: int) -> str:
    """``timestamp()``'s value (seconds as a float), as Prometheus formats sample values."""
    sec, frac = divmod(ms, 1000)
    return str(sec) if frac == 0 else f"{sec}.{frac:03d}".rstrip("0")


class MatrixWriter:
    """Collects series for one query_range matrix and writes it exactly as ``json.dumps(sort_keys=True)``
    would, but without building per-point Python lists (5,000 nodes × 8 GPUs stay fast)."""

    def __init__(self) -> None:
        self.series: list[tuple[str, str]] = []

    def add(self, metric_json: str, prefixes: Sequence[str], values: Sequence[str]) -> None:
        """Add one series: its labels as sorted compact JSON, ``prefixes[i]`` = ``[<ts>,"`` of ``values[i]``."""
        if not values:
            return
        body = ",".join([p + v + '"]' for p, v in zip(prefixes, values, strict=True)])
        self.series.append((metric_json, '{"metric":' + metric_json + ',"values":[' + body + "]}"))

    def write(self, path: Path) -> None:
        """Write the response, series in Prometheus' matrix order (by label set).

        Sorting on the sorted-key JSON of the labels gives the same order as comparing label pairs: names
        and values are plain ASCII and the closing quote sorts before every character they contain.
        """
        self.series.sort(key=lambda item: item[0])
        with path.open("w", encoding="utf-8") as fh:
            fh.write('{"data":{"result":[')
            fh.write(",".join(s for _, s in self.series))
            fh.write('],"resultType":"matrix"},"status":"success"}')


def _target_labels(node: NodeCast) -> dict[str, str]:
    """Labels Prometheus adds to every series of the node's exporter target (ServiceMonitor + relabel)."""
    return {
        "endpoint": "gpu-metrics",
        "instance": f"{node.exporter_ip}:9400",
        "job": EXPORTER_JOB,
        "node": node.name,
        "service": EXPORTER_JOB,
    }


def _device_labels(node: NodeCast, dev: Device, model: GpuModel, *, instance_level: bool) -> dict[str, str]:
    labels = _target_labels(node)
    labels.update(
        {
            "DCGM_FI_DRIVER_VERSION": model.driver,
            "Hostname": node.exporter_pod if node.hostname_is_pod else node.name,
            "UUID": dev.uuid,
            "device": f"nvidia{dev.gpu}",
            "gpu": str(dev.gpu),
            "modelName": model.model_name,
            "pci_bus_id": dev.pci_bus_id,
        }
    )
    if instance_level and dev.gi_id is not None:
        labels["GPU_I_ID"] = dev.gi_id
        labels["GPU_I_PROFILE"] = dev.profile or ""
    workload = dev.load.workload if instance_level or not node.mig else None
    # Attributed series carry the workload's namespace/pod/container; the others keep the exporter
    # target's own (as the real aicr capture shows), so a pod-label join still lands on the right node.
    ns, pod, container = workload or (EXPORTER_NS, node.exporter_pod, "nvidia-dcgm-exporter")
    labels.update({"namespace": ns, "pod": pod, "container": container})
    return labels


class LabelJson:
    """Sorted compact JSON of one label set, with ``__name__`` spliced in per metric.

    ``__name__`` sorts after the upper-case DCGM/``Hostname``/``UUID`` names and before the lower-case ones,
    so one ``json.dumps`` per device serves every metric (json.dumps dominated 5,000-node runs).
    """

    def __init__(self, labels: dict[str, str]) -> None:
        head = {k: v for k, v in labels.items() if k < "__name__"}
        tail = {k: v for k, v in labels.items() if k > "__name__"}
        self.head = json.dumps(head, sort_keys=True, separators=(",", ":"))[:-1] if head else "{"
        self.tail = json.dumps(tail, sort_keys=True, separators=(",", ":"))[1:] if tail else "}"

    def named(self, name: str) -> str:
        """The JSON with ``"__name__": name``."""
        sep_head = "," if self.head != "{" else ""
        sep_tail = "," if self.tail != "}" else ""
        return f'{self.head}{sep_head}"__name__":"{name}"{sep_tail}{self.tail}'

    def plain(self) -> str:
        """The JSON without ``__name__`` (functions such as ``timestamp()`` drop it)."""
        if self.head == "{" or self.tail == "}":
            return self.head + self.tail
        return self.head + "," + self.tail


_PROF_FMT = _Formatter(4)


def _series_for_device(
    rng: random.Random, dev: Device, model: GpuModel, n: int, frozen: bool
) -> dict[str, list[str]]:
    """Per-step value strings of the per-device metrics (activity, FB) for one device."""
    load = dev.load
    total = dev.fb_total_mib
    if frozen:
        return {
            "DCGM_FI_DEV_GPU_UTIL": ["0"] * n,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ["0"] * n,
            "DCGM_FI_DEV_FB_USED": [str(load.fb_used_mib)] * n,
            "DCGM_FI_DEV_FB_FREE": [str(total - load.fb_used_mib)] * n,
        }
    if load.busy:
        util = [max(60, min(99, round(rng.gauss(load.activity_pct, 4.0)))) for _ in range(n)]
        # GR_ENGINE_ACTIVE runs a few points under GPU_UTIL (the g5 scrape: 87 % vs 0.812).
        prof = [u * rng.uniform(0.90, 0.97) / 100 for u in util]
        fb = [max(0, min(total, load.fb_used_mib + int(rng.random() * 193) - 96)) for _ in range(n)]
    else:
        util = rng.choices((0, 1, 2), weights=(85, 10, 5), k=n)
        prof = [u * rng.uniform(0.4, 0.9) / 100 + int(rng.random() * 9) / 10_000 for u in util]
        # An idle process keeps its allocation; only a held context wobbles by a few MiB.
        held = load.fb_used_mib
        fb = [held + int(rng.random() * 5) for _ in range(n)] if held else [0] * n
    # BUG-02: on MIG instances the driver reports no utilization; dcgm-exporter pins it at 0.
    util_s = ["0"] * n if dev.gi_id is not None else [str(u) for u in util]
    return {
        "DCGM_FI_DEV_GPU_UTIL": util_s,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [_PROF_FMT(p) for p in prof],
        "DCGM_FI_DEV_FB_USED": [str(f) for f in fb],
        "DCGM_FI_DEV_FB_FREE": [str(total - f) for f in fb],
    }


def _power_series(
    rng: random.Random, node: NodeCast, model: GpuModel, gpu: int, devices: list[Device], n: int
) -> list[float]:
    """DCGM_FI_DEV_POWER_USAGE (W) per step of one physical GPU, from the activity of its devices."""
    idle_base = model.idle_power_w[gpu % len(model.idle_power_w)] + rng.uniform(-1.0, 1.0)
    held = any(d.load.fb_used_mib and not d.load.busy for d in devices)
    base = idle_base + (2.0 if held else 0.0)  # a live CUDA context keeps the clocks up a little
    span = model.max_power_w - idle_base
    busy = [d for d in devices if d.load.busy]
    out = []
    for _ in range(n):
        watts = base + rng.uniform(-0.9, 0.9)
        for d in busy:
            share = d.slices / 7 if d.gi_id is not None else 1.0
            scale = (
                1.25 if d.gi_id is not None else 0.7
            )  # a busy MIG slice pulls its memory/clock domains too
            watts += span * share * scale * rng.gauss(d.load.activity_pct, 3.0) / 100
        out.append(min(watts, model.max_power_w))
    return out


def render_metrics(
    scenario: Scenario,
    src: Sources,
    rng: random.Random,
    taken_at: datetime,
    window_s: int,
    step_s: int,
    out: Path,
) -> None:
    """Write ``metrics/*.json`` for every GPU node of the scenario.

    Each file is a ``/api/v1/query_range`` response ``{"status": "success", "data": {"resultType":
    "matrix", "result": [{"metric": {labels}, "values": [[<unix s>, "<value>"], ...]}]}}`` with points at
    taken_at − window, …, taken_at (window / step + 1). Per device (physical GPU, or MIG instance with
    ``GPU_I_ID``/``GPU_I_PROFILE``):

    - ``DCGM_FI_DEV_GPU_UTIL`` (field 203, gauge, %): 0–2 idle, 60–99 busy; pinned at 0 on MIG instances.
    - ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (field 1001, gauge, ratio 0..1): a few points under GPU_UTIL / 100;
      the only activity signal of a MIG instance.
    - ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (fields 252 / 251, gauge, MiB): used + free = the
      device's framebuffer.

    Per physical GPU (no ``GPU_I_*`` labels, as dcgm-exporter reports them on MIG GPUs too):

    - ``DCGM_FI_DEV_POWER_USAGE`` (field 155, gauge, W): idle draw ±2 W plus the load of its devices.
    - ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (field 156, counter, mJ): the trapezoid integral of power,
      strictly increasing; flat (like power) when the exporter is frozen.

    Per exporter target: ``up`` (1, or 0 once an exporter is down). ``DCGM_FI_DEV_GPU_UTIL.timestamp.json``
    holds ``timestamp(DCGM_FI_DEV_GPU_UTIL)``: the raw 15 s scrape time behind each step (no ``__name__``).
    A down exporter's series end at its last scrape (Prometheus stale markers); missing GPUs have none.
    """
    end_ms = int(taken_at.timestamp() * 1000)
    n = window_s // step_s + 1
    steps = [end_ms - (n - 1 - i) * step_s * 1000 for i in range(n)]
    prefixes = ["[" + _ts_json(t) + ',"' for t in steps]
    writers = {m: MatrixWriter() for m in (*METRIC_FILES, "timestamp")}
    power_fmt = _Formatter(scenario.power_decimals)
    for node in sorted(scenario.nodes, key=lambda x: x.name):
        if not node.itype.gpus:
            continue
        model = src.models[node.itype.model or ""]
        # Fixed scrape phase per target: with a 15 s interval and a 60 s step the lag is the same each step.
        node.lag_ms = rng.randint(1_200, 13_800)
        live = n
        if node.exporter_state == "down":
            # Stale markers end every series at the first failed scrape: no lookback stretch.
            live = sum(1 for t in steps if t - node.lag_ms < end_ms - node.down_seconds * 1000)
        frozen = node.exporter_state == "frozen"
        up_labels = _target_labels(node) | {
            "container": "nvidia-dcgm-exporter",
            "namespace": EXPORTER_NS,
            "pod": node.exporter_pod,
        }
        writers["up"].add(LabelJson(up_labels).named("up"), prefixes, ["1"] * live + ["0"] * (n - live))
        sample_times = [_ts_value(t - node.lag_ms) for t in steps[:live]]
        by_gpu: dict[int, list[Device]] = {}
        for dev in node.devices:
            by_gpu.setdefault(dev.gpu, []).append(dev)
        for gpu, devices in sorted(by_gpu.items()):
            if gpu in node.missing_gpus:
                continue
            for dev in devices:
                values = _series_for_device(rng, dev, model, n, frozen)
                labels = LabelJson(_device_labels(node, dev, model, instance_level=True))
                for metric, series in values.items():
                    writers[metric].add(labels.named(metric), prefixes[:live], series[:live])
                writers["timestamp"].add(labels.plain(), prefixes[:live], sample_times)
            phys_labels = LabelJson(_device_labels(node, devices[0], model, instance_level=False))
            power = _power_series(rng, node, model, gpu, devices, n)
            uptime_s = (taken_at - node.created).total_seconds() - window_s
            energy = int(uptime_s * (power[0] + 4.0) * 1000 * rng.uniform(0.9, 1.1))
            energies = []
            for i in range(n):
                if i:
                    energy += round((power[i - 1] + power[i]) / 2 * step_s * 1000)
                energies.append(energy)
            if frozen:
                power = [power[0]] * n
                energies = [energies[0]] * n
            writers["DCGM_FI_DEV_POWER_USAGE"].add(
                phys_labels.named("DCGM_FI_DEV_POWER_USAGE"),
                prefixes[:live],
                [power_fmt(p) for p in power[:live]],
            )
            writers["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].add(
                phys_labels.named("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
                prefixes[:live],
                [str(e) for e in energies[:live]],
            )
    metrics_dir = out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for metric in METRIC_FILES:
        writers[metric].write(metrics_dir / f"{metric}.json")
    writers["timestamp"].write(metrics_dir / f"{TIMESTAMP_METRIC}.timestamp.json")
