"""``plan(snapshot, policy, now) -> Plan``: the pure decision (docs/architecture.md §3).

No clock, no environment, no I/O, no randomness: the same input gives the same plan. Steps: interpret the
metrics per device, classify the pods on every GPU node, collect every reason, choose ``scale_in``
candidates under the disruption budget (Karpenter-style: budgets are counted down while choosing), then
price everything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from rightsizer.domain.capacity import (
    ice_evidence,
    interruption_signals,
    reservation_of,
    reservation_reasons,
    reservation_use,
    reserved_kept,
    warm_floor_of,
    warm_floor_reason,
)
from rightsizer.domain.catalog import HOURS_PER_MONTH, Catalog, InstanceType, load_catalog
from rightsizer.domain.consolidation import budget_left, choose_consolidations, pin_advice
from rightsizer.domain.eligibility import DrainFacts, Judged, drain_refusals
from rightsizer.domain.gpu import GpuAssessment, is_gpu_node
from rightsizer.domain.health import health_reasons, repair_owner, xid_facts
from rightsizer.domain.holds import snooze_reason
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import (
    ANN_CORDONED_BY,
    ANN_DO_NOT_DISRUPT,
    NODEGROUP_LABEL,
    AsgInfo,
    ClusterSnapshot,
    Ec2Instance,
    Node,
    Pod,
    ResourceClaim,
)
from rightsizer.domain.periods import schedule_contains
from rightsizer.domain.placement_cluster import ClusterPlacement
from rightsizer.domain.plan import (
    Action,
    NodeReport,
    Plan,
    ReservationReport,
    Savings,
    UnmappedReport,
    action_id,
)
from rightsizer.domain.planner_holders import GpuFacts, activity_of, signals_over, workload_verdicts
from rightsizer.domain.pods import PodClassification, PodContext, classify_pods, pdbs_by_namespace, wants_node
from rightsizer.domain.policy import Policy
from rightsizer.domain.prices import price_reason
from rightsizer.domain.recommend import Recommendation, recommend_for_node, resize_or_recommend
from rightsizer.domain.replacement import (
    GroupMember,
    KnownReplacement,
    drain_refused_groups,
    group_replacements,
    held_groups,
    replacement_reasons,
)
from rightsizer.domain.showback import NodeHolders, showback
from rightsizer.domain.usage import CollectedSignals, UnmappedSeries, Window
from rightsizer.domain.verdicts import UNHEALTHY_CODES, Verdict, code_of, order_reasons, verdict_of
from rightsizer.domain.volumes import VolumeFacts
from rightsizer.domain.workloads import Activity
from rightsizer.gc_pause import gc_paused

KARPENTER_NODEPOOL = "karpenter.sh/nodepool"
OTHER_AUTOSCALER_TAINTS = ("ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted")
CA_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: EC2 instance states (DescribeInstances ``State.Name``) of an instance that is leaving or gone.
GONE_INSTANCE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})


@dataclass
class NodeDecision:
    """Working state for one GPU node while planning (internal to the planner, exposed for tests)."""

    node: Node
    group: AsgInfo | None
    standalone: bool
    row: InstanceType | None
    assessment: GpuAssessment
    pods: list[PodClassification]
    reasons: list[str] = field(default_factory=list)
    hourly_usd: float | None = None
    recommendation: Recommendation | None = None

    @property
    def pods_to_evict(self) -> int:
        """Pods the drain would evict (not ignored)."""
        return sum(1 for p in self.pods if p.ignored is None)


def _human_duration(seconds: int) -> str:
    """``1800`` → ``30 min``, ``10`` → ``10 s``, ``5400`` → ``1 h 30 min``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h" if hours else "", f"{minutes} min" if minutes else "", f"{secs} s" if secs else ""]
    return " ".join(p for p in parts if p) or "0 s"


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _price(
    node: Node,
    row: InstanceType | None,
    region: str,
    instance: Ec2Instance | None,
    spot: dict[tuple[str, str], float],
    catalog: Catalog,
) -> tuple[float | None, list[str]]:
    """USD/hour the node costs and the pricing reasons (docs/architecture.md §3 "Pricing", issue 17 "Honest savings").

    On demand: the region's price from the AWS Price List Query API when the snapshot carries one
    (``catalog.prices``, reason ``priced_on_demand:pricing_api:<region>``), else the packaged catalog's
    us-east-1 price (``priced_on_demand:catalog:us-east-1:<date>`` there, ``price_region_fallback:<region>``
    elsewhere). A spot instance at its zone's current spot price (EC2 DescribeSpotPriceHistory, carried in
    the snapshot) when known, else on demand with ``spot_priced_on_demand``. Reserved capacity is judged
    by ``domain.capacity`` (kept by default, never priced as savings).
    """
    reasons: list[str] = []
    on_demand = catalog.on_demand_usd(row.name) if row is not None else None
    if row is None or on_demand is None:
        return None, [*reasons, f"price_unknown:{node.instance_type or 'no_instance_type'}"]
    node_region = node.labels.get("topology.kubernetes.io/region") or region
    capacity_type = (
        node.labels.get("eks.amazonaws.com/capacityType")
        or node.labels.get("karpenter.sh/capacity-type")
        or ""
    )
    if capacity_type.lower() == "spot" or (instance is not None and instance.lifecycle == "spot"):
        zone = (instance.availability_zone if instance else "") or node.labels.get(
            "topology.kubernetes.io/zone", ""
        )
        price = spot.get((row.name, zone))
        if price is not None:
            return price, [*reasons, f"priced_spot:{zone}"]
        reasons.append("spot_priced_on_demand")
    reason = price_reason(catalog.prices, node_region, row.name)
    if catalog.prices is not None and node_region != catalog.prices.region:
        on_demand = catalog.packaged_usd.get(row.name, on_demand)  # the book is another region's
    return on_demand, [*reasons, reason]


