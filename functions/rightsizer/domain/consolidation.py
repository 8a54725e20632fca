"""Consolidation: empty partly-used GPU nodes onto fewer, chosen by measured use (issue 29).

Karpenter consolidates on requests and Cluster Autoscaler removes a node whose requests fall under a
threshold; here measured activity chooses *which* node to empty — the least used GPU node first
(devices active at one time, then peak activity, then peak framebuffer), the dearest first among equals,
then by name — and requests decide *whether* its pods fit elsewhere (``domain.placement``: exclusive GPUs
cannot be shared by measuring them). With policy ``consolidation``:

- ``idle_holders``: a node qualifies only when every GPU of it was idle the whole window, so every GPU pod
  on it left its GPUs idle (DCGM series carry no reliable pod of a device, so one busy GPU makes every GPU
  pod of the node stay); CPU-only pods always may move. This is what ``idle_gpu_holder`` protects.
- ``all``: busy nodes qualify too: the pods move by their requests, like Karpenter's consolidation.

Every other protection still refuses (the node's pods' findings, PodDisruptionBudgets, do-not-disrupt,
other autoscalers, node group bounds, cooldown, windows, snoozes, replacements, reservations...), and a
consolidation counts against the same disruption budget as ``scale_in`` (after the scale-ins). At most
``consolidation_max_candidates`` nodes are simulated per plan: the plan's work is bounded and, being pure,
the same input gives the same consolidations. Each chosen node's placements are committed before the next
is tried (``ClusterPlacement``), so two consolidations never count on the same room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rightsizer.domain.catalog import HOURS_PER_MONTH
from rightsizer.domain.eligibility import DrainFacts, Judged, drain_refusals
from rightsizer.domain.model import ANN_CORDONED_BY, AsgInfo
from rightsizer.domain.placement_cluster import ClusterPlacement, movers, placement_reasons
from rightsizer.domain.plan import Action, PodMove, action_id
from rightsizer.domain.policy import Policy
from rightsizer.domain.verdicts import code_of, verdict_of

if TYPE_CHECKING:
    from rightsizer.domain.planner import NodeDecision

#: The advice for a GPU node that CPU-only pods keep alive.
PIN_ADVICE = (
    "taint the GPU node group (e.g. nvidia.com/gpu=present:NoSchedule in the EKS node group or Karpenter "
    "NodePool taints) and give GPU pods the matching toleration (the ExtendedResourceToleration admission "
    "plugin adds it to every pod requesting nvidia.com/gpu), so CPU-only pods schedule elsewhere"
)


def consolidation_refusals(reasons: Sequence[str], mode: str, asg: str | None = "plan") -> list[str]:
    """Why a node may not be consolidated in ``mode`` (empty: it may): the drain's eligibility in mode
    ``consolidate`` (``domain.eligibility``, which the workflow's validate and revalidate run too):
    every excluded and unknown reason, busy reasons in ``idle_holders``, every protection but
    ``CONSOLIDATE_EXEMPT``, and a node outside any Auto Scaling group."""
    judged = Judged(verdict_of(reasons), tuple(reasons))
    facts = DrainFacts(judged, asg, "consolidate", consolidation=mode)
    return [r.reason for r in drain_refusals(facts)]


#: (group, instance type) → (in-service count, warm floor, evidence) of a node, None without a floor.
FloorOf = Callable[["NodeDecision"], "tuple[tuple[str, str], int, int, str | None] | None"]


@dataclass(frozen=True, slots=True)
class Budget:
    """What the scale-ins left of the disruption budget: run slots, nodes taken per group, and nodes
    leaving per (group, instance type) for the warm floor."""

    run_slots: int
    taken: Mapping[str, int]
    leaving: Mapping[tuple[str, str], int]


def budget_left(
    decisions: Sequence[NodeDecision],
    actions: Sequence[Action],
    policy: Policy,
    stale: frozenset[str],
    floor_of: FloorOf,
) -> Budget:
    """The run slots and per-group counts after the drains in flight and the chosen ``scale_in``s."""
    by_node = {d.node.name: d for d in decisions}
    taken: dict[str, int] = {}
    leaving: dict[tuple[str, str], int] = {}
    busy = 0
    gone = [
        d for d in decisions if ANN_CORDONED_BY in d.node.metadata.annotations and d.node.name not in stale
    ] + [by_node[a.node] for a in actions if a.kind == "scale_in" and a.node in by_node]
    for d in gone:
        busy += 1
        if d.group is not None:
            taken[d.group.name] = taken.get(d.group.name, 0) + 1
        floor = floor_of(d)
        if floor is not None:
            leaving[floor[0]] = leaving.get(floor[0], 0) + 1
    return Budget(policy.max_nodes_per_run - busy, taken, leaving)


def _use(d: NodeDecision) -> tuple[int, float, float, float, str]:
    a = d.assessment
    return (
        a.peak_active_devices,
        a.activity_max_pct or 0.0,
        a.fb_used_max_mib or 0.0,
        -(d.hourly_usd if d.hourly_usd is not None else -1.0),
        d.node.name,
    )


def choose_consolidations(
    decisions: Sequence[NodeDecision],
    policy: Policy,
    checker: ClusterPlacement,
    budget: Budget,
    floor_of: FloorOf,
    reserved: Callable[[Sequence[str]], str | None],
) -> list[Action]:
    """``consolidate`` actions for the nodes that may be emptied (module docstring), with their moves.

    Args:
        decisions: the planner's node decisions after ``scale_in`` was chosen (reasons final but for
            the ``no_placement`` / ``cpu_pods_pin_gpu_node`` this adds).
        policy: ``consolidation`` (not ``off``), ``consolidation_max_candidates``, the budgets.
        checker: the plan's placement state, the scale-ins' removals already kept.
        budget: :func:`budget_left`.
        floor_of: a node's warm floor in its group (``domain.capacity``): never removed below it.
        reserved: the reservation id in a node's reasons (a removal saves nothing while it is held).
    """
    mode = policy.consolidation
    candidates = [
        d
        for d in decisions
        if d.group is not None
        and verdict_of(d.reasons) != "idle"
        and movers(d.pods)
        and not any(code_of(r) == "no_placement" for r in d.reasons)  # the scale-in's trial failed
        and not consolidation_refusals(d.reasons, mode, d.group.name)
    ]
    slots = budget.run_slots
    taken = dict(budget.taken)
    leaving = dict(budget.leaving)
    actions: list[Action] = []
    for d in sorted(candidates, key=_use)[: policy.consolidation_max_candidates]:
        group = d.group
        assert group is not None
        used = taken.get(group.name, 0)
        if slots <= 0:
            break
        if group.desired - used - 1 < group.min_size or used >= policy.node_group_budget(group.desired):
            continue
        floor = floor_of(d)
        if floor is not None and floor[1] - leaving.get(floor[0], 0) - 1 < floor[2]:
            continue
        moving = movers(d.pods)
        placed = checker.trial([d.node.name], moving)
        if not placed.ok:
            checker.undo()
            d.reasons.extend(placement_reasons([c.pod for c in d.pods if c.ignored is None], placed))
            continue
        checker.keep()
        slots -= 1
        taken[group.name] = used + 1
        if floor is not None:
            leaving[floor[0]] = leaving.get(floor[0], 0) + 1
        actions.append(_action(d, group, used, placed.moves, policy, reserved(d.reasons)))
    return actions


def _action(
    d: NodeDecision,
    group: AsgInfo,
    used: int,
    moves: Sequence[object],
    policy: Policy,
    reservation: str | None,
) -> Action:
    before = group.desired - used
    pod_moves = [PodMove(pod=m.pod, to=m.to) for m in moves]  # type: ignore[attr-defined]
    hourly = None if reservation else d.hourly_usd
    a = d.assessment
    gpus_moving = sum(c.pod.gpu_request() for c in d.pods if c.ignored is None)
    use = (
        f"peak {a.peak_active_devices} of {a.expected.total} GPUs active, activity max "
        f"{a.activity_max_pct if a.activity_max_pct is not None else 0:.0f} %"
    )
    reason = (
        f"{len(pod_moves)} pods ({gpus_moving} GPUs requested) fit on other nodes; {use} in the window"
        + (
            f"; runs in reservation {reservation}: removal saves nothing while it is held"
            if reservation
            else ""
        )
    )
    return Action(
        action_id=action_id("consolidate", d.node.name, sorted((m.pod, m.to) for m in pod_moves)),
        kind="consolidate",
        node=d.node.name,
        node_group=group.display_name,
        instance_id=d.node.instance_id,
        from_=before,
        to=before - 1,
        reason=reason,
        hourly_savings_usd=hourly,
        monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
        why_safe="every evicted pod fits on another node by its requests, taints, affinity, spread and "
        "volume zones, simulated with each move committed (and again right before the first eviction); "
        + (
            "every GPU of the node idle for the whole window"
            if policy.consolidation == "idle_holders"
            else "workloads restart on their new node"
        )
        + "; PodDisruptionBudgets honoured, uncordoned on failure",
        moves=pod_moves,
    )


def pin_advice(decisions: Sequence[NodeDecision]) -> list[Action]:
    """A ``recommend`` per GPU node that CPU-only pods keep alive (``cpu_pods_pin_gpu_node``)."""
    out: list[Action] = []
    for d in decisions:
        pinned = [r for r in d.reasons if code_of(r) == "cpu_pods_pin_gpu_node"]
        if not pinned:
            continue
        pods = ", ".join(sorted(c.pod.key for c in d.pods if c.ignored is None)[:5])
        cost = f" (USD {d.hourly_usd:.2f}/h)" if d.hourly_usd is not None else ""
        out.append(
            Action(
                action_id=action_id("recommend", d.node.name, "cpu_pods_pin_gpu_node"),
                kind="recommend",
                node=d.node.name,
                node_group=d.group.display_name if d.group is not None else None,
                instance_id=d.node.instance_id,
                from_=None,
                to=None,
                reason=f"CPU-only pods ({pods}) keep GPU node {d.node.name}{cost} and fit nowhere else: "
                + PIN_ADVICE,
                hourly_savings_usd=None,
                monthly_savings_usd=None,
            )
        )
    return out
