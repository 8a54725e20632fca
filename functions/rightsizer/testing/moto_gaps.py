"""EC2 calls moto 5.2.5 does not implement, added to its in-process backend with EC2's semantics (tests and
the demo only; docs/architecture.md §7).

- ``DeleteLaunchTemplateVersions`` (EC2 API reference, ``DeleteLaunchTemplateVersions``): deletes the
  listed versions of one template; each version is reported in ``SuccessfullyDeletedLaunchTemplateVersions``
  or in ``UnsuccessfullyDeletedLaunchTemplateVersions`` with a ``ResponseError`` code —
  ``launchTemplateVersionDoesNotExist`` for an unknown or already deleted version, ``unexpectedError`` for
  the default version (EC2 never deletes the default version). The remaining versions keep their
  numbers; a deleted one is gone from ``DescribeLaunchTemplateVersions`` (listing) and asking for it by
  number answers ``InvalidLaunchTemplateId.VersionNotFound``, as for a version that never existed.

:func:`install` patches moto's classes once per process; moto's server runs in this process
(``ThreadedMotoServer``), so every client of the server sees the call.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["install"]

_lock = threading.Lock()
_installed = False


def _deleted(template: Any) -> set[int]:
    found: set[int] | None = getattr(template, "_rightsizer_deleted_versions", None)
    if found is None:
        found = set()
        template._rightsizer_deleted_versions = found
    return found


def install() -> None:
    """Add ``DeleteLaunchTemplateVersions`` to moto's EC2 (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from moto.core.responses import ActionResult
        from moto.ec2.exceptions import InvalidLaunchTemplateVersionNotFound
        from moto.ec2.models.launch_templates import LaunchTemplate, LaunchTemplateBackend
        from moto.ec2.responses.launch_templates import LaunchTemplates

        original_get = LaunchTemplate.get_version
        original_describe = LaunchTemplateBackend.describe_launch_template_versions

        def get_version(self: Any, num: Any) -> Any:
            if str(num).isdigit() and int(num) in _deleted(self):
                raise InvalidLaunchTemplateVersionNotFound(template_id=self.id, version=num)
            return original_get(self, num)

        def describe(self: Any, *args: Any, **kwargs: Any) -> Any:
            found = original_describe(self, *args, **kwargs)
            return [(t, v) for t, v in found if v.number not in _deleted(t)]

        def delete_launch_template_versions(self: Any) -> Any:
            name = self._get_param("LaunchTemplateName")
            template_id = self._get_param("LaunchTemplateId")
            versions = [str(v) for v in self._get_param("Versions", [])]
            self.error_on_dryrun()
            backend = self.ec2_backend
            template = (
                backend.get_launch_template_by_name(name)
                if name
                else backend.get_launch_template(template_id)
            )
            gone, refused = [], []
            for v in versions:
                number = int(v) if v.isdigit() else 0
                item = {
                    "LaunchTemplateId": template.id,
                    "LaunchTemplateName": template.name,
                    "VersionNumber": number,
                }
                if number < 1 or number > len(template.versions) or number in _deleted(template):
                    error = {
                        "Code": "launchTemplateVersionDoesNotExist",
                        "Message": f"version {v} does not exist",
                    }
                    refused.append({**item, "ResponseError": error})
                elif number == template.default_version_number:
                    error = {"Code": "unexpectedError", "Message": "Cannot delete the default version"}
                    refused.append({**item, "ResponseError": error})
                else:
                    _deleted(template).add(number)
                    gone.append(item)
            return ActionResult(
                {
                    "SuccessfullyDeletedLaunchTemplateVersions": gone,
                    "UnsuccessfullyDeletedLaunchTemplateVersions": refused,
                }
            )

        LaunchTemplate.get_version = get_version  # type: ignore[method-assign]
        LaunchTemplateBackend.describe_launch_template_versions = describe  # type: ignore[method-assign]
        LaunchTemplates.delete_launch_template_versions = delete_launch_template_versions  # type: ignore[attr-defined]
        _installed = True
