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

from typing import Final, Literal

__all__ = [
    "EBS_GP3_USD_PER_GB_MONTH",
    "HOURS_PER_MONTH",
    "WARM_STOPPED_RATIO",
    "PoolState",
    "ebs_usd_per_hour",
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
