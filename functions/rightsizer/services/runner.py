"""The in-process ``WorkflowStarter``: runs drain steps in this process (CLI, demo, ``serve``, tests).

It calls exactly the step functions the Step Functions state machine calls (``Executor.step``),
waiting between them as the state machine's Wait state would, and retrying transient errors with the
delay they ask for, a bounded number of times — then the drain rolls back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Final

from rightsizer.domain.errors import RightsizerError, TransientError
from rightsizer.services.drain import FINAL_STATUSES, DrainRequest, StepResult
from rightsizer.services.workflow.executor import Executor

log = logging.getLogger(__name__)

Progress = Callable[[StepResult], None]

#: Workflows run at once in the background (``serve``); more wait their turn in a queue, so a flood of
#: alerts never becomes a flood of threads (issue 14). A drain mostly waits (eviction grace periods).
BACKGROUND_WORKERS: Final = 8


class InProcessRunner:
    """Drives drain workflows to completion in this process.

    Args:
        workflow: the drain workflow (its ports decide what is touched).
        sleep: how to wait between steps, in seconds (tests pass a fake clock's advance).
        progress: called after every step with its ``StepResult`` (live progress on stderr).
        max_transient_retries: consecutive transient failures of one step before rolling back.
        background: run workflows on a pool of ``background_workers`` threads (``serve``: the webhook
            answers at once); a workflow started while all are busy waits for one.
        background_workers: size of that pool (``BACKGROUND_WORKERS``).
        approval_poll_s: how often a drain waiting for a person's approval reads the decision (seconds;
            Step Functions is woken by the decision instead).
    """

    def __init__(
        self,
        workflow: Executor,
        *,
        sleep: Callable[[float], None] = time.sleep,
        progress: Progress | None = None,
        max_transient_retries: int = 5,
        background: bool = False,
        background_workers: int = BACKGROUND_WORKERS,
        approval_poll_s: float = 5.0,
    ) -> None:
        self.workflow = workflow
        self._sleep = sleep
        self._progress = progress
        self._retries = max_transient_retries
        self._approval_poll_s = approval_poll_s
        self.results: dict[str, StepResult] = {}
        self._pool = (
            ThreadPoolExecutor(max_workers=background_workers, thread_name_prefix="drain")
            if background
            else None
        )
        self.futures: list[Future[StepResult]] = []

    def start(self, request: DrainRequest) -> str:
        """``WorkflowStarter.start``: create the workflow and run it (now, or queued on the background pool).
        A request the workflow answers with a finished record (a superseded restart) runs nothing."""
        record = self.workflow.start(request)
        if record.status in FINAL_STATUSES:
            self.results[request.execution_id] = StepResult(
                request.execution_id, "start", None, record.status, 0.0, "nothing to run", record.details.kind
            )
            return request.execution_id
        if self._pool is not None:
            self.futures = [f for f in self.futures if not f.done()]  # results stay in self.results
            self.futures.append(self._pool.submit(self.run, request.execution_id))
        else:
            self.run(request.execution_id)
        return request.execution_id

    def run(self, execution_id: str) -> StepResult:
        """Run steps until the workflow ends; returns the final ``StepResult``."""
        failures = 0
        while True:
            try:
                result = self.workflow.step(execution_id)
            except TransientError as exc:
                failures += 1
                log.warning(
                    "drain %s: transient failure %d/%d: %s", execution_id, failures, self._retries, exc
                )
                if failures > self._retries:
                    result = self.workflow.rollback(
                        execution_id, f"failed:retries_exhausted:{exc}", status="failed"
                    )
                else:
                    self._sleep(exc.retry_after)
                    continue
            failures = 0
            if self._progress is not None:
                self._progress(result)
            if result.finished:
                self.results[execution_id] = result
                return result
            if result.next_step == "approval":
                # The state machine's AwaitApproval: publish the request once, then read the decision.
                try:
                    self.workflow.request_approval(execution_id, None)
                except RightsizerError as exc:  # not published: the next step abandons the drain
                    log.warning("drain %s: approval request failed: %s", execution_id, exc)
                self._sleep(min(result.wait_seconds, self._approval_poll_s))
            elif result.wait_seconds > 0:
                self._sleep(result.wait_seconds)

    def join(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds) for the background workflows started so far to finish."""
        wait(list(self.futures), timeout=timeout)
