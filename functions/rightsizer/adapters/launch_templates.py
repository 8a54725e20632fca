"""EC2 launch templates: the ``LaunchTemplateVersions`` port (docs/architecture.md §4 "Node group replacement").

A managed node group whose launch template names an instance type cannot be given another type through
``CreateNodegroup`` (EKS refuses ``instanceTypes`` beside it): the replacement gets a new version of the same
template with only ``InstanceType`` changed.

IAM actions (:data:`IAM_ACTIONS`): ``ec2:DescribeLaunchTemplateVersions``, ``ec2:CreateLaunchTemplateVersion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.domain.errors import PermanentError

if TYPE_CHECKING:
    from mypy_boto3_ec2.client import EC2Client

__all__ = ["IAM_ACTIONS", "LaunchTemplates"]

#: The AWS actions this module calls (IAM ``service:Action``); ``tests/integration/test_iam_replace.py`` checks it.
IAM_ACTIONS: Final = frozenset({"ec2:DescribeLaunchTemplateVersions", "ec2:CreateLaunchTemplateVersion"})


class LaunchTemplates:
    """``LaunchTemplateVersions`` (``rightsizer.ports``) over EC2.

    Args:
        ec2: an EC2 client (standard retries), built by the wiring.
    """

    def __init__(self, ec2: EC2Client) -> None:
        self._ec2 = ec2

    def instance_type(self, template_id: str, version: str) -> str | None:
        """``InstanceType`` of the version (EC2 ``DescribeLaunchTemplateVersions``); None when it names none.

        Raises:
            PermanentError: no such version; AWS refusals.
        """
        with aws_errors("DescribeLaunchTemplateVersions"):
            answer = self._ec2.describe_launch_template_versions(
                LaunchTemplateId=template_id, Versions=[version]
            )
        versions = answer.get("LaunchTemplateVersions") or []
        if not versions:
            raise PermanentError(f"launch template {template_id} has no version {version}")
        value = (versions[0].get("LaunchTemplateData") or {}).get("InstanceType")
        return str(value) if value else None

    def new_version(self, template_id: str, source_version: str, instance_type: str) -> str:
        """EC2 ``CreateLaunchTemplateVersion`` from ``source_version`` with ``InstanceType`` replaced; returns
        the new version number."""
        with aws_errors("CreateLaunchTemplateVersion"):
            answer = self._ec2.create_launch_template_version(
                LaunchTemplateId=template_id,
                SourceVersion=source_version,
                VersionDescription=f"rightsizer: {instance_type}",
                LaunchTemplateData={"InstanceType": instance_type},  # type: ignore[typeddict-item]
            )
        return str(answer["LaunchTemplateVersion"]["VersionNumber"])
