"""Issue 26 item 5: the webhook token and the approval-link key are separate secrets, each re-read on a
short cache, so a rotation reaches a warm function within ``SECRET_MAX_AGE_S`` without a redeploy.

Secrets Manager on moto (server mode), rotated with ``PutSecretValue`` as ``aws secretsmanager
put-secret-value`` does; the webhook runs through its Lambda handler body (the intake the warm function
keeps) and the drain's side signs links through the composition root. The cache age is shortened to a
second so the test waits one second, not five minutes.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import boto3
import pytest

from rightsizer import wiring
from rightsizer.adapters import secrets as secrets_adapter
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.config import Config
from rightsizer.domain.approval import ApprovalClaims, derive_key, sign_token
from rightsizer.localserve import LocalLambdaContext, function_url_event
from rightsizer.services.webhook import MemoryDuplicateGuard
from rightsizer.state import ApprovalRequest
from rightsizer.testing.moto_eks import MotoServer
from rightsizer.webhook_handler import function_url_handler
from tests.unit.test_webhook import RecordingStarter, alert, payload

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

CLUSTER = "prod-eks"
MAX_AGE = 1.0


@pytest.fixture
def secrets(
    moto_server: MotoServer,
    boto_session: boto3.session.Session,
    aws_clients: object,  # the test credentials in the environment, as the functions read them
    monkeypatch: pytest.MonkeyPatch,
) -> object:
    monkeypatch.setattr(secrets_adapter, "SECRET_MAX_AGE_S", MAX_AGE)
    monkeypatch.delenv("RIGHTSIZER_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("RIGHTSIZER_APPROVAL_KEY", raising=False)
    client = boto_session.client("secretsmanager", endpoint_url=moto_server.endpoint_url)
    client.create_secret(Name="rightsizer/webhook-token", SecretString="token-before-rotation-0001")
    client.create_secret(Name="rightsizer/approval-link-key", SecretString="link-key-before-rotation-01")
    return client


def _config(moto_server: MotoServer) -> Config:
    return Config.model_validate(
        {
            "cluster": {"name": CLUSTER},
            "aws": {"region": "us-east-1", "endpoint_url": moto_server.endpoint_url},
            "webhook": {"token_secret": "rightsizer/webhook-token"},
            "approval": {"key_secret": "rightsizer/approval-link-key"},
        }
    )


def _delivery(token: str) -> dict[str, object]:
    import json

    body = json.dumps(payload(alert("firing", "gpu-1", "fp-1"))).encode()
    return function_url_event(
        method="POST", path="/", headers={"authorization": f"Bearer {token}"}, body=body
    )


def test_a_rotated_webhook_token_is_accepted_by_the_warm_intake_and_the_old_one_refused(
    secrets: object, moto_server: MotoServer
) -> None:
    # GIVEN a warm webhook (its intake built once, as the Lambda keeps it)
    intake = wiring.build_intake(
        _config(moto_server),
        starter=RecordingStarter(),
        leases=MemoryState(CLUSTER),
        guard=MemoryDuplicateGuard(),
    )
    handler = function_url_handler(lambda: intake)
    assert handler(_delivery("token-before-rotation-0001"), LocalLambdaContext("1"))["statusCode"] == 202

    # WHEN the token is rotated in Secrets Manager
    secrets.put_secret_value(SecretId="rightsizer/webhook-token", SecretString="token-after-rotation-0002")  # type: ignore[attr-defined]

    # THEN within the cache age the new token works and the old one is refused, with no new intake
    time.sleep(MAX_AGE + 0.2)
    assert handler(_delivery("token-after-rotation-0002"), LocalLambdaContext("2"))["statusCode"] in (
        200,
        202,
    )
    assert handler(_delivery("token-before-rotation-0001"), LocalLambdaContext("3"))["statusCode"] == 401


def test_the_link_key_is_its_own_secret_and_a_rotation_reaches_both_sides(
    secrets: object, moto_server: MotoServer
) -> None:
    config = _config(moto_server)
    store = MemoryState(CLUSTER)  # memory approvals of the same process: the desk reads what the gate opened
    from rightsizer.adapters.memory_state import MemoryApprovals

    approvals = MemoryApprovals()
    now = datetime.now(UTC)
    for n in (1, 2):
        approvals.open_approval(
            ApprovalRequest(
                f"exec-{n}", f"gpu-{n}", f"nonce-{n}", now, now + timedelta(hours=1), task_token=None
            )
        )
    intake = wiring.build_intake(
        config,
        starter=RecordingStarter(),
        leases=store,
        guard=MemoryDuplicateGuard(),
        approval_store=approvals,
    )
    handler = function_url_handler(lambda: intake)

    def click(key: str, n: int) -> int:
        claims = ApprovalClaims(
            "approve", CLUSTER, f"exec-{n}", f"nonce-{n}", int((now + timedelta(hours=1)).timestamp()), 0
        )
        body = urlencode({"token": sign_token(derive_key(key), claims)}).encode()
        event = function_url_event(
            method="POST",
            path="/approval",
            headers={"content-type": "application/x-www-form-urlencoded"},
            body=body,
        )
        return int(handler(event, LocalLambdaContext(f"link-{n}"))["statusCode"])

    # a link signed with a key derived from the webhook token is forged: the key is its own secret
    assert click("token-before-rotation-0001", 1) == 401
    # WHEN the link key rotates, links signed with the old key stop working and new ones work
    secrets.put_secret_value(  # type: ignore[attr-defined]
        SecretId="rightsizer/approval-link-key", SecretString="link-key-after-rotation-02"
    )
    time.sleep(MAX_AGE + 0.2)
    assert click("link-key-before-rotation-01", 1) == 401
    assert click("link-key-after-rotation-02", 2) == 200
    # AND the drain's side signs with the rotated key too
    signing = wiring.approval_key_source(config)
    assert signing is not None and signing() == derive_key("link-key-after-rotation-02")


def test_without_a_configured_link_key_lambda_serves_no_links_and_serve_uses_a_process_key(
    moto_server: MotoServer,
) -> None:
    config = Config.model_validate({"cluster": {"name": CLUSTER}})
    assert wiring.approval_key_source(config, {}) is None
    one, two = (
        wiring.approval_key_source(config, {}, process_key=True),
        wiring.approval_key_source(config, {}, process_key=True),
    )
    assert one is not None and two is not None and one() == two() and len(one()) == 32
    assert one() != derive_key("anything")
