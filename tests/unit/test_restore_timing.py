"""Measured restore delay (issue 30): a scale-out's milestones from the Kubernetes and EC2 objects, their
ledger encoding, p50/p95 per node group, and the billed end of a removal's saving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.restore_timing import RestoreTiming, delay_stats, nearest_rank, timing_from_reason
from rightsizer.services.realized import realized_savings
from rightsizer.services.restore_timing import (
    SETTLE,
    ScaleOutObserver,
    measure_node,
    observe_restore,
    recorded_timings,
)
from rightsizer.state import LedgerEntry
from tests.builders import gpu_node, pod

T0 = datetime(2026, 12, 7, 7, 0, tzinfo=UTC)


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, *, created: datetime, ready: datetime | None, gpus: int = 1) -> dict[str, Any]:
    raw = gpu_node(name, instance_type="g5.xlarge", gpus=gpus)
    raw["metadata"]["creationTimestamp"] = rfc(created)
    raw["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = "gpu-a10g"
    raw["spec"]["providerID"] = f"aws:///us-east-1a/i-{name}"
    status = "True" if ready is not None else "False"
    raw["status"]["conditions"] = [
        {"type": "Ready", "status": status, "lastTransitionTime": rfc(ready or created)}
    ]
    if gpus == 0:
        raw["status"]["allocatable"].pop("nvidia.com/gpu", None)
    return raw


def gpu_pod(on: str, *, scheduled: datetime, ready: datetime | None) -> dict[str, Any]:
    raw = pod(f"{on}-server", on, gpus=1)
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc(scheduled)}
    ]
    if ready is not None:
        raw["status"]["conditions"].append(
            {"type": "Ready", "status": "True", "lastTransitionTime": rfc(ready)}
        )
    return raw


def test_a_cold_node_is_timed_from_the_request_to_its_first_gpu_pod_ready() -> None:
    n = node("a", created=T0 + timedelta(seconds=70), ready=T0 + timedelta(seconds=95))
    p = gpu_pod("a", scheduled=T0 + timedelta(seconds=130), ready=T0 + timedelta(seconds=170))
    t = measure_node(
        n, [p], group="gpu-a10g", cause="offhours_restore", requested_at=T0,
        launched_at=T0 + timedelta(seconds=20), now=T0 + timedelta(minutes=5),
    )  # fmt: skip
    assert t is not None and t.start == "cold"
    assert [t.seconds(m) for m in ("instance_running", "node_ready", "gpu_allocatable", "first_gpu_pod_ready")] == [
        20, 95, 130, 170
    ]  # fmt: skip
    assert t.serving_seconds == 170
    again = timing_from_reason("gpu-a10g", "a", t.reason())
    assert again == t
    assert t.reason() == (
        "cause=offhours_restore start=cold requested=2026-12-07T07:00:00Z instance_running=+20 "
        "node_ready=+95 gpu_allocatable=+130 first_gpu_pod_ready=+170"
    )


def test_a_warm_instance_was_launched_before_the_request_and_a_node_waits_to_settle() -> None:
    n = node("b", created=T0 + timedelta(seconds=30), ready=T0 + timedelta(seconds=50))
    kwargs: dict[str, Any] = {"group": "gpu-a10g", "cause": "offhours_restore", "requested_at": T0}
    launched = T0 - timedelta(days=3)
    # no GPU pod yet: not final until SETTLE after Node Ready; then GPUs allocatable is not known and
    # the serving time is Node Ready's (a lower bound)
    assert measure_node(n, [], launched_at=launched, now=T0 + timedelta(minutes=2), **kwargs) is None
    late = T0 + timedelta(seconds=50) + SETTLE
    t = measure_node(n, [], launched_at=launched, now=late, **kwargs)
    assert t is not None and t.start == "warm" and t.instance_running_at is None
    assert t.first_gpu_pod_ready_at is None and t.gpu_allocatable_at is None
    assert t.serving_seconds == 50
    # not Ready, or Ready without GPUs (the device plugin has not registered, BUG-20): nothing yet
    assert measure_node(node("c", created=T0, ready=None), [], launched_at=None, now=late, **kwargs) is None
    no_gpus = node("d", created=T0, ready=T0 + timedelta(seconds=40), gpus=0)
    assert measure_node(no_gpus, [], launched_at=None, now=late, **kwargs) is None


def test_p50_and_p95_per_group_are_measured_values_and_incomplete_restores_are_left_out() -> None:
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank([float(x) for x in range(1, 21)], 0.95) == 19.0
    timings = [
        RestoreTiming(
            "g",
            f"n{k}",
            "offhours_restore",
            T0 + timedelta(hours=k),
            node_ready_at=T0 + timedelta(hours=k, seconds=60 + k),
            gpu_allocatable_at=T0 + timedelta(hours=k, seconds=100 + k),
            start="warm" if k % 2 else "cold",
        )
        for k in range(1, 21)
    ]
    stuck = RestoreTiming("g", "x", "offhours_restore", T0)
    stats = delay_stats([*timings, stuck])["g"]
    assert stats.count == 20 and stats.warm == 10
    assert stats.p50["node_ready"] == 70 and stats.p95["node_ready"] == 79
    assert stats.serving_p50 == 110 and stats.serving_p95 == 119
    assert "first_gpu_pod_ready" not in stats.p50


def restore_entry(at: datetime, cycle: str = "offhours-gpu-a10g-1") -> LedgerEntry:
    return LedgerEntry(
        execution_id=cycle, node=None, instance_id=None, node_group="gpu-a10g", kind="scale_node_group",
        step="restore", result="applied", reason="restore saved sizes", hourly_savings_usd=None,
        monthly_savings_usd=None, at=at,
    )  # fmt: skip


class Pods:
    def __init__(self, pods: dict[str, list[dict[str, Any]]]) -> None:
        self.pods = pods

    def list_pods_on_node(self, name: str) -> list[dict[str, Any]]:
        return self.pods.get(name, [])


class Instances:
    def describe_instances(self, ids: Any) -> dict[str, Any]:
        return {"Reservations": [{"Instances": [
            {"InstanceId": "i-a", "LaunchTime": rfc(T0 + timedelta(seconds=25))},
            {"InstanceId": "i-b", "LaunchTime": rfc(T0 - timedelta(days=1))},
        ]}]}  # fmt: skip


def test_the_observer_records_each_node_of_the_latest_restore_once() -> None:
    state = MemoryState("c")
    state.record(restore_entry(T0))
    old = node("old", created=T0 - timedelta(hours=5), ready=T0 - timedelta(hours=5))
    a = node("a", created=T0 + timedelta(seconds=70), ready=T0 + timedelta(seconds=95))
    b = node("b", created=T0 + timedelta(seconds=40), ready=T0 + timedelta(seconds=60))
    pods = Pods({
        "a": [gpu_pod("a", scheduled=T0 + timedelta(seconds=120), ready=T0 + timedelta(seconds=150))],
        "b": [gpu_pod("b", scheduled=T0 + timedelta(seconds=70), ready=T0 + timedelta(seconds=90))],
    })  # fmt: skip
    observer = ScaleOutObserver(state, pods, Instances())
    now = T0 + timedelta(minutes=5)
    got = observe_restore(observer, "gpu-a10g", [old, a, b], state.entries(), now)
    assert sorted((t.node, t.start, t.serving_seconds) for t in got) == [
        ("a", "cold", 150),
        ("b", "warm", 90),
    ]
    assert (
        observe_restore(observer, "gpu-a10g", [old, a, b], state.entries(), now + timedelta(minutes=5)) == []
    )
    recorded = recorded_timings(state.entries())
    assert [(t.node, t.serving_seconds) for t in recorded] == [("a", 150.0), ("b", 90.0)]
    stats = delay_stats(recorded)["gpu-a10g"]
    assert stats.count == 2 and stats.warm == 1 and stats.serving_p50 == 90
    # a restore older than the horizon is not this node's: nothing measured
    assert observe_restore(observer, "gpu-a10g", [a], state.entries(), T0 + timedelta(hours=3)) == []


def test_a_measured_scale_out_ends_a_removal_s_saving_at_its_request() -> None:
    removal = LedgerEntry(
        execution_id="d1", node="n1", instance_id="i-1", node_group="gpu-a10g", kind="scale_in",
        step="terminate", result="applied", reason="", hourly_savings_usd=1.006, monthly_savings_usd=None,
        at=T0 - timedelta(hours=2),
    )  # fmt: skip
    timing = RestoreTiming("gpu-a10g", "a", "scale_out", T0, gpu_allocatable_at=T0 + timedelta(minutes=3))
    measured = LedgerEntry(
        execution_id="x", node="a", instance_id=None, node_group="gpu-a10g", kind="scale_node_group",
        step="scaled_out", result="applied", reason=timing.reason(), hourly_savings_usd=None,
        monthly_savings_usd=None, at=T0 + timedelta(minutes=20),
    )  # fmt: skip
    rows = realized_savings([removal, measured], T0 + timedelta(hours=4))
    assert [r.instance_hours for r in rows] == [pytest.approx(2.0)]  # recorded at 07:20, billed from 07:00
