"""The drain state machine's ASL, executed state by state against ``functions/drain/app.handler``.

Runs whole drains through the interpreter of ``tests/support/asl.py`` on a fake clock against the in-memory
fakes (MemoryState, FakeClusterWriter, FakeNodeScaler), so the ASL and the step functions cannot drift
(docs/architecture.md §2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.ports import EvictionOutcome
from rightsizer.services.drain import DrainDeps, DrainWorkflow
from rightsizer.services.notices import notifying
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from rightsizer.wiring.settings import STATE_MACHINE_TIMEOUT_S
from tests.builders import AT, gpu_node, pdb, pod
from tests.support.asl import (
    DRAIN_ARN,
    LAMBDA_INVOKE,
    ROOT,
    WAIT_FOR_TOKEN,
    AslInterpreter,
    Execution,
    LambdaContext,
    LambdaKilled,
    TaskTokens,
    drain_handler,
    drain_machine,
    load_asl,
    serving,
)

pytestmark = pytest.mark.integration

# Re-exported for the tests that import them from here (the interpreter lives in tests/support/asl.py).
__all__ = [
    "DRAIN_ARN",
    "AslInterpreter",
    "Execution",
    "LambdaContext",
    "TaskTokens",
    "drain_handler",
    "load_asl",
]

# --------------------------------------------------------------------------------------------------
# The world: one GPU node of node group gpu-a10g with a few pods, on the in-memory fakes
# --------------------------------------------------------------------------------------------------

NODE = "gpu-node-k"
INSTANCE = "i-0b32aa11c0ffee000"
ASG = "eks-gpu-a10g-5ac5e5d2"


class IdleAssessor:
    """The fresh decision of validate/revalidate: the node is idle (planning is tested elsewhere)."""

    def assess_node(self, node: str, now: Any) -> NodeReport | None:
        return NodeReport(
            node=node,
            verdict="idle",
            reasons=["idle_window_clean"],
            node_group="gpu-a10g",
            instance_id=INSTANCE,
            instance_type="g5.12xlarge",
            gpus=4,
            gpu_activity_max_pct=0.0,
            fb_used_max_mib=0.0,
            coverage=1.0,
            hourly_usd=5.672,
        )


@dataclass
class World:
    clock: FakeClock
    cluster: FakeClusterWriter
    scaler: FakeNodeScaler
    state: MemoryState
    workflow: DrainWorkflow
    interpreter: AslInterpreter


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    with drain_world(getattr(request, "param", 600)) as made:
        yield made


@contextmanager
def drain_world(drain_timeout: int = 600, notifier: Any = None) -> Iterator[World]:
    """The drain handler behind the ASL interpreter, over in-memory ports (one idle node, one ASG); with
    ``notifier``, the workflow's ledger announces action outcomes through it (``services.notices``)."""
    clock = FakeClock(AT)
    cluster = FakeClusterWriter(clock=clock)
    cluster.add_node(gpu_node(NODE, instance_id=INSTANCE, created=AT - timedelta(days=2)))
    scaler = FakeNodeScaler()
    scaler.add_group(ASG, min_size=1, desired=3, max_size=6, instance_ids=[INSTANCE, "i-0a", "i-0c"])
    state = MemoryState("prod-eks")
    policy = Policy.model_validate(
        {
            "dry_run": False,
            "drain_timeout": drain_timeout,
            "max_decision_age": 3600,
            "max_nodes_per_node_group": 2,
        }
    )
    workflow = DrainWorkflow(
        DrainDeps(
            cluster,
            scaler,
            IdleAssessor(),
            notifying(state, notifier, "prod-eks"),
            policy,
            dry_run=False,
            clock=clock.now,
        )
    )
    with serving(workflow):
        yield World(clock, cluster, scaler, state, workflow, drain_machine(clock))


def request(execution_id: str = "gpu-node-k-0123456789abcdef") -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "node": NODE,
        "trigger": "schedule",
        "hourly_savings_usd": 5.672,
        "offhours": False,
    }


