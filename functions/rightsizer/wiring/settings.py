"""The deployment's environment and its policy: one settings model, one policy provider.

- :class:`DeploymentSettings` — the ``RIGHTSIZER_*`` variables ``template.yaml`` sets on every Lambda,
  parsed by pydantic-settings (empty strings count as unset: CloudFormation passes ``""`` for optional
  parameters); a bad value is a :class:`~rightsizer.domain.errors.ConfigError` naming the variable.
- :func:`deployment_config` — settings → the same :class:`~rightsizer.config.Config` the CLI reads from a
  file, so every entry point decides on one model.
- :class:`PolicyProvider` — the policy, re-read from its source when older than ``max_age`` seconds (default
  60 s): an emergency ``dry_run: true`` written to the SSM parameter reaches a warm Lambda within a minute.
  It lives beside, not inside, the cache of built clients (docs/architecture.md §6 "Policy").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import yaml
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.policy import MAX_APPROVAL_TIMEOUT_S, Policy, load_policy
from rightsizer.domain.validation import combined, config_error

__all__ = [
    "POLICY_MAX_AGE_S",
    "STATE_MACHINE_MARGIN_S",
    "STATE_MACHINE_TIMEOUT_S",
    "DeploymentSettings",
    "PolicyProvider",
    "config_from_settings",
    "deployment_config",
    "parse_policy_text",
]

#: How long a policy read from its source is used before it is read again (seconds).
POLICY_MAX_AGE_S: Final = 60.0
#: The drain state machine's ``TimeoutSeconds`` (infra/statemachine/drain.asl.json; a test compares):
#: the longest approval wait (24 h, ``Policy.approval_timeout``) plus two hours of drain.
STATE_MACHINE_TIMEOUT_S: Final = 93600
#: drain_timeout + lease margin (5 min) + verify (5 min) + retries must fit the state machine's timeout.
STATE_MACHINE_MARGIN_S: Final = 1800

_REGION_VARIABLES: Final = ("RIGHTSIZER_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
# Settings fields whose variable is not RIGHTSIZER_<FIELD> (for error messages).
_VARIABLES: Final = {"region": "AWS_REGION", "kubeconfig": "KUBECONFIG", "RIGHTSIZER_REGION": "AWS_REGION"}


class DeploymentSettings(BaseSettings):
    """The deployment's settings, from ``RIGHTSIZER_*`` environment variables (template parameters).

    ``region`` comes from ``RIGHTSIZER_REGION``, else ``AWS_REGION`` (set by Lambda), else
    ``AWS_DEFAULT_REGION``; ``kubeconfig`` from ``KUBECONFIG``.
    """

    model_config = SettingsConfigDict(
        env_prefix="RIGHTSIZER_", env_ignore_empty=True, extra="ignore", frozen=True, populate_by_name=True
    )

    cluster_name: str = Field(description="EKS cluster name (RIGHTSIZER_CLUSTER_NAME).")
    region: str = Field(
        validation_alias=AliasChoices("RIGHTSIZER_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
        description="AWS region (RIGHTSIZER_REGION, else AWS_REGION / AWS_DEFAULT_REGION).",
    )
    table: str | None = Field(None, description="DynamoDB state table (RIGHTSIZER_TABLE).")
    dry_run: bool = Field(True, description="Template parameter DryRun (RIGHTSIZER_DRY_RUN).")
    prometheus_url: str = Field("http://127.0.0.1:9090", description="RIGHTSIZER_PROMETHEUS_URL.")
    prometheus_auth: Literal["none", "bearer", "basic", "sigv4"] = "none"
    prometheus_secret: str | None = Field(
        None, description="Secret reference (RIGHTSIZER_PROMETHEUS_SECRET)."
    )
    prometheus_username: str | None = None
    node_label: str | None = None
    pricing_api: bool = Field(
        True, description="Template parameter PriceListApi (RIGHTSIZER_PRICING_API): config aws.pricing_api."
    )
    policy_parameter: str | None = Field(None, description="SSM parameter with the policy YAML.")
    policy_inline: str | None = Field(None, description="The policy as YAML/JSON text.")
    policy_max_age: float = Field(
        POLICY_MAX_AGE_S, gt=0, description="Seconds a policy read is reused (RIGHTSIZER_POLICY_MAX_AGE)."
    )
    offhours: str | None = Field(None, description="Off-hours section as YAML/JSON text.")
    state_machine_arn: str | None = Field(
        None, description="Drain state machine (RIGHTSIZER_STATE_MACHINE_ARN)."
    )
    webhook_token_secret: str | None = Field(
        None, description="Secrets Manager secret with the bearer token."
    )
    approval_topic_arn: str | None = Field(
        None, description="SNS topic of approval requests (RIGHTSIZER_APPROVAL_TOPIC_ARN)."
    )
    notify_actions: bool = Field(
        False,
        description="Template parameter NotifyActions (RIGHTSIZER_NOTIFY_ACTIONS): config approval.notify_actions.",
    )
    approval_url: str | None = Field(
        None, description="The webhook's Function URL, base of approval links (RIGHTSIZER_APPROVAL_URL)."
    )
    approval_key_secret: str | None = Field(
        None,
        description="Secrets Manager secret with the approval links' key (RIGHTSIZER_APPROVAL_KEY_SECRET).",
    )
    aws_endpoint_url: str | None = Field(None, description="Endpoint override for every client (tests).")
    kube_context: str | None = Field(None, description="kubeconfig context instead of EKS auth (tests).")
    kubeconfig: str | None = Field(None, validation_alias="KUBECONFIG", description="kubeconfig path.")
    tracing: bool = Field(False, description="X-Ray via Powertools Tracer (RIGHTSIZER_TRACING).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeploymentSettings:
        """Read the settings from the process environment, or from ``environ`` alone when given
        (``rightsizer validate`` checks the environment a template would set).

        Raises:
            ConfigError: a required variable is missing or a value is invalid (names the variable).
        """
        try:
            if environ is None:
                return cls()
            values: dict[str, Any] = {}
            for name in cls.model_fields:
                variables = _REGION_VARIABLES if name == "region" else (_variable(name),)
                found = next((environ[v] for v in variables if environ.get(v, "").strip()), None)
                if found is not None:
                    values[name] = found
            return cls.model_validate(values)
        except ValidationError as exc:
            raise config_error(exc, source="environment", field_name=_variable) from exc


def _variable(key: str) -> str:
    """The environment variable behind a settings field name or alias."""
    if key in _VARIABLES:
        return _VARIABLES[key]
    return key if key.isupper() else f"RIGHTSIZER_{key.upper()}"


def parse_policy_text(text: str | None, *, source: str) -> Policy:
    """A policy from YAML/JSON ``text`` (None or empty: the defaults), checked against the drain state
    machine's overall timeout.

    Raises:
        ConfigError: invalid YAML, not a mapping, a key/value the policy rejects, or a ``drain_timeout``
            that leaves less than 30 min of the state machine's timeout (names the source and the field).
    """
    policy = load_policy(_mapping(text, source=source), source=source)
    if policy.drain_timeout + STATE_MACHINE_MARGIN_S + MAX_APPROVAL_TIMEOUT_S > STATE_MACHINE_TIMEOUT_S:
        raise ConfigError(
            f"drain_timeout {policy.drain_timeout}s leaves less than {STATE_MACHINE_MARGIN_S}s of the drain "
            f"state machine's {STATE_MACHINE_TIMEOUT_S}s timeout (after {MAX_APPROVAL_TIMEOUT_S}s reserved "
            "for an approval wait)",
            source=source,
            field="drain_timeout",
        )
    return policy


def _mapping(text: str | None, *, source: str) -> dict[str, Any]:
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


def deployment_config(settings: DeploymentSettings, policy: Policy) -> Config:
    """The :class:`~rightsizer.config.Config` of this deployment with ``policy`` (from the provider).

    Raises:
        ConfigError: the off-hours text or a value is invalid (names the source and the field).
    """
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
            "pricing_api": settings.pricing_api,
        },
        "policy": policy,
        "offhours": _mapping(settings.offhours, source="RIGHTSIZER_OFFHOURS"),
        "webhook": {"token_secret": settings.webhook_token_secret},
        "approval": {
            "topic_arn": settings.approval_topic_arn,
            "url": settings.approval_url,
            "key_secret": settings.approval_key_secret,
            "notify_actions": settings.notify_actions,
        },
    }
    try:
        return Config.model_validate(document)
    except ValidationError as exc:
        raise config_error(exc, source="environment", model=Config) from exc


def monotonic() -> float:
    """The providers' clock (seconds); a module function so tests can move time forward."""
    return time.monotonic()


