"""Off-hours decision (docs/architecture.md §4 "Off-hours"): what one tick should do to one node group.

The shape of AWS Instance Scheduler: a pure function from the facts one tick read about a node group —
what its schedule says at ``now``, the saved and current sizes, its member nodes, drains in flight, Ready
GPU nodes, each member's verdict, snooze and last failed drain, the failed scaling activities, the policy
and ``force`` — to a typed,
frozen :class:`OffhoursDecision` with its reasons. ``services.offhours`` reads the facts, calls
:func:`decide`, and applies the decision (or, in a dry run, only reports it).

No I/O, no clock, no SDK: the same facts always give the same decision, so every branch is a table test
(``tests/unit/test_offhours_decision.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from rightsizer.domain.eligibility import DrainFacts, Judged, drain_refusals
from rightsizer.domain.holds import backoff_reason, snooze_reason
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.verdicts import BUSY_CODES, code_of, verdict_of

__all__ = [
    "FORCE_OVERRIDABLE",
    "Direction",
    "GroupFacts",
    "OffhoursAction",
    "OffhoursDecision",
    "Resize",
    "decide",
    "drain_blockers",
    "force_report",
    "restore_target",
    "wants_verdicts",
]

#: Which way a schedule moves a node group: to zero, or back to its saved sizes.
Direction = Literal["down", "up"]

#: Reason codes ``force`` lifts: the busy verdicts, i.e. "idle for the whole idle window". Unknown and
#: protected codes are never in here (docs/architecture.md §4).
FORCE_OVERRIDABLE = BUSY_CODES


class OffhoursAction(StrEnum):
    """What a tick does to a node group.

    - ``hold``: converged (down at zero, or up with nothing saved) — nothing to change;
    - ``skip``: going down, but a member may not be drained (busy, unknown, protected, excluded);
    - ``wait``: a drain is in flight, or the new ``minSize`` 0 has not reached the Auto Scaling group yet;
    - ``scale_down``: no member left — ``minSize``/``desiredSize`` to 0 (max unchanged);
    - ``drain_then_scale_down``: save sizes, ``minSize`` 0, drain and remove the members one at a time;
    - ``restore``: (re-)apply the saved sizes, never lowering a desired size an autoscaler raised;
    - ``finish_restore``: saved sizes are back and enough nodes are Ready with GPUs — forget them.
    """

    HOLD = "hold"
    SKIP = "skip"
    WAIT = "wait"
    SCALE_DOWN = "scale_down"
    DRAIN_THEN_SCALE_DOWN = "drain_then_scale_down"
    RESTORE = "restore"
    FINISH_RESTORE = "finish_restore"


@dataclass(frozen=True, slots=True)
class Resize:
    """One ``UpdateNodegroupConfig`` call: ``step`` names it in the ledger (``min_zero``, ``desired_zero``,
    ``restore``), ``what`` in the report; ``sizes`` are instances, sent together."""

    step: str
    sizes: GroupSizes
    what: str

    def text(self) -> str:
        """``"<what>: min M, desired D, max X"`` — how the report and the ledger name the change."""
        s = self.sizes
        return f"{self.what}: min {s.min}, desired {s.desired}, max {s.max}"


@dataclass(frozen=True)
class GroupFacts:
    """What one tick read about one node group (every input of :func:`decide`).

    Attributes:
        direction: what the schedule says at ``now`` (``domain.periods.schedule_contains``: down = in a period).
        now: the tick's aware instant.
        saved: sizes saved before the scale-down (``OffhoursStore.get_sizes``), or None.
        restore_started_at: when the first up tick of this cycle began the restore, or None.
        current: the Auto Scaling group's sizes (instances) now.
        members: names of the group's Nodes whose instance is still in the ASG, in drain order.
        in_flight: names of the group's nodes being drained now (a budget slot or a live lease of ours).
        ready_nodes: nodes of the group Ready with allocatable GPUs (BUG-27: what a restore counts).
        verdicts: a fresh assessment per member (``Assessor.assess_node``; None = not a GPU node). A
            member without an entry is never drained.
        failed_activity_codes: error codes of the ASG's failed scaling activities since the restore
            began (``DescribeScalingActivities``; None for an activity without a code).
        snoozed: member → the aware instant a person snoozed its removal until (``ApprovalStore.snoozes``).
        failed_drains: member → (aware instant, ledger result) of its last failed or rolled-back drain
            (``services.backoff.last_failures``); ``policy.drain_failure_backoff`` decides how long it holds.
    """

    direction: Direction
    now: datetime
    saved: GroupSizes | None
    current: GroupSizes
    restore_started_at: datetime | None = None
    members: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()
    ready_nodes: int = 0
    verdicts: Mapping[str, NodeReport | None] = field(default_factory=dict)
    failed_activity_codes: tuple[str | None, ...] = ()
    snoozed: Mapping[str, datetime] = field(default_factory=dict)
    failed_drains: Mapping[str, tuple[datetime, str]] = field(default_factory=dict)

    def holds(self, name: str, policy: Policy) -> tuple[str, ...]:
        """The holds on member ``name`` at ``now`` that no verdict shows: a running snooze
        (``snoozed:until:<t>``) and a failure back-off (``drain_failure_backoff:until:<t>:<result>``) —
        the same rules (``domain.holds``) the planner, the assessment and the drain's validate apply."""
        found = (
            snooze_reason(self.snoozed.get(name), self.now),
            backoff_reason(self.failed_drains.get(name), self.now, policy.drain_failure_backoff),
        )
        return tuple(reason for reason in found if reason is not None)


