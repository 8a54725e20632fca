"""The fleet's composition (issue 31, docs/fleet.md): settings of the fleet functions, the per-cluster
``Config`` a child assesses with (the spoke role assumed for every call about the cluster), and the three
steps the fleet state machine's Lambda tasks and ``rightsizer fleet`` run.

A child observes its cluster as the assessment does (``Runtime.observe``) and decides with the planner,
read only: the fleet decides and reports; healing, cordons and drains stay with a cluster's own stack.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.fleet import ClusterResult, FleetError, FleetReport, FleetRules, FleetTarget
from rightsizer.domain.policy import Policy
from rightsizer.services import fleet as service
from rightsizer.wiring.runtime import Runtime


class FleetSettings(BaseSettings):
    """The fleet functions' settings (``RIGHTSIZER_FLEET_*``, set by ``template.yaml`` under EnableFleet)."""

    model_config = SettingsConfigDict(env_prefix="RIGHTSIZER_FLEET_", env_ignore_empty=True, frozen=True)

    bucket: str = Field(description="The fleet bucket (manifests, Map results, reports).")
    role_name: str = Field("gpu-rightsizer-spoke", description="The spoke role's name in every account.")
    external_id: str | None = Field(None, description="The ExternalId the spoke role's trust asks for.")
    regions: str = Field("", description="Comma-separated regions to scan; empty = the hub's region.")
    accounts: str = Field("", description="Comma-separated account ids; empty = Organizations.")
    allow: str = Field("", description="Comma-separated account/region/cluster patterns to assess.")
    deny: str = Field("", description="Comma-separated account/region/cluster patterns to leave out.")
    manifest_key: str = Field("", description="An operator's manifest in the bucket instead of discovery.")
    max_concurrency: int = Field(20, ge=1, le=10_000)
    tolerated_failure_percentage: int = Field(100, ge=0, le=100)
    region: str = Field("us-east-1", validation_alias="AWS_REGION")
    endpoint_url: str | None = Field(None, validation_alias="RIGHTSIZER_AWS_ENDPOINT_URL")

    @property
    def rules(self) -> FleetRules:
        """The allow/deny rules."""
        return FleetRules.parse(self.allow, self.deny)

    def region_list(self) -> list[str]:
        """The regions to scan (default: the hub's)."""
        return [r.strip() for r in self.regions.split(",") if r.strip()] or [self.region]


def _bucket(settings: FleetSettings) -> service.JsonStore:
    from rightsizer.adapters.fleet_aws import fleet_bucket

    return fleet_bucket(settings.bucket, settings.region, settings.endpoint_url)


def discover_run(settings: FleetSettings, run_id: str) -> dict[str, Any]:
    """The discovery step: the operator's manifest (``manifest_key``) or Organizations accounts × regions ×
    ``eks:ListClusters`` through each account's spoke role, filtered, written as the run's manifest.

    Returns:
        The state machine's input of the Map: ``manifest`` {bucket, key, count}, ``max_concurrency``,
        ``tolerated_failure_percentage``.
    """
    from rightsizer.adapters.aws import shared_models_session
    from rightsizer.adapters.fleet_aws import (
        SpokeInventory,
        active_accounts,
        assume_role_session,
        spoke_role_arn,
    )

    store = _bucket(settings)
    if settings.manifest_key:
        targets = service.operator_manifest(store.get_json(settings.manifest_key), settings.rules)
    else:
        session = shared_models_session(settings.region)
        accounts = [a.strip() for a in settings.accounts.split(",") if a.strip()] or active_accounts(
            session, settings.endpoint_url
        )

        def spoke(account: str) -> SpokeInventory:
            role = spoke_role_arn(account, settings.role_name)
            assumed = assume_role_session(
                role,
                external_id=settings.external_id,
                region=settings.region,
                endpoint_url=settings.endpoint_url,
            )
            return SpokeInventory(assumed, settings.endpoint_url)

        targets = service.discover(accounts, spoke, settings.region_list(), settings.rules, settings.region)
    ref = service.write_manifest(store, run_id, targets)
    return {
        "manifest": {"bucket": ref.bucket, "key": ref.key, "count": ref.count},
        "max_concurrency": settings.max_concurrency,
        "tolerated_failure_percentage": settings.tolerated_failure_percentage,
    }


