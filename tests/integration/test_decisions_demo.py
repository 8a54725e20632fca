"""Decision records of a scheduled assessment on the demo environment (issue 15, "every decision visible").

The assessment runs as the ``assess`` Lambda runs it (``run_assessment``) against the demo environment's
real servers: moto (DynamoDB state table, EKS, Auto Scaling) and the Kubernetes API double, both through
the product's adapters built by the wiring. Its records are compared with ``rightsizer plan --snapshot``
on the demo snapshot (the CLI's JSON), and read back from the state table.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rightsizer.cli import main
from rightsizer.domain.decisions import EVENT_REASONS
from rightsizer.domain.model import ClusterSnapshot
from rightsizer.domain.policy import Policy
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.services.drain import DrainRequest
from rightsizer.services.observe import observe_request, snapshot_from_observation
from rightsizer.services.snapshot import observe
from rightsizer.state import LedgerEntry
from rightsizer.testing.demo_env import DemoEnvironment, demo_snapshot_dir
from rightsizer.wiring import builders as wiring

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class RecordingStarter:
    """A ``WorkflowStarter`` that records the requests (the drains themselves are not under test)."""

    def __init__(self) -> None:
        self.requests: list[DrainRequest] = []

    def start(self, request: DrainRequest) -> str:
        self.requests.append(request)
        return request.execution_id


@pytest.fixture(scope="module")
def env() -> Iterator[DemoEnvironment]:
    with DemoEnvironment() as started:
        yield started


def _deps(env: DemoEnvironment, starter: RecordingStarter) -> AssessmentDeps:
    policy = Policy()
    config = env.config(policy=policy)
    writer = wiring.build_cluster_writer(config)
    inventory = wiring.build_inventory(config)

    @functools.lru_cache(maxsize=4)
    def snapshot_at(at: datetime) -> ClusterSnapshot:
        request = observe_request(config, policy, at)
        observation = observe(writer, inventory, env.metrics, request)  # type: ignore[arg-type]
        return snapshot_from_observation(observation, wiring.decode_live_documents)

    return AssessmentDeps(
        cluster_name=env.cluster_name,
        observe=snapshot_at,
        policy=policy,
        cluster=writer,
        state=wiring.build_state(config),
        starter=starter,
        plans=wiring.build_plan_history(config),
    )


def _plan_snapshot(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", "--snapshot", str(demo_snapshot_dir()), "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def _verdict_events(env: DemoEnvironment) -> list[dict[str, Any]]:
    return [e for e in env.double.events() if e["reason"] in EVENT_REASONS.values()]


def test_one_record_per_gpu_node_with_the_verdicts_and_reasons_of_plan_snapshot(
    env: DemoEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the demo environment and `rightsizer plan --snapshot` of the same demo snapshot
    expected = _plan_snapshot(capsys)
    starter = RecordingStarter()
    deps = _deps(env, starter)
    now = datetime.now(UTC).replace(microsecond=0)

    # WHEN the scheduled assessment runs
    summary = run_assessment(deps, now, "tick-1")

    # THEN there is exactly one record per GPU node, with the plan's verdict and reasons
    records = {r.node: r for r in summary.records}
    assert len(records) == len(summary.records) == len(expected["nodes"])
    for node in expected["nodes"]:
        record = records[node["node"]]
        assert (record.verdict, record.reasons) == (node["verdict"], node["reasons"]), node["node"]
        assert record.hourly_usd == node["hourly_usd"]
    # AND the idle node's record names the drain it started; every other record says why not
    (request,) = starter.requests
    idle = records[request.node]
    assert idle.action == "drain_started" and idle.execution_id == request.execution_id
    assert idle.recommendation is not None and idle.recommendation.kind == "scale_in"
    for record in summary.records:
        if record.node != request.node:
            assert record.action == "none" and record.why_not, record
            assert record.why_not.startswith(record.verdict) or record.recommendation is not None
    # AND the state table holds the plan, readable back as the same records
    (stored,) = deps.plans.plans(limit=5) if deps.plans else [None]
    assert stored is not None and stored["cluster"] == env.cluster_name
    assert [r["node"] for r in stored["records"]] == [r.node for r in summary.records]
    assert stored["records"] == [r.model_dump(mode="json") for r in summary.records]


def test_verdict_change_raises_one_event_and_a_repeat_raises_none(env: DemoEnvironment) -> None:
    # GIVEN a stored plan in which every node was "busy" (the previous assessment)
    starter = RecordingStarter()
    deps = _deps(env, starter)
    assert deps.plans is not None
    now = datetime.now(UTC).replace(microsecond=0)
    first = run_assessment(deps, now, "tick-a")
    previous = deps.plans.plans(limit=1)[0]
    for record in previous["records"]:
        record["verdict"] = "busy"
    deps.plans.save_plan(previous, now + timedelta(seconds=1))
    before = len(_verdict_events(env))
    assert first.records

    # WHEN the next assessment runs
    second = run_assessment(deps, now + timedelta(seconds=60), "tick-b")

    # THEN one Event per node whose verdict is not busy, with the Karpenter-style reason of the new verdict
    changed = [r for r in second.records if r.verdict != "busy"]
    assert second.events == len(changed) > 0
    raised = _verdict_events(env)[before:]
    assert sorted((e["involvedObject"]["name"], e["reason"]) for e in raised) == sorted(
        (r.node, EVENT_REASONS[r.verdict]) for r in changed
    )
    for event in raised:
        assert event["message"].startswith("GPU verdict busy -> "), event["message"]
        assert event["type"] == ("Warning" if "-> unknown" in event["message"] else "Normal")
    # WHEN a third assessment sees the same verdicts
    third = run_assessment(deps, now + timedelta(seconds=120), "tick-c")
    # THEN no Event is raised (one per change, no spam)
    assert third.events == 0
    assert len(_verdict_events(env)) == before + len(changed)


def test_a_node_whose_drain_failed_is_left_alone_for_the_backoff(env: DemoEnvironment) -> None:
    # GIVEN the idle node's last drain rolled back ten minutes ago (default back-off 30 min)
    starter = RecordingStarter()
    deps = _deps(env, starter)
    now = datetime.now(UTC).replace(microsecond=0)
    probe = run_assessment(deps, now, "tick-probe")
    (idle,) = [r for r in probe.records if r.action == "drain_started"]
    failed_at = now - timedelta(minutes=10)
    deps.state.record(
        LedgerEntry(
            "old-drain",
            idle.node,
            idle.instance_id,
            idle.node_group,
            "scale_in",
            "rollback",
            "rolled_back",
            "eviction_timeout",
            None,
            None,
            failed_at,
        )
    )
    starter.requests.clear()

    # WHEN the assessment runs again
    summary = run_assessment(deps, now + timedelta(seconds=5), "tick-backoff")

    # THEN no drain starts for that node, and its record says until when
    assert starter.requests == []
    record = next(r for r in summary.records if r.node == idle.node)
    until = (failed_at + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert record.action == "none"
    assert record.why_not == f"drain_failure_backoff:until:{until}:rolled_back"

    # WHEN the back-off has passed
    later = run_assessment(deps, failed_at + timedelta(minutes=31), "tick-after")

    # THEN the node is drained again
    assert [r.node for r in starter.requests] == [idle.node]
    assert next(r for r in later.records if r.node == idle.node).action == "drain_started"