@dataclass(frozen=True)
class OffhoursDecision:
    """What one tick should do to one node group, and why; applied in this order by the executor.

    Attributes:
        action: the :class:`OffhoursAction`.
        outcome: the report outcome this action asks for (``GroupReport.outcome``).
        save: sizes to save before any change (the store keeps the first ones of a cycle), or None.
        restart_restore_clock: a restore that never finished is interrupted by a new off period — keep
            the saved sizes but restart their cycle, so the next up period does not alarm at once.
        resize: the ``UpdateNodegroupConfig`` to send now, or None.
        drain: members to drain and remove, one at a time, in this order (only the first now).
        then: the sizes once every member is gone (``desired`` 0), for the report.
        start_restore_clock: record ``now`` as the start of the restore (``restore_deadline``).
        forget_saved: the restore succeeded — delete the saved sizes.
        overdue_since: when the restore became overdue (``restore_started_at + restore_deadline``).
        reasons: why, as ``code`` or ``code:detail``.
        node_reasons: per member that blocks a scale-down, its verdict and blocking reasons.
    """

    action: OffhoursAction
    outcome: str
    save: GroupSizes | None = None
    restart_restore_clock: bool = False
    resize: Resize | None = None
    drain: tuple[str, ...] = ()
    then: GroupSizes | None = None
    start_restore_clock: bool = False
    forget_saved: bool = False
    overdue_since: datetime | None = None
    reasons: tuple[str, ...] = ()
    node_reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        """The decision as JSON (what was *requested*; the report's ``actions`` say what was taken)."""

        def sizes(value: GroupSizes | None) -> dict[str, int] | None:
            return None if value is None else {"min": value.min, "desired": value.desired, "max": value.max}

        return {
            "action": self.action.value,
            "outcome": self.outcome,
            "save": sizes(self.save),
            "restart_restore_clock": self.restart_restore_clock,
            "resize": None
            if self.resize is None
            else {"step": self.resize.step, **(sizes(self.resize.sizes) or {})},
            "drain": list(self.drain),
            "then": sizes(self.then),
            "start_restore_clock": self.start_restore_clock,
            "forget_saved": self.forget_saved,
            "overdue_since": None
            if self.overdue_since is None
            else self.overdue_since.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "reasons": list(self.reasons),
        }


def force_report(report: NodeReport | None) -> NodeReport | None:
    """The report with the busy reasons removed (``FORCE_OVERRIDABLE``) and the verdict recomputed.

    Unknown, protected and excluded reasons stay, so a forced drain still refuses those nodes.
    """
    if report is None:
        return None
    reasons = [r for r in report.reasons if code_of(r) not in FORCE_OVERRIDABLE]
    return report.model_copy(update={"reasons": reasons, "verdict": verdict_of(reasons)})


