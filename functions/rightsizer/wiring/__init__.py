"""The composition root: the only place SDK clients, adapters and use cases are built.

- :class:`Runtime` (``runtime``) — one per process and mode: ``assessment()``, ``offhours()``,
  ``drain_workflow()``, ``webhook_intake()``, ``observe(at)`` (once per tick) and the ``starter()`` of the
  mode; :func:`lambda_runtime` is the warm Lambda's.
- ``settings`` — the deployment environment (one pydantic-settings model) and the policy provider
  (``max_age``, default 60 s).
- ``builders`` — the builders of single adapters and clients the runtime assembles (the use cases, the
  live observation among them, live in ``rightsizer.services``); ``intake`` — the webhook
  intake's (token and link-key sources, intake, approval desk).

Only this package and ``rightsizer.adapters`` import boto3, botocore, kubernetes or httpx (an import
contract in pyproject.toml).
"""

from rightsizer.wiring.builders import build_metrics_reader, build_observers
from rightsizer.wiring.intake import (
    APPROVAL_KEY_ENV,
    TOKEN_ENV,
    approval_key_source,
    build_intake,
    webhook_token,
    webhook_token_source,
)
from rightsizer.wiring.runtime import (
    CONFIG_ENV,
    Mode,
    Runtime,
    clear_lambda_runtime,
    lambda_runtime,
    webhook_intake_from_env,
)
from rightsizer.wiring.settings import (
    POLICY_MAX_AGE_S,
    STATE_MACHINE_TIMEOUT_S,
    DeploymentSettings,
    PolicyProvider,
)
from rightsizer.wiring.stack import config_from_stack, stack_region

__all__ = [
    "APPROVAL_KEY_ENV",
    "CONFIG_ENV",
    "POLICY_MAX_AGE_S",
    "STATE_MACHINE_TIMEOUT_S",
    "TOKEN_ENV",
    "DeploymentSettings",
    "Mode",
    "PolicyProvider",
    "Runtime",
    "approval_key_source",
    "build_intake",
    "build_metrics_reader",
    "build_observers",
    "clear_lambda_runtime",
    "config_from_stack",
    "lambda_runtime",
    "stack_region",
    "webhook_intake_from_env",
    "webhook_token",
    "webhook_token_source",
]
