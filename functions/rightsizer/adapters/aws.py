"""AWS adapter: inventory, targeted scale-in, managed node group sizing and standalone EC2 resize.

Implements docs/architecture.md §4 "Remove", "Resize" and "Node group sizing", and the AWS half of the snapshot
(§5 ``nodegroups.json`` / ``instances.json``). Every SDK error leaves this module as one of the taxonomy
in :mod:`rightsizer.domain.errors`, chosen by the AWS error ``Code`` (never by message text); the
``Aws*`` subclasses below keep the code and the operation for logs and alarms.

IAM actions needed (one role may hold only the subset its function uses):

- ``autoscaling:DescribeAutoScalingGroups``, ``autoscaling:DescribeAutoScalingInstances``,
  ``autoscaling:DescribeScalingActivities`` — inventory, scale-in and resize preflight;
- ``autoscaling:TerminateInstanceInAutoScalingGroup`` — targeted scale-in (:class:`AsgScaler`);
- ``eks:ListNodegroups``, ``eks:DescribeNodegroup`` — inventory and sizing;
- ``eks:UpdateNodegroupConfig`` — node group sizing (:class:`EksNodeGroupSizer`, off-hours only);
- ``ec2:DescribeInstances``, ``ec2:DescribeInstanceTypes`` — inventory and resize preflight;
- ``ec2:StopInstances``, ``ec2:StartInstances``, ``ec2:ModifyInstanceAttribute`` — resize
  (:class:`rightsizer.adapters.ec2_resize.Ec2Resizer`); scope these with a condition on the tag
  ``rightsizer.io/resize=allowed``.

Clients are built once per cold start by :func:`make_clients` (or by the wiring) and passed in; this
module never builds a client behind the caller's back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, NoReturn

import boto3
from botocore.config import Config

from rightsizer.adapters.aws_errors import (
    ActionRefusedError,
    AwsPermanentError,
    AwsStalePlan,
    AwsTransientError,
    aws_errors,
    error_code,
    map_aws_error,
)
from rightsizer.domain.errors import (
    ConfigError,
    PermanentError,
    StalePlan,
    TransientError,
)

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_eks.client import EKSClient

__all__ = [
    "ASG_BATCH",
    "ActionRefusedError",
    "AsgScaler",
    "AwsClients",
    "AwsInventory",
    "AwsPermanentError",
    "AwsStalePlan",
    "AwsTransientError",
    "EksNodeGroupSizer",
    "GroupSizes",
    "NodeGroupUpdate",
    "ScalingSizes",
    "TerminateResult",
    "instance_type_change_steps",
    "json_safe",
    "make_clients",
    "map_aws_error",
    "validate_sizes",
]

#: DescribeAutoScalingInstances accepts at most 50 instance ids per call.
ASG_BATCH: Final = 50
#: DescribeInstances filter values per call; the API allows 200, a smaller page keeps responses small.
EC2_BATCH: Final = 100

_RETRY_CONFIG: Final = Config(retries={"mode": "standard", "max_attempts": 5})

#: The AWS actions this module calls (IAM ``service:Action``). ``tests/integration/test_iam.py`` records
#: every SDK call each function makes and fails when this module calls an action it does not declare.
IAM_ACTIONS: Final = frozenset(
    {
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeScalingActivities",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "eks:ListNodegroups",
        "eks:DescribeNodegroup",
        "eks:UpdateNodegroupConfig",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeSpotPriceHistory",
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:ModifyInstanceAttribute",
    }
)

# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsClients:
    """The three SDK clients this adapter uses, all for one region."""

    ec2: EC2Client
    eks: EKSClient
    autoscaling: AutoScalingClient


def make_clients(
    region: str, endpoint_url: str | None = None, *, session: boto3.session.Session | None = None
) -> AwsClients:
    """Build EC2, EKS and Auto Scaling clients with standard retries (5 attempts).

    Args:
        region: AWS region name, e.g. ``us-east-1``.
        endpoint_url: override for every client (a moto server in tests and the demo); ``None`` = AWS.
        session: a boto3 session to build from (it caches service models: reuse it across cold-start
            wiring or tests); by default a new one.
    """
    session = session or boto3.session.Session(region_name=region)
    return AwsClients(
        ec2=session.client("ec2", region_name=region, endpoint_url=endpoint_url, config=_RETRY_CONFIG),
        eks=session.client("eks", region_name=region, endpoint_url=endpoint_url, config=_RETRY_CONFIG),
        autoscaling=session.client(
            "autoscaling", region_name=region, endpoint_url=endpoint_url, config=_RETRY_CONFIG
        ),
    )


# --------------------------------------------------------------------------------------------------
# JSON helpers
# --------------------------------------------------------------------------------------------------


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def json_safe(value: Any) -> Any:
    """Return ``value`` with datetimes as RFC 3339 UTC strings and ``ResponseMetadata`` removed.

    The result is what ``json.dumps`` accepts; otherwise the AWS shape is kept key for key.
    """
    if isinstance(value, datetime):
        return _rfc3339(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items() if k != "ResponseMetadata"}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _batches(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------------------------------


class AwsInventory:
    """Reads node group, Auto Scaling and EC2 state in the snapshot's shapes (docs/architecture.md §5)."""

    def __init__(self, clients: AwsClients, *, activity_pages: int = 2) -> None:
        """Args: clients; activity_pages: DescribeScalingActivities pages read per ASG (newest first)."""
        self._ec2 = clients.ec2
        self._eks = clients.eks
        self._asg = clients.autoscaling
        self._activity_pages = activity_pages

    def describe(self, instance_ids: Sequence[str], cluster: str) -> dict[str, Any]:
        """Return the ``nodegroups.json`` document for a cluster and the nodes' instance ids.

        Calls EKS ListNodegroups + DescribeNodegroup (every managed node group of ``cluster``),
        DescribeAutoScalingInstances (``instance_ids`` in batches of 50), DescribeAutoScalingGroups
        (every group named by either) and DescribeScalingActivities (newest successful launch).

        Returns:
            ``{"nodegroups": [DescribeNodegroup .nodegroup], "autoScalingGroups": [ASG],
            "autoScalingInstances": [instance], "launchActivities": {asg_name: RFC 3339}}``; the first
            three exactly as AWS returns them (datetimes as RFC 3339 strings). An instance id missing
            from ``autoScalingInstances`` is known to be standalone.
        """
        nodegroups = self._nodegroups(cluster)
        asg_instances = self._asg_instances(_unique(instance_ids))
        names = [
            str(group["name"])
            for ng in nodegroups
            for group in ng.get("resources", {}).get("autoScalingGroups", [])
            if group.get("name")
        ]
        names += [str(item["AutoScalingGroupName"]) for item in asg_instances]
        groups = self._groups(_unique(names))
        launches: dict[str, str] = {}
        for group in groups:
            started = self._newest_launch(str(group["AutoScalingGroupName"]))
            if started is not None:
                launches[str(group["AutoScalingGroupName"])] = started
        return {
            "nodegroups": json_safe(nodegroups),
            "autoScalingGroups": json_safe(groups),
            "autoScalingInstances": json_safe(asg_instances),
            "launchActivities": launches,
        }

    def describe_instances(self, instance_ids: Sequence[str]) -> dict[str, Any]:
        """Return the ``instances.json`` document for these instance ids.

        Calls EC2 DescribeInstances with an ``instance-id`` filter, paginated, so that an id that no
        longer exists is simply absent instead of failing the whole call (``InvalidInstanceID.NotFound``);
        then, when any is a spot instance (``InstanceLifecycle == "spot"``), DescribeSpotPriceHistory for
        their types and zones (``Linux/UNIX``, the price in effect now).

        Returns:
            ``{"Reservations": [...], "SpotPriceHistory": [...]}`` as AWS returns them (datetimes as
            RFC 3339 strings); ``SpotPriceHistory`` is empty without spot instances.
        """
        reservations: list[Any] = []
        paginator = self._ec2.get_paginator("describe_instances")
        for batch in _batches(_unique(instance_ids), EC2_BATCH):
            with aws_errors("DescribeInstances"):
                for page in paginator.paginate(Filters=[{"Name": "instance-id", "Values": batch}]):
                    reservations.extend(page.get("Reservations", []))
        spot = [
            i for r in reservations for i in r.get("Instances", []) if i.get("InstanceLifecycle") == "spot"
        ]
        return {
            "Reservations": json_safe(reservations),
            "SpotPriceHistory": json_safe(self._spot_prices(spot)),
        }

    def _spot_prices(self, instances: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        if not instances:
            return []
        types = _unique(str(i["InstanceType"]) for i in instances)
        zones = _unique(str(i.get("Placement", {}).get("AvailabilityZone", "")) for i in instances)
        history: list[Mapping[str, Any]] = []
        with aws_errors("DescribeSpotPriceHistory"):
            pages = self._ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=types,  # type: ignore[arg-type]
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.now(UTC),
                Filters=[{"Name": "availability-zone", "Values": [z for z in zones if z]}],
            )
            for page in pages:
                history.extend(page.get("SpotPriceHistory", []))
        return history

    def _nodegroups(self, cluster: str) -> list[Mapping[str, Any]]:
        names: list[str] = []
        with aws_errors("ListNodegroups"):
            for page in self._eks.get_paginator("list_nodegroups").paginate(clusterName=cluster):
                names.extend(page.get("nodegroups", []))
        result: list[Mapping[str, Any]] = []
        for name in names:
            try:
                with aws_errors("DescribeNodegroup"):
                    result.append(
                        self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
                    )
            except StalePlan:
                continue  # deleted between list and describe
        return result

    def _asg_instances(self, instance_ids: Sequence[str]) -> list[Mapping[str, Any]]:
        result: list[Mapping[str, Any]] = []
        paginator = self._asg.get_paginator("describe_auto_scaling_instances")
        for batch in _batches(instance_ids, ASG_BATCH):
            with aws_errors("DescribeAutoScalingInstances"):
                for page in paginator.paginate(InstanceIds=batch):
                    result.extend(page.get("AutoScalingInstances", []))
        return result

    def _groups(self, names: Sequence[str]) -> list[Mapping[str, Any]]:
        result: list[Mapping[str, Any]] = []
        paginator = self._asg.get_paginator("describe_auto_scaling_groups")
        for batch in _batches(names, ASG_BATCH):
            with aws_errors("DescribeAutoScalingGroups"):
                for page in paginator.paginate(AutoScalingGroupNames=batch):
                    result.extend(page.get("AutoScalingGroups", []))
        return result

    def _newest_launch(self, asg_name: str) -> str | None:
        paginator = self._asg.get_paginator("describe_scaling_activities")
        pages = paginator.paginate(
            AutoScalingGroupName=asg_name, PaginationConfig={"MaxItems": 100 * self._activity_pages}
        )
        newest: datetime | None = None
        with aws_errors("DescribeScalingActivities"):
            for page in pages:
                for activity in page.get("Activities", []):
                    # Activities carry no type field; the launch ones are described as "Launching ...".
                    if activity.get("StatusCode") != "Successful":
                        continue
                    if not str(activity.get("Description", "")).startswith("Launching"):
                        continue
                    started = activity.get("StartTime")
                    if isinstance(started, datetime) and (newest is None or started > newest):
                        newest = started
        return None if newest is None else _rfc3339(newest)


