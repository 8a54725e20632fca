"""EC2 calls moto 5.2.5 does not implement, added to its in-process backend with EC2's semantics (tests and
the demo only; docs/architecture.md §7).

- ``DeleteLaunchTemplateVersions`` (EC2 API reference, ``DeleteLaunchTemplateVersions``): deletes the
  listed versions of one template; each version is reported in ``SuccessfullyDeletedLaunchTemplateVersions``
  or in ``UnsuccessfullyDeletedLaunchTemplateVersions`` with a ``ResponseError`` code —
  ``launchTemplateVersionDoesNotExist`` for an unknown or already deleted version, ``unexpectedError`` for
  the default version (EC2 never deletes the default version). The remaining versions keep their
  numbers; a deleted one is gone from ``DescribeLaunchTemplateVersions`` (listing) and asking for it by
  number answers ``InvalidLaunchTemplateId.VersionNotFound``, as for a version that never existed.

- Capacity reservations (issue 28): ``CreateCapacityReservation`` (an On-Demand Capacity Reservation:
  ``InstanceType``, ``AvailabilityZone``, ``InstanceCount``, optional ``EndDate``) and
  ``DescribeCapacityReservations`` (by id, or all; ``TotalInstanceCount``, ``AvailableInstanceCount``,
  ``State`` ``active``, ``EndDate``, ``ReservationType`` ``default``), and ``RunInstances`` with
  ``CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId``: each instance
  launched into it takes one available slot and reports ``CapacityReservationId`` in DescribeInstances;
  an unknown id answers ``InvalidCapacityReservationId.NotFound``, a full one
  ``ReservationCapacityExceeded`` (EC2 API reference).

:func:`install` patches moto's classes once per process; moto's server runs in this process
(``ThreadedMotoServer``), so every client of the server sees the call.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["install", "place_in_reservation"]

_lock = threading.Lock()
_installed = False


def _deleted(template: Any) -> set[int]:
    found: set[int] | None = getattr(template, "_rightsizer_deleted_versions", None)
    if found is None:
        found = set()
        template._rightsizer_deleted_versions = found
    return found


def install() -> None:
    """Add ``DeleteLaunchTemplateVersions`` and capacity reservations to moto's EC2 (idempotent)."""
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

        _install_capacity_reservations()
        LaunchTemplate.get_version = get_version  # type: ignore[method-assign]
        LaunchTemplateBackend.describe_launch_template_versions = describe  # type: ignore[method-assign]
        LaunchTemplates.delete_launch_template_versions = delete_launch_template_versions  # type: ignore[attr-defined]
        _installed = True


def _reservations(backend: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] | None = getattr(backend, "_rightsizer_capacity_reservations", None)
    if found is None:
        found = {}
        backend._rightsizer_capacity_reservations = found
    return found


def _install_capacity_reservations() -> None:
    import secrets

    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.instances import InstanceResponse

    original_run = InstanceResponse.run_instances

    def create_capacity_reservation(self: Any) -> Any:
        self.error_on_dryrun()
        count = int(self._get_param("InstanceCount"))
        rid = f"cr-{secrets.token_hex(9)[:17]}"
        item = {
            "CapacityReservationId": rid,
            "OwnerId": self.current_account,
            "InstanceType": self._get_param("InstanceType"),
            "InstancePlatform": self._get_param("InstancePlatform"),
            "AvailabilityZone": self._get_param("AvailabilityZone"),
            "TotalInstanceCount": count,
            "AvailableInstanceCount": count,
            "State": "active",
            "EndDateType": self._get_param("EndDateType") or "unlimited",
            "ReservationType": "default",
        }
        if self._get_param("EndDate"):
            item["EndDate"] = self._get_param("EndDate")
        _reservations(self.ec2_backend)[rid] = item
        return ActionResult({"CapacityReservation": item})

    def describe_capacity_reservations(self: Any) -> Any:
        wanted = self._get_param("CapacityReservationIds", [])
        known = _reservations(self.ec2_backend)
        missing = [r for r in wanted if r not in known]
        if missing:
            raise EC2ClientError(
                "InvalidCapacityReservationId.NotFound",
                f"The capacity reservation ID '{missing[0]}' does not exist",
            )
        return ActionResult({"CapacityReservations": [known[r] for r in (wanted or sorted(known))]})

    def run_instances(self: Any) -> Any:
        target = (self._get_param("CapacityReservationSpecification") or {}).get(
            "CapacityReservationTarget"
        ) or {}
        rid = target.get("CapacityReservationId")
        if not rid:
            return original_run(self)
        item = _reservations(self.ec2_backend).get(rid)
        if item is None:
            raise EC2ClientError(
                "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
            )
        count = int(self._get_param("MinCount", 1))
        if item["AvailableInstanceCount"] < count:
            raise EC2ClientError(
                "ReservationCapacityExceeded", f"capacity reservation {rid} has no available capacity"
            )
        result = original_run(self)
        launched: list[Any] = getattr(result.result, "instances", [])
        for instance in launched:
            instance.capacity_reservation_id = rid
        item["AvailableInstanceCount"] -= len(launched)
        return result

    InstanceResponse.create_capacity_reservation = create_capacity_reservation  # type: ignore[attr-defined]
    InstanceResponse.describe_capacity_reservations = describe_capacity_reservations  # type: ignore[attr-defined]
    InstanceResponse.run_instances = run_instances  # type: ignore[method-assign]


def place_in_reservation(account: str, region: str, instance_id: str, reservation_id: str) -> None:
    """Mark a running instance as launched into capacity reservation ``reservation_id`` (one slot taken),
    as an Auto Scaling launch template targeting it would have launched it: moto's Auto Scaling launches
    ignore ``CapacityReservationSpecification``. The server must run in this process (``install`` first).

    Raises:
        KeyError: an unknown reservation id.
    """
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[account][region]
    item = _reservations(backend)[reservation_id]
    instance: Any = backend.get_instance(instance_id)
    instance.capacity_reservation_id = reservation_id
    item["AvailableInstanceCount"] -= 1
