"""Shared plumbing of the Lambda handlers (design §6, style guide "Handlers (≤ 15 lines)").

- :class:`Settings` — the deployment's environment (``RIGHTSIZER_*``, set by ``template.yaml``), validated
  once per invocation (cheap) and used as the cache key of the dependencies;
- :func:`load_config` — ``Settings`` → the same :class:`~rightsizer.config.Config` the CLI reads from YAML,
  the policy fetched from SSM through Powertools Parameters (cached for ``PARAMETER_MAX_AGE_S``);
- :func:`act_deps` / :func:`assessment_deps` — dependencies built once per cold start (per settings);
  EKS tokens are not built here: the Kubernetes adapter mints one per request as needed and on a 401;
- the event models: :class:`ScheduledTick` (the EventBridge Scheduler ``Input`` of design §6) and the drain
  state machine's task payloads (:data:`DrainTask`);
- :func:`run_drain_task` — one state machine task → one ``DrainWorkflow`` call → the JSON the ASL reads;
- :func:`traced` — X-Ray only when ``RIGHTSIZER_TRACING=true`` (the Tracer costs ~0.7 s of import).

Nothing here imports boto3, Kubernetes or Powertools utilities at import time: handlers stay cheap to
load and the webhook never pulls in Kubernetes.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar, cast

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rightsizer.domain.errors import ConfigError, TransientError

if TYPE_CHECKING:
    from rightsizer.config import Config
    from rightsizer.services.assess import AssessmentDeps
    from rightsizer.services.drain import DrainWorkflow, StepResult
    from rightsizer.services.offhours import OffhoursDeps
    from rightsizer.wiring import ActDeps

__all__ = [
    "METRICS_NAMESPACE",
    "PARAMETER_MAX_AGE_S",
    "STATE_MACHINE_MARGIN_S",
    "STATE_MACHINE_TIMEOUT_S",
    "DrainTask",
    "RollbackTask",
    "ScheduledTick",
    "Settings",
    "StartTask",
    "StepTask",
    "act_deps",
    "assessment_deps",
    "clear_caches",
    "drain_metrics",
    "drain_workflow",
    "emit_dimensioned",
    "load_config",
    "offhours_deps",
    "parse_drain_task",
    "run_drain_task",
    "traced",
    "use_drain_workflow",
]

#: CloudWatch namespace of every EMF metric.
METRICS_NAMESPACE: Final = "GPURightsizer"
#: Powertools Parameters cache lifetime for the policy and the webhook token (seconds).
PARAMETER_MAX_AGE_S: Final = 300
#: The drain state machine's ``TimeoutSeconds`` (infra/statemachine/drain.asl.json; a test compares).
STATE_MACHINE_TIMEOUT_S: Final = 7200
# drain_timeout + lease margin (5 min) + verify (5 min) + retries must fit the state machine's timeout.
STATE_MACHINE_MARGIN_S: Final = 1800

F = TypeVar("F", bound=Callable[..., Any])


def _truthy(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


class Settings(BaseModel):
    """The deployment's settings, from ``RIGHTSIZER_*`` environment variables (template parameters).

    Empty strings count as unset: CloudFormation passes ``""`` for optional parameters.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_name: str = Field(description="EKS cluster name (RIGHTSIZER_CLUSTER_NAME).")
    region: str = Field(description="AWS region (AWS_REGION, set by Lambda).")
    table: str | None = Field(None, description="DynamoDB state table (RIGHTSIZER_TABLE).")
    dry_run: bool = Field(True, description="Template parameter DryRun (RIGHTSIZER_DRY_RUN).")
    prometheus_url: str = Field("http://127.0.0.1:9090", description="RIGHTSIZER_PROMETHEUS_URL.")
    prometheus_auth: Literal["none", "bearer", "basic", "sigv4"] = "none"
    prometheus_secret: str | None = Field(
        None, description="Secret reference (RIGHTSIZER_PROMETHEUS_SECRET)."
    )
    prometheus_username: str | None = None
    node_label: str | None = None
    policy_parameter: str | None = Field(None, description="SSM parameter with the policy YAML.")
    policy_inline: str | None = Field(None, description="The policy as YAML/JSON text.")
    offhours: str | None = Field(None, description="Off-hours section as YAML/JSON text.")
    state_machine_arn: str | None = Field(
        None, description="Drain state machine (RIGHTSIZER_STATE_MACHINE_ARN)."
    )
    webhook_token_secret: str | None = Field(
        None, description="Secrets Manager secret with the bearer token."
    )
    aws_endpoint_url: str | None = Field(None, description="Endpoint override for every client (tests).")
    kube_context: str | None = Field(None, description="kubeconfig context instead of EKS auth (tests).")
    kubeconfig: str | None = Field(None, description="kubeconfig path with kube_context (KUBECONFIG).")
    tracing: bool = Field(False, description="X-Ray via Powertools Tracer (RIGHTSIZER_TRACING).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``).

        Raises:
            ConfigError: a required variable is missing or a value is invalid (names the variable).
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value is not None and value.strip() != "" else None

        values: dict[str, Any] = {
            "cluster_name": get("RIGHTSIZER_CLUSTER_NAME"),
            "region": get("RIGHTSIZER_REGION") or get("AWS_REGION") or get("AWS_DEFAULT_REGION"),
            "table": get("RIGHTSIZER_TABLE"),
            "dry_run": _truthy(env.get("RIGHTSIZER_DRY_RUN"), True),
            "prometheus_url": get("RIGHTSIZER_PROMETHEUS_URL") or "http://127.0.0.1:9090",
            "prometheus_auth": get("RIGHTSIZER_PROMETHEUS_AUTH") or "none",
            "prometheus_secret": get("RIGHTSIZER_PROMETHEUS_SECRET"),
            "prometheus_username": get("RIGHTSIZER_PROMETHEUS_USERNAME"),
            "node_label": get("RIGHTSIZER_NODE_LABEL"),
            "policy_parameter": get("RIGHTSIZER_POLICY_PARAMETER"),
            "policy_inline": get("RIGHTSIZER_POLICY_INLINE"),
            "offhours": get("RIGHTSIZER_OFFHOURS"),
            "state_machine_arn": get("RIGHTSIZER_STATE_MACHINE_ARN"),
            "webhook_token_secret": get("RIGHTSIZER_WEBHOOK_TOKEN_SECRET"),
            "aws_endpoint_url": get("RIGHTSIZER_AWS_ENDPOINT_URL"),
            "kube_context": get("RIGHTSIZER_KUBE_CONTEXT"),
            "kubeconfig": get("KUBECONFIG"),
            "tracing": _truthy(env.get("RIGHTSIZER_TRACING"), False),
        }
        names = {
            "cluster_name": "RIGHTSIZER_CLUSTER_NAME",
            "region": "AWS_REGION",
            "prometheus_auth": "RIGHTSIZER_PROMETHEUS_AUTH",
        }
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else "<env>"
            raise ConfigError(err["msg"], source="environment", field=names.get(key, key)) from exc


# --------------------------------------------------------------------------------------------------
# Settings → Config (the same model the CLI reads from YAML)
# --------------------------------------------------------------------------------------------------


def _yaml(text: str | None, *, source: str) -> dict[str, Any]:
    import yaml

    if text is None:
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML/JSON: {exc}", source=source) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping", source=source)
    return data


