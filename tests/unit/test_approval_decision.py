"""The one rule of deciding an approval request (``rightsizer.state.approval_decision``), without a store.

Both stores call it and only do the conditional write (``tests/integration/test_approval_store.py`` holds
them to it): decided once while ``pending``, by a link only with its nonce, and — except when marking it
``expired`` — only before ``expires_at``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rightsizer.state import ApprovalRequest, ApprovalStatus, approval_decision

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
EXPIRES = T0 + timedelta(hours=1)


def pending(status: ApprovalStatus = "pending") -> ApprovalRequest:
    return ApprovalRequest("exec-1", "gpu-1", "n-1", T0, EXPIRES, status=status)


@pytest.mark.parametrize(
    ("stored", "status", "nonce", "now", "allowed"),
    [
        (pending(), "approved", None, T0, True),  # the CLI: no nonce
        (pending(), "approved", "n-1", T0, True),  # a link with the request's nonce
        (pending(), "rejected", "n-2", T0, False),  # a link of another request (forged or old)
        (pending(), "snoozed", "n-1", EXPIRES - timedelta(seconds=1), True),
        (pending(), "approved", "n-1", EXPIRES, False),  # at the deadline: too late
        (pending(), "approved", None, EXPIRES + timedelta(hours=1), False),
        (pending(), "expired", None, EXPIRES, True),  # the timeout marks it at its deadline
        (pending(), "expired", None, EXPIRES + timedelta(days=1), True),
        (pending(status="approved"), "approved", "n-1", T0, False),  # decided before: single use
        (pending(status="expired"), "approved", None, T0, False),
        (pending(status="rejected"), "expired", None, EXPIRES, False),  # a decision beats the timeout
        (None, "approved", None, T0, False),  # no such request
    ],
)
def test_a_request_is_decided_once_while_pending_with_its_nonce_before_its_deadline(
    stored: ApprovalRequest | None, status: ApprovalStatus, nonce: str | None, now: datetime, allowed: bool
) -> None:
    decision = approval_decision(status, by="link", now=now, nonce=nonce)
    assert decision.allows(stored) is allowed
    if allowed:
        assert stored is not None
        decided = decision.applied(stored)
        assert (decided.status, decided.decided_by, decided.decided_at) == (status, "link", now)
        assert (decided.nonce, decided.expires_at, decided.node) == (
            stored.nonce,
            stored.expires_at,
            stored.node,
        )


def test_a_snooze_records_its_end_in_utc_and_other_decisions_keep_none() -> None:
    paris = timezone(timedelta(hours=1))
    until = datetime(2026, 11, 3, 11, 0, tzinfo=paris)
    decision = approval_decision("snoozed", by="cli:ops", now=T0.astimezone(paris), snooze_until=until)
    decided = decision.applied(pending())
    assert decided.snooze_until == until and decided.snooze_until.tzinfo == UTC
    assert decided.decided_at == T0 and decided.decided_at.tzinfo == UTC
    assert approval_decision("approved", by="cli:ops", now=T0).applied(pending()).snooze_until is None


@pytest.mark.parametrize(
    ("status", "kwargs", "message"),
    [
        ("pending", {}, "cannot be 'pending'"),
        ("maybe", {}, "cannot be 'maybe'"),
        ("approved", {"snooze_until": EXPIRES}, "only for a snooze"),
        ("approved", {"now": datetime(2026, 11, 2, 10, 0)}, "now must be a timezone-aware"),  # noqa: DTZ001
        ("snoozed", {"snooze_until": datetime(2026, 11, 3)}, "snooze_until must be a timezone-aware"),  # noqa: DTZ001
    ],
)
def test_a_bad_decision_is_refused_before_any_write(
    status: str, kwargs: dict[str, object], message: str
) -> None:
    arguments: dict[str, object] = {"by": "link", "now": T0, **kwargs}
    with pytest.raises(ValueError, match=message):
        approval_decision(status, **arguments)  # type: ignore[arg-type]
