"""Our cordon is never forgotten (issue 12 §2): a failing uncordon is retried with backoff; one that keeps
failing leaves a record the assessment heals; a stale cordon never spends other nodes' budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.services.drain import UNCORDON_ATTEMPTS, DrainRequest
from rightsizer.services.healing import stale_cordons
from rightsizer.services.runner import InProcessRunner
from tests.builders import AT, gpu_node, merge_metrics, node_devices, pod, snapshot
from tests.unit.test_drain import World, event_reasons, make_world, reasons


class Recorder:
    """A ``WorkflowStarter`` that only records what the assessment asked for."""

    def __init__(self) -> None:
        self.requests: list[DrainRequest] = []

    def start(self, request: Any) -> str:
        self.requests.append(request)
        return str(request.execution_id)


def _failing_uncordon(world: World, errors: list[Exception]) -> list[str]:
    """The next uncordons raise ``errors`` in order, then behave; returns the call log."""
    original = world.writer.uncordon
    log: list[str] = []

    def uncordon(node: str, execution_id: str) -> bool:
        log.append(node)
        if errors:
            raise errors.pop(0)
        return original(node, execution_id)

    world.writer.uncordon = uncordon  # type: ignore[method-assign]
    return log


def _rolls_back(world: World) -> InProcessRunner:
    """A drain of gpu-1 whose PDB never allows a disruption: it must time out and roll back."""
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        world.clock.advance(seconds)

    runner = InProcessRunner(world.workflow(), sleep=sleep)
    runner.waits = waits  # type: ignore[attr-defined]
    return runner


def _cordoned(world: World, node: str = "gpu-1") -> bool:
    return bool(world.writer.get_node(node)["spec"].get("unschedulable"))


@pytest.mark.parametrize(
    "errors",
    [
        [TransientError("503")],
        [TransientError("429", retry_after=1), StalePlan("node_changed"), TransientError("timeout")],
    ],
    ids=["one-503", "429-409-timeout"],
)
def test_an_uncordon_that_fails_a_few_times_is_retried_with_backoff_until_it_holds(
    errors: list[Exception],
) -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "infer-0", *[PermanentError("eviction refused")] * 1)
    count = len(errors)
    calls = _failing_uncordon(world, list(errors))
    runner = _rolls_back(world)
    runner.start(DrainRequest("gpu-1", "exec-1"))
    record = world.state.load("exec-1")
    assert record.status == "failed" and not _cordoned(world)
    assert len(calls) == count + 1
    backoffs = [w for w in runner.waits if w >= 2.0]  # type: ignore[attr-defined]
    assert backoffs[:count] == [2.0 * 2**i for i in range(count)]
    assert "uncordon_pending" not in record.details
    assert event_reasons(world)[-1] == "RolledBack"


def _assess(world: World, starter: Recorder, tick: str = "tick-1") -> Any:
    deps = AssessmentDeps(
        cluster_name="demo",
        observe=world.observe,
        policy=world.policy,
        cluster=world.writer,
        state=world.state,
        starter=starter,
    )
    # The decision instant is the one the fake metrics describe (the drain's clock ran past it).
    return run_assessment(deps, AT, tick)


@pytest.mark.parametrize(
    "make_error",
    [lambda: TransientError("503"), lambda: PermanentError("403 Forbidden: patch nodes")],
    ids=["503-forever", "403"],
)
def test_an_uncordon_that_keeps_failing_is_healed_by_the_next_assessment(
    make_error: Callable[[], Exception],
) -> None:
    world = make_world(pods=[pod("infer-0", "gpu-1", grace=30)])
    world.writer.script_eviction("default", "infer-0", PermanentError("eviction refused"))
    attempts = UNCORDON_ATTEMPTS if isinstance(make_error(), TransientError) else 1  # 403 is not retried
    calls = _failing_uncordon(world, [make_error() for _ in range(attempts)])
    _rolls_back(world).start(DrainRequest("gpu-1", "exec-1"))
    record = world.state.load("exec-1")
    assert record.status == "failed" and record.details.get("uncordon_pending") is True
    assert "uncordon_pending" in reasons(world)[-1][2]
    assert _cordoned(world) and world.state.get("gpu-1") is None  # lease released, cordon left
    assert "UncordonFailed" in event_reasons(world)
    assert len(calls) == attempts

    starter = Recorder()
    summary = _assess(world, starter)
    assert summary.healed == ["gpu-1"]
    assert not _cordoned(world)
    assert ANN_CORDONED_BY not in world.writer.get_node("gpu-1")["metadata"]["annotations"]
    assert event_reasons(world)[-1] == "RolledBack"
    heal = [e for e in world.state.entries(execution_id="exec-1") if e.step == "heal"]
    assert [(e.result, e.reason) for e in heal] == [("rolled_back", "stale_cordon:workflow exec-1 is failed")]
    # The stale cordon did not spend the budget: another idle node is drained in the same assessment.
    assert [r.node for r in starter.requests] != []


def test_a_stale_cordon_never_spends_the_budget_of_other_nodes() -> None:
    nodes = [
        gpu_node("gpu-1", instance_type="g5.xlarge", gpus=1, unschedulable=True, annotations={ANN_CORDONED_BY: "dead-exec"}),
        gpu_node("gpu-2", instance_type="g5.xlarge", gpus=1),
        gpu_node("gpu-3", instance_type="g5.xlarge", gpus=1),
    ]  # fmt: skip
    metrics = merge_metrics(*(node_devices(f"gpu-{i}", 1) for i in (1, 2, 3)))
    snap = snapshot(nodes, [], metrics)
    live = plan(snap, Policy(), AT)
    assert [a for a in live.actions if a.kind == "scale_in"] == []
    assert "disruption_budget_exhausted" in live.node("gpu-2").reasons
    stale = plan(snap, Policy(), AT, stale_cordons=frozenset({"gpu-1"}))
    assert [a.node for a in stale.actions if a.kind == "scale_in"] in (["gpu-2"], ["gpu-3"])
    assert stale.node("gpu-1").verdict == "protected"  # still not a candidate itself


def test_only_a_cordon_without_a_live_lease_is_stale() -> None:
    world = make_world(pods=[pod("trainer-0", "gpu-1", grace=120)])
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    workflow.step("exec-1")
    workflow.step("exec-1")  # cordoned, lease live
    nodes = world.observe(world.clock.now()).nodes
    assert stale_cordons(nodes, world.state, world.clock.now()) == {}
    world.writer.update_node(
        "gpu-2", lambda n: n["metadata"]["annotations"].update({ANN_CORDONED_BY: "ghost"})
    )
    nodes = world.observe(world.clock.now()).nodes
    assert stale_cordons(nodes, world.state, world.clock.now()) == {"gpu-2": "ghost"}
    world.clock.advance(3600)  # the lease expired: the workflow is dead
    assert set(stale_cordons(nodes, world.state, world.clock.now())) == {"gpu-1", "gpu-2"}


def test_a_409_on_the_cordon_rereads_and_retries() -> None:
    world = make_world()
    fired: list[str] = []

    def someone_else_writes(node: str) -> None:
        if not fired:
            fired.append(node)
            world.writer.update_node(node, lambda n: n["metadata"]["labels"].update({"touched": "yes"}))

    world.writer.before_node_patch(someone_else_writes)
    assert world.drain().status == "succeeded"
    assert fired == ["gpu-1"] and world.scaler.terminated == ["i-1"]