def add_workload(cluster: FakeClusterWriter, count: int, *, grace: int = 30) -> list[str]:
    names = [f"worker-{i}" for i in range(count)]
    for name in names:
        cluster.add_pod(pod(name, NODE, namespace="ml", grace=grace, labels={"app": "worker"}))
    return names


def node_annotations(cluster: FakeClusterWriter) -> dict[str, str]:
    node = cluster.get_node(NODE)
    assert node is not None
    annotations: dict[str, str] = node["metadata"].get("annotations") or {}
    return annotations


# --------------------------------------------------------------------------------------------------
# The definition itself
# --------------------------------------------------------------------------------------------------


def test_definition_uses_only_what_the_interpreter_and_the_handler_know() -> None:
    definition = load_asl()
    states = definition["States"]
    # GIVEN every Task invokes the drain function with a payload the handler parses
    tasks = {name: s for name, s in states.items() if s["Type"] == "Task"}
    assert set(tasks) == {"Start", "Step", "Rollback", "AwaitApproval"}
    for name, task in tasks.items():
        assert task["Resource"] == (WAIT_FOR_TOKEN if name == "AwaitApproval" else LAMBDA_INVOKE)
        assert task["Parameters"]["FunctionName"] == DRAIN_ARN
        retried = {e for r in task["Retry"] for e in r["ErrorEquals"]}
        assert {"Lambda.ServiceException", "Lambda.TooManyRequestsException", "TransientError"} <= retried
        if name != "AwaitApproval":  # a retried request would wait on a new token: the Step re-enters it
            assert "Sandbox.Timedout" in retried  # a killed invocation resumes from the saved step (BUG-32)
        assert all(r["BackoffRate"] > 1 for r in task["Retry"])
    # AND the approval wait is bounded by the step's wait_seconds, and every way out reads the decision
    assert tasks["AwaitApproval"]["TimeoutSecondsPath"] == "$.drain.wait_seconds"
    assert {c["Next"] for c in tasks["AwaitApproval"]["Catch"]} == {"Step"}
    assert tasks["AwaitApproval"]["Next"] == "Step"
    assert {c["Next"] for c in tasks["Step"]["Catch"]} == {"Rollback"}
    # THEN the Wait reads wait_seconds, and the overall timeout outlives the default drain by a margin
    assert states["Wait"]["SecondsPath"] == "$.drain.wait_seconds"
    assert definition["TimeoutSeconds"] == STATE_MACHINE_TIMEOUT_S
    assert definition["TimeoutSeconds"] >= Policy().drain_timeout + 1800
    # AND the event files are exactly the three task payloads
    for name in ("start", "step", "rollback"):
        payload = json.loads((ROOT / "events" / f"drain-{name}.json").read_text(encoding="utf-8"))
        assert payload["action"] == name


# --------------------------------------------------------------------------------------------------
# Drains through the state machine
# --------------------------------------------------------------------------------------------------


def test_full_drain_runs_every_step_and_removes_exactly_that_instance(world: World) -> None:
    # GIVEN an idle node with three replicated pods
    add_workload(world.cluster, 3)

    # WHEN the state machine runs the drain
    run = world.interpreter.run(request(), "gpu-node-k-0123456789abcdef")

    # THEN it succeeds after validate → cordon → revalidate → evict → wait… → remove → verify
    assert run.status == "SUCCEEDED", (run.error, run.cause)
    steps = [p.get("action") for p in run.invocations]
    assert steps[0] == "start" and "rollback" not in steps
    assert run.output["drain"]["status"] == "succeeded"
    assert world.scaler.terminated == [INSTANCE]
    assert world.scaler.describe_group(ASG).sizes.desired == 2
    assert {e[3] for e in world.cluster.evictions} == {"accepted"}
    assert "Wait" in run.states  # pods took their grace period: the waiting happened in the state machine
    record = world.state.load("gpu-node-k-0123456789abcdef")
    assert record is not None and record.status == "succeeded"
    assert [e.result for e in world.state.entries("gpu-node-k-0123456789abcdef")][-1] == "applied"


