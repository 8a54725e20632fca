"""A resize whose workflow dies after the stop is brought back by the next assessment (issue 17), through the
drain state machine definition.

GIVEN the standalone g5.4xlarge resize of ``test_resize_statemachine`` (fake EC2 with EC2's transitions, the
fake cluster, a kubelet), WHEN its workflow dies right after the stop, or right after the type was changed
(the instance stopped as g5.xlarge), and its lease expires, THEN ``run_assessment`` restarts it: a new
execution ``<execution id>-r<lease epoch>`` of ``infra/statemachine/drain.asl.json`` continues the same record, sets the
original type, starts the instance, waits for the Node to be Ready with its GPU and uncordons it; the
record ends ``rolled_back``. A second assessment changes nothing. A resize that died *before* its stop is
only uncordoned (the drain's healing), and a live resize is left alone.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pytest

from rightsizer.adapters.stepfunctions import execution_name
from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.handler_io import use_drain_workflow
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.services.resize import ResizeRequest
from rightsizer.state import lease_ttl_seconds
from tests.builders import snapshot
from tests.integration.test_resize_statemachine import (
    EXECUTION,
    NODE,
    World,
    asl,
    assert_serving_as,
    make_world,
    node,
)

pytestmark = pytest.mark.integration


class AslStarter:
    """The Step Functions starter of the assessment, played by the ASL interpreter (one run per start)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.runs: list[tuple[str, Any]] = []

    def start(self, request: Any) -> str:
        name = execution_name(request.execution_id, getattr(request, "resume", 0))
        use_drain_workflow(self.w.workflow)
        try:
            run = asl(self.w).run(asdict(request), name)
        finally:
            use_drain_workflow(None)
        self.runs.append((name, run))
        return str(request.execution_id)


def die_after(w: World, step: str) -> None:
    """Run the resize in-process until ``step`` has run, then stop (the process dies)."""
    w.workflow.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))
    for _ in range(200):
        result = w.workflow.step(EXECUTION)
        assert not result.finished, result
        if result.step == step and result.next_step != step:
            return
        w.clock.advance(result.wait_seconds)
    raise AssertionError(f"never passed {step}")


def assess(w: World, starter: AslStarter) -> list[str]:
    """One scheduled assessment at the fake clock's now (no GPU node to plan: only its healing matters)."""
    deps = AssessmentDeps(
        cluster_name="prod-eks",
        observe=lambda now: snapshot([], at=now),
        policy=w.workflow.deps.policy,
        cluster=w.cluster,
        state=w.state,
        starter=starter,
    )
    return run_assessment(deps, w.clock.now(), "tick").healed


def expire_lease(w: World) -> None:
    w.clock.advance(lease_ttl_seconds(timedelta(seconds=w.workflow.deps.policy.drain_timeout)) + 1)


