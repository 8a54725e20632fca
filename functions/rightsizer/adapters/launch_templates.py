"""EC2 launch templates: the ``LaunchTemplateVersions`` port (docs/architecture.md §4 "Node group replacement").

A managed node group whose launch template names an instance type cannot be given another type through
``CreateNodegroup`` (EKS refuses ``instanceTypes`` beside it): the replacement gets a new version of the same
template with only ``InstanceType`` changed.

A replacement that rolls back deletes the version it created (``DeleteLaunchTemplateVersions``): the old group
still runs its own version, and nothing else was given ours.

Only a template that opted in carries writes (issue 26): the drain role may create or delete versions of
launch templates tagged ``rightsizer.io/enabled=true`` alone (``template.yaml``
``ReplaceLaunchTemplateVersions``), and :meth:`LaunchTemplates.new_version` reads the tag first, so an
untagged template is refused by name before anything is written, not by an AccessDenied. The version it
creates changes ``InstanceType`` only (IAM has no condition key for a launch template's data; the code is
the bound, ``tests/integration/test_iam_replace.py`` checks the request).

IAM actions (:data:`IAM_ACTIONS`): ``ec2:DescribeLaunchTemplateVersions``, ``ec2:DescribeLaunchTemplates``,
``ec2:CreateLaunchTemplateVersion``, ``ec2:DeleteLaunchTemplateVersions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.model import TAG_ENABLED

if TYPE_CHECKING:
    from mypy_boto3_ec2.client import EC2Client

__all__ = ["IAM_ACTIONS", "LaunchTemplates"]

#: The AWS actions this module calls (IAM ``service:Action``); ``tests/integration/test_iam_replace.py`` checks it.
IAM_ACTIONS: Final = frozenset(
    {
        "ec2:DescribeLaunchTemplateVersions",
        "ec2:DescribeLaunchTemplates",
        "ec2:CreateLaunchTemplateVersion",
        "ec2:DeleteLaunchTemplateVersions",
    }
)
#: DeleteLaunchTemplateVersions error codes that mean the version is already gone (a retried rollback).
_GONE: Final = frozenset({"launchTemplateVersionDoesNotExist", "launchTemplateIdDoesNotExist"})


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
        the new version number.

        Raises:
            PermanentError: the template does not carry ``rightsizer.io/enabled=true`` (EC2
                ``DescribeLaunchTemplates``; nothing is written); AWS refusals.
        """
        with aws_errors("DescribeLaunchTemplates"):
            found = self._ec2.describe_launch_templates(LaunchTemplateIds=[template_id]).get(
                "LaunchTemplates"
            )
        tags = {t.get("Key"): t.get("Value") for t in (found or [{}])[0].get("Tags") or []}
        if tags.get(TAG_ENABLED) != "true":
            raise PermanentError(
                f"launch template {template_id} is not opted in: tag it {TAG_ENABLED}=true to let the "
                "replacement add a version with another instance type"
            )
        with aws_errors("CreateLaunchTemplateVersion"):
            answer = self._ec2.create_launch_template_version(
                LaunchTemplateId=template_id,
                SourceVersion=source_version,
                VersionDescription=f"rightsizer: {instance_type}",
                LaunchTemplateData={"InstanceType": instance_type},  # type: ignore[typeddict-item]
            )
        return str(answer["LaunchTemplateVersion"]["VersionNumber"])

    def delete_version(self, template_id: str, version: str) -> bool:
        """EC2 ``DeleteLaunchTemplateVersions`` of one version (one a rolled-back replacement created).

        Returns:
            True when deleted now; False when it was already gone (a retried rollback).

        Raises:
            PermanentError: EC2 refused it for another reason (the default version is never deleted, and ours
                never is the default; a malformed id); access denied.
        """
        with aws_errors("DeleteLaunchTemplateVersions"):
            answer = self._ec2.delete_launch_template_versions(
                LaunchTemplateId=template_id, Versions=[version]
            )
        if answer.get("SuccessfullyDeletedLaunchTemplateVersions"):
            return True
        for failure in answer.get("UnsuccessfullyDeletedLaunchTemplateVersions") or []:
            code = str((failure.get("ResponseError") or {}).get("Code", ""))
            if code in _GONE:
                return False
            raise PermanentError(
                f"launch template {template_id} version {version} not deleted: {code} "
                f"{(failure.get('ResponseError') or {}).get('Message', '')}".rstrip()
            )
        return False
