"""The off-hours executor (``services.offhours``) around the pure decision: what it reads, when it assesses,
that a dry run and a live run make the same decisions, and that the report keeps requested apart from taken.

Runs on ``tests.support.offhours_world`` (the real drain workflow, fake cluster and node groups).
"""

from __future__ import annotations

from datetime import timedelta

from rightsizer.services.offhours import run_offhours
from tests.support.offhours_world import MONDAY_MORNING, SATURDAY_NOON, make_world


def test_a_dry_run_makes_the_live_runs_decision_and_takes_none_of_it() -> None:
    live, dry = make_world(), make_world(dry_run=True)
    taken = live.run(SATURDAY_NOON).group("gpu-a10g")
    would = dry.run(SATURDAY_NOON).group("gpu-a10g")
    # Same facts (same world), same first decision; the live tick then goes on after each finished drain.
    assert would.requested == taken.requested[:1]
    assert would.requested[0]["action"] == "drain_then_scale_down"
    assert would.requested[0]["drain"] == dry.nodes_of("gpu-a10g")
    assert (
        dry.state.entries() == [] and dry.aws.update_calls == [] and dry.state.get_sizes("gpu-a10g") is None
    )


def test_requested_and_taken_are_both_in_the_report() -> None:
    world = make_world()
    nodes = world.nodes_of("gpu-a10g")
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    # One decision per round: a synchronous drain finished, so the tick read and decided again.
    assert [d["action"] for d in group.requested] == ["drain_then_scale_down"] * 3 + ["hold"]
    assert [d["drain"] for d in group.requested] == [nodes, nodes[1:], nodes[2:], []]
    assert group.requested[0]["save"] == {"min": 1, "desired": 3, "max": 6}
    assert group.requested[0]["resize"] == {"step": "min_zero", "min": 0, "desired": 3, "max": 6}
    assert group.requested[1]["resize"] is None  # min 0 reached the ASG: not asked again
    assert group.actions == [
        "saved sizes: min 1, desired 3, max 6",
        "set min 0: min 0, desired 3, max 6",
        *(f"drained and removed {n}" for n in nodes),
    ]
    assert group.outcome == "scaling_down"  # the tick took the group the rest of the way
    assert group.to_json_dict()["requested"] == group.requested

    up = world.run(MONDAY_MORNING).group("gpu-a10g")
    assert [d["action"] for d in up.requested] == ["restore"]
    assert up.requested[0]["start_restore_clock"] is True
    assert up.actions == ["restore saved sizes: min 1, desired 3, max 6"]


def test_members_are_assessed_once_per_tick_and_only_when_the_decision_reads_verdicts() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    # 3 nodes assessed once each by the tick; the drain workflow's own validate/revalidate assess too.
    tick_calls = world.assessor.calls
    assert tick_calls >= 3

    quiet = make_world()
    node = quiet.nodes_of("gpu-a10g")[0]
    assert quiet.state.acquire(node, "other-exec", SATURDAY_NOON, 900) is not None
    quiet.state.take_slot(
        "eks-gpu-a10g-asg", node, "other-exec", SATURDAY_NOON,
        max_per_run=1, max_per_group=1, desired=3, min_size=0,
    )  # fmt: skip
    assert quiet.run(SATURDAY_NOON).group("gpu-a10g").outcome == "waiting"
    assert quiet.assessor.calls == 0  # a waiting tick costs no observation

    assert quiet.run(MONDAY_MORNING).group("gpu-a10g").outcome == "up"
    assert quiet.assessor.calls == 0  # nor does the way up


def test_each_member_is_assessed_once_even_across_rounds() -> None:
    world = make_world()
    seen: list[str] = []
    inner = world.assessor.assess_node

    def counting(node: str, now: object) -> object:
        seen.append(node)
        return inner(node, now)  # type: ignore[arg-type]

    # Only the off-hours tick's assessor counts; the drain workflow holds its own reference.
    world.deps.assessor = type("Counting", (), {"assess_node": staticmethod(counting)})()
    world.run(SATURDAY_NOON)
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 3


def test_a_dry_run_waits_for_min_size_like_a_live_run() -> None:
    """Intended difference: a dry run used to skip the MinSize check and list every drain; it now reports
    the live run's decision for this tick (ask for min 0, then wait)."""
    world = make_world(sizes=(2, 2, 6), dry_run=True)
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and group.reasons == ["waiting_for_min_size:2"]
    assert group.actions == [
        "would save sizes: min 2, desired 2, max 6",
        "would set min 0: min 0, desired 2, max 6",
    ]
    assert world.aws.update_calls == []


def test_a_failed_restore_call_is_reported_and_the_deadline_still_applies() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.run(MONDAY_MORNING)  # the restore starts
    world.aws.groups["gpu-a10g"].desired = 0
    world.aws.groups["gpu-a10g"].min = 0
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.remove_node(name)
    world.aws.groups["gpu-a10g"].instances.clear()

    def refuse(*_args: object) -> bool:
        from rightsizer.domain.errors import TransientError

        raise TransientError("ResourceInUseException: update in progress")

    world.aws.update_sizes = refuse  # type: ignore[method-assign,assignment]
    report = run_offhours(world.deps, MONDAY_MORNING + timedelta(minutes=31))
    group = report.group("gpu-a10g")
    assert group.outcome == "restoring" and group.restore_overdue and report.failed
    assert group.error is not None and "ResourceInUseException" in group.error
    steps = [(e.step, e.result) for e in world.state.entries() if e.kind == "scale_node_group"]
    assert steps[-1] == ("restore", "failed")  # the call and the overdue restore, one entry per cycle step