def _ssm_parameter(settings: Settings, name: str) -> str:
    """The parameter's value (decrypted), cached by Powertools Parameters for ``PARAMETER_MAX_AGE_S``."""
    import boto3
    from aws_lambda_powertools.utilities.parameters import SSMProvider

    client = boto3.session.Session(region_name=settings.region).client(
        "ssm", endpoint_url=settings.aws_endpoint_url
    )
    try:
        value = SSMProvider(boto3_client=client).get(name, max_age=PARAMETER_MAX_AGE_S, decrypt=True)
    except Exception as exc:  # Powertools wraps every SDK failure in GetParameterError
        raise ConfigError(f"cannot read SSM parameter {name}: {exc}", field="PolicyParameterName") from exc
    return str(value)


def load_config(settings: Settings, *, fetch: Callable[[Settings, str], str] = _ssm_parameter) -> Config:
    """The :class:`~rightsizer.config.Config` of this deployment.

    The policy comes from the SSM parameter when one is named (``fetch`` reads it), else from the inline
    text; the off-hours section from ``RIGHTSIZER_OFFHOURS``.

    Raises:
        ConfigError: the policy or the off-hours text is invalid, or the policy's ``drain_timeout`` does not
            fit the state machine's overall timeout (names the source and the field).
    """
    from rightsizer.config import Config
    from rightsizer.domain.policy import load_policy

    if settings.policy_parameter:
        source = f"ssm:{settings.policy_parameter}"
        policy_doc = _yaml(fetch(settings, settings.policy_parameter), source=source)
    else:
        source = "RIGHTSIZER_POLICY_INLINE"
        policy_doc = _yaml(settings.policy_inline, source=source)
    policy = load_policy(policy_doc, source=source)
    if policy.drain_timeout + STATE_MACHINE_MARGIN_S > STATE_MACHINE_TIMEOUT_S:
        raise ConfigError(
            f"drain_timeout {policy.drain_timeout}s leaves less than {STATE_MACHINE_MARGIN_S}s of the drain "
            f"state machine's {STATE_MACHINE_TIMEOUT_S}s timeout",
            source=source,
            field="drain_timeout",
        )
    cluster: dict[str, Any] = {"name": settings.cluster_name, "region": settings.region}
    if settings.kube_context:
        cluster.update(context=settings.kube_context, kubeconfig=settings.kubeconfig)
    document: dict[str, Any] = {
        "cluster": cluster,
        "prometheus": {
            "url": settings.prometheus_url,
            "auth": settings.prometheus_auth,
            "secret": settings.prometheus_secret,
            "username": settings.prometheus_username,
            "node_label": settings.node_label,
        },
        "aws": {
            "region": settings.region,
            "endpoint_url": settings.aws_endpoint_url,
            "table": settings.table,
        },
        "policy": policy,
        "offhours": _yaml(settings.offhours, source="RIGHTSIZER_OFFHOURS"),
        "webhook": {"token_secret": settings.webhook_token_secret},
    }
    try:
        return Config.model_validate(document)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or "<root>"
        raise ConfigError(err["msg"], source="environment", field=field) from exc


