"""Measured restore delay through a real off-hours down/up cycle (issue 30): moto in server mode, the
Kubernetes double with its node lifecycle following moto's instances, and the product wired as the demo
wires it (``Runtime`` with the snapshot-form metrics).

The demo environment's clock is moved 20 minutes back, so that the down tick (inside the schedule's off
period, which ended 5 minutes ago) happens on the demo's "now" and the up ticks on the wall clock, which the
new Nodes' creation times, their Ready conditions and moto's ``LaunchTime`` also follow.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rightsizer.cli.backtest import measured_provision_delay
from rightsizer.config import OffhoursConfig, OffhoursGroup
from rightsizer.demo import DEV_GROUP
from rightsizer.domain.periods import Period
from rightsizer.domain.policy import Policy
from rightsizer.render import render_status
from rightsizer.services.offhours import run_offhours
from rightsizer.services.restore_timing import recorded_timings
from rightsizer.services.status import read_status
from rightsizer.testing.demo_env import DemoEnvironment
from rightsizer.wiring import Runtime
from tests.builders import pod

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _hhmm(t: datetime) -> str:
    return t.strftime("%H:%M")


def _rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _group_nodes(env: DemoEnvironment) -> list[dict[str, Any]]:
    return [
        n
        for n in env.double.list_nodes()
        if n["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == DEV_GROUP
    ]


def test_a_restore_is_timed_from_the_desired_change_to_the_first_gpu_pod_ready() -> None:
    wall = datetime.now(UTC).replace(microsecond=0)
    down_at = wall - timedelta(minutes=20)
    with DemoEnvironment(now=down_at.timestamp()) as env:
        offhours = OffhoursConfig(
            schedules={"nights": [Period(days=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
                                         start=_hhmm(wall - timedelta(hours=1)),
                                         end=_hhmm(wall - timedelta(minutes=5)), timezone="UTC")]},
            node_groups=[OffhoursGroup(name=DEV_GROUP, schedule="nights")],
        )  # fmt: skip
        config = env.config(policy=Policy(dry_run=False), offhours=offhours)
        runtime = Runtime(config, "demo", dry_run=False, metrics=env.metrics)
        deps = runtime.offhours()
        asg = env.asg_name(DEV_GROUP)
        before = runtime.scaler.describe_group(asg).sizes
        assert before.desired == 2

        # down: the real tick drains both idle nodes and sets desired 0
        for _ in range(6):
            run_offhours(deps, down_at)
            env.settle()
            if runtime.scaler.describe_group(asg).sizes.desired == 0:
                break
        assert runtime.scaler.describe_group(asg).sizes.desired == 0 and not _group_nodes(env)

        # up: the restore's UpdateNodegroupConfig; moto launches, the lifecycle joins two new Nodes
        requested = datetime.now(UTC)
        up = run_offhours(deps, requested)
        assert up.group(DEV_GROUP).outcome == "restoring"
        for _ in range(20):
            env.settle()
            if len(_group_nodes(env)) == 2:
                break
            time.sleep(0.2)
        nodes = _group_nodes(env)
        assert len(nodes) == 2
        # the workload's GPU pods are scheduled and become Ready a few seconds after their nodes
        for k, node in enumerate(nodes):
            created = datetime.fromisoformat(node["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
            raw = pod(f"vllm-{k}", node["metadata"]["name"], gpus=1)
            raw["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _rfc(created + timedelta(seconds=3))},
                {"type": "Ready", "status": "True", "lastTransitionTime": _rfc(created + timedelta(seconds=40 + k))},
            ]  # fmt: skip
            env.double.add_pod(raw)
        done = run_offhours(deps, datetime.now(UTC))
        assert done.group(DEV_GROUP).outcome == "restored", done.group(DEV_GROUP)
        measured = [a for a in done.group(DEV_GROUP).actions if a.startswith("measured restore of")]
        assert len(measured) == 2

        timings = recorded_timings(runtime.state.entries())
        assert sorted(t.node for t in timings) == sorted(n["metadata"]["name"] for n in nodes)
        for t in timings:
            assert t.cause == "offhours_restore" and t.start == "cold"  # launched after the request
            assert abs((t.requested_at - requested).total_seconds()) < 1
            running, ready = t.seconds("instance_running"), t.seconds("node_ready")
            allocatable, served = t.seconds("gpu_allocatable"), t.seconds("first_gpu_pod_ready")
            assert (
                running is not None and ready is not None and allocatable is not None and served is not None
            )
            assert 0 <= running <= ready + 1 and ready <= allocatable <= served
            assert served == pytest.approx(ready + 40, abs=2)  # Ready 40-41 s after the node was created
        # measured once: the next tick records nothing new
        again = run_offhours(deps, datetime.now(UTC))
        assert not [a for a in again.group(DEV_GROUP).actions if a.startswith("measured")]
        assert len(recorded_timings(runtime.state.entries())) == 2

        # status shows p50/p95 per group; the backtest's --provision-delay measured uses the p50
        status = read_status(
            runtime.state, runtime.plans, datetime.now(UTC), offhours_groups=[DEV_GROUP]
        ).to_json()
        (row,) = status["restore_delays"]
        assert row["node_group"] == DEV_GROUP and row["measured"] == 2 and row["warm"] == 0
        served = sorted(t.serving_seconds or 0 for t in timings)
        assert row["serving_p50_seconds"] == served[0] and row["serving_p95_seconds"] == served[1]
        assert "Measured restore delays" in render_status(status)
        assert measured_provision_delay(config) == round(served[0])
