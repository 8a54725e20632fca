"""Decision records, verdict changes and their Events (pure ``rightsizer.domain.decisions``)."""

from __future__ import annotations

from typing import Any

import pytest

from rightsizer.domain.decisions import (
    EVENT_REASONS,
    DecisionRecord,
    decision_records,
    event_for,
    verdict_changes,
)
from rightsizer.domain.plan import Action, NodeReport, Plan, Savings


def report(node: str, verdict: Any, reasons: list[str]) -> NodeReport:
    return NodeReport(
        node=node,
        verdict=verdict,
        reasons=reasons,
        node_group="gpu-a10g",
        instance_id=f"i-{node}",
        instance_type="g5.xlarge",
        gpus=1,
        gpu_activity_max_pct=1.0,
        fb_used_max_mib=0.0,
        coverage=1.0,
        hourly_usd=1.006,
    )


def action(node: str, kind: Any, to: Any = None) -> Action:
    return Action.model_validate(
        {
            "action_id": f"{kind}-{node}",
            "kind": kind,
            "node": node,
            "node_group": "gpu-a10g",
            "instance_id": f"i-{node}",
            "from": None,
            "to": to,
            "reason": "idle_window_clean",
            "hourly_savings_usd": 1.006,
            "monthly_savings_usd": 734.38,
        }
    )


PLAN = Plan(
    at="2026-11-02T10:00:00Z",
    taken_at="2026-11-02T10:00:00Z",
    dry_run=True,
    policy={},
    nodes=[
        report("idle-1", "idle", ["idle_window_clean"]),
        report("idle-2", "idle", ["idle_window_clean"]),
        report("busy-1", "busy", ["activity_above_threshold:gpu0:87%"]),
        report("pdb-1", "protected", ["pdb_blocks:default/web", "idle_window_clean"]),
        report("stale-1", "unknown", ["stale_metrics:600s"]),
        report("big-1", "underutilized", ["activity_above_threshold:gpu0:30%"]),
    ],
    actions=[
        action("idle-1", "scale_in"),
        action("idle-2", "scale_in"),
        action("big-1", "recommend", "g5.xlarge"),
    ],
    unmapped=[],
    savings=Savings(hourly_usd=2.0, monthly_usd=1460.0),
)


def records(**skipped: str) -> dict[str, DecisionRecord]:
    built = decision_records(PLAN, "prod", started={"idle-1": "exec-1"}, skipped=skipped)
    return {r.node: r for r in built}


def test_one_record_per_node_in_plan_order_with_its_verdict_and_reasons() -> None:
    built = decision_records(PLAN, "prod", started={}, skipped={})
    assert [r.node for r in built] == [n.node for n in PLAN.nodes]
    assert [(r.verdict, r.reasons) for r in built] == [(n.verdict, n.reasons) for n in PLAN.nodes]
    assert all(r.cluster == "prod" and r.at == PLAN.at and r.dry_run for r in built)


@pytest.mark.parametrize(
    ("node", "why_not"),
    [
        ("busy-1", "busy: activity_above_threshold:gpu0:87%"),
        ("pdb-1", "protected: pdb_blocks:default/web"),
        ("stale-1", "unknown: stale_metrics:600s"),
        (
            "big-1",
            "recommend is a recommendation: the assessment starts only scale_in, resize_instance, replace_node_group and consolidate",
        ),
        ("idle-2", "backoff-reason"),
    ],
)
def test_every_node_not_acted_on_says_why(node: str, why_not: str) -> None:
    record = records(**{"idle-2": "backoff-reason"})[node]
    assert record.action == "none" and record.execution_id is None
    assert record.why_not == why_not


def test_a_started_drain_is_named_with_its_recommendation_and_price() -> None:
    record = records()["idle-1"]
    assert (record.action, record.execution_id, record.why_not) == ("drain_started", "exec-1", None)
    assert record.recommendation is not None
    assert (record.recommendation.kind, record.recommendation.hourly_savings_usd) == ("scale_in", 1.006)
    assert record.hourly_usd == 1.006
    assert records()["big-1"].recommendation is not None
    assert records()["busy-1"].recommendation is None


def test_verdict_changes_once_per_change_and_first_sightings_only_when_actionable() -> None:
    now = list(records().values())
    # first assessment: only idle and underutilized nodes are news
    first = verdict_changes(None, now)
    assert sorted((c.node, c.before, c.after) for c in first) == [
        ("big-1", None, "underutilized"),
        ("idle-1", None, "idle"),
        ("idle-2", None, "idle"),
    ]
    # the same verdicts again: nothing
    same = {r.node: r.verdict for r in now}
    assert verdict_changes(same, now) == []
    # one node changed
    changed = dict(same, **{"stale-1": "busy", "idle-1": "busy"})
    assert sorted((c.node, c.before, c.after) for c in verdict_changes(changed, now)) == [
        ("idle-1", "busy", "idle"),
        ("stale-1", "busy", "unknown"),
    ]


def test_event_reason_is_camel_case_of_the_new_verdict_and_warning_only_for_unknown() -> None:
    by_node = records()
    changes = {c.node: c for c in verdict_changes({n: "busy" for n in by_node}, list(by_node.values()))}
    reason, message, warning = event_for(changes["idle-1"], by_node["idle-1"])
    assert (reason, warning) == ("GPUIdle", False)
    assert message == "GPU verdict busy -> idle: idle_window_clean; drain exec-1 started (dry run)"
    reason, message, warning = event_for(changes["stale-1"], by_node["stale-1"])
    assert (reason, warning) == ("GPUVerdictUnknown", True)
    assert message.endswith("no action (unknown: stale_metrics:600s)")
    assert all(r[0].isupper() and " " not in r for r in EVENT_REASONS.values())
