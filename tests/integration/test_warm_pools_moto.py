"""Warm pools against moto in server mode (issue 30): the recommendation for an off-hours group, its
setting through EKS ``UpdateNodegroupConfig`` only (moto lacks ``warmPoolConfig``: ``testing.moto_gaps``),
the refusals (Spot, mixed instance types, custom AMI) and the drift of warm instances from the group's
launch template."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.adapters.warm_pools import WarmPools
from rightsizer.config import OffhoursConfig, OffhoursGroup
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.periods import Period
from rightsizer.domain.policy import Policy
from rightsizer.domain.warm_pool import EBS_GP3_USD_PER_GB_MONTH, HOURS_PER_MONTH
from rightsizer.services.warm_pools import schedule_month, warm_pool_reports
from rightsizer.testing.moto_eks import BuiltCluster, NodeGroupSpec, add_nodegroup, record_calls
from rightsizer.testing.moto_gaps import seed_warm_instance

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

CLUSTER, REGION, GROUP = "prod-eks", "us-east-1", "gpu-a10g"  # 1/3/6 g5.2xlarge (tests.support.moto_fixtures)
NIGHTS = [Period(days=["Mon", "Tue", "Wed", "Thu", "Fri"], start="20:00", end="08:00", timezone="UTC")]
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)  # a Monday, up


def offhours(*groups: str) -> OffhoursConfig:
    return OffhoursConfig(
        schedules={"nights": NIGHTS}, node_groups=[OffhoursGroup(name=g, schedule="nights") for g in groups]
    )


def reports(clients: AwsClients, policy: Policy, *groups: str, apply: bool = False, acting: bool = False,
            state: MemoryState | None = None):  # type: ignore[no-untyped-def]  # fmt: skip
    state = state or MemoryState(CLUSTER)
    return warm_pool_reports(
        WarmPools(clients.eks, clients.autoscaling), cluster=CLUSTER, offhours=offhours(*groups), policy=policy,
        catalog=load_catalog(), saved=state, entries=state.entries(), now=NOW, apply=apply, acting=acting,
    )  # fmt: skip


def test_the_schedule_gives_down_hours_and_restores_per_month() -> None:
    down, restores = schedule_month(NIGHTS, NOW)
    # 30 days from Mon 7 Dec noon: 21 full weekday nights (12 h) ... and weekends are up: 21 or 22 nights
    assert restores in (21.0, 22.0) and down == pytest.approx(12 * restores)


def test_a_stopped_pool_is_recommended_when_waiting_work_costs_more_than_its_ebs_and_set_through_eks(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    state = MemoryState(CLUSTER)
    state.save_sizes(GROUP, GroupSizes(1, 3, 6), NOW - timedelta(days=1))
    policy = Policy(dry_run=False, allow_warm_pool=True, unserved_gpu_minute_usd=0.10)
    (report,) = reports(aws_clients, policy, GROUP, state=state)
    rec = report.recommendation
    assert rec is not None and rec.refusal is None and report.current is None
    down, restores = schedule_month(NIGHTS, NOW)
    # 3 g5.2xlarge (1 GPU each), 300 s cold (nothing measured), 300 x 80/110 s warm, the group's diskSize
    disk = aws_clients.eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=GROUP)["nodegroup"][
        "diskSize"
    ]
    assert disk == 20  # EKS's (and moto's) default
    assert rec.unserved_gpu_minutes_cold == pytest.approx(3 * 5 * restores)
    assert rec.unserved_gpu_minutes_warm == pytest.approx(3 * 5 * 80 / 110 * restores)
    assert rec.usd_per_month == pytest.approx(3 * 20 * EBS_GP3_USD_PER_GB_MONTH / HOURS_PER_MONTH * down)
    assert rec.config == {
        "enabled": True, "minSize": 0, "maxGroupPreparedCapacity": 3, "poolState": "STOPPED",
        "reuseOnScaleIn": True,
    }  # fmt: skip
    assert rec.value_usd_per_month > 0 and "instance_store_wiped_on_stop" in rec.notes  # g5: local NVMe

    eks_calls, asg_calls = record_calls(aws_clients.eks), record_calls(aws_clients.autoscaling)
    # without acting (a dry run) nothing is called; with it, one UpdateNodegroupConfig and nothing else
    (dry,) = reports(aws_clients, policy, GROUP, state=state, apply=True, acting=False)
    assert dry.applied == "dry_run" and eks_calls.count("UpdateNodegroupConfig") == 0
    (done,) = reports(aws_clients, policy, GROUP, state=state, apply=True, acting=True)
    assert done.applied == "set" and eks_calls.count("UpdateNodegroupConfig") == 1
    assert asg_calls.count("PutWarmPool") == 0  # EKS manages the group's pool; we never touch the ASG's
    ng = aws_clients.eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=GROUP)["nodegroup"]
    assert (
        ng["warmPoolConfig"]["poolState"] == "STOPPED"
        and ng["warmPoolConfig"]["maxGroupPreparedCapacity"] == 3
    )
    asg = gpu_cluster.nodegroups[GROUP].asg_name
    pool = aws_clients.autoscaling.describe_warm_pool(AutoScalingGroupName=asg)["WarmPoolConfiguration"]
    assert pool["MaxGroupPreparedCapacity"] == 3 and pool["PoolState"] == "Stopped"
    (again,) = reports(aws_clients, policy, GROUP, state=state, apply=True, acting=True)
    assert again.applied == "already_set" and eks_calls.count("UpdateNodegroupConfig") == 1

    # a warm instance launched from an older template version drifts from the group's
    template = gpu_cluster.nodegroups[GROUP].launch_template_id
    seed_warm_instance(REGION, asg, "i-0warm0old", template, "0")
    seed_warm_instance(REGION, asg, "i-0warm0new", "lt-other", "1")
    (seen,) = reports(aws_clients, policy, GROUP, state=state)
    # the fixture's group names no launch template (instanceTypes): EKS manages its own, nothing to compare
    assert seen.drift == []


def test_drift_is_reported_against_the_group_s_launch_template_version(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    spec = NodeGroupSpec("gpu-pinned", instance_type="g5.xlarge", min_size=0, desired=2, max_size=2,
                         pinned_template=True)  # fmt: skip
    built = add_nodegroup(aws_clients, CLUSTER, gpu_cluster.subnet_ids, spec, region=REGION)
    policy = Policy(dry_run=False, allow_warm_pool=True, unserved_gpu_minute_usd=1.0)
    (first,) = reports(aws_clients, policy, "gpu-pinned", apply=True, acting=True)
    assert first.applied == "set"
    seed_warm_instance(REGION, built.asg_name, "i-0fresh", built.launch_template_id, "1")
    seed_warm_instance(REGION, built.asg_name, "i-0stale", built.launch_template_id, "0")
    (seen,) = reports(aws_clients, policy, "gpu-pinned")
    assert seen.drift == [f"i-0stale: template {built.launch_template_id} version 0, group at "
                          f"{built.launch_template_id} version 1"]  # fmt: skip


def test_spot_mixed_and_custom_ami_groups_are_refused_with_the_reason(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    eks = aws_clients.eks
    base = {"clusterName": CLUSTER, "nodeRole": "arn:aws:iam::123456789012:role/node",
            "subnets": list(gpu_cluster.subnet_ids), "scalingConfig": {"minSize": 0, "desiredSize": 1, "maxSize": 2}}  # fmt: skip
    eks.create_nodegroup(nodegroupName="spot", capacityType="SPOT", instanceTypes=["g5.xlarge"], **base)  # type: ignore[arg-type]
    eks.create_nodegroup(nodegroupName="mixed", instanceTypes=["g5.xlarge", "g6.xlarge"], **base)  # type: ignore[arg-type]
    eks.create_nodegroup(nodegroupName="custom", amiType="CUSTOM", instanceTypes=["g5.xlarge"], **base)  # type: ignore[arg-type]
    calls = record_calls(eks)
    policy = Policy(dry_run=False, allow_warm_pool=True, unserved_gpu_minute_usd=100.0)
    got = reports(aws_clients, policy, "spot", "mixed", "custom", apply=True, acting=True)
    assert [
        (r.node_group, r.recommendation.refusal if r.recommendation else None, r.applied) for r in got
    ] == [
        ("spot", "spot_capacity", "refused:spot_capacity"),
        ("mixed", "mixed_instance_types", "refused:mixed_instance_types"),
        ("custom", "custom_ami", "refused:custom_ami"),
    ]
    assert all(r.recommendation and r.recommendation.config is None for r in got)
    assert calls.count("UpdateNodegroupConfig") == 0


def test_without_allow_warm_pool_apply_only_reports(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)
    (r,) = reports(
        aws_clients, Policy(dry_run=False, unserved_gpu_minute_usd=1.0), GROUP, apply=True, acting=True
    )
    assert r.applied == "not_allowed" and calls.count("UpdateNodegroupConfig") == 0
    # at a price of nothing, waiting work is free: a pool is never worth its EBS
    (free,) = reports(aws_clients, Policy(unserved_gpu_minute_usd=0.0), GROUP)
    assert free.recommendation is not None and free.recommendation.config is None
    assert free.recommendation.value_usd_per_month < 0