def test_a_retried_start_is_idempotent(world: World) -> None:
    # GIVEN a drain that already ran to its end
    add_workload(world.cluster, 1)
    first = world.interpreter.run(request(), "x")
    assert first.status == "SUCCEEDED"

    # WHEN the same execution input is started again (a retried schedule tick)
    again = world.interpreter.run(request(), "x")

    # THEN nothing is done twice: the record is finished, no second terminate
    assert again.status == "SUCCEEDED"
    assert [p["action"] for p in again.invocations] == ["start"]
    assert world.scaler.terminated == [INSTANCE]


@pytest.mark.parametrize("world", [2400], indirect=True)
def test_bug32_drain_longer_than_an_invocation_resumes_from_the_persisted_step(world: World) -> None:
    # GIVEN the BUG-32 shape: six pods, trainer-2 with a 900 s grace period, a drain of ~2000 s in all
    case = json.loads((ROOT / "tests" / "fixtures" / "cases" / "BUG-32.json").read_text(encoding="utf-8"))
    lambda_limit = case["lambda"]["timeout_seconds"]
    add_workload(world.cluster, 5, grace=60)
    world.cluster.add_pod(pod("trainer-2", NODE, namespace="ml", grace=900, labels={"app": "trainer"}))
    # AND the Lambda is killed twice mid-run: once inside the evict step after some evictions went out,
    # once while the long wait is under way
    world.cluster.script_eviction("ml", "worker-3", LambdaKilled("killed at the 900 s limit"))
    killed_waits = {"left": 1}
    real_invoke = world.interpreter.invoke

    def invoke(function_arn: str, payload: dict[str, Any]) -> Any:
        answer = real_invoke(function_arn, payload)
        record = world.state.load(payload.get("execution_id", ""))
        if (
            record is not None
            and record.step == "wait"
            and killed_waits["left"]
            and world.clock() - AT.timestamp() > 300
        ):
            killed_waits["left"] -= 1
            world.clock.advance(lambda_limit)  # the invocation hung until Lambda ended it
            raise LambdaKilled("Task timed out after 900.00 seconds")
        return answer

    world.interpreter.invoke = invoke

    # WHEN the state machine runs the drain
    run = world.interpreter.run(request(), "bug32")

    # THEN it succeeded, both kills were retried, and every side effect happened exactly once
    assert run.status == "SUCCEEDED", (run.error, run.cause, world.state.load("gpu-node-k-0123456789abcdef"))
    assert run.retried.count("Sandbox.Timedout") == 2
    assert world.scaler.terminated == [INSTANCE]
    assert [c for c in world.cluster.calls if c[0] == "cordon"] and world.scaler.describe_group(
        ASG
    ).sizes.desired == 2
    accepted = [e for e in world.cluster.evictions if e[3] == "accepted"]
    assert sorted(e[1] for e in accepted) == sorted([*(f"worker-{i}" for i in range(5)), "trainer-2"])
    assert len({e[2] for e in accepted}) == len(accepted)  # no pod UID evicted twice
    # AND the drain outlived any single invocation: the waiting was done by the state machine
    assert world.clock() - AT.timestamp() > lambda_limit
    assert run.states.count("Wait") > 10


