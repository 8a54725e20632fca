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
a capacity reservation.

**Replacements the plan knows** (:class:`KnownReplacement`, from the live ``nodegroup:<name>`` leases,
``rightsizer.services.replace.known_replacements``): while one runs, every node of its old and its new
group carries ``replacement_in_progress:<execution>`` — protected, so no scale-in, resize, drain or second
replacement picks them (its own child drains are exempt), and the group is not proposed again. After it
ended past its point of no return the new group's nodes carry ``replacement_settling:until:<t>`` for
``Policy.replace_settle_seconds``: they stood empty while the old nodes drained, so their idle evidence
must be taken after the pods moved (Cluster Autoscaler's ``scale-down-delay-after-add``, Karpenter's
``consolidateAfter``). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rightsizer.domain.catalog import HOURS_PER_MONTH, Catalog, InstanceType
from rightsizer.domain.eligibility import Judged, ReplaceFacts, ReplaceMember, replace_refusals
from rightsizer.domain.model import AsgInfo
from rightsizer.domain.plan import Action, action_id
from rightsizer.domain.throughput import Demand, Fit, cheapest_fit
from rightsizer.domain.verdicts import Verdict

KIND = "replace_node_group"


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One GPU node of a node group as the planner judged it.

    ``demand`` is set when a cheaper instance type fits the node (its recommendation's demand);
    ``reserved`` names the capacity reservation the node runs in, if any; ``reasons`` are its reasons.
    """

    node: str
    verdict: Verdict
    row: InstanceType | None
    demand: Demand | None
    reserved: str | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KnownReplacement:
    """A node group replacement the state store knows of: ``execution_id`` holds (or held) ``groups`` (EKS
    node group names: the old group and, once validate named it, the new one).

    ``settling_until`` is None while the workflow runs; after it ended past its point of no return, the
    aware instant until which its new group settles (``groups`` is then the new group only).
    """

    execution_id: str
    groups: tuple[str, ...]
    settling_until: datetime | None = None


def replacement_reasons(nodegroup: str | None, known: Iterable[KnownReplacement], at: datetime) -> list[str]:
    """The reasons a node of managed node group ``nodegroup`` carries at ``at``:
    ``replacement_in_progress:<execution>`` while a replacement of its group or to its group runs,
    ``replacement_settling:until:<RFC 3339 UTC>`` while its group settles after replacing another. Empty
    for a node of no managed node group."""
    if not nodegroup:
        return []
    reasons = []
    for r in known:
        if nodegroup not in r.groups:
            continue
        if r.settling_until is None:
            reasons.append(f"replacement_in_progress:{r.execution_id}")
        elif at < r.settling_until:
            stamp = r.settling_until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            reasons.append(f"replacement_settling:until:{stamp}")
    return reasons


def held_groups(known: Iterable[KnownReplacement], at: datetime) -> dict[str, str]:
    """Node group → why no ``replace_node_group`` may be proposed for it at ``at`` (the first reason of
    :func:`replacement_reasons`): a replacement of it or to it runs, or it is settling."""
    known = list(known)
    held = {}
    for group in sorted({g for r in known for g in r.groups}):
        reasons = replacement_reasons(group, known, at)
        if reasons:
            held[group] = reasons[0]
    return held


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


def replace_facts(group: AsgInfo, members: Sequence[GroupMember], *, allowed: bool) -> ReplaceFacts:
    """The replacement eligibility's facts (``domain.eligibility.ReplaceFacts``) of a group as judged."""
    return ReplaceFacts(
        nodegroup=group.nodegroup,
        allowed=allowed,
        tags=group.tags,
        in_service=sum(1 for state in group.instances.values() if state == "InService"),
        members=tuple(
            ReplaceMember(
                m.node, Judged(m.verdict, m.reasons), m.row.name if m.row else None, m.demand is not None
            )
            for m in members
        ),
    )


def why_not_replace(group: AsgInfo, members: Sequence[GroupMember], *, allowed: bool) -> str | None:
    """Why ``group`` gets no ``replace_node_group`` action (None when it may get one): the refusals of
    ``domain.eligibility.replace_refusals`` — the replacement workflow's validate calls the same function
    — comma-joined. Among them the preflight: every node must pass the child drain's eligibility (a
    hostPath or local-PV pod, a PodDisruptionBudget, an opt-out annotation ... on one node keeps the group).

    Args:
        group: the Auto Scaling group and its managed node group name.
        members: its GPU nodes as judged.
        allowed: the policy's ``allow_replace_node_group``.
    """
    found = replace_refusals(replace_facts(group, members, allowed=allowed))
    return ", ".join(r.reason for r in found) if found else None


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
    held: Mapping[str, str] | None = None,
) -> tuple[list[Action], frozenset[str]]:
    """``replace_node_group`` actions for the groups that qualify, and the nodes whose own recommendation
    they supersede (a group that does not qualify keeps its nodes' ``recommend`` actions). A group in
    ``held`` (:func:`held_groups`) gets no action; while it is being replaced its nodes' recommendations
    are superseded by the replacement that runs."""
    actions: list[Action] = []
    covered: set[str] = set()
    for group, members in groups:
        hold = (held or {}).get(group.nodegroup or "")
        if hold is not None:
            if hold.startswith("replacement_in_progress:"):
                covered.update(m.node for m in members)
            continue
        why = why_not_replace(group, members, allowed=allowed)
        found = replacement_action(group, members, catalog) if why is None else None
        if found is None:
            continue
        actions.append(found[0])
        covered.update(m.node for m in members)
    return actions, frozenset(covered)


def drain_refused_groups(
    groups: Sequence[tuple[AsgInfo, Sequence[GroupMember]]], *, allowed: bool
) -> dict[str, str]:
    """Node → why its group, which would otherwise be replaced, is not: only the preflight refuses (a node
    of it fails the child drain's eligibility, ``every_node_drains``). The members' ``recommend`` actions
    name it (issue 25: a node refused for an action kind gets a recommend naming the refusal)."""
    notes: dict[str, str] = {}
    for group, members in groups:
        found = replace_refusals(replace_facts(group, members, allowed=allowed))
        if found and all(r.guard == "every_node_drains" for r in found):
            why = f"replace_node_group of {group.nodegroup} refused: " + ", ".join(r.reason for r in found)
            notes.update(dict.fromkeys((m.node for m in members), why))
    return notes
