"""The drain workflow on fakes (docs/architecture.md §4): every path ends with the cluster as it was, or the exact
instance removed once (BUG-14, 17, 21, 23, 31, 32)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import AsgInfo, ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.ports import EvictionOutcome, TerminateResult
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.healing import heal_expired_leases
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from tests.builders import AT, gpu_node, merge_metrics, node_devices, pdb, pod, snapshot

ASG = "eks-gpu-a10g-asg"


@dataclass
class World:
    clock: FakeClock
    writer: FakeClusterWriter
    scaler: FakeNodeScaler
    state: MemoryState
    policy: Policy
    metrics: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False

    def observe(self, now: datetime) -> ClusterSnapshot:
        nodes = [self.writer.get_node(n) for n in ("gpu-1", "gpu-2", "gpu-3")]
        pods = [p for n in ("gpu-1", "gpu-2", "gpu-3") for p in self.writer.list_pods_on_node(n)]
        asg = self.scaler.describe_group(ASG)
        sizes = asg.sizes
        group = AsgInfo(
            ASG, sizes.min, sizes.max, sizes.desired, dict.fromkeys(asg.in_service, "InService"), "gpu-a10g"
        )
        return snapshot([n for n in nodes if n], pods, self.metrics, groups=[group], at=AT)

    def workflow(self) -> DrainWorkflow:
        deps = DrainDeps(
            cluster=self.writer,
            scaler=self.scaler,
            assessor=PlanningAssessor(self.observe, self.policy),
            state=self.state,
            policy=self.policy,
            dry_run=self.dry_run,
            clock=self.clock.now,
        )
        return DrainWorkflow(deps)

    def runner(self) -> InProcessRunner:
        return InProcessRunner(self.workflow(), sleep=self.clock.advance)

    def drain(self, node: str = "gpu-1", execution_id: str = "exec-1", **kw: Any) -> Any:
        return self.runner().start(DrainRequest(node, execution_id, **kw)) and self.state.load(execution_id)


def make_world(*, policy: Policy | None = None, pods: list[dict[str, Any]] | None = None, dry_run: bool = False,
               min_size: int = 0) -> World:  # fmt: skip
    clock = FakeClock(AT)
    writer = FakeClusterWriter(clock=clock)
    scaler = FakeNodeScaler()
    ids = ["i-1", "i-2", "i-3"]
    for i, iid in enumerate(ids, start=1):
        writer.add_node(gpu_node(f"gpu-{i}", instance_type="g5.xlarge", gpus=1, instance_id=iid))
    for p in pods if pods is not None else [pod("web-1", "gpu-1", grace=30), pod("web-2", "gpu-1", grace=30)]:
        writer.add_pod(p)
    scaler.add_group(ASG, min_size=min_size, desired=3, max_size=5, instance_ids=ids)
    metrics = merge_metrics(*(node_devices(f"gpu-{i}", 1) for i in (1, 2, 3)))
    return World(
        clock, writer, scaler, MemoryState("demo"), policy or Policy(dry_run=False), metrics, dry_run
    )


def reasons(world: World, execution_id: str = "exec-1") -> list[tuple[str, str, str]]:
    return [(e.step, e.result, e.reason) for e in world.state.entries(execution_id=execution_id)]


def event_reasons(world: World) -> list[str]:
    return [e["reason"] for e in world.writer.events]


def test_happy_path_drains_waits_and_removes_exactly_that_instance() -> None:
    world = make_world()
    record = world.drain()
    assert record.status == "succeeded"
    assert world.scaler.terminated == ["i-1"]
    assert world.scaler.describe_group(ASG).sizes.desired == 2
    assert world.writer.list_pods_on_node("gpu-1") == []
    assert event_reasons(world) == ["CordonedIdle", "ScaledIn"]
    [entry] = world.state.entries(execution_id="exec-1")
    assert (entry.result, entry.hourly_savings_usd) == ("applied", pytest.approx(1.006))
    assert entry.monthly_savings_usd == pytest.approx(1.006 * 730)
    assert world.state.get("gpu-1") is None and world.state.slots() == []


def test_terminate_happens_only_after_every_pod_is_gone_bug17() -> None:
    world = make_world(pods=[pod("trainer-0", "gpu-1", grace=300)])
    evicted_at: list[float] = []
    original = world.writer.evict

    def evict(namespace: str, name: str, uid: str) -> EvictionOutcome:
        evicted_at.append(world.clock())
        return original(namespace, name, uid)

    world.writer.evict = evict  # type: ignore[method-assign]
    original_terminate = world.scaler.terminate
    terminated_at: list[float] = []

    def terminate(asg: str, iid: str) -> TerminateResult:
        terminated_at.append(world.clock())
        assert world.writer.get_pod("default", "trainer-0") is None
        return original_terminate(asg, iid)

    world.scaler.terminate = terminate  # type: ignore[method-assign]
    assert world.drain().status == "succeeded"
    assert terminated_at[0] - evicted_at[0] >= 300


def test_dry_run_validates_and_touches_nothing() -> None:
    world = make_world(dry_run=True)
    record = world.drain()
    assert record.status == "dry_run"
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.writer.evictions == [] and world.scaler.terminated == []
    [(step, result, reason)] = reasons(world)
    assert (step, result) == ("validate", "dry_run")
    assert "would cordon gpu-1, evict 2 pod(s), terminate i-1 in eks-gpu-a10g-asg (desired 3 -> 2)" in reason


def test_missing_node_is_abandoned() -> None:
    world = make_world()
    assert world.drain(node="gpu-9").status == "abandoned"
    assert reasons(world)[0][2] == "node_not_found"


def test_a_human_cordon_is_never_adopted() -> None:
    world = make_world()
    world.writer.update_node("gpu-1", lambda n: n["spec"].update(unschedulable=True))
    assert world.drain().status == "abandoned"
    assert reasons(world)[0][2] == "cordoned_by_other"
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is True
    assert world.writer.evictions == [] and world.scaler.terminated == []


def test_pods_that_land_after_the_cordon_roll_back_bug21() -> None:
    world = make_world()

    def land(node: str) -> None:
        if not world.writer.get_node(node)["spec"].get("unschedulable"):
            world.writer.add_pod(
                pod("render-0", node, namespace="batch", annotations={"karpenter.sh/do-not-disrupt": "true"})
            )

    world.writer.before_node_patch(land)
    record = world.drain()
    assert record.status == "rolled_back"
    assert reasons(world)[-1][2].startswith("pods_landed:batch/render-0")
    node = world.writer.get_node("gpu-1")
    assert node["spec"]["unschedulable"] is False
    assert "rightsizer.io/cordoned-by" not in node["metadata"]["annotations"]
    assert world.writer.evictions == [] and world.scaler.terminated == []
    assert event_reasons(world) == ["CordonedIdle", "RolledBack"]


def test_pdb_that_never_allows_a_disruption_times_out_and_uncordons_bug14() -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", labels={"app": "infer"}, grace=30)])
    blocked = EvictionOutcome(
        "blocked", "The disruption budget infer needs 1 healthy pods and has 1 currently"
    )
    world.writer.script_eviction("default", "infer-0", *([blocked] * 1000))
    record = world.drain()
    assert record.status == "rolled_back"
    _step, _result, reason = reasons(world)[-1]
    assert reason.startswith("drain_timeout:default/infer-0: The disruption budget infer")
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.writer.get_pod("default", "infer-0") is not None
    assert world.scaler.terminated == [] and not [c for c in world.scaler.calls if c[0] == "terminate"]
    # No eviction starts once grace (30 s) + 60 s would pass the 10-minute deadline.
    assert timedelta(minutes=8, seconds=30) <= world.clock.now() - AT < timedelta(minutes=10)
    assert "DrainBlocked" in event_reasons(world) and event_reasons(world)[-1] == "RolledBack"


def test_pdb_that_clears_lets_the_drain_finish() -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    blocked = EvictionOutcome(
        "blocked", "The disruption budget infer needs 1 healthy pods and has 1 currently"
    )
    world.writer.script_eviction("default", "infer-0", blocked, blocked)
    assert world.drain().status == "succeeded"
    assert world.scaler.terminated == ["i-1"]


def test_repeated_500_is_permanent_and_rolls_back() -> None:
    world = make_world(pods=[pod("two-pdbs", "gpu-1", grace=30)])
    error = EvictionOutcome("error", "This pod has more than one PodDisruptionBudget")
    world.writer.script_eviction("default", "two-pdbs", error, error, error)
    assert world.drain().status == "rolled_back"
    assert reasons(world)[-1][2].startswith("eviction_failed:default/two-pdbs")
    assert world.scaler.terminated == []


def test_pdb_known_at_validation_abandons_before_the_cordon() -> None:
    pods = [pod("infer-0", "gpu-1", labels={"app": "infer"})]
    world = make_world(pods=pods)
    world.writer.add_pdb(pdb("infer", "default", {"app": "infer"}, 0))
    assert world.drain().status == "abandoned"
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.writer.evictions == []


def test_forbidden_eviction_mid_drain_uncordons_and_stops_bug31() -> None:
    world = make_world()
    world.writer.deny("create", "pods", "eviction")
    record = world.drain()
    assert record.status == "failed"
    assert "create pods/eviction" in reasons(world)[-1][2]
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.scaler.terminated == []


def test_two_starters_racing_for_one_node_drain_it_once() -> None:
    world = make_world(policy=Policy(dry_run=False, max_nodes_per_run=2, max_nodes_per_node_group=2))
    first, second = world.workflow(), world.workflow()
    first.start(DrainRequest("gpu-1", "exec-a"))
    second.start(DrainRequest("gpu-1", "exec-b"))
    assert first.step("exec-a").next_step == "cordon"
    result = second.step("exec-b")
    assert (result.status, result.message) == ("abandoned", "lease_held_by_other")
    assert InProcessRunner(first, sleep=world.clock.advance).run("exec-a").status == "succeeded"
    assert world.scaler.terminated == ["i-1"]


def test_budget_counts_nodes_in_flight() -> None:
    world = make_world()
    first = world.workflow()
    first.start(DrainRequest("gpu-1", "exec-a"))
    first.step("exec-a")
    other = world.workflow()
    other.start(DrainRequest("gpu-2", "exec-b"))
    result = other.step("exec-b")
    assert (result.status, result.message) == ("abandoned", "disruption_budget_exhausted")


def test_group_at_min_size_is_never_scaled_in() -> None:
    world = make_world(min_size=3)
    assert world.drain().status == "abandoned"
    assert reasons(world)[0][2].startswith("not_a_candidate:node_group_at_min_size")
    assert world.scaler.terminated == []


def test_busy_node_is_not_drained_even_when_asked() -> None:
    world = make_world()
    world.metrics = merge_metrics(
        node_devices("gpu-1", 1, util=lambda i: 90.0), node_devices("gpu-2", 1), node_devices("gpu-3", 1)
    )
    assert world.drain().status == "abandoned"
    assert reasons(world)[0][2].startswith("not_a_candidate:activity_above_threshold")


def test_stale_metrics_at_revalidation_roll_back() -> None:
    world = make_world(policy=Policy(dry_run=False, max_decision_age=0))
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    workflow.step("exec-1")
    workflow.step("exec-1")
    world.clock.advance(5)
    world.metrics = {}  # the exporter vanished: the fresh assessment is unknown
    result = workflow.step("exec-1")
    assert result.status == "rolled_back" and result.message.startswith("not_idle_anymore:")
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False


def test_a_drain_resumes_in_a_new_invocation_without_repeating_side_effects_bug32() -> None:
    world = make_world(pods=[pod("trainer-0", "gpu-1", grace=120)])
    first = world.workflow()
    first.start(DrainRequest("gpu-1", "exec-1"))
    for _ in range(4):  # validate, cordon, revalidate, evict — then the "Lambda" dies mid-wait
        first.step("exec-1")
    assert world.state.load("exec-1").step == "wait"
    world.clock.advance(60)
    resumed = InProcessRunner(world.workflow(), sleep=world.clock.advance).run("exec-1")
    assert resumed.status == "succeeded"
    assert event_reasons(world).count("CordonedIdle") == 1
    assert len(world.writer.evictions) == 1 and world.scaler.terminated == ["i-1"]


def test_cancel_for_the_lease_epoch_rolls_back() -> None:
    world = make_world(pods=[pod("trainer-0", "gpu-1", grace=120)])
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    for _ in range(4):
        workflow.step("exec-1")
    lease = world.state.get("gpu-1")
    assert world.state.request_cancel("gpu-1", lease.epoch)
    result = workflow.step("exec-1")
    assert result.status == "abandoned" and "cancelled" in result.message
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.scaler.terminated == []


def _flaky_pod_list(world: World, failures: int) -> list[int]:
    calls = [0]
    original = world.writer.list_pods_on_node

    def list_pods_on_node(node: str) -> list[dict[str, Any]]:
        calls[0] += 1
        if (
            world.writer.get_node(node)["spec"].get("unschedulable")
            and calls[0] <= failures + 1
            and calls[0] > 1
        ):
            raise TransientError("API server 503", retry_after=2)
        return original(node)

    world.writer.list_pods_on_node = list_pods_on_node  # type: ignore[method-assign]
    return calls


def test_transient_errors_are_retried_with_their_delay() -> None:
    world = make_world()
    _flaky_pod_list(world, failures=2)
    assert world.drain().status == "succeeded"
    assert world.scaler.terminated == ["i-1"]


def test_transient_errors_that_persist_roll_back() -> None:
    world = make_world()
    _flaky_pod_list(world, failures=100)
    runner = InProcessRunner(world.workflow(), sleep=world.clock.advance, max_transient_retries=3)
    assert runner.start(DrainRequest("gpu-1", "exec-1")) == "exec-1"
    assert world.state.load("exec-1").status == "failed"
    assert reasons(world)[-1][2].startswith("failed:retries_exhausted")
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert world.scaler.terminated == []


def test_expired_lease_cordons_are_healed_by_the_next_assessment() -> None:
    world = make_world(pods=[pod("trainer-0", "gpu-1", grace=120)])
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    workflow.step("exec-1")
    workflow.step("exec-1")  # cordoned, then the workflow dies for good
    world.clock.advance(3600)
    assert heal_expired_leases(world.writer, world.state, world.clock.now()) == ["gpu-1"]
    assert world.writer.get_node("gpu-1")["spec"]["unschedulable"] is False
    assert event_reasons(world)[-1] == "RolledBack"


def test_retry_after_of_a_blocked_eviction_is_honoured() -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    blocked = EvictionOutcome("blocked", "The disruption budget infer needs 1 healthy pods", retry_after=20.0)
    world.writer.script_eviction("default", "infer-0", blocked)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        world.clock.advance(seconds)

    runner = InProcessRunner(world.workflow(), sleep=sleep)
    runner.start(DrainRequest("gpu-1", "exec-1"))
    assert world.state.load("exec-1").status == "succeeded"
    assert waits[0] == 20.0


def _reserved_world(policy: Policy | None = None) -> World:
    import dataclasses

    from rightsizer.domain.model import Ec2Instance

    class ReservedWorld(World):
        def observe(self, now: datetime) -> ClusterSnapshot:
            snap = super().observe(now)
            reserved = Ec2Instance("i-1", "g5.xlarge", {}, "ebs", "running", "", "cr-0abc", "us-east-1a")
            return dataclasses.replace(
                snap, inventory=dataclasses.replace(snap.inventory, instances={"i-1": reserved})
            )

    base = make_world(policy=policy)
    return ReservedWorld(base.clock, base.writer, base.scaler, base.state, base.policy, base.metrics)


def test_a_node_in_a_capacity_reservation_is_never_cordoned_nor_terminated() -> None:
    """Issue 28 (flips issue 17's test): removing a reserved instance saves nothing and frees the slot for
    any matching launch; validate refuses before the cordon."""
    world = _reserved_world()
    record = world.drain()
    [entry] = world.state.entries(execution_id="exec-1")
    assert record.status == "abandoned" and "capacity_reserved:odcr:cr-0abc" in entry.reason
    assert world.scaler.terminated == []
    assert not world.writer.get_node("gpu-1")["spec"].get("unschedulable")


def test_release_reserved_capacity_drains_a_reserved_node_but_books_no_savings() -> None:
    world = _reserved_world(Policy(dry_run=False, release_reserved_capacity=True))
    record = world.drain()
    assert record.status == "succeeded" and world.scaler.terminated == ["i-1"]
    [entry] = world.state.entries(execution_id="exec-1")
    assert (entry.result, entry.hourly_savings_usd) == ("applied", None)


def test_a_running_drain_yields_to_an_interruption_notice_and_leaves_the_handlers_cordon() -> None:
    """Issue 28: the AWS Node Termination Handler taints the node mid-drain; the next eviction round stops,
    nothing is terminated, the node stays cordoned (the handler drains it now) and healing leaves it."""
    from rightsizer.domain.model import Node
    from rightsizer.services.healing import stale_cordons

    world = make_world()
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    result = workflow.step("exec-1")
    while result.step != "cordon":
        result = workflow.step("exec-1")
    node = world.writer.get_node("gpu-1")
    assert node is not None and node["spec"]["unschedulable"]
    node["spec"]["taints"] = [
        {"key": "aws-node-termination-handler/spot-itn", "value": "1", "effect": "NoSchedule"}
    ]
    world.writer.add_node(node)
    while not result.finished:
        result = workflow.step("exec-1")
    assert result.status == "rolled_back" and "spot_interruption:spot_itn" in result.message
    assert world.scaler.terminated == []
    after = world.writer.get_node("gpu-1")
    assert after is not None and after["spec"]["unschedulable"]  # not uncordoned: the handler's now
    assert stale_cordons([Node.model_validate(after)], world.state, world.clock.now()) == {}
