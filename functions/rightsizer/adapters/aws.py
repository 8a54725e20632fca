"""AWS clients and the AWS inventory: the read-only half of the snapshot (docs/architecture.md §5
``nodegroups.json`` / ``instances.json``), the ``NodeGroupInventory`` port.

The AWS adapters, one per capability (docs/architecture.md §2 "Parts"):

- this module — :func:`make_clients` and :class:`AwsInventory` (EKS, Auto Scaling and EC2 reads, in
  the snapshot's shapes);
- :mod:`rightsizer.adapters.autoscaling` — ``NodeScaler``: membership, sizes, targeted scale-in,
  scaling activities;
- :mod:`rightsizer.adapters.eks_nodegroups` — ``NodeGroupSizer``: managed node group listing and sizing;
- :mod:`rightsizer.adapters.ec2_resize` — ``InstanceTypeChanger``: a standalone instance's type change;
- :mod:`rightsizer.adapters.aws_errors` — the error taxonomy every one of them raises, by AWS error
  ``Code`` (never by message text).

Each module declares the IAM actions it calls in ``IAM_ACTIONS``; ``tests/integration/test_iam.py``
holds them to the calls. This one: ``eks:ListNodegroups``, ``eks:DescribeNodegroup``,
``autoscaling:DescribeAutoScalingInstances``, ``autoscaling:DescribeAutoScalingGroups``,
``autoscaling:DescribeScalingActivities``, ``ec2:DescribeInstances``, ``ec2:DescribeSpotPriceHistory``,
``ec2:DescribeInstanceStatus``, ``ec2:DescribeCapacityReservations``.

Clients are built once per cold start by :func:`make_clients` (or by the wiring) and passed in; no
adapter builds a client behind the caller's back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config

from rightsizer.adapters.aws_errors import aws_errors
from rightsizer.domain.errors import StalePlan

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_eks.client import EKSClient

    from rightsizer.adapters.pricing import PriceListPrices

__all__ = [
    "ASG_BATCH",
    "AwsClients",
    "AwsInventory",
    "json_safe",
    "make_client",
    "make_clients",
    "shared_models_session",
    "unique",
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
        "eks:ListNodegroups",
        "eks:DescribeNodegroup",
        "ec2:DescribeInstances",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeInstanceStatus",
        "ec2:DescribeCapacityReservations",
    }
)
#: The text Auto Scaling puts in a failed launch's ``StatusMessage`` when EC2 had no capacity.
ICE_CODE: Final = "InsufficientInstanceCapacity"
#: Failed capacity launches kept per group (newest first): a floor needs one within 24 h.
ICE_KEPT: Final = 5

# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsClients:
    """The three SDK clients this adapter uses, all for one region."""

    ec2: EC2Client
    eks: EKSClient
    autoscaling: AutoScalingClient


_MODELS: list[Any] = []  # the first session's data loader, shared: service models load once per process


def shared_models_session(region: str | None = None, **credentials: str) -> boto3.session.Session:
    """A new boto3 session — its own credentials, resolved as a fresh session resolves them — that shares
    the process's loaded service models and endpoint data (botocore's ``data_loader``).

    A fresh session reads and parses each service's JSON model and ``endpoints.json`` again: 0.1-0.8 s of
    CPU per client, paid by every client of a cold start when each is built from its own session
    (issue 33: nine clients, 1.2 s → 0.4 s of CPU on python3.12). Only the immutable loaded data is
    shared; credentials, configuration and event hooks stay per session.
    """
    import botocore.session

    core = botocore.session.get_session()
    if _MODELS:
        core.register_component("data_loader", _MODELS[0])
    else:
        _MODELS.append(core.get_component("data_loader"))
    return boto3.session.Session(botocore_session=core, region_name=region, **credentials)


def make_client(
    service: str,
    region: str,
    endpoint_url: str | None = None,
    *,
    session: boto3.session.Session | None = None,
    config: Config | None = None,
) -> Any:
    """One AWS SDK client for ``service`` (``"dynamodb"``, ``"stepfunctions"`` …) with standard retries (5
    attempts): the one place every AWS client of the product is built.

    Args:
        service: the boto3 service name.
        region: AWS region name, e.g. ``us-east-1``.
        endpoint_url: override (a moto server in tests and the demo); ``None`` = AWS.
        session: a boto3 session to build from; by default a new one sharing the process's loaded
            service models (:func:`shared_models_session`).
        config: botocore settings merged over the standard retries (e.g. shorter timeouts).
    """
    session = session or shared_models_session(region)
    return session.client(
        service,  # type: ignore[call-overload]
        region_name=region,
        endpoint_url=endpoint_url,
        config=_RETRY_CONFIG.merge(config) if config is not None else _RETRY_CONFIG,
    )


def make_clients(
    region: str, endpoint_url: str | None = None, *, session: boto3.session.Session | None = None
) -> AwsClients:
    """Build EC2, EKS and Auto Scaling clients (:func:`make_client`) from one session."""
    session = session or shared_models_session(region)
    return AwsClients(
        ec2=make_client("ec2", region, endpoint_url, session=session),
        eks=make_client("eks", region, endpoint_url, session=session),
        autoscaling=make_client("autoscaling", region, endpoint_url, session=session),
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


def unique(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in first-seen order (AWS filters and id lists refuse duplicates)."""
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------------------------------