def member_config(
    target: FleetTarget,
    policy: Policy,
    *,
    role_name: str | None,
    external_id: str | None,
    endpoint_url: str | None = None,
    kubeconfig: str | None = None,
    pricing_api: bool = True,
) -> Config:
    """The single-cluster ``Config`` of one manifest entry: EKS authentication under the spoke role (the
    entry's ``role_arn``, else ``role_name`` in its account; no role when ``role_name`` is None and the
    entry names none: the caller's own credentials), or the entry's kubeconfig ``context``."""
    from rightsizer.adapters.fleet_aws import spoke_role_arn

    role = target.role_arn or (spoke_role_arn(target.account_id, role_name) if role_name else None)
    return Config.model_validate(
        {
            "cluster": {
                "name": target.cluster,
                "region": target.region,
                "context": target.context,
                "kubeconfig": kubeconfig,
            },
            "prometheus": {"url": target.prometheus_url, "auth": target.prometheus_auth},
            "aws": {
                "region": target.region,
                "endpoint_url": endpoint_url,
                "role_arn": role,
                "external_id": external_id if role else None,
                "pricing_api": pricing_api,
            },
            "policy": policy,
        }
    )


def assess_config(config: Config, at: datetime) -> service.ClusterAssessment:
    """One cluster observed (Kubernetes, AWS, Prometheus: the assessment's own reads, under the config's
    role) and decided at ``at``; read only (``services.fleet.assess_snapshot``)."""
    runtime = Runtime(config, "cli", dry_run=True)
    name = str(config.cluster.name or config.cluster.context)
    return service.assess_snapshot(
        runtime.observe(at), runtime.policy(), at, name, config.prometheus.node_label
    )


def explain(exc: BaseException) -> tuple[str, str]:
    """(kind, code) of a child's failure for ``domain.fleet.classify_failure``, from the exception and its
    causes: the Kubernetes API's 401/403, a connection that never reached the API server or Prometheus,
    Prometheus' own errors, an AWS error code."""
    from botocore.exceptions import ClientError, EndpointConnectionError
    from urllib3.exceptions import HTTPError

    from rightsizer.adapters.kubernetes_errors import KubernetesAccessError
    from rightsizer.adapters.prometheus import PrometheusQueryError, PrometheusUnavailable
    from rightsizer.services.snapshot import ReadAccessDenied

    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in chain:
        if isinstance(error, FleetError):
            return error.kind, error.code
        if isinstance(error, KubernetesAccessError | ReadAccessDenied):
            return "access", ""
        if isinstance(error, PrometheusQueryError):
            return ("access", "") if error.status_code in (401, 403) else ("metrics", "")
        if isinstance(error, PrometheusUnavailable):
            return ("unreachable", "") if error.status_code is None else ("metrics", "")
        if isinstance(error, ClientError):
            return "aws", str(error.response.get("Error", {}).get("Code", ""))
        if isinstance(error, HTTPError | EndpointConnectionError | ConnectionError):
            return "unreachable", ""
    text = str(exc)
    if "AccessDenied" in text:
        return "aws", "AccessDenied"
    return "failed", ""


def assess_member(
    target: FleetTarget, at: datetime, config_for: Callable[[FleetTarget], Config]
) -> ClusterResult:
    """One Distributed Map child: the target assessed under its config (never raises)."""
    return service.assess_target(target, lambda t: assess_config(config_for(t), at), explain)


def summarize_run(
    settings: FleetSettings,
    run_id: str,
    at: str,
    manifest: service.ManifestRef,
    result_manifest_key: str | None,
    map_error: str | None,
) -> FleetReport:
    """The summary step: the fleet report from the Map run's ResultWriter output."""
    return service.summarize(_bucket(settings), run_id, at, manifest, result_manifest_key, map_error)


def latest_report(bucket: str, region: str, endpoint_url: str | None = None) -> FleetReport:
    """The deployed fleet's latest report (``rightsizer fleet status``).

    Raises:
        ConfigError: no report yet (the first run has not finished) or the bucket cannot be read.
    """
    from rightsizer.adapters.fleet_aws import fleet_bucket

    try:
        document = fleet_bucket(bucket, region, endpoint_url).get_json(service.LATEST_REPORT)
    except FleetError as exc:
        raise ConfigError(f"no fleet report in s3://{bucket}/{service.LATEST_REPORT}: {exc}") from exc
    return FleetReport.model_validate(document)


def report_of_stack(stack: str, region: str | None = None) -> FleetReport:
    """The latest fleet report of the hub stack ``stack`` (its ``FleetBucketName`` output;
    ``cloudformation:DescribeStacks`` and ``s3:GetObject`` with the caller's credentials).

    Raises:
        ConfigError: no such stack, a stack without EnableFleet, or no report yet.
    """
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from rightsizer.wiring.stack import stack_region

    session = boto3.session.Session(region_name=stack_region(stack, region))  # ARN, --region or AWS config
    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    except (ClientError, BotoCoreError) as exc:
        raise ConfigError(
            f"stack {stack!r} not found in {session.region_name}: {exc}", field="--stack"
        ) from exc
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    if "FleetBucketName" not in outputs:
        raise ConfigError(f"stack {stack!r} has no fleet (deploy it with EnableFleet=true)", field="--stack")
    return latest_report(outputs["FleetBucketName"], str(session.region_name))
