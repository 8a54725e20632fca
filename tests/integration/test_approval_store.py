"""The approval store's contract (``rightsizer.state.ApprovalStore``), held by both stores alike:
:class:`DynamoDbApprovals` on a moto server (real conditional writes) and :class:`MemoryApprovals`.

A request is opened once (a re-entered wait only changes the task token), decided once (the single use
of a link: the condition names status ``pending``, the nonce and the expiry), and a snooze runs until
its end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from rightsizer.adapters.dynamodb_approvals import DynamoDbApprovals
from rightsizer.adapters.memory_state import MemoryApprovals
from rightsizer.state import ApprovalRequest, ApprovalStatus, ApprovalStore, approval_decision
from rightsizer.testing.dynamodb_table import create_state_table

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest) -> Iterator[ApprovalStore]:
    if request.param == "memory":
        yield MemoryApprovals()
        return
    server = request.getfixturevalue("moto_server")
    client = boto3.session.Session(
        region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    ).client("dynamodb", endpoint_url=server.endpoint_url)
    table = f"approvals-{threading.get_ident()}-{id(request)}"
    create_state_table(client, table)
    yield DynamoDbApprovals(client, table, "prod-eks")
    client.delete_table(TableName=table)


def opened(store: ApprovalStore, token: str | None = "t-1") -> ApprovalRequest:
    return store.open_approval(
        ApprovalRequest(
            execution_id="exec-1", node="gpu-1", nonce="n-1", requested_at=T0,
            expires_at=T0 + timedelta(hours=1), task_token=token,
            details={"verdict": "idle", "reasons": ["idle_window_clean"], "hourly_savings_usd": 5.672},
        )
    )  # fmt: skip


def test_open_is_idempotent_and_a_reentered_wait_only_changes_the_token(store: ApprovalStore) -> None:
    first = opened(store)
    assert (first.status, first.nonce, first.task_token, first.notified) == ("pending", "n-1", "t-1", False)
    store.mark_notified("exec-1")
    again = store.open_approval(
        ApprovalRequest(
            "exec-1", "gpu-1", "n-2", T0 + timedelta(minutes=5), T0 + timedelta(hours=2), task_token="t-2"
        )
    )
    assert (again.nonce, again.expires_at, again.task_token, again.notified) == (
        "n-1",
        T0 + timedelta(hours=1),
        "t-2",
        True,
    )
    assert again.details["reasons"] == ["idle_window_clean"] and again.details["hourly_savings_usd"] == 5.672


def test_a_request_is_decided_once(store: ApprovalStore) -> None:
    opened(store)
    now = T0 + timedelta(minutes=10)
    assert (
        store.decide_approval("exec-1", "approved", by="link", now=now, nonce="other") is None
    )  # forged nonce
    decided = store.decide_approval("exec-1", "approved", by="link", now=now, nonce="n-1")
    assert decided is not None and (decided.status, decided.decided_by, decided.decided_at) == (
        "approved",
        "link",
        now,
    )
    assert store.decide_approval("exec-1", "rejected", by="cli:bob", now=now) is None  # reused
    assert store.decide_approval("exec-1", "expired", by="timeout", now=T0 + timedelta(hours=2)) is None
    stored = store.get_approval("exec-1")
    assert stored is not None and stored.status == "approved"
    assert store.decide_approval("missing", "approved", by="link", now=now) is None


def test_an_expired_request_can_only_be_marked_expired(store: ApprovalStore) -> None:
    opened(store)
    late = T0 + timedelta(hours=1)  # expires_at <= now: too late
    assert store.decide_approval("exec-1", "approved", by="cli:alice", now=late) is None
    expired = store.decide_approval("exec-1", "expired", by="timeout", now=late)
    assert expired is not None and expired.status == "expired"


def test_a_snooze_records_its_end_and_runs_until_it(store: ApprovalStore) -> None:
    opened(store)
    until = T0 + timedelta(hours=24)
    snoozed = store.decide_approval("exec-1", "snoozed", by="link", now=T0, nonce="n-1", snooze_until=until)
    assert snoozed is not None and snoozed.snooze_until == until
    store.snooze("gpu-1", until, by="link", now=T0)
    store.snooze("gpu-2", T0 + timedelta(minutes=1), by="cli:alice", now=T0)
    assert store.snoozes(T0) == {"gpu-1": until, "gpu-2": T0 + timedelta(minutes=1)}
    assert store.snoozes(T0 + timedelta(minutes=1)) == {"gpu-1": until}
    assert store.snoozes(until) == {}


@pytest.mark.parametrize(
    ("before", "status", "nonce", "after"),
    [
        (None, "approved", "n-1", timedelta(minutes=10)),
        (None, "rejected", "n-2", timedelta(minutes=10)),  # another request's link
        (None, "snoozed", None, timedelta(minutes=59, seconds=59)),
        (None, "approved", None, timedelta(hours=1)),  # at the deadline
        (None, "expired", None, timedelta(hours=1)),
        ("approved", "rejected", "n-1", timedelta(minutes=10)),  # decided before
        ("rejected", "expired", None, timedelta(hours=2)),
    ],
)
def test_both_stores_decide_exactly_as_the_rule_says(
    store: ApprovalStore, before: ApprovalStatus | None, status: ApprovalStatus, nonce: str | None,
    after: timedelta,
) -> None:  # fmt: skip
    # GIVEN a request, pending or decided before
    opened(store)
    if before is not None:
        assert store.decide_approval("exec-1", before, by="cli:bob", now=T0) is not None
    stored = store.get_approval("exec-1")
    now = T0 + after
    until = now + timedelta(hours=24) if status == "snoozed" else None
    rule = approval_decision(status, by="link", now=now, nonce=nonce, snooze_until=until)

    # WHEN the store decides it
    decided = store.decide_approval("exec-1", status, by="link", now=now, nonce=nonce, snooze_until=until)

    # THEN it wrote exactly when the rule allows it, exactly what the rule applies
    assert (decided is not None) is rule.allows(stored)
    assert stored is not None
    expected = rule.applied(stored) if rule.allows(stored) else stored
    assert store.get_approval("exec-1") == (decided or stored) == expected
