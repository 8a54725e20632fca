"""The AWS adapter against a moto server over HTTP (docs/architecture.md §4, BUG-23/25/26/27).

Real boto3 clients with ``endpoint_url``; faults are injected with botocore event hooks, never by
mocking the client. moto links neither node group ⇄ ASG direction, so tests call the reconciler.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError, ParamValidationError

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients, AwsInventory
from rightsizer.adapters.aws_errors import (
    ActionRefusedError,
    AwsPermanentError,
    AwsStalePlan,
    AwsTransientError,
    map_aws_error,
)
from rightsizer.adapters.ec2_resize import Ec2Resizer, preflight_fits
from rightsizer.adapters.eks_nodegroups import EksNodeGroups
from rightsizer.domain.errors import (
    ConfigError,
    PermanentError,
    StalePlan,
    TransientError,
)
from rightsizer.domain.model import GroupSizes
from rightsizer.testing.moto_eks import (
    BuiltCluster,
    NodeGroupReconciler,
    inject_error_once,
    launch_standalone,
    record_calls,
    seed_instance,
)

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = pytest.mark.integration

# The cluster and region the ``gpu_cluster`` fixture builds (tests.support.moto_fixtures).
CLUSTER = "prod-eks"
REGION = "us-east-1"


# ---------------------------------------------------------------------------------------------- helpers


def _instance(clients: AwsClients, instance_id: str) -> dict[str, Any]:
    answer = clients.ec2.describe_instances(InstanceIds=[instance_id])
    return dict(answer["Reservations"][0]["Instances"][0])


def _state(clients: AwsClients, instance_id: str) -> str:
    return str(_instance(clients, instance_id)["State"]["Name"])


def _asg(clients: AwsClients, name: str) -> dict[str, Any]:
    return dict(
        clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    )


def _scaling_config(clients: AwsClients, nodegroup: str) -> dict[str, int]:
    ng = clients.eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=nodegroup)["nodegroup"]
    return dict(ng["scalingConfig"])


def _resizer(clients: AwsClients) -> Ec2Resizer:
    return Ec2Resizer(clients.ec2, clients.autoscaling)


# ------------------------------------------------------------------------ targeted scale-in (BUG-23)


def test_terminate_removes_exactly_the_drained_instance_and_decrements_once(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, reconciler: NodeGroupReconciler
) -> None:
    # GIVEN the BUG-23 group: 3 instances, min 1, desired 3; node b was drained
    group = gpu_cluster.nodegroups["gpu-a10g"]
    node_a, node_b, node_c = group.instance_ids
    asg_calls, eks_calls = record_calls(aws_clients.autoscaling), record_calls(aws_clients.eks)

    # WHEN we remove node b
    result = AutoScalingGroups(aws_clients.autoscaling).terminate(group.asg_name, node_b)
    eks_calls_by_scaler = list(eks_calls.operations)
    reconciler.reconcile()
    reconciler.reconcile()

    # THEN exactly b is gone, desired went 3 -> 2 once, and EKS was never asked to resize
    assert (result.desired_before, result.desired_after, result.already_done) == (3, 2, False)
    assert _state(aws_clients, node_b) in ("shutting-down", "terminated")
    assert _state(aws_clients, node_a) == "running"
    assert _state(aws_clients, node_c) == "running"
    after = _asg(aws_clients, group.asg_name)
    assert after["DesiredCapacity"] == 2
    assert sorted(i["InstanceId"] for i in after["Instances"]) == sorted([node_a, node_c])
    assert asg_calls.count("TerminateInstanceInAutoScalingGroup") == 1
    assert eks_calls_by_scaler == []
    assert _scaling_config(aws_clients, "gpu-a10g") == {"minSize": 1, "desiredSize": 2, "maxSize": 6}


def test_terminate_is_idempotent(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> None:
    group = gpu_cluster.nodegroups["gpu-a10g"]
    victim = group.instance_ids[1]
    scaler = AutoScalingGroups(aws_clients.autoscaling)
    scaler.terminate(group.asg_name, victim)
    calls = record_calls(aws_clients.autoscaling)

    again = scaler.terminate(group.asg_name, victim)

    assert again.already_done
    assert (again.desired_before, again.desired_after) == (2, 2)
    assert calls.count("TerminateInstanceInAutoScalingGroup") == 0
    assert _asg(aws_clients, group.asg_name)["DesiredCapacity"] == 2


def test_terminate_refused_at_min_size(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> None:
    # GIVEN desired == min (moto itself would happily go below MinSize)
    group = gpu_cluster.nodegroups["gpu-a10g"]
    aws_clients.autoscaling.update_auto_scaling_group(AutoScalingGroupName=group.asg_name, MinSize=3)
    calls = record_calls(aws_clients.autoscaling)

    with pytest.raises(ActionRefusedError) as refused:
        AutoScalingGroups(aws_clients.autoscaling).terminate(group.asg_name, group.instance_ids[0])

    assert refused.value.reasons == ("node_group_at_min_size",)
    assert isinstance(refused.value, PermanentError)
    assert calls.count("TerminateInstanceInAutoScalingGroup") == 0
    assert _asg(aws_clients, group.asg_name)["DesiredCapacity"] == 3
    assert all(_state(aws_clients, i) == "running" for i in group.instance_ids)


def test_terminate_of_an_instance_in_another_group_is_stale(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    a10g, l4 = gpu_cluster.nodegroups["gpu-a10g"], gpu_cluster.nodegroups["gpu-l4"]
    calls = record_calls(aws_clients.autoscaling)

    with pytest.raises(StalePlan):
        AutoScalingGroups(aws_clients.autoscaling).terminate(a10g.asg_name, l4.instance_ids[0])

    assert calls.count("TerminateInstanceInAutoScalingGroup") == 0
    assert _state(aws_clients, l4.instance_ids[0]) == "running"


def test_group_sizes_come_from_the_asg(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> None:
    group = gpu_cluster.nodegroups["gpu-a10g"]
    described = AutoScalingGroups(aws_clients.autoscaling).describe_group(group.asg_name)
    assert described.sizes == GroupSizes(1, 3, 6)
    assert described.in_service == described.members == frozenset(group.instance_ids)
    assert described.tags["eks:cluster-name"] == CLUSTER
    with pytest.raises(StalePlan):
        AutoScalingGroups(aws_clients.autoscaling).describe_group("no-such-group")


# --------------------------------------------------------------------------------- node group sizing


def test_update_sizes_sends_all_three_and_the_asg_follows(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, reconciler: NodeGroupReconciler
) -> None:
    sizer = EksNodeGroups(aws_clients.eks, sleep=pytest.fail)

    result = sizer.update_sizes(CLUSTER, "gpu-a10g", GroupSizes(0, 1, 4))
    reconciler.reconcile()

    assert result.changed and not result.already_done
    assert (result.before, result.after) == (GroupSizes(1, 3, 6), GroupSizes(0, 1, 4))
    assert _scaling_config(aws_clients, "gpu-a10g") == {"minSize": 0, "desiredSize": 1, "maxSize": 4}
    asg = _asg(aws_clients, gpu_cluster.nodegroups["gpu-a10g"].asg_name)
    assert (asg["MinSize"], asg["DesiredCapacity"], asg["MaxSize"]) == (0, 1, 4)
    assert len(asg["Instances"]) == 1


def test_update_sizes_with_unchanged_sizes_makes_no_update(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)
    result = EksNodeGroups(aws_clients.eks).update_sizes(CLUSTER, "gpu-a10g", GroupSizes(1, 3, 6))
    assert result.already_done
    assert calls.count("UpdateNodegroupConfig") == 0


@pytest.mark.parametrize(
    "sizes",
    [(1, 7, 6), (3, 2, 6), (-1, 0, 6), (0, 0, -1), (True, 1, 2), (0, 1.5, 2)],
    ids=["desired>max", "min>desired", "negative", "max<0", "bool", "float"],
)
def test_inconsistent_sizes_cannot_be_expressed(sizes: tuple[Any, Any, Any]) -> None:
    # The one GroupSizes of the code base checks 0 <= min <= desired <= max and integers on construction,
    # so no adapter can be handed sizes that AWS (or moto, which accepts anything) would hold wrongly.
    with pytest.raises(ValueError, match="size"):
        GroupSizes(*sizes)


def test_update_sizes_refuses_max_zero_without_calling_aws(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)

    with pytest.raises(ConfigError) as refused:
        EksNodeGroups(aws_clients.eks).update_sizes(CLUSTER, "gpu-a10g", GroupSizes(0, 0, 0))

    assert refused.value.field == "scalingConfig.maxSize"
    assert calls.operations == []
    assert _scaling_config(aws_clients, "gpu-a10g") == {"minSize": 1, "desiredSize": 3, "maxSize": 6}


def test_update_sizes_waits_and_retries_on_resource_in_use(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)
    fired = inject_error_once(aws_clients.eks, "UpdateNodegroupConfig", "ResourceInUseException", status=409)
    sleeps: list[float] = []

    result = EksNodeGroups(aws_clients.eks, sleep=sleeps.append, delay_s=7.0).update_sizes(
        CLUSTER, "gpu-a10g", GroupSizes(1, 2, 6)
    )

    assert fired == [1]
    assert sleeps == [7.0]
    assert result.attempts == 2
    assert calls.count("UpdateNodegroupConfig") == 2
    assert _scaling_config(aws_clients, "gpu-a10g") == {"minSize": 1, "desiredSize": 2, "maxSize": 6}


def test_update_sizes_gives_up_after_bounded_attempts(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    for _ in range(3):
        aws_clients.eks.meta.events.register(
            "before-call.eks.UpdateNodegroupConfig",
            lambda **_: (_busy_response(), {"Error": {"Code": "ResourceInUseException", "Message": "busy"}}),
        )
    sleeps: list[float] = []
    with pytest.raises(TransientError):
        EksNodeGroups(aws_clients.eks, sleep=sleeps.append, max_attempts=3, delay_s=1.0).update_sizes(
            CLUSTER, "gpu-a10g", GroupSizes(1, 2, 6)
        )
    assert sleeps == [1.0, 1.0]


def _busy_response() -> Any:
    from botocore.awsrequest import AWSResponse
    from botocore.compat import HTTPHeaders

    return AWSResponse("https://eks.invalid/", 409, HTTPHeaders(), None)


def test_update_sizes_never_retries_invalid_parameter(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)
    inject_error_once(aws_clients.eks, "UpdateNodegroupConfig", "InvalidParameterException", status=400)
    sleeps: list[float] = []

    with pytest.raises(AwsPermanentError) as failed:
        EksNodeGroups(aws_clients.eks, sleep=sleeps.append).update_sizes(
            CLUSTER, "gpu-a10g", GroupSizes(1, 2, 6)
        )

    assert failed.value.code == "InvalidParameterException"
    assert calls.count("UpdateNodegroupConfig") == 1
    assert sleeps == []


# ---------------------------------------------------------------------- instance type change (BUG-25)


def test_instance_type_change_of_a_managed_node_group_is_refused_with_blue_green_steps(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    calls = record_calls(aws_clients.eks)

    with pytest.raises(ActionRefusedError) as refused:
        EksNodeGroups(aws_clients.eks).refuse_instance_type_change(CLUSTER, "gpu-a10g", "g5.xlarge")

    message = str(refused.value)
    assert refused.value.reasons == ("immutable_instance_type",)
    assert "gpu-a10g-g5-xlarge" in message  # a NEW name, never the old one
    for step in ("ACTIVE", "allocatable nvidia.com/gpu", "drain", "scale gpu-a10g to 0", "only then delete"):
        assert step in message
    assert [op for op in calls.operations if op != "DescribeNodegroup"] == []


def test_update_nodegroup_config_has_no_instance_types_parameter() -> None:
    # BUG-25 attempt 1: botocore refuses locally; the mapping makes it permanent, never a retry.
    error = map_aws_error(ParamValidationError(report='Unknown parameter in input: "instanceTypes"'), "X")
    assert isinstance(error, PermanentError)


def test_preflight_fits_refuses_pods_bigger_than_the_target() -> None:
    with pytest.raises(ActionRefusedError) as refused:
        preflight_fits({"ml/llm-0": 4, "ml/small": 1}, target_gpu_count=1)
    assert refused.value.reasons == ("pod_does_not_fit",)
    assert "ml/llm-0" in str(refused.value)
    assert "ml/small" not in str(refused.value)
    preflight_fits({"ml/small": 1}, target_gpu_count=1)


# ------------------------------------------------------------------------- EC2 resize (BUG-26/27)


@pytest.fixture
def standalone(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> str:
    """A running standalone g5.4xlarge (it has an NVMe instance store, like BUG-26's cache)."""
    return launch_standalone(aws_clients, "g5.4xlarge", gpu_cluster.subnet_ids[0], region=REGION)


def test_step_calls_change_only_the_type_and_repeat_safely(aws_clients: AwsClients, standalone: str) -> None:
    """The resize workflow's EC2 steps (``services.resize`` waits between them): each is idempotent."""
    resizer = _resizer(aws_clients)
    resizer.stop(standalone)
    assert resizer.describe(standalone).state == "stopped"
    resizer.set_type(standalone, "g5.2xlarge")
    resizer.start(standalone)
    facts = resizer.describe(standalone)
    assert (facts.state, facts.instance_type, facts.tags["rightsizer.io/resize"]) == (
        "running",
        "g5.2xlarge",
        "allowed",
    )
    calls = record_calls(aws_clients.ec2)
    resizer.start(standalone)  # running: no call
    resizer.stop(standalone)
    resizer.stop(standalone)  # stopping/stopped: no second call
    resizer.set_type(standalone, "g5.2xlarge")  # already that type: no call
    assert calls.count("StopInstances") == 1
    assert calls.count("StartInstances") == 0 and calls.count("ModifyInstanceAttribute") == 0


def _assert_untouched(
    clients: AwsClients, instance_id: str, calls: Any, original: str = "g5.4xlarge"
) -> None:
    after = _instance(clients, instance_id)
    assert (after["InstanceType"], after["State"]["Name"]) == (original, "running")
    assert not {"StopInstances", "ModifyInstanceAttribute", "StartInstances"} & set(calls.operations)


def test_resize_requires_opt_in_for_instance_store_data_loss(
    aws_clients: AwsClients, standalone: str
) -> None:
    calls = record_calls(aws_clients.ec2)
    with pytest.raises(ActionRefusedError) as refused:
        _resizer(aws_clients).preflight(standalone, "g5.2xlarge", allow_instance_store_loss=False)
    assert refused.value.reasons == ("instance_store_data_loss",)
    assert "resize_allow_instance_store_loss" in str(refused.value)
    _assert_untouched(aws_clients, standalone, calls)


def test_resize_refuses_an_instance_in_an_auto_scaling_group(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    member = gpu_cluster.nodegroups["gpu-a10g"].instance_ids[0]
    calls = record_calls(aws_clients.ec2)
    with pytest.raises(ActionRefusedError) as refused:
        _resizer(aws_clients).preflight(member, "g5.xlarge", allow_instance_store_loss=True)
    assert "in_auto_scaling_group" in refused.value.reasons
    _assert_untouched(aws_clients, member, calls, original="g5.2xlarge")


def test_resize_refuses_an_instance_store_root(aws_clients: AwsClients, standalone: str) -> None:
    seed_instance(standalone, region=REGION, root_device_type="instance-store")
    calls = record_calls(aws_clients.ec2)
    with pytest.raises(ActionRefusedError) as refused:
        _resizer(aws_clients).preflight(standalone, "g5.2xlarge", allow_instance_store_loss=True)
    assert refused.value.reasons == ("instance_store_root",)
    _assert_untouched(aws_clients, standalone, calls)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("g5g.2xlarge", "architecture_mismatch"),  # Graviton (arm64) with an x86_64 AMI
        ("m5.large", "target_has_no_gpus"),
    ],
)
def test_resize_refuses_incompatible_pairs_before_stopping(
    aws_clients: AwsClients, standalone: str, target: str, reason: str
) -> None:
    calls = record_calls(aws_clients.ec2)
    with pytest.raises(ActionRefusedError) as refused:
        _resizer(aws_clients).preflight(standalone, target, allow_instance_store_loss=True)
    assert reason in refused.value.reasons
    _assert_untouched(aws_clients, standalone, calls)


