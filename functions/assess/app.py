"""Lambda ``assess``: the scheduled assessment (EventBridge Scheduler, docs/architecture.md §2 and §6).

Heals expired drain leases, plans the cluster at the tick's ``scheduled_time`` and starts one drain state
machine execution per ``scale_in`` action, named deterministically from the tick's ``execution_id`` so a
retried tick cannot start a drain twice (:func:`rightsizer.services.assess.run_assessment`). Logs one decision
record per GPU node (message ``decision``, key ``decision``: the shipped Logs Insights queries read them).
A run that fails (Prometheus unavailable past ``prometheus.deadline``, most metric queries failed,
``MetricsFailed``) emits ``AssessmentsFailed`` (``AssessmentsFailedAlarm``) and raises (Lambda ``Errors``).

Cold start (issue 33): the module imports the logger, the metrics and the event model only; the
assessment, the composition root and the SDKs are imported by the first request.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from rightsizer import logsafety
from rightsizer.handler_io import (
    METRICS_NAMESPACE,
    ScheduledTick,
    emit_dimensioned,
    showback_metrics,
    traced,
)

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service="assess")
# No log level prints a credential: SDK loggers floored at INFO, every handler redacts (issue 14).
logsafety.install([logger.registered_handler])
metrics = Metrics(namespace=METRICS_NAMESPACE, service="assess")


def _sharded(runtime: Any, event: ScheduledTick) -> str | None:
    """The sharded run started for this tick, or None (no sharding configured, or a small cluster)."""
    if not os.environ.get("RIGHTSIZER_SHARD_STATE_MACHINE_ARN"):
        return None  # imported only where sharding is deployed: the cold start stays as it was
    from rightsizer.wiring.shards import ShardSettings, start_if_large

    return start_if_large(runtime, ShardSettings(), event.scheduled_time, event.execution_id)


@logger.inject_lambda_context(correlation_id_path="execution_id", clear_state=True)
@metrics.log_metrics
@traced
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Assess at the tick's ``scheduled_time``; returns the :class:`AssessmentSummary` as JSON.

    Raises:
        pydantic.ValidationError: the event is no :class:`ScheduledTick`.
    """
    from rightsizer.domain.decisions import DECISION_LOG_MESSAGE
    from rightsizer.domain.errors import RightsizerError
    from rightsizer.services.assess import run_assessment
    from rightsizer.wiring import lambda_runtime

    event = ScheduledTick.model_validate(raw)
    metrics.add_metric(name="AssessInvocations", unit=MetricUnit.Count, value=1)  # flushed even on failure
    runtime = lambda_runtime()
    deps = runtime.assessment()
    metrics.add_dimension(name="cluster", value=deps.cluster_name)
    try:
        # Over ``ShardAboveGpuNodes`` GPU nodes the run is sharded: the state machine assesses (issue 33).
        sharded = _sharded(runtime, event)
        if sharded is not None:
            logger.info("assessment sharded", extra={"execution": sharded})
            return {"sharded": sharded}
        summary = run_assessment(deps, event.scheduled_time, event.execution_id)
    except RightsizerError as exc:
        # a failed run is loud: its own metric (AssessmentsFailedAlarm) beside the Lambda Errors it raises
        metrics.add_metric(name="AssessmentsFailed", unit=MetricUnit.Count, value=1)
        logger.error("assessment failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        raise
    metrics.add_metric(name="IdleNodes", unit=MetricUnit.Count, value=summary.verdicts.get("idle", 0))
    metrics.add_metric(name="DrainsStarted", unit=MetricUnit.Count, value=len(summary.started))
    metrics.add_metric(name="LeasesHealed", unit=MetricUnit.Count, value=len(summary.healed))
    metrics.add_metric(
        name="PlannedSavingsUsdPerHour", unit=MetricUnit.NoUnit, value=summary.hourly_savings_usd
    )
    metrics.add_metric(name="AssessmentDuration", unit=MetricUnit.Seconds, value=summary.duration_s)
    metrics.add_metric(name="VerdictEvents", unit=MetricUnit.Count, value=summary.events)
    for metric in showback_metrics(deps.cluster_name, summary.showback):
        emit_dimensioned("assess", metric)
    for record in summary.records:  # one line per GPU node: the shipped Logs Insights queries read them
        logger.info(DECISION_LOG_MESSAGE, extra={"decision": record.model_dump(mode="json")})
    logger.info("assessment finished", extra={"summary": summary.to_json()})
    return summary.to_json()