@pytest.mark.parametrize(
    ("died_after", "state_then", "type_then"),
    [("stop", "stopped", "g5.4xlarge"), ("set_type", "stopped", "g5.xlarge")],
    ids=["after-stop", "after-modify"],
)
def test_a_resize_that_died_after_its_stop_is_restored_by_the_next_assessment(
    died_after: str, state_then: str, type_then: str
) -> None:
    w = make_world()
    die_after(w, died_after)
    w.ec2.describe(w.ec2.instance_id)  # EC2 finishes the stop meanwhile
    assert (w.ec2.state, w.ec2.instance_type) == (state_then, type_then)
    assert node(w)["spec"].get("unschedulable")  # the dead workflow left it cordoned
    starter = AslStarter(w)

    assert assess(w, starter) == []  # the lease is still live: the workflow may be alive
    assert starter.runs == [] and w.ec2.state == state_then

    expire_lease(w)
    assert assess(w, starter) == [NODE]

    [(name, run)] = starter.runs
    assert name == f"{EXECUTION}-r2"  # the lease epoch the healer took (the dead workflow held epoch 1)
    assert (run.status, run.error) == ("FAILED", "DrainFailed")  # rolled back: operators see it
    assert_serving_as(w, "g5.4xlarge")
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "rolled_back"
    assert record.details["resumes"] == 1 and f"died at step {died_after_next(died_after)}" in str(
        record.details["restoring"]
    )
    assert w.ec2.calls[-2:] == ["set_type g5.4xlarge", "start g5.4xlarge"]
    entries = {(e.step, e.result) for e in w.state.entries(EXECUTION)}
    assert ("heal:2", "applied") in entries and ("uncordon", "rolled_back") in entries
    reasons = [e["reason"] for e in w.cluster.events]
    assert reasons[-2:] == ["ResizeResumed", "RolledBack"]

    # A second assessment, even much later, is a no-op.
    calls, version, events = list(w.ec2.calls), record.version, len(w.cluster.events)
    expire_lease(w)
    assert assess(w, starter) == []
    assert len(starter.runs) == 1 and w.ec2.calls == calls and len(w.cluster.events) == events
    again = w.state.load(EXECUTION)
    assert again is not None and again.version == version


def died_after_next(step: str) -> str:
    return {"stop": "stopped", "set_type": "start"}[step]


def test_a_restart_that_dies_too_is_restarted_again_until_done() -> None:
    w = make_world()
    die_after(w, "stop")
    expire_lease(w)

    class DyingStarter(AslStarter):
        def start(self, request: Any) -> str:  # the execution starts and dies before its first step
            self.runs.append((execution_name(request.execution_id, request.resume), request))
            return str(request.execution_id)

    dying = DyingStarter(w)
    assert assess(w, dying) == [NODE]
    assert assess(w, dying) == []  # the healer holds the lease for the restart: not yet dead
    expire_lease(w)
    assert assess(w, dying) == [NODE]
    first, second = (request for _, request in dying.runs)

    # The first restart's execution wakes up late: superseded (lease epoch 2 is gone), it ends untouched.
    version = w.state.load(EXECUTION).version  # type: ignore[union-attr]
    late = AslStarter(w)
    late.start(first)
    [(name, run)] = late.runs
    assert name == f"{EXECUTION}-r2" and run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.output["drain"]["status"] == "abandoned"
    assert w.ec2.calls == ["preflight g5.xlarge", "stop"] and w.state.load(EXECUTION).version == version  # type: ignore[union-attr]

    # The second one (epoch 3, still holding the lease) runs to the end; so would a third after it died.
    starter = AslStarter(w)
    starter.start(second)
    assert [name for name, _ in dying.runs] == [f"{EXECUTION}-r2", f"{EXECUTION}-r3"]
    assert_serving_as(w, "g5.4xlarge")
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "rolled_back" and record.details["resumes"] == 1

    # A late start of a finished record changes nothing either.
    calls, version = list(w.ec2.calls), record.version
    starter.start(second)
    assert starter.runs[-1][1].error == "DrainFailed"  # it reports the record's rolled_back, as before
    assert w.ec2.calls == calls and w.state.load(EXECUTION).version == version  # type: ignore[union-attr]


def test_a_resize_that_died_before_its_stop_is_only_uncordoned() -> None:
    w = make_world()
    die_after(w, "evict")
    assert w.ec2.state == "running"
    expire_lease(w)
    starter = AslStarter(w)
    assert assess(w, starter) == [NODE]
    assert starter.runs == [] and w.ec2.calls == ["preflight g5.xlarge"]
    n = node(w)
    assert not n["spec"].get("unschedulable") and ANN_CORDONED_BY not in n["metadata"].get("annotations", {})


def test_a_restart_has_its_own_execution_name_within_the_80_character_limit() -> None:
    assert execution_name(EXECUTION) == EXECUTION == execution_name(EXECUTION, 0)
    assert execution_name(EXECUTION, 3) == f"{EXECUTION}-r3"
    long_id = "x" * 80
    assert execution_name(long_id, 12) == "x" * 76 + "-r12" and len(execution_name(long_id, 12)) == 80


