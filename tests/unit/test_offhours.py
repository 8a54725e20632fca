"""Off-hours on fakes (docs/architecture.md §4 "Off-hours", "Periods"; BUG-27, BUG-28, BUG-29).

The drain is the real :class:`~rightsizer.services.drain.DrainWorkflow` run by the in-process runner; the
cluster, the node groups and the assessor are the in-memory fakes of ``tests.support.offhours_world``, so
a whole night — down, down again, up — runs without sockets. The decision alone is tested in
``test_offhours_decision.py``, the executor around it in ``test_offhours_executor.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from rightsizer import cli
from rightsizer.adapters.autoscaling import error_code_of
from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.policy import Policy
from rightsizer.ports import (
    NodeGroupUpdate,
    ScalingFailure,
)
from rightsizer.services.offhours import (
    METRIC_RESTORE_OVERDUE,
    TAG_OFFHOURS,
    ForcedAssessor,
    OffhoursDeps,
    force_report,
    offhours_status,
    ready_gpu_nodes,
    run_offhours,
)
from tests.builders import pod
from tests.support.offhours_world import (
    CLUSTER,
    MONDAY_MORNING,
    SATURDAY_NOON,
    FakeNodeGroups,
    berlin,
    make_world,
    scale_node_group_entries,
    utc,
)

# ------------------------------------------------------------------------------ down, down, up


def test_down_then_down_again_then_up_restores_the_exact_sizes() -> None:
    world = make_world()
    first = world.run(SATURDAY_NOON)
    group = first.group("gpu-a10g")
    assert group.state == "down" and group.outcome == "scaling_down", group
    assert not first.failed and not first.dry_run
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)
    # min 0 first (desired and max unchanged), then one drain per node; the drains' targeted scale-in
    # already took desired to 0, so no second UpdateNodegroupConfig (it would decrement twice).
    assert world.aws.update_calls == [("gpu-a10g", 0, 3, 6)]
    assert [d["status"] for d in group.drains] == ["succeeded"] * 3
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    assert world.nodes_of("gpu-a10g") == []
    assert scale_node_group_entries(world.state) == [("min_zero", "applied", "gpu-a10g")]
    scale_ins = [e for e in world.state.entries() if e.kind == "scale_in" and e.result == "applied"]
    assert len(scale_ins) == 3 and all(e.hourly_savings_usd == 5.672 for e in scale_ins)

    # A second run in the same off period: nothing to do, and the saved sizes are NOT replaced by 0/0/6.
    again = world.run(SATURDAY_NOON + timedelta(minutes=5))
    assert again.group("gpu-a10g").outcome == "down"
    assert world.state.get_sizes("gpu-a10g") == saved
    assert world.aws.update_calls == [("gpu-a10g", 0, 3, 6)]

    # Monday morning: the saved sizes come back, all three together.
    up = world.run(MONDAY_MORNING)
    restoring = up.group("gpu-a10g")
    assert restoring.state == "up" and restoring.outcome == "restoring"
    assert world.aws.update_calls[-1] == ("gpu-a10g", 1, 3, 6)
    assert world.state.get_sizes("gpu-a10g") is not None  # kept until the nodes are Ready

    done = world.run(MONDAY_MORNING + timedelta(minutes=5))
    assert done.group("gpu-a10g").outcome == "restored"
    assert world.aws.sizes("gpu-a10g") == (1, 3, 6)
    assert len(ready_gpu_nodes(world.cluster.list_nodes(), "gpu-a10g")) == 3
    assert world.state.get_sizes("gpu-a10g") is None
    assert scale_node_group_entries(world.state)[-2:] == [
        ("restore", "applied", "gpu-a10g"),
        ("restored", "applied", "gpu-a10g"),
    ]
    # Up and nothing saved: converged, no call.
    calls = len(world.aws.update_calls)
    assert world.run(MONDAY_MORNING + timedelta(minutes=10)).group("gpu-a10g").outcome == "up"
    assert len(world.aws.update_calls) == calls


def test_saved_sizes_come_from_the_asg_once_even_when_a_tick_is_interrupted() -> None:
    world = make_world()
    # The first node's drain is refused by the workflow (a bare pod the assessor did not see).
    first_node = world.nodes_of("gpu-a10g")[0]
    world.cluster.add_node(world.cluster.nodes[first_node], [pod("bare", first_node, owner=None)])
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert group.outcome == "failed" and report.failed
    assert group.reasons[-1] == f"drain_abandoned:{first_node}"
    assert world.aws.sizes("gpu-a10g") == (0, 3, 6)  # min already lowered
    # Next tick reads min 0 from the ASG, but the saved sizes keep the original minimum.
    world.run(SATURDAY_NOON + timedelta(minutes=5))
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)


# ------------------------------------------------------------------------------ skip and force


def busy(node: str) -> list[str]:
    return [f"activity_above_threshold:{node}:GPU-0:87.0"]


def test_a_group_with_busy_or_unknown_nodes_is_skipped_with_reasons_per_node() -> None:
    world = make_world()
    a, b, _c = world.nodes_of("gpu-a10g")
    world.assessor.reasons[a] = busy(a)
    world.assessor.reasons[b] = ["coverage_below_min:0.42"]
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert group.outcome == "skipped"
    assert group.node_reasons == {
        a: ["verdict:busy", f"activity_above_threshold:{a}:GPU-0:87.0"],
        b: ["verdict:unknown", "coverage_below_min:0.42"],
    }
    assert group.reasons == [f"nodes_not_drainable:{a},{b}"]
    # Skipped means untouched: nothing saved, no sizing call, every node still there.
    assert world.state.get_sizes("gpu-a10g") is None
    assert world.aws.update_calls == []
    assert len(world.nodes_of("gpu-a10g")) == 3
    assert not report.failed


def test_force_drains_a_busy_group() -> None:
    world = make_world()
    for node in world.nodes_of("gpu-a10g"):
        world.assessor.reasons[node] = busy(node)
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "skipped"
    report = world.run(SATURDAY_NOON + timedelta(minutes=1), force=True)
    group = report.group("gpu-a10g")
    assert report.force and group.outcome == "scaling_down", group
    # The drain workflow itself re-assessed each node through the forcing assessor and still succeeded.
    assert [d["status"] for d in group.drains] == ["succeeded"] * 3
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)


@pytest.mark.parametrize(
    ("reasons", "verdict"),
    [
        (["no_series:GPU-0"], "unknown"),
        (["node_too_young"], "unknown"),
        (["do_not_disrupt:node"], "protected"),
        (["activity_above_threshold:x:GPU-0:90.0", "pending_gpu_pods:1"], "busy"),
    ],
)
def test_force_never_overrides_unknown_or_protected(reasons: list[str], verdict: str) -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    world.assessor.reasons[node] = reasons
    group = world.run(SATURDAY_NOON, force=True).group("gpu-a10g")
    assert group.outcome == "skipped"
    assert group.node_reasons[node][0] == f"verdict:{verdict}"
    assert world.aws.update_calls == [] and len(world.nodes_of("gpu-a10g")) == 3


def test_force_report_lifts_only_busy_codes() -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    world.assessor.reasons[node] = ["fb_above_threshold:x", "power_above_idle:x", "do_not_disrupt:node"]
    forced = ForcedAssessor(world.assessor).assess_node(node, SATURDAY_NOON)
    assert forced is not None and forced.verdict == "protected" and forced.reasons == ["do_not_disrupt:node"]
    assert force_report(None) is None


def test_exempt_protections_do_not_skip_an_offhours_group() -> None:
    """cooldown, disruption windows, MinSize and our budget do not apply to off-hours (docs/architecture.md §4)."""
    world = make_world()
    for node in world.nodes_of("gpu-a10g"):
        world.assessor.reasons[node] = [
            "node_group_at_min_size:1",
            "cooldown:3m",
            "outside_disruption_window",
        ]
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "scaling_down"
    assert world.nodes_of("gpu-a10g") == []


# ------------------------------------------------------------------------------ one at a time


def test_a_group_with_a_drain_in_flight_waits_for_the_next_tick() -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    lease = world.state.acquire(node, "other-exec", SATURDAY_NOON, 900)
    assert lease is not None
    world.state.take_slot(
        "eks-gpu-a10g-asg", node, "other-exec", SATURDAY_NOON,
        max_per_run=1, max_per_group=1, desired=3, min_size=0,
    )  # fmt: skip
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and group.in_flight == [node]
    assert world.aws.update_calls == [] and len(world.nodes_of("gpu-a10g")) == 3


def test_an_asynchronous_starter_drains_one_node_per_tick() -> None:
    world = make_world()
    started: list[str] = []

    class Recorder:
        def start(self, request: Any) -> str:
            started.append(request.node)
            assert request.offhours and request.trigger == "offhours:gpu-a10g"
            return str(request.execution_id)

    world.deps.starter = Recorder()
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and started == [world.nodes_of("gpu-a10g")[0]]
    assert group.drains[0]["status"] == "started"


class LaggingNodeGroups(FakeNodeGroups):
    """EKS accepted the new sizes; the Auto Scaling group has not been updated yet."""

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        self.update_calls.append((nodegroup, sizes.min, sizes.desired, sizes.max))
        return NodeGroupUpdate(cluster, nodegroup, sizes, sizes, "update-1", False, 1)


def test_min_size_not_yet_on_the_asg_waits_instead_of_draining() -> None:
    world = make_world(sizes=(1, 1, 6), aws_class=LaggingNodeGroups)
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and "waiting_for_min_size:1" in group.reasons
    assert group.drains == [] and world.aws.update_calls == [("gpu-a10g", 0, 1, 6)]
    assert len(world.nodes_of("gpu-a10g")) == 1


# ------------------------------------------------------------------------------ restore (BUG-27)


def ice(asg: str, at: datetime) -> ScalingFailure:
    return ScalingFailure(
        activity_id="a-1",
        started_at=at,
        status="Failed",
        code="InsufficientInstanceCapacity",
        message="Could not launch On-Demand Instances. InsufficientInstanceCapacity - capacity not "
        "available for g5.12xlarge in us-east-1a. Launching EC2 instance failed.",
    )


def test_a_failed_restore_is_retried_every_tick_and_alarms_after_the_deadline() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    world.aws.capacity["gpu-a10g"] = 1  # AWS has one g5.12xlarge left
    world.aws.launch_ready = False  # and its node is not Ready yet
    world.aws.failures["eks-gpu-a10g-asg"] = [ice("eks-gpu-a10g-asg", MONDAY_MORNING + timedelta(seconds=7))]

    first = world.run(MONDAY_MORNING)
    group = first.group("gpu-a10g")
    assert group.outcome == "restoring" and not group.restore_overdue
    assert group.failed_activities[0]["code"] == "InsufficientInstanceCapacity"
    assert "scaling_failed:InsufficientInstanceCapacity" in group.reasons
    assert world.aws.sizes("gpu-a10g") == (1, 3, 6)  # desired 3 even though one instance launched
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.restore_started_at == MONDAY_MORNING
    assert first.metrics == [] and not first.failed

    asks = world.aws.update_asks
    later = world.run(MONDAY_MORNING + timedelta(minutes=10)).group("gpu-a10g")
    assert later.outcome == "restoring" and "ready:0/3" in later.reasons
    assert world.aws.update_asks == asks + 1  # re-applied (a no-op while the sizes still match)

    overdue = world.run(MONDAY_MORNING + timedelta(minutes=30))
    group = overdue.group("gpu-a10g")
    assert group.restore_overdue and overdue.failed and overdue.alarms == ["gpu-a10g"]
    assert overdue.metrics == [
        {
            "name": METRIC_RESTORE_OVERDUE,
            "value": 1,
            "unit": "Count",
            "dimensions": {"cluster": CLUSTER, "node_group": "gpu-a10g"},
        }
    ]
    assert ("restore", "failed", "gpu-a10g") in scale_node_group_entries(world.state)
    assert world.state.get_sizes("gpu-a10g") is not None  # the restore stays resumable

    # Capacity comes back: the group launches the rest, the nodes turn Ready, the restore completes.
    world.aws.capacity.clear()
    world.aws.launch_ready = True
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.set_ready(name, True)
    group_obj = world.aws.groups["gpu-a10g"]
    while len(group_obj.instances) < group_obj.desired:
        world.aws._launch(group_obj, ready=True)
    done = world.run(MONDAY_MORNING + timedelta(minutes=35))
    assert done.group("gpu-a10g").outcome == "restored" and not done.failed
    assert world.state.get_sizes("gpu-a10g") is None


def test_nodes_ready_without_allocatable_gpus_do_not_count() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.run(MONDAY_MORNING)
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.nodes[name]["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # BUG-20
    group = world.run(MONDAY_MORNING + timedelta(minutes=5)).group("gpu-a10g")
    assert group.outcome == "restoring" and group.ready_nodes == 0


def test_restore_never_lowers_a_desired_size_an_autoscaler_raised() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.run(MONDAY_MORNING)
    group = world.aws.groups["gpu-a10g"]
    group.desired = 5
    while len(group.instances) < 5:
        world.aws._launch(group, ready=False)
    before = len(world.aws.update_calls)
    report = world.run(MONDAY_MORNING + timedelta(minutes=5)).group("gpu-a10g")
    assert report.outcome == "restored"  # 3 Ready with GPUs are enough
    assert world.aws.sizes("gpu-a10g") == (1, 5, 6)
    assert len(world.aws.update_calls) == before


def test_a_new_off_period_during_an_unfinished_restore_keeps_the_original_sizes() -> None:
    world = make_world(groups=[("gpu-a10g", "nightly")])
    night = berlin("2024-05-14T23:00:00+02:00")
    world.run(night)
    world.aws.launch_ready = False
    world.run(berlin("2024-05-15T07:00:00+02:00"))  # restore starts, nodes never get Ready
    world.assessor.reasons.clear()
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.set_ready(name, True)
    next_night = berlin("2024-05-15T23:00:00+02:00")
    report = world.run(next_night).group("gpu-a10g")
    assert "restore_interrupted" in report.reasons
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)
    assert saved.restore_started_at is None and saved.saved_at == next_night


# ------------------------------------------------------------------------------ dry run


@pytest.mark.parametrize("switch", ["deps", "policy"])
def test_dry_run_reports_and_changes_nothing(switch: str) -> None:
    world = (
        make_world(dry_run=True)
        if switch == "deps"
        else make_world(policy=Policy(dry_run=True), dry_run=False)
    )
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert report.dry_run and group.outcome == "scaling_down"
    nodes = world.nodes_of("gpu-a10g")
    assert group.actions == [
        "would save sizes: min 1, desired 3, max 6",
        "would set min 0: min 0, desired 3, max 6",
        f"would drain and remove, one at a time: {', '.join(nodes)}",
        "would set desired 0: min 0, desired 0, max 6",
    ]
    assert world.state.get_sizes("gpu-a10g") is None
    assert world.state.entries() == [] and world.aws.update_calls == []
    assert len(nodes) == 3 and world.state.slots() == []


def test_dry_run_up_with_saved_sizes_only_says_so() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.deps.dry_run = True
    group = world.run(MONDAY_MORNING).group("gpu-a10g")
    assert group.outcome == "restoring"
    assert group.actions == ["would restore saved sizes: min 1, desired 3, max 6"]
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.restore_started_at is None
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)


# ------------------------------------------------------------------------------ selection


def test_unknown_schedule_is_reported_and_the_group_skipped() -> None:
    world = make_world(groups=[("gpu-a10g", "weekend"), ("gpu-l4", "weekned")])
    report = world.run(SATURDAY_NOON)
    typo = report.group("gpu-l4")
    assert typo.outcome == "skipped" and typo.reasons == ["unknown_schedule:weekned"]
    assert typo.error is not None and "weekned" in typo.error
    assert report.group("gpu-a10g").outcome == "scaling_down"
    assert len(world.nodes_of("gpu-l4")) == 3
    assert report.failed  # a person has to fix the config


def test_tag_selected_group_follows_its_schedule_and_config_wins_over_a_tag() -> None:
    world = make_world(
        groups=[("gpu-a10g", "weekend")],
        tagged={"gpu-l4": ("nightly", (0, 1, 2)), "gpu-h100": ("weekend", (0, 1, 1))},
    )
    world.aws.groups["gpu-a10g"].tags[TAG_OFFHOURS] = "nightly"  # the config says weekend
    report = world.run(SATURDAY_NOON)
    assert [(g.node_group, g.source, g.schedule) for g in report.groups] == [
        ("gpu-a10g", "config", "weekend"),
        ("gpu-h100", "tag", "weekend"),
        ("gpu-l4", "tag", "nightly"),
    ]
    assert report.group("gpu-a10g").reasons[0] == "config_overrides_tag:nightly"
    assert report.group("gpu-h100").outcome == "scaling_down"
    assert world.nodes_of("gpu-h100") == []
    assert report.group("gpu-l4").state == "up" and report.group("gpu-l4").outcome == "up"


def test_a_configured_group_that_does_not_exist_fails_alone() -> None:
    world = make_world(groups=[("gpu-a10g", "weekend"), ("gpu-gone", "weekend")], untracked=["gpu-gone"])
    report = world.run(SATURDAY_NOON)
    assert report.group("gpu-gone").outcome == "failed"
    assert report.group("gpu-gone").error == "node_group_not_found"
    assert report.group("gpu-a10g").outcome == "scaling_down"


def test_only_acts_in_the_requested_direction() -> None:
    world = make_world()
    group = world.run(SATURDAY_NOON, only="up").group("gpu-a10g")
    assert group.outcome == "skipped" and group.reasons == ["schedule_says_down"]
    assert world.aws.update_calls == []


def test_status_shows_state_transition_sizes_and_in_flight_and_changes_nothing() -> None:
    world = make_world(groups=[("gpu-a10g", "nightly")])
    noon = berlin("2024-05-14T12:00:00+02:00")
    report = offhours_status(world.deps, noon)
    group = report.group("gpu-a10g")
    assert group.outcome == "status" and group.state == "up"
    assert group.next_transition == berlin("2024-05-14T22:30:00+02:00")
    assert group.current == GroupSizes(1, 3, 6) and group.saved is None and group.in_flight == []
    assert group.ready_nodes == 3
    assert world.assessor.calls == 0 and world.aws.update_asks == 0
    doc = report.to_json_dict()
    assert doc["groups"][0]["next_transition"] == "2024-05-14T20:30:00Z"
    assert doc["groups"][0]["current"] == {"min": 1, "desired": 3, "max": 6}
    json.dumps(doc)


def test_naive_now_is_refused() -> None:
    world = make_world()
    with pytest.raises(ValueError, match="timezone-aware"):
        run_offhours(world.deps, datetime(2024, 5, 18, 13, 0))  # noqa: DTZ001


# ------------------------------------------------------------------------------ schedules at instants


@pytest.mark.parametrize(
    ("schedule", "instant", "expected"),
    [
        # BUG-28: weekday and time both from the Auckland local time.
        ("auckland", utc("2024-03-03T19:30:00Z"), "up"),  # Monday 08:30 NZDT (Sunday in UTC)
        ("auckland", utc("2024-03-08T06:30:00Z"), "down"),  # Friday 19:30 NZDT
        ("auckland", utc("2024-03-08T19:30:00Z"), "down"),  # Saturday 08:30 NZDT (Friday in UTC)
        # BUG-29: across midnight and the weekend.
        ("nightly", berlin("2024-05-14T23:15:00+02:00"), "down"),
        ("nightly", berlin("2024-05-14T02:00:00+02:00"), "down"),
        ("nightly", berlin("2024-05-14T06:00:00+02:00"), "up"),
        ("nightly", berlin("2024-05-14T12:00:00+02:00"), "up"),
        ("weekend", berlin("2024-05-18T13:00:00+02:00"), "down"),
        ("weekend", berlin("2024-05-20T06:59:00+02:00"), "down"),
        ("weekend", berlin("2024-05-17T19:59:00+02:00"), "up"),
        ("evening", berlin("2024-05-17T23:59:30+02:00"), "down"),
        ("evening", berlin("2024-05-18T00:00:30+02:00"), "up"),
        # The week boundary itself: Sunday 23:59:59 and Monday 00:00 are in, Monday 07:00 is out.
        ("weekend", berlin("2024-05-19T23:59:59+02:00"), "down"),
        ("weekend", berlin("2024-05-20T00:00:00+02:00"), "down"),
        ("weekend", berlin("2024-05-20T07:00:00+02:00"), "up"),
        # DST, Europe/Berlin: 06:00 local is 04:00 UTC after spring-forward, 05:00 UTC after fall-back.
        ("nightly", utc("2024-03-31T03:59:59Z"), "down"),
        ("nightly", utc("2024-03-31T04:00:00Z"), "up"),
        ("nightly", utc("2024-10-27T04:59:59Z"), "down"),
        ("nightly", utc("2024-10-27T05:00:00Z"), "up"),
        # A start inside the spring-forward gap (02:30) takes effect when the clock jumps to 03:00.
        ("gap", utc("2024-03-31T00:59:59Z"), "up"),
        ("gap", utc("2024-03-31T01:00:00Z"), "down"),
        # The repeated fall-back hour 02:00-03:00 is wholly in: both occurrences.
        ("fallback", utc("2024-10-26T23:59:59Z"), "up"),
        ("fallback", utc("2024-10-27T00:00:00Z"), "down"),
        ("fallback", utc("2024-10-27T01:30:00Z"), "down"),
        ("fallback", utc("2024-10-27T02:00:00Z"), "up"),
    ],
)
def test_the_schedule_drives_the_direction_at_exact_instants(
    schedule: str, instant: datetime, expected: str
) -> None:
    world = make_world(groups=[("gpu-a10g", schedule)])
    report = world.run(instant)
    group = report.group("gpu-a10g")
    assert group.state == expected
    if expected == "down":
        assert group.outcome == "scaling_down" and world.nodes_of("gpu-a10g") == []
        assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    else:
        assert group.outcome == "up" and world.aws.update_calls == []
        assert len(world.nodes_of("gpu-a10g")) == 3


@pytest.mark.parametrize("schedule", ["late_end", "late_start"])
def test_a_boundary_in_the_repeated_hour_scales_down_once_and_restores_once(schedule: str) -> None:
    """Issue 12: a tick every 5 minutes through the fall-back night; the wall clock passes 02:30 twice,
    the schedule acts once: one scale-down, one restore, never a restore undone and redone."""
    world = make_world(groups=[("gpu-a10g", schedule)])
    tick = utc("2024-10-26T19:00:00Z")  # Saturday 21:00 CEST
    outcomes = []
    while tick <= utc("2024-10-27T06:00:00Z"):  # Sunday 07:00 CET
        outcomes.append(world.run(tick).group("gpu-a10g").state)
        tick += timedelta(minutes=5)
    flips = [(a, b) for a, b in itertools.pairwise(outcomes) if a != b]
    assert flips == [("up", "down"), ("down", "up")]
    downs = [c for c in world.aws.update_calls if c[1] == 0]
    restores = [c for c in world.aws.update_calls if c[1] != 0]
    assert len(downs) == 1 and len(restores) == 1, world.aws.update_calls


def test_bug28_auckland_evaluations_give_up_down_down() -> None:
    world = make_world(groups=[("gpu-a10g", "auckland")])
    instants = [utc("2024-03-03T19:30:00Z"), utc("2024-03-08T06:30:00Z"), utc("2024-03-08T19:30:00Z")]
    states = [offhours_status(world.deps, at).group("gpu-a10g").state for at in instants]
    assert [s.upper() if s else s for s in states] == ["UP", "DOWN", "DOWN"]


def test_a_missed_tick_still_converges() -> None:
    """Level-triggered: no tick at 20:00 Friday; the next one, Saturday noon, still brings the group down."""
    world = make_world()
    assert world.run(berlin("2024-05-17T19:55:00+02:00")).group("gpu-a10g").outcome == "up"
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "scaling_down"


# ------------------------------------------------------------------------------ CLI


def write_config(tmp_path: Any) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(
        "cluster: {name: prod-eks}\n"
        "aws: {table: rightsizer}\n"
        "policy: {dry_run: false}\n"
        "offhours:\n"
        "  schedules:\n"
        "    weekend:\n"
        "      - {days: [Sat, Sun], start: '00:00', end: '00:00', timezone: Europe/Berlin}\n"
        "  node_groups: [{name: gpu-a10g, schedule: weekend}]\n",
        encoding="utf-8",
    )
    return str(path)


def cli_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["offhours", *argv])


def test_cli_offhours_dry_run_by_default_and_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    world = make_world()
    seen: list[bool] = []

    def build(config: Config, *, dry_run: bool) -> OffhoursDeps:
        seen.append(dry_run)
        assert config.offhours.node_groups[0].name == "gpu-a10g"
        world.deps.dry_run = dry_run
        return world.deps

    path = write_config(tmp_path)
    args = cli_args("down", "--config", path, "--json", "--at", "2024-05-18T13:00:00+02:00")
    assert cli.cmd_offhours(args, build=build) == cli.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert seen == [True] and doc["dry_run"] is True
    assert doc["groups"][0]["outcome"] == "scaling_down" and doc["groups"][0]["state"] == "down"
    assert world.state.get_sizes("gpu-a10g") is None

    assert cli.cmd_offhours(cli_args("status", "--config", path), build=build) == cli.EXIT_OK
    assert "gpu-a10g [config: weekend]" in capsys.readouterr().out


def test_cli_offhours_exit_codes(tmp_path: Any) -> None:
    world = make_world(groups=[("gpu-a10g", "nope")])
    path = write_config(tmp_path)

    def build(config: Config, *, dry_run: bool) -> OffhoursDeps:
        return world.deps

    assert cli.cmd_offhours(cli_args("status", "--config", path), build=build) == cli.EXIT_FAILED
    with pytest.raises(ConfigError, match="--at"):
        cli.cmd_offhours(cli_args("down", "--config", path, "--execute", "--at", "2024-05-18T13:00:00Z"))


# ------------------------------------------------------------------------------ adapter helper


@pytest.mark.parametrize(
    ("texts", "code"),
    [
        (
            (
                "Could not launch On-Demand Instances. InsufficientInstanceCapacity - capacity not "
                "available for g5.12xlarge in us-east-1a. Launching EC2 instance failed.",
            ),
            "InsufficientInstanceCapacity",
        ),
        (
            (
                "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you "
                "requested (us-east-1c).",
            ),
            "InsufficientInstanceCapacity",
        ),
        (
            (
                "You have requested more vCPU capacity than your current vCPU limit allows.",
                "VcpuLimitExceeded - x",
            ),
            "VcpuLimitExceeded",
        ),
        (
            ("Launching a new EC2 instance: i-0abc. Status Reason: SomethingNewHappened - details",),
            "SomethingNewHappened",
        ),
        (("Launching a new EC2 instance failed.", ""), None),
    ],
)
def test_error_code_of_scaling_activity_messages(texts: tuple[str, ...], code: str | None) -> None:
    assert error_code_of(*texts) == code
