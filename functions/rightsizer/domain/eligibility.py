"""Whether an action kind may run on a node or group: one pure function per kind, both sides call it (issue 25).

The planner proposes an executable action only when its kind's eligibility returns no refusal (otherwise at
most a ``recommend`` naming the refusal), and every workflow's validate and revalidate call the *same*
function on fresh facts (a fresh ``NodeReport`` from the assessor, fresh EC2 / Auto Scaling / EKS reads).
Plan and act therefore agree by construction: nothing the plan lists as executable is abandoned by the
workflow for a reason the plan could have known (the local-storage resize and the hostPath node group
replacement of issue 25 were such drifts).

Each kind is an ordered tuple of :class:`Guard` entries, like the pod filters of ``domain.pods``: a guard
reads one fact and returns the refusals it finds. Adding a protection is adding one entry (or, for a
protection the assessment already reports, one reason code in ``domain.verdicts``: the ``assessment``
guard refuses every protected code the kind does not exempt). The workflow ends at the first guard that
refuses, with that guard's message (:func:`first_refusal_message`), which keeps the ledger reasons the
workflows have always written (``not_a_candidate:...``, ``preflight:...``, ``not_opted_in:...``).

Kinds and their facts:

- ``scale_in`` / off-hours drain / a node group replacement's child drain: :class:`DrainFacts`
  (:data:`DRAIN_GUARDS`, :func:`drain_refusals`);
- ``resize_instance``: :class:`ResizeFacts` (:data:`RESIZE_GUARDS`, :func:`resize_refusals`);
- ``replace_node_group``: :class:`ReplaceFacts` (:data:`REPLACE_GUARDS`, :func:`replace_refusals`), whose
  preflight runs the child drain's eligibility on every node of the old group;
- ``scale_workload`` (issue 32): :class:`WorkloadFacts` (:data:`WORKLOAD_GUARDS`, :func:`workload_refusals`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from rightsizer.domain.catalog import InstanceType
from rightsizer.domain.drivers import DriverMinimum, driver_check
from rightsizer.domain.model import TAG_ENABLED, TAG_RESIZE
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.verdicts import BUDGET_ONLY, SHRINKING_EXEMPT, Verdict, reasons_blocking
from rightsizer.domain.verdicts import OFFHOURS_EXEMPT as VERDICT_OFFHOURS_EXEMPT
from rightsizer.domain.workloads import WorkloadVerdict

F = TypeVar("F")

DrainMode = Literal["scale_in", "offhours", "replace", "consolidate"]

#: Protections a drain re-checks itself: the budget slot (the state store's) and our own cordon.
SCALE_IN_EXEMPT = BUDGET_ONLY
#: An off-hours drain is exempt from cooldown, disruption windows, MinSize and more: the schedule is the
#: operator's window (``domain.verdicts.OFFHOURS_EXEMPT``, docs/architecture.md §4 "Off-hours").
OFFHOURS_EXEMPT = VERDICT_OFFHOURS_EXEMPT
#: A replacement's child drain moves a busy node's workload (idle GPU holders included) out of a group
#: whose size no longer matters (cooldown, MinSize); its budget slot is the state store's.
REPLACE_CHILD_EXEMPT = frozenset(
    {"disruption_budget_exhausted", "idle_gpu_holder", "cooldown", "node_group_at_min_size"}
)
#: A consolidation (issue 29) moves idle GPU holders (and, in mode ``all``, busy pods) to other nodes;
#: ``no_placement`` / ``cpu_pods_pin_gpu_node`` were the scale-in's simulation: it runs its own, the plan's
#: and again right before its first eviction (``services.consolidate``).
CONSOLIDATE_EXEMPT = BUDGET_ONLY | {"idle_gpu_holder", "no_placement", "cpu_pods_pin_gpu_node"}
#: A resize moves a busy node's workload (idle GPU holders are part of it); the slot is re-checked.
RESIZE_EXEMPT = frozenset({"disruption_budget_exhausted", "idle_gpu_holder"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an action kind may not run: ``code`` (a stable reason code), ``detail`` (what, for people), and
    the ``guard`` that refused. ``reason`` is ``code:detail`` (``code`` alone without detail)."""

    code: str
    detail: str = ""
    guard: str = ""

    @property
    def reason(self) -> str:
        """``code:detail``, or ``code``."""
        return f"{self.code}:{self.detail}" if self.detail else self.code

    @classmethod
    def of_reason(cls, reason: str, guard: str) -> Refusal:
        """A refusal from a plan reason ``code:detail``."""
        code, _, detail = reason.partition(":")
        return cls(code, detail, guard)


