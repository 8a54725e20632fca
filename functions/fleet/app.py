"""Lambda ``fleet``: the three tasks of the fleet state machine (``infra/statemachine/fleet.asl.json``,
issue 31, docs/fleet.md), one handler each, one function and role each in ``template.yaml``:

- :func:`discover` — ``{"run": {"id", "at"}}`` → the run's manifest in S3 and the Map's settings;
- :func:`member` — ``{"target": FleetTarget, "run"}`` → one cluster's ``ClusterResult`` (never raises);
- :func:`summarize` — ``{"run", "manifest", "results"?, "map_error"?}`` → the fleet report's totals.

Cold start (issue 33): the module imports the logger only; the events (:mod:`fleet.events`), the
composition root and the SDKs are imported by the first request.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger

from rightsizer import logsafety

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from rightsizer.domain.fleet import FleetTarget
    from rightsizer.wiring import DeploymentSettings, PolicyProvider

logger = Logger(service="fleet")
logsafety.install([logger.registered_handler])


@functools.lru_cache(maxsize=2)
def _policy(deployment: DeploymentSettings) -> PolicyProvider:
    """One provider per warm container: the policy (SSM or inline) is re-read after its max_age, not per
    cluster."""
    from rightsizer.wiring.runtime import policy_provider

    return policy_provider(deployment)


@logger.inject_lambda_context(clear_state=True)
def discover(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Write the run's manifest; returns ``{manifest, max_concurrency, tolerated_failure_percentage}``."""
    from fleet.events import DiscoverEvent
    from rightsizer.wiring.fleet import FleetSettings, discover_run

    parsed = DiscoverEvent.model_validate(event)
    return discover_run(FleetSettings(), parsed.run.id)  # type: ignore[call-arg]


@logger.inject_lambda_context(clear_state=True)
def member(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Assess one cluster under its spoke role; returns its ``ClusterResult`` as JSON."""
    from fleet.events import MemberEvent
    from rightsizer.wiring import DeploymentSettings
    from rightsizer.wiring.fleet import FleetSettings, assess_member, member_config

    parsed = MemberEvent.model_validate(event)
    fleet = FleetSettings()  # type: ignore[call-arg]
    deployment = DeploymentSettings.from_env()
    policy = _policy(deployment).get()

    def config_for(target: FleetTarget) -> Any:
        return member_config(
            target,
            policy,
            role_name=fleet.role_name,
            external_id=fleet.external_id,
            endpoint_url=fleet.endpoint_url,
            pricing_api=deployment.pricing_api,
        )

    at: datetime = parsed.run.at
    result = assess_member(parsed.target, at, config_for)
    logger.info("cluster assessed", extra={"result": result.model_dump(mode="json")})
    return result.model_dump(mode="json")


@logger.inject_lambda_context(clear_state=True)
def summarize(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Write the fleet report (``fleet/reports/<run>.json``, ``latest.json``); returns its totals."""
    from fleet.events import SummarizeEvent
    from rightsizer.wiring.fleet import FleetSettings, summarize_run

    parsed = SummarizeEvent.model_validate(event)
    details = (parsed.results or {}).get("ResultWriterDetails") or {}
    error = parsed.map_error
    report = summarize_run(
        FleetSettings(),  # type: ignore[call-arg]
        parsed.run.id,
        parsed.run.at.isoformat(),
        parsed.manifest,
        details.get("Key"),
        f"{error.get('Error')}: {error.get('Cause')}" if error else None,
    )
    totals = report.model_dump(mode="json", exclude={"results"})
    logger.info("fleet report", extra={"report": totals})
    return totals
