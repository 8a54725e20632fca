"""The drain state machine in process: a small interpreter for the subset of ASL that
``infra/statemachine/drain.asl.json`` uses, with ``functions/drain/app.handler`` playing its Lambda tasks.

The interpreter — Task (``lambda:invoke`` with Parameters/ResultSelector/ResultPath, Retry with backoff,
Catch; ``lambda:invoke.waitForTaskToken`` with ``$$.Task.Token`` and TimeoutSecondsPath, woken by
:class:`TaskTokens`), Choice (StringEquals, NumericGreaterThan, IsNull, And/Or/Not), Wait (SecondsPath),
Succeed, Fail, the execution's TimeoutSeconds — runs whole workflows on a fake clock, so the ASL and the
step functions cannot drift (docs/architecture.md §2). Lambda's side is simulated too: the error name of a
failed invocation is the exception's class name (as the Python runtime reports ``errorType``), a killed
invocation surfaces as ``Sandbox.Timedout``, and each invocation costs a little fake time.

:func:`drain_machine` and :func:`serving` are how a test runs a workflow (drain, resize, replacement)
through it (``tests/integration/test_statemachine.py`` tests the interpreter and the drain's ASL).
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rightsizer.handler_io import use_drain_workflow
from rightsizer.services.drain import DrainWorkflow
from rightsizer.testing.fakes import FakeClock

ROOT = Path(__file__).resolve().parents[2]
ASL_PATH = ROOT / "infra" / "statemachine" / "drain.asl.json"
DRAIN_ARN = "arn:aws:lambda:us-east-1:123456789012:function:rightsizer-drain"
LAMBDA_INVOKE = "arn:aws:states:::lambda:invoke"
WAIT_FOR_TOKEN = LAMBDA_INVOKE + ".waitForTaskToken"


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
    if path.startswith("$[") or "[" in path:
        raise AssertionError(f"JSONPath not supported by the test interpreter: {path}")
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
        s3: Any = None,
    ) -> None:
        #: A boto3 S3 client (moto): the Distributed Map's ItemReader and ResultWriter (``asl_map``).
        self.s3 = s3
        #: Every Map state's run (``asl_map.MapRun``), in order.
        self.map_runs: list[Any] = []
        self.tokens = tokens or TaskTokens()
        self.definition = definition
        self.invoke = invoke
        self.clock = clock
        self.invoke_latency_s = invoke_latency_s
        self.max_transitions = max_transitions

    def run(self, execution_input: dict[str, Any], name: str) -> Execution:
        started_at = datetime.fromtimestamp(self.clock(), UTC).isoformat().replace("+00:00", "Z")
        context = {"Execution": {"Input": execution_input, "Name": name, "StartTime": started_at}}
        return self.run_in(execution_input, context)

    def run_in(self, execution_input: Any, context: dict[str, Any]) -> Execution:
        """Run from ``StartAt`` with ``context`` as ``$$`` (a Map child runs in its parent's context)."""
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
            if kind == "Pass":
                result = (
                    _template(state["Parameters"], document, context)
                    if "Parameters" in state
                    else state.get("Result", document)
                )
                document = _set(document, state.get("ResultPath", "$"), result)
                if state.get("End"):
                    return self._end(run, "SUCCEEDED", document)
                state_name = state["Next"]
                continue
            assert kind in ("Task", "Map"), f"state type not supported by the test interpreter: {kind}"
            try:
                if kind == "Map":
                    from tests.support.asl_map import run_map

                    document = run_map(self, state, document, context, run)
                else:
                    document = self._task(state, document, context, run)
                if state.get("End"):
                    return self._end(run, "SUCCEEDED", document)
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


def drain_machine(clock: FakeClock, *, tokens: TaskTokens | None = None) -> AslInterpreter:
    """The drain state machine (its ASL as SAM deploys it) whose Lambda tasks are served in process by
    ``functions/drain/app.handler`` — with the workflow :func:`serving` installed."""
    handler, context = drain_handler(), LambdaContext()

    def invoke(function_arn: str, payload: dict[str, Any]) -> Any:
        assert function_arn == DRAIN_ARN
        return handler(payload, context)

    return AslInterpreter(load_asl(), invoke, clock, tokens=tokens)


@contextmanager
def serving(workflow: DrainWorkflow) -> Iterator[DrainWorkflow]:
    """Install ``workflow`` as the drain handler's (``handler_io.use_drain_workflow``) for the block."""
    use_drain_workflow(workflow)
    try:
        yield workflow
    finally:
        use_drain_workflow(None)