@dataclass(frozen=True, slots=True)
class Guard(Generic[F]):
    """One entry of a kind's guard list: ``check`` reads the facts and returns the refusals it finds;
    a workflow that stops at this guard ends with ``prefix`` + the refusals' reasons joined by commas."""

    name: str
    check: Callable[[F], Iterable[Refusal]]
    prefix: str = ""


@dataclass(frozen=True, slots=True)
class Judged:
    """A node as an assessment judged it: its verdict and reasons (``domain.plan.NodeReport`` or the
    planner's own decision). ``verdict`` None: the node is not a GPU node of the assessment."""

    verdict: Verdict | None
    reasons: tuple[str, ...] = ()

    @classmethod
    def of(cls, report: NodeReport | None) -> Judged:
        """A fresh ``NodeReport`` (the assessor's) as judged facts; None: not a GPU node."""
        return cls(None) if report is None else cls(report.verdict, tuple(report.reasons))


def refusals(guards: Sequence[Guard[F]], facts: F) -> tuple[Refusal, ...]:
    """Every refusal of ``guards`` over ``facts``, in guard order (empty: the action kind may run)."""
    found: list[Refusal] = []
    for guard in guards:
        found.extend(_attributed(r, guard.name) for r in guard.check(facts))
    return tuple(found)


def first_refusal_message(guards: Sequence[Guard[F]], facts: F) -> str | None:
    """The workflow's abandon reason: the first refusing guard's ``prefix`` and its refusals' reasons
    (comma-joined), or None when no guard refuses."""
    for guard in guards:
        found = list(guard.check(facts))
        if found:
            return guard.prefix + ",".join(r.reason for r in found)
    return None


def _attributed(refusal: Refusal, guard: str) -> Refusal:
    """``refusal`` attributed to ``guard`` (unless it names one already)."""
    return refusal if refusal.guard else Refusal(refusal.code, refusal.detail, guard)


def _gpu_node(judged: Judged) -> list[Refusal]:
    return [] if judged.verdict is not None else [Refusal("not_a_gpu_node")]


def _blocking(
    judged: Judged, execution_id: str, *, exempt: AbstractSet[str], busy_blocks: bool, own: str = ""
) -> list[Refusal]:
    """Every excluded and unknown reason (never act on missing data), busy ones when ``busy_blocks``, and
    every protection whose code is not in ``exempt``; our own cordon (``in_flight:<execution_id>``) and
    the ``own`` reason (a replacement's hold on its own group) never refuse."""
    reasons = [r for r in judged.reasons if not own or r != own]
    blocking = reasons_blocking(reasons, execution_id, exempt=exempt, busy_blocks=busy_blocks)
    return [Refusal.of_reason(r, "assessment") for r in blocking]


# ---------------------------------------------------------------------------------------------- drain


@dataclass(frozen=True, slots=True)
class DrainFacts:
    """What a drain's eligibility reads about one node.

    Attributes:
        judged: the node's verdict and reasons.
        asg: the Auto Scaling group the instance is in (EC2 Auto Scaling ``DescribeAutoScalingInstances``,
            or the snapshot's inventory); None for a standalone instance or one without a provider id.
        mode: ``scale_in``, ``offhours`` (the schedule's drain) or ``replace`` (a replacement's child).
        execution_id: the asking workflow ("" for the planner): its own cordon does not refuse.
        parent: for ``replace``, the replacement execution whose ``replacement_in_progress`` is its own.
        consolidation: for ``consolidate``, policy ``consolidation`` (``idle_holders``: busy GPUs refuse;
            ``all``: they do not).
        shrinking: the plan shrinks the group anyway (its scale-in): ``SHRINKING_EXEMPT`` is lifted
            (issue 28: an unhealthy node goes first even with a repair pending).
    """

    judged: Judged
    asg: str | None
    mode: DrainMode = "scale_in"
    execution_id: str = ""
    parent: str = ""
    shrinking: bool = False
    consolidation: str = "off"


