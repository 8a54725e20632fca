"""Node group replacement preflight and refusals (issue 25), on moto + the Kubernetes double.

GIVEN the opted-in managed node group of ``test_replace_nodegroup_moto`` (two g5.12xlarge nodes, each one
A10G of four busy),
WHEN one old node carries a pod with node-local data (``hostPath``) before the replacement starts,
THEN the replacement is refused at validate (``not_a_candidate:<node>:local_storage:...``) and
``CreateNodegroup`` is never called — no new group, no launch template version;
WHEN the refusal appears only after the new group exists (the pod lands while the new nodes join),
THEN the replacement rolls back after that one refused child drain: no retry loop until the drain
deadline, the new group and its launch template version deleted, the old group's sizes and nodes intact,
nothing left cordoned.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.services.replace import ReplaceRequest, lease_key
from tests.builders import pod
from tests.integration.test_replace_nodegroup_moto import EXECUTION, NEW, OLD, World, make_world

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOST_PATH = [{"name": "cache", "hostPath": {"path": "/var/cache/models"}}]


@pytest.fixture
def world(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients)


def request() -> ReplaceRequest:
    return ReplaceRequest(lease_key(OLD), EXECUTION, "cli", None, nodegroup=OLD, target_type="g5.xlarge")


def land_host_path_pod(world: World, node: str) -> None:
    world.double.add_pod(
        pod("cache-0", node, namespace="ml", grace=0, volumes=HOST_PATH, labels={"app": "cache"})
    )


def test_a_group_with_a_refused_node_is_neither_proposed_nor_created(world: World) -> None:
    land_host_path_pod(world, world.old_nodes[1])
    assert [a.kind for a in world.observed.plan().actions if a.kind != "recommend"] == []

    workflow = world.workflow()
    workflow.start(request())
    result = workflow.step(EXECUTION)

    assert result.status == "abandoned" and result.finished
    assert result.message.startswith(f"not_a_candidate:{world.old_nodes[1]}:local_storage:ml/cache-0"), (
        result.message
    )
    assert world.nodegroup(NEW) is None  # CreateNodegroup never called
    template = (world.nodegroup(OLD) or {})["launchTemplate"]
    versions = world.clients.ec2.describe_launch_template_versions(LaunchTemplateId=template["id"])
    assert [v["VersionNumber"] for v in versions["LaunchTemplateVersions"]] == [1]
    assert world.old_sizes() == (1, 2, 3) and world.cordoned() == []


def test_a_refusal_after_the_new_group_exists_rolls_back_after_one_attempt(world: World) -> None:
    workflow = world.workflow()
    workflow.start(request())
    steps: list[str] = []
    landed = False
    for _ in range(400):
        result = workflow.step(EXECUTION)
        steps.append(result.step)
        if result.finished:
            break
        if result.next_step == "ng_drain" and not landed:
            assert world.nodegroup(NEW) is not None  # the new group exists and serves
            land_host_path_pod(world, world.old_nodes[0])
            landed = True
        world.advance(result.wait_seconds)

    assert landed and result.status == "rolled_back", result.message
    assert result.message.startswith(f"drain_refused:{world.old_nodes[0]}: not_a_candidate:"), result.message
    assert "local_storage:ml/cache-0" in result.message
    assert steps.count("ng_drain") == 1  # one attempt, no retry loop until the drain deadline
    record = world.state.load(EXECUTION)
    assert record is not None and record.details["tries"] == {world.old_nodes[0]: 1}
    assert world.nodegroup(NEW) is None  # deleted
    assert world.old_sizes() == (1, 2, 3) and world.cordoned() == []
    assert world.double.list_pods(world.old_nodes[0])  # nothing evicted from the refused node
    assert world.state.get(lease_key(OLD)) is None
