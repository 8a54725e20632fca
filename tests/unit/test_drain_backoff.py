"""The back-off after a failed drain holds for every drain, whoever starts it (issue 15).

``drain_failure_backoff`` (default 30 min, Cluster Autoscaler's ``scale-down-delay-after-failure`` per
node) used to be applied only by the scheduled assessment, which does not start a drain of such a node.
A drain an Alertmanager alert (the webhook) or off-hours starts goes through the same validate step, and
that step now checks the node's ledger: within the back-off the drain is abandoned before anything is
cordoned, with the reason ``drain_failure_backoff:until:<t>:<result>``; once it has passed the drain
goes ahead. Only failed and rolled-back drains count (an abandoned one never touched the node).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from rightsizer.services.drain import DrainRequest
from rightsizer.services.webhook import MemoryDuplicateGuard, WebhookIntake
from rightsizer.state import LedgerEntry
from tests.builders import AT
from tests.unit.test_drain import World, make_world
from tests.unit.test_webhook import TOKEN, alert, payload, post


def failed_before(world: World, node: str, ago: timedelta, result: str = "rolled_back") -> None:
    world.state.record(
        LedgerEntry(
            execution_id="earlier-drain", node=node, instance_id="i-1", node_group="gpu-a10g",
            kind="scale_in", step="evict", result=result, reason="drain_timeout:pdb_blocks",  # type: ignore[arg-type]
            hourly_savings_usd=None, monthly_savings_usd=None, at=AT - ago,
        )
    )  # fmt: skip


def cordoned(world: World) -> bool:
    return any(call[0] == "cordon" for call in world.writer.calls)


def start_by_alert(world: World, node: str) -> str:
    runner = world.runner()
    intake = WebhookIntake(token=TOKEN, starter=runner, leases=world.state, guard=MemoryDuplicateGuard())
    answer = intake.handle(post(payload(alert("firing", node, "f00dfeedf00dfeed"))))
    assert answer.status_code == 202, answer.body
    (started,) = answer.body["started"]
    return str(runner.results[started["execution_id"]].message)


def start_by_offhours(world: World, node: str) -> str:
    runner = world.runner()
    runner.start(DrainRequest(node, "offhours-exec-1", "offhours:gpu-a10g", offhours=True))
    return str(runner.results["offhours-exec-1"].message)


STARTERS = {"alert": start_by_alert, "offhours": start_by_offhours}


@pytest.mark.parametrize("starter", sorted(STARTERS))
@pytest.mark.parametrize("result", ["rolled_back", "failed"])
def test_a_drain_within_the_backoff_is_abandoned_before_the_cordon(starter: str, result: str) -> None:
    world = make_world()
    failed_before(world, "gpu-1", timedelta(minutes=10), result)

    message = STARTERS[starter](world, "gpu-1")

    until = (AT + timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert message == f"drain_failure_backoff:until:{until}:{result}"
    assert not cordoned(world) and world.scaler.terminated == []
    assert world.state.get("gpu-1") is None and world.state.slots() == []


@pytest.mark.parametrize("starter", sorted(STARTERS))
def test_once_the_backoff_has_passed_the_drain_goes_ahead(starter: str) -> None:
    world = make_world()
    failed_before(world, "gpu-1", timedelta(minutes=31))

    STARTERS[starter](world, "gpu-1")

    assert cordoned(world) and world.scaler.terminated == ["i-1"]


def test_an_abandoned_drain_or_another_nodes_failure_does_not_hold_the_node() -> None:
    world = make_world()
    failed_before(world, "gpu-1", timedelta(minutes=5), "abandoned")
    failed_before(world, "gpu-2", timedelta(minutes=5))

    start_by_alert(world, "gpu-1")

    assert cordoned(world) and world.scaler.terminated == ["i-1"]


def test_a_zero_backoff_turns_it_off() -> None:
    from rightsizer.domain.policy import Policy

    world = make_world(policy=Policy(dry_run=False, drain_failure_backoff=0))
    failed_before(world, "gpu-1", timedelta(minutes=1))

    start_by_offhours(world, "gpu-1")

    assert world.scaler.terminated == ["i-1"]


@pytest.mark.parametrize("starter", sorted(STARTERS))
def test_a_snoozed_node_is_not_drained_whoever_starts_it_until_the_snooze_ends(
    starter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The validate step re-plans the node with the snoozes a person set through an approval request.
    from rightsizer.adapters.memory_state import MemoryApprovals
    from rightsizer.services.assess import PlanningAssessor
    from rightsizer.services.drain import DrainDeps, DrainWorkflow

    for until, drained in ((AT + timedelta(hours=8), False), (AT, True)):
        world = make_world()
        snoozes = MemoryApprovals()
        snoozes.snooze("gpu-1", until, by="link", now=AT - timedelta(hours=1))

        def workflow(w: World = world, s: MemoryApprovals = snoozes) -> DrainWorkflow:
            assessor = PlanningAssessor(w.observe, w.policy, snoozes=s)
            return DrainWorkflow(
                DrainDeps(w.writer, w.scaler, assessor, w.state, w.policy, dry_run=False, clock=w.clock.now)
            )

        monkeypatch.setattr(world, "workflow", workflow)
        message = STARTERS[starter](world, "gpu-1")

        assert cordoned(world) is drained, message
        if not drained:
            assert message == "not_a_candidate:snoozed:until:" + until.strftime("%Y-%m-%dT%H:%M:%SZ")
