"""Notices of actions (issue 27 item 4): with ``NotifyActions`` on, every completed or rolled-back removal and
every off-hours transition is published once on the alarm topic with node, action, reason and USD.

Before: a completed removal, resize or replacement notified no one unless approval was required.
The drain runs through the real drain handler behind the ASL interpreter (``drain_world``), off-hours through
``run_offhours``; the notifier records what ``sns:Publish`` would send.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from rightsizer.domain.errors import PermanentError
from rightsizer.services.notices import notice_for, notifying
from rightsizer.state import LedgerEntry
from tests.builders import AT
from tests.integration.test_alarms import blocked_until_deadline
from tests.integration.test_statemachine import NODE, drain_world, request

pytestmark = pytest.mark.integration


class Topic:
    """What ``SnsNotifier.publish`` is given (subject ≤ 100 characters, message)."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.fail = fail

    def publish(self, subject: str, message: str) -> None:
        if self.fail:
            raise PermanentError("sns:Publish failed: AuthorizationError")
        assert len(subject) <= 100
        self.sent.append((subject, message))


def test_a_completed_removal_is_announced_once_with_node_reason_and_usd() -> None:
    topic = Topic()
    with drain_world(notifier=topic) as world:
        assert world.interpreter.run(request(), "ok").status == "SUCCEEDED"
    [(subject, message)] = topic.sent
    assert subject == f"GPU Rightsizer prod-eks: scale_in done on {NODE}"
    assert f"node: {NODE} (instance " in message
    assert "action: scale_in: removal (drain and scale-in of the node)" in message
    assert "outcome: completed" in message
    assert "USD: 5.67 USD/hour (4,140.56 USD/month) saved" in message
    assert "reason: " in message and "reason: -" not in message


def test_a_rolled_back_drain_is_announced_without_savings() -> None:
    topic = Topic()
    with drain_world(notifier=topic) as world:
        blocked_until_deadline(world)
        world.interpreter.run(request(), "rolled-back")
    [(subject, message)] = topic.sent
    assert subject == f"GPU Rightsizer prod-eks: scale_in rolled back on {NODE}"
    assert "outcome: rolled back (our cordon undone, nothing removed)" in message
    assert "USD: none (nothing was removed)" in message


def test_a_notice_that_cannot_be_published_does_not_fail_the_drain(caplog: pytest.LogCaptureFixture) -> None:
    with drain_world(notifier=Topic(fail=True)) as world:
        assert world.interpreter.run(request(), "ok").status == "SUCCEEDED"
    assert "action notice not published" in caplog.text


def test_off_hours_transitions_are_announced_down_and_up() -> None:
    from tests.support.offhours_world import MONDAY_MORNING, SATURDAY_NOON, make_world

    topic = Topic()
    world = make_world()
    world.deps = dataclasses.replace(world.deps, state=notifying(world.state, topic, "prod-eks"))
    world.run(SATURDAY_NOON)
    world.run(SATURDAY_NOON + timedelta(minutes=5))  # a repeated tick of the same cycle: nothing new
    world.run(MONDAY_MORNING)
    world.run(MONDAY_MORNING + timedelta(minutes=10))
    subjects = [s for s, _m in topic.sent]
    assert subjects[0] == "GPU Rightsizer prod-eks: scale_node_group done on gpu-a10g"
    assert "outcome: scaling down for off-hours (min 0; " in topic.sent[0][1]
    assert "outcome: restored from off-hours (its nodes Ready with GPUs) at step restored" in topic.sent[1][1]
    assert "reason: 3 node(s) Ready with GPUs" in topic.sent[1][1]
    assert len(subjects) == 2, subjects


@pytest.mark.parametrize(
    ("kind", "step", "result", "hourly", "announced"),
    [
        ("scale_in", "verify", "applied", 5.672, True),
        ("scale_in", "verify", "applied", None, False),  # no savings booked: not a completed removal
        ("scale_in", "rollback", "rolled_back", None, True),
        ("scale_in", "validate", "abandoned", None, False),  # nothing was done
        ("scale_in", "remove", "failed", None, False),  # failures have their alarms
        ("scale_in", "verify", "dry_run", None, False),
        ("resize_instance", "uncordon", "applied", 0.62, True),
        ("resize_instance", "heal:3", "applied", None, False),
        ("replace_node_group", "ng_gone", "applied", 9.33, True),
        ("scale_node_group", "desired_zero", "applied", None, True),
        ("scale_node_group", "min_zero", "applied", None, True),
        ("scale_node_group", "restore", "applied", None, False),  # the call; "restored" is the outcome
        ("scale_node_group", "restored", "applied", None, True),
        ("lease_expired", "heal", "applied", None, False),
    ],
)
def test_which_ledger_entries_are_announced(
    kind: str, step: str, result: str, hourly: float | None, announced: bool
) -> None:
    entry = LedgerEntry(
        execution_id="e-1",
        node="gpu-1",
        instance_id="i-1",
        node_group="gpu-a10g",
        kind=kind,
        step=step,
        result=result,  # type: ignore[arg-type]
        reason="idle for 30m",
        hourly_savings_usd=hourly,
        monthly_savings_usd=None,
        at=AT,
    )
    assert (notice_for(entry, "prod-eks") is not None) is announced