# --------------------------------------------------------------------------------------------------
# Dependencies, once per cold start
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def act_deps(settings: Settings) -> ActDeps:
    """The act side (Kubernetes, AWS, Prometheus, DynamoDB, drain workflow), built once per settings."""
    from rightsizer.wiring import build_act_deps

    return build_act_deps(load_config(settings), dry_run=settings.dry_run)


@functools.lru_cache(maxsize=4)
def assessment_deps(settings: Settings) -> AssessmentDeps:
    """The scheduled assessment's dependencies (the act side plus the Step Functions starter).

    Raises:
        ConfigError: no ``RIGHTSIZER_STATE_MACHINE_ARN``.
    """
    from rightsizer.services.assess import AssessmentDeps
    from rightsizer.wiring import build_plan_history, build_workflow_starter

    if not settings.state_machine_arn:
        raise ConfigError("the drain state machine is required", field="RIGHTSIZER_STATE_MACHINE_ARN")
    deps = act_deps(settings)
    return AssessmentDeps(
        plans=build_plan_history(deps.config),
        cluster_name=settings.cluster_name,
        observe=deps.observe,
        policy=deps.policy,
        cluster=deps.cluster,
        state=deps.state,
        starter=build_workflow_starter(deps.config, settings.state_machine_arn),
        node_label=deps.config.prometheus.node_label,
    )


@functools.lru_cache(maxsize=4)
def offhours_deps(settings: Settings) -> OffhoursDeps:
    """The off-hours tick's dependencies: the act side, the EKS node group sizer, and drains through the
    state machine (a drain that outlives this invocation goes on there; the next tick sees it in flight).

    Raises:
        ConfigError: no ``RIGHTSIZER_STATE_MACHINE_ARN``.
    """
    from rightsizer.services.offhours import OffhoursDeps
    from rightsizer.wiring import build_nodegroup_sizer, build_workflow_starter

    if not settings.state_machine_arn:
        raise ConfigError("the drain state machine is required", field="RIGHTSIZER_STATE_MACHINE_ARN")
    deps = act_deps(settings)
    return OffhoursDeps(
        cluster=settings.cluster_name,
        config=deps.config.offhours,
        policy=deps.policy,
        nodes=deps.observers.cluster,
        sizer=build_nodegroup_sizer(deps.config),
        scaler=deps.scaler,
        assessor=deps.workflow.deps.assessor,
        state=deps.state,
        starter=build_workflow_starter(deps.config, settings.state_machine_arn),
        dry_run=settings.dry_run,
    )