def _node_protections(node: Node) -> list[str]:
    reasons: list[str] = []
    ann, labels = node.metadata.annotations, node.labels
    if (
        ann.get(ANN_DO_NOT_DISRUPT) == "true"
        or labels.get(ANN_DO_NOT_DISRUPT) == "true"
        or ann.get(KARPENTER_DO_NOT_DISRUPT) == "true"
        or ann.get(CA_SCALE_DOWN_DISABLED) == "true"
    ):
        reasons.append("do_not_disrupt:node")
    if node.metadata.deletionTimestamp is not None:
        reasons.append("other_autoscaler:node_deleting")  # kubectl, CA and Karpenter skip it too
    for taint in node.spec.taints:
        if taint.key in OTHER_AUTOSCALER_TAINTS:
            reasons.append(f"other_autoscaler:{taint.key}")
    if KARPENTER_NODEPOOL in labels:
        reasons.append(f"karpenter_owned:{labels[KARPENTER_NODEPOOL]}")
    if node.spec.unschedulable:
        if ANN_CORDONED_BY in ann:
            reasons.append(f"in_flight:{ann[ANN_CORDONED_BY]}")
        else:
            reasons.append("cordoned_by_other")
    return reasons


def _selected(node: Node, group: AsgInfo | None, policy: Policy) -> bool:
    if any(node.labels.get(k) != v for k, v in policy.node_selector.items()):
        return False
    if policy.node_groups:
        names = {node.labels.get(NODEGROUP_LABEL)}
        if group is not None:
            names |= {group.name, group.nodegroup}
        return bool(names & set(policy.node_groups))
    return True


def _exporter_pod(pods: Sequence[Pod]) -> str | None:
    for pod in pods:
        if "dcgm-exporter" in pod.metadata.name:
            return pod.key
    return None


def _claims_by_node(snapshot: ClusterSnapshot) -> dict[str, dict[str, ResourceClaim]]:
    out: dict[str, dict[str, ResourceClaim]] = {}
    for claim in snapshot.resource_claims:
        if not claim.allocated:
            continue
        for node in claim.nodes:
            out.setdefault(node, {})[f"{claim.namespace}/{claim.name}"] = claim
    return out


