"""Executing ``consolidate`` (``services.consolidate``) on the drain's fakes: drain + removal like a
scale-in, the placement re-run right before the first eviction, and the abort when anything changed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rightsizer.domain.policy import Policy
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.consolidate import ConsolidateRequest, ConsolidateWorkflow, recheck
from rightsizer.services.drain import DrainDeps
from tests.builders import AT, pod
from tests.unit.test_drain import World, make_world

POLICY = Policy(dry_run=False, consolidation="idle_holders")
MOVES = (("default/holder", "gpu-2"),)


def _world() -> World:
    return make_world(policy=POLICY, pods=[pod("holder", "gpu-1", gpus=1, grace=30)])


def _workflow(world: World, *, observe: bool = True) -> ConsolidateWorkflow:
    deps = DrainDeps(
        cluster=world.writer,
        scaler=world.scaler,
        assessor=PlanningAssessor(world.observe, world.policy),
        state=world.state,
        policy=world.policy,
        dry_run=False,
        clock=world.clock.now,
    )
    return ConsolidateWorkflow(deps, None, observe_cluster=world.observe if observe else None)


def _until_evict(wf: ConsolidateWorkflow) -> Any:
    record = wf.start(ConsolidateRequest("gpu-1", "exec-1", moves=MOVES))
    while record.step != "evict" and record.status == "running":
        wf.step(record.execution_id)
        record = wf.deps.state.load(record.execution_id)
    return record


def test_a_consolidation_drains_and_removes_the_node_like_a_scale_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    world = _world()
    wf = _workflow(world)
    record = _until_evict(wf)
    assert record.step == "evict" and record.details["kind"] == "consolidate"
    while record.status == "running":
        wf.step(record.execution_id)
        world.clock.advance(5)
        record = wf.deps.state.load(record.execution_id)
    assert record.status == "succeeded", record
    assert record.details["placement_checked"]
    assert world.scaler.terminated == ["i-1"]
    # the end is logged under the workflow's own kind (a resize or a replacement is no "drain")
    assert "consolidate exec-1 of gpu-1 ended succeeded" in caplog.text


def test_the_move_checked_before_the_first_eviction_aborts_when_the_room_is_gone() -> None:
    world = _world()
    wf = _workflow(world)
    record = _until_evict(wf)
    assert record.status == "running"
    for node in ("gpu-2", "gpu-3"):  # the room the plan counted on is taken after the cordon
        world.writer.add_pod(pod(f"late-{node}", node, gpus=1))
    wf.step(record.execution_id)
    record = wf.deps.state.load(record.execution_id)
    assert record.status == "rolled_back"
    assert "no_placement:default/holder:gpu" in str(record.details)
    assert world.scaler.terminated == []
    assert not world.writer.get_node("gpu-1")["spec"].get("unschedulable")
    assert not world.writer.evictions


def test_without_a_cluster_read_a_consolidation_never_evicts() -> None:
    world = _world()
    wf = _workflow(world, observe=False)
    record = _until_evict(wf)
    wf.step(record.execution_id)
    record = wf.deps.state.load(record.execution_id)
    assert record.status == "rolled_back" and not world.writer.evictions


def test_recheck_names_what_changed() -> None:
    world = _world()
    snap = world.observe(AT)
    assert recheck(snap, "gpu-1", ["default/holder"], AT, POLICY) is None
    assert recheck(snap, "gpu-1", ["default/other"], AT, POLICY) == (
        "placement_changed:+default/holder,-default/other"
    )


def test_a_consolidation_with_the_policy_off_is_abandoned_at_validate() -> None:
    world = _world()
    world.policy = Policy(dry_run=False, consolidation="off")
    wf = _workflow(world)
    record = wf.start(ConsolidateRequest("gpu-1", "exec-1", moves=MOVES))
    wf.step(record.execution_id)
    record = wf.deps.state.load(record.execution_id)
    assert record.status == "abandoned" and "consolidation_off" in str(record.details)


def test_every_step_result_names_its_workflow_kind() -> None:
    # Progress lines (`rightsizer demo`, the CLI's log) print the kind: a consolidation, a resize or a
    # replacement is no "drain".
    from rightsizer.services.runner import InProcessRunner

    world = _world()
    seen: list[str] = []
    runner = InProcessRunner(
        _workflow(world), sleep=world.clock.advance, progress=lambda r: seen.append(r.kind)
    )
    runner.start(ConsolidateRequest("gpu-1", "exec-1", moves=MOVES))
    assert seen and set(seen) == {"consolidate"}
    assert runner.results["exec-1"].kind == "consolidate"
