"""Lambda ``fleet``: the three tasks of the fleet state machine (``infra/statemachine/fleet.asl.json``,
issue 31, docs/fleet.md), one handler each, one function and role each in ``template.yaml``:

- :func:`discover` — ``{"run": {"id", "at"}}`` → the run's manifest in S3 and the Map's settings;
- :func:`member` — ``{"target": FleetTarget, "run"}`` → one cluster's ``ClusterResult`` (never raises);
- :func:`summarize` — ``{"run", "manifest", "results"?, "map_error"?}`` → the fleet report's totals.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rightsizer import logsafety
from rightsizer.domain.fleet import FleetTarget
from rightsizer.services.fleet import ManifestRef
from rightsizer.wiring import DeploymentSettings
from rightsizer.wiring.fleet import FleetSettings, assess_member, discover_run, member_config, summarize_run
from rightsizer.wiring.runtime import policy_provider

logger = Logger(service="fleet")
logsafety.install([logger.registered_handler])
# One provider per warm container: the policy (SSM or inline) is re-read after its max_age, not per cluster.
_policy = functools.lru_cache(maxsize=2)(policy_provider)


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Run(_Event):
    """The fleet execution: its name (``$$.Execution.Name``) and start time (``$$.Execution.StartTime``)."""

    id: str = Field(min_length=1, max_length=80)
    at: AwareDatetime


class DiscoverEvent(_Event):
    run: Run


class MemberEvent(_Event):
    target: FleetTarget
    run: Run


class SummarizeEvent(_Event):
    run: Run
    manifest: ManifestRef
    results: dict[str, Any] | None = None
    map_error: dict[str, Any] | None = None


@logger.inject_lambda_context(clear_state=True)
def discover(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Write the run's manifest; returns ``{manifest, max_concurrency, tolerated_failure_percentage}``."""
    parsed = DiscoverEvent.model_validate(event)
    return discover_run(FleetSettings(), parsed.run.id)  # type: ignore[call-arg]


@logger.inject_lambda_context(clear_state=True)
def member(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Assess one cluster under its spoke role; returns its ``ClusterResult`` as JSON."""
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