@gc_paused  # ~1.5 M objects held at 10,000 GPU nodes: the collector's full passes cost ~2 of ~9 CPU-s
def plan(  # noqa: C901 (24): the verdict-then-budget pipeline of §3, one step per paragraph
    snapshot: ClusterSnapshot,
    policy: Policy,
    now: datetime | None = None,
    *,
    catalog: Catalog | None = None,
    node_label: str | None = None,
    stale_cordons: frozenset[str] = frozenset(),
    snoozed: Mapping[str, datetime] | None = None,
    replacements: Sequence[KnownReplacement] = (),
    placement: bool = True,
) -> Plan:
    """Decide, for every GPU node of ``snapshot``, a verdict with reasons, and the actions to take.

    Args:
        snapshot: the cluster state (docs/architecture.md §5 snapshot directory, validated).
        policy: the decision policy.
        now: the decision instant ``at`` (aware); defaults to the snapshot's ``taken_at``.
        catalog: the instance catalog (defaults to the packaged one); the region's on-demand prices the
            snapshot carries (``inventory.on_demand``, AWS Price List Query API) are applied to it.
        node_label: the operator's node-name label on DCGM series (config ``prometheus.node_label``).
        stale_cordons: nodes carrying our cordon annotation without a live workflow (the caller knows
            the leases): still not candidates, but they do not count as drains in flight.
        snoozed: node → the aware instant until which a person snoozed its removal (approval snooze,
            docs/architecture.md §4): before it the node is ``protected`` with ``snoozed:until:<t>``.
        replacements: the node group replacements the state store knows (running, or finished recently):
            their groups' nodes are ``protected`` (``replacement_in_progress:<execution>``,
            ``replacement_settling:until:<t>``, ``domain.replacement``) and no group of theirs is proposed
            for replacement again.

    Returns:
        The ``Plan`` (docs/architecture.md §5): nodes sorted by name, actions by hourly savings then id.

    Raises:
        ValueError: when ``now`` is a naive datetime.
    """
    at = now or snapshot.meta.taken_at
    if at.tzinfo is None:
        raise ValueError("plan() needs an aware datetime for now")
    catalog = (catalog or load_catalog()).with_prices(snapshot.inventory.on_demand)
    window = Window.ending(at, policy.idle_window, snapshot.meta.step_seconds)
    joiner = NodeJoiner(
        snapshot.nodes, snapshot.pods, node_label or snapshot.node_label, snapshot.pod_addresses
    )
    signals = signals_over(snapshot, joiner, window, policy)
    assert signals is not None  # the decision window is the snapshot's own
    # Workload verdicts judge each node again over the workloads' own (longer) idle window (issue 32).
    wl_window = Window.ending(at, policy.workloads.idle_window, snapshot.meta.step_seconds)
    wl_signals: list[CollectedSignals | None] = []
    activity: dict[str, Activity] = {}
    ambiguous: dict[str, set[str]] = {}
    for u in signals.unmapped:
        if u.reason.startswith("series_unmapped:ambiguous:"):
            for name in u.reason.rsplit(":", 1)[1].split(","):
                ambiguous.setdefault(name, set()).add(u.metric)
    ceilings = {**catalog.idle_power_w, **policy.idle_power_max_w}
    pods_by_node: dict[str, list[Pod]] = {}
    for pod in snapshot.pods:
        if pod.spec.nodeName:
            pods_by_node.setdefault(pod.spec.nodeName, []).append(pod)
    pending = [p for p in snapshot.pods if p.status.phase == "Pending" and not p.spec.nodeName]
    claims = _claims_by_node(snapshot)
    volumes = VolumeFacts.of(snapshot.pvcs, snapshot.pvs, snapshot.nodes, known=snapshot.volumes_known)
    pdb_index = pdbs_by_namespace(snapshot.pdbs)
    inventory = snapshot.inventory
    if snapshot.xid_answers and not snapshot.xids:
        xids = xid_facts(dict(snapshot.xid_answers), lambda labels: joiner.join(labels).node, window.start)
        snapshot = dataclasses.replace(snapshot, xids=xids)

    decisions: list[NodeDecision] = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if not is_gpu_node(node, catalog):
            continue
        row = catalog.get(node.instance_type)
        instance = node.instance_id
        group: AsgInfo | None = None
        standalone = False
        reasons: list[str] = []
        if inventory.known and instance:
            asg_name = inventory.asg_of_instance.get(instance)
            if asg_name is None:
                standalone = True
            else:
                group = inventory.groups.get(asg_name)
                if group is None:
                    reasons.append(f"node_group_unknown:{asg_name}")
                elif group.instances.get(instance, "InService") != "InService":
                    # Terminating, Standby, Detaching...: the Auto Scaling group already acts on it.
                    reasons.append(f"other_autoscaler:asg_lifecycle_{group.instances[instance]}")
            ec2 = (inventory.instances or {}).get(instance)
            if ec2 is not None and ec2.state in GONE_INSTANCE_STATES:
                # A Node lingering after its instance went away: nothing to drain, stop or terminate.
                reasons.append(f"other_autoscaler:instance_{ec2.state}")
        else:
            reasons.append("node_group_unknown:" + ("no_inventory" if instance else "no_provider_id"))
        if not _selected(node, group, policy):
            reasons.append("not_selected")
        node_pods = pods_by_node.get(node.name, [])
        facts = GpuFacts(node, row, ceilings, at, _exporter_pod(node_pods), snapshot.signal_set)
        assessment = facts.assess(signals, window, policy)
        reasons.extend(assessment.reasons)
        reasons.extend(f"series_unmapped:{m}" for m in sorted(ambiguous.get(node.name, ())))
        ctx = PodContext(policy, snapshot.pdbs, claims.get(node.name, {}), at, volumes, pdb_index=pdb_index)
        classified = classify_pods(node_pods, ctx)
        if any(c.gpu_holder is not None for c in classified):
            if policy.workloads.idle_window == policy.idle_window:
                activity[node.name] = activity_of(assessment)
            else:
                if not wl_signals:
                    wl_signals.append(signals_over(snapshot, joiner, wl_window, policy))
                longer = wl_signals[0]
                activity[node.name] = (
                    "unknown" if longer is None else activity_of(facts.assess(longer, wl_window, policy))
                )
        for c in classified:
            reasons.extend(f.reason for f in c.findings)
            if c.gpu_holder is not None:
                reasons.append(c.gpu_holder.reason)
        if policy.evict_idle_gpu_holders:
            reasons = [r for r in reasons if not r.startswith("idle_gpu_holder")]
        wanted = sum(1 for p in pending if wants_node(p, node))
        if wanted:
            reasons.append(f"pending_gpu_pods:{wanted}")
        reasons.extend(_node_protections(node))
        snooze = snooze_reason((snoozed or {}).get(node.name), at)
        if snooze is not None:
            reasons.append(snooze)
        nodegroup = (
            group.nodegroup if group is not None and group.nodegroup else node.labels.get(NODEGROUP_LABEL)
        )
        reasons.extend(replacement_reasons(nodegroup, replacements, at))
        ec2 = inventory.instances.get(instance or "") if inventory.instances is not None else None
        hourly, price_reasons = _price(node, row, snapshot.meta.region, ec2, inventory.spot_prices, catalog)
        reasons = _capacity_and_health(reasons, node, ec2, group, policy, snapshot)
        decision = NodeDecision(node, group, standalone, row, assessment, classified, reasons, hourly)
        decision.recommendation = recommend_for_node(
            node=node,
            row=row,
            assessment=assessment,
            pods=classified,
            group=group,
            standalone=standalone,
            hourly=hourly,
            policy=policy,
            catalog=catalog,
        )
        decision.reasons.extend(price_reasons)
        decisions.append(decision)

    floors = _warm_floors(decisions, snapshot, policy, at)
    _apply_group_rules(decisions, snapshot, policy, at, floors)
    checker = ClusterPlacement(snapshot, volumes) if placement else None
    actions = _choose(decisions, policy, stale_cordons, floors, checker)
    if checker is not None and policy.consolidation != "off":
        floor_of = partial(_floor_of, floors=floors)
        budget = budget_left(decisions, actions, policy, stale_cordons, floor_of)
        actions += choose_consolidations(decisions, policy, checker, budget, floor_of, _reservation)
    actions += pin_advice(decisions)
    held = held_groups(replacements, at)
    plan_ = _assemble(snapshot, policy, at, decisions, actions, signals.unmapped, catalog, held)
    workloads = workload_verdicts(snapshot, _holders(decisions), activity, policy, at)
    return plan_.model_copy(update={"workloads": workloads})


