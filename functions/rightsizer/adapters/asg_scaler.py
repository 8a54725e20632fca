"""``NodeScaler`` over Auto Scaling: group membership, fresh sizes and targeted scale-in (docs/architecture.md §4 "Remove").

A thin port implementation over :class:`rightsizer.adapters.aws.AsgScaler`, which owns the scale-in
itself: ``TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True)`` for exactly the
drained instance after checking DesiredCapacity − 1 ≥ MinSize, and never an ``UpdateNodegroupConfig``
after it (EKS mirrors the ASG's new DesiredCapacity; a second change would shrink the group twice —
BUG-23). Managed node groups are Auto Scaling groups underneath, so this covers them too.

Every SDK error leaves as the taxonomy of :mod:`rightsizer.domain.errors` through
:func:`rightsizer.adapters.aws.map_aws_error` (by AWS error ``Code``).

IAM actions needed:

- ``autoscaling:DescribeAutoScalingInstances`` — :meth:`AsgNodeScaler.find_group` and the re-check
  before a terminate;
- ``autoscaling:DescribeAutoScalingGroups`` — :meth:`AsgNodeScaler.group_sizes` and
  :meth:`AsgNodeScaler.opt_in_refusal`;
- ``autoscaling:TerminateInstanceInAutoScalingGroup`` — :meth:`AsgNodeScaler.terminate`, on groups tagged
  ``rightsizer.io/enabled=true`` and ``eks:cluster-name=<cluster>`` only (the template's condition).

RBAC verbs: none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from rightsizer.adapters.aws import AsgScaler
from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.domain.errors import StalePlan
from rightsizer.domain.model import opt_in_refusal

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient

__all__ = ["AsgNodeScaler"]

#: The AWS actions this module calls itself (the scale-in is :class:`rightsizer.adapters.aws.AsgScaler`'s).
IAM_ACTIONS: Final = frozenset(
    {"autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeAutoScalingGroups"}
)


class AsgNodeScaler:
    """``NodeScaler`` (ports) for EC2 Auto Scaling groups, managed node groups included."""

    def __init__(self, autoscaling: AutoScalingClient) -> None:
        """Args: autoscaling: an Auto Scaling client (standard retries), built by the wiring."""
        self._asg = autoscaling
        self._scaler = AsgScaler(autoscaling)

    def find_group(self, instance_id: str) -> str | None:
        """The Auto Scaling group of ``instance_id`` (DescribeAutoScalingInstances), or None when the
        instance is standalone or unknown. An instance that is already Terminating still names its group.

        Raises:
            TransientError: throttling, 5xx, connection failures.
            PermanentError: access denied, malformed instance id.
        """
        with aws_errors("DescribeAutoScalingInstances"):
            found = self._asg.describe_auto_scaling_instances(InstanceIds=[instance_id])
        for member in found.get("AutoScalingInstances", []):
            if member.get("InstanceId") == instance_id:
                return str(member["AutoScalingGroupName"])
        return None

    def group_sizes(self, asg_name: str) -> tuple[int, int, int, frozenset[str]]:
        """(MinSize, DesiredCapacity, MaxSize, ids of the InService instances) of ``asg_name``, read fresh
        (DescribeAutoScalingGroups). Sizes are instance counts; Pending, Terminating, Standby… members are
        not in the set.

        Raises:
            StalePlan: the group does not exist (any more).
            TransientError / PermanentError: as mapped from the AWS error code.
        """
        with aws_errors("DescribeAutoScalingGroups"):
            answer = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])
        groups = answer.get("AutoScalingGroups", [])
        if not groups:
            raise StalePlan(f"Auto Scaling group {asg_name!r} not found")
        group = groups[0]
        in_service = frozenset(
            str(i["InstanceId"]) for i in group.get("Instances", []) if i.get("LifecycleState") == "InService"
        )
        return int(group["MinSize"]), int(group["DesiredCapacity"]), int(group["MaxSize"]), in_service

    def opt_in_refusal(self, asg_name: str, cluster: str) -> str | None:
        """Why ``asg_name`` may not be scaled in, or None (its tags, DescribeAutoScalingGroups, through
        :func:`rightsizer.domain.model.opt_in_refusal`). Checked before a cordon: the drain role's
        Terminate grant carries the same tag conditions, so an un-tagged group would otherwise be drained
        and then denied.

        Raises:
            StalePlan: the group does not exist (any more).
            TransientError / PermanentError: as mapped from the AWS error code.
        """
        with aws_errors("DescribeAutoScalingGroups"):
            answer = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])
        groups = answer.get("AutoScalingGroups", [])
        if not groups:
            raise StalePlan(f"Auto Scaling group {asg_name!r} not found")
        tags = {str(t["Key"]): str(t.get("Value", "")) for t in groups[0].get("Tags", []) if "Key" in t}
        return opt_in_refusal(tags, cluster, asg=True)

    def terminate(self, asg_name: str, instance_id: str) -> tuple[int, int, bool]:
        """Remove exactly ``instance_id`` from ``asg_name`` and decrement DesiredCapacity by one.

        DescribeAutoScalingInstances and DescribeAutoScalingGroups re-read the member and the sizes, then
        TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True) — only when
        DesiredCapacity − 1 ≥ MinSize. Idempotent: an instance already Terminating/Terminated, or no
        longer in any group, makes no call.

        Returns:
            (DesiredCapacity before, DesiredCapacity after, already done).

        Raises:
            ActionRefusedError (a ``PermanentError``): reason ``node_group_at_min_size``; nothing was called.
            StalePlan: the instance is in another group, or in a state we do not remove from (Standby,
                Detaching…), or the group is gone.
            TransientError: the instance is still Pending; throttling, 5xx.
            PermanentError: AWS refused (validation, access denied).
        """
        result = self._scaler.terminate_instance(asg_name, instance_id)
        return result.desired_before, result.desired_after, result.already_done
