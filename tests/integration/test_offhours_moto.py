"""Off-hours against a moto server (docs/architecture.md §4, §7; BUG-27): real EKS/Auto Scaling/DynamoDB calls over HTTP.

moto links neither direction between a managed node group and its ASG, so the fixtures' reconciler
mirrors ``UpdateNodegroupConfig`` onto the ASG (which then launches or terminates instances) and the
ASG's DesiredCapacity back, as EKS does. The Kubernetes side is the in-memory fake cluster of the unit
tests, with a node lifecycle that follows the ASG's InService instances (a terminated instance's Node goes
away; a launched one appears, Ready with GPUs unless the test says otherwise). Saved sizes, the ledger,
leases and budget slots live in the DynamoDB store on moto.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients, make_clients
from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.adapters.eks_nodegroups import EksNodeGroups
from rightsizer.config import OffhoursConfig, OffhoursGroup
from rightsizer.domain.model import TAG_ENABLED, GroupSizes
from rightsizer.domain.periods import Period
from rightsizer.domain.policy import Policy
from rightsizer.services.drain import DrainDeps
from rightsizer.services.offhours import (
    METRIC_RESTORE_OVERDUE,
    TAG_OFFHOURS,
    OffhoursDeps,
    OffhoursReport,
    in_process_starters,
    ready_gpu_nodes,
    run_offhours,
)
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.moto_eks import (
    BuiltCluster,
    MotoServer,
    NodeGroupReconciler,
    record_calls,
    seed_instance,
)
from tests.builders import gpu_node, pod
from tests.support.offhours_world import FakeAssessor, FakeCluster

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

CLUSTER = "prod-eks"
REGION = "us-east-1"
GROUP = "gpu-a10g"  # 1/3/6 with three g5.2xlarge instances (tests.support.moto_fixtures)
WEEKEND = [
    Period(days=["Fri"], start="20:00", end="00:00", timezone="Europe/Berlin"),
    Period(days=["Sat", "Sun"], start="00:00", end="00:00", timezone="Europe/Berlin"),
    Period(days=["Mon"], start="00:00", end="07:00", timezone="Europe/Berlin"),
]
SATURDAY = datetime(2024, 5, 18, 11, 0, tzinfo=UTC)  # 13:00 in Berlin
MONDAY = datetime(2024, 5, 20, 6, 0, tzinfo=UTC)  # 08:00 in Berlin


class AsgNodeLifecycle:
    """Keeps the fake cluster's Nodes in step with the ASGs: one Node per InService instance."""

    def __init__(self, clients: AwsClients, cluster: FakeCluster, reconciler: NodeGroupReconciler) -> None:
        self.clients = clients
        self.cluster = cluster
        self.reconciler = reconciler
        self.new_nodes_ready = True

    def __call__(self) -> None:
        self.reconciler.reconcile()
        eks, asg = self.clients.eks, self.clients.autoscaling
        alive: set[str] = set()
        for name in eks.list_nodegroups(clusterName=CLUSTER)["nodegroups"]:
            ng = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]
            asg_name = ng["resources"]["autoScalingGroups"][0]["name"]
            groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"]
            for instance in groups[0]["Instances"] if groups else []:
                if instance["LifecycleState"] != "InService":
                    continue
                instance_id = str(instance["InstanceId"])
                alive.add(instance_id)
                if self.cluster.node_of_instance(instance_id) is None:
                    node = f"ip-{instance_id[2:]}"
                    self.cluster.add_node(
                        gpu_node(
                            node, instance_id=instance_id, nodegroup=name, instance_type="g5.2xlarge", gpus=1
                        ),
                        [pod(f"web-{instance_id[2:]}", node)],
                    )
                    self.cluster.set_ready(node, self.new_nodes_ready)
        for node, obj in list(self.cluster.nodes.items()):
            if obj["spec"]["providerID"].rsplit("/", 1)[-1] not in alive:
                self.cluster.remove_node(node)


@dataclass
class Env:
    clients: AwsClients
    product: AwsClients
    cluster: FakeCluster
    lifecycle: AsgNodeLifecycle
    groups: EksNodeGroups
    scaler: AutoScalingGroups
    state: DynamoDbState
    deps: OffhoursDeps
    clock: list[datetime]

    def run(self, now: datetime, **kwargs: Any) -> OffhoursReport:
        self.clock[0] = now
        report = run_offhours(self.deps, now, **kwargs)
        self.lifecycle()  # let EKS/ASG and the Nodes settle before the test looks
        return report

    def scaling_config(self, nodegroup: str = GROUP) -> tuple[int, int, int]:
        ng = self.clients.eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=nodegroup)["nodegroup"]
        c = ng["scalingConfig"]
        return int(c["minSize"]), int(c["desiredSize"]), int(c["maxSize"])

    def asg(self, nodegroup: str = GROUP) -> tuple[int, int, int, int]:
        info = self.groups.describe(CLUSTER, nodegroup)
        assert info.asg_name is not None
        group = self.scaler.describe_group(info.asg_name)
        return group.sizes.min, group.sizes.desired, group.sizes.max, len(group.in_service)


