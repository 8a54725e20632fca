"""Issue 28 "Capacity and health": reserved capacity kept, warm floors, the ``unhealthy`` verdict,
interruption notices — planner tables (pure, no server)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from rightsizer.domain.errors import ConfigError
from rightsizer.domain.health import last_xids, rising_xids
from rightsizer.domain.model import CapacityReservation, ClusterSnapshot, Ec2Instance, Series
from rightsizer.domain.plan import Plan
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy, load_policy
from rightsizer.domain.verdicts import blocking_reasons, code_of
from tests.builders import AT, asg, gpu_node, merge_metrics, node_devices, pod, snapshot

H100_FB = 81559.0


def _p5(name: str, iid: str, **kw: Any) -> dict[str, Any]:
    return gpu_node(name, instance_type="p5.48xlarge", gpus=8, instance_id=iid, nodegroup="p5", **kw)


def _g5(name: str, iid: str, **kw: Any) -> dict[str, Any]:
    return gpu_node(name, instance_type="g5.xlarge", gpus=1, instance_id=iid, nodegroup="g5", **kw)


def _idle(*names: str, gpus: int = 1, **kw: Any) -> dict[str, list[Series]]:
    return merge_metrics(*(node_devices(n, gpus, **kw) for n in names))


def _with(snap: ClusterSnapshot, **inventory: Any) -> ClusterSnapshot:
    return dataclasses.replace(snap, inventory=dataclasses.replace(snap.inventory, **inventory))


def _ec2(iid: str, itype: str = "g5.xlarge", **kw: Any) -> Ec2Instance:
    return Ec2Instance(iid, itype, {}, "ebs", "running", availability_zone="us-east-1a", **kw)


def _scale_ins(result: Plan) -> list[str | None]:
    return [a.node for a in result.actions if a.kind == "scale_in"]


# ------------------------------------------------------------------------------ reserved capacity


def _reserved_snap(**instance: Any) -> ClusterSnapshot:
    nodes = [_g5("a", "i-a"), _g5("b", "i-b")]
    snap = snapshot(nodes, [], _idle("a", "b"), groups=[asg("asg-g5", ["i-a", "i-b"], nodegroup="g5")])
    return _with(snap, instances={"i-a": _ec2("i-a", **instance), "i-b": _ec2("i-b")})


@pytest.mark.parametrize(
    ("instance", "reason"),
    [
        ({"capacity_reservation_id": "cr-1"}, "capacity_reserved:odcr:cr-1"),
        (
            {"capacity_reservation_id": "cr-2", "lifecycle": "capacity-block"},
            "capacity_reserved:capacity_block:cr-2",
        ),
    ],
    ids=["odcr", "capacity-block"],
)
def test_a_reserved_idle_node_is_kept_by_default(instance: dict[str, Any], reason: str) -> None:
    result = plan(_reserved_snap(**instance), Policy(max_nodes_per_node_group=2, max_nodes_per_run=2))
    report = result.node("a")
    assert report.verdict == "protected" and reason in report.reasons
    assert _scale_ins(result) == ["b"]  # the on-demand twin goes; the reserved node stays
    assert all(a.node != "a" for a in result.actions)


def test_release_reserved_capacity_allows_removal_but_books_no_savings() -> None:
    policy = Policy(release_reserved_capacity=True, max_nodes_per_node_group=2, max_nodes_per_run=2)
    result = plan(_reserved_snap(capacity_reservation_id="cr-1"), policy)
    assert result.node("a").verdict == "idle"
    assert "reservation_released:odcr:cr-1" in result.node("a").reasons
    [action] = [a for a in result.actions if a.node == "a"]
    assert action.hourly_savings_usd is None and "reservation cr-1" in action.reason
    assert result.savings.hourly_usd == pytest.approx(result.node("b").hourly_usd or 0.0)


def test_karpenter_reserved_label_is_a_reservation_without_ec2_facts() -> None:
    labels = {"karpenter.sh/capacity-type": "reserved", "karpenter.k8s.aws/capacity-reservation-id": "cr-9"}
    snap = snapshot(
        [_g5("a", "i-a", labels=labels)], [], _idle("a"), groups=[asg("asg-g5", ["i-a"], nodegroup="g5")]
    )
    report = plan(snap, Policy()).node("a")
    assert "capacity_reserved:odcr:cr-9" in report.reasons and report.verdict == "protected"


def test_plan_reports_unused_reservation_cost_and_a_capacity_blocks_end() -> None:
    end = AT + timedelta(days=2)
    snap = _with(
        _reserved_snap(capacity_reservation_id="cr-2", lifecycle="capacity-block"),
        reservations={"cr-2": CapacityReservation("cr-2", "capacity_block", "g5.xlarge", 3, 2, end=end)},
    )
    result = plan(snap, Policy())
    assert "capacity_block_ends:2026-11-04T10:00:00Z" in result.node("a").reasons
    [use] = result.reservations
    price = result.node("a").hourly_usd
    assert price is not None
    assert (use.reservation_id, use.kind, use.idle_nodes, use.available) == (
        "cr-2",
        "capacity_block",
        ["a"],
        2,
    )
    assert use.unused_usd_per_hour == pytest.approx(3 * price)
    assert use.end == "2026-11-04T10:00:00Z" and "cannot be cancelled" in use.advice


def test_an_odcr_report_advises_shrinking_or_cancelling() -> None:
    snap = _with(
        _reserved_snap(capacity_reservation_id="cr-1"),
        reservations={"cr-1": CapacityReservation("cr-1", "odcr", "g5.xlarge", 1, 0)},
    )
    [use] = plan(snap, Policy()).reservations
    assert use.idle_nodes == ["a"] and "ModifyCapacityReservation" in use.advice


# ------------------------------------------------------------------------------ warm floor


def _p5_snap(count: int, **group: Any) -> ClusterSnapshot:
    names = [f"p{i}" for i in range(count)]
    ids = [f"i-p{i}" for i in range(count)]
    nodes = [_p5(n, i) for n, i in zip(names, ids, strict=True)]
    info = dataclasses.replace(asg("asg-p5", ids, nodegroup="p5"), **group)
    return snapshot(nodes, [], _idle(*names, gpus=8, fb_total=H100_FB), groups=[info])


def test_the_last_p5_node_is_kept_warm() -> None:
    result = plan(_p5_snap(1), Policy())
    assert result.node("p0").verdict == "protected"
    assert "warm_floor:p5.48xlarge:1" in result.node("p0").reasons
    assert result.actions == []


def test_scale_in_stops_at_the_warm_floor() -> None:
    result = plan(_p5_snap(3), Policy(max_nodes_per_run=5, max_nodes_per_node_group=5))
    assert len(_scale_ins(result)) == 2
    kept = [n for n in result.nodes if n.node not in _scale_ins(result)]
    assert [r for r in kept[0].reasons if code_of(r) == "warm_floor"] == ["warm_floor:p5.48xlarge:1"]


def test_recent_ice_raises_the_floor_and_names_it() -> None:
    fresh = _p5_snap(3, capacity_failures=(AT - timedelta(hours=3),))
    result = plan(fresh, Policy(max_nodes_per_run=5, max_nodes_per_node_group=5))
    assert len(_scale_ins(result)) == 1
    assert any(r == "warm_floor:p5.48xlarge:2:ice:scaling_activity" for n in result.nodes for r in n.reasons)
    old = _p5_snap(3, capacity_failures=(AT - timedelta(hours=25),))
    assert len(_scale_ins(plan(old, Policy(max_nodes_per_run=5, max_nodes_per_node_group=5)))) == 2


def test_a_node_group_health_issue_is_ice_evidence_for_any_type() -> None:
    info = dataclasses.replace(
        asg("asg-g5", ["i-a"], nodegroup="g5"), nodegroup_issues=("AsgInstanceLaunchFailures",)
    )
    snap = snapshot([_g5("a", "i-a")], [], _idle("a"), groups=[info])
    report = plan(snap, Policy()).node("a")
    assert "warm_floor:g5.xlarge:1:ice:nodegroup_health:AsgInstanceLaunchFailures" in report.reasons


def test_warm_floor_policy_merges_over_the_defaults() -> None:
    policy = load_policy({"warm_floor": {"p5": 0, "g5.xlarge": 2}})
    assert (
        policy.warm_floor["p5"] == 0 and policy.warm_floor["p4d"] == 1 and policy.warm_floor["g5.xlarge"] == 2
    )
    assert plan(_p5_snap(1), policy).actions != []
    with pytest.raises(ConfigError) as err:
        load_policy({"warm_floor": {"p5": -1}})
    assert "warm_floor" in str(err.value)


# ------------------------------------------------------------------------------ health


def _broken(**kw: Any) -> dict[str, Any]:
    node = _g5("bad", "i-bad", **kw)
    node["status"]["conditions"].append(
        {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error"}
    )
    return node


def test_a_gpu_that_fell_off_the_bus_is_unhealthy_never_idle() -> None:
    snap = snapshot([_broken()], [], _idle("bad"), groups=[asg("asg-g5", ["i-bad"], nodegroup="g5")])
    report = plan(snap, Policy()).node("bad")
    assert report.verdict == "unhealthy"
    assert report.reasons[0] == "accelerated_hardware_not_ready:NvidiaXID79Error"


def test_unallocatable_gpus_on_a_settled_node_are_health_evidence_not_missing_data() -> None:
    node = gpu_node(
        "n", instance_type="g5.12xlarge", gpus=4, instance_id="i-n", allocatable={"nvidia.com/gpu": "3"}
    )
    snap = snapshot([node], [], _idle("n", gpus=4))
    report = plan(snap, Policy()).node("n")
    assert report.verdict == "unhealthy" and "gpus_unallocatable:1" in report.reasons
    assert not any(code_of(r) == "gpus_not_allocatable" for r in report.reasons)
    young = gpu_node(
        "y", gpus=4, instance_id="i-y", allocatable={"nvidia.com/gpu": "3"}, created=AT - timedelta(minutes=5)
    )
    report = plan(snapshot([young], [], _idle("y", gpus=4)), Policy()).node("y")
    assert report.verdict == "unknown" and any(code_of(r) == "gpus_not_allocatable" for r in report.reasons)


def _xid(values: list[float], start: float = 0.0, step: float = 60.0, code: str = "79") -> Series:
    return Series({"node": "n", "xid": code}, [start + i * step for i in range(len(values))], values)


@pytest.mark.parametrize(
    ("values", "start", "rising"),
    [
        ([0, 0, 1, 1], 0.0, True),  # a new error inside the window
        ([2, 2, 2, 2], 0.0, False),  # stale: held since before the window
        ([1, 1, 0, 0], 0.0, False),  # the exporter's counting window moving past an old error
        ([1, 1], 600.0, True),  # the xid series appeared inside the window
        ([float("nan"), 0, 2], 0.0, True),
    ],
)
def test_rising_xid_counts(values: list[float], start: float, rising: bool) -> None:
    found = rising_xids([("n", _xid(values, start))], window_start=60.0)
    assert found == ({"n": {"79"}} if rising else {})


def test_a_stale_xid_gauge_alone_is_a_hint_not_a_verdict() -> None:
    hints = last_xids([("n", Series({"node": "n"}, [0.0, 60.0], [79.0, 79.0]))])
    assert hints == {"n": {"79"}}
    snap = snapshot([_g5("n", "i-n")], [], _idle("n"), groups=[asg("asg-g5", ["i-n"], nodegroup="g5")])
    report = plan(dataclasses.replace(snap, xids={"n": ((), ("79",))}), Policy()).node("n")
    assert report.verdict == "idle" and "xid_last:79" in report.reasons
    report = plan(dataclasses.replace(snap, xids={"n": (("79",), ("79",))}), Policy()).node("n")
    assert (
        report.verdict == "unhealthy" and "xid:79" in report.reasons and "xid_last:79" not in report.reasons
    )


def _shrinking(
    *, bad_pods: list[dict[str, Any]] | None = None, repair: bool = False, idle: bool = True
) -> Plan:
    nodes = [_g5("ok", "i-ok"), _broken()]
    info = dataclasses.replace(asg("asg-g5", ["i-ok", "i-bad"], nodegroup="g5"), node_repair=repair)
    metrics = (
        _idle("ok", "bad")
        if idle
        else merge_metrics(node_devices("ok", 1, util=lambda i: 90.0), node_devices("bad", 1))
    )
    return plan(snapshot(nodes, bad_pods or [], metrics, groups=[info]), Policy())


def test_a_shrinking_group_removes_its_unhealthy_node_before_a_healthy_idle_one() -> None:
    result = _shrinking()
    assert _scale_ins(result) == ["bad"]
    assert "unhealthy_first:bad" in result.node("ok").reasons and result.node("ok").verdict == "protected"
    [action] = result.actions
    assert action.reason.startswith("unhealthy (accelerated_hardware_not_ready:NvidiaXID79Error)")


def test_an_unhealthy_node_with_a_gpu_holder_is_never_drained_for_health() -> None:
    result = _shrinking(bad_pods=[pod("train", "bad", gpus=1)])
    assert _scale_ins(result) == ["ok"]


def test_repair_owned_unhealthy_nodes_are_reported_unless_the_group_shrinks_anyway() -> None:
    still = _shrinking(repair=True, idle=False)
    assert still.actions == [] and "unhealthy_pending_repair:eks" in still.node("bad").reasons
    shrinking = _shrinking(repair=True)
    assert _scale_ins(shrinking) == ["bad"]
    reasons = shrinking.node("bad").reasons
    assert blocking_reasons(reasons, "x", offhours=False, shrinking=True) == []
    assert blocking_reasons(reasons, "x", offhours=False) == ["unhealthy_pending_repair:eks"]


# ------------------------------------------------------------------------------ interruption notices


@pytest.mark.parametrize(
    ("taint", "events", "reason"),
    [
        ("aws-node-termination-handler/spot-itn", (), "spot_interruption:spot_itn"),
        (
            "aws-node-termination-handler/rebalance-recommendation",
            (),
            "spot_interruption:rebalance_recommendation",
        ),
        (None, ("instance-retirement",), "spot_interruption:ec2_event:instance-retirement"),
    ],
)
def test_a_node_under_an_interruption_notice_is_left_to_its_handler(
    taint: str | None, events: tuple[str, ...], reason: str
) -> None:
    taints = [{"key": taint, "value": "1", "effect": "NoSchedule"}] if taint else []
    snap = snapshot(
        [_g5("s", "i-s", taints=taints)], [], _idle("s"), groups=[asg("asg-g5", ["i-s"], nodegroup="g5")]
    )
    snap = _with(snap, instances={"i-s": _ec2("i-s", lifecycle="spot", events=events)})
    result = plan(snap, Policy())
    assert reason in result.node("s").reasons and result.node("s").verdict == "protected"
    assert result.actions == []


# ------------------------------------------------------------------------------ no change of a kept reservation


def test_a_reserved_underutilized_instance_is_never_resized_nor_its_group_replaced() -> None:
    from rightsizer.domain.model import TAG_ENABLED

    node = gpu_node("solo", instance_type="g5.4xlarge", gpus=1, instance_id="i-solo", nodegroup=None)
    metrics = node_devices("solo", 1, util=lambda i: 30.0, fb_used=lambda i: 4096.0, power=lambda i: 100.0)
    snap = snapshot([node], [pod("api-0", "solo", gpus=1, cpu="2", memory="8Gi")], metrics, groups=[])
    tags = {"rightsizer.io/resize": "allowed"}
    reserved = Ec2Instance("i-solo", "g5.4xlarge", tags, "ebs", "running", "", "cr-1", "us-east-1a")
    snap = _with(snap, known=True, instances={"i-solo": reserved})
    policy = Policy(allow_resize=True, resize_allow_instance_store_loss=True)
    assert [a.kind for a in plan(snap, policy).actions if a.kind != "recommend"] == []
    released = plan(snap, policy.model_copy(update={"release_reserved_capacity": True}))
    assert [a.kind for a in released.actions] == ["resize_instance"]  # the guard is the reservation
    # a managed node group opted in for replacement, one of whose nodes is reserved
    hot = {"util": lambda i: 40.0, "fb_used": lambda i: 6000.0, "power": lambda i: 150.0}
    nodes = [
        gpu_node(n, instance_type="g5.12xlarge", gpus=4, instance_id=f"i-{n}", nodegroup="ga")
        for n in ("a", "b")
    ]
    group = dataclasses.replace(
        asg("asg-ga", ["i-a", "i-b"], min_size=1, nodegroup="ga"), tags={TAG_ENABLED: "true"}
    )
    pods = [pod(f"infer-{n}", n, gpus=1, cpu="2", memory="8Gi") for n in ("a", "b")]
    metrics = merge_metrics(*(node_devices(n, 4, per_gpu={0: hot}) for n in ("a", "b")))
    snap = snapshot(nodes, pods, metrics, groups=[group])
    replace = Policy(allow_replace_node_group=True, cooldown=0)
    assert [a.kind for a in plan(snap, replace).actions] == ["replace_node_group"]
    snap = _with(snap, instances={"i-a": _ec2("i-a", "g5.12xlarge", capacity_reservation_id="cr-2")})
    assert [a.kind for a in plan(snap, replace).actions if a.kind != "recommend"] == []
