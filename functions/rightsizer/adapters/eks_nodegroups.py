"""EKS managed node groups: the ``NodeGroupSizer`` and ``NodeGroupReplacer`` ports (docs/architecture.md §4
"Node group sizing", "Node group replacement").

One adapter for the EKS node group capability: listing and describing node groups (tags select groups for
off-hours, health issues explain a slow restore), setting min/desired/max together through
``UpdateNodegroupConfig`` (off-hours only; waits while the group is busy, never retries
``InvalidParameterException``), and refusing an in-place instance type change with the blue/green steps
(BUG-25). For a node group replacement: the old group as a :class:`~rightsizer.ports.ManagedNodeGroup`, and
``CreateNodegroup`` / ``DeleteNodegroup``. Sizes that count are read from the Auto Scaling group
(:class:`rightsizer.adapters.autoscaling.AutoScalingGroups`).

IAM actions (:data:`IAM_ACTIONS`): ``eks:ListNodegroups``, ``eks:DescribeNodegroup``,
``eks:UpdateNodegroupConfig``, ``eks:CreateNodegroup`` (EKS checks ``iam:PassRole`` of the node role it
names), ``eks:DeleteNodegroup``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NoReturn

from rightsizer.adapters.aws_errors import ActionRefusedError, aws_errors, error_code
from rightsizer.domain.errors import ConfigError, PermanentError, StalePlan, TransientError
from rightsizer.domain.model import GroupSizes
from rightsizer.ports import ManagedNodeGroup, NodeGroupInfo, NodeGroupUpdate

if TYPE_CHECKING:
    from mypy_boto3_eks.client import EKSClient

__all__ = ["EksNodeGroups", "instance_type_change_steps"]

#: The AWS actions this module calls (IAM ``service:Action``); ``tests/integration/test_iam.py`` checks it.
IAM_ACTIONS: Final = frozenset(
    {
        "eks:ListNodegroups",
        "eks:DescribeNodegroup",
        "eks:UpdateNodegroupConfig",
        "eks:CreateNodegroup",
        "iam:PassRole",  # EKS checks it for the node role CreateNodegroup names
        "eks:DeleteNodegroup",
    }
)

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


def _scaling(nodegroup: Any) -> GroupSizes | None:
    config = nodegroup.get("scalingConfig")
    if not config:
        return None
    try:
        return GroupSizes(
            int(config.get("minSize", 0)), int(config.get("desiredSize", 0)), int(config.get("maxSize", 0))
        )
    except ValueError:
        return None  # sizes EKS would never hold (moto keeps anything): unknown, so any update differs


def _managed(ng: Any) -> ManagedNodeGroup:
    config = ng.get("scalingConfig") or {}
    groups = (ng.get("resources") or {}).get("autoScalingGroups") or []
    template = ng.get("launchTemplate")
    issues = (ng.get("health") or {}).get("issues") or []
    return ManagedNodeGroup(
        name=str(ng["nodegroupName"]),
        status=str(ng.get("status", "")),
        instance_types=tuple(str(t) for t in ng.get("instanceTypes") or ()),
        scaling=GroupSizes(
            int(config.get("minSize", 0)),
            int(config.get("desiredSize", 0)),
            int(config.get("maxSize", 0)),
        ),
        labels={str(k): str(v) for k, v in (ng.get("labels") or {}).items()},
        taints=tuple(
            {str(k): str(v) for k, v in taint.items() if v is not None} for taint in ng.get("taints") or ()
        ),
        subnets=tuple(str(s) for s in ng.get("subnets") or ()),
        node_role=str(ng.get("nodeRole", "")),
        launch_template={str(k): str(v) for k, v in template.items()} if template else None,
        capacity_type=str(ng["capacityType"]) if ng.get("capacityType") else None,
        ami_type=str(ng["amiType"]) if ng.get("amiType") else None,
        tags={str(k): str(v) for k, v in (ng.get("tags") or {}).items()},
        asg_name=str(groups[0]["name"]) if groups and groups[0].get("name") else None,
        health_issues=tuple(sorted({str(i["code"]) for i in issues if i.get("code")})),
        disk_size=int(ng["diskSize"]) if ng.get("diskSize") and not template else None,
    )


class EksNodeGroups:
    """``NodeGroupSizer`` and ``NodeGroupReplacer`` (``rightsizer.ports``) over EKS managed node groups.

    Args:
        eks: an EKS client (standard retries), built by the wiring.
        sleep: how to wait between sizing attempts, in seconds (tests pass a no-op).
        max_attempts: reads of a busy group (``CREATING``/``UPDATING``, ``ResourceInUseException``) before
            :meth:`update_sizes` gives up.
        delay_s: seconds between those attempts.
    """

    def __init__(
        self,
        eks: EKSClient,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = 10,
        delay_s: float = 15.0,
    ) -> None:
        self._eks = eks
        self._sleep = sleep
        self._max_attempts = max_attempts
        self._delay_s = delay_s

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
        """ASG name, status, tags, health issue codes and ``scalingConfig`` of a managed node group (EKS
        ``DescribeNodegroup``).

        Raises:
            StalePlan: the node group does not exist.
        """
        ng = self._nodegroup(cluster, nodegroup)
        groups = ng.get("resources", {}).get("autoScalingGroups", [])
        asg_name = str(groups[0]["name"]) if groups and groups[0].get("name") else None
        issues = tuple(
            sorted(
                {str(issue["code"]) for issue in ng.get("health", {}).get("issues", []) if "code" in issue}
            )
        )
        tags = {str(k): str(v) for k, v in (ng.get("tags") or {}).items()}
        return NodeGroupInfo(asg_name, str(ng.get("status", "")), tags, issues, _scaling(ng))

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        """Send min, desired and max together with ``UpdateNodegroupConfig``.

        ``sizes`` are consistent by construction (:class:`~rightsizer.domain.model.GroupSizes`); EKS also
        needs ``maxSize`` ≥ 1, checked here before any call (moto accepts anything; EKS would refuse only
        after the drain). Waits ``delay_s`` and tries again (at most ``max_attempts`` times) while the
        group is CREATING/UPDATING or the call answers ResourceInUseException; never retries
        InvalidParameterException. Sizes already equal ⇒ no call (``already_done``).

        Raises:
            ConfigError: ``maxSize`` < 1 (no AWS call made), naming ``scalingConfig.maxSize``.
            StalePlan: the node group is gone or being deleted.
            TransientError: still busy after ``max_attempts``; throttling/5xx.
            PermanentError: the group is in a failed state, or AWS rejected the sizes.
        """
        if sizes.max < 1:
            raise ConfigError(
                f"maxSize {sizes.max} < 1 (EKS requires at least 1)", field="scalingConfig.maxSize"
            )
        before: GroupSizes | None = None
        for attempt in range(1, self._max_attempts + 1):
            info = self.describe(cluster, nodegroup)
            current = info.scaling or GroupSizes(0, 0, 0)
            before = before or current
            if current == sizes:
                return NodeGroupUpdate(cluster, nodegroup, before, current, None, True, attempt)
            if info.status in _GONE_STATUSES:
                raise StalePlan(f"node group {cluster}/{nodegroup} is {info.status}")
            if info.status in _BROKEN_STATUSES:
                raise PermanentError(f"node group {cluster}/{nodegroup} is {info.status}; fix it first")
            if info.status in _WAIT_STATUSES:
                self._pause(attempt)
                continue
            try:
                with aws_errors("UpdateNodegroupConfig"):
                    response = self._eks.update_nodegroup_config(
                        clusterName=cluster,
                        nodegroupName=nodegroup,
                        scalingConfig={
                            "minSize": sizes.min,
                            "desiredSize": sizes.desired,
                            "maxSize": sizes.max,
                        },
                    )
            except TransientError as exc:
                if error_code(exc) != "ResourceInUseException":
                    raise
                self._pause(attempt)
                continue
            return NodeGroupUpdate(
                cluster, nodegroup, before, sizes, response.get("update", {}).get("id"), False, attempt
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
        ng = self._nodegroup(cluster, nodegroup)
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

    # ------------------------------------------------------------------------------ NodeGroupReplacer

    def describe_managed(self, cluster: str, nodegroup: str) -> ManagedNodeGroup | None:
        """The node group as a replacement copies it (EKS ``DescribeNodegroup``); None when it does not exist."""
        try:
            return _managed(self._nodegroup(cluster, nodegroup))
        except StalePlan:
            return None

    def create_nodegroup(self, cluster: str, spec: ManagedNodeGroup, client_token: str) -> None:
        """EKS ``CreateNodegroup`` from ``spec``; an existing group carrying ``spec.tags`` is ours (a retried
        create), as ``clientRequestToken`` makes it on EKS.

        Raises:
            PermanentError: ``nodegroup_name_taken`` when a group of that name is not ours; AWS refusals.
        """
        minimum, desired, maximum = spec.scaling.min, spec.scaling.desired, spec.scaling.max
        params: dict[str, Any] = {
            "clusterName": cluster,
            "nodegroupName": spec.name,
            "nodeRole": spec.node_role,
            "subnets": list(spec.subnets),
            "scalingConfig": {"minSize": minimum, "desiredSize": desired, "maxSize": maximum},
            "labels": dict(spec.labels),
            "taints": [dict(t) for t in spec.taints],
            "tags": dict(spec.tags),
            "clientRequestToken": client_token,
        }
        if spec.instance_types:
            params["instanceTypes"] = list(spec.instance_types)
        if spec.launch_template:
            params["launchTemplate"] = {
                "id": spec.launch_template["id"],
                "version": spec.launch_template["version"],
            }
        elif spec.disk_size:
            params["diskSize"] = spec.disk_size
        if spec.capacity_type:
            params["capacityType"] = spec.capacity_type
        if spec.ami_type and not (spec.launch_template and spec.ami_type == "CUSTOM"):
            params["amiType"] = spec.ami_type
        try:
            with aws_errors("CreateNodegroup"):
                self._eks.create_nodegroup(**params)
        except (TransientError, PermanentError) as exc:
            if error_code(exc) != "ResourceInUseException":
                raise
            existing = self.describe_managed(cluster, spec.name)
            if existing is None or any(existing.tags.get(k) != v for k, v in spec.tags.items()):
                raise PermanentError(f"nodegroup_name_taken:{spec.name}") from exc

    def delete_nodegroup(self, cluster: str, nodegroup: str) -> bool:
        """EKS ``DeleteNodegroup``; False when it does not exist any more."""
        try:
            with aws_errors("DeleteNodegroup"):
                self._eks.delete_nodegroup(clusterName=cluster, nodegroupName=nodegroup)
        except StalePlan:
            return False
        return True

    def _nodegroup(self, cluster: str, nodegroup: str) -> Any:
        with aws_errors("DescribeNodegroup"):
            return self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]

    def _pause(self, attempt: int) -> None:
        if attempt < self._max_attempts:
            self._sleep(self._delay_s)
