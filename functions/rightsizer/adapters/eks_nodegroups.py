"""Managed node groups for off-hours: the ``NodeGroupSizer`` and ``NodeScaler`` ports on EKS + Auto Scaling.

:class:`EksNodeGroups` wraps the sizing and scale-in code of :mod:`rightsizer.adapters.aws`
(:class:`~rightsizer.adapters.aws.EksNodeGroupSizer`, :class:`~rightsizer.adapters.aws.AsgScaler`) and adds
what off-hours needs besides: listing and describing node groups (tags select groups, health issues explain
a slow restore) and the failed scaling activities of a restore with their error codes (BUG-27).

IAM actions: ``eks:ListNodegroups``, ``eks:DescribeNodegroup``, ``eks:UpdateNodegroupConfig``,
``autoscaling:DescribeAutoScalingGroups``, ``autoscaling:DescribeAutoScalingInstances``,
``autoscaling:DescribeScalingActivities``, ``autoscaling:TerminateInstanceInAutoScalingGroup``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from rightsizer.adapters.asg_scaler import AsgNodeScaler
from rightsizer.adapters.aws import AwsClients, EksNodeGroupSizer
from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.ports import NodeGroupInfo, ScalingFailure

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient

__all__ = ["EksNodeGroups", "error_code_of"]

#: The AWS actions this module calls itself (sizing is :class:`rightsizer.adapters.aws.EksNodeGroupSizer`'s).
IAM_ACTIONS: Final = frozenset(
    {"eks:ListNodegroups", "eks:DescribeNodegroup", "autoscaling:DescribeScalingActivities"}
)

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

#: DescribeScalingActivities page size (the API maximum is 100).
_ACTIVITY_PAGE: Final = 50


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


class EksNodeGroups(AsgNodeScaler):
    """Off-hours node group access: implements ``NodeGroupSizer`` and, inherited from ``AsgNodeScaler``,
    ``NodeScaler`` (``rightsizer.ports``).

    Args:
        clients: EKS and Auto Scaling clients (``make_clients``); EC2 is not used.
        sleep: how to wait between sizing attempts, in seconds (tests pass a no-op).
        max_attempts: ``UpdateNodegroupConfig`` attempts while the group is busy (UPDATING,
            ``ResourceInUseException``).
        delay_s: seconds between those attempts.
        activity_pages: at most this many pages of ``DescribeScalingActivities`` per call (50 each).
    """

    def __init__(
        self,
        clients: AwsClients,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = 10,
        delay_s: float = 15.0,
        activity_pages: int = 2,
    ) -> None:
        super().__init__(clients.autoscaling)
        self._eks = clients.eks
        self._autoscaling: AutoScalingClient = clients.autoscaling
        self._sizer = EksNodeGroupSizer(clients.eks, sleep=sleep, max_attempts=max_attempts, delay_s=delay_s)
        self._activity_pages = activity_pages

    # ------------------------------------------------------------------------------ NodeGroupSizer

    def list_nodegroups(self, cluster: str) -> list[str]:
        """Managed node group names of ``cluster``, sorted (EKS ``ListNodegroups``, every page)."""
        names: list[str] = []
        token: str | None = None
        while True:
            with aws_errors("ListNodegroups"):
                page = (
                    self._eks.list_nodegroups(clusterName=cluster, nextToken=token)
                    if token
                    else self._eks.list_nodegroups(clusterName=cluster)
                )
            names.extend(str(n) for n in page.get("nodegroups", []))
            token = page.get("nextToken")
            if not token:
                return sorted(names)

    def describe(self, cluster: str, nodegroup: str) -> NodeGroupInfo:
        """ASG name, status, tags and health issue codes of a managed node group (EKS ``DescribeNodegroup``).

        Raises:
            StalePlan: the node group does not exist.
        """
        with aws_errors("DescribeNodegroup"):
            ng = self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        groups = ng.get("resources", {}).get("autoScalingGroups", [])
        asg_name = str(groups[0]["name"]) if groups and groups[0].get("name") else None
        issues = tuple(
            sorted(
                {str(issue["code"]) for issue in ng.get("health", {}).get("issues", []) if "code" in issue}
            )
        )
        tags = {str(k): str(v) for k, v in (ng.get("tags") or {}).items()}
        return NodeGroupInfo(asg_name, str(ng.get("status", "")), tags, issues)

    def update_sizes(self, cluster: str, nodegroup: str, min_size: int, desired: int, max_size: int) -> bool:
        """``UpdateNodegroupConfig`` with min, desired and max together, validated locally first.

        Waits and retries while the group is busy, never retries ``InvalidParameterException``
        (:meth:`rightsizer.adapters.aws.EksNodeGroupSizer.update_sizes`).

        Returns:
            True when a call was made; False when ``scalingConfig`` already had these sizes.
        """
        update = self._sizer.update_sizes(cluster, nodegroup, min_size, desired, max_size)
        return not update.already_done

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
                    page = self._autoscaling.describe_scaling_activities(
                        AutoScalingGroupName=asg_name, MaxRecords=_ACTIVITY_PAGE, NextToken=token
                    )
                else:
                    page = self._autoscaling.describe_scaling_activities(
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
