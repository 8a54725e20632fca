"""SigV4 for Amazon Managed Prometheus: the hand computation against the AWS test suite, and botocore's
signature of a fixed AMP query equal to it (``rightsizer.adapters.prometheus.SigV4Auth``)."""

from __future__ import annotations

import hashlib

import botocore.auth
import httpx
import pytest
from botocore.credentials import Credentials

from rightsizer.adapters.prometheus import SigV4Auth
from tests.support.sigv4 import AKID, FROZEN, SECRET, sigv4_by_hand


def test_hand_sigv4_reproduces_the_aws_test_suite_get_vanilla() -> None:
    # aws-sig-v4-test-suite "get-vanilla": GET / host example.amazonaws.com, 20150830T123600Z.
    signed, signature = sigv4_by_hand(
        method="GET",
        path="/",
        query="",
        headers={"Host": "example.amazonaws.com", "X-Amz-Date": "20150830T123600Z"},
        body=b"",
        amz_date="20150830T123600Z",
        region="us-east-1",
        service="service",
    )
    assert signed == "host;x-amz-date"
    assert signature == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"


def test_sigv4_authorization_for_a_fixed_amp_request_matches_the_hand_computation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN fixed credentials, time and request
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: FROZEN)
    url = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-EXAMPLE/api/v1/query"
    request = httpx.Client().build_request("POST", url, data={"query": "up", "time": "1440938160"})
    # WHEN signed for aps
    SigV4Auth(Credentials(AKID, SECRET), "us-east-1").sign(request)
    # THEN the Authorization header equals the independent computation
    body = request.content
    assert body == b"query=up&time=1440938160"
    signed, signature = sigv4_by_hand(
        method="POST",
        path="/workspaces/ws-EXAMPLE/api/v1/query",
        query="",
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "host": "aps-workspaces.us-east-1.amazonaws.com",
            "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
            "x-amz-date": "20150830T123600Z",
        },
        body=body,
        amz_date="20150830T123600Z",
        region="us-east-1",
        service="aps",
    )
    assert request.headers["X-Amz-Date"] == "20150830T123600Z"
    assert request.headers["Authorization"] == (
        f"AWS4-HMAC-SHA256 Credential={AKID}/20150830/us-east-1/aps/aws4_request, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    assert signed == "content-type;host;x-amz-content-sha256;x-amz-date"
