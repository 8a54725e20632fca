"""Warm pools of EKS managed node groups (issue 30): read a group's ``warmPoolConfig``, set it through
``UpdateNodegroupConfig`` (EKS manages the Auto Scaling group's warm pool; never ``PutWarmPool`` on the
group itself), and list the warm instances with their launch template version (``DescribeWarmPool``) so
drift from the group's launch template is seen.

Shapes: botocore EKS model 2017-11-01 ``WarmPoolConfig`` (``enabled``, ``minSize``,
``maxGroupPreparedCapacity``, ``poolState`` STOPPED | RUNNING | HIBERNATED, ``reuseOnScaleIn``); Auto
Scaling ``DescribeWarmPool`` ``Instances[].LaunchTemplate`` (``LaunchTemplateId``, ``Version``).

IAM actions (:data:`IAM_ACTIONS`): ``eks:DescribeNodegroup``, ``eks:UpdateNodegroupConfig``,
``autoscaling:DescribeWarmPool``. Only ``rightsizer plan`` / ``apply`` call them, with the operator's
credentials; no function role holds ``DescribeWarmPool``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.domain.warm_pool import WarmInstance, WarmPoolGroup

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_eks.client import EKSClient
    from mypy_boto3_eks.type_defs import WarmPoolConfigTypeDef

__all__ = ["IAM_ACTIONS", "WarmPools"]

#: The AWS actions this module calls (IAM ``service:Action``).
IAM_ACTIONS: Final = frozenset(
    {"eks:DescribeNodegroup", "eks:UpdateNodegroupConfig", "autoscaling:DescribeWarmPool"}
)


class WarmPools:
    """EKS warm pool calls (see the module).

    Raises (every method): TransientError / PermanentError / StalePlan as
    :func:`rightsizer.adapters.aws_errors.aws_errors` maps AWS errors.
    """

    def __init__(self, eks: EKSClient, autoscaling: AutoScalingClient) -> None:
        """Args: eks and autoscaling clients (standard retries), built by the wiring."""
        self._eks = eks
        self._asg = autoscaling

    def describe(self, cluster: str, nodegroup: str) -> WarmPoolGroup:
        """``DescribeNodegroup`` reduced to :class:`WarmPoolGroup`."""
        with aws_errors("DescribeNodegroup"):
            ng: Any = self._eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        template = ng.get("launchTemplate")
        groups = (ng.get("resources") or {}).get("autoScalingGroups") or []
        return WarmPoolGroup(
            name=str(ng["nodegroupName"]),
            capacity_type=str(ng["capacityType"]) if ng.get("capacityType") else None,
            instance_types=tuple(str(t) for t in ng.get("instanceTypes") or ()),
            ami_type=str(ng["amiType"]) if ng.get("amiType") else None,
            disk_size=int(ng["diskSize"]) if ng.get("diskSize") else None,
            launch_template={str(k): str(v) for k, v in template.items()} if template else None,
            asg_name=str(groups[0]["name"]) if groups and groups[0].get("name") else None,
            desired=int((ng.get("scalingConfig") or {}).get("desiredSize", 0)),
            warm_pool=dict(ng["warmPoolConfig"]) if ng.get("warmPoolConfig") else None,
        )

    def set_warm_pool(self, cluster: str, nodegroup: str, config: dict[str, Any]) -> str | None:
        """``UpdateNodegroupConfig`` with only ``warmPoolConfig``; returns the update id."""
        with aws_errors("UpdateNodegroupConfig"):
            answer: Any = self._eks.update_nodegroup_config(
                clusterName=cluster,
                nodegroupName=nodegroup,
                warmPoolConfig=cast("WarmPoolConfigTypeDef", config),
            )
        update = answer.get("update") or {}
        return str(update["id"]) if update.get("id") else None

    def warm_instances(self, asg_name: str) -> list[WarmInstance]:
        """The group's warm pool instances (``DescribeWarmPool``, every page); [] without a pool."""
        out: list[WarmInstance] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"AutoScalingGroupName": asg_name}
            if token:
                kwargs["NextToken"] = token
            with aws_errors("DescribeWarmPool"):
                page: Any = self._asg.describe_warm_pool(**kwargs)
            for item in page.get("Instances") or []:
                template = item.get("LaunchTemplate") or {}
                out.append(
                    WarmInstance(
                        instance_id=str(item["InstanceId"]),
                        lifecycle_state=str(item.get("LifecycleState", "")),
                        template_id=str(template["LaunchTemplateId"])
                        if template.get("LaunchTemplateId")
                        else None,
                        version=str(template["Version"]) if template.get("Version") else None,
                    )
                )
            token = page.get("NextToken")
            if not token:
                return out
