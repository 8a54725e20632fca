"""HTTP auth for the Prometheus adapter (``adapters.prometheus``): SigV4 for Amazon Managed Service for
Prometheus (service ``aps``, botocore's signer) and bearer tokens (Thanos or Prometheus behind an auth
proxy, Grafana Cloud). Basic auth is httpx's own ``httpx.BasicAuth``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from typing import Any, Final, Protocol

import httpx
from botocore.auth import SigV4Auth as _BotocoreSigV4
from botocore.awsrequest import AWSRequest

__all__ = ["IAM_ACTIONS", "BearerAuth", "CredentialsLike", "SigV4Auth"]

#: The AWS actions behind ``auth: sigv4`` (Amazon Managed Service for Prometheus), signed here: the
#: adapter calls only ``/api/v1/query`` and ``/api/v1/query_range``, both ``aps:QueryMetrics``.
IAM_ACTIONS: Final = frozenset({"aps:QueryMetrics"})


class CredentialsLike(Protocol):
    """botocore credentials: ``get_frozen_credentials()`` (refreshable role credentials included)."""

    def get_frozen_credentials(self) -> Any:
        """A consistent (access_key, secret_key, token) triple for one signature."""


class SigV4Auth(httpx.Auth):
    """AWS Signature Version 4 for AMP (service ``aps``) using botocore's signer.

    The request is signed over exactly what httpx will send: method, URL (path and query string), the
    body bytes (``x-amz-content-sha256`` = hex SHA-256 of the body, sent as well), ``host``,
    ``content-type`` and ``x-amz-date`` (plus ``x-amz-security-token`` for session credentials). Only
    those headers are signed: httpx may add or rewrite others (``connection``, ``accept-encoding``) and a
    proxy may too, which would break a signature over them. Credentials are frozen per request, so
    refreshable role credentials rotate without rebuilding the client.
    """

    requires_request_body = True

    def __init__(self, credentials: CredentialsLike, region: str, service: str = "aps") -> None:
        self._credentials = credentials
        self._region = region
        self._service = service

    def sign(self, request: httpx.Request) -> None:
        """Add ``Authorization``, ``X-Amz-Date``, ``X-Amz-Content-SHA256`` (and token) to ``request``."""
        body = request.content
        headers = {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()}
        if "content-type" in request.headers:
            headers["Content-Type"] = request.headers["content-type"]
        aws = AWSRequest(method=request.method, url=str(request.url), data=body, headers=headers)
        # botocore derives the signed ``host`` from the URL the same way httpx writes the Host header
        # (default ports omitted); assert it rather than hope, a mismatch would be a 403 far from here.
        _BotocoreSigV4(self._credentials.get_frozen_credentials(), self._service, self._region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token"):
            value = aws.headers.get(name)
            if value is not None:
                request.headers[name] = value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """httpx hook: sign each attempt afresh (retries get a new date and signature)."""
        self.sign(request)
        yield request


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer <token>`` (Thanos/Prometheus behind an auth proxy, Grafana Cloud…)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """httpx hook: add the header."""
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request
