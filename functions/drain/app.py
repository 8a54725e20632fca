"""Lambda ``drain``: one task of the drain state machine (``infra/statemachine/drain.asl.json``).

``{"action": "start", "request": {...}}`` creates the workflow record, ``{"action": "step",
"execution_id"}`` runs the record's current step once (``DrainWorkflow.step``), ``{"action": "rollback",
"execution_id", "error"}`` undoes our cordon after a step failed its retries. Every step is persisted before
it returns, and waits happen in the state machine, so no invocation nears the Lambda limit and a killed one
resumes from the saved step when retried (BUG-32). A ``TransientError`` leaves as exactly that error name,
which the state machine's Retry matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from rightsizer import logsafety
from rightsizer.domain.errors import TransientError
from rightsizer.handler_io import (
    METRICS_NAMESPACE,
    drain_metrics,
    drain_workflow,
    parse_drain_task,
    run_drain_task,
    traced,
)

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service="drain")
# No log level prints a credential: SDK loggers floored at INFO, every handler redacts (issue 14).
logsafety.install([logger.registered_handler])
metrics = Metrics(namespace=METRICS_NAMESPACE, service="drain")


@logger.inject_lambda_context(correlation_id_path="execution_id || request.execution_id", clear_state=True)
@metrics.log_metrics
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Run one drain task; returns ``{execution_id, step, next_step, status, wait_seconds, message}``."""
    # Counted first: a metric is flushed even when the step raises (an empty flush only warns).
    metrics.add_metric(name="DrainInvocations", unit=MetricUnit.Count, value=1)
    task = parse_drain_task(event)
    workflow = drain_workflow()
    metrics.add_dimension(name="cluster", value=workflow.deps.state.cluster)
    try:
        output = run_drain_task(workflow, task)
    except TransientError:
        raise  # the state machine retries it; exhausted retries show as a failed execution
    except Exception:
        if task.action == "rollback":  # the execution ends in RollbackFailed: our cordon may remain
            metrics.add_metric(name="RollbackFailures", unit=MetricUnit.Count, value=1)
        raise
    for name, unit, value in drain_metrics(output):
        metrics.add_metric(name=name, unit=unit, value=value)
    logger.info("drain task done", extra={"task": task.action, "result": output})
    return output
