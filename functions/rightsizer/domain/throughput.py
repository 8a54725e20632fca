"""Would a cheaper instance type serve a busy node's observed peak without slowing it down? (pure)

A busy node may move to a smaller shape of the same GPU model whenever the shape holds the busy GPUs,
their framebuffer and the pods' requests: each GPU is the same chip, so nothing runs slower. A move to
another GPU model must also cover the observed peak with headroom on both compute and memory bandwidth:

    target dense tensor TFLOPS      >= source TFLOPS x peak activity x (1 + headroom)
    target memory bandwidth (GB/s)  >= source GB/s   x peak activity x (1 + headroom)

per GPU, with the published figures of ``gpu-models.csv``. Peak activity is the node's maximum of
``max(100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_DEV_GPU_UTIL)`` over the window; GPU_UTIL counts any
kernel running, so it over-states the share of compute and bandwidth in use (the safe direction). A move
across models is refused when either figure is unpublished, when the activity is unknown, when the devices
are MIG slices (their activity is a share of the slice, not of the GPU), or when a pod using several GPUs
would lose NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass

from rightsizer.domain.catalog import Catalog, InstanceType


@dataclass(frozen=True, slots=True)
class Demand:
    """What a busy node was observed to use.

    Units: ``gpus`` GPUs busy at once or requested by one pod (at least 1); ``fb_per_gpu_mib`` the peak
    framebuffer of one device with the framebuffer headroom applied (MiB); ``activity_pct`` peak activity in
    percent (None when unknown); ``pod_gpus`` the largest GPU request of one pod; ``cpu_m`` / ``memory_mib``
    the pods' summed requests (millicores, MiB); ``mig`` whether the devices are MIG slices; ``headroom``
    the throughput headroom ratio (0.2 = 20 %).
    """

    gpus: int
    fb_per_gpu_mib: float
    activity_pct: float | None
    pod_gpus: int
    cpu_m: int
    memory_mib: float
    mig: bool
    headroom: float


@dataclass(frozen=True, slots=True)
class Fit:
    """A cheaper type that serves the demand, with the expected slowdown (percent, 0 when none) and why."""

    row: InstanceType
    expected_slowdown_pct: float
    why_safe: str


def _nvlink(row: InstanceType, catalog: Catalog) -> bool:
    perf = catalog.performance_of(row)
    return perf is not None and perf.nvlink and row.gpu_count > 1


def _basic_fit(current: InstanceType, cand: InstanceType, demand: Demand) -> bool:
    return not (
        cand.hourly_usd is None
        or cand.compute_capability is None
        or current.hourly_usd is None
        or current.compute_capability is None
        or cand.hourly_usd >= current.hourly_usd
        or cand.arch != current.arch
        or cand.gpu_count < demand.gpus
        or cand.gpu_memory_mib < demand.fb_per_gpu_mib
        or cand.compute_capability < current.compute_capability
        or (cand.allocatable_cpu_m is not None and cand.allocatable_cpu_m < demand.cpu_m)
        or (cand.allocatable_memory_mib is not None and cand.allocatable_memory_mib < demand.memory_mib)
    )


def judge(current: InstanceType, cand: InstanceType, demand: Demand, catalog: Catalog) -> Fit | None:
    """``cand`` as a replacement for ``current`` under ``demand``, or None when it does not qualify.

    Qualifies: cheaper (on-demand USD per hour), same architecture, a compute capability not older, at
    least ``demand.gpus`` GPUs with ``demand.fb_per_gpu_mib`` MiB each, allocatable CPU and memory for the
    pods' requests, NVLink kept for pods using several GPUs, and — across GPU models — the throughput rule
    of this module.
    """
    if not _basic_fit(current, cand, demand):
        return None
    if demand.pod_gpus > 1 and _nvlink(current, catalog) and not _nvlink(cand, catalog):
        return None
    busy = f"{demand.gpus} GPU(s) busy at peak, {cand.gpu_count} on {cand.name}"
    if cand.gpu_model == current.gpu_model and cand.gpu_memory_mib == current.gpu_memory_mib:
        return Fit(cand, 0.0, f"same GPU ({cand.gpu_model}): each workload keeps the same chip; {busy}")
    src, dst = catalog.performance_of(current), catalog.performance_of(cand)
    if (
        demand.activity_pct is None
        or demand.mig
        or src is None
        or dst is None
        or None
        in (src.tensor_tflops, src.memory_bandwidth_gbps, dst.tensor_tflops, dst.memory_bandwidth_gbps)
    ):
        return None
    assert src.tensor_tflops and src.memory_bandwidth_gbps and dst.tensor_tflops and dst.memory_bandwidth_gbps
    share = min(demand.activity_pct, 100.0) / 100.0
    need_tflops = src.tensor_tflops * share
    need_gbps = src.memory_bandwidth_gbps * share
    margin = 1.0 + demand.headroom
    if dst.tensor_tflops < need_tflops * margin or dst.memory_bandwidth_gbps < need_gbps * margin:
        return None
    slowdown = 100.0 * max(
        0.0, need_tflops / dst.tensor_tflops - 1.0, need_gbps / dst.memory_bandwidth_gbps - 1.0
    )
    why = (
        f"{cand.gpu_model} covers the observed peak ({demand.activity_pct:g}% activity) with "
        f"{demand.headroom:.0%} headroom: compute {dst.tensor_tflops:g} >= {need_tflops * margin:.1f} TFLOPS, "
        f"memory bandwidth {dst.memory_bandwidth_gbps:g} >= {need_gbps * margin:.0f} GB/s per GPU; {busy}"
    )
    if demand.pod_gpus > 1 and _nvlink(cand, catalog):
        why += "; NVLink kept"
    return Fit(cand, slowdown, why)


def cheapest_fit(current: InstanceType, catalog: Catalog, demand: Demand) -> Fit | None:
    """The cheapest qualifying replacement for ``current`` (see :func:`judge`), same GPU model first.

    A smaller shape of the same GPU model wins over any other model even when the other is cheaper: it
    changes nothing about how the work runs. Ties go by name. None when nothing cheaper qualifies.
    """
    fits = [f for cand in catalog.types.values() if (f := judge(current, cand, demand, catalog)) is not None]
    same = [f for f in fits if f.row.gpu_model == current.gpu_model]
    pool = same or fits
    return min(pool, key=lambda f: (f.row.hourly_usd or 0.0, f.row.name)) if pool else None
