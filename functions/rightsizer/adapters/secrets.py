"""Resolve secret references (config ``prometheus.secret``, ``webhook.token_secret``) at run time.

A reference is ``scheme:rest`` (``rightsizer.config.SECRET_SCHEMES``):

- ``env:NAME`` — the environment variable ``NAME`` (tests, ``rightsizer serve``).
- ``file:/path`` — the file's text without its trailing newline (Kubernetes/CSI mounted secrets).
- ``ssm:/parameter/name`` — SSM Parameter Store ``GetParameter(WithDecryption=True)`` (SecureString).
- ``secretsmanager:name-or-arn`` — Secrets Manager ``GetSecretValue`` (``SecretString``, else
  ``SecretBinary`` as UTF-8).

:class:`CachedSecret` re-reads a secret at most every ``SECRET_MAX_AGE_S`` (five minutes), so a rotated
webhook token or approval-link key reaches a warm function within minutes without a redeploy (issue 26).

Needs IAM: ``ssm:GetParameter`` on the parameter, ``secretsmanager:GetSecretValue`` on the secret, and
``kms:Decrypt`` on the customer-managed KMS key when one encrypts them (the AWS-managed keys need no
grant). Clients are passed in (built once per cold start in wiring); this module builds none.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from rightsizer.adapters.sdk_errors import SDK_ERRORS
from rightsizer.domain.errors import ConfigError, PermanentError, TransientError
from rightsizer.logsafety import register_secret

if TYPE_CHECKING:
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_ssm import SSMClient

#: The AWS actions this module calls (``secretsmanager:`` and ``ssm:`` references).
IAM_ACTIONS: Final = frozenset({"secretsmanager:GetSecretValue", "ssm:GetParameter"})
#: Seconds a resolved secret is reused before it is read again: the longest a rotation takes to reach a
#: warm function (Secrets Manager's rotation keeps the previous value AWSPREVIOUS, so Alertmanager and
#: the webhook may disagree this long at most).
SECRET_MAX_AGE_S: Final = 300.0
#: After a failed re-read (throttling, an AWS outage) the last value is served this long before trying again.
_RETRY_AFTER_S: Final = 30.0
log = logging.getLogger(__name__)

_NOT_FOUND = frozenset(
    {
        "ParameterNotFound",
        "ParameterVersionNotFound",
        "ResourceNotFoundException",
        "InvalidParameterException",
    }
)
_THROTTLED = frozenset(
    {"ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded", "InternalServerError",
     "InternalServiceError", "InternalServiceErrorException", "ServiceUnavailable"}
)  # fmt: skip


def resolve_secret(
    ref: str,
    *,
    ssm: SSMClient | None = None,
    secretsmanager: SecretsManagerClient | None = None,
    environ: Mapping[str, str] | None = None,
    field: str | None = None,
) -> str:
    """The secret value named by ``ref`` (``env:``, ``file:``, ``ssm:``, ``secretsmanager:``), registered
    with :func:`rightsizer.logsafety.register_secret` so no log line ever shows it.

    Args:
        ref: the reference from the config file.
        ssm: an SSM client (needed for ``ssm:``).
        secretsmanager: a Secrets Manager client (needed for ``secretsmanager:``).
        environ: the environment (default ``os.environ``).
        field: the config key holding ``ref``, for error messages (e.g. ``prometheus.secret``).

    Raises:
        ConfigError: bad reference, unset variable, unreadable file, missing parameter/secret or no
            client for the scheme — fail closed, act on nothing.
        PermanentError: access denied (IAM/KMS) or another AWS error retrying cannot fix.
        TransientError: throttling or an AWS-side failure; retry later.
    """
    value = _resolve(ref, ssm=ssm, secretsmanager=secretsmanager, environ=environ, field=field)
    register_secret(value)
    return value


def _resolve(
    ref: str,
    *,
    ssm: SSMClient | None = None,
    secretsmanager: SecretsManagerClient | None = None,
    environ: Mapping[str, str] | None = None,
    field: str | None = None,
) -> str:
    """:func:`resolve_secret` without the registration."""
    scheme, sep, rest = ref.partition(":")
    if not sep or not rest:
        raise ConfigError(f"not a secret reference: {scheme!r}…", field=field)
    if scheme == "env":
        env = os.environ if environ is None else environ
        value = env.get(rest)
        if value is None:
            raise ConfigError(f"environment variable {rest} is not set", field=field)
        return value
    if scheme == "file":
        try:
            return Path(rest).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read secret file {rest}: {exc}", field=field) from exc
    if scheme == "ssm":
        if ssm is None:
            raise ConfigError("an ssm: reference needs an SSM client", field=field)
        answer = _call(lambda: ssm.get_parameter(Name=rest, WithDecryption=True), ref, field)
        return str(answer["Parameter"]["Value"])
    if scheme == "secretsmanager":
        if secretsmanager is None:
            raise ConfigError("a secretsmanager: reference needs a Secrets Manager client", field=field)
        answer = _call(lambda: secretsmanager.get_secret_value(SecretId=rest), ref, field)
        if answer.get("SecretString") is not None:
            return str(answer["SecretString"])
        binary = answer.get("SecretBinary")
        if isinstance(binary, bytes | bytearray):
            return bytes(binary).decode("utf-8")
        raise ConfigError(f"secret {rest} has no value", field=field)
    raise ConfigError(f"unknown secret scheme {scheme!r} (env, file, ssm, secretsmanager)", field=field)


def _call(fn: Any, ref: str, field: str | None) -> Any:
    try:
        return fn()
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        # The message never includes a value; AWS errors don't carry one either.
        message = f"{ref}: {code}: {err.get('Message', '')}"
        if code in _NOT_FOUND:
            raise ConfigError(message, field=field) from exc
        if code in _THROTTLED or status >= 500 or status == 429:
            raise TransientError(message, retry_after=5.0) from exc
        raise PermanentError(message) from exc
    except SDK_ERRORS as exc:  # endpoint unreachable, read timeout
        raise TransientError(f"{ref}: {exc}", retry_after=5.0) from exc


class CachedSecret:
    """A secret read through ``load`` and reused for ``max_age_s`` seconds, then read again (thread-safe).

    The first read fails as ``load`` fails (fail closed: no secret, nothing served). A later re-read that
    fails with a ``TransientError`` keeps the last value for ``_RETRY_AFTER_S`` more seconds (an AWS
    hiccup must not lock Alertmanager out); a ``ConfigError`` or ``PermanentError`` (the secret deleted,
    access revoked) is raised: a credential that was withdrawn is not served on.

    Args:
        load: resolves the secret (e.g. ``resolve_secret`` of a reference).
        max_age_s: seconds a value is reused (default ``SECRET_MAX_AGE_S`` as it is when this is made).
        clock: monotonic seconds (default ``time.monotonic``).
    """

    def __init__(
        self,
        load: Callable[[], str],
        *,
        max_age_s: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._load = load
        self._max_age_s = SECRET_MAX_AGE_S if max_age_s is None else max_age_s
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._value: str | None = None
        self._read_at = 0.0

    def __call__(self) -> str:
        """The current value, read again when older than ``max_age_s``."""
        with self._lock:
            now = self._clock()
            if self._value is not None and now - self._read_at < self._max_age_s:
                return self._value
            try:
                value = self._load()
            except TransientError as exc:
                if self._value is None:
                    raise
                log.warning(
                    "secret re-read failed (%s); the last value is kept %.0f s more", exc, _RETRY_AFTER_S
                )
                self._read_at = now - self._max_age_s + _RETRY_AFTER_S
                return self._value
            self._value, self._read_at = value, now
            return value
