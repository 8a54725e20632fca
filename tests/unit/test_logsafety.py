"""``rightsizer.logsafety``: every spelling of a credential in a log line is redacted, at every level."""

from __future__ import annotations

import io
import logging

import pytest

from rightsizer import logsafety
from rightsizer.logsafety import REDACTED, SDK_LOGGERS, RedactingFilter, redact, register_secret

TOKEN = "IQoJb3JpZ2luX2VjEXAMPLEsessionTOKEN0123456789"


@pytest.mark.parametrize(
    "line",
    [
        f"Authorization: Bearer {TOKEN}",
        f"headers={{'Authorization': b'Bearer {TOKEN}'}}",
        f"authorization: bearer {TOKEN}",
        f"Authorization: Basic {TOKEN}==",
        f"GET https://sts.amazonaws.com/?Action=GetCallerIdentity&X-Amz-Security-Token={TOKEN}&X-Amz-Date=1",
        f"x-amz-security-token:{TOKEN}",
        f"{{'X-Amz-Security-Token': b'{TOKEN}'}}",
        f"token k8s-aws-v1.{TOKEN}",
        f"{{'aws_session_token': '{TOKEN}'}}",
        f"aws_secret_access_key={TOKEN}",
        f"password: {TOKEN}",
        f"secret={TOKEN}",
        f"X-Amz-Credential={TOKEN}/20240101/us-east-1/sts/aws4_request",
    ],
)
def test_credential_patterns_are_redacted(line: str) -> None:
    cleaned = redact(line)
    assert TOKEN not in cleaned and TOKEN[:16] not in cleaned
    assert REDACTED in cleaned


@pytest.mark.parametrize(
    ("line", "redacted"),
    [
        ("401: missing or wrong bearer token", False),
        ("use Basic auth or a bearer token", False),
        ("Authorization: Bearer abc123", True),
        ("Authorization: Bearer Token", True),
        ("Authorization: bearer tokenvalue", True),
        ("Authorization: Basic dXNlcjpwdw==", True),
    ],
)
def test_prose_after_bearer_stays_and_every_credential_shape_goes(line: str, redacted: bool) -> None:
    # a credential has a digit, an upper-case letter, a symbol or 8+ characters; a short lower-case word is prose
    assert (REDACTED in redact(line)) is redacted
    assert redact(line) == line or redacted


def test_registered_secrets_are_redacted_anywhere_even_in_tracebacks() -> None:
    secret = "webhook-token-only-known-by-value-42"
    register_secret(secret)
    register_secret("short")  # under 8 characters: not redacted by value (would mask ordinary words)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("test.logsafety")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.debug("token is %s", secret)
        try:
            raise ValueError(f"bad token {secret}")
        except ValueError:
            log.exception("failed")
        log.info("a short word stays")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert secret not in text
    assert text.count(REDACTED) == 2  # the message and the exception text
    assert "a short word stays" in text


def test_install_floors_the_sdk_loggers_at_info_whatever_the_root_level() -> None:
    root = logging.getLogger()
    saved = {name: logging.getLogger(name).level for name in SDK_LOGGERS}
    level = root.level
    try:
        root.setLevel(logging.DEBUG)
        for name in SDK_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        logsafety.install()
        assert all(logging.getLogger(n).getEffectiveLevel() >= logging.INFO for n in SDK_LOGGERS)
        assert not logging.getLogger("botocore.endpoint").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("rightsizer").isEnabledFor(logging.DEBUG)  # -v still works for ours
    finally:
        root.setLevel(level)
        for name, value in saved.items():
            logging.getLogger(name).setLevel(value)
