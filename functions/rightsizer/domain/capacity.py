"""Scarce capacity (issue 28): reservations kept, warm floors, interruption notices — pure, no I/O.

- **Reserved capacity.** An instance in an On-Demand Capacity Reservation or a Capacity Block is paid for
  whether it runs or not: removing it saves nothing and frees the slot for any matching launch in the
  account. Sources: EC2 DescribeInstances ``CapacityReservationId`` and ``InstanceLifecycle=capacity-block``;
  the Node labels Karpenter sets (``karpenter.sh/capacity-type=reserved``,
  ``karpenter.k8s.aws/capacity-reservation-id`` / ``-type``) and EKS's ``eks.amazonaws.com/capacityType=
  CAPACITY_BLOCK``. Kept by default (``capacity_reserved:<kind>:<id>``, a protection); policy
  ``release_reserved_capacity: true`` lets it go (``reservation_released:<kind>:<id>``, a note, still no
  savings). A Capacity Block's end (DescribeCapacityReservations ``EndDate``) is shown
  (``capacity_block_ends:<t>``): AWS terminates its instances 30 min before it.
- **Warm floor.** ``Policy.warm_floor`` maps an instance type or family to the nodes of that type a node
  group keeps (default 1 for p4d/p5-class types). Recent InsufficientInstanceCapacity evidence — a failed
  launch in the last 24 h (Auto Scaling DescribeScalingActivities) or an EKS node group health issue —
  raises it by one (``warm_floor:<type>:<n>:ice:<source>``).
- **Interruption notices.** A node the AWS Node Termination Handler or Karpenter is about to take away
  (their taints), or whose instance has a scheduled EC2 event (DescribeInstanceStatus), is left to them:
  ``spot_interruption:<signal>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from rightsizer.domain.model import AsgInfo, CapacityReservation, Ec2Instance, Node

__all__ = [
    "ICE_LOOKBACK",
    "INTERRUPTION_TAINTS",
    "Reservation",
    "ReservationUse",
    "family_keys",
    "ice_evidence",
    "interruption_signals",
    "reservation_of",
    "reservation_reasons",
    "reservation_use",
    "reserved_kept",
    "warm_floor_of",
    "warm_floor_reason",
]

#: Karpenter (AWS provider ≥ 1.3) labels of a node launched into a capacity reservation.
KARPENTER_CAPACITY_TYPE: Final = "karpenter.sh/capacity-type"
KARPENTER_RESERVATION_ID: Final = "karpenter.k8s.aws/capacity-reservation-id"
KARPENTER_RESERVATION_TYPE: Final = "karpenter.k8s.aws/capacity-reservation-type"
#: EKS managed node groups label their nodes with the group's capacity type (``CAPACITY_BLOCK`` for blocks).
EKS_CAPACITY_TYPE: Final = "eks.amazonaws.com/capacityType"

#: How far back a failed launch for InsufficientInstanceCapacity raises a warm floor.
ICE_LOOKBACK: Final = timedelta(hours=24)
#: EKS node group health issue codes that mean the group could not get instances
#: (DescribeNodegroup ``health.issues[].code``).
ICE_ISSUE_CODES: Final = frozenset({"AsgInstanceLaunchFailures", "InsufficientCapacity"})

#: Taints that announce the node is being taken away, and the signal each one names: the AWS Node
#: Termination Handler's (``TAINT_NODE``, aws/aws-node-termination-handler README and
#: ``pkg/node/node.go``) and Karpenter's disruption taint of v0.32–v0.37 (v1's ``karpenter.sh/disrupted``
#: is already ``other_autoscaler``).
INTERRUPTION_TAINTS: Final[Mapping[str, str]] = {
    "aws-node-termination-handler/spot-itn": "spot_itn",
    "aws-node-termination-handler/rebalance-recommendation": "rebalance_recommendation",
    "aws-node-termination-handler/scheduled-maintenance": "scheduled_maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination": "asg_lifecycle_termination",
    "karpenter.sh/disruption": "karpenter_disruption",
}

ReservationKind = Literal["odcr", "capacity_block"]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The reservation a node's instance runs in: ``kind`` and id (``unknown`` when only a label says so)."""

    kind: ReservationKind
    reservation_id: str

    @property
    def detail(self) -> str:
        """``<kind>:<id>``, the detail of the reservation reasons."""
        return f"{self.kind}:{self.reservation_id}"


