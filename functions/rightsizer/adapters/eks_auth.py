"""EKS authentication: cluster endpoint and CA, and the presigned-STS bearer token the API server accepts.

The token is what ``aws eks get-token`` prints: ``k8s-aws-v1.`` + base64url (no padding) of a presigned
``sts:GetCallerIdentity`` URL whose signature covers the header ``x-k8s-aws-id: <cluster name>``, with
``X-Amz-Expires=60``. The API server (aws-iam-authenticator) accepts such a token for about 15 minutes
after ``X-Amz-Date`` whatever ``X-Amz-Expires`` says, and AWS declined to make that longer
(aws/aws-cli#5185), so :class:`EksTokenSource` rebuilds it when it is older than 10 minutes and on demand
after a 401 (BUG-31). Tokens are built lazily — per invocation, never at import.

IAM actions needed:

- ``eks:DescribeCluster`` — endpoint and ``certificateAuthority.data`` (:func:`describe_cluster`);
- none for the token itself: ``sts:GetCallerIdentity`` cannot be denied by IAM policy, and presigning is
  local (no network call). :func:`caller_identity` calls it only to name the identity in error messages.

RBAC verbs: none here; the identity's Kubernetes permissions come from an EKS access entry (or the
``aws-auth`` ConfigMap) — see :mod:`rightsizer.adapters.kubernetes`.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from botocore.auth import SIGV4_TIMESTAMP, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import BotoCoreError, ClientError

from rightsizer.adapters.sdk_errors import SDK_ERRORS, ResponseParserError
from rightsizer.domain.errors import ConfigError, PermanentError, TransientError
from rightsizer.logsafety import register_secret

if TYPE_CHECKING:
    from mypy_boto3_eks.client import EKSClient
    from mypy_boto3_sts.client import STSClient

__all__ = [
    "REFRESH_AFTER_S",
    "TOKEN_PREFIX",
    "ClusterEndpoint",
    "EksTokenSource",
    "build_token",
    "caller_identity",
    "describe_cluster",
    "write_ca_bundle",
]

#: The AWS actions this module calls. ``sts:GetCallerIdentity`` (the identity in the ``whoami`` check
#: and the presigned token itself) needs no IAM grant: AWS always allows it.
IAM_ACTIONS: Final = frozenset({"eks:DescribeCluster", "sts:GetCallerIdentity"})

TOKEN_PREFIX: Final = "k8s-aws-v1."  # noqa: S105 - a format prefix, not a secret
#: The header aws-iam-authenticator requires inside the signature; it binds the token to one cluster.
CLUSTER_ID_HEADER: Final = "x-k8s-aws-id"
#: What ``aws eks get-token`` uses; the server applies its own ~15 min validity on top.
PRESIGN_EXPIRES_S: Final = 60
#: Rebuild well before the ~15 min server-side validity, leaving room for one long request (BUG-31).
REFRESH_AFTER_S: Final = 600.0

Clock = Callable[[], float]
"""Unix seconds; ``time.time`` in production, a test-controlled function in tests."""


class _PresignAt(SigV4QueryAuth):
    """botocore's query-string SigV4 with the signing time taken from our clock, not the wall clock.

    Only ``add_auth`` changes (it reads the time itself in botocore); canonicalisation, scope and the
    signature stay botocore's, so the URL is exactly what ``generate_presigned_url`` would produce.
    """

    def __init__(self, credentials: ReadOnlyCredentials, region: str, at: datetime) -> None:
        super().__init__(credentials, "sts", region, expires=PRESIGN_EXPIRES_S)
        self._at = at

    def add_auth(self, request: AWSRequest) -> None:
        request.context["timestamp"] = self._at.astimezone(UTC).strftime(SIGV4_TIMESTAMP)
        # botocore-stubs leave out these two protected steps of SigV4QueryAuth.add_auth.
        steps: Any = super()
        steps._modify_request_before_signing(request)
        canonical = self.canonical_request(request)
        signature = self.signature(self.string_to_sign(request, canonical), request)
        steps._inject_signature_to_request(request, signature)


def sts_endpoint_for(region: str) -> str:
    """The regional STS endpoint (``https://sts.<region>.amazonaws.com``; ``.com.cn`` in China)."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://sts.{region}.{suffix}"


def build_token(
    credentials: ReadOnlyCredentials,
    cluster: str,
    region: str,
    at: datetime,
    *,
    sts_endpoint: str | None = None,
) -> str:
    """Build an EKS bearer token (the ``aws eks get-token`` format) signed at ``at``.

    Args:
        credentials: access key, secret key and optional session token (a Lambda role's are temporary).
        cluster: the EKS cluster name, signed in as ``x-k8s-aws-id``.
        region: the STS signing region.
        at: signing time (aware); becomes ``X-Amz-Date``.
        sts_endpoint: STS base URL; default the regional endpoint of ``region``.

    Returns:
        ``k8s-aws-v1.<base64url of the presigned GetCallerIdentity URL, no padding>``.
    """
    if at.tzinfo is None:
        raise ValueError("build_token needs an aware datetime")
    base = (sts_endpoint or sts_endpoint_for(region)).rstrip("/")
    query = urlencode({"Action": "GetCallerIdentity", "Version": "2011-06-15"})
    request = AWSRequest(method="GET", url=f"{base}/?{query}", headers={CLUSTER_ID_HEADER: cluster})
    _PresignAt(credentials, region, at).add_auth(request)
    encoded = base64.urlsafe_b64encode(str(request.url).encode("utf-8")).decode("ascii")
    return TOKEN_PREFIX + encoded.rstrip("=")


def caller_identity(sts: STSClient) -> str:
    """The ARN of the AWS identity signing the tokens (``sts:GetCallerIdentity``), for error messages.

    Never raises: when STS cannot answer, the text says so instead, since this only decorates another
    error.
    """
    try:
        return str(sts.get_caller_identity()["Arn"])
    except (ClientError, BotoCoreError, ResponseParserError) as exc:
        return f"<unknown identity: sts:GetCallerIdentity failed: {exc}>"


class EksTokenSource:
    """Hands out an EKS bearer token, rebuilding it when older than ``refresh_after`` s or invalidated.

    Thread-safe. ``credentials`` is called at every rebuild, so refreshing role credentials (Lambda,
    ``AssumeRole``) are picked up; ``identity`` is looked up once, lazily, and only for error messages.
    """

    def __init__(
        self,
        cluster: str,
        region: str,
        credentials: Callable[[], ReadOnlyCredentials],
        *,
        clock: Clock = time.time,
        refresh_after: float = REFRESH_AFTER_S,
        sts_endpoint: str | None = None,
        identity: Callable[[], str] | None = None,
    ) -> None:
        """Args: cluster name; STS region; credentials provider; clock (Unix s); refresh_after (s);
        sts_endpoint (default regional); identity (ARN lookup, e.g. ``caller_identity`` bound to a client)."""
        self.cluster = cluster
        self.region = region
        self._credentials = credentials
        self._clock = clock
        self._refresh_after = refresh_after
        self._sts_endpoint = sts_endpoint
        self._identity_lookup = identity
        self._identity: str | None = None
        self._lock = threading.Lock()
        self._token: str | None = None
        self._built_at = 0.0
        self.builds = 0
        """How many tokens were built (for logs and tests)."""

    def token(self) -> str:
        """The current token; a new one when none exists, it is ``refresh_after`` s old, or invalidated."""
        with self._lock:
            now = self._clock()
            if self._token is None or now - self._built_at >= self._refresh_after:
                self._token = build_token(
                    self._credentials(),
                    self.cluster,
                    self.region,
                    datetime.fromtimestamp(now, UTC),
                    sts_endpoint=self._sts_endpoint,
                )
                register_secret(self._token)  # a bearer credential for ~15 minutes: never logged
                self._built_at = now
                self.builds += 1
            return self._token

    def invalidate(self) -> None:
        """Forget the current token (the API server answered 401); the next ``token()`` builds anew."""
        with self._lock:
            self._token = None

    def identity(self) -> str:
        """The IAM ARN behind the token (looked up once), or a description when unknown."""
        if self._identity is None:
            self._identity = self._identity_lookup() if self._identity_lookup else "<unknown AWS identity>"
        return self._identity


@dataclass(frozen=True)
class ClusterEndpoint:
    """An EKS cluster's API server: ``endpoint`` URL and the PEM CA bundle that signs its certificate."""

    name: str
    endpoint: str
    ca_pem: bytes


def describe_cluster(eks: EKSClient, name: str) -> ClusterEndpoint:
    """Read the API endpoint and CA of cluster ``name`` (``eks:DescribeCluster``).

    Returns ``ca_pem`` as the base64-decoded ``certificateAuthority.data``, unchecked (see
    :func:`write_ca_bundle`).

    Raises:
        ConfigError: no such cluster in the client's region (``cluster.name`` / ``cluster.region``).
        PermanentError: access denied, the cluster has no endpoint yet, or the CA is not base64.
        TransientError: throttling, 5xx, network failure.
    """
    try:
        cluster = eks.describe_cluster(name=name)["cluster"]
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "ResourceNotFoundException":
            raise ConfigError(
                f"EKS cluster {name!r} not found in {eks.meta.region_name}", field="cluster.name"
            ) from exc
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("ThrottlingException", "ServiceUnavailableException") or status >= 500:
            raise TransientError(f"eks:DescribeCluster {name}: {code}") from exc
        raise PermanentError(f"eks:DescribeCluster {name}: {code}: {exc}") from exc
    except SDK_ERRORS as exc:
        raise TransientError(f"eks:DescribeCluster {name}: {exc}") from exc
    endpoint = str(cluster.get("endpoint") or "")
    if not endpoint:
        raise PermanentError(f"EKS cluster {name!r} has no API endpoint (status {cluster.get('status')})")
    data = str(cluster.get("certificateAuthority", {}).get("data") or "")
    try:
        ca_pem = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PermanentError(f"EKS cluster {name!r}: certificateAuthority.data is not base64") from exc
    return ClusterEndpoint(name=name, endpoint=endpoint, ca_pem=ca_pem)


def write_ca_bundle(ca_pem: bytes, directory: str | Path) -> Path:
    """Write a PEM CA bundle to ``directory/ca.crt`` for the Kubernetes client (it takes a file path).

    Raises:
        PermanentError: the bytes hold no PEM certificate — TLS would fail on every request, so fail
            now with a clear message instead (moto's DescribeCluster answers random bytes here).
    """
    if b"-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise PermanentError("the cluster CA (certificateAuthority.data) is not a PEM certificate")
    path = Path(directory) / "ca.crt"
    path.write_bytes(ca_pem)
    return path


def frozen_credentials(session: Any) -> Callable[[], ReadOnlyCredentials]:
    """A credentials provider over a ``boto3.Session``: the session's (refreshing) credentials, frozen
    at each call so one token is signed with one consistent triple.

    Raises (when called):
        PermanentError: the session has no credentials at all.
    """

    def provide() -> ReadOnlyCredentials:
        creds = session.get_credentials()
        if creds is None:
            raise PermanentError("no AWS credentials to sign the EKS token with")
        frozen: ReadOnlyCredentials = creds.get_frozen_credentials()
        register_secret(frozen.secret_key)
        register_secret(frozen.token)
        return frozen

    return provide
