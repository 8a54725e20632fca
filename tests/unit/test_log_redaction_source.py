"""Redaction at the source (issue 26 item 2): once ``logsafety.install`` ran, a record of any logger —
ours, httpx's request lines, botocore's, urllib3's, a library nobody configured — is redacted where it is
made, so a handler added afterwards (a user's, pytest's) never sees a URL's userinfo or a credential query
value; the formatted request line of ``serve`` and arbitrary URL shapes are covered by the same rules."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rightsizer import logsafety

SECRET = "Pl4ntedPassw0rd-Source26"


@pytest.fixture
def late_handler() -> Iterator[io.StringIO]:
    logsafety.install()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # added after install: it has no filter of ours
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize(
    "logger", ["httpx", "botocore.endpoint", "urllib3.connectionpool", "rightsizer", "some.lib"]
)
@pytest.mark.parametrize(
    "url",
    [
        f"http://grafana:{SECRET}@prom.example:9090/api/v1/query",
        f"https://{SECRET}@prom.example/api/v1/query_range",
        f"http://prom.example/api/v1/query?query=up&access_token={SECRET}",
        f"https://proxy.example/q?api_key={SECRET}&step=60",
        f"https://aps.example/ws?X-Amz-Signature={SECRET}",
        f"/approval?token={SECRET}",
        f"http://h/p;password={SECRET}",
    ],
)
def test_a_url_logged_by_any_logger_reaches_no_handler_with_its_credential(
    late_handler: io.StringIO, logger: str, url: str
) -> None:
    logging.getLogger(logger).warning('HTTP Request: %s %s "%s"', "POST", url, "HTTP/1.1 200 OK")
    text = late_handler.getvalue()
    assert "HTTP Request: POST" in text and SECRET not in text, text
    assert logsafety.REDACTED in text


def test_query_values_that_are_not_credentials_are_kept() -> None:
    url = "http://prom:9090/api/v1/query_range?query=up&start=1&end=2&step=60"
    assert logsafety.redact_url(url) == url
