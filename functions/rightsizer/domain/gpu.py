"""What the metrics say about one GPU node: expected devices, coverage, idleness (docs/architecture.md §3).

Pure: takes a Node, its device signals and the policy; returns reason codes and figures. Missing, partial,
stale, frozen or non-finite data yields an ``unknown``-class reason — never a silent "idle" (BUG-02/04/05).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rightsizer.domain.catalog import Catalog, InstanceType
from rightsizer.domain.model import (
    ALL_SIGNALS,
    GPU_RESOURCE,
    GPU_SHARED_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SIGNAL_FRAMEBUFFER,
    SIGNAL_LIVENESS,
    SIGNAL_POWER,
    Node,
)
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import DeviceSignals, Window
from rightsizer.domain.verdicts import UNKNOWN_CODES, code_of


def is_gpu_node(node: Node, catalog: Catalog) -> bool:
    """A node with GPU capacity, label ``nvidia.com/gpu.present=true``, or a catalog type with GPUs."""
    capacity = node.status.capacity
    if any(
        (k in (GPU_RESOURCE, GPU_SHARED_RESOURCE) or k.startswith(MIG_RESOURCE_PREFIX))
        and node.capacity_count(k) > 0
        for k in capacity
    ):
        return True
    if node.labels.get("nvidia.com/gpu.present") == "true":
        return True
    row = catalog.get(node.instance_type)
    return bool(row and row.gpu_count > 0)


@dataclass(frozen=True, slots=True)
class ExpectedDevices:
    """Devices a node must report: ``physical`` GPUs, ``mig`` instances, ``full`` non-MIG GPUs on the node.

    On a node without MIG ``full == physical``. ``reasons`` holds ``gpu_count_mismatch`` /
    ``gpus_not_allocatable`` findings.
    """

    physical: int
    mig: int
    full: int
    reasons: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Devices with their own activity signal."""
        return self.mig + self.full


def expected_devices(node: Node, row: InstanceType | None) -> ExpectedDevices:
    """Expected devices of a node (docs/architecture.md §3 "Expected devices").

    Physical GPUs = the catalog count; without a catalog row, label ``nvidia.com/gpu.count``, else capacity
    ``nvidia.com/gpu`` ÷ max(1, ``nvidia.com/gpu.replicas``) (time-slicing replicas are not devices).
    MIG instances = Σ capacity ``nvidia.com/mig-*`` (strategy mixed), or capacity ``nvidia.com/gpu`` with
    strategy single on a MIG-enabled GPU.
    """
    labels = node.labels
    reasons: list[str] = []
    replicas = max(1, _int(labels.get("nvidia.com/gpu.replicas")) or 1)
    label_count = _int(labels.get("nvidia.com/gpu.count"))
    cap_gpu = node.capacity_count(GPU_RESOURCE)
    mig = sum(node.capacity_count(k) for k in node.status.capacity if k.startswith(MIG_RESOURCE_PREFIX))
    single_mig = labels.get("nvidia.com/mig.strategy") == "single" and (
        "MIG" in labels.get("nvidia.com/gpu.product", "")
        or labels.get("nvidia.com/mig.config", "all-disabled") not in ("", "all-disabled")
    )
    if row is not None and row.gpu_count > 0:
        physical = row.gpu_count
        if label_count is not None and label_count != physical:
            reasons.append(f"gpu_count_mismatch:catalog={physical},label={label_count}")
        elif mig == 0 and not single_mig and cap_gpu and cap_gpu // replicas != physical:
            reasons.append(f"gpu_count_mismatch:catalog={physical},capacity={cap_gpu // replicas}")
    elif label_count is not None:
        physical = label_count
    else:
        physical = cap_gpu // replicas
    if single_mig:
        mig, full = cap_gpu, 0
    elif mig:
        full = cap_gpu // replicas
    else:
        full = physical
    for resource in sorted(node.status.capacity):
        if resource in (GPU_RESOURCE, GPU_SHARED_RESOURCE) or resource.startswith(MIG_RESOURCE_PREFIX):
            cap, alloc = node.capacity_count(resource), node.allocatable_count(resource)
            if alloc < cap:
                reasons.append(f"gpus_not_allocatable:{resource}={alloc}/{cap}")
    return ExpectedDevices(physical=physical, mig=mig, full=full, reasons=tuple(reasons))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass
class GpuAssessment:
    """The metric-side findings for one node.

    ``reasons``: unknown-class and busy-class reason codes (docs/architecture.md §3 order is applied later).
    Figures: ``activity_max_pct`` percent, ``fb_used_max_mib`` MiB (maxima over devices and the window,
    None when unknown), ``coverage`` 0..1, ``peak_active_devices`` = most devices above the activity
    threshold at one step, ``device_fb_peaks_mib`` per device peak framebuffer.
    """

    expected: ExpectedDevices
    devices: list[DeviceSignals]
    reasons: list[str] = field(default_factory=list)
    coverage: float = 0.0
    activity_max_pct: float | None = None
    fb_used_max_mib: float | None = None
    fb_total_mib: float | None = None
    peak_active_devices: int = 0
    busy: bool = False
    idle: bool = False