def _drain_assessment(f: DrainFacts) -> list[Refusal]:
    if f.judged.verdict is None:
        return []
    if f.mode == "replace":
        own = f"replacement_in_progress:{f.parent}" if f.parent else ""
        return _blocking(f.judged, f.execution_id, exempt=REPLACE_CHILD_EXEMPT, busy_blocks=False, own=own)
    if f.mode == "consolidate":
        if f.consolidation not in ("idle_holders", "all"):
            return [Refusal("consolidation_off", guard="assessment")]
        busy = f.consolidation == "idle_holders"
        return _blocking(f.judged, f.execution_id, exempt=CONSOLIDATE_EXEMPT, busy_blocks=busy)
    exempt = (
        OFFHOURS_EXEMPT
        if f.mode == "offhours"
        else SCALE_IN_EXEMPT | (SHRINKING_EXEMPT if f.shrinking else set())
    )
    return _blocking(f.judged, f.execution_id, exempt=exempt, busy_blocks=True)


def _in_a_group(f: DrainFacts) -> list[Refusal]:
    # Only an Auto Scaling group can take the instance away (TerminateInstanceInAutoScalingGroup).
    return [] if f.asg is not None else [Refusal("node_group_unknown", "standalone")]


DRAIN_GUARDS: tuple[Guard[DrainFacts], ...] = (
    Guard("gpu_node", lambda f: _gpu_node(f.judged), "not_a_candidate:"),
    Guard("assessment", _drain_assessment, "not_a_candidate:"),
    Guard("in_a_group", _in_a_group),
)


def drain_refusals(facts: DrainFacts) -> tuple[Refusal, ...]:
    """Why the node may not be drained (and its instance scaled in), or ``()`` when it may."""
    return refusals(DRAIN_GUARDS, facts)


# --------------------------------------------------------------------------------------------- resize


@dataclass(frozen=True, slots=True)
class ResizeFacts:
    """What a resize's eligibility reads about one standalone instance and its target.

    Attributes:
        judged: the node's verdict and reasons.
        execution_id: the asking workflow ("" for the planner).
        allow_resize: policy ``allow_resize``.
        in_group: the instance belongs to an Auto Scaling group (then its group owns its type).
        tags: the instance's EC2 tags (DescribeInstances); ``rightsizer.io/resize=allowed`` opts it in.
        state: the instance's EC2 state (``running`` ...).
        current: catalog row of the instance's type now (None when not in the catalog).
        target_type: the type to change to; ``target`` its catalog row (None when unknown).
        labels: the Node's labels (GPU Feature Discovery's driver version, ``domain.drivers``).
        driver_minimums: ``Catalog.driver_minimums``.
        allow_unknown_driver, allow_instance_store_loss: policy ``resize_allow_unknown_driver`` and
            ``resize_allow_instance_store_loss``.
    """

    judged: Judged
    allow_resize: bool
    in_group: bool
    tags: Mapping[str, str]
    state: str
    current: InstanceType | None
    current_type: str
    target_type: str
    target: InstanceType | None
    labels: Mapping[str, str] = field(default_factory=dict)
    driver_minimums: Mapping[str, DriverMinimum] = field(default_factory=dict)
    allow_unknown_driver: bool = False
    allow_instance_store_loss: bool = False
    execution_id: str = ""


def _resize_allowed(f: ResizeFacts) -> list[Refusal]:
    return [] if f.allow_resize else [Refusal("resize_not_allowed", "allow_resize")]


def _standalone(f: ResizeFacts) -> list[Refusal]:
    return [Refusal("in_auto_scaling_group")] if f.in_group else []


