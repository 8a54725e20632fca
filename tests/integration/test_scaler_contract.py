"""Contract suite of the ``NodeScaler`` port (Auto Scaling): one set of tests, run on the fake and on the
real adapter.

``params=["fake", "real"]``: ``fake`` is :class:`FakeNodeScaler`; ``real`` is :class:`AutoScalingGroups`
against the session's moto server. Whatever the fake answers, the adapter answers: the drain and off-hours
unit tests can trust the fake. Case: BUG-23 (exactly that instance, desired − 1 once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.aws_errors import ActionRefusedError
from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.domain.model import GroupSizes
from rightsizer.ports import NodeScaler, ScalingGroup
from rightsizer.testing.fakes import FakeNodeScaler
from rightsizer.testing.moto_eks import BuiltCluster, record_calls

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.moto_fixtures"]


# -------------------------------------------------------------------------------------- NodeScaler


@dataclass
class ScalerWorld:
    scaler: NodeScaler
    asg_name: str
    instance_ids: tuple[str, str, str]  # BUG-23: a, b, c
    other_asg: str
    other_instance: str
    set_min_size: Callable[[int], None]
    terminate_calls: Callable[[], int]


@pytest.fixture(params=["fake", "real"])
def scaler_world(request: pytest.FixtureRequest) -> ScalerWorld:
    if request.param == "fake":
        fake = FakeNodeScaler()
        ids = ("i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c")
        name = "eks-gpu-a10g-00000000-0000-0000-0000-000000000000"
        fake.add_group(name, min_size=1, desired=3, max_size=6, instance_ids=ids)
        fake.add_group(
            "eks-gpu-l4-0000", min_size=0, desired=1, max_size=2, instance_ids=["i-0000000000000000d"]
        )
        return ScalerWorld(
            fake,
            name,
            ids,
            "eks-gpu-l4-0000",
            "i-0000000000000000d",
            lambda n: fake.set_sizes(name, min_size=n),
            lambda: len(fake.terminated),
        )
    clients: AwsClients = request.getfixturevalue("aws_clients")
    cluster: BuiltCluster = request.getfixturevalue("gpu_cluster")
    a10g, l4 = cluster.nodegroups["gpu-a10g"], cluster.nodegroups["gpu-l4"]
    a, b, c = a10g.instance_ids
    calls = record_calls(clients.autoscaling)

    def set_min(n: int) -> None:
        clients.autoscaling.update_auto_scaling_group(AutoScalingGroupName=a10g.asg_name, MinSize=n)

    return ScalerWorld(
        AutoScalingGroups(clients.autoscaling),
        a10g.asg_name,
        (a, b, c),
        l4.asg_name,
        l4.instance_ids[0],
        set_min,
        lambda: calls.count("TerminateInstanceInAutoScalingGroup"),
    )


def test_find_group(scaler_world: ScalerWorld) -> None:
    w = scaler_world
    assert w.scaler.find_group(w.instance_ids[1]) == w.asg_name
    assert w.scaler.find_group(w.other_instance) == w.other_asg
    assert w.scaler.find_group("i-0123456789abcdef0") is None  # standalone or unknown


def _sizes_and_in_service(group: ScalingGroup) -> tuple[GroupSizes, frozenset[str]]:
    return group.sizes, group.in_service


def test_group_sizes_are_min_desired_max_and_the_in_service_ids(scaler_world: ScalerWorld) -> None:
    w = scaler_world
    described = w.scaler.describe_group(w.asg_name)
    assert _sizes_and_in_service(described) == (GroupSizes(1, 3, 6), frozenset(w.instance_ids))
    assert described.members == frozenset(w.instance_ids)
    with pytest.raises(StalePlan):
        w.scaler.describe_group("no-such-group")


def test_terminate_removes_exactly_that_instance_and_decrements_desired_once(
    scaler_world: ScalerWorld,
) -> None:
    # GIVEN BUG-23: a, b, c in service, min 1, desired 3; b was drained
    w = scaler_world
    a, b, c = w.instance_ids

    # WHEN b is removed, and the step is replayed
    first = w.scaler.terminate(w.asg_name, b)
    replay = w.scaler.terminate(w.asg_name, b)

    # THEN only b left, desired went 3 -> 2 once, and the replay made no call
    assert (first.desired_before, first.desired_after, first.already_done) == (3, 2, False)
    assert (replay.desired_before, replay.desired_after, replay.already_done) == (2, 2, True)
    assert _sizes_and_in_service(w.scaler.describe_group(w.asg_name)) == (
        GroupSizes(1, 2, 6),
        frozenset({a, c}),
    )
    assert w.terminate_calls() == 1


def test_terminate_is_refused_at_min_size(scaler_world: ScalerWorld) -> None:
    w = scaler_world
    w.set_min_size(3)

    with pytest.raises(ActionRefusedError) as refused:
        w.scaler.terminate(w.asg_name, w.instance_ids[0])

    assert refused.value.reasons == ("node_group_at_min_size",)
    assert isinstance(refused.value, PermanentError)
    assert _sizes_and_in_service(w.scaler.describe_group(w.asg_name)) == (
        GroupSizes(3, 3, 6),
        frozenset(w.instance_ids),
    )
    assert w.terminate_calls() == 0


def test_terminate_of_an_instance_in_another_group_is_stale(scaler_world: ScalerWorld) -> None:
    w = scaler_world
    with pytest.raises(StalePlan):
        w.scaler.terminate(w.asg_name, w.other_instance)
    assert w.terminate_calls() == 0
    assert w.scaler.describe_group(w.other_asg).in_service == frozenset({w.other_instance})


def test_fake_scaler_lifecycle_states_and_injected_failures() -> None:
    fake = FakeNodeScaler()
    fake.add_group("g", min_size=0, desired=2, max_size=2, instance_ids=["i-1", "i-2"])
    fake.set_state("i-1", "Pending")
    with pytest.raises(TransientError):
        fake.terminate("g", "i-1")
    fake.set_state("i-2", "Standby")
    with pytest.raises(StalePlan):
        fake.terminate("g", "i-2")
    assert _sizes_and_in_service(fake.describe_group("g")) == (GroupSizes(0, 2, 2), frozenset())
    assert fake.describe_group("g").members == frozenset({"i-1", "i-2"})
    fake.fail_next("describe_group", TransientError("Throttling"))
    with pytest.raises(TransientError):
        fake.describe_group("g")
    assert fake.describe_group("g").sizes.desired == 2
    assert fake.calls[0] == ("terminate", "g", "i-1")


def test_a_group_without_failed_launches_reports_no_failed_activities(scaler_world: ScalerWorld) -> None:
    w = scaler_world
    since = datetime.now(UTC) - timedelta(hours=1)
    assert w.scaler.failed_activities(w.asg_name, since) == []