def assess_gpus(  # noqa: C901 (24): the expected-devices rules of §3 (catalog, labels, MIG strategies)
    node: Node,
    row: InstanceType | None,
    devices: Sequence[DeviceSignals],
    *,
    policy: Policy,
    power_ceilings: Mapping[str, float],
    window: Window,
    at: datetime,
    up_coverage: float | None,
    problems: Sequence[str],
    present: frozenset[str],
    exporter: str | None,
    signal_set: frozenset[str] = ALL_SIGNALS,
) -> GpuAssessment:
    """Apply the signal rules of docs/architecture.md §3 to one node's devices.

    Args:
        node: the Node.
        row: its catalog row (None for types not in the catalog).
        devices: signals of the devices joined to this node.
        policy: thresholds (percent, MiB, W), ``min_coverage``, ``max_sample_age`` (s).
        power_ceilings: W per ``gpu_model`` (packaged table overlaid with the policy's).
        window: the idle window.
        at: the decision instant (aware).
        up_coverage: share of steps with ``up == 1`` for the node's exporter, None when ``up`` is absent.
        problems: metric names whose answers were unusable (each ⇒ ``partial_response:<metric>``).
        present: device metric names that were exported at all.
        exporter: the node's dcgm-exporter pod (``namespace/name``) for ``signals_disagree``/frozen details.
        signal_set: the signal families the source carries (``ClusterSnapshot.signal_set``); the rules
            of a family not in it — framebuffer, power, liveness — are skipped, not failed. Activity is
            always required.

    Returns:
        A ``GpuAssessment`` whose ``idle`` is True only when every expected device was seen for the
        window and every signal was at or below its threshold.
    """
    expected = expected_devices(node, row)
    reasons: list[str] = list(expected.reasons)
    reasons.extend(f"partial_response:{m}" for m in problems)
    mig_devs = [d for d in devices if d.is_mig]
    mig_uuids = {d.device for d in mig_devs}
    full_devs = [d for d in devices if not d.is_mig and d.device not in mig_uuids]
    used = [*mig_devs, *full_devs]
    a = GpuAssessment(expected=expected, devices=used)

    if not (present & {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}):
        reasons.append("no_series:activity")
    missing = max(0, expected.mig - len(mig_devs)) + max(0, expected.full - len(full_devs))
    if expected.total == 0:
        reasons.append("no_series:no_expected_devices")
    elif missing:
        reasons.append(f"no_series:{missing}_of_{expected.total}_devices")
    fb_rules = SIGNAL_FRAMEBUFFER in signal_set
    power_rules = SIGNAL_POWER in signal_set
    required = (
        *(("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE") if fb_rules else ()),
        *(("DCGM_FI_DEV_POWER_USAGE",) if power_rules else ()),
    )
    for name in required:
        if name not in present and name not in problems:
            reasons.append(f"partial_response:{name}")
    if fb_rules and used and any(not d.has_fb for d in used) and "DCGM_FI_DEV_FB_USED" in present:
        reasons.append("no_series:DCGM_FI_DEV_FB_USED")
    if power_rules and used and any(not d.has_power for d in used) and "DCGM_FI_DEV_POWER_USAGE" in present:
        reasons.append("no_series:DCGM_FI_DEV_POWER_USAGE")

    coverage = min((d.coverage for d in used), default=0.0) if not missing else 0.0
    if up_coverage is not None:
        coverage = min(coverage, up_coverage)
    a.coverage = coverage
    if coverage < policy.min_coverage:
        reasons.append(f"coverage_below_min:{coverage:.2f}<{policy.min_coverage:g}")

    newest = [d.newest_sample for d in used]
    if used and any(t is None for t in newest):
        reasons.append("stale_metrics:no_sample")
    elif used:
        age = at.timestamp() - min(t for t in newest if t is not None)
        if age > freshness_bound(policy.max_sample_age, used, window.step):
            reasons.append(f"stale_metrics:{int(age)}s")

    if SIGNAL_LIVENESS in signal_set:
        frozen = sorted({d.exporter or d.device for d in used if d.liveness == "frozen"})
        if frozen:
            reasons.append(f"exporter_frozen:{exporter or ','.join(frozen) or node.name}")
        if used and any(d.liveness == "absent" for d in used):
            reasons.append("no_liveness_signal")
    bad = sorted({m for d in used for m in d.non_finite})
    reasons.extend(f"non_finite:{m}" for m in bad)
    catalog_mib = row.gpu_memory_mib if row else None
    implausible = sorted({r for d in used if (r := _fb_implausible(d, catalog_mib))})
    reasons.extend(f"fb_implausible:{r}" for r in implausible)

    model = row.gpu_model if row else None
    ceiling = power_ceilings.get(model) if model else None
    if ceiling is None and power_rules:
        reasons.append(f"power_ceiling_unknown:{model or node.instance_type or 'unknown_type'}")

    created = node.metadata.creationTimestamp
    if created is not None and (at - created).total_seconds() < window.seconds:
        reasons.append("node_too_young")

    activities = [d.activity_max_pct for d in used if d.activity_max_pct is not None]
    a.activity_max_pct = max(activities) if activities else None
    fbs = [d.fb_used_max_mib for d in used if d.fb_used_max_mib is not None]
    a.fb_used_max_mib = max(fbs) if fbs else None
    totals = [d.fb_total_mib for d in used if d.fb_total_mib is not None]
    a.fb_total_mib = max(totals) if totals else None
    slots: dict[int, int] = {}
    for d in used:
        for slot in d.active_steps:
            slots[slot] = slots.get(slot, 0) + 1
    a.peak_active_devices = max(slots.values(), default=0)

    busy_reasons: list[str] = []
    if a.activity_max_pct is not None and a.activity_max_pct > policy.gpu_activity_max_pct:
        busy_reasons.append(f"activity_above_threshold:{a.activity_max_pct:g}%")
    if fb_rules and a.fb_used_max_mib is not None and a.fb_used_max_mib > policy.fb_used_max_mib:
        busy_reasons.append(f"fb_above_threshold:{a.fb_used_max_mib:g}MiB")
    powers = [d.power_max_w for d in used if d.power_max_w is not None]
    if power_rules and ceiling is not None and powers and max(powers) > ceiling:
        busy_reasons.append(f"power_above_idle:{max(powers):g}W>{ceiling:g}W")
    if any(d.signals_disagree for d in used):
        busy_reasons.append(f"signals_disagree:{exporter or used[0].exporter or node.name}")
    reasons.extend(busy_reasons)
    a.reasons = reasons
    a.busy = any(not r.startswith("signals_disagree") for r in busy_reasons)
    unknown = any(code_of(r) in UNKNOWN_CODES for r in reasons)
    a.idle = not unknown and not a.busy
    return a


