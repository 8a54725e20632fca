"""The approval notification names the snooze it grants in the units the CLI's ``--for`` accepts.

Before: ``Snooze {seconds // 3600} h`` printed ``Snooze 0 h`` for ``approval_snooze: 30m`` and the shell
hint always said ``--for 24h`` whatever the policy's snooze was.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rightsizer.domain.policy import parse_duration
from rightsizer.services.approval import approval_message
from rightsizer.state import ApprovalRequest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LINKS = {"approve": "https://u/a", "reject": "https://u/r", "snooze": "https://u/s"}


def request() -> ApprovalRequest:
    return ApprovalRequest(
        execution_id="ex-1",
        node="ip-10-0-1-23.ec2.internal",
        nonce="n",
        requested_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        details={"verdict": "idle", "hourly_savings_usd": 1.006},
    )


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(1800, "30m"), (86400, "24h"), (5400, "1h30m"), (45, "45s"), (3 * 86400, "72h"), (3661, "1h1m1s")],
)
def test_snooze_link_and_shell_hint_name_the_policy_snooze(seconds: int, label: str) -> None:
    _, body = approval_message("prod", request(), LINKS, seconds)
    assert f"Snooze {label}: https://u/s" in body
    assert f"rightsizer snooze  ex-1 --for {label} --stack <stack>" in body
    assert parse_duration(label) == seconds  # the hint is a valid --for


def test_without_links_the_shell_hint_still_names_the_snooze() -> None:
    _, body = approval_message("prod", request(), {}, 1800)
    assert "Snooze" not in body.split("From a shell")[0]
    assert "--for 30m" in body
