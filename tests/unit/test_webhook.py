"""Webhook intake (docs/architecture.md §4 "Webhook", §5 "Webhook (contract)") on in-memory ports, no sockets.

Every test asserts the answer *and* the side effects: which drains the recording starter was asked to
start, which cancels the lease store recorded, which keys the duplicate guard holds. De-duplication on
DynamoDB (Powertools Idempotency) is exercised in ``tests/integration/test_webhook_serve.py``.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from alert_webhook import app
from rightsizer import wiring
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.cli import main
from rightsizer.config import Config
from rightsizer.domain.alertmanager import WebhookPayload
from rightsizer.domain.errors import ConfigError, TransientError
from rightsizer.localserve import LocalLambdaContext, function_url_event
from rightsizer.services.drain import DrainRequest
from rightsizer.services.webhook import (
    MAX_BODY_BYTES,
    MemoryDuplicateGuard,
    WebhookIntake,
    WebhookRequest,
    WebhookResponse,
    execution_id_for,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
AM = FIXTURES / "alertmanager"
CASES = FIXTURES / "cases"
TOKEN = "s3cr3t-webhook-token"  # the token of the real Alertmanager 0.25 capture
AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
T0 = datetime(2024, 5, 14, 9, 50, 30, tzinfo=UTC)
LEASE_TTL = 900


class RecordingStarter:
    """``WorkflowStarter`` that records requests; ``fail`` makes the next starts raise."""

    def __init__(self) -> None:
        self.requests: list[DrainRequest] = []
        self.fail: Exception | None = None
        self._lock = threading.Lock()

    def start(self, request: DrainRequest) -> str:
        if self.fail is not None:
            raise self.fail
        with self._lock:
            self.requests.append(request)
        return request.execution_id

    @property
    def nodes(self) -> list[str]:
        return [r.node for r in self.requests]


def alert(
    status: str,
    node: str | None,
    fingerprint: str,
    starts_at: str = "2024-05-14T09:20:00Z",
    ends_at: str = "0001-01-01T00:00:00Z",
    label: str = "node",
) -> dict[str, Any]:
    labels = {"alertname": "GPUNodeIdle", "severity": "info"}
    if node is not None:
        labels[label] = node
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": "GPU node idle"},
        "startsAt": starts_at,
        "endsAt": ends_at,
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any], truncated: int = 0, status: str = "firing") -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GPUNodeIdle"}',
        "truncatedAlerts": truncated,
        "status": status,
        "receiver": "gpu-rightsizer",
        "groupLabels": {"alertname": "GPUNodeIdle"},
        "commonLabels": {"alertname": "GPUNodeIdle"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def post(body: Any, headers: dict[str, str] | None = None) -> WebhookRequest:
    text = body if isinstance(body, str) else json.dumps(body)
    return WebhookRequest(headers=AUTH if headers is None else headers, body=text)


class Harness:
    """An intake over a recording starter, the in-memory lease store and the in-memory guard."""

    def __init__(
        self, node_labels: tuple[str, ...] = ("node", "Hostname", "hostname", "kubernetes_node")
    ) -> None:
        self.starter = RecordingStarter()
        self.state = MemoryState("prod-eks")
        self.guard = MemoryDuplicateGuard()
        self.intake = WebhookIntake(
            token=TOKEN, starter=self.starter, leases=self.state, guard=self.guard, node_labels=node_labels
        )

    def handle(self, request: WebhookRequest) -> WebhookResponse:
        return self.intake.handle(request)

    def lease(self, node: str, owner: str = "sched-1") -> int:
        lease = self.state.acquire(node, owner, T0, LEASE_TTL)
        assert lease is not None
        return lease.epoch

    def cancel_requested(self, node: str) -> bool:
        lease = self.state.get(node)
        return lease is not None and lease.cancel_requested


@pytest.fixture
def h() -> Harness:
    return Harness()


def assert_untouched(h: Harness) -> None:
    assert h.starter.requests == []
    assert h.guard.seen() == []


# --------------------------------------------------------------------------------------------------
# 401 / 413 / 400: refused before anything is looked up
# --------------------------------------------------------------------------------------------------


def test_no_token_is_401_and_nothing_is_touched(h: Harness) -> None:
    # GIVEN a lease that a resolved alert would cancel
    h.lease("gpu-node-a")
    # WHEN the request carries no Authorization header
    response = h.handle(post(payload(alert("resolved", "gpu-node-a", "f1")), headers={}))
    # THEN 401, no start, no cancel, no idempotency key
    assert response.status_code == 401
    assert response.body["error"] == "unauthorized"
    assert_untouched(h)
    assert not h.cancel_requested("gpu-node-a")


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN[:-1]}", "bearer wrong"],
)
def test_wrong_token_is_401(h: Harness, authorization: str) -> None:
    response = h.handle(
        post(payload(alert("firing", "gpu-node-a", "f1")), headers={"Authorization": authorization})
    )
    assert response.status_code == 401
    assert_untouched(h)


def test_token_is_checked_before_the_body_is_parsed_or_measured(h: Harness) -> None:
    # Neither a malformed nor an oversized body tells an unauthenticated caller anything.
    assert h.handle(post("{not json", headers={})).status_code == 401
    assert h.handle(post("x" * (2 * MAX_BODY_BYTES), headers={})).status_code == 401
    assert_untouched(h)


def test_bearer_scheme_is_case_insensitive_and_header_name_any_case(h: Harness) -> None:
    response = h.handle(post(payload(), headers={"AUTHORIZATION": f"bearer {TOKEN}"}))
    assert response.status_code == 200


def test_malformed_json_is_400_with_the_reason(h: Harness) -> None:
    response = h.handle(post('{"version": "4", "alerts": ['))
    assert response.status_code == 400
    assert response.body["error"] == "malformed_json"
    assert "json" in response.body["detail"].lower()
    assert_untouched(h)


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda p: p.pop("alerts"), "alerts: Field required"),
        (lambda p: p["alerts"][0].update(status="pending"), "alerts.0.status"),
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.update(version=4), "version"),
        (lambda p: p["alerts"][0].pop("fingerprint"), "alerts.0.fingerprint"),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "alerts.0.startsAt"),
        (lambda p: p["alerts"][0].update(startsAt="2024-05-14T09:20:00"), "alerts.0.startsAt"),  # no offset
        (lambda p: p["alerts"][0]["labels"].update(node=7), "alerts.0.labels.node"),
        (lambda p: p.update(truncatedAlerts=-1), "truncatedAlerts"),
    ],
    ids=[
        "missing-alerts",
        "bad-status",
        "version-3",
        "version-int",
        "no-fingerprint",
        "bad-time",
        "naive-time",
        "label-not-string",
        "negative-truncation",
    ],
)
def test_schema_violations_are_400_naming_the_field(h: Harness, mutate: Any, where: str) -> None:
    body = payload(alert("firing", "gpu-node-a", "f1"))
    mutate(body)
    response = h.handle(post(body))
    assert response.status_code == 400
    assert response.body["error"] == "invalid_payload"
    assert where in response.body["detail"]
    assert_untouched(h)


def test_a_body_that_is_not_an_object_is_400(h: Harness) -> None:
    for body in ("[]", '"4"', "null"):
        response = h.handle(post(body))
        assert (response.status_code, response.body["error"]) == (400, "invalid_payload")
    assert_untouched(h)


def test_2_mib_body_is_413(h: Harness) -> None:
    big = payload(alert("firing", "gpu-node-a", "f1"))
    big["commonAnnotations"] = {"padding": "x" * (2 * MAX_BODY_BYTES)}
    response = h.handle(post(big))
    assert response.status_code == 413
    assert response.body["error"] == "payload_too_large"
    assert_untouched(h)


def test_body_size_is_measured_after_base64_decoding(h: Harness) -> None:
    # GIVEN a body of 0.9 MiB: its base64 form is 1.2 MiB
    body = payload(alert("firing", "gpu-node-a", "f1"))
    body["commonAnnotations"] = {"padding": "x" * 900_000}
    raw = json.dumps(body).encode()
    encoded = base64.b64encode(raw).decode()
    assert len(raw) <= MAX_BODY_BYTES < len(encoded)
    # WHEN it arrives base64-encoded THEN the decoded size counts: accepted, the drain starts
    response = h.handle(WebhookRequest(AUTH, encoded, is_base64_encoded=True))
    assert response.status_code == 202
    assert h.starter.nodes == ["gpu-node-a"]
    # AND one byte over the limit after decoding is 413
    over = base64.b64encode(b" " * (MAX_BODY_BYTES + 1)).decode()
    assert h.handle(WebhookRequest(AUTH, over, is_base64_encoded=True)).status_code == 413


def test_invalid_base64_is_400(h: Harness) -> None:
    response = h.handle(WebhookRequest(AUTH, "not base64!!", is_base64_encoded=True))
    assert (response.status_code, response.body["error"]) == (400, "invalid_base64")
    assert_untouched(h)


def test_old_alertmanager_payload_without_fingerprints_is_refused_by_name(h: Harness) -> None:
    # The prometheus-msteams capture (19 alerts, no per-alert status or fingerprint): we cannot
    # de-duplicate without a fingerprint, so the whole notification is refused, naming the fields.
    response = h.handle(post((AM / "msteams-large_prom_post_request-19-alerts.json").read_text()))
    assert response.status_code == 400
    assert "alerts.0.status: Field required" in response.body["detail"]
    assert "alerts.0.fingerprint: Field required" in response.body["detail"]
    assert "more" in response.body["detail"]  # 38 errors, the first five named
    assert_untouched(h)


def test_old_alertmanager_alerts_without_node_labels_are_ignored_once_complete(h: Harness) -> None:
    body = json.loads((AM / "msteams-large_prom_post_request-19-alerts.json").read_text())
    for i, item in enumerate(body["alerts"]):
        item.update(status="firing", fingerprint=f"{i:016x}")
    response = h.handle(post(body))
    assert response.status_code == 200
    assert [entry["reason"] for entry in response.body["ignored"]] == ["no_node_label"] * 19
    assert_untouched(h)


# --------------------------------------------------------------------------------------------------
# 200 / 202: per-alert status, truncation, node labels
# --------------------------------------------------------------------------------------------------


def test_resolved_only_without_lease_is_200_and_starts_nothing(h: Harness) -> None:
    response = h.handle(post(payload(alert("resolved", "gpu-node-a", "f1", ends_at="2024-05-14T10:00:00Z"))))
    assert response.status_code == 200
    assert response.body["started"] == [] and response.body["cancelled"] == []
    assert response.body["ignored"] == [{"node": "gpu-node-a", "fingerprint": "f1", "reason": "no_lease"}]
    assert h.starter.requests == []


def test_mixed_group_acts_on_each_alerts_own_status(h: Harness) -> None:
    # GIVEN gpu-node-b is being drained (lease epoch 1) and the group's status says "firing"
    epoch = h.lease("gpu-node-b")
    body = payload(
        alert("firing", "gpu-node-a", "fa"),
        alert("resolved", "gpu-node-b", "fb", ends_at="2024-05-14T09:55:30Z"),
        status="firing",
    )
    # WHEN it arrives
    response = h.handle(post(body))
    # THEN one drain starts for a, and b's lease epoch gets a cancel — not a second drain
    assert response.status_code == 202
    assert h.starter.nodes == ["gpu-node-a"]
    assert h.starter.requests[0].trigger == "alert:fa"
    assert response.body["started"] == [
        {"node": "gpu-node-a", "execution_id": h.starter.requests[0].execution_id, "fingerprint": "fa"}
    ]
    assert response.body["cancelled"] == [{"node": "gpu-node-b", "epoch": epoch, "fingerprint": "fb"}]
    assert h.cancel_requested("gpu-node-b")
    assert not h.cancel_requested("gpu-node-a")


def test_a_resolved_group_status_does_not_resolve_its_firing_alerts(h: Harness) -> None:
    response = h.handle(post(payload(alert("firing", "gpu-node-a", "fa"), status="resolved")))
    assert response.status_code == 202
    assert h.starter.nodes == ["gpu-node-a"]


def test_bug12_truncated_payload_acts_on_present_alerts_and_logs_the_count(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN five nodes known idle; c is already being drained
    case = json.loads((CASES / "BUG-12.json").read_text())
    h.lease("gpu-node-c")
    # WHEN the notification carries two alerts and truncatedAlerts=3
    with caplog.at_level(logging.WARNING, logger="rightsizer.services.webhook"):
        response = h.handle(post(case["webhook_payload"]))
    # THEN a and b start, the missing three are neither resolved nor started
    assert response.status_code == 202
    assert sorted(h.starter.nodes) == ["gpu-node-a", "gpu-node-b"]
    assert response.body["truncated_alerts"] == 3
    assert not h.cancel_requested("gpu-node-c")
    assert h.state.get("gpu-node-c") is not None
    assert any("3 alerts not sent" in r.getMessage() for r in caplog.records)


def test_alert_without_node_label_is_ignored_200(h: Harness) -> None:
    response = h.handle(post(payload(alert("firing", None, "f1"))))
    assert response.status_code == 200
    assert response.body["ignored"] == [{"fingerprint": "f1", "node": None, "reason": "no_node_label"}]
    assert_untouched(h)


def test_node_comes_from_the_first_present_label_in_policy_order(h: Harness) -> None:
    # Prometheus-operator setups often carry both ``node`` and ``Hostname``; ``node`` comes first by default.
    first = alert("firing", "from-node-label", "f1")
    first["labels"]["Hostname"] = "from-hostname-label"
    second = alert("firing", "", "f2")  # an empty value counts as absent
    second["labels"]["kubernetes_node"] = "from-kubernetes-node"
    response = h.handle(post(payload(first, second)))
    assert response.status_code == 202
    assert sorted(h.starter.nodes) == ["from-kubernetes-node", "from-node-label"]
    # AND a policy that prefers Hostname gets Hostname
    other = Harness(node_labels=("Hostname", "node"))
    other.handle(post(payload(first)))
    assert other.starter.nodes == ["from-hostname-label"]


# --------------------------------------------------------------------------------------------------
# De-duplication (BUG-13) and the deterministic execution id
# --------------------------------------------------------------------------------------------------


def test_same_alert_twice_second_is_duplicate_200(h: Harness) -> None:
    body = payload(alert("firing", "gpu-node-a", "f1"))
    assert h.handle(post(body)).status_code == 202
    second = h.handle(post(body))
    assert second.status_code == 200
    assert second.body["duplicates"] == 1
    assert h.starter.nodes == ["gpu-node-a"]


def test_known_alert_inside_a_bigger_group_only_the_new_one_starts(h: Harness) -> None:
    h.handle(post(payload(alert("firing", "gpu-node-a", "f1"))))
    response = h.handle(
        post(payload(alert("firing", "gpu-node-a", "f1"), alert("firing", "gpu-node-b", "f2")))
    )
    assert response.status_code == 202
    assert response.body["duplicates"] == 1
    assert [s["node"] for s in response.body["started"]] == ["gpu-node-b"]
    assert h.starter.nodes == ["gpu-node-a", "gpu-node-b"]


def test_a_new_firing_instance_of_the_same_fingerprint_starts_again(h: Harness) -> None:
    # Same label set (fingerprint), new startsAt: the alert resolved and fired again — a new decision.
    h.handle(post(payload(alert("firing", "gpu-node-a", "f1", starts_at="2024-05-14T09:20:00Z"))))
    h.handle(post(payload(alert("firing", "gpu-node-a", "f1", starts_at="2024-05-14T12:00:00Z"))))
    ids = [r.execution_id for r in h.starter.requests]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_bug13_five_deliveries_start_exactly_one_drain_and_cancel_once(h: Harness) -> None:
    case = json.loads((CASES / "BUG-13.json").read_text())
    statuses = []
    for delivery in case["deliveries"]:
        a = delivery["alert"]
        if a["status"] == "resolved" and h.state.get(a["node"]) is None:
            # the drain the first delivery started holds the node's lease by now
            h.lease(a["node"], owner=h.starter.requests[0].execution_id)
        item = alert(
            a["status"], a["node"], a["fingerprint"], a["startsAt"], a.get("endsAt", "0001-01-01T00:00:00Z")
        )
        statuses.append(h.handle(post(payload(item))).status_code)
    # seq 1 starts, 2-3 are duplicates, 4 records the cancel, 5 is a duplicate
    assert statuses == [202, 200, 200, 202, 200]
    assert len(h.starter.requests) == 1
    assert h.cancel_requested("gpu-node-a")
    assert {k[2] for k in h.guard.seen()} == {"firing", "resolved"}


def test_ha_pair_delivering_at_once_starts_one_drain() -> None:
    # GIVEN a starter slow enough for the second delivery to arrive while the first is in progress
    h = Harness()
    entered, release = threading.Event(), threading.Event()
    original = h.starter.start

    def slow_start(request: DrainRequest) -> str:
        entered.set()
        release.wait(5)
        return original(request)

    h.starter.start = slow_start  # type: ignore[method-assign]
    body = post(payload(alert("firing", "gpu-node-a", "f1")))
    answers: list[int] = []
    first = threading.Thread(target=lambda: answers.append(h.handle(body).status_code))
    first.start()
    assert entered.wait(5)
    # WHEN the HA peer delivers the same alert meanwhile THEN it is a duplicate (in progress)
    assert h.handle(body).status_code == 200
    release.set()
    first.join(5)
    assert answers == [202]
    assert h.starter.nodes == ["gpu-node-a"]


def test_execution_id_is_deterministic_per_alert_instance() -> None:
    parsed = WebhookPayload.model_validate(
        payload(
            alert("firing", "n", "f1", starts_at="2024-05-14T09:20:00Z"),
            alert(
                "resolved", "n", "f1", starts_at="2024-05-14T11:20:00+02:00", ends_at="2024-05-14T10:00:00Z"
            ),
            alert("firing", "n", "f2", starts_at="2024-05-14T09:20:00Z"),
        )
    )
    a, same_instant, other = parsed.alerts
    assert execution_id_for(a) == execution_id_for(same_instant)  # one instant, two spellings
    assert execution_id_for(a) != execution_id_for(other)
    assert execution_id_for(a).startswith("alert-") and len(execution_id_for(a)) == 22


# --------------------------------------------------------------------------------------------------
# BUG-10: Go's zero time
# --------------------------------------------------------------------------------------------------


def test_bug10_zero_ends_at_is_none_and_the_firing_alert_starts(h: Harness) -> None:
    case = json.loads((CASES / "BUG-10.json").read_text())
    parsed = WebhookPayload.model_validate_json(json.dumps(case["webhook_payload"]))
    firing, resolved = parsed.alerts
    assert firing.ends_at is None
    assert firing.starts_at == datetime(2024, 5, 14, 9, 28, 0, 123000, tzinfo=UTC)
    assert resolved.ends_at == datetime(2024, 5, 14, 9, 55, 30, tzinfo=UTC)
    response = h.handle(post(case["webhook_payload"]))
    assert response.status_code == 202
    assert h.starter.nodes == ["gpu-node-a"]
    assert response.body["ignored"] == [
        {"node": "gpu-node-b", "fingerprint": "a1b2c3d4e5f60002", "reason": "no_lease"}
    ]


@pytest.mark.parametrize(
    "zero", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000Z", "0001-01-01T00:00:00+00:00"]
)
def test_every_spelling_of_the_zero_time_is_unset(zero: str) -> None:
    parsed = WebhookPayload.model_validate(payload(alert("firing", "n", "f1", ends_at=zero)))
    assert parsed.alerts[0].ends_at is None


def test_unknown_fields_are_kept_for_forward_compatibility() -> None:
    body = payload(alert("firing", "n", "f1"))
    body["notification_reason"] = "new alerts added"
    body["alerts"][0]["routeLabels"] = {"team": "ml"}
    parsed = WebhookPayload.model_validate(body)
    assert parsed.model_extra == {"notification_reason": "new alerts added"}
    assert parsed.alerts[0].model_extra == {"routeLabels": {"team": "ml"}}


# --------------------------------------------------------------------------------------------------
# Failures: 503, the failed alert is retried, the others are not repeated
# --------------------------------------------------------------------------------------------------


def test_a_failed_start_is_503_and_the_retry_starts_it(h: Harness) -> None:
    h.lease("gpu-node-b")
    body = post(payload(alert("firing", "gpu-node-a", "fa"), alert("resolved", "gpu-node-b", "fb")))
    h.starter.fail = TransientError("StartExecution throttled")
    first = h.handle(body)
    assert first.status_code == 503
    assert first.body["failed"] == [
        {"fingerprint": "fa", "node": "gpu-node-a", "error": "StartExecution throttled"}
    ]
    assert first.body["cancelled"][0]["node"] == "gpu-node-b"  # the other alert was handled
    # WHEN Alertmanager retries the group THEN a starts, b is a duplicate
    h.starter.fail = None
    second = h.handle(body)
    assert second.status_code == 202
    assert h.starter.nodes == ["gpu-node-a"]
    assert second.body["duplicates"] == 1


def test_an_unexpected_error_in_one_alert_does_not_drop_the_group(h: Harness) -> None:
    h.starter.fail = RuntimeError("boom")
    response = h.handle(post(payload(alert("firing", "gpu-node-a", "fa"), alert("firing", None, "fb"))))
    assert response.status_code == 503
    assert response.body["failed"] == [{"fingerprint": "fa", "node": "gpu-node-a", "error": "RuntimeError"}]
    assert response.body["ignored"][0]["fingerprint"] == "fb"
    assert h.guard.seen() == []  # released for the retry


def test_an_empty_token_refuses_to_build() -> None:
    with pytest.raises(ConfigError, match="token"):
        WebhookIntake(
            token="", starter=RecordingStarter(), leases=MemoryState("c"), guard=MemoryDuplicateGuard()
        )


# --------------------------------------------------------------------------------------------------
# The Lambda handler on the real Alertmanager 0.25 events
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def handler_harness() -> Iterator[Harness]:
    h = Harness()
    app.use_intake(h.intake)
    try:
        yield h
    finally:
        app.use_intake(None)


def context(request_id: str) -> Any:
    """A Lambda context stand-in (typed ``Any``: the handler is annotated with Powertools' ``LambdaContext``)."""
    return LocalLambdaContext(aws_request_id=request_id)


def load_event(kind: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((ROOT / "events" / f"alert-webhook-{kind}.json").read_text())
    return event


def test_events_carry_the_real_captured_payloads_and_headers() -> None:
    headers = json.loads((AM / "alertmanager-0.25-webhook.headers.real.json").read_text())["headers"]
    for kind in ("firing", "resolved"):
        event = load_event(kind)
        assert event["body"].encode() == (AM / f"alertmanager-0.25-webhook-{kind}.real.json").read_bytes()
        assert event["headers"]["authorization"] == headers["Authorization"]
        assert event["headers"]["user-agent"] == "Alertmanager/0.25.0"


def test_real_alertmanager_025_firing_then_resolved_through_the_handler(handler_harness: Harness) -> None:
    h = handler_harness
    node = "ip-10-0-1-23.ec2.internal"  # from the ``Hostname`` label
    # WHEN the real firing notification arrives THEN one drain starts, correlated with the request id
    fired = app.lambda_handler(load_event("firing"), context("lambda-1"))
    assert fired["statusCode"] == 202
    assert fired["headers"] == {"content-type": "application/json"}
    body = json.loads(fired["body"])
    assert body["started"] == [
        {"node": node, "execution_id": h.starter.requests[0].execution_id, "fingerprint": "280e8540395e9bb0"}
    ]
    assert app.logger.get_correlation_id() == "c0ffee00-0000-4000-8000-000000000001"
    # AND the drain took the node's lease; the real resolved notification cancels that epoch
    epoch = h.lease(node, owner=h.starter.requests[0].execution_id)
    resolved = app.lambda_handler(load_event("resolved"), context("lambda-2"))
    assert resolved["statusCode"] == 202
    assert json.loads(resolved["body"])["cancelled"] == [
        {"node": node, "epoch": epoch, "fingerprint": "280e8540395e9bb0"}
    ]
    assert h.cancel_requested(node)
    # AND a redelivery of either is a duplicate
    again = app.lambda_handler(load_event("firing"), context("lambda-3"))
    assert (again["statusCode"], json.loads(again["body"])["duplicates"]) == (200, 1)
    assert len(h.starter.requests) == 1


def test_handler_401_on_the_real_event_with_another_token(handler_harness: Harness) -> None:
    event = load_event("firing")
    event["headers"]["authorization"] = "Bearer not-the-token"
    answer = app.lambda_handler(event, context("x"))
    assert answer["statusCode"] == 401
    assert_untouched(handler_harness)


def test_handler_decodes_base64_function_url_bodies(handler_harness: Harness) -> None:
    event = load_event("firing")
    event["body"] = base64.b64encode(event["body"].encode()).decode()
    event["isBase64Encoded"] = True
    assert app.lambda_handler(event, context("x"))["statusCode"] == 202


def test_handler_refuses_an_event_that_is_not_a_function_url_event(handler_harness: Harness) -> None:
    answer = app.lambda_handler({"detail-type": "Scheduled Event"}, context("x"))
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["error"] == "invalid_event"
    assert_untouched(handler_harness)


def test_function_url_event_round_trips_a_request() -> None:
    event = function_url_event(
        method="POST", path="/alerts", headers={"X-A": "1", "x-a": "2", "Host": "h"}, body=b"\xff\x00"
    )
    assert event["headers"]["x-a"] == "1,2"
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == b"\xff\x00"


# --------------------------------------------------------------------------------------------------
# Token, wiring and imports
# --------------------------------------------------------------------------------------------------


def test_token_from_environment_wins_over_the_secret() -> None:
    config = Config.model_validate({"cluster": {"name": "c"}, "webhook": {"token_secret": "env:OTHER"}})
    assert wiring.webhook_token(config, {"RIGHTSIZER_WEBHOOK_TOKEN": "t1", "OTHER": "t2"}) == "t1"
    assert wiring.webhook_token(config, {"OTHER": "t2"}) == "t2"
    with pytest.raises(ConfigError, match="token_secret"):
        wiring.webhook_token(Config.model_validate({"cluster": {"name": "c"}}), {})


def test_serve_without_an_eks_cluster_name_cannot_act_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster: {context: laptop}\n")
    monkeypatch.setenv("RIGHTSIZER_WEBHOOK_TOKEN", TOKEN)
    assert main(["serve", "--config", str(config), "--port", "0"]) == 2
    assert "cluster.name" in capsys.readouterr().err


def test_serve_without_a_token_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster: {name: prod-eks}\n")
    monkeypatch.delenv("RIGHTSIZER_WEBHOOK_TOKEN", raising=False)
    assert main(["serve", "--config", str(config), "--port", "0"]) == 2


def test_the_webhook_handler_imports_no_kubernetes_client_and_no_prometheus_adapter() -> None:
    # A fresh interpreter: this test process has long imported everything.
    code = (
        "import sys, alert_webhook.app, rightsizer.services.webhook\n"
        "bad = sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')"
        " or m.startswith('rightsizer.adapters.prometheus') or m.startswith('rightsizer.adapters.kubernetes'))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