#: The freshness bound when the scrape interval is not measured (a device whose scrape target has no
#: ``up`` count, a format-2 snapshot without ``.count`` files, a format-1 source without ``timestamp``
#: matrices), and the loosest automatic one: Prometheus' own lookback.
FRESHNESS_FALLBACK_S = 300.0


def freshness_bound(configured: float | None, devices: Sequence[DeviceSignals], step: float) -> float:
    """The oldest the newest raw sample may be (s): ``max_sample_age`` when configured, else two measured
    scrape intervals (the slowest device's ``sample_interval_s``: in format 2 from the scrape attempts
    of its target over the window, ``up`` counted, an upper bound from its raw sample times in format 1)
    plus one query step (a live decision
    instant is floored to the step), at most ``FRESHNESS_FALLBACK_S``.

    A 15 s scrape at the 60 s step allows 90 s, where a fixed 5 minutes let an exporter that stopped four
    minutes ago still count as fresh.
    """
    if configured is not None:
        return float(configured)
    intervals = [d.sample_interval_s for d in devices]
    if not intervals or any(i is None for i in intervals):
        return FRESHNESS_FALLBACK_S
    slowest = max(i for i in intervals if i is not None)
    return min(FRESHNESS_FALLBACK_S, 2 * slowest + step)


#: A device's framebuffer total (used + free, MiB) must lie within this share of the catalog's memory for
#: its GPU model: drivers report 92–100 % of the nominal size (A10G 22,731 of 24,576 MiB, T4 15,360 of
#: 16,384, H100 81,559 of 81,920); a total outside is another device's reading, or a broken exporter's.
FB_TOTAL_CATALOG_SHARE = (0.80, 1.05)


def _fb_implausible(device: DeviceSignals, catalog_mib: int | None = None) -> str | None:
    """Why a device's framebuffer readings cannot be true, or None (issue 11: such a device is unknown).

    Negative used memory; used + free (``DCGM_FI_DEV_FB_USED`` + ``DCGM_FI_DEV_FB_FREE``, MiB) of zero or
    less (an exporter that lost the GPU reports zeros, and zeros would read as an idle framebuffer); or,
    for a whole GPU (not a MIG instance, whose memory is a slice) of an instance type the catalog knows
    (``catalog_mib``: ``ec2-gpu-instances.csv`` ``gpu_memory_mib_per_gpu``), a total outside
    ``FB_TOTAL_CATALOG_SHARE`` of it.
    """
    if not device.has_fb:
        return None
    if device.fb_used_max_mib is not None and device.fb_used_max_mib < 0:
        return "negative_used"
    total = device.fb_total_mib
    if total is not None and total <= 0:
        return "used_plus_free_not_positive"
    if total is not None and catalog_mib and not device.is_mig:
        low, high = FB_TOTAL_CATALOG_SHARE
        if not low * catalog_mib <= total <= high * catalog_mib:
            return f"total_{total:.0f}MiB_not_{catalog_mib}MiB"
    return None