@pytest.fixture
def env(
    aws_clients: AwsClients,
    gpu_cluster: BuiltCluster,
    reconciler: NodeGroupReconciler,
    moto_server: MotoServer,
    boto_session: boto3.session.Session,
) -> Iterator[Env]:
    dynamodb = boto_session.client("dynamodb", region_name=REGION, endpoint_url=moto_server.endpoint_url)
    create_state_table(dynamodb, "rightsizer-state")
    state = DynamoDbState(dynamodb, "rightsizer-state", CLUSTER)
    cluster = FakeCluster()
    lifecycle = AsgNodeLifecycle(aws_clients, cluster, reconciler)
    cluster.before_read = lifecycle
    lifecycle()
    # Its own clients, so that call counts see the product's calls and not the reconciler's.
    product = make_clients(REGION, endpoint_url=moto_server.endpoint_url, session=boto_session)
    groups = EksNodeGroups(product.eks, sleep=lambda _s: None, delay_s=0.0)
    scaler = AutoScalingGroups(product.autoscaling)
    assessor = FakeAssessor(cluster)
    policy = Policy(dry_run=False)
    clock = [SATURDAY]
    drain_deps = DrainDeps(
        cluster=cluster,
        scaler=scaler,
        assessor=assessor,
        state=state,
        policy=policy,
        dry_run=False,
        clock=lambda: clock[0],
    )
    normal, forced = in_process_starters(drain_deps, sleep=lambda _s: None)
    deps = OffhoursDeps(
        cluster=CLUSTER,
        config=OffhoursConfig(
            schedules={"weekend": WEEKEND}, node_groups=[OffhoursGroup(name=GROUP, schedule="weekend")]
        ),
        policy=policy,
        nodes=cluster,
        sizer=groups,
        scaler=scaler,
        assessor=assessor,
        state=state,
        starter=normal,
        forced_starter=forced,
        dry_run=False,
    )
    yield Env(aws_clients, product, cluster, lifecycle, groups, scaler, state, deps, clock)


def _nodes(env: Env, group: str = GROUP) -> list[str]:
    return sorted(
        n
        for n, o in env.cluster.nodes.items()
        if o["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == group
    )


def test_weekend_down_twice_then_monday_restores_exact_sizes(env: Env) -> None:
    eks_calls = record_calls(env.product.eks)
    assert len(_nodes(env)) == 3

    report = env.run(SATURDAY)
    group = report.group(GROUP)
    assert group.outcome == "scaling_down" and not report.failed, group
    assert [d["status"] for d in group.drains] == ["succeeded"] * 3
    saved = env.state.get_sizes(GROUP)
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)
    assert env.asg() == (0, 0, 6, 0)
    assert env.scaling_config() == (0, 0, 6)
    assert _nodes(env) == []
    assert eks_calls.count("UpdateNodegroupConfig") == 1  # min 0 only; the drains decremented desired
    # The other group (not selected) is untouched.
    assert env.asg("gpu-l4") == (0, 1, 2, 1)

    again = env.run(SATURDAY + timedelta(minutes=5))
    assert again.group(GROUP).outcome == "down"
    assert env.state.get_sizes(GROUP) == saved
    assert eks_calls.count("UpdateNodegroupConfig") == 1

    first_up = env.run(MONDAY)
    assert first_up.group(GROUP).outcome == "restoring"
    assert eks_calls.count("UpdateNodegroupConfig") == 2
    assert env.scaling_config() == (1, 3, 6)
    assert env.asg() == (1, 3, 6, 3)

    done = env.run(MONDAY + timedelta(minutes=5))
    assert done.group(GROUP).outcome == "restored", done.group(GROUP)
    assert env.state.get_sizes(GROUP) is None
    assert len(ready_gpu_nodes(env.cluster.list_nodes(), GROUP)) == 3
    steps = [(e.step, e.result) for e in env.state.entries() if e.kind == "scale_node_group"]
    assert steps == [("min_zero", "applied"), ("restore", "applied"), ("restored", "applied")]


