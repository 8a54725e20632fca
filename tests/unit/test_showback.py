"""Showback of idle GPU holders (issue 32): figures checked against a snapshot computed by hand.

The snapshot (window 30 min, ``tests.builders.AT``):

- node ``a``, g5.12xlarge (4 GPUs, 5.672 USD/h), every GPU idle: ``ml/notebook-1`` (1 GPU, team research,
  up 5 h), ``ml/server-1`` (2 GPUs, team research, up 10 min), ``search/embed-1`` (privileged, no GPU
  request, team search: takes the 1 GPU the counted holders leave);
- node ``b``, g5.xlarge (1.006 USD/h), busy (80 %): ``ml/trainer-1`` holds its GPU and uses it — no showback;
- node ``c``, g5.xlarge, idle: ``web/bot-1`` (1 GPU, no team label).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.render import render_plan
from tests.builders import AT, const, gpu_node, merge_metrics, node_devices, pod, rfc, snapshot


def _pod(name: str, node: str, ns: str, gpus: int, team: str | None, **kw: Any) -> dict[str, Any]:
    labels = {"app": name} | ({"team": team, "cost-center": f"cc-{team}"} if team else {})
    return pod(name, node, namespace=ns, gpus=gpus, labels=labels, **kw)


def _snapshot() -> Any:
    nodes = [
        gpu_node("a", instance_type="g5.12xlarge", gpus=4),
        gpu_node("b", instance_type="g5.xlarge", gpus=1, nodegroup="small"),
        gpu_node("c", instance_type="g5.xlarge", gpus=1, nodegroup="small"),
    ]
    server = _pod("server-1", "a", "ml", 2, "research")
    server["status"]["startTime"] = rfc(AT - timedelta(minutes=10))
    embed = _pod("embed-1", "a", "search", 0, "search")
    embed["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pods = [
        _pod("notebook-1", "a", "ml", 1, "research"),
        server,
        embed,
        _pod("trainer-1", "b", "ml", 1, "research"),
        _pod("bot-1", "c", "web", 1, None),
    ]
    metrics = merge_metrics(
        node_devices("a", 4), node_devices("b", 1, util=const(80.0)), node_devices("c", 1)
    )
    return snapshot(nodes, pods, metrics)


def _row(rows: Any, key: str) -> dict[str, Any]:
    return next(r.model_dump() for r in rows if r.key == key)


def test_showback_per_namespace_and_team_matches_the_hand_computed_figures() -> None:
    sb = plan(_snapshot(), Policy()).showback
    assert sb is not None
    assert sb.window_hours == 0.5
    holders = {h.pod: h for h in sb.holders}
    assert set(holders) == {"ml/notebook-1", "ml/server-1", "search/embed-1", "web/bot-1"}
    assert holders["ml/server-1"].gpus == 2.0
    assert holders["ml/server-1"].hours == pytest.approx(10 / 60, abs=1e-6)
    assert holders["ml/server-1"].hourly_usd == pytest.approx(2.836)
    assert holders["ml/server-1"].usd == pytest.approx(2.836 / 6, abs=1e-6)
    assert holders["search/embed-1"].gpus == 1.0  # the GPU the counted holders leave
    assert holders["web/bot-1"].team == "(none)"
    assert _row(sb.by_namespace, "ml") == {
        "key": "ml",
        "pods": 2,
        "gpus": 3.0,
        "gpu_hours": pytest.approx(0.5 + 2 / 6, abs=1e-6),
        "hourly_usd": pytest.approx(4.254),
        "usd": pytest.approx(0.709 + 2.836 / 6, abs=1e-6),
        "unpriced": 0,
    }
    assert _row(sb.by_namespace, "search")["usd"] == pytest.approx(0.709)
    assert _row(sb.by_namespace, "web")["usd"] == pytest.approx(0.503)
    assert [r.key for r in sb.by_team] == ["research", "search", "(none)"]
    assert _row(sb.by_team, "research")["gpu_hours"] == pytest.approx(0.5 + 2 / 6, abs=1e-6)
    assert sb.gpu_hours == pytest.approx(1.5 + 2 / 6, abs=1e-6)
    assert sb.usd == pytest.approx(0.709 + 2.836 / 6 + 0.709 + 0.503, abs=1e-5)


def test_the_team_label_key_is_the_policys() -> None:
    sb = plan(_snapshot(), Policy(showback_team_label="cost-center")).showback
    assert sb is not None
    assert {r.key for r in sb.by_team} == {"cc-research", "cc-search", "(none)"}


def test_holders_on_a_busy_node_or_an_unknown_one_are_not_shown_back() -> None:
    snap = snapshot(
        [gpu_node("c", instance_type="g5.xlarge", gpus=1)],
        [_pod("bot-1", "c", "web", 1, None)],
        node_devices("c", 1, util=None, prof=None),  # no activity signal: unknown, never idle
    )
    sb = plan(snap, Policy()).showback
    assert sb is not None and sb.holders == [] and sb.usd == 0.0


def test_the_plan_text_lists_the_idle_gpu_holders_per_team() -> None:
    text = render_plan(plan(_snapshot(), Policy()))
    assert "Idle GPU holders" in text
    assert "research" in text and "0.83 GPU-h" in text


def test_a_written_snapshot_keeps_the_policys_team_label_and_no_other() -> None:
    from rightsizer.adapters.snapshot_projection import PagedProjection, project_documents

    raw = _pod("bot-1", "c", "web", 1, "research")
    out = project_documents({"pods.json": {"items": [raw]}}, policy_pod_labels=("team",))
    assert out["pods.json"]["items"][0]["metadata"]["labels"] == {"team": "research"}
    paged = PagedProjection(policy_pod_labels=("cost-center",)).item("pods.json", raw)
    assert paged["metadata"]["labels"] == {"cost-center": "cc-research"}
