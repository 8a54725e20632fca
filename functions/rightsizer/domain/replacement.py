"""Node group replacement as a plan action (docs/architecture.md §3 "Recommendations", issue 17).

A managed node group cannot change its instance type in place. When every GPU node of an opted-in group
(``allow_replace_node_group: true`` and the group tag ``rightsizer.io/enabled=true``) is ``underutilized``
with a cheaper instance type fitting it, the group's nodes' observed demands are combined (the maximum of
each dimension: GPUs busy at once, framebuffer per GPU, activity, pod requests) and the cheapest type that
serves the combined demand (``domain.throughput.cheapest_fit``) becomes one ``replace_node_group`` action
for the whole group; it supersedes the nodes' own ``recommend`` actions. Any other node in the group — busy
without a cheaper fit, idle, unknown, protected, or an instance without a Node — keeps the group as it is:
one node's workload must never be moved to a shape picked for another's.

Savings (USD per hour) = (current − target on-demand price) × the group's nodes; none while a node runs in
a capacity reservation. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rightsizer.domain.catalog import HOURS_PER_MONTH, Catalog, InstanceType
from rightsizer.domain.model import TAG_ENABLED, AsgInfo
from rightsizer.domain.plan import Action, action_id
from rightsizer.domain.throughput import Demand, Fit, cheapest_fit

KIND = "replace_node_group"


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One GPU node of a node group as the planner judged it.

    ``demand`` is set when a cheaper instance type fits the node (its recommendation's demand);
    ``reserved`` names the capacity reservation the node runs in, if any.
    """

    node: str
    verdict: str
    row: InstanceType | None
    demand: Demand | None
    reserved: str | None = None


def combined_demand(demands: Sequence[Demand]) -> Demand:
    """The demand one node of the new type must serve: every dimension's maximum over ``demands``.

    Raises:
        ValueError: ``demands`` is empty.
    """
    if not demands:
        raise ValueError("no demand to combine")
    activities = [d.activity_pct for d in demands if d.activity_pct is not None]
    return Demand(
        gpus=max(d.gpus for d in demands),
        fb_per_gpu_mib=max(d.fb_per_gpu_mib for d in demands),
        activity_pct=max(activities) if len(activities) == len(demands) else None,
        pod_gpus=max(d.pod_gpus for d in demands),
        cpu_m=max(d.cpu_m for d in demands),
        memory_mib=max(d.memory_mib for d in demands),
        mig=any(d.mig for d in demands),
        headroom=max(d.headroom for d in demands),
    )


def why_not_replace(group: AsgInfo, members: Sequence[GroupMember], *, allowed: bool) -> str | None:
    """Why ``group`` gets no ``replace_node_group`` action (None when it may get one).

    Args:
        group: the Auto Scaling group and its managed node group name.
        members: its GPU nodes as judged.
        allowed: the policy's ``allow_replace_node_group``.
    """
    if not group.nodegroup:
        return "not a managed node group"
    if not allowed:
        return "allow_replace_node_group: false"
    if group.tags.get(TAG_ENABLED) != "true":
        return f"not opted in (tag {TAG_ENABLED}=true)"
    in_service = [i for i, state in group.instances.items() if state == "InService"]
    if not members or len(members) != len(in_service):
        return f"{len(members)} GPU node(s) for {len(in_service)} instance(s) in service"
    types = {m.row.name if m.row else None for m in members}
    if len(types) != 1 or None in types:
        return "the nodes run more than one (or an unknown) instance type"
    others = sorted(
        f"{m.node}:{m.verdict}" for m in members if m.verdict != "underutilized" or m.demand is None
    )
    if others:
        return "not every node is underutilized with a cheaper type fitting: " + ", ".join(others)
    return None


def replacement_action(
    group: AsgInfo, members: Sequence[GroupMember], catalog: Catalog
) -> tuple[Action, Fit] | None:
    """The ``replace_node_group`` action for a group that passed :func:`why_not_replace`, or None when no
    cheaper type serves the combined demand of its nodes.

    ``from``/``to`` are instance types; the action has no node and no instance id.
    """
    row = members[0].row
    assert row is not None and group.nodegroup
    demand = combined_demand([m.demand for m in members if m.demand is not None])
    fit = cheapest_fit(row, catalog, demand)
    if fit is None or fit.row.hourly_usd is None or row.hourly_usd is None:
        return None
    reserved = sorted({m.reserved for m in members if m.reserved})
    per_node = row.hourly_usd - fit.row.hourly_usd
    hourly = None if reserved else per_node * len(members)
    reason = (
        f"every node of managed node group {group.nodegroup} fits {fit.row.name} (combined peak of "
        f"{len(members)} node(s): {demand.gpus} GPU(s) busy at once, {demand.fb_per_gpu_mib:.0f} MiB framebuffer "
        f"per GPU with headroom, pods request {demand.cpu_m}m CPU / {demand.memory_mib:.0f} MiB): replace the group "
        f"with one of {fit.row.name}, drain the old nodes one disruption budget at a time, scale the old group to 0"
    )
    if reserved:
        reason += f"; runs in reservation {', '.join(reserved)}: the change saves nothing while it is held"
    action = Action(
        action_id=action_id(KIND, group.nodegroup, fit.row.name),
        kind=KIND,
        node=None,
        node_group=group.nodegroup,
        instance_id=None,
        from_=row.name,
        to=fit.row.name,
        reason=reason,
        hourly_savings_usd=hourly,
        monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
        expected_slowdown_pct=fit.expected_slowdown_pct,
        why_safe=fit.why_safe,
    )
    return action, fit


def group_replacements(
    groups: Sequence[tuple[AsgInfo, Sequence[GroupMember]]],
    catalog: Catalog,
    *,
    allowed: bool,
) -> tuple[list[Action], frozenset[str]]:
    """``replace_node_group`` actions for the groups that qualify, and the nodes whose own recommendation
    they supersede (a group that does not qualify keeps its nodes' ``recommend`` actions)."""
    actions: list[Action] = []
    covered: set[str] = set()
    for group, members in groups:
        why = why_not_replace(group, members, allowed=allowed)
        found = replacement_action(group, members, catalog) if why is None else None
        if found is None:
            continue
        actions.append(found[0])
        covered.update(m.node for m in members)
    return actions, frozenset(covered)
