"""Webhook on real servers: Powertools Idempotency on DynamoDB (moto server), ``rightsizer serve`` over HTTP.

The intake is built exactly as the Lambda builds it (:func:`rightsizer.wiring.build_intake`): leases in
:class:`DynamoDbState` and idempotency items in the same table, reached over HTTP through boto3's
``endpoint_url``. Only the workflow starter is a recording double (Step Functions is wired elsewhere).
Deliveries are sequential on purpose: moto applies conditional writes without a lock (see
``test_state_contract.py``), so true concurrency is tested on the in-memory guard in the unit suite.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from alert_webhook import app
from rightsizer import wiring
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.config import Config
from rightsizer.localserve import LocalLambdaContext, WebhookHTTPServer, build_webhook_server
from rightsizer.services.drain import DrainRequest
from rightsizer.services.webhook import (
    IDEMPOTENCY_EXPIRY_SECONDS,
    MAX_BODY_BYTES,
    MemoryDuplicateGuard,
    WebhookIntake,
    WebhookRequest,
)
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.moto_eks import MotoServer
from tests.unit.test_webhook import AUTH, TOKEN, RecordingStarter, alert, payload

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AM = ROOT / "tests" / "fixtures" / "alertmanager"
CASES = ROOT / "tests" / "fixtures" / "cases"
TABLE = "rightsizer-state"
CLUSTER = "prod-eks"
IDEMPOTENCY_PK = "idempotency#alert_webhook"
T0 = datetime(2024, 5, 14, 9, 50, 30, tzinfo=UTC)


@dataclass
class Backend:
    """The intake on DynamoDB, the recording starter and direct handles on the table."""

    intake: WebhookIntake
    starter: RecordingStarter
    state: DynamoDbState
    client: Any
    config: Config

    def deliver(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        response = self.intake.handle(
            WebhookRequest(AUTH, json.dumps(body)), lambda_context=LocalLambdaContext(aws_request_id="r")
        )
        return response.status_code, response.body

    def idempotency_items(self) -> list[dict[str, Any]]:
        answer = self.client.query(
            TableName=TABLE,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": IDEMPOTENCY_PK}},
            ConsistentRead=True,
        )
        items: list[dict[str, Any]] = answer["Items"]
        return items

    def lease(self, node: str, owner: str) -> int:
        lease = self.state.acquire(node, owner, datetime.now(UTC), 900)
        assert lease is not None
        return lease.epoch


def expected_sk(fingerprint: str, starts_at: str, status: str) -> str:
    # Powertools: sha256 of the JSON of the JMESPath result ``[fingerprint, startsAt, status]``.
    digest = hashlib.sha256(json.dumps([fingerprint, starts_at, status], sort_keys=True).encode()).hexdigest()
    return f"alert#{digest}"


@pytest.fixture
def config(aws_clients: Any, moto_server: MotoServer, boto_session: boto3.session.Session) -> Config:
    client = boto_session.client("dynamodb", endpoint_url=moto_server.endpoint_url)
    create_state_table(client, TABLE)
    return Config.model_validate(
        {
            "cluster": {"name": CLUSTER},
            "aws": {"region": "us-east-1", "endpoint_url": moto_server.endpoint_url, "table": TABLE},
        }
    )


@pytest.fixture
def backend(config: Config, moto_server: MotoServer, boto_session: boto3.session.Session) -> Backend:
    starter = RecordingStarter()
    intake = wiring.build_intake(config, starter=starter, environ={"RIGHTSIZER_WEBHOOK_TOKEN": TOKEN})
    client = boto_session.client("dynamodb", endpoint_url=moto_server.endpoint_url)
    return Backend(intake, starter, DynamoDbState(client, TABLE, CLUSTER), client, config)


# --------------------------------------------------------------------------------------------------
# Powertools Idempotency on DynamoDB
# --------------------------------------------------------------------------------------------------


def test_bug13_five_deliveries_one_start_one_cancel_two_items(backend: Backend) -> None:
    case = json.loads((CASES / "BUG-13.json").read_text())
    statuses = []
    for delivery in case["deliveries"]:
        a = delivery["alert"]
        if a["status"] == "resolved" and backend.state.get(a["node"]) is None:
            backend.lease(a["node"], backend.starter.requests[0].execution_id)
        item = alert(
            a["status"], a["node"], a["fingerprint"], a["startsAt"], a.get("endsAt", "0001-01-01T00:00:00Z")
        )
        statuses.append(backend.deliver(payload(item))[0])
    # THEN exactly one drain, one cancel; the HA duplicate, the repeat and the second resolved are no-ops
    assert statuses == [202, 200, 200, 202, 200]
    assert backend.starter.nodes == ["gpu-node-a"]
    lease = backend.state.get("gpu-node-a")
    assert lease is not None and lease.cancel_requested
    # AND the table holds one completed item per (fingerprint, startsAt, status), expiring in 7 days
    items = {i["sk"]["S"]: i for i in backend.idempotency_items()}
    starts = "2024-05-14T09:20:00.000000+00:00"  # canonical: UTC, µs
    assert set(items) == {
        expected_sk("d00000000000000a", starts, "firing"),
        expected_sk("d00000000000000a", starts, "resolved"),
    }
    now = datetime.now(UTC).timestamp()
    for item in items.values():
        assert item["status"]["S"] == "COMPLETED"
        assert abs(int(item["ttl"]["N"]) - (now + IDEMPOTENCY_EXPIRY_SECONDS)) < 120
    started = json.loads(items[expected_sk("d00000000000000a", starts, "firing")]["data"]["S"])
    assert started == {
        "outcome": "started",
        "node": "gpu-node-a",
        "execution_id": backend.starter.requests[0].execution_id,
        "fingerprint": "d00000000000000a",
    }


def test_same_alert_twice_then_inside_a_bigger_group(backend: Backend) -> None:
    first = alert("firing", "gpu-node-a", "e00000000000000a")
    assert backend.deliver(payload(first))[0] == 202
    status, body = backend.deliver(payload(first))
    assert (status, body["duplicates"]) == (200, 1)
    status, body = backend.deliver(payload(first, alert("firing", "gpu-node-b", "e00000000000000b")))
    assert status == 202
    assert body["duplicates"] == 1
    assert [s["node"] for s in body["started"]] == ["gpu-node-b"]
    assert backend.starter.nodes == ["gpu-node-a", "gpu-node-b"]
    assert len(backend.idempotency_items()) == 2


def test_a_delivery_while_the_first_is_in_progress_is_a_duplicate(backend: Backend) -> None:
    # GIVEN a starter during whose StartExecution the HA peer delivers the same alert
    body = payload(alert("firing", "gpu-node-a", "e00000000000000c"))
    inner: list[int] = []
    during: list[dict[str, Any]] = []
    original = backend.starter.start

    def start_with_redelivery(request: DrainRequest) -> str:
        during.extend(backend.idempotency_items())
        inner.append(backend.deliver(body)[0])
        return original(request)

    backend.starter.start = start_with_redelivery  # type: ignore[method-assign]
    # WHEN delivered THEN the nested delivery saw the INPROGRESS item: IdempotencyAlreadyInProgressError
    assert backend.deliver(body)[0] == 202
    assert inner == [200]
    assert backend.starter.nodes == ["gpu-node-a"]
    # AND the Lambda context was registered: the in-progress item expires with the invocation (ms),
    # so a crash mid-start is retried on the next delivery instead of blocking for 7 days
    (in_progress,) = during
    assert in_progress["status"]["S"] == "INPROGRESS"
    now_ms = datetime.now(UTC).timestamp() * 1000
    assert now_ms < int(in_progress["in_progress_expiration"]["N"]) <= now_ms + 31_000
    (item,) = backend.idempotency_items()
    assert item["status"]["S"] == "COMPLETED"


def test_a_failed_start_leaves_no_item_and_the_retry_starts(backend: Backend) -> None:
    body = payload(alert("firing", "gpu-node-a", "e00000000000000d"))
    backend.starter.fail = RuntimeError("states:StartExecution failed")
    assert backend.deliver(body)[0] == 503
    assert backend.idempotency_items() == []
    backend.starter.fail = None
    assert backend.deliver(body)[0] == 202
    assert backend.starter.nodes == ["gpu-node-a"]


def test_resolved_without_lease_is_200_and_recorded_once(backend: Backend) -> None:
    body = payload(alert("resolved", "gpu-node-z", "e00000000000000e", ends_at="2024-05-14T10:00:00Z"))
    status, answer = backend.deliver(body)
    assert (status, answer["ignored"][0]["reason"]) == (200, "no_lease")
    assert backend.deliver(body)[1]["duplicates"] == 1
    assert backend.starter.requests == []
    assert backend.state.get("gpu-node-z") is None


def test_a_cancel_only_names_the_epoch_held_now(backend: Backend) -> None:
    # GIVEN the node's lease was released and taken again by a newer drain (epoch 2)
    old = backend.lease("gpu-node-a", "first")
    assert backend.state.release("gpu-node-a", "first", old)
    new = backend.lease("gpu-node-a", "second")
    # WHEN the alert resolves THEN the cancel carries the current epoch
    status, body = backend.deliver(payload(alert("resolved", "gpu-node-a", "e00000000000000f")))
    assert status == 202
    assert body["cancelled"] == [{"node": "gpu-node-a", "epoch": new, "fingerprint": "e00000000000000f"}]
    assert new == old + 1


def test_token_from_secrets_manager(
    config: Config, moto_server: MotoServer, boto_session: boto3.session.Session
) -> None:
    sm = boto_session.client("secretsmanager", endpoint_url=moto_server.endpoint_url)
    sm.create_secret(Name="rightsizer/webhook-token", SecretString="from-secrets-manager")
    with_secret = config.model_copy(
        update={"webhook": config.webhook.model_copy(update={"token_secret": "rightsizer/webhook-token"})}
    )
    assert wiring.webhook_token(with_secret, {}) == "from-secrets-manager"


# --------------------------------------------------------------------------------------------------
# rightsizer serve over real HTTP on 127.0.0.1
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def serving() -> Iterator[tuple[WebhookHTTPServer, RecordingStarter, MemoryState]]:
    starter, state = RecordingStarter(), MemoryState(CLUSTER)
    config = Config.model_validate({"cluster": {"name": CLUSTER}})
    server = build_webhook_server(
        config,
        starter=starter,
        state=state,
        guard=MemoryDuplicateGuard(),
        environ={"RIGHTSIZER_WEBHOOK_TOKEN": TOKEN},
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, starter, state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        app.use_intake(None)


def captured_headers() -> dict[str, str]:
    headers: dict[str, str] = json.loads((AM / "alertmanager-0.25-webhook.headers.real.json").read_text())[
        "headers"
    ]
    return {k: v for k, v in headers.items() if k not in ("Host", "Content-Length")}


def test_serve_answers_401_400_413_202_200_over_http(
    serving: tuple[WebhookHTTPServer, RecordingStarter, MemoryState],
) -> None:
    server, starter, state = serving
    assert server.server_address[0] == "127.0.0.1"
    firing = (AM / "alertmanager-0.25-webhook-firing.real.json").read_bytes()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        # 401: no token, wrong token
        assert client.post("/alertmanager", content=firing).status_code == 401
        wrong = client.post("/alertmanager", content=firing, headers={"Authorization": "Bearer nope"})
        assert (wrong.status_code, wrong.json()["error"]) == (401, "unauthorized")
        # 400: malformed JSON, schema
        bad = client.post("/alertmanager", content=b"{oops", headers=captured_headers())
        assert (bad.status_code, bad.json()["error"]) == (400, "malformed_json")
        schema = client.post("/alertmanager", json={"version": "4"}, headers=captured_headers())
        assert schema.status_code == 400
        assert "alerts: Field required" in schema.json()["detail"]
        assert starter.requests == []
        # 202: the real Alertmanager 0.25 notification, with its captured headers
        ok = client.post("/alertmanager", content=firing, headers=captured_headers())
        assert ok.status_code == 202
        assert ok.headers["content-type"] == "application/json"
        assert ok.json()["started"][0]["node"] == "ip-10-0-1-23.ec2.internal"
        # 200: the same delivery again
        again = client.post("/alertmanager", content=firing, headers=captured_headers())
        assert (again.status_code, again.json()["duplicates"]) == (200, 1)
        # 413: 2 MiB, and the connection is closed rather than reading it all into memory
        big = client.post("/alertmanager", content=b"x" * (2 * MAX_BODY_BYTES), headers=captured_headers())
        assert (big.status_code, big.json()["error"]) == (413, "payload_too_large")
        # GET is not the webhook
        assert client.get("/alertmanager").status_code == 405
    assert starter.nodes == ["ip-10-0-1-23.ec2.internal"]
    assert state.get("ip-10-0-1-23.ec2.internal") is None  # the webhook never takes leases itself


def test_serve_resolved_cancels_the_lease_over_http(
    serving: tuple[WebhookHTTPServer, RecordingStarter, MemoryState],
) -> None:
    server, starter, state = serving
    node = "ip-10-0-1-23.ec2.internal"
    lease = state.acquire(node, "alert-x", T0, 900)
    assert lease is not None
    resolved = (AM / "alertmanager-0.25-webhook-resolved.real.json").read_bytes()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        answer = client.post("/alertmanager", content=resolved, headers=captured_headers())
    assert answer.status_code == 202
    assert answer.json()["cancelled"] == [
        {"node": node, "epoch": lease.epoch, "fingerprint": "280e8540395e9bb0"}
    ]
    held = state.get(node)
    assert held is not None and held.cancel_requested
    assert starter.requests == []


def test_serve_on_the_dynamodb_table_path(config: Config, boto_session: boto3.session.Session) -> None:
    # The default serve wiring with ``aws.table``: DynamoDbState + Powertools Idempotency on the table.
    starter = RecordingStarter()
    server = build_webhook_server(config, starter=starter, environ={"RIGHTSIZER_WEBHOOK_TOKEN": TOKEN})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    firing = (AM / "alertmanager-0.25-webhook-firing.real.json").read_bytes()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            statuses = [
                client.post("/", content=firing, headers=captured_headers()).status_code for _ in range(3)
            ]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        app.use_intake(None)
    assert statuses == [202, 200, 200]
    assert starter.nodes == ["ip-10-0-1-23.ec2.internal"]
    dynamodb = boto_session.client("dynamodb", endpoint_url=config.aws.endpoint_url)
    items = dynamodb.query(
        TableName=TABLE,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": IDEMPOTENCY_PK}},
    )["Items"]
    assert [i["sk"]["S"] for i in items] == [
        expected_sk("280e8540395e9bb0", "2026-11-29T15:04:16.835000+00:00", "firing")
    ]
