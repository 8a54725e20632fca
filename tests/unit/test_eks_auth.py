"""EKS bearer tokens (BUG-31): exact format, deterministic signing time, refresh policy, CA bundle."""

from __future__ import annotations

import base64
import re
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore import auth as botocore_auth
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import (
    REFRESH_AFTER_S,
    TOKEN_PREFIX,
    EksTokenSource,
    build_token,
    sts_endpoint_for,
    write_ca_bundle,
)
from rightsizer.domain.errors import PermanentError

CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
AT = datetime(2024, 5, 14, 10, 0, 0, tzinfo=UTC)  # BUG-31 scenario A: token_created_at


def decode(token: str) -> str:
    body = token.removeprefix(TOKEN_PREFIX)
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def query_of(token: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(decode(token)).query).items()}


class Clock:
    def __init__(self, start: datetime) -> None:
        self.t = start.timestamp()

    def __call__(self) -> float:
        return self.t


def test_token_has_the_aws_eks_get_token_format() -> None:
    # GIVEN credentials and a cluster WHEN a token is built at the BUG-31 instant
    token = build_token(CREDS, "prod-eks", "us-east-1", AT)

    # THEN it is the prefix + base64url without padding of a presigned GetCallerIdentity URL
    assert token.startswith("k8s-aws-v1.")
    assert "=" not in token
    assert re.fullmatch(r"k8s-aws-v1\.[A-Za-z0-9_-]+", token)
    url = urlsplit(decode(token))
    assert (url.scheme, url.netloc, url.path) == ("https", "sts.us-east-1.amazonaws.com", "/")
    q = query_of(token)
    assert q["Action"] == "GetCallerIdentity"
    assert q["Version"] == "2011-06-15"
    assert q["X-Amz-Expires"] == "60"
    assert q["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert q["X-Amz-SignedHeaders"].split(";") == ["host", "x-k8s-aws-id"]
    assert q["X-Amz-Date"] == "20240514T100000Z"
    assert q["X-Amz-Credential"] == "AKIDEXAMPLE/20240514/us-east-1/sts/aws4_request"
    assert re.fullmatch(r"[0-9a-f]{64}", q["X-Amz-Signature"])
    assert "X-Amz-Security-Token" not in q


def test_session_token_travels_in_the_url() -> None:
    creds = ReadOnlyCredentials("ASIAEXAMPLE", "secret", "session-token/with+chars")
    q = query_of(build_token(creds, "prod-eks", "eu-west-1", AT))
    assert q["X-Amz-Security-Token"] == "session-token/with+chars"
    assert q["X-Amz-Credential"].endswith("/eu-west-1/sts/aws4_request")


def test_signature_equals_botocores_own_presign_at_the_same_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN botocore's stock SigV4QueryAuth with its clock pinned to the same instant
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda *a, **k: AT.replace(tzinfo=None))
    request = AWSRequest(
        method="GET",
        url="https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
        headers={"x-k8s-aws-id": "prod-eks"},
    )
    SigV4QueryAuth(CREDS, "sts", "us-east-1", expires=60).add_auth(request)

    # THEN our clock-driven token carries exactly the URL botocore would have presigned
    assert decode(build_token(CREDS, "prod-eks", "us-east-1", AT)) == request.url


def test_the_cluster_name_is_signed() -> None:
    a = query_of(build_token(CREDS, "prod-eks", "us-east-1", AT))
    b = query_of(build_token(CREDS, "other", "us-east-1", AT))
    assert a["X-Amz-Signature"] != b["X-Amz-Signature"]


def test_signing_time_comes_from_the_argument_not_the_wall_clock() -> None:
    assert build_token(CREDS, "c", "us-east-1", AT) == build_token(CREDS, "c", "us-east-1", AT)
    later = build_token(CREDS, "c", "us-east-1", AT + timedelta(seconds=1))
    assert query_of(later)["X-Amz-Date"] == "20240514T100001Z"


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        build_token(CREDS, "c", "us-east-1", datetime(2024, 5, 14, 10, 0))  # noqa: DTZ001


def test_china_and_override_endpoints() -> None:
    assert sts_endpoint_for("cn-north-1") == "https://sts.cn-north-1.amazonaws.com.cn"
    token = build_token(CREDS, "c", "us-east-1", AT, sts_endpoint="http://127.0.0.1:5000/")
    assert decode(token).startswith("http://127.0.0.1:5000/?Action=GetCallerIdentity")


def test_token_source_refreshes_when_older_than_ten_minutes() -> None:
    # GIVEN a token source on a test clock
    clock = Clock(AT)
    fetched: list[int] = []

    def credentials() -> ReadOnlyCredentials:
        fetched.append(1)
        return CREDS

    source = EksTokenSource("prod-eks", "us-east-1", credentials, clock=clock)
    first = source.token()

    # WHEN less than 10 minutes pass THEN the same token is reused
    clock.t += REFRESH_AFTER_S - 1
    assert source.token() == first
    assert source.builds == 1

    # WHEN it is 10 minutes old THEN a new token is signed at the new instant
    clock.t += 1
    second = source.token()
    assert second != first
    assert query_of(second)["X-Amz-Date"] == "20240514T101000Z"
    assert source.builds == 2
    assert len(fetched) == 2  # credentials are re-read per build (rotating role credentials)


def test_invalidate_forces_a_rebuild_after_a_401() -> None:
    clock = Clock(AT)
    source = EksTokenSource("prod-eks", "us-east-1", lambda: CREDS, clock=clock)
    first = source.token()
    clock.t += 30
    source.invalidate()
    assert source.token() != first
    assert source.builds == 2


def test_identity_is_looked_up_once_and_only_when_asked() -> None:
    calls: list[int] = []

    def lookup() -> str:
        calls.append(1)
        return "arn:aws:sts::000000000000:assumed-role/gpu-rightsizer-lambda/fn"

    source = EksTokenSource("c", "us-east-1", lambda: CREDS, identity=lookup)
    source.token()
    assert calls == []
    assert source.identity().endswith("gpu-rightsizer-lambda/fn")
    assert source.identity().endswith("gpu-rightsizer-lambda/fn")
    assert calls == [1]


def _self_signed_ca_pem() -> bytes:
    x509 = pytest.importorskip("cryptography.x509", reason="the cryptography package is not installed")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
    return pem


def test_ca_bundle_from_describe_cluster_loads_into_a_tls_context(tmp_path: Path) -> None:
    # GIVEN a real CA certificate as EKS returns it (base64 of PEM, decoded by describe_cluster)
    pem = _self_signed_ca_pem()

    # WHEN it is written for the client THEN a TLS context trusts exactly that CA
    path = write_ca_bundle(pem, tmp_path)
    context = ssl.create_default_context(cafile=str(path))
    assert context.cert_store_stats()["x509_ca"] == 1


def test_ca_bundle_that_is_not_pem_fails_before_any_request(tmp_path: Path) -> None:
    # moto's DescribeCluster answers random bytes as certificateAuthority.data
    with pytest.raises(PermanentError, match="not a PEM certificate"):
        write_ca_bundle(b"\x8f\x00random", tmp_path)
    assert not (tmp_path / "ca.crt").exists()
