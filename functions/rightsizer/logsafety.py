"""No log level prints a credential (issue 14 "Inputs bounded and validated").

Two layers, installed by every entry point (``rightsizer`` CLI, the Lambda handlers) through
:func:`install`:

1. **SDK loggers never log below INFO.** At DEBUG, botocore prints every signed request (its canonical
   request carries ``X-Amz-Security-Token``) and every response body (a ``GetSecretValue`` answer *is* the
   secret); urllib3, httpx and httpcore print request lines and headers. ``-v`` and ``LOG_LEVEL=DEBUG``
   are for this product's own loggers; ``SDK_LOGGERS`` stay at INFO or above whatever the root level.
2. **Every handler redacts.** :class:`RedactingFilter` on the root logger's handlers (and any handler
   passed to :func:`install`) replaces, in the formatted message and in tracebacks:

   * every value registered with :func:`register_secret` — the webhook token, resolved Prometheus
     secrets, the AWS secret key and session token (from the environment at :func:`install`, as Lambda
     provides them, and from the credentials the EKS token and SigV4 sign with), each EKS bearer token
     as it is built;
   * by pattern: ``Bearer``/``Basic`` credentials, ``k8s-aws-v1.`` tokens, ``X-Amz-Security-Token`` /
     ``X-Amz-Credential`` / ``X-Amz-Signature`` values, ``Signature=`` and ``aws_session_token`` /
     ``aws_secret_access_key`` / ``password`` / ``secret`` assignments.

``tests/integration/test_log_secrets.py`` runs the demo and ``serve`` at DEBUG with planted credentials,
``tests/integration/test_lambda_log_secrets.py`` every Lambda handler as the Lambda runtime runs it
(assess, a drain through approval to removal, the webhook with its approval links, off-hours); neither
finds any of them in the captured logs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

__all__ = [
    "CREDENTIAL_ENV",
    "REDACTED",
    "SDK_LOGGERS",
    "RedactingFilter",
    "install",
    "is_credential_name",
    "redact",
    "redact_url",
    "register_secret",
]

REDACTED: Final = "<redacted>"
#: Third-party loggers whose DEBUG output carries credentials or secret values (module docstring).
SDK_LOGGERS: Final = (
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "httpx",
    "httpcore",
    "kubernetes",
    "werkzeug",
)
#: Registered values shorter than this are not redacted by value (they would mask ordinary words); the
#: patterns still apply. Real tokens and keys are far longer.
MIN_SECRET_LEN: Final = 8

# A URL's userinfo (``https://user:password@host``), whoever prints the URL (issue 26).
_URL_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@'\"<>]+@")
# Credential-bearing query parameters (``?token=``, ``access_token``, ``api_key``, ``X-Amz-Signature``,
# ``sig``, ``password``…), in a URL or a request line.
_CREDENTIAL_WORD: Final = r"(?:token|key|secret|passw(?:or)?d|pwd|auth|sig|signature|credential|session)"
_URL_CREDENTIAL_PARAM: Final = re.compile(
    rf"(?i)([?&;][a-z0-9_.\-]*{_CREDENTIAL_WORD}[a-z0-9_.\-]*=)[^&\s'\"#<>]+"
)
_CREDENTIAL_NAME: Final = re.compile(rf"(?i){_CREDENTIAL_WORD}")

_PATTERNS: Final = (
    # A short lower-case word after "bearer"/"basic" is prose ("wrong bearer token"), never a credential.
    (
        re.compile(
            r"(?i)\b(bearer|basic)(\s+)(?!(?-i:[a-z]{1,7})(?![A-Za-z0-9\-._~+/=]))[A-Za-z0-9\-._~+/]+=*"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"k8s-aws-v1\.[A-Za-z0-9_\-]+"), "k8s-aws-v1." + REDACTED),
    (_URL_USERINFO, r"\1" + REDACTED + "@"),
    (_URL_CREDENTIAL_PARAM, r"\1" + REDACTED),
    (
        re.compile(
            r"(?i)(x-amz-(?:security-token|credential|signature)['\"]?\s*[:=]\s*b?['\"]?)[^'\"&\s,;}]+"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)(signature=)[0-9a-f]{16,}"), r"\1" + REDACTED),
    (
        re.compile(
            r"(?i)((?:aws_)?(?:session_token|secret_access_key|secret_key|password|secret)['\"]?\s*[:=]\s*b?['\"]?)"
            r"[^'\"\s,;}&]+"
        ),
        r"\1" + REDACTED,
    ),
)

_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()


def register_secret(value: str | None) -> None:
    """Redact ``value`` from every log line from now on (no-op for None or values under 8 characters)."""
    global _secrets
    if value and len(value) >= MIN_SECRET_LEN and value not in _secrets:
        with _lock:
            _secrets = _secrets | {value}


def is_credential_name(name: str) -> bool:
    """True for a query parameter or field name that carries a credential (``token``, ``api_key``,
    ``X-Amz-Signature``, ``password``…): its value is redacted from every URL logged."""
    return bool(_CREDENTIAL_NAME.search(name))


def redact_url(url: str) -> str:
    """``url`` without its userinfo and with every credential-bearing query value replaced by
    ``<redacted>`` (the form every log line and error message shows a URL in)."""
    return _URL_CREDENTIAL_PARAM.sub(r"\1" + REDACTED, _URL_USERINFO.sub(r"\1" + REDACTED + "@", url))


def redact(text: str) -> str:
    """``text`` with every registered secret and every credential pattern replaced by ``<redacted>``."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that redacts the formatted message and the traceback of every record."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place (message, args, traceback text); always lets it through."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error path
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER: Final = RedactingFilter()
#: Environment variables that hold credentials (Lambda puts the role's session credentials there).
CREDENTIAL_ENV: Final = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "RIGHTSIZER_WEBHOOK_TOKEN",
    "RIGHTSIZER_APPROVAL_KEY",
)


def _redacting_factory(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        _FILTER.filter(record)
        return record

    make.redacting = True  # type: ignore[attr-defined]
    return make


def install(handlers: Iterable[logging.Handler] = ()) -> None:
    """Redact every log record as it is made, floor the SDK loggers at INFO, and put the redacting
    filter on the root logger's handlers and on ``handlers`` (a Powertools ``Logger``'s, which do not
    propagate to the root); register the credentials of ``CREDENTIAL_ENV`` present in the environment.
    Idempotent.

    The record factory (``logging.setLogRecordFactory``) redacts each record where it is created, before
    any logger's filters or any handler — ours, httpx's INFO request lines, botocore's, urllib3's, a
    handler added later (pytest's, a user's) — sees it; the handler filter is kept for tracebacks, which
    are formatted later."""
    if not getattr(logging.getLogRecordFactory(), "redacting", False):
        logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
    for name in CREDENTIAL_ENV:
        register_secret(os.environ.get(name))
    for name in SDK_LOGGERS:
        sdk = logging.getLogger(name)
        if sdk.getEffectiveLevel() < logging.INFO:
            sdk.setLevel(logging.INFO)
    for handler in [*logging.getLogger().handlers, *handlers]:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
