"""The plan during and after a node group replacement (issue 17: replacements the plan knows).

GIVEN old managed node group ``gpu-a10g`` (two underutilized g5.12xlarge, opted in) and the group that
replaces it, ``gpu-a10g-g5-xlarge`` (two g5.xlarge standing empty while the old nodes drain),
WHEN no replacement is known, the plan proposes the replacement again and scales in an empty new node
(the two faults this guards against); WHEN one runs (``replacement_in_progress``) or its new group
settles (``replacement_settling``), neither happens and the decision records say why; once the settle
period is over the new nodes are judged like any others.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.decisions import decision_records
from rightsizer.domain.model import TAG_ENABLED
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.replacement import KnownReplacement
from rightsizer.domain.verdicts import blocking_reasons
from rightsizer.services.replace import SETTLE_SUFFIX, child_blockers, known_replacements, lease_key
from tests.builders import AT, asg, const, gpu_node, merge_metrics, node_devices, pod, snapshot

OLD, NEW, EXECUTION = "gpu-a10g", "gpu-a10g-g5-xlarge", "nodegroup-gpu-a10g-0123456789abcdef"


def busy(node: str) -> dict[str, Any]:
    hot = {"util": const(40), "fb_used": const(6000), "power": const(150)}
    return node_devices(node, 4, per_gpu={0: hot})


def cluster_plan(known: list[KnownReplacement], at: datetime = AT) -> Plan:
    old = [gpu_node(n, instance_id=f"i-{i:017x}", nodegroup=OLD) for i, n in enumerate(("n1", "n2"))]
    new = [
        gpu_node(n, instance_type="g5.xlarge", gpus=1, instance_id=f"i-{i + 8:017x}", nodegroup=NEW)
        for i, n in enumerate(("m1", "m2"))
    ]
    groups = [
        dataclasses.replace(
            asg(f"eks-{OLD}", ["i-" + f"{i:017x}" for i in range(2)], min_size=1, nodegroup=OLD),
            tags={TAG_ENABLED: "true"},
        ),
        dataclasses.replace(
            asg(f"eks-{NEW}", ["i-" + f"{i + 8:017x}" for i in range(2)], nodegroup=NEW),
            tags={TAG_ENABLED: "true"},
        ),
    ]
    pods = [pod(f"infer-{i}", n, gpus=1, cpu="2", memory="8Gi") for i, n in enumerate(("n1", "n2"))]
    metrics = merge_metrics(busy("n1"), busy("n2"), node_devices("m1", 1), node_devices("m2", 1))
    snap = snapshot(old + new, pods, metrics, groups=groups)
    policy = Policy(allow_replace_node_group=True, cooldown=0, max_nodes_per_run=2)
    return plan(snap, policy, at, replacements=known)


def actions(result: Plan) -> list[tuple[str, str | None]]:
    return sorted((a.kind, a.node or a.node_group) for a in result.actions if a.kind != "recommend")


def test_without_knowing_the_replacement_the_plan_repeats_it_and_takes_the_new_nodes_apart() -> None:
    result = cluster_plan([])
    assert actions(result) == [("replace_node_group", OLD), ("scale_in", "m1")]


def test_a_running_replacement_is_not_proposed_again_and_protects_both_groups() -> None:
    result = cluster_plan([KnownReplacement(EXECUTION, (OLD, NEW))])

    assert actions(result) == []
    assert [a for a in result.actions if a.node in ("n1", "n2")] == []  # the replacement moves them
    verdicts = {
        r.node: (r.verdict, [x for x in r.reasons if x.startswith("replacement")]) for r in result.nodes
    }
    mark = [f"replacement_in_progress:{EXECUTION}"]
    assert verdicts == {
        "n1": ("underutilized", mark),
        "n2": ("underutilized", mark),
        "m1": ("protected", mark),
        "m2": ("protected", mark),
    }
    records = {r.node: r for r in decision_records(result, "prod-eks", started={}, skipped={})}
    assert records["n1"].why_not == f"underutilized: replacement_in_progress:{EXECUTION}"
    assert records["m1"].why_not == f"protected: replacement_in_progress:{EXECUTION}"
    # a drain the webhook starts for a new node is refused by validate on the same reason
    assert blocking_reasons(result.node("m1").reasons, "alert-drain", offhours=False) == mark


def test_the_new_group_settles_after_the_replacement_then_is_judged_like_any_other() -> None:
    until = AT + timedelta(minutes=10)
    settling = [KnownReplacement(EXECUTION, (NEW,), settling_until=until)]

    during = cluster_plan(settling)
    assert actions(during) == [("replace_node_group", OLD)]  # (the old group still has its nodes here)
    assert [x for x in during.node("m1").reasons if x.startswith("replacement")] == [
        "replacement_settling:until:2026-11-02T10:10:00Z"
    ]
    assert during.node("m1").verdict == "protected"

    ended = [
        KnownReplacement(EXECUTION, (NEW,), settling_until=AT)
    ]  # the settle period ends at the plan's `at`
    after = cluster_plan(ended)
    assert ("scale_in", "m1") in actions(after)
    assert not [x for x in after.node("m1").reasons if x.startswith("replacement")]


def test_the_settle_period_defaults_to_a_whole_idle_window_plus_the_cooldown() -> None:
    assert Policy().replace_settle_seconds == 1800 + 600
    assert Policy(idle_window="1h", cooldown="15m").replace_settle_seconds == 4500
    assert Policy(replace_settle="5m").replace_settle_seconds == 300


def test_the_replacements_are_read_from_the_live_node_group_leases() -> None:
    state = MemoryState("prod-eks")
    state.acquire(lease_key(OLD), EXECUTION, AT, 600)
    state.acquire(lease_key(NEW), EXECUTION, AT, 600)
    state.acquire(lease_key("gpu-l4-g6-xlarge"), "older" + SETTLE_SUFFIX, AT, 300)
    state.acquire(lease_key("gone"), "ended", AT - timedelta(hours=1), 60)  # expired: not known
    state.acquire("ip-10-0-1-10.ec2.internal", "a-drain", AT, 600)  # a node's lease: not a replacement

    known = known_replacements(state, AT + timedelta(seconds=1))
    assert known == [
        KnownReplacement(EXECUTION, (OLD, NEW)),
        KnownReplacement("older", ("gpu-l4-g6-xlarge",), settling_until=AT + timedelta(seconds=300)),
    ]
    assert known_replacements(state, AT, ignore=EXECUTION) == known[1:]  # validate's own plan


def test_a_child_drain_of_the_replacement_is_not_blocked_by_its_own_parent() -> None:
    result = cluster_plan([KnownReplacement(EXECUTION, (OLD, NEW))])
    assert child_blockers(result.node("n1"), f"{EXECUTION}.0.1", EXECUTION) == []
    other = child_blockers(result.node("n1"), "x.0.1", "another-replacement")
    assert other == [f"replacement_in_progress:{EXECUTION}"]