class AwsInventory:
    """Reads node group, Auto Scaling and EC2 state in the snapshot's shapes (docs/architecture.md §5)."""

    def __init__(
        self, clients: AwsClients, *, activity_pages: int = 2, prices: PriceListPrices | None = None
    ) -> None:
        """Args: clients; activity_pages: DescribeScalingActivities pages read per ASG (newest first);
        prices: the region's on-demand prices (Price List Query API, cached), None to carry none."""
        self._ec2 = clients.ec2
        self._eks = clients.eks
        self._asg = clients.autoscaling
        self._activity_pages = activity_pages
        self._prices = prices

    def describe(self, instance_ids: Sequence[str], cluster: str) -> dict[str, Any]:
        """Return the ``nodegroups.json`` document for a cluster and the nodes' instance ids.

        Calls EKS ListNodegroups + DescribeNodegroup (every managed node group of ``cluster``),
        DescribeAutoScalingInstances (``instance_ids`` in batches of 50), DescribeAutoScalingGroups
        (every group named by either) and DescribeScalingActivities (newest successful launch, and the
        launches that failed for InsufficientInstanceCapacity: issue 28's warm floor evidence).

        Returns:
            ``{"nodegroups": [DescribeNodegroup .nodegroup], "autoScalingGroups": [ASG],
            "autoScalingInstances": [instance], "launchActivities": {asg_name: RFC 3339},
            "capacityFailures": {asg_name: [RFC 3339, newest first]}}``; the first three exactly as AWS
            returns them (datetimes as RFC 3339 strings; a node group's ``health.issues`` and
            ``nodeRepairConfig`` included). An instance id missing from ``autoScalingInstances`` is known
            to be standalone.
        """
        nodegroups = self._nodegroups(cluster)
        asg_instances = self._asg_instances(unique(instance_ids))
        names = [
            str(group["name"])
            for ng in nodegroups
            for group in ng.get("resources", {}).get("autoScalingGroups", [])
            if group.get("name")
        ]
        names += [str(item["AutoScalingGroupName"]) for item in asg_instances]
        groups = self._groups(unique(names))
        launches: dict[str, str] = {}
        failures: dict[str, list[str]] = {}
        for group in groups:
            name = str(group["AutoScalingGroupName"])
            started, ice = self._activities(name)
            if started is not None:
                launches[name] = started
            if ice:
                failures[name] = ice
        return {
            "nodegroups": json_safe(nodegroups),
            "autoScalingGroups": json_safe(groups),
            "autoScalingInstances": json_safe(asg_instances),
            "launchActivities": launches,
            "capacityFailures": failures,
        }

    def describe_instances(self, instance_ids: Sequence[str]) -> dict[str, Any]:
        """Return the ``instances.json`` document for these instance ids.

        Calls EC2 DescribeInstances with an ``instance-id`` filter, paginated, so that an id that no
        longer exists is simply absent instead of failing the whole call (``InvalidInstanceID.NotFound``);
        then, when any is a spot instance (``InstanceLifecycle == "spot"``), DescribeSpotPriceHistory for
        their types and zones (``Linux/UNIX``, the price in effect now); and, with a price source, the
        region's on-demand prices (``rightsizer.adapters.pricing``: Price List Query API GetProducts,
        cached for hours; never raises, a failure is recorded in the document).

        Also DescribeInstanceStatus (``IncludeAllInstances``: the scheduled events of each instance, an
        interruption notice the drain yields to) and DescribeCapacityReservations of the reservations the
        instances run in (type, counts, ``EndDate``: issue 28).

        Returns:
            ``{"Reservations": [...], "SpotPriceHistory": [...], "InstanceStatuses": [...],
            "CapacityReservations": [...], "OnDemandPrices": {...}}``, AWS's shapes (datetimes as RFC 3339
            strings); ``SpotPriceHistory`` is empty without spot instances; ``OnDemandPrices``
            (``PriceBook.document``) only with a price source.
        """
        reservations: list[Any] = []
        paginator = self._ec2.get_paginator("describe_instances")
        for batch in _batches(unique(instance_ids), EC2_BATCH):
            with aws_errors("DescribeInstances"):
                for page in paginator.paginate(Filters=[{"Name": "instance-id", "Values": batch}]):
                    reservations.extend(page.get("Reservations", []))
        instances = [i for r in reservations for i in r.get("Instances", [])]
        spot = [i for i in instances if i.get("InstanceLifecycle") == "spot"]
        reserved = unique(
            str(i["CapacityReservationId"]) for i in instances if i.get("CapacityReservationId")
        )
        document: dict[str, Any] = {
            "Reservations": json_safe(reservations),
            "SpotPriceHistory": json_safe(self._spot_prices(spot)),
            "InstanceStatuses": json_safe(self._statuses([str(i["InstanceId"]) for i in instances])),
            "CapacityReservations": json_safe(self._reservations(reserved)),
        }
        if self._prices is not None:
            document["OnDemandPrices"] = self._prices.document()
        return document

    def _statuses(self, instance_ids: Sequence[str]) -> list[Mapping[str, Any]]:
        statuses: list[Mapping[str, Any]] = []
        paginator = self._ec2.get_paginator("describe_instance_status")
        for batch in _batches(unique(instance_ids), EC2_BATCH):
            with aws_errors("DescribeInstanceStatus"):
                for page in paginator.paginate(InstanceIds=batch, IncludeAllInstances=True):
                    statuses.extend(
                        {"InstanceId": s["InstanceId"], "Events": s.get("Events", [])}
                        for s in page.get("InstanceStatuses", [])
                    )
        return statuses

    def _reservations(self, reservation_ids: Sequence[str]) -> list[Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = []
        for batch in _batches(reservation_ids, EC2_BATCH):
            with aws_errors("DescribeCapacityReservations"):
                found.extend(
                    self._ec2.describe_capacity_reservations(CapacityReservationIds=batch).get(
                        "CapacityReservations", []
                    )
                )
        return found

    def _spot_prices(self, instances: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        if not instances:
            return []
        types = unique(str(i["InstanceType"]) for i in instances)
        zones = unique(str(i.get("Placement", {}).get("AvailabilityZone", "")) for i in instances)
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

    def _activities(self, asg_name: str) -> tuple[str | None, list[str]]:
        """(newest successful launch, start times of launches that failed for InsufficientInstanceCapacity,
        newest first, at most ``ICE_KEPT``) among the newest ``activity_pages`` pages."""
        paginator = self._asg.get_paginator("describe_scaling_activities")
        pages = paginator.paginate(
            AutoScalingGroupName=asg_name, PaginationConfig={"MaxItems": 100 * self._activity_pages}
        )
        newest: datetime | None = None
        ice: list[datetime] = []
        with aws_errors("DescribeScalingActivities"):
            for page in pages:
                for activity in page.get("Activities", []):
                    # Activities carry no type field; the launch ones are described as "Launching ...".
                    if not str(activity.get("Description", "")).startswith("Launching"):
                        continue
                    started = activity.get("StartTime")
                    if not isinstance(started, datetime):
                        continue
                    if activity.get("StatusCode") == "Successful" and (newest is None or started > newest):
                        newest = started
                    elif activity.get("StatusCode") in ("Failed", "Cancelled") and ICE_CODE in str(
                        activity.get("StatusMessage", "")
                    ):
                        ice.append(started)
        kept = [_rfc3339(t) for t in sorted(ice, reverse=True)[:ICE_KEPT]]
        return (None if newest is None else _rfc3339(newest)), kept