def _holders(decisions: Sequence[NodeDecision]) -> list[NodeHolders]:
    """Each GPU node's GPU-holding pods, idleness and price (a reserved node's USD is not paid extra)."""
    return [
        NodeHolders(
            d.node,
            d.assessment.expected.physical,
            None if _reservation(d.reasons) else d.hourly_usd,
            d.assessment.idle,
            [c.pod for c in d.pods if c.gpu_holder is not None],
        )
        for d in decisions
    ]


def _capacity_and_health(
    reasons: list[str],
    node: Node,
    ec2: Ec2Instance | None,
    group: AsgInfo | None,
    policy: Policy,
    snapshot: ClusterSnapshot,
) -> list[str]:
    """``reasons`` with the node's reservation, interruption notices and health evidence (issue 28,
    ``domain.capacity``, ``domain.health``). An allocatable deficit on a settled node is health evidence
    (``gpus_unallocatable``), not missing data (``gpus_not_allocatable``)."""
    found = reservation_of(node, ec2)
    out = [
        *reasons,
        *reservation_reasons(found, policy.release_reserved_capacity, snapshot.inventory.reservations),
    ]
    out.extend(interruption_signals(node, ec2))
    xids, hints = snapshot.xids.get(node.name, ((), ()))
    settled = not any(code_of(r) == "node_too_young" for r in reasons)
    health = health_reasons(node, settled=settled, xids=xids, hints=hints)
    if any(code_of(r) == "gpus_unallocatable" for r in health):
        out = [r for r in out if code_of(r) != "gpus_not_allocatable"]
    owner = repair_owner(node, group)
    if owner is not None and any(code_of(r) in UNHEALTHY_CODES for r in health):
        health.append(f"unhealthy_pending_repair:{owner}")
    return [*out, *health]


