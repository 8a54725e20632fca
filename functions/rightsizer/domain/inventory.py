"""AWS inventory of a snapshot: Auto Scaling groups, EC2 instances, capacity reservations.

The shapes keep DescribeAutoScalingGroups / DescribeAutoScalingInstances / DescribeNodegroup /
DescribeInstances / DescribeCapacityReservations fields (EC2 and Auto Scaling API references).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from rightsizer.domain.prices import PriceBook


@dataclass(frozen=True, slots=True)
class AsgInfo:
    """An Auto Scaling group (DescribeAutoScalingGroups) and its EKS managed node group, if any.

    Sizes are instance counts; ``instances`` maps instance id → LifecycleState.
    """

    name: str
    min_size: int
    max_size: int
    desired: int
    instances: dict[str, str]
    nodegroup: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    last_launch: datetime | None = None
    capacity_failures: tuple[datetime, ...] = ()
    """Start times of failed launches for InsufficientInstanceCapacity (DescribeScalingActivities)."""
    nodegroup_issues: tuple[str, ...] = ()
    """EKS DescribeNodegroup ``health.issues[].code`` that say the group cannot get capacity."""
    node_repair: bool = False
    """EKS DescribeNodegroup ``nodeRepairConfig.enabled``: EKS replaces the group's unhealthy nodes."""

    @property
    def display_name(self) -> str:
        """The EKS node group name when managed, else the ASG name."""
        return self.nodegroup or self.name


@dataclass(frozen=True, slots=True)
class Ec2Instance:
    """An EC2 instance (DescribeInstances): type, tags, root device type and how it is paid for.

    ``lifecycle`` is DescribeInstances ``InstanceLifecycle`` (``"spot"``, ``"capacity-block"``, ``""`` for
    on-demand); ``capacity_reservation_id`` is set when the instance runs in an On-Demand Capacity
    Reservation or a Capacity Block; ``availability_zone`` is ``Placement.AvailabilityZone``.
    """

    instance_id: str
    instance_type: str
    tags: dict[str, str]
    root_device_type: str
    state: str
    lifecycle: str = ""
    capacity_reservation_id: str | None = None
    availability_zone: str = ""
    events: tuple[str, ...] = ()
    """Scheduled events not yet completed or canceled (DescribeInstanceStatus ``Events[].Code``:
    ``instance-stop``, ``instance-retirement``, ``system-maintenance`` …)."""


@dataclass(frozen=True, slots=True)
class CapacityReservation:
    """An On-Demand Capacity Reservation or Capacity Block (EC2 DescribeCapacityReservations).

    ``kind`` is ``capacity_block`` for ``ReservationType=capacity-block``, else ``odcr``; counts are
    instances; ``end`` is ``EndDate`` (None for an ODCR without an end date); ``state`` is ``State``.
    """

    reservation_id: str
    kind: str
    instance_type: str
    total: int
    available: int
    state: str = "active"
    end: datetime | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """Node group membership from AWS (docs/architecture.md §3 "Node groups").

    ``known`` is False when the snapshot has no ``nodegroups.json`` (every node ⇒ ``node_group_unknown``).
    ``asg_of_instance`` maps instance id → ASG name (DescribeAutoScalingInstances, and the ASGs'
    Instances lists); an instance absent from it is standalone when ``known``. ``spot_prices`` maps (type,
    zone) → USD per hour (DescribeSpotPriceHistory); ``on_demand`` is the region's on-demand price book
    (Price List Query API, or why it could not be read), None when the snapshot carries none.
    """

    known: bool = False
    groups: dict[str, AsgInfo] = field(default_factory=dict)
    asg_of_instance: dict[str, str] = field(default_factory=dict)
    instances: dict[str, Ec2Instance] | None = None
    spot_prices: dict[tuple[str, str], float] = field(default_factory=dict)
    on_demand: PriceBook | None = None
    reservations: dict[str, CapacityReservation] = field(default_factory=dict)
    """Capacity reservations the nodes' instances run in, by id (DescribeCapacityReservations)."""
