"""AWS calls moto 5.2.5 does not implement, added to its in-process backend with AWS's semantics (tests and
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
- EKS ``UpdateNodegroupConfig`` ``warmPoolConfig`` (botocore EKS model 2017-11-01, shape
  ``WarmPoolConfig``): moto drops it. Here it is stored on the node group (a field left out of an update
  keeps its value, as the model documents), answered by ``DescribeNodegroup`` as ``warmPoolConfig``, and
  mirrored onto the node group's Auto Scaling group as its warm pool (``PutWarmPool``: poolState
  ``STOPPED`` → ``Stopped``, ``reuseOnScaleIn`` → ``InstanceReusePolicy.ReuseOnScaleIn``), as EKS manages
  the group's warm pool. ``enabled: false`` deletes the ASG's warm pool.
- Auto Scaling ``DescribeWarmPool`` ``Instances``: moto answers none. :func:`seed_warm_instance` puts an
  instance in a group's warm pool (``LifecycleState`` ``Warmed:Stopped``, its launch template id and
  version), and ``DescribeWarmPool`` lists it.

:func:`install` patches moto's classes once per process; moto's server runs in this process
(``ThreadedMotoServer``), so every client of the server sees the call.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["install", "place_in_reservation", "seed_warm_instance"]

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
        _install_warm_pools()
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


_POOL_STATES = {"STOPPED": "Stopped", "RUNNING": "Running", "HIBERNATED": "Hibernated"}


def _warm_instances(pool: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] | None = getattr(pool, "_rightsizer_instances", None)
    if found is None:
        found = []
        pool._rightsizer_instances = found
    return found


def seed_warm_instance(
    region: str, asg_name: str, instance_id: str, template_id: str, version: str, *, account: str = ""
) -> None:
    """Put ``instance_id`` (launched from ``template_id`` version ``version``) in ``asg_name``'s warm pool
    as ``Warmed:Stopped`` (the group must have a warm pool)."""
    from moto.autoscaling.models import autoscaling_backends
    from moto.core.models import DEFAULT_ACCOUNT_ID

    backend = autoscaling_backends[account or DEFAULT_ACCOUNT_ID][region]
    pool = backend.describe_warm_pool(group_name=asg_name)
    if pool is None:
        raise ValueError(f"{asg_name} has no warm pool")
    _warm_instances(pool).append(
        {
            "InstanceId": instance_id,
            "LifecycleState": "Warmed:Stopped",
            "HealthStatus": "Healthy",
            "LaunchTemplate": {"LaunchTemplateId": template_id, "Version": version},
        }
    )


def _install_warm_pools() -> None:
    from moto.autoscaling.models import autoscaling_backends
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.core.responses import ActionResult
    from moto.eks.responses import EKSResponse

    original_update = EKSResponse.update_nodegroup_config

    def update_nodegroup_config(self: Any) -> Any:
        wanted = self._get_param("warmPoolConfig")
        if wanted is None:
            return original_update(self)
        cluster = self.eks_backend.clusters[self._get_param("name")]
        nodegroup = cluster.nodegroups[self._get_param("nodegroupName")]
        current = dict(getattr(nodegroup, "warm_pool_config", None) or {})
        current.update({k: v for k, v in wanted.items() if v is not None})
        nodegroup.warm_pool_config = current
        backend = autoscaling_backends[self.current_account][self.region]
        for group in (g["name"] for g in nodegroup.resources.get("autoScalingGroups", [])):
            if group not in backend.autoscaling_groups:
                continue
            if current.get("enabled") is False:
                backend.delete_warm_pool(group_name=group)
                continue
            backend.put_warm_pool(
                group_name=group,
                max_group_prepared_capacity=current.get("maxGroupPreparedCapacity"),
                min_size=current.get("minSize"),
                pool_state=_POOL_STATES.get(str(current.get("poolState", "STOPPED")), "Stopped"),
                instance_reuse_policy={"ReuseOnScaleIn": bool(current.get("reuseOnScaleIn", False))},
            )
        result = original_update(self)
        return result if result is not None else ActionResult({})

    def describe_warm_pool(self: Any) -> Any:
        group_name = self._get_param("AutoScalingGroupName")
        pool = self.autoscaling_backend.describe_warm_pool(group_name=group_name)
        instances = list(_warm_instances(pool)) if pool is not None else []
        return ActionResult({"WarmPoolConfiguration": pool, "Instances": instances})

    EKSResponse.update_nodegroup_config = update_nodegroup_config  # type: ignore[method-assign]
    AutoScalingResponse.describe_warm_pool = describe_warm_pool  # type: ignore[method-assign]
