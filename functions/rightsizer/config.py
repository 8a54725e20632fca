"""The configuration file (docs/architecture.md §5 "Config"): cluster, Prometheus, AWS, policy, off-hours, webhook.

YAML validated with pydantic (``extra="forbid"`` everywhere, so a typo names the key). Every section but
``cluster`` has defaults. Secrets are never inlined: ``secret`` is a reference resolved at run time —
``env:NAME``, ``file:/path``, ``ssm:/parameter/name`` (SecureString) or ``secretsmanager:name``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rightsizer.domain.errors import ConfigError
from rightsizer.domain.periods import Period
from rightsizer.domain.policy import Policy, Seconds, load_policy
from rightsizer.domain.validation import KeyedValueError, combined, config_error

SECRET_SCHEMES = ("env", "file", "ssm", "secretsmanager")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_secret_ref(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, sep, rest = value.partition(":")
    if not sep or scheme not in SECRET_SCHEMES or not rest:
        raise ValueError(f"a secret reference is one of {', '.join(s + ':…' for s in SECRET_SCHEMES)}")
    return value


class ClusterConfig(_Section):
    """Which cluster: an EKS cluster ``name`` (+ ``region``), or a kubeconfig ``context``."""

    name: str | None = Field(None, description="EKS cluster name (eks:DescribeCluster).")
    region: str | None = Field(None, description="AWS region of the cluster; default aws.region.")
    context: str | None = Field(None, description="kubeconfig context (CLI use); overrides EKS auth.")
    kubeconfig: str | None = Field(
        None, description="kubeconfig path; default $KUBECONFIG or ~/.kube/config."
    )

    @model_validator(mode="after")
    def _one_way_in(self) -> ClusterConfig:
        if not self.name and not self.context:
            raise KeyedValueError("name", "set cluster.name (EKS) or cluster.context (kubeconfig)")
        return self


class PrometheusConfig(_Section):
    """Where DCGM metrics live: Prometheus, Thanos or Amazon Managed Service for Prometheus."""

    url: str = Field("http://127.0.0.1:9090", description="Base URL (AMP: the workspace URL).")
    auth: Literal["none", "bearer", "basic", "sigv4"] = Field("none", description="Authentication kind.")
    secret: str | None = Field(None, description="Token (bearer) or password (basic) reference.")
    username: str | None = Field(None, description="User name for basic auth.")
    sigv4_region: str | None = Field(
        None, description="Region for SigV4 (service 'aps'); default aws.region."
    )
    node_label: str | None = Field(None, description="Series label carrying the Kubernetes node name.")
    shard_nodes: int = Field(
        1000,
        ge=1,
        description="GPU nodes per series shard: larger fleets are read in shards, concurrently, and "
        "merged; by node_label when set (this many nodes per shard), else by the GPU index (dcgm-exporter "
        "label gpu; a power of two of shards, at most 16); a failed shard makes only its nodes unknown.",
    )
    step: Seconds = Field(60, gt=0, description="Query step in seconds (≤ idle_window).")
    timeout: Seconds = Field(30, gt=0, description="Read timeout per query in seconds.")
    deadline: Seconds = Field(
        90,
        gt=0,
        description="Total time in seconds for all queries of one cycle; past it the cycle ends as "
        "'Prometheus unavailable' (keep it well under the Lambda timeouts: drain 120 s, assess 300 s).",
    )
    ca_bundle: str | None = Field(None, description="CA bundle path for TLS.")
    job: str | None = Field(None, description="Restrict series to this scrape job (label 'job').")
    compression: Literal["auto", "gzip", "identity"] = Field(
        "auto",
        description="How answers travel: auto = gzip from AMP (sigv4), uncompressed from any other server "
        "(compressing ~20 KiB per GPU node per cycle costs the cluster's Prometheus CPU); gzip or identity "
        "forces one (gzip for a server across the internet or a NAT gateway).",
    )

    _check = field_validator("secret")(_check_secret_ref)

    @model_validator(mode="after")
    def _auth_needs(self) -> PrometheusConfig:
        if self.auth in ("bearer", "basic") and not self.secret:
            raise KeyedValueError("secret", f"prometheus.auth {self.auth} needs a secret reference here")
        if self.auth == "basic" and not self.username:
            raise KeyedValueError("username", "prometheus.auth basic needs the user name here")
        return self

    @model_validator(mode="after")
    def _timeout_within_deadline(self) -> PrometheusConfig:
        # a query may run at most what is left of the cycle's deadline: a timeout beyond it never applies
        if self.timeout > self.deadline:
            raise KeyedValueError(
                "timeout",
                f"{self.timeout} s must be ≤ prometheus.deadline ({self.deadline} s): lower timeout or raise "
                "deadline",
            )
        return self


class AwsConfig(_Section):
    """AWS access: region and, for tests and the demo, a local endpoint (moto server)."""

    region: str = Field("us-east-1", description="Default AWS region.")
    endpoint_url: str | None = Field(None, description="Endpoint override for every AWS client (tests).")
    table: str | None = Field(None, description="DynamoDB table for leases, slots, ledger, off-hours state.")
    pricing_api: bool = Field(
        True,
        description="Read the region's on-demand prices from the AWS Price List Query API (pricing:GetProducts);"
        " false prices from the packaged us-east-1 catalog (an isolated VPC).",
    )
    pricing_endpoint_url: str | None = Field(
        None,
        description="Endpoint override for the Price List Query API client (tests); default endpoint_url.",
    )
    role_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+$",
        description="A role to assume for every call about the cluster (the fleet's spoke role, issue 31).",
    )
    external_id: str | None = Field(None, description="The ExternalId the role's trust policy asks for.")


class OffhoursGroup(_Section):
    """A node group that follows a schedule of periods when it is scaled to zero."""

    name: str
    schedule: str


class OffhoursConfig(_Section):
    """Off-hours: named schedules (unions of periods, docs/architecture.md §4) and the node groups that follow them."""

    schedules: dict[str, list[Period]] = Field(default_factory=dict)
    node_groups: list[OffhoursGroup] = Field(default_factory=list)


class WebhookConfig(_Section):
    """Alertmanager webhook: where the bearer token lives (``RIGHTSIZER_WEBHOOK_TOKEN`` wins when set)."""

    token_secret: str | None = Field(None, description="Secrets Manager secret or SSM SecureString name.")


class ApprovalConfig(_Section):
    """Where approval requests go (policy ``approval``, docs/architecture.md §4 "Approval")."""

    topic_arn: str | None = Field(
        None, description="SNS topic of approval requests (the stack's alarm topic)."
    )
    url: str | None = Field(
        None, description="The webhook's public base URL (Function URL) the approve/reject/snooze links use."
    )
    key_secret: str | None = Field(
        None,
        description="The approval links' signing key: a Secrets Manager secret or SSM SecureString name, "
        "its own secret (never the webhook token); RIGHTSIZER_APPROVAL_KEY wins when set.",
    )
    notify_actions: bool = Field(
        False,
        description="Also publish every completed or rolled-back removal, resize, replacement and off-hours "
        "transition (node, action, reason, USD) to topic_arn (template parameter NotifyActions).",
    )


class Config(_Section):
    """The whole configuration file."""

    cluster: ClusterConfig
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    policy: Policy = Field(default_factory=Policy)
    offhours: OffhoursConfig = Field(default_factory=OffhoursConfig)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    approval: ApprovalConfig = Field(default_factory=ApprovalConfig)

    @model_validator(mode="after")
    def _step_within_window(self) -> Config:
        if self.prometheus.step > self.policy.idle_window:
            raise KeyedValueError(
                "policy.idle_window",
                f"{self.policy.idle_window} s is shorter than prometheus.step ({self.prometheus.step} s): a "
                "window must hold at least one step; lengthen idle_window or shorten prometheus.step",
            )
        return self


def load_config(path: str | Path) -> Config:
    """Read and validate a config file; ``policy`` may be a mapping or a path relative to the file.

    Raises:
        ConfigError: naming the file and the first offending key (dotted path); ``problems`` lists every
            mistake of the config and of a policy file it names, each with its key path and fix.
    """
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(p)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=str(p)) from exc
    if not isinstance(raw, dict):
        raise ConfigError("a config file is a mapping", source=str(p))
    data: dict[str, Any] = dict(raw)
    policy_ref = data.get("policy")
    errors: list[ConfigError] = []
    if isinstance(policy_ref, str):
        policy_path = (p.parent / policy_ref).resolve()
        try:
            policy_raw = yaml.safe_load(policy_path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"cannot read policy {policy_path}: {exc.strerror}", source=str(p), field="policy"
            ) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"invalid YAML: {exc}", source=str(policy_path)) from exc
        try:
            data["policy"] = load_policy(policy_raw, source=str(policy_path))
        except ConfigError as exc:  # reported with the config's own mistakes, all in one pass
            errors.append(exc)
            data.pop("policy")
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        errors.append(config_error(exc, source=str(p), model=Config))
    if errors:
        raise combined(errors)
    return config
