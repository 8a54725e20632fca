"""Lambda ``alert_webhook``: the Alertmanager webhook behind a Function URL (design §2, §5 "Webhook").

Intake only: authenticate, validate, de-duplicate, start or cancel drain workflows
(:mod:`rightsizer.services.webhook`). This module imports no Kubernetes client and no Prometheus adapter,
so a cold start stays small and the answer comes within a second (design §8); a test imports it in a
fresh interpreter and checks ``sys.modules``.

Configuration (read once per cold start): the template's ``RIGHTSIZER_*`` variables
(:class:`rightsizer.handler_support.Settings`: cluster, state table, token secret, drain state machine
ARN), or ``RIGHTSIZER_CONFIG`` — the path of a config file (design §5 "Config") — plus
``RIGHTSIZER_STATE_MACHINE_ARN``; ``RIGHTSIZER_WEBHOOK_TOKEN`` overrides the token secret. ``rightsizer serve`` builds the intake itself and injects it with
:func:`use_intake`, then calls :func:`lambda_handler` exactly as Lambda does.

IAM: ``dynamodb:GetItem``, ``PutItem``, ``UpdateItem``, ``DeleteItem`` on the state table (leases,
idempotency items); ``secretsmanager:GetSecretValue`` or ``ssm:GetParameter`` on the token; and what the
workflow starter needs (``states:StartExecution`` for Step Functions). No EKS access entry.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import LambdaFunctionUrlModel
from pydantic import ValidationError

from rightsizer.config import Config, load_config
from rightsizer.domain.errors import ConfigError
from rightsizer.ports import WorkflowStarter
from rightsizer.services.webhook import (
    DuplicateGuard,
    PowertoolsDuplicateGuard,
    WebhookIntake,
    WebhookRequest,
    WebhookResponse,
)
from rightsizer.state import LeaseStore

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

__all__ = [
    "build_intake",
    "build_workflow_starter",
    "lambda_handler",
    "logger",
    "use_intake",
    "webhook_token",
]

TOKEN_ENV = "RIGHTSIZER_WEBHOOK_TOKEN"  # noqa: S105 (a variable name, not a secret)
CONFIG_ENV = "RIGHTSIZER_CONFIG"
FUNCTION_NAME = "alert_webhook"

# stderr: Lambda sends it to CloudWatch like stdout, and ``rightsizer serve`` keeps stdout for data (design §5).
logger = Logger(service=FUNCTION_NAME, stream=sys.stderr)
_intake: WebhookIntake | None = None


def use_intake(intake: WebhookIntake | None) -> None:
    """Use ``intake`` for the following invocations (``rightsizer serve``, tests); ``None`` forgets it,
    so the next invocation builds one from the environment again."""
    global _intake
    _intake = intake


def _current_intake() -> WebhookIntake:
    global _intake
    if _intake is None:  # cold start: one config read, one token lookup, clients reused afterwards
        if CONFIG_ENV in os.environ:
            config = load_config(os.environ[CONFIG_ENV])
            arn = os.environ.get("RIGHTSIZER_STATE_MACHINE_ARN")
        else:  # deployed: the template's RIGHTSIZER_* variables (rightsizer.handler_support.Settings)
            from rightsizer.handler_support import Settings
            from rightsizer.handler_support import load_config as load_deployment_config

            settings = Settings.from_env()
            config, arn = load_deployment_config(settings), settings.state_machine_arn
        _intake = build_intake(config, starter=build_workflow_starter(config, arn))
    return _intake


@logger.inject_lambda_context(correlation_id_path=correlation_paths.LAMBDA_FUNCTION_URL)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Function URL (payload format 2.0) event in, ``{statusCode, headers, body}`` out.

    Status codes: 401 bad token, 413 body over 1 MiB, 400 malformed JSON / schema / not a Function URL
    event, 202 workflows started or cancels recorded, 200 nothing to do, 503 retry later (see
    :meth:`rightsizer.services.webhook.WebhookIntake.handle` for the bodies).
    """
    try:
        url = parse(event=event, model=LambdaFunctionUrlModel)
    except ValidationError:  # not from a Function URL: a wiring mistake, never Alertmanager's
        logger.error("event is not a Function URL (payload format 2.0) event")
        return WebhookResponse(
            400, {"error": "invalid_event", "detail": "not a Function URL event"}
        ).to_function_url()
    body = url.body if isinstance(url.body, str) else None
    request = WebhookRequest(url.headers, body, bool(url.isBase64Encoded), url.requestContext.requestId)
    return _current_intake().handle(request, lambda_context=context).to_function_url()


# --------------------------------------------------------------------------------------------------
# Cold-start wiring (shared with ``rightsizer serve``)
# --------------------------------------------------------------------------------------------------


def build_workflow_starter(config: Config, state_machine_arn: str | None) -> WorkflowStarter:
    """The production ``WorkflowStarter``: Step Functions ``StartExecution`` on the drain state machine.

    Raises:
        ConfigError: no state machine ARN (``RIGHTSIZER_STATE_MACHINE_ARN``): fail closed at cold start
            rather than accept alerts that cannot be acted on.
    """
    if not state_machine_arn:
        raise ConfigError("the drain state machine is required", field="RIGHTSIZER_STATE_MACHINE_ARN")
    from rightsizer.wiring import build_workflow_starter as step_functions_starter

    return step_functions_starter(config, state_machine_arn)


def _secret_reference(name: str) -> str:
    # ``webhook.token_secret`` is a bare Secrets Manager / SSM name (design §5) or a full reference.
    scheme = name.partition(":")[0]
    if scheme in ("env", "file", "ssm", "secretsmanager"):
        return name
    if name.startswith("/") or name.startswith("arn:aws:ssm:"):
        return f"ssm:{name}"
    return f"secretsmanager:{name}"


def webhook_token(config: Config, environ: Mapping[str, str] | None = None) -> str:
    """The bearer token: ``RIGHTSIZER_WEBHOOK_TOKEN`` when set, else ``webhook.token_secret`` resolved
    (Secrets Manager secret name/ARN, SSM SecureString ``/name``, or an ``env:``/``file:`` reference).

    Raises:
        ConfigError: neither is set, or the secret does not exist (fail closed: no token, no intake).
        PermanentError / TransientError: AWS refused or failed (``rightsizer.adapters.secrets``).
    """
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV]
    if not config.webhook.token_secret:
        raise ConfigError(f"set webhook.token_secret or {TOKEN_ENV}", field="webhook.token_secret")
    from rightsizer.wiring import resolve_config_secret

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
) -> WebhookIntake:
    """The intake for ``config``: token, leases and de-duplication on the state table (``aws.table``)
    unless ``leases``/``guard`` are given, node labels from the policy, the Powertools logger.

    Idempotency items go to the state table under ``pk`` = ``idempotency#<AWS_LAMBDA_FUNCTION_NAME or
    alert_webhook>`` (the prefix ``rightsizer.adapters.dynamodb_state`` reserves for them).

    Raises:
        ConfigError: no token, or no ``aws.table`` when leases or guard must be built.
    """
    token = webhook_token(config, environ)
    if leases is None or guard is None:
        if not config.aws.table:
            raise ConfigError("the webhook needs the state table", field="aws.table")
        import boto3
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        from rightsizer.adapters.dynamodb_state import DynamoDbState

        env = os.environ if environ is None else environ
        client = boto3.session.Session(region_name=config.aws.region).client(
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
    )