@pytest.mark.parametrize(
    ("request_input", "problem"),
    [
        ({"node": NODE, "execution_id": EXECUTION, "resume": 1}, "needs target_type"),
        ({"node": NODE, "execution_id": EXECUTION, "resume": -1, "target_type": "g5.xlarge"}, "greater than"),
        (
            {
                "node": NODE,
                "execution_id": EXECUTION,
                "resume": 1,
                "target_type": "g5.xlarge",
                "nodegroup": "ng",
            },
            "no nodegroup",
        ),
    ],
)
def test_the_state_machine_input_validates_resume(request_input: dict[str, Any], problem: str) -> None:
    from pydantic import ValidationError

    from rightsizer.handler_io import DrainRequestModel

    with pytest.raises(ValidationError, match=problem):
        DrainRequestModel.model_validate(request_input)


@pytest.mark.parametrize(
    ("broken", "status", "serving"),
    [(frozenset(), "succeeded", "g5.xlarge"), (frozenset({"g5.xlarge"}), "rolled_back", "g5.4xlarge")],
    ids=["node-ready", "never-ready"],
)
def test_a_resize_that_died_waiting_for_its_node_goes_on_under_its_own_deadline(
    broken: frozenset[str], status: str, serving: str
) -> None:
    # Died at `ready` (the instance runs as g5.xlarge): the restart does not stop it again; it finishes the
    # resize when the Node is Ready with its GPU, and restores only at the resize deadline otherwise.
    w = make_world(broken=broken, policy={"resize_timeout": 120})
    die_after(w, "start")
    w.ec2.describe(w.ec2.instance_id)  # EC2 finishes the start meanwhile
    assert (w.ec2.state, w.ec2.instance_type) == ("running", "g5.xlarge")
    expire_lease(w)  # longer than resize_timeout: the deadline has passed by the time the restart runs
    starter = AslStarter(w)
    assert assess(w, starter) == [NODE]
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == status, record
    assert_serving_as(w, serving)
    stops = w.ec2.calls.count("stop")
    assert stops == (1 if status == "succeeded" else 2)


def test_a_restore_that_cannot_start_the_instance_keeps_trying_until_it_runs() -> None:
    # g5.xlarge has no capacity (the resize restores) and neither has g5.4xlarge for a long time: past the
    # restore deadline the workflow does not end with the instance stopped, it retries every 5 min.
    from rightsizer.domain.errors import TransientError
    from rightsizer.services.resize import RESTORE_RETRY_S
    from rightsizer.services.runner import InProcessRunner

    w = make_world(policy={"resize_timeout": 120})
    capacity_back = w.clock.now() + timedelta(hours=2)
    real_start = w.ec2.start

    def start(instance_id: str) -> None:
        if w.ec2.instance_type == "g5.xlarge" or w.clock.now() < capacity_back:
            w.ec2.calls.append(f"start {w.ec2.instance_type}")
            raise TransientError(f"InsufficientInstanceCapacity: no {w.ec2.instance_type}")
        real_start(instance_id)

    w.ec2.start = start  # type: ignore[method-assign]
    result = InProcessRunner(w.workflow, sleep=w.clock.advance).start(
        ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge")
    )
    assert result == EXECUTION
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "rolled_back", record
    assert w.clock.now() >= capacity_back
    assert_serving_as(w, "g5.4xlarge")
    retrying = [e for e in w.cluster.events if e["reason"] == "ResizeRestoreRetrying"]
    assert retrying and all(e["type"] == "Warning" for e in retrying)
    # bounded: about one retry per RESTORE_RETRY_S after the deadline, not a busy loop
    assert len(retrying) <= timedelta(hours=2).total_seconds() / RESTORE_RETRY_S + 2