def reservation_of(node: Node, instance: Ec2Instance | None) -> Reservation | None:
    """The capacity reservation ``node`` runs in, or None for on-demand and spot capacity.

    EC2 (DescribeInstances) decides when it is known; the Node's labels (Karpenter, EKS) otherwise.
    """
    labels = node.labels
    block = (
        (instance is not None and instance.lifecycle == "capacity-block")
        or labels.get(KARPENTER_RESERVATION_TYPE) == "capacity-block"
        or labels.get(EKS_CAPACITY_TYPE, "").upper() == "CAPACITY_BLOCK"
    )
    kind: ReservationKind = "capacity_block" if block else "odcr"
    if instance is not None and instance.capacity_reservation_id:
        return Reservation(kind, instance.capacity_reservation_id)
    label_id = labels.get(KARPENTER_RESERVATION_ID)
    if block or label_id or labels.get(KARPENTER_CAPACITY_TYPE) == "reserved":
        return Reservation(kind, label_id or "unknown")
    return None


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def reservation_reasons(
    found: Reservation | None, release: bool, reservations: Mapping[str, CapacityReservation]
) -> list[str]:
    """The reasons of a node in reservation ``found``: kept (``capacity_reserved:<kind>:<id>``, a
    protection) unless ``release`` (policy ``release_reserved_capacity``: ``reservation_released:…``, a
    note); a reservation with an end date adds ``capacity_block_ends:<RFC 3339>``."""
    if found is None:
        return []
    code = "reservation_released" if release else "capacity_reserved"
    reasons = [f"{code}:{found.detail}"]
    known = reservations.get(found.reservation_id)
    if known is not None and known.end is not None:
        reasons.append(f"capacity_block_ends:{_rfc3339(known.end)}")
    return reasons


def reserved_kept(reasons: Iterable[str]) -> str | None:
    """The ``<kind>:<id>`` of a node's reservation, kept or released, or None (no savings either way)."""
    for reason in reasons:
        code, _, detail = reason.partition(":")
        if code in ("capacity_reserved", "reservation_released"):
            return detail
    return None


def family_keys(instance_type: str) -> tuple[str, ...]:
    """Keys a warm floor may be given under, most specific first: ``p6-b200.48xlarge`` →
    (``p6-b200.48xlarge``, ``p6-b200``, ``p6``); ``p5.48xlarge`` → (``p5.48xlarge``, ``p5``)."""
    family = instance_type.split(".", 1)[0]
    keys = [instance_type, family]
    if "-" in family:
        keys.append(family.split("-", 1)[0])
    return tuple(dict.fromkeys(k for k in keys if k))


def warm_floor_of(floors: Mapping[str, int], instance_type: str | None) -> int:
    """The policy's warm floor for ``instance_type`` (first key of :func:`family_keys` present), else 0."""
    if not instance_type:
        return 0
    for key in family_keys(instance_type):
        if key in floors:
            return floors[key]
    return 0


def ice_evidence(group: AsgInfo, at: datetime) -> str | None:
    """Why ``group`` is short of capacity now, or None: ``scaling_activity`` (a launch failed for
    InsufficientInstanceCapacity within ``ICE_LOOKBACK`` before ``at``), ``nodegroup_health:<code>``."""
    if any(at - ICE_LOOKBACK <= t <= at for t in group.capacity_failures):
        return "scaling_activity"
    for code in group.nodegroup_issues:
        if code in ICE_ISSUE_CODES:
            return f"nodegroup_health:{code}"
    return None


