"""Eligibility parity through the drain workflow (issue 12 §4/§5): the classification rules acting on a
live drain — cordon-tolerating pods, nodes being deleted, terminating pods, PDB names."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rightsizer.services.drain import POLL_S, DrainRequest
from rightsizer.services.runner import InProcessRunner
from tests.builders import pdb, pod, rfc
from tests.unit.test_drain import event_reasons, make_world, reasons

TOLERATE_ALL = {"tolerations": [{"operator": "Exists"}]}


def test_a_pod_that_tolerates_the_cordon_is_neither_evicted_nor_counted_as_landed() -> None:
    agent = pod("agent-0", "gpu-1", extra_spec=TOLERATE_ALL)
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30), agent])
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    workflow.step("exec-1")
    workflow.step("exec-1")  # cordoned
    # Its replacement would come straight back onto the cordoned node: that must not roll back the drain.
    world.writer.add_pod(pod("agent-1", "gpu-1", extra_spec=TOLERATE_ALL))
    InProcessRunner(workflow, sleep=world.clock.advance).run("exec-1")
    assert world.state.load("exec-1").status == "succeeded"
    assert [e[1] for e in world.writer.evictions] == ["web-1"]
    assert world.scaler.terminated == ["i-1"]


def test_a_node_being_deleted_is_not_a_candidate() -> None:
    world = make_world()
    world.writer.update_node(
        "gpu-1", lambda n: n["metadata"].update({"deletionTimestamp": rfc(world.clock.now())})
    )
    assert world.drain().status == "abandoned"
    assert reasons(world)[-1][2] == "node_deleting"
    report = world.workflow().deps.assessor.assess_node("gpu-1", world.clock.now())
    assert "other_autoscaler:node_deleting" in report.reasons and report.verdict == "protected"
    assert world.writer.evictions == [] and world.scaler.terminated == []


def test_a_terminating_pod_does_not_block_and_is_waited_for_without_spinning() -> None:
    stuck = pod("old-0", "gpu-1", grace=30)
    stuck["metadata"]["deletionTimestamp"] = rfc(make_world().clock.now() + timedelta(seconds=400))
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30), stuck])
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        world.clock.advance(seconds)

    InProcessRunner(world.workflow(), sleep=sleep).start(DrainRequest("gpu-1", "exec-1"))
    assert world.state.load("exec-1").status == "succeeded"
    assert [e[1] for e in world.writer.evictions] == ["web-1"]  # never evicted again
    assert world.scaler.terminated == ["i-1"]
    assert waits and min(waits) >= 0.5 and len(waits) <= 400 / POLL_S + 10


def test_a_daemonset_pod_with_do_not_disrupt_keeps_the_node() -> None:
    ds = pod(
        "dcgm-0", "gpu-1", owner=("DaemonSet", "apps/v1"), annotations={"karpenter.sh/do-not-disrupt": "true"}
    )
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30), ds])
    assert world.drain().status == "abandoned"
    assert "do_not_disrupt:default/dcgm-0" in reasons(world)[-1][2]
    assert world.writer.evictions == []


def test_pdb_names_are_in_the_reason_the_event_and_the_ledger() -> None:
    world = make_world(pods=[pod("web-1", "gpu-1", grace=30, labels={"app": "web", "tier": "front"})])
    workflow = world.workflow()
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    workflow.step("exec-1")
    workflow.step("exec-1")  # cordoned; now two PDBs select the pod
    world.writer.add_pdb(pdb("web", "default", {"app": "web"}, allowed=1))
    world.writer.add_pdb(pdb("front", "default", {"tier": "front"}, allowed=1))
    result: Any = InProcessRunner(workflow, sleep=world.clock.advance).run("exec-1")
    assert result.status == "rolled_back"
    assert "multiple_pdbs:default/web-1:front,web" in reasons(world)[-1][2]
    assert "front,web" in world.writer.events[-1]["message"]
    assert event_reasons(world)[-1] == "RolledBack"


def test_a_gpu_job_that_tolerates_every_taint_still_protects_its_node() -> None:
    """Not evicted because it would come back — but its work would die with the instance: it blocks."""
    trainer = pod("trainer-0", "gpu-1", owner=("Job", "batch/v1"), gpus=1, extra_spec=TOLERATE_ALL)
    world = make_world(pods=[trainer])
    assert world.drain().status == "abandoned"
    blocking = reasons(world)[-1][2]
    assert (
        "running_batch_pod:default/trainer-0" in blocking and "idle_gpu_holder:default/trainer-0" in blocking
    )
    assert world.writer.evictions == [] and world.scaler.terminated == []
