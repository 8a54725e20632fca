"""The standalone-instance resize (issue 17) end to end in-process: EC2 on a moto server, the Kubernetes
double over HTTP through the real adapter, and a kubelet that re-registers the Node with the new type.

GIVEN a running standalone g5.4xlarge (ENA, tagged ``rightsizer.io/resize=allowed``) behind a Node with two
replicated pods, WHEN ``ResizeWorkflow`` runs to g5.xlarge with the in-process runner THEN the instance
ends running as g5.xlarge and its Node is Ready with 1 GPU allocatable and uncordoned; an
``InsufficientInstanceCapacity`` answer to StartInstances, and a Node that never gets the new type's GPU
by the deadline, both end with the original type running and the Node uncordoned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.ec2_resize import Ec2Resizer
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.model import ANN_CORDONED_BY
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps, StepResult
from rightsizer.services.resize import ResizeRequest, ResizeWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.k8s.double import KubernetesDouble
from rightsizer.testing.moto_eks import BuiltCluster, inject_error_once, launch_standalone
from rightsizer.testing.periodic import Periodic
from tests.builders import gpu_node, pod
from tests.support.resize_world import Kubelet

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "ip-10-0-9-21.ec2.internal"
EXECUTION = "ip-10-0-9-21.ec2.internal-0011223344556677"
CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)


class UnderutilizedAssessor:
    """The fresh decision: busy, a cheaper shape fits (planning has its own tests)."""

    def assess_node(self, node: str, now: Any) -> NodeReport | None:
        return NodeReport(
            node=node, verdict="underutilized", reasons=["activity_above_threshold:30%"], node_group=None,
            instance_id=None, instance_type="g5.4xlarge", gpus=1, gpu_activity_max_pct=30.0,
            fb_used_max_mib=4096.0, coverage=1.0, hourly_usd=1.624,
        )  # fmt: skip


@dataclass
class World:
    clients: AwsClients
    double: KubernetesDouble
    instance_id: str
    kubelet: Kubelet

    def instance(self) -> tuple[str, str]:
        answer = self.clients.ec2.describe_instances(InstanceIds=[self.instance_id])
        found = answer["Reservations"][0]["Instances"][0]
        return str(found["State"]["Name"]), str(found["InstanceType"])

    def run(self, *, resize_timeout: int = 600) -> StepResult:
        policy = Policy.model_validate(
            {"dry_run": False, "allow_resize": True, "resize_allow_instance_store_loss": True,
             "resize_timeout": resize_timeout}
        )  # fmt: skip
        cluster = KubernetesCluster.for_eks(
            self.double.base_url, EksTokenSource("prod-eks", "us-east-1", lambda: CREDS)
        )
        deps = DrainDeps(
            cluster, AutoScalingGroups(self.clients.autoscaling), UnderutilizedAssessor(), MemoryState("prod-eks"),
            policy, dry_run=False,
        )  # fmt: skip
        changer = Ec2Resizer(self.clients.ec2, self.clients.autoscaling)
        runner = InProcessRunner(ResizeWorkflow(deps, changer), sleep=lambda s: time.sleep(min(s, 0.05)))
        runner.start(ResizeRequest(NODE, EXECUTION, target_type="g5.xlarge"))
        return runner.results[EXECUTION]

    def assert_serving_as(self, instance_type: str) -> None:
        assert self.instance() == ("running", instance_type)
        node = self.double.get_node(NODE)
        assert node is not None
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == instance_type
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
        assert not node["spec"].get("unschedulable")
        assert ANN_CORDONED_BY not in (node["metadata"].get("annotations") or {})


def make_world(clients: AwsClients, cluster: BuiltCluster, broken: frozenset[str]) -> Iterator[World]:
    instance_id = launch_standalone(clients, "g5.4xlarge", cluster.subnet_ids[0])
    with KubernetesDouble(seed=3, resource_api_versions=None) as double:
        double.add_node(
            gpu_node(NODE, instance_type="g5.4xlarge", gpus=1, instance_id=instance_id, nodegroup=None)
        )
        for i in range(2):
            obj = pod(f"api-{i}", NODE, namespace="ml", grace=1, labels={"app": "api"})
            double.add_pod(obj)
        world = World(
            clients, double, instance_id, Kubelet(double, NODE, lambda: world.instance(), broken_types=broken)
        )
        # The kubelet's first status write happens before the workflow starts, as on a live node; its later
        # writes (NotReady while stopped, re-registration) never race with our cordon or uncordon.
        world.kubelet.sync()
        follower = Periodic(world.kubelet.sync, "test-kubelet")
        follower.start(0.05)
        try:
            yield world
        finally:
            follower.stop()
        assert follower.errors == []


@pytest.fixture
def world(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> Iterator[World]:
    yield from make_world(aws_clients, gpu_cluster, frozenset())


@pytest.fixture
def broken_world(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> Iterator[World]:
    yield from make_world(aws_clients, gpu_cluster, frozenset({"g5.xlarge"}))


def test_resize_on_moto_and_the_kubernetes_double(world: World) -> None:
    result = world.run()
    assert result.status == "succeeded", result.message
    world.assert_serving_as("g5.xlarge")
    assert world.kubelet.registrations == ["g5.xlarge"]
    assert world.double.list_pods(NODE) == []  # drained before the stop
    reasons = [e["reason"] for e in world.double.events(involved_name=NODE)]
    assert reasons == ["CordonedIdle", "Resizing", "Resized"]


def test_insufficient_capacity_on_start_restores_the_original_type(world: World) -> None:
    fired = inject_error_once(world.clients.ec2, "StartInstances", "InsufficientInstanceCapacity", status=500)
    result = world.run()
    assert result.status == "rolled_back" and "InsufficientInstanceCapacity" in result.message, result.message
    assert fired == [1]
    world.assert_serving_as("g5.4xlarge")
    assert "RolledBack" in [e["reason"] for e in world.double.events(involved_name=NODE)]


def test_the_deadline_restores_the_original_type(broken_world: World) -> None:
    # g5.xlarge comes back with no allocatable GPU (no driver in the AMI, say): the deadline restores.
    result = broken_world.run(resize_timeout=2)
    assert result.status == "rolled_back" and "0/1 GPUs allocatable" in result.message, result.message
    broken_world.assert_serving_as("g5.4xlarge")
