"""Lambda tasks of the sharded assessment (issue 33 item 3, ``infra/statemachine/shard.asl.json``,
docs/architecture.md §2 "Sharded assessment"), one function each in ``template.yaml`` (``EnableSharding``):

- :func:`prepare` — ``{"run": {"id", "at"}}`` → take the run lock, cut the GPU nodes into shards, write them
  (``{manifest, shards, gpu_nodes, max_concurrency, locked_by}``);
- :func:`observe` — ``{"run", "shard": ShardSpec}`` → one shard's pods and series, its partial in S3;
- :func:`merge` — ``{"run"}`` → the cluster-wide facts and every partial, then the assessment (drains
  started, decisions published, the lock released); returns the ``AssessmentSummary``;
- :func:`release` — ``{"run"}`` → the lock given back after a failed run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rightsizer import logsafety
from rightsizer.domain.shard import ShardSpec

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from rightsizer.wiring.shards import ShardSettings

# The composition root and the SDKs are imported by each task's first request, not at cold start (issue 33).

logger = Logger(service="assess-shards")
logsafety.install([logger.registered_handler])


class Run(BaseModel):
    """The sharded run: its execution name (``$$.Execution.Name``) and the tick's instant (its input)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(min_length=1, max_length=80)
    at: AwareDatetime


class RunEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    run: Run


class ShardEvent(RunEvent):
    shard: ShardSpec


def _settings() -> ShardSettings:
    from rightsizer.wiring.shards import ShardSettings

    return ShardSettings()


@logger.inject_lambda_context(clear_state=True)
def prepare(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Lock, list, cut, write; the Map's settings."""
    from rightsizer.wiring import lambda_runtime
    from rightsizer.wiring.shards import prepare_run

    run = RunEvent.model_validate(event).run
    result = prepare_run(lambda_runtime(), _settings(), run.id, run.at)
    logger.info("sharded run prepared", extra={"prepared": result})
    return result


@logger.inject_lambda_context(clear_state=True)
def observe(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One shard's observation; returns its counts and the partial's key."""
    from rightsizer.wiring import lambda_runtime
    from rightsizer.wiring.shards import observe_shard

    parsed = ShardEvent.model_validate(event)
    result = observe_shard(lambda_runtime(), _settings(), parsed.run.id, parsed.run.at, parsed.shard)
    logger.info("shard observed", extra={"shard": result})
    return result


@logger.inject_lambda_context(clear_state=True)
def merge(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The merge and the assessment; returns the ``AssessmentSummary`` as JSON."""
    from rightsizer.domain.decisions import DECISION_LOG_MESSAGE
    from rightsizer.wiring import lambda_runtime
    from rightsizer.wiring.shards import merge_run

    run = RunEvent.model_validate(event).run
    summary = merge_run(lambda_runtime(), _settings(), run.id, run.at)
    for record in summary.records:  # one line per GPU node, as the unsharded assessment logs them
        logger.info(DECISION_LOG_MESSAGE, extra={"decision": record.model_dump(mode="json")})
    logger.info("assessment finished", extra={"summary": summary.to_json()})
    return summary.to_json()


@logger.inject_lambda_context(clear_state=True)
def release(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Give the run lock back after a failed run."""
    from rightsizer.wiring import lambda_runtime
    from rightsizer.wiring.shards import release_run

    run = RunEvent.model_validate(event).run
    return {"released": release_run(lambda_runtime(), run.id)}
