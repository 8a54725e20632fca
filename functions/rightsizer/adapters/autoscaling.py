"""Auto Scaling: the ``NodeScaler`` port (docs/architecture.md §4 "Remove", "Off-hours").

One adapter for the whole Auto Scaling capability: group membership, fresh sizes and tags, the targeted
scale-in — ``TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True)`` for exactly the
drained instance after checking DesiredCapacity − 1 ≥ MinSize, and never an ``UpdateNodegroupConfig``
after it (EKS mirrors the ASG's new DesiredCapacity; a second change would shrink the group twice —
BUG-23) — and the failed scaling activities of an off-hours restore with their error codes (BUG-27).
Managed node groups are Auto Scaling groups underneath, so this covers them too.

Every SDK error leaves as the taxonomy of :mod:`rightsizer.domain.errors` through
:func:`rightsizer.adapters.aws_errors.aws_errors` (by AWS error ``Code``).

IAM actions (:data:`IAM_ACTIONS`): ``autoscaling:DescribeAutoScalingInstances``,
``autoscaling:DescribeAutoScalingGroups``, ``autoscaling:DescribeScalingActivities`` and
``autoscaling:TerminateInstanceInAutoScalingGroup`` — the last on groups tagged
``rightsizer.io/enabled=true`` and ``eks:cluster-name=<cluster>`` only (the template's condition).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from rightsizer.adapters.aws_errors import ActionRefusedError, aws_errors
from rightsizer.domain.errors import StalePlan, TransientError
from rightsizer.domain.model import GroupSizes, opt_in_refusal
from rightsizer.ports import ScalingFailure, ScalingGroup, TerminateResult

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient

__all__ = ["AutoScalingGroups", "error_code_of"]

#: The AWS actions this module calls (IAM ``service:Action``); ``tests/integration/test_iam.py`` checks it.
IAM_ACTIONS: Final = frozenset(
    {
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeScalingActivities",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    }
)

_DONE_STATES: Final = ("Terminating", "Terminated")
_NOT_YET_STATES: Final = ("Pending", "EnteringStandby")

#: DescribeScalingActivities page size (the API maximum is 100).
_ACTIVITY_PAGE: Final = 50

# Codes EC2 / Auto Scaling put into a failed launch's status message. Checked before the generic pattern
# because some messages carry them mid-sentence ("... Instances. InsufficientInstanceCapacity - ...").
_KNOWN_CODES: Final = (
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientFreeAddressesInSubnet",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "InvalidParameterValue",
    "InvalidParameterCombination",
    "Unsupported",
    "UnauthorizedOperation",
    "InvalidBlockDeviceMapping",
    "InvalidLaunchTemplateId.NotFound",
    "InvalidAMIID.NotFound",
)
# A CamelCase token followed by " - " or ":" is how Auto Scaling quotes an EC2 error code.
_GENERIC_CODE = re.compile(r"\b([A-Z][a-z]+(?:[A-Z][a-z]*)+(?:\.[A-Za-z]+)?)(?: - |:)")
# The plain-English form EC2 uses when no code is quoted (BUG-27's StartInstances message).
_CAPACITY_PHRASE = re.compile(r"do not have sufficient .* capacity", re.IGNORECASE)


def error_code_of(*texts: str) -> str | None:
    """The AWS error code quoted in a scaling activity's ``StatusMessage`` / ``Description``, if any.

    Args:
        texts: the activity's status message and description (either may be empty).

    Returns:
        e.g. ``"InsufficientInstanceCapacity"`` for "Could not launch On-Demand Instances.
        InsufficientInstanceCapacity - capacity not available ..." or for "We currently do not have
        sufficient p4d.24xlarge capacity ..."; None when no code can be told.
    """
    joined = " ".join(t for t in texts if t)
    for code in _KNOWN_CODES:
        if re.search(rf"\b{re.escape(code)}\b", joined):
            return code
    match = _GENERIC_CODE.search(joined)
    if match:
        return match.group(1)
    if _CAPACITY_PHRASE.search(joined):
        return "InsufficientInstanceCapacity"
    return None


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).astimezone(UTC)


class AutoScalingGroups:
    """``NodeScaler`` (``rightsizer.ports``) over EC2 Auto Scaling, managed node groups included.

    Args:
        autoscaling: an Auto Scaling client (standard retries), built by the wiring.
        activity_pages: at most this many pages of ``DescribeScalingActivities`` (50 each) per
            :meth:`failed_activities` call.
    """

    def __init__(self, autoscaling: AutoScalingClient, *, activity_pages: int = 2) -> None:
        self._asg = autoscaling
        self._activity_pages = activity_pages

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

    def describe_group(self, asg_name: str) -> ScalingGroup:
        """MinSize, DesiredCapacity, MaxSize, members and tags of ``asg_name``, read fresh
        (DescribeAutoScalingGroups). Sizes are instance counts.

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
        instances = group.get("Instances", [])
        return ScalingGroup(
            name=asg_name,
            sizes=GroupSizes(int(group["MinSize"]), int(group["DesiredCapacity"]), int(group["MaxSize"])),
            in_service=frozenset(
                str(i["InstanceId"]) for i in instances if i.get("LifecycleState") == "InService"
            ),
            members=frozenset(str(i["InstanceId"]) for i in instances),
            tags={str(t["Key"]): str(t.get("Value", "")) for t in group.get("Tags", []) if "Key" in t},
        )

    def opt_in_refusal(self, asg_name: str, cluster: str) -> str | None:
        """Why ``asg_name`` may not be scaled in, or None (its tags, DescribeAutoScalingGroups, through
        :func:`rightsizer.domain.model.opt_in_refusal`). Checked before a cordon: the drain role's
        Terminate grant carries the same tag conditions, so an un-tagged group would otherwise be drained
        and then denied.

        Raises:
            StalePlan: the group does not exist (any more).
            TransientError / PermanentError: as mapped from the AWS error code.
        """
        return opt_in_refusal(dict(self.describe_group(asg_name).tags), cluster, asg=True)

    def terminate(self, asg_name: str, instance_id: str) -> TerminateResult:
        """Terminate exactly ``instance_id`` and decrement DesiredCapacity by one, idempotently.

        Re-reads the instance (DescribeAutoScalingInstances) and the group (DescribeAutoScalingGroups),
        checks DesiredCapacity − 1 ≥ MinSize, then calls TerminateInstanceInAutoScalingGroup with
        ``ShouldDecrementDesiredCapacity=True``. Never follow it with UpdateNodegroupConfig: EKS already
        mirrors the new DesiredCapacity, a second change would shrink the group twice.

        Returns:
            ``already_done=True`` without a call when the instance is already Terminating/Terminated,
            gone, or no longer in any group.

        Raises:
            ActionRefusedError (a ``PermanentError``): reason ``node_group_at_min_size``; nothing was called.
            StalePlan: the instance is in a different group, or in a state we do not remove from
                (Standby, Detaching...), or the group is gone.
            TransientError: the instance is still Pending; AWS throttling/5xx.
            PermanentError: AWS refused the call (validation, access denied).
        """
        with aws_errors("DescribeAutoScalingInstances"):
            found = self._asg.describe_auto_scaling_instances(InstanceIds=[instance_id])
        members = found.get("AutoScalingInstances", [])
        if not members:
            return self._already_done(asg_name, instance_id)
        member = members[0]
        if member.get("AutoScalingGroupName") != asg_name:
            raise StalePlan(
                f"{instance_id} belongs to Auto Scaling group {member.get('AutoScalingGroupName')!r}, "
                f"not {asg_name!r}"
            )
        state = str(member.get("LifecycleState", ""))
        if state.startswith(_DONE_STATES):
            return self._already_done(asg_name, instance_id)
        if state.startswith(_NOT_YET_STATES):
            raise TransientError(f"{instance_id} is {state}, not InService yet", retry_after=30.0)
        if state != "InService":
            raise StalePlan(f"{instance_id} is {state} in {asg_name}, not InService")

        group = self.describe_group(asg_name)
        if instance_id not in group.members:
            return self._already_done(asg_name, instance_id, group)
        sizes = group.sizes
        # Checked here because the API's own refusal arrives only after the drain, and moto never refuses.
        if sizes.desired - 1 < sizes.min:
            raise ActionRefusedError(
                f"removing {instance_id} would take {asg_name} below MinSize: DesiredCapacity "
                f"{sizes.desired} - 1 < MinSize {sizes.min}; lower MinSize first or skip this node",
                reasons=["node_group_at_min_size"],
            )
        with aws_errors("TerminateInstanceInAutoScalingGroup"):
            response = self._asg.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
            )
        after = self.describe_group(asg_name).sizes
        return TerminateResult(
            asg_name=asg_name,
            instance_id=instance_id,
            desired_before=sizes.desired,
            desired_after=after.desired,
            already_done=False,
            activity_id=response.get("Activity", {}).get("ActivityId"),
        )

    def failed_activities(self, asg_name: str, since: datetime) -> list[ScalingFailure]:
        """Failed activities of ``asg_name`` started at or after ``since`` (aware), newest first.

        Reads ``DescribeScalingActivities`` (newest first) page by page and stops at the first activity
        older than ``since`` or after ``activity_pages`` pages. The error code comes from
        :func:`error_code_of` on ``StatusMessage`` and ``Description``.
        """
        since = since.astimezone(UTC)
        failures: list[ScalingFailure] = []
        token: str | None = None
        for _ in range(self._activity_pages):
            with aws_errors("DescribeScalingActivities"):
                if token:
                    page = self._asg.describe_scaling_activities(
                        AutoScalingGroupName=asg_name, MaxRecords=_ACTIVITY_PAGE, NextToken=token
                    )
                else:
                    page = self._asg.describe_scaling_activities(
                        AutoScalingGroupName=asg_name, MaxRecords=_ACTIVITY_PAGE
                    )
            for activity in page.get("Activities", []):
                started = _aware(activity.get("StartTime"))
                if started is not None and started < since:
                    return failures
                if activity.get("StatusCode") != "Failed":
                    continue
                message = str(activity.get("StatusMessage") or "")
                failures.append(
                    ScalingFailure(
                        activity_id=str(activity.get("ActivityId", "")),
                        started_at=started,
                        status=str(activity.get("StatusCode")),
                        code=error_code_of(message, str(activity.get("Description") or "")),
                        message=message,
                    )
                )
            token = page.get("NextToken")
            if not token:
                break
        return failures

    def _already_done(
        self, asg_name: str, instance_id: str, group: ScalingGroup | None = None
    ) -> TerminateResult:
        try:
            desired = (group or self.describe_group(asg_name)).sizes.desired
        except StalePlan:
            desired = 0  # the whole group is gone: nothing left to remove
        return TerminateResult(asg_name, instance_id, desired, desired, already_done=True)