_workflow_override: list[DrainWorkflow] = []


def use_drain_workflow(workflow: DrainWorkflow | None) -> None:
    """Make the drain handler use ``workflow`` (the ASL interpreter test over in-memory fakes, a local
    runner); ``None`` goes back to building it from the environment."""
    _workflow_override[:] = [] if workflow is None else [workflow]


def drain_workflow() -> DrainWorkflow:
    """The drain handler's workflow: the injected one, else built from the environment (cached)."""
    if _workflow_override:
        return _workflow_override[0]
    return act_deps(Settings.from_env()).workflow


def clear_caches() -> None:
    """Forget the cached dependencies (tests switch endpoints between cases)."""
    act_deps.cache_clear()
    assessment_deps.cache_clear()
    offhours_deps.cache_clear()


# --------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------


class ScheduledTick(BaseModel):
    """The EventBridge Scheduler ``Input`` of design §6: ``<aws.scheduler.scheduled-time>`` (RFC 3339 UTC)
    and ``<aws.scheduler.execution-id>`` (stable across the retries of one invocation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduled_time: AwareDatetime
    execution_id: str = Field(min_length=1)


class DrainRequestModel(BaseModel):
    """The drain state machine's execution input: a ``DrainRequest`` as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1)
    execution_id: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9._-]+$")
    trigger: str = "schedule"
    hourly_savings_usd: float | None = None
    offhours: bool = False
    target_type: str | None = Field(
        None, min_length=1, description="Set for a resize of a standalone instance (issue 17)."
    )


class StartTask(BaseModel):
    """State ``Start``: create the workflow record from the execution input (idempotent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["start"]
    request: DrainRequestModel


class StepTask(BaseModel):
    """State ``Step``: run the record's current step once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["step"]
    execution_id: str = Field(min_length=1)


class StateError(BaseModel):
    """A Catch's ``{"Error", "Cause"}``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    Error: str = "States.ALL"
    Cause: str = ""


class RollbackTask(BaseModel):
    """State ``Rollback``: a step failed after its retries; undo our cordon, never scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["rollback"]
    execution_id: str = Field(min_length=1)
    error: StateError | None = None


DrainTask = Annotated[StartTask | StepTask | RollbackTask, Field(discriminator="action")]
_DRAIN_TASK: TypeAdapter[StartTask | StepTask | RollbackTask] = TypeAdapter(DrainTask)


def parse_drain_task(event: Mapping[str, Any]) -> StartTask | StepTask | RollbackTask:
    """Validate a drain state machine task payload (``action`` = ``start`` | ``step`` | ``rollback``)."""
    return _DRAIN_TASK.validate_python(event)


def _output(result: StepResult) -> dict[str, Any]:
    # Wait.SecondsPath needs a non-negative integer; round up so a poll never comes early.
    return {
        "execution_id": result.execution_id,
        "step": result.step,
        "next_step": result.next_step,
        "status": result.status,
        "wait_seconds": math.ceil(result.wait_seconds),
        "message": result.message,
    }