# --------------------------------------------------------------------------------------------------
# Targeted scale-in (Auto Scaling)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingSizes:
    """Min, desired and max size of a group, in instances."""

    min_size: int
    desired: int
    max_size: int


@dataclass(frozen=True)
class GroupSizes:
    """An Auto Scaling group's sizes (instances) and member ids, from DescribeAutoScalingGroups."""

    min_size: int
    desired: int
    max_size: int
    instance_ids: tuple[str, ...]

    @property
    def sizes(self) -> ScalingSizes:
        """The sizes without the members."""
        return ScalingSizes(self.min_size, self.desired, self.max_size)


@dataclass(frozen=True)
class TerminateResult:
    """Outcome of a targeted scale-in; ``already_done`` means no terminate call was made this time."""

    asg_name: str
    instance_id: str
    desired_before: int
    desired_after: int
    already_done: bool
    activity_id: str | None = None


_DONE_STATES: Final = ("Terminating", "Terminated")
_NOT_YET_STATES: Final = ("Pending", "EnteringStandby")


class AsgScaler:
    """Removes one chosen instance from its Auto Scaling group and shrinks the group by one (BUG-23)."""

    def __init__(self, autoscaling: AutoScalingClient) -> None:
        """Args: autoscaling: an Auto Scaling client (standard retries)."""
        self._asg = autoscaling

    def group_sizes(self, asg_name: str) -> GroupSizes:
        """Read MinSize, DesiredCapacity, MaxSize and the member ids via DescribeAutoScalingGroups.

        Raises:
            StalePlan: the group does not exist (any more).
        """
        group = self._group(asg_name)
        return GroupSizes(
            min_size=int(group["MinSize"]),
            desired=int(group["DesiredCapacity"]),
            max_size=int(group["MaxSize"]),
            instance_ids=tuple(str(i["InstanceId"]) for i in group.get("Instances", [])),
        )

    def terminate_instance(self, asg_name: str, instance_id: str) -> TerminateResult:
        """Terminate exactly ``instance_id`` and decrement DesiredCapacity by one, idempotently.

        Re-reads the instance (DescribeAutoScalingInstances) and the group (DescribeAutoScalingGroups),
        checks DesiredCapacity − 1 ≥ MinSize, then calls TerminateInstanceInAutoScalingGroup with
        ``ShouldDecrementDesiredCapacity=True``. Never follow it with UpdateNodegroupConfig: EKS already
        mirrors the new DesiredCapacity, a second change would shrink the group twice.

        Returns:
            :class:`TerminateResult`; ``already_done=True`` without a call when the instance is already
            Terminating/Terminated, gone, or no longer in any group.

        Raises:
            StalePlan: the instance is in a different group, or in a state we do not remove from
                (Standby, Detaching...).
            TransientError: the instance is still Pending; AWS throttling/5xx.
            ActionRefusedError: ``node_group_at_min_size`` — lower MinSize first or skip the node.
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

        sizes = self.group_sizes(asg_name)
        if instance_id not in sizes.instance_ids:
            return self._already_done(asg_name, instance_id, sizes)
        # Checked here because the API's own refusal arrives only after the drain, and moto never refuses.
        if sizes.desired - 1 < sizes.min_size:
            raise ActionRefusedError(
                f"removing {instance_id} would take {asg_name} below MinSize: DesiredCapacity "
                f"{sizes.desired} - 1 < MinSize {sizes.min_size}; lower MinSize first or skip this node",
                reasons=["node_group_at_min_size"],
            )
        with aws_errors("TerminateInstanceInAutoScalingGroup"):
            response = self._asg.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
            )
        after = self.group_sizes(asg_name)
        return TerminateResult(
            asg_name=asg_name,
            instance_id=instance_id,
            desired_before=sizes.desired,
            desired_after=after.desired,
            already_done=False,
            activity_id=response.get("Activity", {}).get("ActivityId"),
        )

    def _already_done(
        self, asg_name: str, instance_id: str, sizes: GroupSizes | None = None
    ) -> TerminateResult:
        try:
            desired = (sizes or self.group_sizes(asg_name)).desired
        except StalePlan:
            desired = 0  # the whole group is gone: nothing left to remove
        return TerminateResult(asg_name, instance_id, desired, desired, already_done=True)

    def _group(self, asg_name: str) -> Mapping[str, Any]:
        with aws_errors("DescribeAutoScalingGroups"):
            groups = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])
        found = groups.get("AutoScalingGroups", [])
        if not found:
            raise StalePlan(f"Auto Scaling group {asg_name!r} not found")
        return found[0]


# --------------------------------------------------------------------------------------------------
# Managed node group sizing (EKS)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroupUpdate:
    """Outcome of :meth:`EksNodeGroupSizer.update_sizes`; ``already_done`` = sizes already matched."""

    cluster: str
    nodegroup: str
    before: ScalingSizes
    after: ScalingSizes
    update_id: str | None
    already_done: bool
    attempts: int


def validate_sizes(min_size: int, desired: int, max_size: int) -> ScalingSizes:
    """Check 0 ≤ min ≤ desired ≤ max and max ≥ 1 locally, before any AWS call.

    moto accepts any scalingConfig (even desired > max); EKS would reject it only after the drain.

    Raises:
        ConfigError: naming the offending ``scalingConfig`` field.
    """
    for field, value in (("minSize", min_size), ("desiredSize", desired), ("maxSize", max_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be an integer, got {value!r}", field=f"scalingConfig.{field}")
    if min_size < 0:
        raise ConfigError(f"minSize {min_size} < 0", field="scalingConfig.minSize")
    if max_size < 1:
        raise ConfigError(f"maxSize {max_size} < 1 (EKS requires at least 1)", field="scalingConfig.maxSize")
    if min_size > desired:
        raise ConfigError(f"minSize {min_size} > desiredSize {desired}", field="scalingConfig.minSize")
    if desired > max_size:
        raise ConfigError(f"desiredSize {desired} > maxSize {max_size}", field="scalingConfig.desiredSize")
    return ScalingSizes(min_size, desired, max_size)


# Transitional statuses end by themselves; DEGRADED is not among them because it can last for hours
# (e.g. AsgInstanceLaunchFailures during a restore, BUG-27) and EKS accepts config updates then.
_WAIT_STATUSES: Final = frozenset({"CREATING", "UPDATING"})
_GONE_STATUSES: Final = frozenset({"DELETING"})
_BROKEN_STATUSES: Final = frozenset({"CREATE_FAILED", "DELETE_FAILED"})


def instance_type_change_steps(
    nodegroup: str, target_type: str, *, via_launch_template: bool = False
) -> list[str]:
    """The blue/green steps for changing a managed node group's instance type (BUG-25), as text."""
    new_name = f"{nodegroup}-{target_type.replace('.', '-')}"
    steps = [
        f"1. create a NEW managed node group with a new name (e.g. {new_name}) and instanceTypes "
        f"[{target_type}], carrying the same labels, taints, subnets and IAM role",
        "2. wait until it is ACTIVE and its nodes are Ready with allocatable nvidia.com/gpu > 0",
        f"3. cordon and drain the nodes of {nodegroup} with the normal PodDisruptionBudget-respecting drain",
        f"4. scale {nodegroup} to 0 (minSize 0, desiredSize 0) and only then delete it",
        f"never delete {nodegroup} first and recreate it under the same name (409 ResourceInUseException)",
    ]
    if via_launch_template:
        steps.append(
            "alternative, since the type lives in the launch template: create a new launch template "
            f"version with InstanceType {target_type}, then UpdateNodegroupVersion (a rolling replacement); "
            "check first that every pod fits the new type"
        )
    return steps