def config_from_settings(
    settings: DeploymentSettings, *, fetch: Callable[[str], str] | None = None
) -> Config:
    """The deployment's config with its policy read once: the SSM parameter through ``fetch`` (name →
    text), else the inline text (``rightsizer validate``; the Lambda reads through :class:`PolicyProvider`).

    Raises:
        ConfigError: the policy or the off-hours text is invalid, or an SSM parameter is named and no
            ``fetch`` was given.
    """
    errors: list[ConfigError] = []
    policy = Policy()
    try:
        if settings.policy_parameter:
            if fetch is None:
                raise ConfigError(
                    f"the policy is in SSM parameter {settings.policy_parameter}", field="PolicyParameterName"
                )
            policy = parse_policy_text(
                fetch(settings.policy_parameter), source=f"ssm:{settings.policy_parameter}"
            )
        else:
            policy = parse_policy_text(settings.policy_inline, source="RIGHTSIZER_POLICY_INLINE")
    except ConfigError as exc:  # the timetable and settings are still checked: every mistake in one pass
        errors.append(exc)
    try:
        config = deployment_config(settings, policy)
    except ConfigError as exc:
        errors.append(exc)
    if errors:
        raise combined(errors)
    return config


class PolicyProvider:
    """The policy, loaded by ``load`` and reused for ``max_age`` seconds, then loaded again.

    Thread-safe. A failed reload raises (the caller's invocation fails and is retried) rather than acting
    on a policy older than asked for.

    Args:
        load: reads and validates the policy (e.g. the SSM parameter through one long-lived client).
        max_age: seconds a loaded policy is reused (default 60).
        clock: monotonic seconds (default: :func:`monotonic`, looked up at every call).
    """

    def __init__(
        self,
        load: Callable[[], Policy],
        *,
        max_age: float = POLICY_MAX_AGE_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._load = load
        self._max_age = max_age
        self._clock = clock or (lambda: monotonic())
        self._lock = threading.Lock()
        self._value: Policy | None = None
        self._loaded_at = 0.0

    @classmethod
    def fixed(cls, policy: Policy) -> PolicyProvider:
        """A provider that always answers ``policy`` (the CLI: the policy is the file it was given)."""
        return cls(lambda: policy, max_age=float("inf"))

    def get(self) -> Policy:
        """The current policy (loading it when it is older than ``max_age``).

        Raises:
            ConfigError: the source is unreadable or the policy invalid.
        """
        with self._lock:
            now = self._clock()
            if self._value is None or now - self._loaded_at >= self._max_age:
                self._value = self._load()
                self._loaded_at = now
            return self._value