def run_drain_task(workflow: DrainWorkflow, task: StartTask | StepTask | RollbackTask) -> dict[str, Any]:
    """Run one state machine task and return the fields the ASL's ``ResultSelector`` reads.

    Raises:
        TransientError: exactly that class (its name is the ``Error`` the ASL's Retry matches), whatever
            subclass the adapter raised; the record is unchanged, so the retry runs the same step.
    """
    from rightsizer.services.drain import FINAL_STATUSES, DrainRequest, StepResult
    from rightsizer.services.resize import ResizeRequest

    try:
        if isinstance(task, StartTask):
            fields = task.request.model_dump()
            target = fields.pop("target_type")
            request = (
                DrainRequest(**fields) if target is None else ResizeRequest(**fields, target_type=target)
            )
            record = workflow.start(request)
            running = record.status not in FINAL_STATUSES
            nxt = record.step if running else None
            return _output(StepResult(record.execution_id, "start", nxt, record.status, 0.0, "started"))
        if isinstance(task, StepTask):
            result = workflow.step(task.execution_id)
            output = _output(result)
            if result.finished and result.status == "succeeded":
                saved = workflow.deps.state.load(task.execution_id)
                output["hourly_savings_usd"] = saved.details.get("hourly_savings_usd") if saved else None
            return output
        error = task.error or StateError()
        reason = f"failed:{error.Error}:{error.Cause[:200]}".rstrip(":")
        try:
            return _output(workflow.rollback(task.execution_id, reason, status="failed"))
        except KeyError:
            return _output(
                StepResult(task.execution_id, "rollback", None, "failed", 0.0, "no workflow record")
            )
    except TransientError as exc:
        if type(exc) is TransientError:
            raise
        raise TransientError(f"{type(exc).__name__}: {exc}", retry_after=exc.retry_after) from exc


# --------------------------------------------------------------------------------------------------
# Observability
# --------------------------------------------------------------------------------------------------


def drain_metrics(output: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """EMF metrics ``(name, unit, value)`` of one drain task's output: the milestones — node cordoned,
    drained, removed (with the USD/h it saves) — and the failure classes the template's alarms watch:
    ``DrainsRolledBack`` (status ``rolled_back``), ``DrainsFailed`` (``failed``) and ``RollbackFailures``
    (a rollback that could not undo our cordon, ``services.drain.UNCORDON_PENDING`` in its message)."""
    from rightsizer.services.drain import UNCORDON_PENDING

    step, nxt, status = output.get("step"), output.get("next_step"), output.get("status")
    found: list[tuple[str, str, float]] = []
    if step == "cordon" and nxt == "revalidate":
        found.append(("NodesCordoned", "Count", 1.0))
    if step == "wait" and nxt == "remove":
        found.append(("NodesDrained", "Count", 1.0))
    if nxt is None and status == "succeeded":
        found.append(("NodesRemoved", "Count", 1.0))
        found.append(("SavedUsdPerHour", "None", float(output.get("hourly_savings_usd") or 0.0)))
    if nxt is None and status == "rolled_back":
        found.append(("DrainsRolledBack", "Count", 1.0))
    if nxt is None and status == "failed":
        found.append(("DrainsFailed", "Count", 1.0))
    if nxt is None and UNCORDON_PENDING in str(output.get("message") or ""):
        found.append(("RollbackFailures", "Count", 1.0))
    return found


def emit_dimensioned(service: str, metric: Mapping[str, Any]) -> None:
    """Print one EMF document for ``metric`` (``{"name", "unit", "value", "dimensions"}``) with its own
    dimensions plus ``service`` — a series per node group, beside the handler's per-cluster total that
    the alarms watch (an EMF document has one set of dimension values)."""
    from aws_lambda_powertools.metrics import single_metric

    dimensions = {"service": service, **{str(k): str(v) for k, v in metric.get("dimensions", {}).items()}}
    with single_metric(
        name=str(metric["name"]),
        unit=metric["unit"],
        value=float(metric["value"]),
        namespace=METRICS_NAMESPACE,
        default_dimensions=dimensions,
    ):
        pass


def traced(handler: F) -> F:
    """Wrap ``handler`` with Powertools Tracer only when ``RIGHTSIZER_TRACING`` is true (decided at import
    of the handler module, i.e. once per cold start); otherwise return it unchanged, Tracer not imported."""
    if not _truthy(os.environ.get("RIGHTSIZER_TRACING"), False):
        return handler
    from aws_lambda_powertools import Tracer

    return cast(F, Tracer().capture_lambda_handler(handler))


def tick_time(tick: ScheduledTick) -> datetime:
    """The tick's instant as an aware datetime (the handlers' ``now``: time comes from the event)."""
    return tick.scheduled_time
