"""Warm pools for the node groups off-hours takes down (issue 30): what a pool costs and what it buys.

An EKS managed node group's ``warmPoolConfig`` (``UpdateNodegroupConfig``; botocore EKS model
2017-11-01, shape ``WarmPoolConfig``: ``enabled``, ``minSize``, ``maxGroupPreparedCapacity``,
``poolState`` STOPPED | RUNNING | HIBERNATED, ``reuseOnScaleIn``) keeps pre-initialised instances beside
the group. The pool holds ``max(minSize, maxGroupPreparedCapacity − desired)`` instances (EC2 Auto Scaling
warm pools), so with ``maxGroupPreparedCapacity`` = the size off-hours saved, the pool holds exactly the
instances taken down while the group is down and none while it is up.

Prices: EC2 does not bill a stopped instance, only its EBS volumes (gp3 USD 0.08 per GB-month in
us-east-1, https://aws.amazon.com/ebs/pricing/, 730 hours a month); a RUNNING pooled instance bills its
full price. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "EBS_GP3_USD_PER_GB_MONTH",
    "HOURS_PER_MONTH",
    "WARM_STOPPED_RATIO",
    "PoolInputs",
    "PoolRecommendation",
    "PoolState",
    "WarmInstance",
    "WarmPoolGroup",
    "drift",
    "ebs_usd_per_hour",
    "recommend",
    "refusal",
]

#: gp3 storage, USD per GB-month, us-east-1 (https://aws.amazon.com/ebs/pricing/, December 2026).
EBS_GP3_USD_PER_GB_MONTH: Final = 0.08
#: The month AWS prices by (730 hours).
HOURS_PER_MONTH: Final = 730.0
PoolState = Literal["STOPPED", "RUNNING"]


def ebs_usd_per_hour(volume_gb: float) -> float:
    """USD per hour of ``volume_gb`` GB of gp3 (what a stopped pooled instance costs).

    Raises:
        ValueError: a negative size.
    """
    if volume_gb < 0:
        raise ValueError("a volume size cannot be negative")
    return volume_gb * EBS_GP3_USD_PER_GB_MONTH / HOURS_PER_MONTH


#: Warm (STOPPED pool) restore delay ÷ cold, the one published figure: a stopped warm instance rejoined in
#: 1 m 20 s vs 1 m 50 s cold, on non-GPU nodes (issue 30; no figure exists for GPU AMIs). The default
#: until a group's own warm restores are measured.
WARM_STOPPED_RATIO: Final = 80 / 110


@dataclass(frozen=True, slots=True)
class PoolInputs:
    """What a warm pool recommendation weighs for one managed node group.

    Attributes:
        node_group: the EKS managed node group name.
        capacity_type: ``ON_DEMAND`` | ``SPOT`` (``DescribeNodegroup`` ``capacityType``; None = on-demand).
        instance_types: ``instanceTypes`` (more than one = a mixed-instance group).
        ami_type: ``amiType`` (``CUSTOM`` = an AMI of the launch template's, not an EKS-optimised one).
        instances: instances the group holds up (the desired size off-hours saved).
        gpus: GPUs per instance (catalog); hourly_usd: the instance's on-demand price (None = unknown).
        volume_gb: EBS GB per instance (the group's ``diskSize``, else 100).
        instance_store: the type has instance-store NVMe (wiped on stop).
        cold_delay_s / warm_delay_s: restore delay (desired change → serving), measured or assumed.
        down_hours_per_month / restores_per_month: from the group's off-hours schedule.
        price: USD per unserved GPU-minute (``Policy.unserved_gpu_minute_usd``).
    """

    node_group: str
    capacity_type: str | None
    instance_types: tuple[str, ...]
    ami_type: str | None
    instances: int
    gpus: int
    hourly_usd: float | None
    volume_gb: float
    instance_store: bool
    cold_delay_s: float
    warm_delay_s: float
    down_hours_per_month: float
    restores_per_month: float
    price: float


@dataclass(frozen=True, slots=True)
class PoolRecommendation:
    """A ``warmPoolConfig`` for one group, or why none.

    ``config`` is the EKS ``warmPoolConfig`` to set (None = none recommended); ``refusal`` why a pool
    cannot be set at all (``spot_capacity``, ``mixed_instance_types``, ``custom_ami``) — EKS warm pools
    need an EKS-optimised AMI and one on-demand instance type; ``usd_per_month`` what the pool costs;
    ``unserved_gpu_minutes_cold`` / ``_warm`` per month if work waits at every restore (an upper bound);
    ``value_usd_per_month`` those minutes' difference at ``price`` minus the pool's cost; ``notes``
    caveats (instance-store data wiped on stop, a stopped instance may not start under
    InsufficientInstanceCapacity).
    """

    node_group: str
    config: dict[str, object] | None
    refusal: str | None
    pool_state: PoolState
    usd_per_month: float
    unserved_gpu_minutes_cold: float
    unserved_gpu_minutes_warm: float
    value_usd_per_month: float
    notes: tuple[str, ...] = ()

    def reason(self) -> str:
        """One line: the recommendation and its figures."""
        if self.refusal is not None:
            return f"no warm pool: {self.refusal}"
        head = "warm pool" if self.config is not None else "no warm pool (costs more than it saves)"
        return (
            f"{head}: {self.pool_state} x{self.config['minSize'] if self.config else 0}, "
            f"USD {self.usd_per_month:,.2f}/month, unserved GPU-min/month {self.unserved_gpu_minutes_cold:,.0f} "
            f"cold -> {self.unserved_gpu_minutes_warm:,.0f} warm, net USD {self.value_usd_per_month:,.2f}/month"
        )


def refusal(capacity_type: str | None, instance_types: tuple[str, ...], ami_type: str | None) -> str | None:
    """Why EKS cannot give this group a warm pool, or None: Spot capacity, more than one instance type,
    or a custom AMI (warm pools need an EKS-optimised AMI)."""
    if (capacity_type or "ON_DEMAND").upper() == "SPOT":
        return "spot_capacity"
    if len(instance_types) > 1:
        return "mixed_instance_types"
    if (ami_type or "").upper() == "CUSTOM":
        return "custom_ami"
    return None


def recommend(inputs: PoolInputs) -> PoolRecommendation:
    """A STOPPED pool holding the instances off-hours takes down, when the unserved GPU-minutes it saves
    are worth more at ``price`` than its EBS; none otherwise.

    ``minSize`` 0 and ``maxGroupPreparedCapacity`` = the saved size: the pool holds exactly the instances
    taken down while the group is down and none while it is up; ``reuseOnScaleIn`` returns them to the
    pool on the way down. A RUNNING pool is never recommended for an off-hours group: it costs what the
    group costs up, so leaving the group up is as fast for the same price.
    """
    reason = refusal(inputs.capacity_type, inputs.instance_types, inputs.ami_type)
    n = max(0, inputs.instances)
    per_restore_cold = n * inputs.gpus * max(0.0, inputs.cold_delay_s) / 60
    per_restore_warm = n * inputs.gpus * max(0.0, min(inputs.warm_delay_s, inputs.cold_delay_s)) / 60
    cold = per_restore_cold * inputs.restores_per_month
    warm = per_restore_warm * inputs.restores_per_month
    cost = n * ebs_usd_per_hour(inputs.volume_gb) * inputs.down_hours_per_month
    value = (cold - warm) * inputs.price - cost
    notes = []
    if inputs.instance_store:
        notes.append("instance_store_wiped_on_stop")
    notes.append("stopped_instance_may_hit_insufficient_capacity_on_start")
    worth = reason is None and n > 0 and value > 0
    config: dict[str, object] | None = (
        {
            "enabled": True,
            "minSize": 0,
            "maxGroupPreparedCapacity": n,
            "poolState": "STOPPED",
            "reuseOnScaleIn": True,
        }
        if worth
        else None
    )
    return PoolRecommendation(
        inputs.node_group, config, reason, "STOPPED", cost, cold, warm, value, tuple(notes)
    )


@dataclass(frozen=True, slots=True)
class WarmPoolGroup:
    """What a warm pool decision reads of one managed node group (EKS ``DescribeNodegroup``):
    ``capacity_type``, ``instance_types``, ``ami_type``, ``disk_size`` (GB; None with a launch
    template), ``launch_template`` (``id``, ``version``) or None, ``asg_name``, and the current
    ``warm_pool`` (``warmPoolConfig``) or None."""

    name: str
    capacity_type: str | None
    instance_types: tuple[str, ...]
    ami_type: str | None
    disk_size: int | None
    launch_template: dict[str, str] | None
    asg_name: str | None
    desired: int
    warm_pool: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class WarmInstance:
    """One instance of an Auto Scaling group's warm pool: its lifecycle state (``Warmed:Stopped`` …) and
    the launch template id and version it was launched from (None when not from a template)."""

    instance_id: str
    lifecycle_state: str
    template_id: str | None
    version: str | None


def drift(group: WarmPoolGroup, instances: list[WarmInstance]) -> list[str]:
    """Warm instances not launched from the group's launch template id and version: a restore would
    bring them back on an old AMI or user data until EKS replaces them (``instance: template version X,
    group at Y``). Empty when the group has no launch template (EKS then manages one itself)."""
    template = group.launch_template
    if not template or not template.get("id"):
        return []
    want_id, want_version = template.get("id"), template.get("version")
    out = []
    for i in instances:
        if i.template_id != want_id or (want_version and i.version != want_version):
            out.append(
                f"{i.instance_id}: template {i.template_id or '-'} version {i.version or '-'}, "
                f"group at {want_id} version {want_version or '-'}"
            )
    return out