def test_deadline_rolls_back_with_no_scaling_call(world: World) -> None:
    # GIVEN a pod whose PodDisruptionBudget allowed a disruption when validated, but whose replacement never
    # becomes Ready: every eviction answers 429 from then on
    world.cluster.add_pod(pod("db-0", NODE, namespace="db", grace=30, labels={"app": "db"}))
    world.cluster.add_pdb(pdb("db", "db", {"app": "db"}, allowed=1))
    blocked = EvictionOutcome("blocked", "Cannot evict pod as it would violate the pod's disruption budget.")
    world.cluster.script_eviction("db", "db-0", *[blocked] * 1000)

    # WHEN the state machine runs the drain past its deadline (policy drain_timeout 600 s)
    run = world.interpreter.run(request(), "deadline")

    # THEN the execution fails as a rolled-back drain, and no scaling call was ever made
    assert run.status == "FAILED" and run.error == "DrainFailed"
    assert run.output is None
    record = world.state.load("gpu-node-k-0123456789abcdef")
    assert record is not None and record.status == "rolled_back"
    assert [c for c in world.scaler.calls if c[0] == "terminate"] == []
    assert world.scaler.describe_group(ASG).sizes.desired == 3
    # AND our cordon is undone, the lease and the slot are released
    assert "rightsizer.io/cordoned-by" not in node_annotations(world.cluster)
    assert world.state.get(NODE) is None and world.state.slots() == []
    assert any(e.get("reason") == "RolledBack" for e in world.cluster.events)
    # AND it ended by the deadline: an eviction is tried only while now + grace + 60 s ≤ cordoned-at + 600 s
    assert 600 - 30 - 60 - 10 <= world.clock() - AT.timestamp() <= 600
    assert world.state.entries("gpu-node-k-0123456789abcdef")[-1].reason.startswith("drain_timeout")


def test_transient_errors_are_retried_with_backoff_then_rolled_back(world: World) -> None:
    # GIVEN the Auto Scaling API keeps throttling longer than the Retry budget
    from rightsizer.domain.errors import TransientError

    for _ in range(20):
        world.scaler.fail_next("find_group", TransientError("Throttling", retry_after=1))

    # WHEN the state machine runs the drain
    run = world.interpreter.run(request(), "throttled")

    # THEN the step was retried as TransientError with growing delays, then the Catch rolled back
    assert run.retried.count("TransientError") == 8
    assert [p["action"] for p in run.invocations][-1] == "rollback"
    assert run.status == "FAILED" and run.error == "DrainFailed"
    record = world.state.load("gpu-node-k-0123456789abcdef")
    assert record is not None and record.status == "failed"
    assert world.scaler.terminated == []


def test_a_node_that_vanished_ends_abandoned_and_succeeds(world: World) -> None:
    # GIVEN the alert named a node that is gone
    world.cluster.delete_node(NODE)

    # WHEN the state machine runs
    run = world.interpreter.run(request(), "gone")

    # THEN it is abandoned quietly (an abandoned drain is a success, docs/architecture.md §5 exit codes)
    assert run.status == "SUCCEEDED"
    assert run.output["drain"]["status"] == "abandoned"
    assert run.output["drain"]["message"] == "node_not_found"


def test_wait_seconds_are_integers_rounded_up() -> None:
    # The Wait state needs a non-negative integer: 0.5 s must become 1, never 0 (a busy loop).
    from rightsizer.handler_io import _output
    from rightsizer.services.drain import StepResult

    assert _output(StepResult("e", "wait", "wait", "running", 0.5))["wait_seconds"] == 1
    assert _output(StepResult("e", "evict", "evict", "running", 5.0))["wait_seconds"] == 5
    assert math.ceil(0.0) == _output(StepResult("e", "evict", "wait", "running", 0.0))["wait_seconds"]


def test_blocked_eviction_answers_are_scriptable() -> None:
    # Guard for the deadline test: the fake answers 429 for a PDB with no disruption allowed.
    clock = FakeClock(AT)
    cluster = FakeClusterWriter(clock=clock)
    cluster.add_node(gpu_node(NODE, instance_id=INSTANCE))
    cluster.add_pod(pod("db-0", NODE, namespace="db", labels={"app": "db"}))
    cluster.add_pdb(pdb("db", "db", {"app": "db"}, allowed=0))
    outcome = cluster.evict("db", "db-0", "uid-db-db-0")
    assert isinstance(outcome, EvictionOutcome) and outcome.status == "blocked"
