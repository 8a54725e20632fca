"""Lambda ``offhours``: the off-hours convergence tick (EventBridge Scheduler rate, docs/architecture.md §4 "Off-hours").

Each tick converges every selected node group one step towards its schedule at the tick's
``scheduled_time`` (:func:`rightsizer.services.offhours.run_offhours`); drains go through the drain state
machine, restores are re-applied every tick until the nodes are Ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from rightsizer import logsafety
from rightsizer.handler_io import METRICS_NAMESPACE, ScheduledTick, emit_dimensioned, traced

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service="offhours")
# No log level prints a credential: SDK loggers floored at INFO, every handler redacts (issue 14).
logsafety.install([logger.registered_handler])
metrics = Metrics(namespace=METRICS_NAMESPACE, service="offhours")


@logger.inject_lambda_context(correlation_id_path="execution_id", clear_state=True)
@metrics.log_metrics
@traced
def handler(raw: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Converge at the tick's ``scheduled_time``; returns the off-hours report as JSON.

    Raises:
        pydantic.ValidationError: the event is no :class:`ScheduledTick`.
    """
    # Imported by the first request, not at cold start (issue 33): the module loads the logger only.
    from rightsizer.services.offhours import run_offhours
    from rightsizer.wiring import lambda_runtime

    event = ScheduledTick.model_validate(raw)
    metrics.add_metric(name="OffhoursInvocations", unit=MetricUnit.Count, value=1)  # flushed even on failure
    deps = lambda_runtime().offhours()
    metrics.add_dimension(name="cluster", value=deps.cluster)
    report = run_offhours(deps, event.scheduled_time)
    metrics.add_metric(name="OffhoursGroups", unit=MetricUnit.Count, value=len(report.groups))
    for metric in report.metrics:  # the cluster's series (alarm RestoreOverdueAlarm), then the group's own
        metrics.add_metric(name=metric["name"], unit=metric["unit"], value=metric["value"])
        emit_dimensioned("offhours", metric)
    logger.info("off-hours tick finished", extra={"report": report.to_json_dict()})
    return report.to_json_dict()
