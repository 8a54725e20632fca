"""A resize that dies after the stop is brought back by the healer (issue 17) — EC2 on a moto server, the
Kubernetes double over HTTP through the real adapter, a kubelet that re-registers the Node.

GIVEN the standalone g5.4xlarge of ``test_resize_moto`` being resized to g5.xlarge, WHEN the process dies
right after StopInstances, or right after ModifyInstanceAttribute (the instance stopped as g5.xlarge), THEN
once its lease expired ``heal_dead_resizes`` (what every assessment runs first) restarts the resize in
process: the instance is running as g5.4xlarge again, its Node Ready with its GPU and uncordoned, the
record ``rolled_back``; a second heal does nothing (no EC2 call, no new ledger line).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.ec2_resize import Ec2Resizer
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps
from rightsizer.services.healing import heal_dead_resizes
from rightsizer.services.resize import ResizeRequest, ResizeWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.state import lease_ttl_seconds
from rightsizer.testing.moto_eks import BuiltCluster
from tests.integration.test_resize_moto import (
    CREDS,
    EXECUTION,
    NODE,
    UnderutilizedAssessor,
    World,
    make_world,
)

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

POLICY = Policy.model_validate(
    {"dry_run": False, "allow_resize": True, "resize_allow_instance_store_loss": True, "resize_timeout": 600}
)
TTL = lease_ttl_seconds(timedelta(seconds=POLICY.drain_timeout))


@pytest.fixture
def world(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> Iterator[World]:
    yield from make_world(aws_clients, gpu_cluster, frozenset())


def workflow(w: World, state: MemoryState) -> ResizeWorkflow:
    """A fresh process's workflow over the same state table (what a new Lambda or CLI run builds)."""
    cluster = KubernetesCluster.for_eks(
        w.double.base_url, EksTokenSource("prod-eks", "us-east-1", lambda: CREDS)
    )
    deps = DrainDeps(
        cluster,
        AutoScalingGroups(w.clients.autoscaling),
        UnderutilizedAssessor(),
        state,
        POLICY,
        dry_run=False,
    )
    return ResizeWorkflow(deps, Ec2Resizer(w.clients.ec2, w.clients.autoscaling))


def die_after(w: World, state: MemoryState, step: str) -> None:
    """Run the resize until ``step`` has run, then abandon it (the process dies)."""
    wf = workflow(w, state)
    wf.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))
    for _ in range(400):
        result = wf.step(EXECUTION)
        assert not result.finished, result
        if result.step == step and result.next_step != step:
            return
        time.sleep(min(result.wait_seconds, 0.05))
    raise AssertionError(f"never passed {step}")


def later() -> datetime:
    """An assessment after the dead workflow's lease expired."""
    return datetime.now(UTC) + timedelta(seconds=TTL + 1)


@pytest.mark.parametrize(
    ("died_after", "type_then"),
    [("stop", "g5.4xlarge"), ("set_type", "g5.xlarge")],
    ids=["after-stop", "after-modify"],
)
def test_the_healer_restores_a_resize_that_died_after_its_stop(
    world: World, died_after: str, type_then: str
) -> None:
    state = MemoryState("prod-eks")
    die_after(world, state, died_after)
    assert world.instance()[1] == type_then and world.instance()[0] in ("stopping", "stopped")
    node = world.double.get_node(NODE)
    assert node is not None and node["spec"].get("unschedulable")

    # While the lease is live the healer leaves it alone (the workflow may be alive).
    runner = InProcessRunner(workflow(world, state), sleep=lambda s: time.sleep(min(s, 0.05)))
    assert heal_dead_resizes(state, runner, datetime.now(UTC), TTL) == []

    assert heal_dead_resizes(state, runner, later(), TTL) == [NODE]
    result = runner.results[EXECUTION]
    assert result.status == "rolled_back", result.message
    world.assert_serving_as("g5.4xlarge")
    record = state.load(EXECUTION)
    assert record is not None and record.status == "rolled_back" and record.details["resumes"] == 1
    assert state.get(NODE) is None and state.slots() == []
    reasons = [e["reason"] for e in world.double.events(involved_name=NODE)]
    assert reasons[-2:] == ["ResizeResumed", "RolledBack"]

    # A second heal is a no-op.
    entries, version = state.entries(EXECUTION), record.version
    assert heal_dead_resizes(state, runner, later(), TTL) == []
    again = state.load(EXECUTION)
    assert again is not None and again.version == version and state.entries(EXECUTION) == entries
    world.assert_serving_as("g5.4xlarge")