#: (ASG name, instance type) → (nodes of that type in service, warm floor, ICE evidence or None).
Floors = dict[tuple[str, str], tuple[int, int, str | None]]


def _warm_floors(
    decisions: Sequence[NodeDecision], snapshot: ClusterSnapshot, policy: Policy, at: datetime
) -> Floors:
    """Each node group's in-service count and warm floor per instance type (``domain.capacity``).

    An instance's type is EC2's (DescribeInstances) or its Node's; when a group's known instances share one
    type, its instances of unknown type count as that type (the one-node read knows one instance)."""
    known = {i: e.instance_type for i, e in (snapshot.inventory.instances or {}).items()}
    known.update(
        {
            d.node.instance_id: d.node.instance_type
            for d in decisions
            if d.node.instance_id and d.node.instance_type
        }
    )
    floors: Floors = {}
    for group in {d.group.name: d.group for d in decisions if d.group is not None}.values():
        in_service = [i for i, state in group.instances.items() if state == "InService"]
        counts: dict[str, int] = {}
        for i in in_service:
            if i in known:
                counts[known[i]] = counts.get(known[i], 0) + 1
        if len(counts) == 1:
            counts = {next(iter(counts)): len(in_service)}
        evidence = ice_evidence(group, at)
        for itype, count in counts.items():
            floor = warm_floor_of(policy.warm_floor, itype) + (1 if evidence else 0)
            if floor:
                floors[(group.name, itype)] = (count, floor, evidence)
    return floors


def _floor_of(d: NodeDecision, floors: Floors) -> tuple[tuple[str, str], int, int, str | None] | None:
    """(key, count, floor, evidence) of the node's type in its group, None without a floor."""
    if d.group is None or not d.node.instance_type:
        return None
    key = (d.group.name, d.node.instance_type)
    found = floors.get(key)
    return None if found is None else (key, *found)


def _apply_group_rules(
    decisions: list[NodeDecision], snapshot: ClusterSnapshot, policy: Policy, at: datetime, floors: Floors
) -> None:
    """Static group rules: MinSize, the warm floor, cooldown since the last scale-up, disruption windows."""
    newest: dict[str, datetime] = {}
    for d in decisions:
        created = d.node.metadata.creationTimestamp
        if d.group is not None and created is not None:
            newest[d.group.name] = max(newest.get(d.group.name, created), created)
    for name, group in snapshot.inventory.groups.items():
        if group.last_launch is not None:
            newest[name] = max(newest.get(name, group.last_launch), group.last_launch)
    in_window = not policy.disruption_windows or schedule_contains(policy.disruption_windows, at)
    for d in decisions:
        if d.group is not None:
            if d.group.desired - 1 < d.group.min_size:
                d.reasons.append(f"node_group_at_min_size:{d.group.display_name}={d.group.min_size}")
            floor = _floor_of(d, floors)
            if floor is not None and floor[1] - 1 < floor[2]:
                d.reasons.append(warm_floor_reason(floor[0][1], floor[2], floor[3]))
            last = newest.get(d.group.name)
            if last is not None and (at - last).total_seconds() < policy.cooldown:
                d.reasons.append(f"cooldown:{int(policy.cooldown - (at - last).total_seconds())}s")
        if not in_window:
            d.reasons.append("outside_disruption_window")


