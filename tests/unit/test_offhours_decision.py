"""The off-hours decision (``rightsizer.domain.offhours.decide``), without ports: tables and properties.

Every action, the force/protected/unknown rules, snoozes and failure back-offs (running or ended),
in-flight drains, MinSize, the restore target and its deadline, DST instants (the direction comes from
``domain.periods``); then hypothesis properties: restore target == saved sizes, desired never lowered by a
restore, unknown/protected/snoozed/backed-off nodes never drained, the same facts give the same decision.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rightsizer.domain.model import GroupSizes
from rightsizer.domain.offhours import (
    Direction,
    GroupFacts,
    OffhoursAction,
    OffhoursDecision,
    Resize,
    decide,
    drain_blockers,
    restore_target,
    wants_verdicts,
)
from rightsizer.domain.periods import Period, schedule_contains
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.verdicts import (
    BUSY_CODES,
    EXCLUDED_CODES,
    OFFHOURS_EXEMPT,
    PROTECTED_CODES,
    REASON_CODES,
    UNKNOWN_CODES,
    code_of,
    verdict_of,
)
from rightsizer.state import SavedSizes

NOW = datetime(2024, 5, 18, 11, 0, tzinfo=UTC)
POLICY = Policy()  # restore_deadline 1800 s
IDLE = ["idle_window_clean"]
NODES = ("n-a", "n-b", "n-c")


def report(node: str, reasons: Sequence[str] = IDLE) -> NodeReport:
    return NodeReport(
        node=node,
        verdict=verdict_of(reasons),
        reasons=list(reasons),
        node_group="gpu",
        instance_id=f"i-{node}",
        instance_type="g5.12xlarge",
        gpus=4,
        gpu_activity_max_pct=0.0,
        fb_used_max_mib=0.0,
        coverage=1.0,
        hourly_usd=5.672,
    )


def idle(*names: str) -> dict[str, NodeReport | None]:
    return {name: report(name) for name in names}


def saved(
    sizes: tuple[int, int, int] = (1, 3, 6), *, restore_started_at: datetime | None = None
) -> SavedSizes:
    return SavedSizes("gpu", GroupSizes(*sizes), NOW - timedelta(days=1), restore_started_at)


def down(
    current: tuple[int, int, int] = (1, 3, 6),
    members: tuple[str, ...] = NODES,
    *,
    verdicts: Mapping[str, NodeReport | None] | None = None,
    in_flight: tuple[str, ...] = (),
    saved_sizes: SavedSizes | None = None,
    snoozed: Mapping[str, datetime] | None = None,
    failed_drains: Mapping[str, tuple[datetime, str]] | None = None,
) -> GroupFacts:
    return GroupFacts(
        direction="down",
        now=NOW,
        saved=saved_sizes.sizes if saved_sizes else None,
        restore_started_at=saved_sizes.restore_started_at if saved_sizes else None,
        current=GroupSizes(*current),
        members=members,
        in_flight=in_flight,
        verdicts=idle(*members) if verdicts is None else verdicts,
        snoozed=snoozed or {},
        failed_drains=failed_drains or {},
    )


def up(
    current: tuple[int, int, int],
    saved_sizes: SavedSizes | None,
    *,
    ready: int = 0,
    now: datetime = NOW,
    codes: tuple[str | None, ...] = (),
) -> GroupFacts:
    return GroupFacts(
        direction="up",
        now=now,
        saved=saved_sizes.sizes if saved_sizes else None,
        restore_started_at=saved_sizes.restore_started_at if saved_sizes else None,
        current=GroupSizes(*current),
        ready_nodes=ready,
        failed_activity_codes=codes,
    )


# ------------------------------------------------------------------------------------------ going down


def test_idle_members_are_drained_after_saving_sizes_and_min_zero() -> None:
    decision = decide(down(), POLICY)
    assert decision == OffhoursDecision(
        OffhoursAction.DRAIN_THEN_SCALE_DOWN,
        "scaling_down",
        save=GroupSizes(1, 3, 6),
        resize=Resize("min_zero", GroupSizes(0, 3, 6), "set min 0"),
        drain=NODES,
        then=GroupSizes(0, 0, 6),
    )


def test_min_already_zero_drains_without_a_resize() -> None:
    decision = decide(down((0, 2, 6), NODES[:2], saved_sizes=saved()), POLICY)
    assert decision.action is OffhoursAction.DRAIN_THEN_SCALE_DOWN
    assert decision.resize is None and decision.save is None and decision.drain == NODES[:2]


@pytest.mark.parametrize(
    ("current", "waits"),
    [((1, 1, 6), True), ((2, 2, 6), True), ((2, 3, 6), False), ((0, 1, 6), False), ((3, 3, 3), True)],
)
def test_min_size_not_yet_zero_on_the_asg_waits_after_asking_for_it(
    current: tuple[int, int, int], waits: bool
) -> None:
    decision = decide(down(current, NODES[: current[1]]), POLICY)
    if waits:
        assert decision.action is OffhoursAction.WAIT and decision.outcome == "waiting"
        assert decision.reasons == (f"waiting_for_min_size:{current[0]}",)
        assert decision.resize == Resize("min_zero", GroupSizes(0, current[1], current[2]), "set min 0")
        assert decision.save == GroupSizes(*current) and decision.drain == ()
    else:
        assert decision.action is OffhoursAction.DRAIN_THEN_SCALE_DOWN


def test_a_drain_in_flight_waits_and_changes_nothing() -> None:
    decision = decide(down(in_flight=("n-b", "n-x")), POLICY)
    assert decision == OffhoursDecision(OffhoursAction.WAIT, "waiting", reasons=("drain_in_flight:n-b,n-x",))


@pytest.mark.parametrize(
    ("current", "action", "resize"),
    [
        ((0, 0, 6), OffhoursAction.HOLD, None),
        ((0, 2, 6), OffhoursAction.SCALE_DOWN, Resize("desired_zero", GroupSizes(0, 0, 6), "set desired 0")),
        ((1, 1, 4), OffhoursAction.SCALE_DOWN, Resize("desired_zero", GroupSizes(0, 0, 4), "set desired 0")),
    ],
)
def test_no_member_left_sets_desired_zero_or_holds(
    current: tuple[int, int, int], action: OffhoursAction, resize: Resize | None
) -> None:
    decision = decide(down(current, (), saved_sizes=saved()), POLICY)
    assert decision.action is action and decision.resize == resize and decision.save is None
    assert decision.outcome == ("down" if action is OffhoursAction.HOLD else "scaling_down")


def test_a_group_already_at_zero_with_nothing_saved_saves_its_sizes_once() -> None:
    decision = decide(down((0, 0, 6), ()), POLICY)
    assert decision.action is OffhoursAction.HOLD and decision.save == GroupSizes(0, 0, 6)


def test_an_unfinished_restore_interrupted_by_the_night_keeps_the_sizes_and_restarts_the_clock() -> None:
    decision = decide(down(saved_sizes=saved(restore_started_at=NOW - timedelta(hours=1))), POLICY)
    assert decision.action is OffhoursAction.DRAIN_THEN_SCALE_DOWN
    assert decision.save is None and decision.restart_restore_clock
    assert decision.reasons == ("restore_interrupted",)


BUSY = "activity_above_threshold:n-a:GPU-0:87.0"


@pytest.mark.parametrize(
    ("reasons", "force", "blocked", "shown"),
    [
        ([BUSY], False, True, "verdict:busy"),
        ([BUSY], True, False, None),
        (["fb_above_threshold:n-a:GPU-0:900"], True, False, None),
        (["no_series:GPU-0"], True, True, "verdict:unknown"),
        (["coverage_below_min:0.42"], False, True, "verdict:unknown"),
        (["do_not_disrupt:node"], True, True, "verdict:protected"),
        (["pdb_blocks:ns/pdb"], True, True, "verdict:protected"),
        (["not_selected"], True, True, "verdict:excluded"),
        ([BUSY, "local_storage:ns/p"], True, True, "verdict:busy"),
        (["in_flight:other-exec"], False, True, "verdict:protected"),
        # Exempt for off-hours: the schedule is the operator's window (docs/architecture.md §4).
        (["cooldown:3m", "outside_disruption_window", "node_group_at_min_size:1"], False, False, None),
        (["disruption_budget_exhausted"], False, False, None),
    ],
)
def test_verdicts_force_and_protections(
    reasons: list[str], force: bool, blocked: bool, shown: str | None
) -> None:
    verdicts = {**idle(*NODES), "n-a": report("n-a", reasons)}
    decision = decide(down(verdicts=verdicts), POLICY, force=force)
    if blocked:
        assert decision.action is OffhoursAction.SKIP and decision.outcome == "skipped"
        assert decision.reasons == ("nodes_not_drainable:n-a",)
        assert decision.node_reasons["n-a"][0] == shown
        assert decision.save is None and decision.resize is None and decision.drain == ()
    else:
        assert decision.action is OffhoursAction.DRAIN_THEN_SCALE_DOWN and "n-a" in decision.drain


def test_a_member_not_assessed_or_not_a_gpu_node_blocks() -> None:
    verdicts: dict[str, NodeReport | None] = {"n-a": None, "n-c": report("n-c")}
    decision = decide(down(verdicts=verdicts), POLICY, force=True)
    assert decision.action is OffhoursAction.SKIP
    assert decision.node_reasons == {
        "n-a": ("verdict:not_a_gpu_node", "not_a_gpu_node"),
        "n-b": ("verdict:unknown", "not_assessed"),
    }


# Snoozes and failure back-offs: holds that no verdict shows (docs/architecture.md §4, domain.holds). The
# planner makes a snoozed node protected (snoozed:until:<t>); the assessment skips a backed-off node with
# drain_failure_backoff:until:<t>:<result>. Off-hours must not start those drains (validate would abandon
# each one), for any member, forced or not; an ended hold changes nothing. Policy default back-off: 30 min.
BACKOFF = POLICY.drain_failure_backoff
SNOOZE_UNTIL = "snoozed:until:2024-05-18T19:00:00Z"


@pytest.mark.parametrize(
    ("snoozed", "failed", "verdict", "force", "blocked_by"),
    [
        # snooze running (8 h left, 1 s left) / ended (exactly now, 1 s ago)
        ({"n-b": NOW + timedelta(hours=8)}, {}, IDLE, False, ("verdict:protected", SNOOZE_UNTIL)),
        ({"n-b": NOW + timedelta(seconds=1)}, {}, IDLE, False, ("verdict:protected", "snoozed:until:2024-05-18T11:00:01Z")),
        ({"n-b": NOW}, {}, IDLE, False, None),
        ({"n-b": NOW - timedelta(seconds=1)}, {}, IDLE, False, None),
        # force lifts busy verdicts, never a snooze; the assessed verdict stays shown when it is not idle
        ({"n-b": NOW + timedelta(hours=8)}, {}, [BUSY], True, ("verdict:busy", SNOOZE_UNTIL)),
        # a snooze the assessment already saw is named once
        ({"n-b": NOW + timedelta(hours=8)}, {}, [SNOOZE_UNTIL], False, ("verdict:protected", SNOOZE_UNTIL)),
        # back-off running (failed 1 min ago, rolled back 29 min 59 s ago) / ended (exactly 30 min, 2 h ago)
        ({}, {"n-b": (NOW - timedelta(minutes=1), "failed")}, IDLE, False,
         ("verdict:idle", "drain_failure_backoff:until:2024-05-18T11:29:00Z:failed")),
        ({}, {"n-b": (NOW - timedelta(seconds=BACKOFF - 1), "rolled_back")}, IDLE, True,
         ("verdict:idle", "drain_failure_backoff:until:2024-05-18T11:00:01Z:rolled_back")),
        ({}, {"n-b": (NOW - timedelta(seconds=BACKOFF), "failed")}, IDLE, False, None),
        ({}, {"n-b": (NOW - timedelta(hours=2), "failed")}, IDLE, False, None),
        # both at once: the snooze first, then the back-off
        ({"n-b": NOW + timedelta(hours=8)}, {"n-b": (NOW - timedelta(minutes=1), "failed")}, IDLE, False,
         ("verdict:protected", SNOOZE_UNTIL, "drain_failure_backoff:until:2024-05-18T11:29:00Z:failed")),
        # a hold on a node that is not a member of the group changes nothing
        ({"elsewhere": NOW + timedelta(hours=8)}, {"elsewhere": (NOW, "failed")}, IDLE, False, None),
    ],
)  # fmt: skip
def test_snoozed_or_backed_off_members_are_not_drained_until_the_hold_ends(
    snoozed: dict[str, datetime],
    failed: dict[str, tuple[datetime, str]],
    verdict: list[str],
    force: bool,
    blocked_by: tuple[str, ...] | None,
) -> None:
    verdicts = {**idle(*NODES), "n-b": report("n-b", verdict)}
    decision = decide(down(verdicts=verdicts, snoozed=snoozed, failed_drains=failed), POLICY, force=force)
    if blocked_by is None:
        assert decision.action is OffhoursAction.DRAIN_THEN_SCALE_DOWN
        assert decision.drain == NODES and decision.node_reasons == {}
    else:
        assert decision.action is OffhoursAction.SKIP and decision.outcome == "skipped"
        assert decision.reasons == ("nodes_not_drainable:n-b",)
        assert decision.node_reasons == {"n-b": blocked_by}
        assert decision.save is None and decision.resize is None and decision.drain == ()


def test_a_back_off_of_zero_never_holds() -> None:
    facts = down(failed_drains={"n-a": (NOW, "failed")})
    assert decide(facts, Policy(drain_failure_backoff=0), force=False).drain == NODES
    assert decide(facts, POLICY, force=False).drain == ()


@pytest.mark.parametrize(
    ("direction", "members", "in_flight", "wanted"),
    [
        ("down", NODES, (), True),
        ("down", NODES, ("n-a",), False),
        ("down", (), (), False),
        ("up", NODES, (), False),
    ],
)
def test_verdicts_are_wanted_only_when_the_decision_reads_them(
    direction: Direction, members: tuple[str, ...], in_flight: tuple[str, ...], wanted: bool
) -> None:
    assert wants_verdicts(direction, members, in_flight) is wanted


# ------------------------------------------------------------------------------------------ coming up


def test_up_with_nothing_saved_holds() -> None:
    assert decide(up((1, 3, 6), None), POLICY) == OffhoursDecision(OffhoursAction.HOLD, "up")


def test_the_first_up_tick_restores_the_saved_sizes_and_starts_the_clock() -> None:
    decision = decide(up((0, 0, 6), saved()), POLICY)
    assert decision == OffhoursDecision(
        OffhoursAction.RESTORE,
        "restoring",
        start_restore_clock=True,
        resize=Resize("restore", GroupSizes(1, 3, 6), "restore saved sizes"),
        reasons=("ready:0/3",),
    )


@pytest.mark.parametrize(
    ("current", "ready", "action"),
    [
        ((1, 3, 6), 3, OffhoursAction.FINISH_RESTORE),
        ((1, 5, 6), 3, OffhoursAction.FINISH_RESTORE),  # an autoscaler grew it: not a failure
        ((1, 3, 6), 2, OffhoursAction.RESTORE),  # BUG-27: sizes are back, nodes are not Ready yet
        ((1, 2, 6), 3, OffhoursAction.RESTORE),
        ((0, 3, 6), 3, OffhoursAction.RESTORE),
        ((1, 3, 8), 3, OffhoursAction.RESTORE),
    ],
)
def test_a_restore_finishes_only_with_the_sizes_back_and_enough_nodes_ready(
    current: tuple[int, int, int], ready: int, action: OffhoursAction
) -> None:
    started = saved(restore_started_at=NOW - timedelta(minutes=5))
    decision = decide(up(current, started, ready=ready), POLICY)
    assert decision.action is action and not decision.start_restore_clock
    assert decision.forget_saved is (action is OffhoursAction.FINISH_RESTORE)


@pytest.mark.parametrize(
    ("current", "target"),
    [((0, 0, 6), (1, 3, 6)), ((1, 5, 6), (1, 5, 6)), ((0, 8, 8), (1, 6, 6)), ((0, 2, 2), (1, 3, 6))],
)
def test_the_restore_target_never_lowers_desired_below_what_the_saved_max_allows(
    current: tuple[int, int, int], target: tuple[int, int, int]
) -> None:
    assert restore_target(GroupSizes(1, 3, 6), GroupSizes(*current)) == GroupSizes(*target)


@pytest.mark.parametrize(
    ("elapsed", "overdue"),
    [(timedelta(minutes=29, seconds=59), False), (timedelta(minutes=30), True), (timedelta(hours=3), True)],
)
def test_a_restore_is_overdue_from_restore_deadline_on(elapsed: timedelta, overdue: bool) -> None:
    began = NOW - elapsed
    facts = up(
        (1, 3, 6), saved(restore_started_at=began), ready=1, codes=("InsufficientInstanceCapacity", None)
    )
    decision = decide(facts, POLICY)
    deadline = began + timedelta(seconds=1800)
    assert decision.action is OffhoursAction.RESTORE
    assert decision.overdue_since == (deadline if overdue else None)
    expected = ["scaling_failed:InsufficientInstanceCapacity,unknown", "ready:1/3"]
    if overdue:
        expected.append("restore_overdue:since:" + deadline.isoformat().replace("+00:00", "Z"))
    assert list(decision.reasons) == expected


# ------------------------------------------------------------------------------------------ DST instants

BERLIN = "Europe/Berlin"
NIGHTLY = [
    Period(
        days=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], start="22:30", end="06:00", timezone=BERLIN
    )
]
FALLBACK_LATE_END = [Period(days=["Sat"], start="22:00", end="02:30", timezone=BERLIN)]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    ("periods", "instant", "action"),
    [
        # 06:00 Berlin is 04:00 UTC after spring-forward and 05:00 UTC after fall-back.
        (NIGHTLY, "2024-03-31T03:59:59Z", OffhoursAction.DRAIN_THEN_SCALE_DOWN),
        (NIGHTLY, "2024-03-31T04:00:00Z", OffhoursAction.RESTORE),
        (NIGHTLY, "2024-10-27T04:59:59Z", OffhoursAction.DRAIN_THEN_SCALE_DOWN),
        (NIGHTLY, "2024-10-27T05:00:00Z", OffhoursAction.RESTORE),
        # An end in the repeated hour acts at its first occurrence (issue 12): 02:30 CEST = 00:30 UTC.
        (FALLBACK_LATE_END, "2024-10-27T00:29:59Z", OffhoursAction.DRAIN_THEN_SCALE_DOWN),
        (FALLBACK_LATE_END, "2024-10-27T00:30:00Z", OffhoursAction.RESTORE),
        (FALLBACK_LATE_END, "2024-10-27T01:30:00Z", OffhoursAction.RESTORE),  # 02:30 CET, the second time
    ],
)
def test_the_decision_at_dst_instants(periods: list[Period], instant: str, action: OffhoursAction) -> None:
    at = utc(instant)
    direction: Direction = "down" if schedule_contains(periods, at) else "up"
    facts = GroupFacts(
        direction, at, GroupSizes(1, 3, 6), GroupSizes(0, 2, 6), members=NODES[:2], verdicts=idle(*NODES[:2])
    )
    assert decide(facts, POLICY).action is action


# ------------------------------------------------------------------------------------------ properties

sizes = st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(1, 12)).map(
    lambda t: GroupSizes(*sorted(t))
)
codes = st.sampled_from((*REASON_CODES, "in_flight"))
reason_lists = st.lists(codes, max_size=4).map(lambda cs: [f"{c}:x" if c == "in_flight" else c for c in cs])


offsets = st.integers(-7200, 7200)  # seconds either side of NOW: holds running and ended


@st.composite
def group_facts(draw: st.DrawFn) -> GroupFacts:
    members = tuple(f"n-{i}" for i in range(draw(st.integers(0, 4))))
    verdicts: dict[str, NodeReport | None] = {}
    for name in members:
        choice = draw(st.sampled_from(["report", "report", "none", "missing"]))
        if choice == "report":
            verdicts[name] = report(name, draw(reason_lists))
        elif choice == "none":
            verdicts[name] = None
    saved_sizes = draw(st.none() | sizes)
    began = None
    if saved_sizes is not None and draw(st.booleans()):
        began = NOW - timedelta(seconds=draw(st.integers(0, 7200)))
    return GroupFacts(
        direction=draw(st.sampled_from(["down", "up"])),
        now=NOW,
        saved=saved_sizes,
        restore_started_at=began,
        current=draw(sizes),
        members=members,
        in_flight=tuple(draw(st.lists(st.sampled_from(members or ("n-x",)), max_size=2, unique=True))),
        ready_nodes=draw(st.integers(0, 12)),
        verdicts=verdicts,
        failed_activity_codes=tuple(
            draw(st.lists(st.none() | st.sampled_from(["InsufficientInstanceCapacity"])))
        ),
        snoozed={
            n: NOW + timedelta(seconds=draw(offsets))
            for n in draw(st.sets(st.sampled_from(members or ("n-x",))))
        },
        failed_drains={
            n: (NOW - timedelta(seconds=draw(offsets)), draw(st.sampled_from(["failed", "rolled_back"])))
            for n in draw(st.sets(st.sampled_from(members or ("n-x",))))
        },
    )


def _held(facts: GroupFacts, name: str) -> bool:
    """A running snooze or failure back-off, by the instants alone (not through domain.holds)."""
    until = facts.snoozed.get(name)
    failed = facts.failed_drains.get(name)
    backoff = timedelta(seconds=POLICY.drain_failure_backoff)
    return (until is not None and until > NOW) or (failed is not None and failed[0] + backoff > NOW)


def _never_drainable(reasons: Sequence[str]) -> bool:
    codes_ = {code_of(r) for r in reasons}
    protected = (codes_ & PROTECTED_CODES) - OFFHOURS_EXEMPT
    return bool(codes_ & (UNKNOWN_CODES | EXCLUDED_CODES) or protected)


@settings(max_examples=200, deadline=None)
@given(group_facts(), st.booleans())
def test_same_facts_same_decision(facts: GroupFacts, force: bool) -> None:
    assert decide(facts, POLICY, force=force) == decide(copy.deepcopy(facts), POLICY, force=force)


@settings(max_examples=200, deadline=None)
@given(group_facts(), st.booleans())
def test_unknown_protected_unassessed_snoozed_or_backed_off_nodes_are_never_drained(
    facts: GroupFacts, force: bool
) -> None:
    decision = decide(facts, POLICY, force=force)
    for name in decision.drain:
        assessed = facts.verdicts.get(name)
        assert assessed is not None, name
        assert not _never_drainable(assessed.reasons), assessed.reasons
        if not force:
            assert not {code_of(r) for r in assessed.reasons} & BUSY_CODES
        assert not _held(facts, name), name
    # A group with one such member is skipped whole, forced or not.
    if any(
        name not in facts.verdicts
        or facts.verdicts[name] is None
        or _never_drainable(facts.verdicts[name].reasons)  # type: ignore[union-attr]
        or _held(facts, name)
        for name in facts.members
    ):
        assert decision.drain == ()


@settings(max_examples=200, deadline=None)
@given(group_facts())
def test_restore_target_is_the_saved_sizes_and_never_lowers_desired(facts: GroupFacts) -> None:
    decision = decide(facts, POLICY)
    if decision.action is not OffhoursAction.RESTORE:
        return
    assert facts.saved is not None and decision.resize is not None
    want, current, target = facts.saved, facts.current, decision.resize.sizes
    assert (target.min, target.max) == (want.min, want.max)
    if current.desired <= want.desired:
        assert target == want
    # Never lower desired while restoring, unless the saved max itself forbids the current desired.
    assert target.desired >= min(current.desired, want.max)


@settings(max_examples=200, deadline=None)
@given(sizes, sizes, st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_desired_never_decreases_over_restore_ticks(
    want: GroupSizes, start: GroupSizes, raises: list[int]
) -> None:
    """Ticks of one up period; between ticks an autoscaler may raise desired (within the saved max)."""
    current = start
    began = NOW
    for tick, extra in enumerate(raises):
        facts = up(
            (current.min, current.desired, current.max),
            saved((want.min, want.desired, want.max), restore_started_at=began),
            now=NOW + timedelta(minutes=5 * tick),
        )
        decision = decide(facts, POLICY)
        if decision.resize is None:
            return
        nxt = decision.resize.sizes
        if tick > 0:  # after the first tick the group is within the saved max
            assert nxt.desired >= current.desired
        grown = min(nxt.desired + extra, nxt.max)
        current = GroupSizes(nxt.min, grown, nxt.max)


@settings(max_examples=300, deadline=None)
@given(group_facts(), st.booleans())
def test_every_resize_is_valid_and_going_down_never_raises_sizes(facts: GroupFacts, force: bool) -> None:
    decision = decide(facts, POLICY, force=force)
    resize = decision.resize
    if resize is not None and facts.direction == "down":
        assert resize.sizes.min <= facts.current.min and resize.sizes.desired <= facts.current.desired
        assert resize.sizes.max == facts.current.max
    if decision.drain:
        assert drain_blockers(decision.drain, facts.verdicts, force=force) == {}