class EksNodeGroupSizer:
    """Sets a managed node group's min/desired/max through UpdateNodegroupConfig (off-hours only)."""

    def __init__(
        self,
        eks: EKSClient,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = 10,
        delay_s: float = 15.0,
    ) -> None:
        """Args: eks client; sleep (injectable); max_attempts and delay_s (seconds) bound the waiting."""
        self._eks = eks
        self._sleep = sleep
        self._max_attempts = max_attempts
        self._delay_s = delay_s

    def current_sizes(self, cluster: str, nodegroup: str) -> tuple[ScalingSizes, str]:
        """Return the node group's ``scalingConfig`` and ``status`` (EKS DescribeNodegroup)."""
        with aws_errors("DescribeNodegroup"):
            ng = self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        config = ng.get("scalingConfig", {})
        sizes = ScalingSizes(
            int(config.get("minSize", 0)), int(config.get("desiredSize", 0)), int(config.get("maxSize", 0))
        )
        return sizes, str(ng.get("status", ""))

    def update_sizes(
        self, cluster: str, nodegroup: str, min_size: int, desired: int, max_size: int
    ) -> NodeGroupUpdate:
        """Send min, desired and max together with UpdateNodegroupConfig, after local validation.

        Waits ``delay_s`` and tries again (at most ``max_attempts`` times) while the group is
        CREATING/UPDATING or the call answers ResourceInUseException; never retries
        InvalidParameterException. Sizes already equal ⇒ no call (``already_done``).

        Raises:
            ConfigError: the sizes are inconsistent (no AWS call made).
            StalePlan: the node group is gone or being deleted.
            TransientError: still busy after ``max_attempts``; throttling/5xx.
            PermanentError: the group is in a failed state, or AWS rejected the sizes.
        """
        wanted = validate_sizes(min_size, desired, max_size)
        before: ScalingSizes | None = None
        for attempt in range(1, self._max_attempts + 1):
            current, status = self.current_sizes(cluster, nodegroup)
            before = before or current
            if current == wanted:
                return NodeGroupUpdate(cluster, nodegroup, before, current, None, True, attempt)
            if status in _GONE_STATUSES:
                raise StalePlan(f"node group {cluster}/{nodegroup} is {status}")
            if status in _BROKEN_STATUSES:
                raise PermanentError(f"node group {cluster}/{nodegroup} is {status}; fix it first")
            if status in _WAIT_STATUSES:
                self._pause(attempt)
                continue
            try:
                with aws_errors("UpdateNodegroupConfig"):
                    response = self._eks.update_nodegroup_config(
                        clusterName=cluster,
                        nodegroupName=nodegroup,
                        scalingConfig={"minSize": min_size, "desiredSize": desired, "maxSize": max_size},
                    )
            except TransientError as exc:
                if error_code(exc) != "ResourceInUseException":
                    raise
                self._pause(attempt)
                continue
            return NodeGroupUpdate(
                cluster, nodegroup, before, wanted, response.get("update", {}).get("id"), False, attempt
            )
        raise TransientError(
            f"node group {cluster}/{nodegroup} still busy after {self._max_attempts} attempts",
            retry_after=self._delay_s,
        )

    def refuse_instance_type_change(self, cluster: str, nodegroup: str, target_type: str) -> NoReturn:
        """Always refuse an in-place instance type change of a managed node group (BUG-25).

        Reads the group (EKS DescribeNodegroup) only to say whether the type lives in
        ``instanceTypes`` or in a launch template, and raises with the blue/green steps.

        Raises:
            ActionRefusedError: ``immutable_instance_type``, always.
        """
        with aws_errors("DescribeNodegroup"):
            ng = self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        current = ", ".join(ng.get("instanceTypes") or []) or "set by its launch template"
        via_template = not ng.get("instanceTypes") and bool(ng.get("launchTemplate"))
        steps = "\n".join(
            instance_type_change_steps(nodegroup, target_type, via_launch_template=via_template)
        )
        raise ActionRefusedError(
            f"the instance type of managed node group {cluster}/{nodegroup} ({current}) cannot be changed "
            f"in place (UpdateNodegroupConfig has no instanceTypes); to move to {target_type}:\n{steps}",
            reasons=["immutable_instance_type"],
        )

    def _pause(self, attempt: int) -> None:
        if attempt < self._max_attempts:
            self._sleep(self._delay_s)