def warm_floor_reason(instance_type: str, floor: int, evidence: str | None) -> str:
    """``warm_floor:<type>:<n>``, with ``:ice:<evidence>`` when the evidence raised it."""
    return f"warm_floor:{instance_type}:{floor}" + (f":ice:{evidence}" if evidence else "")


def interruption_signals(node: Node, instance: Ec2Instance | None) -> list[str]:
    """``spot_interruption:<signal>`` for each notice that the node is being taken away: an interruption
    handler's taint (:data:`INTERRUPTION_TAINTS`) or a scheduled EC2 event of its instance
    (DescribeInstanceStatus ``Events[].Code``, e.g. ``instance-retirement``)."""
    found = [
        f"spot_interruption:{INTERRUPTION_TAINTS[t.key]}"
        for t in node.spec.taints
        if t.key in INTERRUPTION_TAINTS
    ]
    if instance is not None:
        found.extend(f"spot_interruption:ec2_event:{code}" for code in instance.events)
    return found


@dataclass(frozen=True, slots=True)
class ReservationUse:
    """What one capacity reservation costs while unused (plan and ``status``; USD per hour).

    ``idle_nodes`` are the reservation's GPU nodes judged idle (or kept idle by the reservation);
    ``available`` the reservation's empty slots (DescribeCapacityReservations ``AvailableInstanceCount``,
    0 when unknown); ``unused_usd_per_hour`` = (idle nodes + empty slots) × the type's on-demand price,
    None when unpriced; ``advice`` what to do about it.
    """

    reservation_id: str
    kind: str
    instance_type: str | None
    idle_nodes: tuple[str, ...]
    available: int
    unused_usd_per_hour: float | None
    end: str | None
    advice: str


def reservation_use(
    members: Sequence[tuple[str, str, str | None, bool, float | None]],
    reservations: Mapping[str, CapacityReservation],
) -> list[ReservationUse]:
    """Per reservation, its unused cost and advice.

    Args:
        members: (node, ``<kind>:<id>``, instance type, idle, USD/h on demand) of every GPU node in a
            reservation.
        reservations: DescribeCapacityReservations by id (may lack some).

    Returns:
        One :class:`ReservationUse` per reservation id, sorted by unused cost (highest first), then id.
    """
    grouped: dict[str, list[tuple[str, str, str | None, bool, float | None]]] = {}
    for member in members:
        grouped.setdefault(member[1], []).append(member)
    out: list[ReservationUse] = []
    for detail, nodes in grouped.items():
        kind, _, rid = detail.partition(":")
        known = reservations.get(rid)
        itype = known.instance_type if known is not None else nodes[0][2]
        idle = tuple(sorted(n[0] for n in nodes if n[3]))
        available = known.available if known is not None else 0
        price = next((n[4] for n in nodes if n[4] is not None), None)
        unused = None if price is None else price * (len(idle) + available)
        end = _rfc3339(known.end) if known is not None and known.end is not None else None
        out.append(
            ReservationUse(
                rid, kind, itype, idle, available, unused, end, _advice(kind, idle, available, end)
            )
        )
    return sorted(out, key=lambda u: (-(u.unused_usd_per_hour or 0.0), u.reservation_id))


def _advice(kind: str, idle: tuple[str, ...], available: int, end: str | None) -> str:
    unused = len(idle) + available
    if unused == 0:
        return "fully used"
    if kind == "capacity_block":
        return (
            f"{unused} slot(s) unused; a Capacity Block cannot be cancelled or shrunk: move work onto it"
            + (f" before it ends at {end}" if end else "")
        )
    return (
        f"{unused} slot(s) unused: shrink the reservation by {unused} (ModifyCapacityReservation "
        "InstanceCount) or cancel it (CancelCapacityReservation) if the capacity is not needed"
    )
