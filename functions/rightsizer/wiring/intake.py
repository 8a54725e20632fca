"""The webhook intake's parts (the alert_webhook Lambda and ``rightsizer serve``): the bearer token and
the approval-link key as rotatable sources, the intake and the approval desk.

Like ``builders``, nothing here runs at import time but the process's random link key.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.logsafety import register_secret
from rightsizer.ports import WorkflowStarter
from rightsizer.state import ApprovalStore, LeaseStore
from rightsizer.wiring.builders import build_approvals, build_task_callback, resolve_config_secret

if TYPE_CHECKING:
    from rightsizer.services.approval import ApprovalDesk, LinkKey
    from rightsizer.services.webhook import DuplicateGuard, WebhookIntake


#: Overrides ``webhook.token_secret`` (``rightsizer serve``, tests).
TOKEN_ENV = "RIGHTSIZER_WEBHOOK_TOKEN"  # noqa: S105 (a variable name, not a secret)


def _secret_reference(name: str) -> str:
    # ``webhook.token_secret`` is a bare Secrets Manager / SSM name (docs/architecture.md §5) or a full reference.
    scheme = name.partition(":")[0]
    if scheme in ("env", "file", "ssm", "secretsmanager"):
        return name
    if name.startswith("/") or name.startswith("arn:aws:ssm:"):
        return f"ssm:{name}"
    return f"secretsmanager:{name}"


#: Overrides ``approval.key_secret`` (``rightsizer serve``, tests): the approval links' key material.
APPROVAL_KEY_ENV = "RIGHTSIZER_APPROVAL_KEY"
#: The link key of a process that both signs and verifies its links (``rightsizer serve``, the demo)
#: when none is configured: random per process, so links die with it and nothing else can mint them.
_PROCESS_LINK_KEY: Final = secrets.token_bytes(32)


def webhook_token_source(config: Config, environ: Mapping[str, str] | None = None) -> Callable[[], str]:
    """The bearer token as a provider: ``RIGHTSIZER_WEBHOOK_TOKEN`` (fixed) when set, else
    ``webhook.token_secret`` re-read every ``SECRET_MAX_AGE_S`` (``adapters.secrets.CachedSecret``), so a
    rotated token is accepted by a warm webhook within minutes. Read once here (fail closed).

    Raises:
        ConfigError / PermanentError / TransientError: as :func:`webhook_token`.
    """
    from rightsizer.adapters.secrets import CachedSecret

    env = os.environ if environ is None else environ
    first = webhook_token(config, env)
    if env.get(TOKEN_ENV):
        return lambda: first
    reference = _secret_reference(str(config.webhook.token_secret))
    source = CachedSecret(
        lambda: resolve_config_secret(config, reference, field="webhook.token_secret", environ=env)
    )
    source()  # the first read, from the cache: no second GetSecretValue
    return source


def approval_key_source(
    config: Config, environ: Mapping[str, str] | None = None, *, process_key: bool = False
) -> Callable[[], bytes] | None:
    """The approval links' HMAC key as a provider (``domain.approval.derive_key`` of its own secret, never
    of the webhook token): ``RIGHTSIZER_APPROVAL_KEY`` when set; else ``approval.key_secret`` re-read every
    ``SECRET_MAX_AGE_S`` (a rotation signs and verifies with the new key within minutes; links signed
    with the old one stop working, the CLI still decides); else, with ``process_key`` (a process that
    verifies its own links: ``serve``, the demo), a random key of this process; else None (no links).

    Raises:
        ConfigError / PermanentError / TransientError: the configured secret cannot be read.
    """
    from rightsizer.adapters.secrets import CachedSecret
    from rightsizer.domain.approval import derive_key

    env = os.environ if environ is None else environ
    if env.get(APPROVAL_KEY_ENV):
        register_secret(env[APPROVAL_KEY_ENV])
        fixed = derive_key(env[APPROVAL_KEY_ENV])
        return lambda: fixed
    if config.approval.key_secret:
        reference = _secret_reference(config.approval.key_secret)
        source = CachedSecret(
            lambda: resolve_config_secret(config, reference, field="approval.key_secret", environ=env)
        )
        source()  # fail closed now, not at the first link
        return lambda: derive_key(source())
    return (lambda: _PROCESS_LINK_KEY) if process_key else None


def webhook_token(config: Config, environ: Mapping[str, str] | None = None) -> str:
    """The bearer token: ``RIGHTSIZER_WEBHOOK_TOKEN`` when set, else ``webhook.token_secret`` resolved
    (Secrets Manager secret name/ARN, SSM SecureString ``/name``, or an ``env:``/``file:`` reference).

    Raises:
        ConfigError: neither is set, or the secret does not exist (fail closed: no token, no intake).
        PermanentError / TransientError: AWS refused or failed (``rightsizer.adapters.secrets``).
    """
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        register_secret(env[TOKEN_ENV])
        return env[TOKEN_ENV]
    if not config.webhook.token_secret:
        raise ConfigError(f"set webhook.token_secret or {TOKEN_ENV}", field="webhook.token_secret")
    return resolve_config_secret(
        config, _secret_reference(config.webhook.token_secret), field="webhook.token_secret", environ=env
    )


def build_intake(
    config: Config,
    *,
    starter: WorkflowStarter,
    leases: LeaseStore | None = None,
    guard: DuplicateGuard | None = None,
    environ: Mapping[str, str] | None = None,
    approval_store: ApprovalStore | None = None,
    link_key: LinkKey | None = None,
) -> WebhookIntake:
    """The intake for ``config``: token, leases and de-duplication on the state table (``aws.table``)
    unless ``leases``/``guard`` are given, node labels from the policy, the Powertools logger; approval
    links verified with ``link_key`` (default: :func:`approval_key_source`, no links without one).

    Idempotency items go to the state table under ``pk`` = ``idempotency#<AWS_LAMBDA_FUNCTION_NAME or
    alert_webhook>`` (the prefix ``rightsizer.adapters.dynamodb_state`` reserves for them).

    Raises:
        ConfigError: no token, or no ``aws.table`` when leases or guard must be built.
    """
    from rightsizer.services.webhook import PowertoolsDuplicateGuard, WebhookIntake
    from rightsizer.webhook_log import FUNCTION_NAME, logger

    token = webhook_token_source(config, environ)
    if link_key is None:
        link_key = approval_key_source(config, environ)
    if leases is None or guard is None:
        if not config.aws.table:
            raise ConfigError("the webhook needs the state table", field="aws.table")
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        from rightsizer.adapters.aws import shared_models_session
        from rightsizer.adapters.dynamodb_state import DynamoDbState

        env = os.environ if environ is None else environ
        client = shared_models_session(config.aws.region).client(
            "dynamodb", endpoint_url=config.aws.endpoint_url
        )
        cluster = config.cluster.name or config.cluster.context or ""
        leases = leases if leases is not None else DynamoDbState(client, config.aws.table, cluster)
        if guard is None:
            function = env.get("AWS_LAMBDA_FUNCTION_NAME") or FUNCTION_NAME
            store = DynamoDBPersistenceLayer(
                table_name=config.aws.table,
                key_attr="pk",
                sort_key_attr="sk",
                expiry_attr="ttl",
                static_pk_value=f"idempotency#{function}",
                boto3_client=client,
            )
            guard = PowertoolsDuplicateGuard(store)
    return WebhookIntake(
        token=token,
        starter=starter,
        leases=leases,
        guard=guard,
        node_labels=config.policy.alert_node_labels,
        logger=logger,
        approvals=approval_desk(config, link_key, store=approval_store),
    )


def approval_desk(config: Config, key: LinkKey | None, *, store: ApprovalStore | None = None) -> ApprovalDesk:
    """The desk deciding approval requests: links verified with ``key`` (the approval-link key, or its
    provider; None refuses every link), the cluster's approval store, Step Functions callbacks. Builds
    clients, calls nothing."""
    from rightsizer.services.approval import ApprovalDesk

    return ApprovalDesk(
        cluster=str(config.cluster.name or config.cluster.context or "local"),
        store=store if store is not None else build_approvals(config),
        callback=build_task_callback(config) if config.aws.table else None,
        key=key,
    )
