"""Standalone EC2 resize: the EC2 calls of an opted-in, EBS-backed GPU instance's type change
(docs/architecture.md §4 "Resize"), one call per workflow step; the waits happen in the state machine.

IAM: ``ec2:DescribeInstances``, ``ec2:DescribeInstanceTypes``, ``autoscaling:DescribeAutoScalingInstances``
(preflight); ``ec2:StopInstances``, ``ec2:StartInstances``, ``ec2:ModifyInstanceAttribute`` (scope them with
a condition on the tag ``rightsizer.io/resize=allowed``), declared in :data:`IAM_ACTIONS`. SDK errors leave
as the taxonomy of :mod:`rightsizer.adapters.aws_errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from rightsizer.adapters.aws import unique
from rightsizer.adapters.aws_errors import ActionRefusedError, aws_errors
from rightsizer.domain.errors import StalePlan
from rightsizer.ports import InstanceFacts

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType

__all__ = ["Ec2Resizer", "preflight_fits"]

#: The AWS actions this module calls (IAM ``service:Action``); ``tests/integration/test_iam_resize.py`` checks it.
IAM_ACTIONS: Final = frozenset(
    {
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
        "autoscaling:DescribeAutoScalingInstances",
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:ModifyInstanceAttribute",
    }
)


def preflight_fits(pods_gpu_requests: Mapping[str, int], target_gpu_count: int) -> None:
    """Refuse a smaller shape when any pod requests more GPUs than the target type has.

    Args:
        pods_gpu_requests: pod (``namespace/name``) → GPUs it requests (``nvidia.com/gpu``, summed over
            its containers, init containers by max).
        target_gpu_count: physical GPUs of the target instance type (DescribeInstanceTypes GpuInfo).

    Raises:
        ActionRefusedError: ``pod_does_not_fit``, naming every pod that cannot fit.
    """
    too_big = sorted(pod for pod, gpus in pods_gpu_requests.items() if gpus > target_gpu_count)
    if too_big:
        detail = ", ".join(f"{pod} requests {pods_gpu_requests[pod]}" for pod in too_big)
        raise ActionRefusedError(
            f"target type has {target_gpu_count} GPU(s): {detail}", reasons=["pod_does_not_fit"]
        )


class Ec2Resizer:
    """The EC2 calls of a standalone (non-ASG) EBS-backed GPU instance's type change (BUG-26, BUG-27):
    ``rightsizer.ports.InstanceTypeChanger``. None of them waits: the resize workflow
    (``rightsizer.services.resize``) waits between them in the state machine, never in Lambda."""

    def __init__(self, ec2: EC2Client, autoscaling: AutoScalingClient) -> None:
        """Args: the EC2 and Auto Scaling clients."""
        self._ec2 = ec2
        self._asg = autoscaling

    # Step-sized calls (``rightsizer.ports.InstanceTypeChanger``): the resize workflow waits between them
    # in the state machine, never in Lambda.

    def describe(self, instance_id: str) -> InstanceFacts:
        """State, type, tags and lifecycle of the instance (DescribeInstances); StalePlan when gone."""
        instance = self._describe(instance_id)
        return InstanceFacts(
            state=str(instance["State"]["Name"]),
            instance_type=str(instance["InstanceType"]),
            tags={str(t["Key"]): str(t.get("Value", "")) for t in instance.get("Tags", [])},
            lifecycle=str(instance.get("InstanceLifecycle", "")),
        )

    def preflight(self, instance_id: str, target_type: str, *, allow_instance_store_loss: bool) -> None:
        """The compatibility checks of :meth:`resize`, alone; raises ``ActionRefusedError``."""
        self._preflight(self._describe(instance_id), target_type, allow_instance_store_loss)

    def stop(self, instance_id: str) -> None:
        """StopInstances, unless the instance is already stopping or stopped."""
        if self.describe(instance_id).state in ("stopping", "stopped"):
            return
        with aws_errors("StopInstances"):
            self._ec2.stop_instances(InstanceIds=[instance_id])

    def set_type(self, instance_id: str, instance_type: str) -> None:
        """ModifyInstanceAttribute ``InstanceType`` of the stopped instance (no call when already that type)."""
        if self.describe(instance_id).instance_type == instance_type:
            return
        with aws_errors("ModifyInstanceAttribute"):
            self._ec2.modify_instance_attribute(InstanceId=instance_id, InstanceType={"Value": instance_type})

    def start(self, instance_id: str) -> None:
        """StartInstances (a running or pending instance is left as it is)."""
        if self.describe(instance_id).state in ("pending", "running"):
            return
        with aws_errors("StartInstances"):
            self._ec2.start_instances(InstanceIds=[instance_id])

    def _preflight(
        self, instance: Mapping[str, Any], target_type: str, allow_instance_store_loss: bool
    ) -> None:
        instance_id = str(instance["InstanceId"])
        current_type = str(instance["InstanceType"])
        reasons: list[str] = []
        details: list[str] = []

        def refuse(code: str, why: str) -> None:
            reasons.append(code)
            details.append(why)

        with aws_errors("DescribeAutoScalingInstances"):
            members = self._asg.describe_auto_scaling_instances(InstanceIds=[instance_id])
        for member in members.get("AutoScalingInstances", []):
            refuse(
                "in_auto_scaling_group",
                f"it belongs to Auto Scaling group {member.get('AutoScalingGroupName')} which would replace "
                "it; change the node group instead (new node group or launch template version)",
            )
        if instance.get("RootDeviceType") != "ebs":
            refuse(
                "instance_store_root",
                f"root device is {instance.get('RootDeviceType')}; it cannot be stopped",
            )
        if instance.get("InstanceLifecycle") == "spot":
            refuse("spot_instance", "spot instances cannot be stopped and modified safely")

        with aws_errors("DescribeInstanceTypes"):
            answer = self._ec2.describe_instance_types(
                InstanceTypes=cast("list[InstanceTypeType]", unique([current_type, target_type]))
            )
        types: dict[str, Mapping[str, Any]] = {
            str(t["InstanceType"]): t for t in answer.get("InstanceTypes", [])
        }
        cur, tgt = types.get(current_type), types.get(target_type)
        if cur is None or tgt is None:
            raise ActionRefusedError(
                f"unknown instance type {current_type if cur is None else target_type}",
                reasons=["unknown_instance_type"],
            )

        if cur.get("InstanceStorageSupported") and not allow_instance_store_loss:
            refuse(
                "instance_store_data_loss",
                f"{current_type} has instance-store volumes whose data is lost on stop; "
                "set resize_allow_instance_store_loss: true to accept",
            )
        arch = instance.get("Architecture")
        supported = tgt.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
        if arch not in supported:
            refuse("architecture_mismatch", f"the AMI is {arch}, {target_type} supports {supported}")
        tgt_gpus = tgt.get("GpuInfo", {}).get("Gpus", [])
        if not tgt_gpus:
            refuse("target_has_no_gpus", f"{target_type} has no GPUs")
        cur_vendors = {g.get("Manufacturer") for g in cur.get("GpuInfo", {}).get("Gpus", [])}
        tgt_vendors = {g.get("Manufacturer") for g in tgt_gpus}
        if cur_vendors and tgt_gpus and cur_vendors != tgt_vendors:
            refuse(
                "gpu_vendor_mismatch",
                f"GPU driver family changes: {sorted(cur_vendors)} -> {sorted(tgt_vendors)}",
            )
        ena_target = tgt.get("NetworkInfo", {}).get("EnaSupport")
        ena_instance = instance.get("EnaSupport")
        if ena_target == "required" and ena_instance is not True:
            refuse(
                "ena_incompatible", f"{target_type} requires ENA and the instance does not have it enabled"
            )
        if ena_target == "unsupported" and ena_instance is True:
            refuse("ena_incompatible", f"{target_type} does not support ENA")
        nvme_cur = cur.get("EbsInfo", {}).get("NvmeSupport")
        nvme_tgt = tgt.get("EbsInfo", {}).get("NvmeSupport")
        if nvme_tgt == "required" and nvme_cur == "unsupported":
            refuse("nvme_incompatible", f"{target_type} exposes EBS as NVMe; the AMI may lack the driver")
        has_efa = any(nic.get("InterfaceType") == "efa" for nic in instance.get("NetworkInterfaces", []))
        if has_efa and not tgt.get("NetworkInfo", {}).get("EfaSupported"):
            refuse("efa_unsupported", f"the instance has an EFA interface and {target_type} has no EFA")
        if reasons:
            raise ActionRefusedError(
                f"refusing to resize {instance_id} {current_type} -> {target_type}: " + "; ".join(details),
                reasons=reasons,
            )

    def _describe(self, instance_id: str) -> Mapping[str, Any]:
        with aws_errors("DescribeInstances"):
            answer = self._ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [instance_id]}])
        for reservation in answer.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return instance
        raise StalePlan(f"instance {instance_id} not found")
