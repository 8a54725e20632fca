"""The drain state machine's ASL, executed state by state against ``functions/drain/app.handler``.

A small interpreter for the subset ``infra/statemachine/drain.asl.json`` uses — Task (``lambda:invoke``
with Parameters/ResultSelector/ResultPath, Retry with backoff, Catch; ``lambda:invoke.waitForTaskToken``
with ``$$.Task.Token`` and TimeoutSecondsPath, woken by :class:`TaskTokens`), Choice (StringEquals,
NumericGreaterThan, IsNull, And/Or/Not), Wait (SecondsPath), Succeed, Fail, the execution's
TimeoutSeconds — runs whole drains in-process on a fake clock against the in-memory fakes (MemoryState,
FakeClusterWriter, FakeNodeScaler), so the ASL and the step functions cannot drift (docs/architecture.md §2).

Lambda's side is simulated too: the error name of a failed invocation is the exception's class name (as the
Python runtime reports ``errorType``), and a killed invocation surfaces as ``Sandbox.Timedout``. Each
invocation costs a little fake time, as it does in AWS.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.handler_support import STATE_MACHINE_TIMEOUT_S, use_drain_workflow
from rightsizer.ports import EvictionOutcome
from rightsizer.services.drain import DrainDeps, DrainWorkflow
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from tests.builders import AT, gpu_node, pdb, pod

ROOT = Path(__file__).resolve().parents[2]
ASL_PATH = ROOT / "infra" / "statemachine" / "drain.asl.json"
DRAIN_ARN = "arn:aws:lambda:us-east-1:123456789012:function:rightsizer-drain"
LAMBDA_INVOKE = "arn:aws:states:::lambda:invoke"
WAIT_FOR_TOKEN = LAMBDA_INVOKE + ".waitForTaskToken"

pytestmark = pytest.mark.integration


def load_asl(function_arn: str = DRAIN_ARN) -> dict[str, Any]:
    """The ASL with its DefinitionSubstitutions applied, as SAM deploys it."""
    text = ASL_PATH.read_text(encoding="utf-8").replace("${DrainFunctionArn}", function_arn)
    document: dict[str, Any] = json.loads(text)
    return document


def drain_handler() -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """``functions/drain/app.handler`` imported as Lambda does (``drain/app.handler`` under CodeUri)."""
    functions = str(ROOT / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    module = importlib.import_module("drain.app")
    handler: Callable[[dict[str, Any], Any], dict[str, Any]] = module.handler
    return handler


@dataclass
class LambdaContext:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str = "rightsizer-drain"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = DRAIN_ARN
    aws_request_id: str = "req-0"

    def get_remaining_time_in_millis(self) -> int:
        return 120_000


# --------------------------------------------------------------------------------------------------
# A tiny ASL interpreter
# --------------------------------------------------------------------------------------------------


class StatesError(Exception):
    """An error as Step Functions names it (``Error``/``Cause``)."""

    def __init__(self, error: str, cause: str = "") -> None:
        self.error = error
        self.cause = cause
        super().__init__(f"{error}: {cause}")


class LambdaKilled(Exception):
    """The Lambda service ended the invocation (timeout, OOM): Step Functions sees ``Sandbox.Timedout``."""

    error_name = "Sandbox.Timedout"


def _get(document: Any, path: str, context: dict[str, Any]) -> Any:
    """Evaluate the JSONPath subset ``$``, ``$.a.b``, ``$$.a.b``."""
    if path.startswith("$$"):
        document, path = context, "$" + path[2:]
    if path == "$":
        return document
    assert path.startswith("$."), path
    value = document
    for part in path[2:].split("."):
        if not isinstance(value, dict) or part not in value:
            raise StatesError("States.Runtime", f"path {path} not found")
        value = value[part]
    return value


def _set(document: Any, path: str | None, value: Any) -> Any:
    """ResultPath: ``$`` replaces, ``$.a.b`` inserts into a copy, ``null`` discards the result."""
    if path is None:
        return document
    if path == "$":
        return value
    result = copy.deepcopy(document)
    target = result
    parts = path[2:].split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value
    return result


def _template(template: Any, document: Any, context: dict[str, Any]) -> Any:
    """Parameters / ResultSelector: keys ending in ``.$`` are paths, everything else is literal."""
    if isinstance(template, dict):
        out: dict[str, Any] = {}
        for key, value in template.items():
            if key.endswith(".$"):
                out[key[:-2]] = _get(document, value, context)
            else:
                out[key] = _template(value, document, context)
        return out
    if isinstance(template, list):
        return [_template(v, document, context) for v in template]
    return template


def _matches(rule: dict[str, Any], document: Any, context: dict[str, Any]) -> bool:
    if "And" in rule:
        return all(_matches(r, document, context) for r in rule["And"])
    if "Or" in rule:
        return any(_matches(r, document, context) for r in rule["Or"])
    if "Not" in rule:
        return not _matches(rule["Not"], document, context)
    try:
        value = _get(document, rule["Variable"], context)
        present = True
    except StatesError:
        value, present = None, False
    if "IsNull" in rule:
        return present and (value is None) == bool(rule["IsNull"])
    if "IsPresent" in rule:
        return present == bool(rule["IsPresent"])
    if "StringEquals" in rule:
        return isinstance(value, str) and value == rule["StringEquals"]
    if "NumericGreaterThan" in rule:
        return isinstance(value, int | float) and value > rule["NumericGreaterThan"]
    if "BooleanEquals" in rule:
        return value is rule["BooleanEquals"]
    raise AssertionError(f"choice operator not supported by the test interpreter: {rule}")


def _error_matches(names: list[str], error: str) -> bool:
    if "States.ALL" in names:
        return True
    if error in names:
        return True
    # A failed Lambda invocation is also a States.TaskFailed.
    return "States.TaskFailed" in names and not error.startswith("States.")


class TaskTokens:
    """Step Functions' side of task tokens: a ``TaskCallback`` (SendTaskSuccess / SendTaskFailure) that
    the interpreter reads when a waitForTaskToken task waits. ``while_waiting(token)`` plays the person
    (clicks a link, runs the CLI) after the task's Lambda returned; no answer = the task times out."""

    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[str, Any]] = {}
        self.issued: list[str] = []
        self.while_waiting: Callable[[str], None] = lambda _token: None

    def succeed(self, task_token: str, output: Any) -> bool:
        if task_token not in self.issued or task_token in self.outcomes:
            return False  # TaskDoesNotExist / TaskTimedOut
        self.outcomes[task_token] = ("success", dict(output))
        return True

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        if task_token not in self.issued or task_token in self.outcomes:
            return False
        self.outcomes[task_token] = ("failure", (error, cause))
        return True