def resize_assessment(judged: Judged, execution_id: str = "") -> list[Refusal]:
    """The ``assessment`` guard of a resize (also what its revalidate re-runs on a fresh report): not a
    GPU node, excluded, unknown, a protection other than :data:`RESIZE_EXEMPT` and our own cordon, or no
    cheaper shape fitting (verdict other than ``underutilized``). Busy reasons are what a resize is for."""
    if judged.verdict is None:
        return [Refusal("not_a_gpu_node")]
    found = _blocking(judged, execution_id, exempt=RESIZE_EXEMPT, busy_blocks=False)
    if not found and judged.verdict != "underutilized":
        found.append(Refusal("no_cheaper_shape", judged.verdict))
    return found


def _resize_opted_in(f: ResizeFacts) -> list[Refusal]:
    return [] if f.tags.get(TAG_RESIZE) == "allowed" else [Refusal("not_opted_in", TAG_RESIZE)]


def _running(f: ResizeFacts) -> list[Refusal]:
    return [] if f.state == "running" else [Refusal(f"instance_{f.state}")]


def _target(f: ResizeFacts) -> list[Refusal]:
    if f.current_type == f.target_type:
        return [Refusal(f"already_{f.target_type}")]
    if f.target is None or f.target.gpu_count < 1:
        return [Refusal("unknown_target_type", f.target_type)]
    return []


def _instance_store(f: ResizeFacts) -> list[Refusal]:
    if f.current is None or not f.current.local_nvme_gb or f.allow_instance_store_loss:
        return []
    why = "instance-store data is lost on resize: set resize_allow_instance_store_loss: true"
    return [Refusal("instance_store_data_loss", why)]


def _driver(f: ResizeFacts) -> list[Refusal]:
    if f.target is None:
        return []
    check = driver_check(
        f.current.gpu_model if f.current else None,
        f.target.gpu_model,
        f.target.gpu_manufacturer,
        f.labels,
        f.driver_minimums,
        allow_unknown=f.allow_unknown_driver,
    )
    return [] if check.ok else [Refusal(check.code, check.detail)]


RESIZE_GUARDS: tuple[Guard[ResizeFacts], ...] = (
    Guard("allow_resize", _resize_allowed),
    Guard("standalone", _standalone),
    Guard("assessment", lambda f: resize_assessment(f.judged, f.execution_id), "not_a_candidate:"),
    Guard("opted_in", _resize_opted_in),
    Guard("running", _running),
    Guard("target", _target),
    Guard("instance_store", _instance_store, "preflight:"),
    Guard("driver", _driver, "preflight:"),
)


def resize_refusals(facts: ResizeFacts) -> tuple[Refusal, ...]:
    """Why the standalone instance may not be resized to ``facts.target_type``, or ``()`` when it may
    (the adapter's EC2 compatibility preflight, DescribeInstanceTypes, still runs before the cordon)."""
    return refusals(RESIZE_GUARDS, facts)


# ------------------------------------------------------------------------------------------- replace


@dataclass(frozen=True, slots=True)
class ReplaceMember:
    """One GPU node of the group to replace: ``judged`` as assessed, ``instance_type`` its type,
    ``cheaper_fits`` whether a cheaper type serves its own observed peak."""

    node: str
    judged: Judged
    instance_type: str | None
    cheaper_fits: bool


@dataclass(frozen=True, slots=True)
class ReplaceFacts:
    """What a node group replacement's eligibility reads.

    Attributes:
        nodegroup: the EKS managed node group name (None: the Auto Scaling group is not a managed one).
        allowed: policy ``allow_replace_node_group``.
        tags: the group's tags (the Auto Scaling group's, or EKS ``DescribeNodegroup``'s).
        in_service: instances in service in the group (Auto Scaling ``LifecycleState``).
        members: its GPU nodes as judged.
        execution_id: the asking replacement ("" for the planner): its own hold on the group is not a refusal.
    """

    nodegroup: str | None
    allowed: bool
    tags: Mapping[str, str]
    in_service: int
    members: tuple[ReplaceMember, ...]
    execution_id: str = ""


def _managed(f: ReplaceFacts) -> list[Refusal]:
    return [] if f.nodegroup else [Refusal("not_a_managed_node_group")]