def test_resize_refuses_when_ena_is_not_enabled(aws_clients: AwsClients, standalone: str) -> None:
    seed_instance(standalone, region=REGION, ena_support=False)
    with pytest.raises(ActionRefusedError) as refused:
        _resizer(aws_clients).preflight(standalone, "g5.2xlarge", allow_instance_store_loss=True)
    assert refused.value.reasons == ("ena_incompatible",)


# Insufficient capacity on start and refused modifications restore the original type in the resize
# workflow: tests/integration/test_resize_moto.py and test_resize_statemachine.py.


def test_resize_of_a_missing_instance_is_stale(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> None:
    with pytest.raises(StalePlan):
        _resizer(aws_clients).describe("i-00000000000000dead")


# --------------------------------------------------------------------------------------------- inventory


def test_inventory_matches_the_snapshot_contract(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, standalone: str
) -> None:
    members = [i for ng in gpu_cluster.nodegroups.values() for i in ng.instance_ids]
    inventory = AwsInventory(aws_clients)

    doc = inventory.describe([*members, standalone], CLUSTER)

    assert set(doc) == {
        "nodegroups",
        "autoScalingGroups",
        "autoScalingInstances",
        "launchActivities",
        "capacityFailures",
    }
    assert doc["capacityFailures"] == {}  # no launch failed for InsufficientInstanceCapacity
    assert sorted(ng["nodegroupName"] for ng in doc["nodegroups"]) == ["gpu-a10g", "gpu-l4"]
    assert {g["AutoScalingGroupName"] for g in doc["autoScalingGroups"]} == {
        ng.asg_name for ng in gpu_cluster.nodegroups.values()
    }
    a10g = next(ng for ng in doc["nodegroups"] if ng["nodegroupName"] == "gpu-a10g")
    assert a10g["resources"]["autoScalingGroups"][0]["name"] == gpu_cluster.nodegroups["gpu-a10g"].asg_name
    assert a10g["scalingConfig"] == {"minSize": 1, "maxSize": 6, "desiredSize": 3}
    assert a10g["createdAt"].endswith("Z")
    # the standalone instance is absent from a known answer: that is what makes it standalone
    assert sorted(i["InstanceId"] for i in doc["autoScalingInstances"]) == sorted(members)
    assert isinstance(doc["launchActivities"], dict)
    assert json.loads(json.dumps(doc)) == doc

    instances = inventory.describe_instances([standalone, "i-00000000000000dead"])
    assert set(instances) == {"Reservations", "SpotPriceHistory", "InstanceStatuses", "CapacityReservations"}
    assert instances["SpotPriceHistory"] == []  # no spot instance: no DescribeSpotPriceHistory call
    assert [s["InstanceId"] for s in instances["InstanceStatuses"]] == [standalone]
    assert instances["CapacityReservations"] == []  # none runs in a reservation: none described
    found = [i["InstanceId"] for r in instances["Reservations"] for i in r["Instances"]]
    assert found == [standalone]
    assert json.loads(json.dumps(instances)) == instances


def test_inventory_batches_instance_ids_by_50(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> None:
    members = list(gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    unknown = [f"i-{n:017x}" for n in range(60)]
    calls = record_calls(aws_clients.autoscaling)

    doc = AwsInventory(aws_clients).describe(members + unknown, CLUSTER)

    assert calls.count("DescribeAutoScalingInstances") == 2
    assert sorted(i["InstanceId"] for i in doc["autoScalingInstances"]) == sorted(members)


# ------------------------------------------------------------------------------ reconciler, error map


def test_background_reconciler_mirrors_the_asg_back_to_the_node_group(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    import time

    group = gpu_cluster.nodegroups["gpu-a10g"]
    with NodeGroupReconciler(aws_clients, CLUSTER, region=REGION) as mirror:
        mirror.reconcile()
        mirror.start(interval_s=0.05)
        AutoScalingGroups(aws_clients.autoscaling).terminate(group.asg_name, group.instance_ids[0])
        deadline = time.monotonic() + 5
        while _scaling_config(aws_clients, "gpu-a10g")["desiredSize"] != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert mirror.errors == []
    assert _scaling_config(aws_clients, "gpu-a10g")["desiredSize"] == 2


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op"
    )


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("Throttling", 400, AwsTransientError),
        ("RequestLimitExceeded", 503, AwsTransientError),
        ("ResourceInUseException", 409, AwsTransientError),
        ("InsufficientInstanceCapacity", 500, AwsTransientError),
        ("SomethingNew", 503, AwsTransientError),
        ("InvalidParameterException", 400, AwsPermanentError),
        ("ValidationError", 400, AwsPermanentError),
        ("AccessDeniedException", 403, AwsPermanentError),
        ("UnauthorizedOperation", 403, AwsPermanentError),
        ("SomethingNew", 400, AwsPermanentError),
        ("ResourceNotFoundException", 404, AwsStalePlan),
        ("InvalidInstanceID.NotFound", 400, AwsStalePlan),
    ],
)
def test_errors_are_mapped_by_code(code: str, status: int, kind: type[Exception]) -> None:
    error = map_aws_error(_client_error(code, status), "Op")
    assert type(error) is kind
    assert getattr(error, "code", None) == code