@dataclass
class Execution:
    """The outcome of one interpreted execution."""

    status: str  # SUCCEEDED | FAILED | TIMED_OUT
    output: Any
    error: str | None = None
    cause: str | None = None
    states: list[str] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)


class AslInterpreter:
    """Runs an ASL document; ``invoke(function_arn, payload)`` plays Lambda; time is the fake clock's."""

    def __init__(
        self,
        definition: dict[str, Any],
        invoke: Callable[[str, dict[str, Any]], Any],
        clock: FakeClock,
        *,
        invoke_latency_s: float = 0.2,
        max_transitions: int = 50_000,
        tokens: TaskTokens | None = None,
    ) -> None:
        self.tokens = tokens or TaskTokens()
        self.definition = definition
        self.invoke = invoke
        self.clock = clock
        self.invoke_latency_s = invoke_latency_s
        self.max_transitions = max_transitions

    def run(self, execution_input: dict[str, Any], name: str) -> Execution:
        context = {"Execution": {"Input": execution_input, "Name": name}}
        started = self.clock()
        timeout = self.definition.get("TimeoutSeconds")
        state_name = self.definition["StartAt"]
        document: Any = execution_input
        run = Execution("RUNNING", None)
        for _ in range(self.max_transitions):
            if timeout is not None and self.clock() - started > timeout:
                return self._end(run, "TIMED_OUT", None, "States.Timeout", "execution timed out")
            state = self.definition["States"][state_name]
            run.states.append(state_name)
            kind = state["Type"]
            if kind == "Succeed":
                return self._end(run, "SUCCEEDED", document)
            if kind == "Fail":
                return self._end(run, "FAILED", None, state.get("Error"), state.get("Cause"))
            if kind == "Wait":
                seconds = (
                    state["Seconds"] if "Seconds" in state else _get(document, state["SecondsPath"], context)
                )
                assert isinstance(seconds, int) and seconds >= 0, (
                    f"Wait needs a non-negative integer, got {seconds!r}"
                )
                self.clock.advance(seconds)
                state_name = state["Next"]
                continue
            if kind == "Choice":
                state_name = next(
                    (rule["Next"] for rule in state["Choices"] if _matches(rule, document, context)),
                    state.get("Default"),
                )
                if state_name is None:
                    return self._end(run, "FAILED", None, "States.NoChoiceMatched", "")
                continue
            assert kind == "Task", f"state type not supported by the test interpreter: {kind}"
            try:
                document = self._task(state, document, context, run)
                state_name = state["Next"]
            except StatesError as exc:
                catcher = next(
                    (c for c in state.get("Catch", []) if _error_matches(c["ErrorEquals"], exc.error)), None
                )
                if catcher is None:
                    return self._end(run, "FAILED", None, exc.error, exc.cause)
                document = _set(
                    document, catcher.get("ResultPath", "$"), {"Error": exc.error, "Cause": exc.cause}
                )
                state_name = catcher["Next"]
        raise AssertionError("the state machine did not end within max_transitions")

    @staticmethod
    def _end(
        run: Execution, status: str, output: Any, error: str | None = None, cause: str | None = None
    ) -> Execution:
        run.status, run.output, run.error, run.cause = status, output, error, cause
        return run

    def _task(self, state: dict[str, Any], document: Any, context: dict[str, Any], run: Execution) -> Any:
        assert state["Resource"] in (LAMBDA_INVOKE, WAIT_FOR_TOKEN)
        waits = state["Resource"] == WAIT_FOR_TOKEN
        token = ""
        if waits:
            token = f"task-token-{len(self.tokens.issued)}"
            self.tokens.issued.append(token)
            context = {**context, "Task": {"Token": token}}
        params = _template(state.get("Parameters", {}), document, context)
        attempts: dict[int, int] = {}
        while True:
            try:
                payload = self._invoke_once(params, run)
                break
            except StatesError as exc:
                index = next(
                    (
                        i
                        for i, r in enumerate(state.get("Retry", []))
                        if _error_matches(r["ErrorEquals"], exc.error)
                    ),
                    None,
                )
                if index is None:
                    raise
                retrier = state["Retry"][index]
                done = attempts.get(index, 0)
                if done >= retrier.get("MaxAttempts", 3):
                    raise
                attempts[index] = done + 1
                run.retried.append(exc.error)
                self.clock.advance(
                    retrier.get("IntervalSeconds", 1) * retrier.get("BackoffRate", 2.0) ** done
                )
        result: Any = {"Payload": payload, "StatusCode": 200}
        if waits:
            result = self._wait_for(state, document, context, token)
        if "ResultSelector" in state:
            result = _template(state["ResultSelector"], result, context)
        document = _set(document, state.get("ResultPath", "$"), result)
        if "OutputPath" in state:
            document = _get(document, state["OutputPath"], context)
        return document

    def _wait_for(self, state: dict[str, Any], document: Any, context: dict[str, Any], token: str) -> Any:
        """The output of SendTaskSuccess, a SendTaskFailure's error, or States.Timeout after the timeout."""
        self.tokens.while_waiting(token)
        outcome = self.tokens.outcomes.get(token)
        if outcome is None:
            timeout = state.get("TimeoutSeconds")
            if "TimeoutSecondsPath" in state:
                timeout = _get(document, state["TimeoutSecondsPath"], context)
            assert isinstance(timeout, int) and timeout > 0, (
                f"TimeoutSeconds must be a positive int: {timeout!r}"
            )
            self.clock.advance(timeout)
            self.tokens.outcomes[token] = ("timeout", None)  # a late callback finds the task gone
            raise StatesError("States.Timeout", "the task timed out")
        kind, value = outcome
        if kind == "failure":
            raise StatesError(*value)
        return value

    def _invoke_once(self, params: dict[str, Any], run: Execution) -> Any:
        payload = copy.deepcopy(params["Payload"])
        run.invocations.append(payload)
        self.clock.advance(self.invoke_latency_s)
        try:
            answer = self.invoke(params["FunctionName"], payload)
        except Exception as exc:
            error = getattr(exc, "error_name", type(exc).__name__)
            cause = json.dumps({"errorMessage": str(exc), "errorType": error})
            raise StatesError(error, cause) from exc
        # The answer crosses the wire as JSON, as Lambda's does.
        return json.loads(json.dumps(answer))


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
def drain_world(drain_timeout: int = 600) -> Iterator[World]:
    """The drain handler behind the ASL interpreter, over in-memory ports (one idle node, one ASG)."""
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
        DrainDeps(cluster, scaler, IdleAssessor(), state, policy, dry_run=False, clock=clock.now)
    )
    handler = drain_handler()
    context = LambdaContext()

    def invoke(function_arn: str, payload: dict[str, Any]) -> Any:
        assert function_arn == DRAIN_ARN
        return handler(payload, context)

    use_drain_workflow(workflow)
    try:
        yield World(clock, cluster, scaler, state, workflow, AslInterpreter(load_asl(), invoke, clock))
    finally:
        use_drain_workflow(None)


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
    from rightsizer.handler_support import _output
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