def _replace_allowed(f: ReplaceFacts) -> list[Refusal]:
    return [] if f.allowed else [Refusal("replace_not_allowed", "allow_replace_node_group")]


def _group_opted_in(f: ReplaceFacts) -> list[Refusal]:
    return [] if f.tags.get(TAG_ENABLED) == "true" else [Refusal("not_opted_in", TAG_ENABLED)]


def _every_instance_a_node(f: ReplaceFacts) -> list[Refusal]:
    if f.members and len(f.members) == f.in_service:
        return []
    return [Refusal("nodes_unaccounted", f"{len(f.members)} GPU node(s) for {f.in_service} instance(s)")]


def _one_type(f: ReplaceFacts) -> list[Refusal]:
    types = {m.instance_type for m in f.members}
    return [] if len(types) == 1 and None not in types else [Refusal("mixed_instance_types")]


def _every_node_fits(f: ReplaceFacts) -> list[Refusal]:
    return [
        Refusal("no_cheaper_shape", f"{m.node}:{m.judged.verdict}")
        for m in f.members
        if m.judged.verdict != "underutilized" or not m.cheaper_fits
    ]


def _every_node_drains(f: ReplaceFacts) -> list[Refusal]:
    """The replacement preflight: every old node passes the child drain's eligibility (no asg: the
    group's membership is this replacement's own fact)."""
    out: list[Refusal] = []
    for m in f.members:
        facts = DrainFacts(m.judged, asg="", mode="replace", parent=f.execution_id)
        out.extend(
            Refusal(r.code, f"{m.node}:{r.detail}" if r.detail else m.node) for r in drain_refusals(facts)
        )
    return out


REPLACE_GUARDS: tuple[Guard[ReplaceFacts], ...] = (
    Guard("managed", _managed),
    Guard("allow_replace", _replace_allowed),
    Guard("opted_in", _group_opted_in),
    Guard("every_instance_a_node", _every_instance_a_node),
    Guard("one_type", _one_type),
    Guard("every_node_drains", _every_node_drains, "not_a_candidate:"),
    Guard("every_node_fits", _every_node_fits, "not_a_candidate:"),
)


def replace_refusals(facts: ReplaceFacts) -> tuple[Refusal, ...]:
    """Why the node group may not be replaced, or ``()`` when it may (then the planner prices the
    cheapest type serving its nodes' combined peak, ``domain.replacement``)."""
    return refusals(REPLACE_GUARDS, facts)


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    """``scale_workload`` (issue 32): the workload's verdict (``domain.workloads``), whether the policy
    scales workloads (``workloads.scale_to_zero``), and whether its owner was found when read afresh
    (None: not read yet — the plan's side)."""

    verdict: WorkloadVerdict
    allowed: bool
    owner_found: bool | None = None


def _workloads_allowed(f: WorkloadFacts) -> list[Refusal]:
    return [] if f.allowed else [Refusal("workloads.scale_to_zero", "false")]


def _workload_verdict(f: WorkloadFacts) -> list[Refusal]:
    if f.verdict.verdict != "scale_to_zero":
        return [Refusal.of_reason(r, "verdict") for r in f.verdict.reasons]
    return [] if f.verdict.method else [Refusal("no_scale_method", f.verdict.workload.text)]


def _owner_found(f: WorkloadFacts) -> list[Refusal]:
    return [Refusal("owner_not_found", f.verdict.workload.text)] if f.owner_found is False else []


WORKLOAD_GUARDS: tuple[Guard[WorkloadFacts], ...] = (
    Guard("allow_workloads", _workloads_allowed, "not_opted_in:"),
    Guard("verdict", _workload_verdict, "not_a_candidate:"),
    Guard("owner", _owner_found, "stale:"),
)


def workload_refusals(facts: WorkloadFacts) -> tuple[Refusal, ...]:
    """Why the workload may not be scaled to zero, or ``()`` when it may: the assessment selects with it,
    ``services.workloads`` re-checks it on the owner read afresh."""
    return refusals(WORKLOAD_GUARDS, facts)
