"""Step Functions adapter of the ``WorkflowStarter`` port: one drain state machine execution per node.

The execution *name* is the drain's ``execution_id`` (deterministic, chosen by the caller), and the input
is the ``DrainRequest`` as JSON with sorted keys, so starting the same drain twice — a retried schedule
tick, a re-delivered alert — is a no-op: Step Functions answers the same execution for the same name and
input, and ``ExecutionAlreadyExists`` when the name was used with another input or has closed; both mean
"already started".

:class:`StepFunctionsCallback` wakes a drain waiting for a person's approval (``SendTaskSuccess`` /
``SendTaskFailure`` with the task token the ``AwaitApproval`` state handed out).

IAM actions: ``states:StartExecution`` on the drain state machine (the assess, webhook and off-hours
functions); ``states:SendTaskSuccess`` and ``states:SendTaskFailure`` on it (the webhook; the CLI with
the operator's credentials).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from rightsizer.adapters.aws_errors import map_aws_error
from rightsizer.adapters.sdk_errors import SDK_ERRORS

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions.client import SFNClient

__all__ = [
    "EXECUTION_NAME_MAX",
    "StepFunctionsCallback",
    "StepFunctionsStarter",
    "execution_name",
    "execution_name_ok",
]

#: The AWS actions this module calls: on the drain state machine only.
IAM_ACTIONS: Final = frozenset({"states:StartExecution", "states:SendTaskSuccess", "states:SendTaskFailure"})
#: Answers meaning the waiting task is gone (timed out, execution ended or the token is not ours).
_TASK_GONE: Final = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})

#: Step Functions execution names: 1-80 characters, no whitespace, brackets, wildcards or punctuation
#: other than ``-``, ``_`` and ``.`` (we allow only those, which is always accepted).
EXECUTION_NAME_MAX: Final = 80
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


def execution_name_ok(name: str) -> bool:
    """True when ``name`` is usable as a Step Functions execution name (and thus as our execution id)."""
    return bool(_NAME.match(name))


def execution_name(execution_id: str, resume: int = 0) -> str:
    """The execution name of a request: its execution id, or for the healer's n-th restart of a resize
    (``resume`` n > 0; names are unique per state machine) ``<execution id>-r<n>``, the id cut to fit 80."""
    if resume <= 0:
        return execution_id
    suffix = f"-r{resume}"
    return execution_id[: EXECUTION_NAME_MAX - len(suffix)] + suffix


class StepFunctionsStarter:
    """Starts the drain state machine; ``start`` is idempotent per execution id.

    Args:
        client: a Step Functions client (standard retries).
        state_machine_arn: the drain state machine (template output ``DrainStateMachineArn``).
    """

    def __init__(self, client: SFNClient, state_machine_arn: str) -> None:
        self._client = client
        self._arn = state_machine_arn

    def start(self, request: Any) -> str:
        """``StartExecution(name=execution_name(request.execution_id, request.resume), input=<the request
        as JSON>)``.

        Args:
            request: a ``rightsizer.services.drain.DrainRequest``.

        Returns:
            The execution id, whether started now or before.

        Raises:
            ValueError: the execution id is not a valid execution name.
            TransientError / PermanentError: the call failed (throttling and 5xx / access denied).
        """
        name = execution_name(str(request.execution_id), int(getattr(request, "resume", 0) or 0))
        if not execution_name_ok(name):
            raise ValueError(f"execution id {name!r} is not a valid Step Functions execution name")
        document = json.dumps(dataclasses.asdict(request), sort_keys=True, separators=(",", ":"))
        try:
            self._client.start_execution(stateMachineArn=self._arn, name=name, input=document)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
                return str(request.execution_id)
            raise map_aws_error(exc, "StartExecution") from exc
        except SDK_ERRORS as exc:
            raise map_aws_error(exc, "StartExecution") from exc
        return str(request.execution_id)


class StepFunctionsCallback:
    """``TaskCallback`` of :mod:`rightsizer.services.approval` over the Step Functions API."""

    def __init__(self, client: SFNClient) -> None:
        self._client = client

    def _send(self, operation: str, call: Any, **kwargs: Any) -> bool:
        try:
            call(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _TASK_GONE:
                return False
            raise map_aws_error(exc, operation) from exc
        except SDK_ERRORS as exc:
            raise map_aws_error(exc, operation) from exc
        return True

    def succeed(self, task_token: str, output: Mapping[str, Any]) -> bool:
        """``SendTaskSuccess``; False when the task is gone (``TaskTimedOut``, ``TaskDoesNotExist``,
        ``InvalidToken``).

        Raises:
            TransientError / PermanentError: throttling and 5xx / access denied.
        """
        document = json.dumps(dict(output), sort_keys=True, separators=(",", ":"))
        return self._send(
            "SendTaskSuccess", self._client.send_task_success, taskToken=task_token, output=document
        )

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        """``SendTaskFailure`` with ``error`` (≤ 256 characters) and ``cause``; False when the task is gone."""
        return self._send(
            "SendTaskFailure",
            self._client.send_task_failure,
            taskToken=task_token,
            error=error[:256],
            cause=cause[:32768],
        )
