"""GPU health as its own verdict (issue 28): a broken GPU reads idle because nothing can run on it.

Evidence, each a reason of the ``unhealthy`` class (``domain.verdicts``), all current signals:

- ``accelerated_hardware_not_ready:<reason>`` — the Node condition ``AcceleratedHardwareReady`` is
  ``False`` (the EKS node monitoring agent sets it from NVIDIA DCGM, NVML and kernel logs; EKS node repair
  replaces the node after it has been so for 10 min). ``Unknown`` is no evidence.
- ``gpus_unallocatable:<n>`` — the device plugin advertises n GPUs fewer allocatable than capacity
  (``status.allocatable`` vs ``status.capacity`` of ``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
  ``nvidia.com/mig-*``): it marks a device unhealthy that way. On a node younger than the idle window
  this is the plugin starting, and stays ``gpus_not_allocatable`` (``unknown``).
- ``xid:<code>`` — dcgm-exporter's ``DCGM_EXP_XID_ERRORS_COUNT{xid="<code>"}`` rose inside the window
  (``rising_xids``). ``DCGM_FI_DEV_XID_ERRORS`` is a gauge of the *last* XID and stays at its value until
  the exporter restarts (NVIDIA/dcgm-exporter#500): alone it is a hint, ``xid_last:<code>``, never a
  verdict.

Who repairs: a managed node group with EKS node repair (DescribeNodegroup ``nodeRepairConfig.enabled``)
or a Karpenter-owned node (Karpenter's node repair acts on the same condition) — such a node is reported
``unhealthy_pending_repair:<eks|karpenter>`` and left to the repair unless its group shrinks anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Final

from rightsizer.domain.model import AsgInfo, Node, Series

__all__ = [
    "ACCELERATED_HARDWARE_READY",
    "XID_COUNT",
    "XID_LAST",
    "health_reasons",
    "last_xids",
    "repair_owner",
    "rising_xids",
]

#: Node condition of the EKS node monitoring agent (docs.aws.amazon.com/eks/latest/userguide/node-health.html).
ACCELERATED_HARDWARE_READY: Final = "AcceleratedHardwareReady"
#: dcgm-exporter: XID errors counted per ``xid`` label over the exporter's window (a rise = a new error).
XID_COUNT: Final = "DCGM_EXP_XID_ERRORS_COUNT"
#: DCGM field 230: the value of the last XID error seen, stale until the exporter restarts.
XID_LAST: Final = "DCGM_FI_DEV_XID_ERRORS"
_GPU_RESOURCES: Final = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
_MIG_PREFIX: Final = "nvidia.com/mig-"
_KARPENTER_NODEPOOL: Final = "karpenter.sh/nodepool"


def _unallocatable(node: Node) -> int:
    missing = 0
    for resource in node.status.capacity:
        if resource in _GPU_RESOURCES or resource.startswith(_MIG_PREFIX):
            missing += max(0, node.capacity_count(resource) - node.allocatable_count(resource))
    return missing


def health_reasons(
    node: Node, *, settled: bool, xids: Iterable[str] = (), hints: Iterable[str] = ()
) -> list[str]:
    """Every health reason of ``node`` (module docstring), in evidence order.

    Args:
        node: the Node as read (conditions, capacity, allocatable).
        settled: the node is older than the idle window (its device plugin had time to register every GPU).
        xids: XID codes whose ``DCGM_EXP_XID_ERRORS_COUNT`` rose in the window (:func:`rising_xids`).
        hints: XID codes ``DCGM_FI_DEV_XID_ERRORS`` shows (:func:`last_xids`): ``xid_last`` notes only.
    """
    reasons: list[str] = []
    for cond in node.status.conditions:
        if cond.type == ACCELERATED_HARDWARE_READY and cond.status == "False":
            reasons.append(f"accelerated_hardware_not_ready:{cond.reason or 'False'}")
    missing = _unallocatable(node)
    if settled and missing:
        reasons.append(f"gpus_unallocatable:{missing}")
    rising = sorted(set(xids), key=_code_order)
    reasons.extend(f"xid:{code}" for code in rising)
    reasons.extend(f"xid_last:{code}" for code in sorted(set(hints) - set(rising), key=_code_order))
    return reasons


def _code_order(code: str) -> tuple[int, str]:
    return (int(code), code) if code.isdigit() else (1 << 30, code)


def repair_owner(node: Node, group: AsgInfo | None) -> str | None:
    """Who replaces this node when it is unhealthy: ``eks`` (node repair enabled on its managed node
    group), ``karpenter`` (a Karpenter-owned node), or None."""
    if group is not None and group.node_repair:
        return "eks"
    if _KARPENTER_NODEPOOL in node.labels:
        return "karpenter"
    return None


def rising_xids(series: Sequence[tuple[str, Series]], window_start: float) -> dict[str, set[str]]:
    """Node → XID codes whose ``DCGM_EXP_XID_ERRORS_COUNT`` rose inside the window.

    Args:
        series: (node, series) pairs of the metric's per-step answer over the window, already joined.
        window_start: Unix seconds of the window's start.

    A rise is a sample above the one before it, or a first sample above 0 taken after the window began
    (dcgm-exporter creates an ``xid`` series when that XID first happens). A value that only holds or
    falls (the exporter's counting window moving past an old error) is no evidence.
    """
    out: dict[str, set[str]] = {}
    for node, s in series:
        code = s.labels.get("xid") or s.labels.get("XID") or "unknown"
        values = [(t, v) for t, v in zip(s.times, s.values, strict=False) if v == v]  # drop NaN
        if not values:
            continue
        rose = values[0][1] > 0 and values[0][0] > window_start
        rose = rose or any(b > a for (_, a), (_, b) in itertools.pairwise(values))
        if rose:
            out.setdefault(node, set()).add(code)
    return out


def last_xids(series: Sequence[tuple[str, Series]]) -> dict[str, set[str]]:
    """Node → the non-zero XID codes ``DCGM_FI_DEV_XID_ERRORS`` shows (its newest sample per series)."""
    out: dict[str, set[str]] = {}
    for node, s in series:
        finite = [v for v in s.values if v == v]
        if finite and finite[-1] > 0:
            out.setdefault(node, set()).add(str(int(finite[-1])))
    return out
