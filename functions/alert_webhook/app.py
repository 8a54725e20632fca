"""Lambda ``alert_webhook``: the Alertmanager webhook behind a Function URL (docs/architecture.md §2, §5 "Webhook").

Intake only: authenticate, validate, de-duplicate, start or cancel drain workflows
(:mod:`rightsizer.services.webhook`). This module imports no Kubernetes client and no Prometheus adapter,
so a cold start stays small and the answer comes within a second (docs/architecture.md §8); a test imports
it in a fresh interpreter and checks ``sys.modules``.

Configuration (read once per cold start, :func:`rightsizer.wiring.webhook_intake_from_env`): the template's
``RIGHTSIZER_*`` variables, or ``RIGHTSIZER_CONFIG`` — the path of a config file — plus
``RIGHTSIZER_STATE_MACHINE_ARN``; ``RIGHTSIZER_WEBHOOK_TOKEN`` overrides the token secret. Tests inject an
intake with :func:`use_intake`.

IAM: ``dynamodb:GetItem``, ``PutItem``, ``UpdateItem``, ``DeleteItem`` on the state table (leases,
idempotency items); ``secretsmanager:GetSecretValue`` or ``ssm:GetParameter`` on the token; and what the
workflow starter needs (``states:StartExecution`` for Step Functions). No EKS access entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rightsizer.webhook_handler import function_url_handler, logger

if TYPE_CHECKING:
    from rightsizer.services.webhook import WebhookIntake

__all__ = ["lambda_handler", "logger", "use_intake"]

_intake: WebhookIntake | None = None


def use_intake(intake: WebhookIntake | None) -> None:
    """Use ``intake`` for the following invocations (tests); ``None`` forgets it, so the next invocation
    builds one from the environment again."""
    global _intake
    _intake = intake


def _current_intake() -> WebhookIntake:
    global _intake
    if _intake is None:  # cold start: one config read, one token lookup, clients reused afterwards
        from rightsizer.wiring import webhook_intake_from_env

        _intake = webhook_intake_from_env()
    return _intake


_handler = function_url_handler(_current_intake)


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Function URL (payload format 2.0) event in, ``{statusCode, headers, body}`` out (401 bad token, 413
    body over 1 MiB, 400 malformed, 202 started or cancelled, 200 nothing to do, 503 retry later)."""
    return _handler(event, context)