def _reservation(reasons: Sequence[str]) -> str | None:
    """The reservation id of a ``capacity_reserved`` / ``reservation_released`` reason, or None."""
    found = reserved_kept(reasons)
    return None if found is None else found.rsplit(":", 1)[1]


def _removable_unhealthy(d: NodeDecision) -> bool:
    """An unhealthy node that nothing but its health and a pending repair keeps: no missing data, no
    busy GPU, no GPU holder, no protection (issue 28: removed before healthy idle nodes when its group
    shrinks; a node with busy GPU holders is never drained for health)."""
    rest = [
        r for r in d.reasons if code_of(r) not in UNHEALTHY_CODES and code_of(r) != "unhealthy_pending_repair"
    ]
    return verdict_of(d.reasons) == "unhealthy" and verdict_of(rest) == "idle"


def _drainable(d: NodeDecision, *, shrinking: bool) -> bool:
    """Whether the drain's eligibility (``domain.eligibility.drain_refusals``, the workflow's own) lets
    the node be drained and its instance scaled in; ``shrinking``: the plan shrinks its group anyway."""
    judged = Judged(verdict_of(d.reasons), tuple(d.reasons))
    return not drain_refusals(DrainFacts(judged, d.group.name if d.group else None, shrinking=shrinking))


def _choose(  # noqa: C901 (19): Karpenter-style budgets counted down while choosing (§3)
    decisions: list[NodeDecision],
    policy: Policy,
    stale: frozenset[str],
    floors: Floors,
    checker: ClusterPlacement | None = None,
) -> list[Action]:
    """Pick ``scale_in`` candidates among idle nodes under the disruption budget (docs/architecture.md §3),
    never below a group's warm floor; a removable unhealthy node of the group goes before each (issue 28);
    with ``checker``, only nodes whose evicted pods fit on the nodes left (``domain.placement``)."""
    flying = [
        d for d in decisions if ANN_CORDONED_BY in d.node.metadata.annotations and d.node.name not in stale
    ]
    in_flight_total = len(flying)
    in_flight_group: dict[str, int] = {}
    gone_type: dict[tuple[str, str], int] = {}  # nodes of a type leaving each group: in flight or chosen
    for d in flying:
        if d.group is not None:
            in_flight_group[d.group.name] = in_flight_group.get(d.group.name, 0) + 1
        floor = _floor_of(d, floors)
        if floor is not None:
            gone_type[floor[0]] = gone_type.get(floor[0], 0) + 1
    run_slots = policy.max_nodes_per_run - in_flight_total
    chosen_group: dict[str, int] = {}

    # The drain's own eligibility (domain.eligibility), as the workflow's validate applies it.
    idle = [d for d in decisions if verdict_of(d.reasons) == "idle" and _drainable(d, shrinking=False)]
    broken: dict[str, list[NodeDecision]] = {}
    for d in decisions:
        if d.group is not None and _removable_unhealthy(d) and _drainable(d, shrinking=True):
            broken.setdefault(d.group.name, []).append(d)

    def above_floor(d: NodeDecision) -> bool:
        floor = _floor_of(d, floors)
        return floor is None or floor[1] - gone_type.get(floor[0], 0) - 1 >= floor[2]

    def order(d: NodeDecision) -> tuple[float, int, float, str]:
        created = d.node.metadata.creationTimestamp
        return (
            -(d.hourly_usd if d.hourly_usd is not None else -1.0),
            d.pods_to_evict,
            created.timestamp() if created else float("inf"),
            d.node.name,
        )

    actions: list[Action] = []
    for d in sorted(idle, key=order):
        group = d.group
        assert group is not None
        taken = in_flight_group.get(group.name, 0) + chosen_group.get(group.name, 0)
        if group.desired - taken - 1 < group.min_size:
            d.reasons.append(f"node_group_at_min_size:{group.display_name}={group.min_size}")
            continue
        if run_slots <= 0 or taken >= policy.node_group_budget(group.desired):
            d.reasons.append("disruption_budget_exhausted")
            continue
        victim = next((u for u in sorted(broken.get(group.name, []), key=order) if above_floor(u)), None)
        if victim is None and not above_floor(d):
            floor = _floor_of(d, floors)
            assert floor is not None
            d.reasons.append(warm_floor_reason(floor[0][1], floor[2], floor[3]))
            continue
        if (
            checker is not None
            and victim is not None
            and not checker.removable(victim.node.name, victim.pods, victim.reasons)
        ):
            broken[group.name].remove(victim)
            victim = None
            if not above_floor(d):
                floor = _floor_of(d, floors)
                assert floor is not None
                d.reasons.append(warm_floor_reason(floor[0][1], floor[2], floor[3]))
                continue
        if checker is not None and victim is None and not checker.removable(d.node.name, d.pods, d.reasons):
            continue
        before = group.desired - chosen_group.get(group.name, 0)
        chosen_group[group.name] = chosen_group.get(group.name, 0) + 1
        run_slots -= 1
        d.reasons.append("idle_window_clean")
        idle_node = d
        if victim is not None:
            broken[group.name].remove(victim)
            d.reasons.append(f"unhealthy_first:{victim.node.name}")
            d = victim
        gone = _floor_of(d, floors)
        if gone is not None:
            gone_type[gone[0]] = gone_type.get(gone[0], 0) + 1
        reserved = _reservation(d.reasons)
        hourly = None if reserved else d.hourly_usd
        unhealthy = [r for r in order_reasons(d.reasons) if code_of(r) in UNHEALTHY_CODES]
        actions.append(
            Action(
                action_id=action_id("scale_in", d.node.name, before - 1),
                kind="scale_in",
                node=d.node.name,
                node_group=group.display_name,
                instance_id=d.node.instance_id,
                from_=before,
                to=before - 1,
                reason=(
                    f"unhealthy ({', '.join(unhealthy)}): removed before idle node {idle_node.node.name} as "
                    f"the group shrinks"
                    if unhealthy
                    else f"all {d.assessment.expected.total} GPU devices idle for the whole "
                    f"{_human_duration(policy.idle_window)} window"
                )
                + (
                    f"; runs in reservation {reserved}: removal saves nothing while it is held"
                    if reserved
                    else ""
                ),
                hourly_savings_usd=hourly,
                monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
                why_safe=(
                    "no GPU holder and no protection on the broken node"
                    if unhealthy
                    else f"every GPU idle for the whole {_human_duration(policy.idle_window)} window"
                )
                + "; the drain evicts only what PodDisruptionBudgets allow and uncordons on failure",
            )
        )
    for d in decisions:
        if verdict_of(d.reasons) == "idle" and "idle_window_clean" not in d.reasons:
            d.reasons.append("idle_window_clean")
    return actions