def drain_blockers(
    members: tuple[str, ...],
    verdicts: Mapping[str, NodeReport | None],
    *,
    force: bool,
    holds: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Per member that may not be drained by off-hours now: ``verdict:<v>`` and the blocking reasons.

    Off-hours drains are exempt from ``cooldown``, disruption windows and MinSize (the schedule is the
    operator's window); ``force`` lifts the busy reasons only — never a hold (``holds``: a member's running
    snooze or failure back-off, :meth:`GroupFacts.holds`), which blocks after the verdict's reasons. The
    verdict shown is the assessed one, so a forced busy node reads ``verdict:busy``; as in a plan, a
    snoozed node that would otherwise be idle reads ``verdict:protected``. A member that was not assessed
    blocks (``not_assessed``).
    """
    blockers: dict[str, tuple[str, ...]] = {}
    for name in members:
        if name not in verdicts:
            blockers[name] = ("verdict:unknown", "not_assessed")
            continue
        assessed = verdicts[name]
        if assessed is None:
            blockers[name] = ("verdict:not_a_gpu_node", "not_a_gpu_node")
            continue
        checked = force_report(assessed) if force else assessed
        assert checked is not None
        judged = Judged(checked.verdict, tuple(checked.reasons))
        # The drain's eligibility (domain.eligibility), as the off-hours drain's validate applies it.
        blocking = [r.reason for r in drain_refusals(DrainFacts(judged, asg="", mode="offhours"))]
        held = [r for r in (holds or {}).get(name, ()) if r not in blocking]
        if blocking or held:
            snoozed = any(code_of(r) == "snoozed" for r in held)
            verdict = "protected" if snoozed and assessed.verdict == "idle" else assessed.verdict
            blockers[name] = (f"verdict:{verdict}", *blocking, *held)
    return blockers


def wants_verdicts(direction: Direction, members: tuple[str, ...], in_flight: tuple[str, ...]) -> bool:
    """Whether :func:`decide` will look at verdicts: going down with members and no drain in flight.

    The executor assesses only then, so a waiting or converged tick costs no observation.
    """
    return direction == "down" and bool(members) and not in_flight


def decide(facts: GroupFacts, policy: Policy, *, force: bool = False) -> OffhoursDecision:
    """The one step that brings the group closer to what its schedule says at ``facts.now``.

    Args:
        facts: everything the tick read about the group.
        policy: ``restore_deadline`` and ``drain_failure_backoff`` (seconds) are used.
        force: lift busy/underutilized verdicts (never unknown, protected, excluded, snoozed or backed off).

    Returns:
        The :class:`OffhoursDecision`. Same facts, same decision; dry run is not an input (the executor
        decides whether to apply it).
    """
    if facts.direction == "down":
        return _going_down(facts, policy, force=force)
    return _coming_up(facts, policy)


def _save(facts: GroupFacts) -> tuple[GroupSizes | None, bool, tuple[str, ...]]:
    """Sizes to save once per cycle, and whether an unfinished restore is being interrupted."""
    if facts.saved is None:
        return facts.current, False, ()
    if facts.restore_started_at is not None:
        return None, True, ("restore_interrupted",)
    return None, False, ()


def _going_down(facts: GroupFacts, policy: Policy, *, force: bool) -> OffhoursDecision:
    current = facts.current
    if facts.in_flight:
        # One node per group at a time: the drain's own workflow finishes it, the next tick goes on.
        return OffhoursDecision(
            OffhoursAction.WAIT, "waiting", reasons=("drain_in_flight:" + ",".join(facts.in_flight),)
        )
    save, restart, save_reasons = _save(facts)
    if not facts.members:
        if current.min == 0 and current.desired == 0:
            return OffhoursDecision(
                OffhoursAction.HOLD, "down", save=save, restart_restore_clock=restart, reasons=save_reasons
            )
        return OffhoursDecision(
            OffhoursAction.SCALE_DOWN,
            "scaling_down",
            save=save,
            restart_restore_clock=restart,
            resize=Resize("desired_zero", GroupSizes(0, 0, current.max), "set desired 0"),
            reasons=save_reasons,
        )
    holds = {name: facts.holds(name, policy) for name in facts.members}
    blockers = drain_blockers(facts.members, facts.verdicts, force=force, holds=holds)
    # A member kept by its group's warm floor alone (issue 28) stays; the others go down around it.
    floor = {n: why for n, why in blockers.items() if all(code_of(r) == "warm_floor" for r in why[1:])}
    blockers = {n: why for n, why in blockers.items() if n not in floor}
    if blockers:
        return OffhoursDecision(
            OffhoursAction.SKIP,
            "skipped",
            reasons=("nodes_not_drainable:" + ",".join(sorted(blockers)),),
            node_reasons=blockers,
        )
    drain = _unhealthy_first(tuple(m for m in facts.members if m not in floor), facts.verdicts)
    if not drain:
        kept = sorted({r for why in floor.values() for r in why[1:]})
        return OffhoursDecision(OffhoursAction.HOLD, "down", save=save, restart_restore_clock=restart,
                                reasons=(*save_reasons, *kept))  # fmt: skip
    resize = (
        Resize("min_zero", GroupSizes(0, current.desired, current.max), "set min 0")
        if current.min != 0
        else None
    )
    if current.desired - 1 < current.min:
        # EKS copies the new minSize to the ASG asynchronously; until it has, removing a node would be
        # refused as below MinSize after the whole drain. The next tick goes on.
        return OffhoursDecision(
            OffhoursAction.WAIT,
            "waiting",
            save=save,
            restart_restore_clock=restart,
            resize=resize,
            reasons=(*save_reasons, f"waiting_for_min_size:{current.min}"),
        )
    return OffhoursDecision(
        OffhoursAction.DRAIN_THEN_SCALE_DOWN,
        "scaling_down",
        save=save,
        restart_restore_clock=restart,
        resize=resize,
        drain=drain,
        then=GroupSizes(0, len(floor), current.max),
        reasons=save_reasons,
    )


def _unhealthy_first(members: tuple[str, ...], verdicts: Mapping[str, NodeReport | None]) -> tuple[str, ...]:
    """``members`` with the unhealthy ones first (issue 28), the order otherwise kept."""
    broken = tuple(m for m in members if (r := verdicts.get(m)) is not None and r.verdict == "unhealthy")
    return broken + tuple(m for m in members if m not in broken)


def restore_target(saved: GroupSizes, current: GroupSizes) -> GroupSizes:
    """The sizes a restore sends: the saved ones, except that desired is never lowered (BUG-23:
    ``UpdateNodegroupConfig`` with a smaller desired terminates instances of AWS's choosing, e.g. nodes an
    autoscaler just added) — capped at the saved max."""
    desired = saved.desired if current.desired <= saved.desired else min(current.desired, saved.max)
    return GroupSizes(saved.min, desired, saved.max)


def _coming_up(facts: GroupFacts, policy: Policy) -> OffhoursDecision:
    if facts.saved is None:
        return OffhoursDecision(OffhoursAction.HOLD, "up")
    start_clock = facts.restore_started_at is None
    current, want = facts.current, facts.saved
    # Success is Ready nodes with GPUs (BUG-27), never the API's 200. desired ≥ rather than ==: an
    # autoscaler may already have grown the group for pending pods, which is not a failure.
    if (
        current.min == want.min
        and current.max == want.max
        and current.desired >= want.desired
        and facts.ready_nodes >= want.desired
    ):
        return OffhoursDecision(
            OffhoursAction.FINISH_RESTORE,
            "restored",
            start_restore_clock=start_clock,
            forget_saved=True,
        )
    codes = sorted({code or "unknown" for code in facts.failed_activity_codes})
    reasons = ["scaling_failed:" + ",".join(codes)] if codes else []
    reasons.append(f"ready:{facts.ready_nodes}/{want.desired}")
    started = facts.restore_started_at or facts.now
    deadline = started + timedelta(seconds=policy.restore_deadline)
    overdue = facts.now >= deadline
    if overdue:
        reasons.append("restore_overdue:since:" + deadline.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    return OffhoursDecision(
        OffhoursAction.RESTORE,
        "restoring",
        start_restore_clock=start_clock,
        resize=Resize("restore", restore_target(want, current), "restore saved sizes"),
        overdue_since=deadline if overdue else None,
        reasons=tuple(reasons),
    )