def _fail_launches(client: Any, message: str, at: datetime) -> None:
    """Make DescribeScalingActivities answer with one failed launch, as Auto Scaling does under ICE.

    moto always answers an empty list; the hook answers before the request is sent, everything else
    stays on the server.
    """

    def handler(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        body = {
            "Activities": [
                {
                    "ActivityId": "f00d-1",
                    "AutoScalingGroupName": "x",
                    "Cause": "user request update of desired capacity",
                    "Description": "Launching a new EC2 instance.  Status Reason: " + message,
                    "StartTime": at,
                    "StatusCode": "Failed",
                    "StatusMessage": message,
                    "Progress": 100,
                }
            ],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        return AWSResponse("https://autoscaling.invalid/", 200, HTTPHeaders(), None), body

    client.meta.events.register("before-call.auto-scaling.DescribeScalingActivities", handler)


def test_failed_restore_reports_the_error_code_retries_and_alarms(env: Env) -> None:
    env.run(SATURDAY)
    assert env.asg() == (0, 0, 6, 0)
    _fail_launches(
        env.product.autoscaling,
        "Could not launch On-Demand Instances. InsufficientInstanceCapacity - capacity not available for "
        "g5.2xlarge in us-east-1a. Launching EC2 instance failed.",
        MONDAY + timedelta(seconds=7),
    )
    env.lifecycle.new_nodes_ready = False  # instances come up, their Nodes never get Ready

    ticks = [env.run(MONDAY + timedelta(minutes=m)) for m in (0, 10, 20)]
    for report in ticks:
        group = report.group(GROUP)
        assert group.outcome == "restoring" and not group.restore_overdue
        assert [f["code"] for f in group.failed_activities] == ["InsufficientInstanceCapacity"]
        assert "ready:0/3" in group.reasons
    assert env.scaling_config() == (1, 3, 6)

    overdue = env.run(MONDAY + timedelta(minutes=31))
    assert overdue.alarms == [GROUP] and overdue.failed
    assert overdue.metrics[0]["name"] == METRIC_RESTORE_OVERDUE
    assert env.state.get_sizes(GROUP) is not None  # resumable: the next tick carries on

    for node in _nodes(env):
        env.cluster.set_ready(node, True)
    done = env.run(MONDAY + timedelta(minutes=35))
    assert done.group(GROUP).outcome == "restored" and not done.failed
    assert env.state.get_sizes(GROUP) is None


def test_a_tagged_node_group_is_selected(env: Env, gpu_cluster: BuiltCluster) -> None:
    eks, asg = env.clients.eks, env.clients.autoscaling
    ng = eks.create_nodegroup(
        clusterName=CLUSTER,
        nodegroupName="gpu-tagged",
        nodeRole="arn:aws:iam::123456789012:role/eks-node",
        subnets=list(gpu_cluster.subnet_ids),
        instanceTypes=["g5.2xlarge"],
        scalingConfig={"minSize": 1, "desiredSize": 2, "maxSize": 3},
        tags={TAG_OFFHOURS: "weekend", TAG_ENABLED: "true"},
    )["nodegroup"]
    asg_name = ng["resources"]["autoScalingGroups"][0]["name"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=asg_name,
        LaunchTemplate={
            "LaunchTemplateId": gpu_cluster.nodegroups[GROUP].launch_template_id,
            "Version": "$Latest",
        },
        MinSize=1,
        MaxSize=3,
        DesiredCapacity=2,
        VPCZoneIdentifier=",".join(gpu_cluster.subnet_ids),
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True}
            for k, v in {TAG_ENABLED: "true", "eks:cluster-name": CLUSTER}.items()
        ],
    )
    for instance in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"][
        0
    ]["Instances"]:
        seed_instance(instance["InstanceId"], region=REGION, ena_support=True)
    env.lifecycle()
    assert len(_nodes(env, "gpu-tagged")) == 2

    report = env.run(SATURDAY)
    tagged = report.group("gpu-tagged")
    assert (tagged.source, tagged.schedule, tagged.outcome) == ("tag", "weekend", "scaling_down")
    assert env.asg("gpu-tagged") == (0, 0, 3, 0)
    saved = env.state.get_sizes("gpu-tagged")
    assert saved is not None and saved.sizes == GroupSizes(1, 2, 3)
    assert "gpu-l4" not in [g.node_group for g in report.groups]


def test_dry_run_on_moto_changes_nothing(env: Env) -> None:
    calls = record_calls(env.product.eks)
    asg_calls = record_calls(env.product.autoscaling)
    env.deps.dry_run = True
    report = env.run(SATURDAY)
    assert report.dry_run and report.group(GROUP).outcome == "scaling_down"
    assert calls.count("UpdateNodegroupConfig") == 0
    assert asg_calls.count("TerminateInstanceInAutoScalingGroup") == 0
    assert env.asg() == (1, 3, 6, 3) and len(_nodes(env)) == 3
    assert env.state.get_sizes(GROUP) is None and env.state.entries() == []
