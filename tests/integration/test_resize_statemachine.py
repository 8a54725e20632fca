"""The standalone-instance resize (issue 17) through the drain state machine's ASL and in-process.

GIVEN a busy standalone g5.4xlarge node opted in (tag ``rightsizer.io/resize=allowed``, ``allow_resize``)
whose plan says ``resize_instance`` → g5.xlarge, with two replicated pods, WHEN the resize runs — state by
state through ``infra/statemachine/drain.asl.json`` against ``functions/drain/app.handler`` on a fake clock,
and through the in-process runner — THEN it validates, cordons, drains, stops, changes only the type,
starts, waits for the Node to re-register Ready with the new type's GPU allocatable, uncordons and books
the saving; an insufficient-capacity answer on start and a Node that never gets its GPUs both restore
the original type, running and uncordoned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps
from rightsizer.services.resize import ResizeRequest, ResizeWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from tests.builders import AT, gpu_node, pod
from tests.support.asl import AslInterpreter, drain_machine, serving
from tests.support.resize_world import FakeInstances, Kubelet

pytestmark = pytest.mark.integration

NODE = "ip-10-0-7-9.ec2.internal"
INSTANCE = "i-0aa1bb2cc3dd4ee5f"
EXECUTION = "ip-10-0-7-9.ec2.internal-00112233aabbccdd"


class UnderutilizedAssessor:
    """The fresh decision: busy, and a cheaper shape fits (planning is tested in tests/unit)."""

    def assess_node(self, node: str, now: Any) -> NodeReport | None:
        return NodeReport(
            node=node, verdict="underutilized", reasons=["activity_above_threshold:30%"], node_group=None,
            instance_id=INSTANCE, instance_type="g5.4xlarge", gpus=1, gpu_activity_max_pct=30.0,
            fb_used_max_mib=4096.0, coverage=1.0, hourly_usd=1.624,
        )  # fmt: skip


@dataclass
class World:
    clock: FakeClock
    cluster: FakeClusterWriter
    ec2: FakeInstances
    kubelet: Kubelet
    state: MemoryState
    workflow: ResizeWorkflow


def make_world(*, broken: frozenset[str] = frozenset(), policy: dict[str, Any] | None = None) -> World:
    clock = FakeClock(AT)
    cluster = FakeClusterWriter(clock=clock)
    cluster.add_node(gpu_node(NODE, instance_type="g5.4xlarge", gpus=1, instance_id=INSTANCE, nodegroup=None))
    for i in range(2):
        cluster.add_pod(pod(f"api-{i}", NODE, namespace="ml", grace=30, labels={"app": "api"}))
    ec2 = FakeInstances(INSTANCE, "g5.4xlarge", {"rightsizer.io/resize": "allowed"})
    kubelet = Kubelet(cluster, NODE, lambda: (ec2.state, ec2.instance_type), broken_types=broken)
    ec2.on_change = kubelet.sync
    state = MemoryState("prod-eks")
    settings = {"dry_run": False, "allow_resize": True, "resize_allow_instance_store_loss": True,
                "resize_timeout": 600, **(policy or {})}  # fmt: skip
    workflow = ResizeWorkflow(
        DrainDeps(
            cluster,
            FakeNodeScaler(),
            UnderutilizedAssessor(),
            state,
            Policy.model_validate(settings),
            dry_run=False,
            clock=clock.now,
        ),
        ec2,
    )
    return World(clock, cluster, ec2, kubelet, state, workflow)


@pytest.fixture
def world() -> Iterator[World]:
    w = make_world()
    with serving(w.workflow):
        yield w


def asl(w: World) -> AslInterpreter:
    return drain_machine(w.clock)


def request(target: str = "g5.xlarge") -> dict[str, Any]:
    # What the Step Functions starter sends: the ResizeRequest as JSON.
    return asdict(ResizeRequest(NODE, EXECUTION, "schedule", 1.624 - 1.006, target_type=target))


def node(w: World) -> dict[str, Any]:
    found = w.cluster.get_node(NODE)
    assert found is not None
    return found


def assert_serving_as(w: World, instance_type: str) -> None:
    n = node(w)
    assert (w.ec2.state, w.ec2.instance_type) == ("running", instance_type)
    assert n["metadata"]["labels"]["node.kubernetes.io/instance-type"] == instance_type
    assert not n["spec"].get("unschedulable") and ANN_CORDONED_BY not in n["metadata"].get("annotations", {})
    assert w.state.get(NODE) is None and w.state.slots() == []


def assert_status(w: World, status: str) -> None:
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == status


def test_resize_through_the_state_machine(world: World) -> None:
    run = asl(world).run(request(), EXECUTION)

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.output["drain"]["status"] == "succeeded"
    assert_serving_as(world, "g5.xlarge")
    # Only the type changed, after the drain, and in order; the kubelet re-registered the new type once.
    assert world.ec2.calls == ["preflight g5.xlarge", "stop", "set_type g5.xlarge", "start g5.xlarge"]
    assert world.kubelet.registrations == ["g5.xlarge"]
    assert [e[0:2] for e in world.cluster.evictions] == [("ml", "api-0"), ("ml", "api-1")]
    assert node(world)["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert "Wait" in run.states  # EC2's transitions were waited for in the state machine, not in Lambda
    [entry] = world.state.entries(EXECUTION)
    assert (entry.kind, entry.step, entry.result) == ("resize_instance", "uncordon", "applied")
    assert entry.hourly_savings_usd == pytest.approx(1.624 - 1.006)
    assert [e["reason"] for e in world.cluster.events] == ["CordonedIdle", "Resizing", "Resized"]


def test_insufficient_capacity_on_start_restores_the_original_type_through_the_state_machine(
    world: World,
) -> None:
    world.ec2.start_errors["g5.xlarge"] = TransientError(
        "InsufficientInstanceCapacity: no g5.xlarge in us-east-1a"
    )

    run = asl(world).run(request(), EXECUTION)

    # A rolled-back execution fails (DrainFailed) so that operators see it; the instance is whole again.
    assert (run.status, run.error) == ("FAILED", "DrainFailed")
    assert_status(world, "rolled_back")
    assert_serving_as(world, "g5.4xlarge")
    assert world.ec2.calls == [
        "preflight g5.xlarge", "stop", "set_type g5.xlarge", "start g5.xlarge", "set_type g5.4xlarge",
        "start g5.4xlarge",
    ]  # fmt: skip
    [entry] = world.state.entries(EXECUTION)
    assert (entry.result, entry.hourly_savings_usd) == ("rolled_back", None)
    assert "InsufficientInstanceCapacity" in entry.reason


def test_a_node_that_never_gets_its_gpus_is_rolled_back_at_the_deadline() -> None:
    # The new type's AMI has no driver for its GPU: the Node comes back Ready with 0 GPUs allocatable.
    w = make_world(broken=frozenset({"g5.xlarge"}), policy={"resize_timeout": 120})
    with serving(w.workflow):
        run = asl(w).run(request(), EXECUTION)

    assert (run.status, run.error) == ("FAILED", "DrainFailed")
    assert_status(w, "rolled_back")
    assert_serving_as(w, "g5.4xlarge")
    assert w.ec2.calls[-3:] == ["stop", "set_type g5.4xlarge", "start g5.4xlarge"]
    assert w.ec2.calls.count("stop") == 2
    [entry] = w.state.entries(EXECUTION)
    assert (
        entry.result == "rolled_back"
        and "deadline" in entry.reason
        and "0/1 GPUs allocatable" in entry.reason
    )


def test_a_refused_preflight_never_cordons_or_stops(world: World) -> None:
    world.ec2.refuse = frozenset({"g5.xlarge"})

    result = InProcessRunner(world.workflow, sleep=world.clock.advance).start(
        ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge")
    )

    record = world.state.load(result)
    assert record is not None and record.status == "abandoned"
    assert world.ec2.calls == ["preflight g5.xlarge"] and world.ec2.state == "running"
    assert not node(world)["spec"].get("unschedulable") and world.cluster.evictions == []
    [entry] = world.state.entries(EXECUTION)
    assert entry.reason.startswith("preflight:") and "refusing g5.xlarge" in entry.reason


def test_resize_in_process_without_opt_in_tag_is_abandoned() -> None:
    w = make_world()
    w.ec2.tags = {}
    runner = InProcessRunner(w.workflow, sleep=w.clock.advance)
    runner.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))
    assert runner.results[EXECUTION].status == "abandoned"
    assert "not_opted_in" in runner.results[EXECUTION].message and w.ec2.calls == []


def test_resize_in_process_succeeds_and_a_second_run_does_nothing() -> None:
    w = make_world()
    runner = InProcessRunner(w.workflow, sleep=w.clock.advance)
    runner.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))
    assert runner.results[EXECUTION].status == "succeeded"
    assert_serving_as(w, "g5.xlarge")
    calls = list(w.ec2.calls)
    runner.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))  # a retried start: same record
    assert w.ec2.calls == calls