def _group_members(
    judged: Sequence[tuple[NodeDecision, list[str], Verdict]],
) -> list[tuple[AsgInfo, list[GroupMember]]]:
    """The GPU nodes of each managed node group with their verdicts, for ``domain.replacement``."""
    groups: dict[str, tuple[AsgInfo, list[GroupMember]]] = {}
    for d, reasons, verdict in judged:
        if d.group is None or not d.group.nodegroup:
            continue
        rec = d.recommendation
        member = GroupMember(
            d.node.name,
            verdict,
            d.row,
            rec.demand if rec is not None else None,
            _reservation(reasons),
            tuple(reasons),
        )
        groups.setdefault(d.group.name, (d.group, []))[1].append(member)
    return [groups[name] for name in sorted(groups)]


def _assemble(
    snapshot: ClusterSnapshot,
    policy: Policy,
    at: datetime,
    decisions: list[NodeDecision],
    scale_ins: list[Action],
    unmapped: Sequence[UnmappedSeries],
    catalog: Catalog,
    held: Mapping[str, str],
) -> Plan:
    reports: list[NodeReport] = []
    actions = list(scale_ins)
    judged: list[tuple[NodeDecision, list[str], Verdict]] = []
    for d in decisions:
        rec = d.recommendation
        reasons = order_reasons(d.reasons)
        judged.append(
            (d, reasons, verdict_of(reasons, cheaper_shape_fits=rec is not None and rec.cheaper_fits))
        )
    members = _group_members(judged)
    replacements, replaced = group_replacements(
        members, catalog, allowed=policy.allow_replace_node_group, held=held
    )
    refused = drain_refused_groups(members, allowed=policy.allow_replace_node_group)
    actions.extend(replacements)
    for d, reasons, verdict in judged:
        rec = d.recommendation
        if d.node.name in replaced:
            rec = None  # the group's replace_node_group action covers this node
        if rec is not None and rec.proposal is not None and verdict in rec.for_verdicts:
            instance = (snapshot.inventory.instances or {}).get(d.node.instance_id or "")
            facts = Judged(verdict, tuple(reasons))
            rec = resize_or_recommend(
                rec, d.node, d.row, facts, instance, policy, catalog, standalone=d.standalone
            )
        if rec is not None and rec.action is not None and verdict in rec.for_verdicts:
            reserved = _reservation(reasons)
            if reserved and rec.action.hourly_savings_usd is not None:
                note = f"; runs in reservation {reserved}: the change saves nothing while it is held"
                rec_action = rec.action.model_copy(
                    update={
                        "hourly_savings_usd": None,
                        "monthly_savings_usd": None,
                        "estimated_hourly_savings_usd": None,
                        "estimated_monthly_savings_usd": None,
                        "reason": rec.action.reason + note,
                    }
                )
                actions.append(rec_action)
            elif d.node.name in refused and rec.action.kind == "recommend":
                actions.append(
                    rec.action.model_copy(update={"reason": f"{rec.action.reason}; {refused[d.node.name]}"})
                )
            else:
                actions.append(rec.action)
        a = d.assessment
        reports.append(
            NodeReport(
                node=d.node.name,
                verdict=verdict,
                reasons=reasons,
                node_group=d.group.display_name if d.group else None,
                instance_id=d.node.instance_id,
                instance_type=d.node.instance_type,
                gpus=a.expected.physical,
                gpu_activity_max_pct=a.activity_max_pct,
                fb_used_max_mib=a.fb_used_max_mib,
                coverage=a.coverage,
                hourly_usd=d.hourly_usd,
            )
        )
    actions.sort(
        key=lambda x: (-(x.hourly_savings_usd if x.hourly_savings_usd is not None else -1.0), x.action_id)
    )
    executable = [x for x in actions if x.kind != "recommend" and x.hourly_savings_usd is not None]
    hourly = sum(x.hourly_savings_usd or 0.0 for x in executable)
    return Plan(
        at=_rfc3339(at),
        taken_at=_rfc3339(snapshot.meta.taken_at),
        dry_run=policy.dry_run,
        policy=policy.model_dump(mode="json"),
        nodes=reports,
        actions=actions,
        unmapped=[UnmappedReport(metric=u.metric, labels=u.labels, reason=u.reason) for u in unmapped],
        savings=Savings(hourly_usd=hourly, monthly_usd=hourly * HOURS_PER_MONTH),
        showback=showback(_holders(decisions), at, policy.idle_window, policy.showback_team_label),
        reservations=_reservation_reports(judged, snapshot),
    )


def _reservation_reports(
    judged: Sequence[tuple[NodeDecision, list[str], str]], snapshot: ClusterSnapshot
) -> list[ReservationReport]:
    """Unused cost per capacity reservation (``domain.capacity.reservation_use``): a node counts as unused
    when its GPUs did nothing all window (``idle`` or ``protected``: kept by the reservation, a floor, an
    idle GPU holder…); busy, unknown and unhealthy nodes do not."""
    members = []
    for d, reasons, verdict in judged:
        detail = reserved_kept(reasons)
        if detail is not None:
            idle = verdict in ("idle", "protected")
            members.append((d.node.name, detail, d.node.instance_type, idle, d.hourly_usd))
    return [
        ReservationReport(
            reservation_id=u.reservation_id,
            kind=u.kind,
            instance_type=u.instance_type,
            idle_nodes=list(u.idle_nodes),
            available=u.available,
            unused_usd_per_hour=u.unused_usd_per_hour,
            end=u.end,
            advice=u.advice,
        )
        for u in reservation_use(members, snapshot.inventory.reservations)
    ]
