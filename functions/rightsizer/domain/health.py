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
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from rightsizer.domain.model import AsgInfo, MetricData, Node, Series
from rightsizer.domain.observation import MetricQuery

__all__ = [
    "ACCELERATED_HARDWARE_READY",
    "XID_COUNT",
    "XID_DOCUMENT",
    "XID_LAST",
    "health_reasons",
    "last_xids",
    "repair_owner",
    "rising_xids",
    "xid_facts",
    "xid_queries",
]

#: Node condition of the EKS node monitoring agent (docs.aws.amazon.com/eks/latest/userguide/node-health.html).
ACCELERATED_HARDWARE_READY: Final = "AcceleratedHardwareReady"
#: dcgm-exporter: XID errors counted per ``xid`` label over the exporter's window (a rise = a new error).
XID_COUNT: Final = "DCGM_EXP_XID_ERRORS_COUNT"
#: DCGM field 230: the value of the last XID error seen, stale until the exporter restarts.
XID_LAST: Final = "DCGM_FI_DEV_XID_ERRORS"
#: dcgm-exporter's label naming the XID code of a ``DCGM_EXP_XID_ERRORS_COUNT`` series.
XID_LABEL: Final = "xid"
#: The snapshot document holding both XID answers (``{"count": query_range answer, "last": …}``).
XID_DOCUMENT: Final = "xid.json"
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
        code = s.labels.get(XID_LABEL) or "unknown"
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


def xid_queries(job: str | None = None, scope: tuple[str, ...] = ()) -> dict[str, MetricQuery]:
    """The two XID queries of an observation, by their key in :data:`XID_DOCUMENT`: ``count``, the per-step
    maximum of ``DCGM_EXP_XID_ERRORS_COUNT`` over the window (to see it rise); ``last``, the window's
    maximum of ``DCGM_FI_DEV_XID_ERRORS`` (the hint). ``job`` and ``scope`` as ``observation_queries``."""
    return {
        "count": MetricQuery(XID_COUNT, "step", job, scope),
        "last": MetricQuery(XID_LAST, "max", job, scope),
    }


def xid_facts(
    answers: dict[str, MetricData], node_of: Callable[[dict[str, str]], str | None], window_start: float
) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Node → (rising XID codes, last-XID hints) from the :data:`XID_DOCUMENT` answers; ``node_of`` maps a
    series' labels to its node (the series join) or None. A failed answer is no evidence either way."""
    count, last = answers.get("count"), answers.get("last")
    rising = rising_xids(_joined(count, node_of), window_start)
    hints = last_xids(_joined(last, node_of))
    return {
        node: (tuple(sorted(rising.get(node, set()))), tuple(sorted(hints.get(node, set()))))
        for node in sorted(set(rising) | set(hints))
    }


def _joined(
    data: MetricData | None, node_of: Callable[[dict[str, str]], str | None]
) -> list[tuple[str, Series]]:
    if data is None or data.problem is not None:
        return []
    return [(node, s) for s in data.series if (node := node_of(s.labels)) is not None]
