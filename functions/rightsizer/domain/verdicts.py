"""Reason codes and verdicts (docs/architecture.md §3 "Verdicts (contract)").

Reasons are ``code`` or ``code:detail``; a node's reasons are sorted by the position of their code in
``REASON_CODES`` (stable for equal codes), without duplicates. The verdict is the first class with a
reason: excluded → unhealthy → unknown → busy/underutilized → protected → idle (issue 28: a broken GPU
reads idle because nothing can run on it; its health evidence outranks every metric).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Literal

Verdict = Literal["excluded", "unhealthy", "unknown", "busy", "underutilized", "protected", "idle"]

REASON_CODES: tuple[str, ...] = (
    "not_selected",
    "accelerated_hardware_not_ready",
    "gpus_unallocatable",
    "xid",
    "no_series",
    "coverage_below_min",
    "stale_metrics",
    "exporter_frozen",
    "non_finite",
    "fb_implausible",
    "partial_response",
    "series_unmapped",
    "gpu_count_mismatch",
    "gpus_not_allocatable",
    "no_liveness_signal",
    "power_ceiling_unknown",
    "node_too_young",
    "activity_above_threshold",
    "fb_above_threshold",
    "power_above_idle",
    "signals_disagree",
    "idle_gpu_holder",
    "running_batch_pod",
    "bare_pod",
    "local_storage",
    "system_pod",
    "pdb_blocks",
    "multiple_pdbs",
    "grace_exceeds_drain_timeout",
    "pending_gpu_pods",
    "do_not_disrupt",
    "other_autoscaler",
    "karpenter_owned",
    "cordoned_by_other",
    "in_flight",
    "replacement_in_progress",
    "replacement_settling",
    "node_group_unknown",
    "node_group_at_min_size",
    "no_placement",
    "cpu_pods_pin_gpu_node",
    "disruption_budget_exhausted",
    "cooldown",
    "outside_disruption_window",
    "snoozed",
    "capacity_reserved",
    "warm_floor",
    "spot_interruption",
    "unhealthy_pending_repair",
    "unhealthy_first",
    "idle_window_clean",
    "price_region_fallback",
    "spot_priced_on_demand",
    "price_unknown",
    "priced_spot",
    "reservation_released",
    "capacity_block_ends",
    "xid_last",
    "priced_on_demand",
)
"""Every reason code in contract order. Extend, never rename. ``in_flight`` (a node we already cordoned)
and ``replacement_in_progress`` / ``replacement_settling`` (a node group replacement running or just
finished, ``domain.replacement.replacement_reasons``) are our extensions. Issue 28 ("Capacity and health")
added the ``unhealthy`` class (``accelerated_hardware_not_ready``, ``gpus_unallocatable``, ``xid``), the
protections ``capacity_reserved`` (moved from the pricing notes: a reservation is kept by default),
``warm_floor``, ``spot_interruption``, ``unhealthy_pending_repair`` and ``unhealthy_first``, and the notes
``reservation_released`` (policy ``release_reserved_capacity``), ``capacity_block_ends`` and ``xid_last``
(a stale-prone hint, never a verdict)."""

_ORDER = {code: i for i, code in enumerate(REASON_CODES)}

EXCLUDED_CODES = frozenset({"not_selected"})
UNHEALTHY_CODES = frozenset({"accelerated_hardware_not_ready", "gpus_unallocatable", "xid"})
UNKNOWN_CODES = frozenset(
    REASON_CODES[REASON_CODES.index("no_series") : REASON_CODES.index("activity_above_threshold")]
)
BUSY_CODES = frozenset({"activity_above_threshold", "fb_above_threshold", "power_above_idle"})
PROTECTED_CODES = frozenset(
    REASON_CODES[REASON_CODES.index("idle_gpu_holder") : REASON_CODES.index("idle_window_clean")]
)


def code_of(reason: str) -> str:
    """The code part of ``code:detail``."""
    return reason.split(":", 1)[0]


def order_reasons(reasons: Iterable[str]) -> list[str]:
    """Sort reasons by contract code order, keep first occurrences, drop duplicates.

    Raises:
        ValueError: for a code that is not in ``REASON_CODES`` (a programming error, caught by tests).
    """
    seen: dict[str, None] = {}
    for reason in reasons:
        if code_of(reason) not in _ORDER:
            raise ValueError(f"unknown reason code {reason!r}")
        seen.setdefault(reason, None)
    return sorted(seen, key=lambda r: _ORDER[code_of(r)])


def verdict_of(reasons: Iterable[str], *, cheaper_shape_fits: bool = False) -> Verdict:
    """The verdict: the first class (excluded, unhealthy, unknown, busy, protected, idle) that has a reason.

    ``busy`` becomes ``underutilized`` when a cheaper shape fits the observed peak. ``unhealthy`` is never
    ``idle``: a GPU that cannot run anything reads idle (issue 28).
    """
    codes = {code_of(r) for r in reasons}
    if codes & EXCLUDED_CODES:
        return "excluded"
    if codes & UNHEALTHY_CODES:
        return "unhealthy"
    if codes & UNKNOWN_CODES:
        return "unknown"
    if codes & BUSY_CODES:
        return "underutilized" if cheaper_shape_fits else "busy"
    if codes & PROTECTED_CODES:
        return "protected"
    return "idle"


#: Protections the drain workflow re-checks itself: the budget slot and our own cordon.
BUDGET_ONLY = frozenset({"disruption_budget_exhausted", "in_flight"})
#: Protections lifted when the drain shrinks the group anyway (the plan's scale-in, off-hours): an
#: unhealthy node is then removed before a healthy one even if a repair would replace it (issue 28).
SHRINKING_EXEMPT = frozenset({"unhealthy_pending_repair", "unhealthy_first"})
#: Protections an off-hours drain is exempt from: the schedule is the operator's window
#: (docs/architecture.md §4 "Off-hours"). Never the warm floor, a reservation or an interruption notice.
#: ``no_placement`` / ``cpu_pods_pin_gpu_node``: a group going to zero on schedule strands its pods by the
#: operator's choice (the scale-in's placement simulation does not apply to it).
OFFHOURS_EXEMPT = (
    BUDGET_ONLY
    | SHRINKING_EXEMPT
    | {
        "cooldown",
        "outside_disruption_window",
        "node_group_at_min_size",
        "no_placement",
        "cpu_pods_pin_gpu_node",
    }
)


def blocking_reasons(
    reasons: Iterable[str], execution_id: str, *, offhours: bool, shrinking: bool = False
) -> list[str]:
    """The reasons that forbid draining a node now: every excluded, unknown or busy reason, and every
    protection but those the workflow re-checks itself (``BUDGET_ONLY``; for off-hours drains
    ``OFFHOURS_EXEMPT``; ``SHRINKING_EXEMPT`` when ``shrinking``: the plan chose the node for a scale-in).
    Health evidence alone never blocks: removing a broken node that nothing else keeps is safe.
    ``in_flight:<id>`` blocks unless ``<id>`` is ``execution_id`` (our own cordon).
    """
    allowed = OFFHOURS_EXEMPT if offhours else BUDGET_ONLY | (SHRINKING_EXEMPT if shrinking else frozenset())
    return reasons_blocking(reasons, execution_id, exempt=allowed, busy_blocks=True)


def reasons_blocking(
    reasons: Iterable[str], execution_id: str, *, exempt: AbstractSet[str], busy_blocks: bool
) -> list[str]:
    """The one rule every workflow applies to a fresh report (drain, resize, node group replacement):
    excluded and unknown reasons always block (never act on missing data), busy reasons when
    ``busy_blocks``, protections unless their code is in ``exempt``; ``in_flight:<id>`` blocks unless
    ``<id>`` is ``execution_id`` (our own cordon). Returns the blocking reasons, in input order."""
    blocking = []
    for reason in reasons:
        code = code_of(reason)
        if code == "in_flight":
            if not reason.endswith(f":{execution_id}"):
                blocking.append(reason)
        elif (
            code in EXCLUDED_CODES
            or code in UNKNOWN_CODES
            or (busy_blocks and code in BUSY_CODES)
            or (code in PROTECTED_CODES and code not in exempt)
        ):
            blocking.append(reason)
    return blocking
