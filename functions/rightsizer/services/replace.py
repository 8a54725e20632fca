"""Managed node group replacement (issue 17; docs/architecture.md §4 "Node group replacement").

A managed node group cannot change its instance type in place, so the plan's ``replace_node_group`` runs
as one workflow per group:

``ng_validate`` → ``ng_create`` → ``ng_created`` → ``ng_ready`` → ``ng_drain`` → ``ng_scale_old`` →
``ng_gone`` (→ ``ng_delete_old``)

- **validate**: ``allow_replace_node_group``, the group's EKS tag ``rightsizer.io/enabled=true``, a fresh
  plan still proposing exactly this replacement (every node underutilized, the target serving the combined
  peak), a lease on ``nodegroup:<name>`` and one on ``nodegroup:<new name>`` (while they are held every plan
  protects both groups, ``known_replacements``; when the workflow ends past its point of no return the new
  group's passes to ``<execution>:settle`` for ``Policy.replace_settle_seconds``); the new group's spec is copied from the old one (labels, taints,
  subnets, node role, launch template, capacity type, AMI type, scaling bounds). A launch template that
  pins an instance type gets a new version with only ``InstanceType`` changed.
- **create / created / ready**: ``CreateNodegroup`` (marked in the record *before* the call, so a rollback
  knows to delete), then wait — in the state machine, never in Lambda — until it is ``ACTIVE`` and as many
  Nodes as the old group's desired size are Ready as the new type with its GPUs allocatable. A failed
  group (``CREATE_FAILED``/``DEGRADED``, capacity health issues) or ``replace_ready_timeout`` rolls back.
- **drain**: the old nodes, one disruption budget at a time, through the drain workflow's own steps
  (child records of kind ``replace_drain``: validate with its lease and budget slot → cordon → revalidate →
  evict → wait), which leave each drained node cordoned. A scale-in validated before our leases were taken
  competes for the same slots (later ones are refused: ``replacement_in_progress``); a child refused for the budget or a lease is retried, one that fails or rolls back is retried
  at most ``DRAIN_ATTEMPTS`` times before the replacement rolls back.
- **scale_old / gone**: the point of no return: ``UpdateNodegroupConfig`` min 0 / desired 0 (max kept), then
  wait until no instance is in service; only then are the savings booked (old minus new on-demand price
  per node, for the nodes that left). ``replace_delete_old_after`` (seconds, optional) deletes the old
  group after that grace period; by default it is kept at size 0.
- **rollback** (before the point of no return): uncordon every node our children cordoned, restore the old
  group's sizes if they were changed, delete the new group and the launch template version made for it
  (``DeleteLaunchTemplateVersions``; the old group runs its own version). Nothing is lost: the old nodes
  were never removed before the new ones served. After the point of no return the new group serves with
  that version, so it is kept; deleting the old group (``ng_delete_old``) touches no version of ours.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from rightsizer.domain.catalog import HOURS_PER_MONTH, Catalog
from rightsizer.domain.eligibility import (
    DrainFacts,
    Judged,
    drain_refusals,
)
from rightsizer.domain.errors import PermanentError, RightsizerError
from rightsizer.domain.model import (
    ANN_CORDONED_BY,
    GPU_RESOURCE,
    NODEGROUP_LABEL,
    TAG_ENABLED,
    GroupSizes,
    Node,
)
from rightsizer.domain.plan import NodeReport, Plan
from rightsizer.domain.replacement import KnownReplacement
from rightsizer.domain.workflow_details import (
    NewGroupSpec,
    ReplaceDetails,
    ReplaceDrainDetails,
    TemplateVersion,
)
from rightsizer.ports import InstanceTypeChanger, LaunchTemplateVersions, ManagedNodeGroup, NodeGroupReplacer
from rightsizer.services.drain import FINAL_STATUSES, POLL_S, DrainDeps, DrainRequest, StepResult
from rightsizer.services.resize import ResizeWorkflow
from rightsizer.services.workflow.engine import StepFn
from rightsizer.state import LeaseStore, LedgerEntry, WorkflowRecord

log = logging.getLogger(__name__)

KIND = "replace_node_group"
CHILD_KIND = "replace_drain"
#: Tags the replacement carries: what it replaces, and which execution created it (a retried create).
TAG_REPLACES = "rightsizer.io/replaces"
TAG_EXECUTION = "rightsizer.io/execution"
#: Node group statuses and health issues that mean the new group will not get its nodes.
FAILED_STATUSES = frozenset({"CREATE_FAILED", "DEGRADED", "DELETING", "DELETE_FAILED"})
DRAIN_ATTEMPTS = 3


#: Lease keys of node groups (a replacement holds its old and its new group's); ``:`` is never in a Node name.
LEASE_PREFIX = "nodegroup:"
#: The owner suffix of a finished replacement's hold on its new group while it settles.
SETTLE_SUFFIX = ":settle"


def replace_details(record: WorkflowRecord) -> ReplaceDetails:
    """The details of a node group replacement's record.

    Raises:
        PermanentError: the record is of another kind.
    """
    if not isinstance(record.details, ReplaceDetails):
        raise PermanentError(f"not_a_replacement_record:{record.details.kind}")
    return record.details


def lease_key(nodegroup: str) -> str:
    """The lease (and record) key of a node group's replacement; ``:`` never occurs in a Node name."""
    return f"{LEASE_PREFIX}{nodegroup}"


def replacement_name(old: str, target_type: str) -> str:
    """The new node group's name: ``<old>-<type with dots as dashes>``, at most 63 characters (EKS)."""
    suffix = "-" + target_type.replace(".", "-")
    return old[: 63 - len(suffix)] + suffix


@dataclass(frozen=True)
class ReplaceRequest(DrainRequest):
    """Replace managed node group ``nodegroup`` with one of ``target_type`` (the plan's
    ``replace_node_group``). ``node`` is :func:`lease_key` of the group; savings in USD per hour."""

    nodegroup: str = ""
    target_type: str = ""


@dataclass(frozen=True)
class ReplaceDrainRequest(DrainRequest):
    """Drain ``node`` of the old group for the replacement ``parent`` (its record's execution id)."""

    parent: str = ""


def child_facts(
    report: NodeReport | None, execution_id: str, parent: str, asg: str | None = ""
) -> DrainFacts:
    """The child drain's eligibility facts (``domain.eligibility.DrainFacts`` in mode ``replace``): busy is
    fine, the ``parent`` replacement's own ``replacement_in_progress:<parent>`` is not a protection."""
    judged = Judged(None) if report is None else Judged(report.verdict, tuple(report.reasons))
    return DrainFacts(judged, asg, "replace", execution_id, parent)


def child_blockers(report: NodeReport | None, execution_id: str, parent: str = "") -> list[str]:
    """Reasons a fresh report forbids moving an old node's pods (:func:`child_facts`' refusals): not a GPU
    node, excluded, unknown metrics (never act on missing data) or a protection other than those in
    ``domain.eligibility.REPLACE_CHILD_EXEMPT`` and the ``parent`` replacement's own hold."""
    return [r.reason for r in drain_refusals(child_facts(report, execution_id, parent))]


class FreshPlanner(Protocol):
    """A fresh plan of the cluster at ``at``; ``ignore`` names a replacement execution the plan must not
    count as in progress (validate asks about its own group while holding its leases)."""

    def __call__(self, at: datetime, *, ignore: str | None = None) -> Plan:
        """The plan (``rightsizer.domain.planner.plan`` on a fresh observation)."""
        ...


def known_replacements(
    leases: LeaseStore, now: datetime, *, ignore: str | None = None
) -> list[KnownReplacement]:
    """The replacements the plan must know at ``now``, from the live ``nodegroup:<name>`` leases (one Query):
    a running replacement holds its old and its new group's lease; one that ended past its point of no
    return leaves the new group's lease to ``<execution>:settle`` until its settle period ends. ``ignore``
    leaves out one running execution (validate's own)."""
    running: dict[str, list[str]] = {}
    settling: list[KnownReplacement] = []
    for lease in leases.live(now, prefix=LEASE_PREFIX):
        group = lease.node.removeprefix(LEASE_PREFIX)
        if lease.owner.endswith(SETTLE_SUFFIX):
            owner = lease.owner.removesuffix(SETTLE_SUFFIX)
            settling.append(KnownReplacement(owner, (group,), settling_until=lease.expires_at))
        elif lease.owner != ignore:
            running.setdefault(lease.owner, []).append(group)
    return [KnownReplacement(owner, tuple(groups)) for owner, groups in sorted(running.items())] + settling


class ReplaceWorkflow(ResizeWorkflow):
    """The drain workflow that also resizes standalone instances and replaces managed node groups.

    Records started from a :class:`ReplaceRequest` run the replacement steps; their child drains run the
    drain's steps and stop at ``drained``; every other record runs exactly as in :class:`ResizeWorkflow`.

    Args:
        deps: the drain's dependencies.
        changer: the EC2 calls of a standalone resize (None: resizes refused).
        replacer: the EKS calls of a replacement (None: replacements refused).
        templates: the EC2 launch template calls of a replacement (None: a pinned template is refused).
        planner: a fresh plan of the cluster at an instant (validate re-checks the replacement on it, its own
            leases not counted).
        catalog: instance types (GPU counts, prices); the packaged one by default.
    """

    def __init__(
        self,
        deps: DrainDeps,
        changer: InstanceTypeChanger | None,
        replacer: NodeGroupReplacer | None = None,
        templates: LaunchTemplateVersions | None = None,
        planner: FreshPlanner | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        super().__init__(deps, changer, catalog)
        self.replacer = replacer
        self.templates = templates
        self.planner = planner

    # ------------------------------------------------------------------------------------ hooks

    @staticmethod
    def _kind(record: WorkflowRecord) -> str:
        return record.details.kind

    def _facts(self, record: WorkflowRecord, report: NodeReport | None, asg: str | None) -> DrainFacts:
        """A child drain's eligibility is the drain's in mode ``replace`` (busy is what it moves)."""
        if self._kind(record) != CHILD_KIND:
            return super()._facts(record, report, asg)
        parent = record.details.parent if isinstance(record.details, ReplaceDrainDetails) else ""
        return DrainFacts(Judged.of(report), asg, "replace", record.execution_id, parent)

    def steps(self, kind: str) -> Mapping[str, StepFn]:
        """A replacement's step table (ng_validate → ng_create → ng_created → ng_ready → ng_drain →
        ng_scale_old → ng_gone → ng_delete_old); its child drain's is the drain's, ending at ``drained``."""
        if kind == CHILD_KIND:
            return {**super().steps(kind), "drained": self._step_drained}
        if kind != KIND:
            return super().steps(kind)
        return {
            "ng_validate": self._step_ng_validate,
            "ng_create": self._step_ng_create,
            "ng_created": self._step_ng_created,
            "ng_ready": self._step_ng_ready,
            "ng_drain": self._step_ng_drain,
            "ng_scale_old": self._step_ng_scale_old,
            "ng_gone": self._step_ng_gone,
            "ng_delete_old": self._step_ng_delete_old,
        }

    def _renew(self, record: WorkflowRecord) -> None:
        super()._renew(record)
        details = record.details
        if isinstance(details, ReplaceDetails) and details.new_lease_epoch is not None:
            # The new group's lease: while it is held, the plan protects the new group's nodes.
            self.deps.state.renew(
                str(details.new_lease), record.execution_id, details.new_lease_epoch, self._now(), self._ttl
            )

    def _release(self, record: WorkflowRecord) -> None:
        super()._release(record)
        details = record.details
        if not isinstance(details, ReplaceDetails) or details.new_lease_epoch is None:
            return
        key, settle = str(details.new_lease), self.deps.policy.replace_settle_seconds
        self.deps.state.release(key, record.execution_id, details.new_lease_epoch)
        if details.point_of_no_return and settle > 0:
            # The new group serves: it settles before anything may take it apart (domain.replacement).
            self.deps.state.acquire(key, record.execution_id + SETTLE_SUFFIX, self._now(), settle)

    def _holders_block(self, record: WorkflowRecord) -> bool:
        # The workload of the old node is what the replacement moves; the eviction API and PDBs still apply.
        return False if self._kind(record) == CHILD_KIND else super()._holders_block(record)

    def _slot_floor(self, record: WorkflowRecord, min_size: int) -> int:
        # The old group goes to 0 once the new one serves: its MinSize does not bound the replacement.
        return 0 if self._kind(record) == CHILD_KIND else super()._slot_floor(record, min_size)

    def _after_drain(self, record: WorkflowRecord) -> str:
        return "drained" if self._kind(record) == CHILD_KIND else super()._after_drain(record)

    def _replacer(self) -> NodeGroupReplacer:
        if self.replacer is None:
            raise PermanentError("replace_not_configured")
        return self.replacer

    # ------------------------------------------------------------------------------------ entry

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the record; a :class:`ReplaceRequest` or :class:`ReplaceDrainRequest` makes a replacement
        or child record (idempotent: an existing record of that execution is returned)."""
        if not isinstance(request, ReplaceRequest | ReplaceDrainRequest):
            return super().start(request)
        existing = self.deps.state.load(request.execution_id)
        if existing is not None:
            return existing
        now = self._now()
        common = {
            "trigger": request.trigger,
            "dry_run": self.deps.dry_run,
            "hourly_savings_usd": request.hourly_savings_usd,
        }
        details: ReplaceDetails | ReplaceDrainDetails
        if isinstance(request, ReplaceRequest):
            step, timeout = "ng_validate", self.deps.policy.replace_ready_timeout
            details = ReplaceDetails.model_validate(
                {"kind": KIND, "nodegroup": request.nodegroup, "target_type": request.target_type, **common}
            )
        else:
            step, timeout = "validate", self.deps.policy.drain_timeout
            details = ReplaceDrainDetails.model_validate(
                {"kind": CHILD_KIND, "parent": request.parent, "offhours": False, **common}
            )
        record = WorkflowRecord(
            execution_id=request.execution_id,
            node=request.node,
            instance_id=None,
            step=step,
            status="running",
            started_at=now,
            deadline=now + timedelta(seconds=timeout),
            details=details,
        )
        return self.deps.state.save(record, expected_version=0)

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """A replacement before its point of no return: uncordon what its children cordoned, restore the old
        group's sizes if changed, delete the new group and the launch template version validate made; after it (the old group already scaling to 0) the
        workflow ends ``failed`` with the reason. Other records: the drain's / resize's rollback."""
        record = self.deps.state.load(execution_id)
        if record is None or not isinstance(record.details, ReplaceDetails):
            return super().rollback(execution_id, reason, status=status, step=step)
        if record.status in FINAL_STATUSES:
            return StepResult(execution_id, step, None, record.status, 0.0, "already finished")
        details = record.details
        if details.point_of_no_return:
            return self._end(record, "failed", f"after scaling the old group to 0: {reason}", step=step)
        cluster = self.deps.state.cluster
        for node, child_id in sorted({**details.drained, **details.children}.items()):
            child = self.deps.state.load(child_id)
            if child is not None and child.status not in FINAL_STATUSES:
                super().rollback(child_id, f"replacement rolled back: {reason}")
            elif self.deps.cluster.uncordon(node, child_id):
                self.deps.cluster.emit_event(
                    node,
                    "RolledBack",
                    f"rightsizer rolled back the node group replacement: {reason}",
                    warning=True,
                )
        sizes = details.old_scaling
        if details.old_sizes_changed and sizes:
            self._replacer().update_sizes(cluster, details.nodegroup, GroupSizes(*sizes))
        deleted = ""
        if details.creating:
            gone = not self._replacer().delete_nodegroup(cluster, str(details.new_nodegroup))
            deleted = f"; new node group {details.new_nodegroup} {'already gone' if gone else 'deleted'}"
        made = details.template_version_created
        if made and self.templates is not None:
            # Ours alone: the old group runs its own version and the new group is being deleted.
            now_gone = self.templates.delete_version(made.id, made.version)
            deleted += (
                f"; launch template {made.id} v{made.version} {'deleted' if now_gone else 'already gone'}"
            )
        log.warning("replacement %s of %s rolled back: %s", execution_id, details.nodegroup, reason)
        return self._end(record, status, reason + deleted, step=step)

    # ------------------------------------------------------------------------------------ replacement steps

    def _step_ng_validate(self, record: WorkflowRecord) -> StepResult:
        deps, now, policy = self.deps, self._now(), self.deps.policy
        old, target = replace_details(record).nodegroup, replace_details(record).target_type
        cluster = deps.state.cluster
        lease = deps.state.acquire(record.node, record.execution_id, now, self._ttl)
        if lease is None:
            return self._end(record, "abandoned", "lease_held_by_other", step="ng_validate")
        record = self._save(record, lease_epoch=lease.epoch)
        new_key = lease_key(replacement_name(old, target))
        held = deps.state.acquire(new_key, record.execution_id, now, self._ttl)
        if held is None:
            # Another replacement made (or is making) a group of that name, or it is still settling.
            return self._end(record, "abandoned", f"lease_held_by_other:{new_key}", step="ng_validate")
        record = self._save(
            record, details=replace_details(record).but(new_lease=new_key, new_lease_epoch=held.epoch)
        )
        if not policy.allow_replace_node_group:
            return self._end(
                record, "abandoned", "replace_not_allowed:allow_replace_node_group", step="ng_validate"
            )
        if self.replacer is None or self.planner is None or self.templates is None:
            return self._end(record, "abandoned", "replace_not_configured", step="ng_validate")
        group = self.replacer.describe_managed(cluster, old)
        if group is None:
            return self._end(record, "abandoned", "node_group_not_found", step="ng_validate")
        template = group.launch_template
        # A launch template that names an instance type wins over the group's instanceTypes (EKS refuses both).
        pinned = self.templates.instance_type(template["id"], template["version"]) if template else None
        current = pinned or (group.instance_types[0] if len(group.instance_types) == 1 else None)
        refusal = self._refusal(group, current, target)
        if refusal is None and policy.approval_required(old, group.asg_name):
            # The approval gate (policy approval) guards single drains; a replacement has no approval step.
            refusal = "approval_required:node group replacement has no approval step"
        if refusal is not None or current is None:
            return self._end(record, "abandoned", refusal or "instance_type_unknown", step="ng_validate")
        fresh_plan = self.planner(now, ignore=record.execution_id)
        # Preflight, before CreateNodegroup: every old node passes its child drain's eligibility on fresh
        # facts (the planner's replacement guard ``every_node_drains`` calls the same function).
        refused = [
            f"{n.node}:{reason}"
            for n in fresh_plan.nodes
            if n.node_group == old
            for reason in child_blockers(n, "", record.execution_id)
        ]
        if refused:
            return self._end(record, "abandoned", "not_a_candidate:" + ",".join(refused), step="ng_validate")
        fresh = [a for a in fresh_plan.actions if a.kind == KIND and a.node_group == old and a.to == target]
        if not fresh:
            return self._end(record, "abandoned", f"not_a_candidate:no {KIND} of {old} to {target} in a fresh plan",
                             step="ng_validate")  # fmt: skip
        old_nodes = self._group_nodes(old)
        if not old_nodes:
            return self._end(record, "abandoned", "no_nodes_to_replace", step="ng_validate")
        spec, template_note, record = self._new_spec(record, group, pinned, target)
        # Priced as the fresh plan priced it: the region's prices, and none while a reservation is held.
        members = sum(1 for n in fresh_plan.nodes if n.node_group == old)
        saved = fresh[0].hourly_savings_usd
        per_node = None if saved is None or not members else saved / members
        details = replace_details(record).but(
            node_group=old,
            asg=group.asg_name,
            old_type=current,
            old_scaling=(group.scaling.min, group.scaling.desired, group.scaling.max),
            old_nodes=sorted(old_nodes),
            new_nodegroup=spec.name,
            # The sizes as [min, desired, max], as records in flight hold them.
            new_spec={
                **spec._asdict(),
                "scaling": (spec.scaling.min, spec.scaling.desired, spec.scaling.max),
            },
            per_node_savings_usd=per_node,
            hourly_savings_usd=None if per_node is None else per_node * len(old_nodes),
        )
        record = self._save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would create node group {spec.name} ({target}, {template_note}, sizes "
                f"{group.scaling.min}/{group.scaling.desired}/{group.scaling.max}), wait for its GPUs, drain {len(old_nodes)} node(s) of {old} "
                f"one disruption budget at a time and scale {old} to 0"
            )
            return self._end(record, "dry_run", message, step="ng_validate")
        return self._next(record, "ng_validate", "ng_create", message=f"validated; {template_note}")

    def _refusal(self, group: ManagedNodeGroup, current: str | None, target: str) -> str | None:
        """Why the old group (of instance type ``current``) may not be replaced by one of ``target``."""
        if group.tags.get(TAG_ENABLED) != "true":
            return f"not_opted_in:{TAG_ENABLED}"
        if group.status != "ACTIVE":
            return f"node_group_{group.status.lower()}"
        if current is None:
            return f"instance_types:{','.join(group.instance_types) or 'none'}"
        if current == target:
            return f"already_{target}"
        row = self.catalog.get(target)
        if row is None or row.gpu_count < 1:
            return f"unknown_target_type:{target}"
        if group.scaling.desired < 1 or group.asg_name is None:
            return "node_group_empty"
        return None

    def _new_spec(
        self, record: WorkflowRecord, group: ManagedNodeGroup, pinned: str | None, target: str
    ) -> tuple[ManagedNodeGroup, str, WorkflowRecord]:
        """The replacement's spec, how its launch template was handled (a new version when the old one pins
        an instance type, ``pinned``) and the record.

        The version made is saved in the record (``template_version_created``) at once, so a validate run
        again after a crash reuses it and a rollback deletes it; a dry run makes none. (A crash between
        EC2's answer and that save leaves one unused version: the call returns nothing to find it by first.)
        """
        template, note = group.launch_template, "no launch template"
        instance_types: tuple[str, ...] = (target,)
        if template is not None:
            if pinned is None:
                note = f"launch template {template['id']} v{template['version']} as is"
            else:
                assert self.templates is not None  # checked by validate
                made = replace_details(record).template_version_created
                if record.details.dry_run:
                    version = "(new)"
                elif made is not None:
                    version = made.version
                else:
                    version = self.templates.new_version(template["id"], template["version"], target)
                    created = TemplateVersion(id=template["id"], version=version)
                    record = self._save(
                        record, details=replace_details(record).but(template_version_created=created)
                    )
                note = (
                    f"launch template {template['id']} v{version} (v{template['version']} pinned {pinned})"
                    if not record.details.dry_run
                    else f"a new version of launch template {template['id']} (v{template['version']} pins {pinned})"
                )
                template = {"id": template["id"], "version": version}
                instance_types = ()  # EKS refuses instanceTypes beside a template that names one
        tags = {
            **{k: v for k, v in group.tags.items() if not k.startswith("aws:")},
            TAG_ENABLED: "true",
            TAG_REPLACES: group.name,
            TAG_EXECUTION: record.execution_id[-63:],
        }
        spec = group._replace(
            name=replacement_name(group.name, target),
            status="",
            instance_types=instance_types,
            launch_template=template,
            tags=tags,
            asg_name=None,
            health_issues=(),
        )
        return spec, note, record

    def _step_ng_create(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        stored = replace_details(record).new_spec
        assert stored is not None  # validate made it
        minimum, desired, maximum = stored.scaling
        fields = {name: getattr(stored, name) for name in NewGroupSpec.model_fields}
        spec = ManagedNodeGroup(**{**fields, "scaling": GroupSizes(minimum, desired, maximum)})
        # Persisted before the call: from here on a rollback deletes the new group.
        record = self._save(record, details=replace_details(record).but(creating=True))
        self._replacer().create_nodegroup(self.deps.state.cluster, spec, record.execution_id[-64:])
        return self._next(record, "ng_create", "ng_created", wait=POLL_S, message=f"creating {spec.name}")

    def _step_ng_created(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        name = str(replace_details(record).new_nodegroup)
        group = self._replacer().describe_managed(self.deps.state.cluster, name)
        if group is None:
            return self.rollback(record.execution_id, f"new node group {name} disappeared", step="ng_created")
        failed = self._failed(group)
        if failed:
            return self.rollback(record.execution_id, failed, step="ng_created")
        if group.status == "ACTIVE":
            return self._next(record, "ng_created", "ng_ready", message=f"{name} ACTIVE")
        if self._now() > record.deadline:
            return self.rollback(
                record.execution_id, f"deadline: {name} still {group.status}", step="ng_created"
            )
        return self._next(record, "ng_created", "ng_created", wait=POLL_S, message=f"{name} {group.status}")

    @staticmethod
    def _failed(group: ManagedNodeGroup) -> str:
        if group.status in FAILED_STATUSES:
            issues = ",".join(group.health_issues) or "no health issue reported"
            return f"no_capacity: new node group {group.name} is {group.status} ({issues})"
        return ""

    def _step_ng_ready(self, record: WorkflowRecord) -> StepResult:
        """As many Nodes of the new group as the old group's desired size, Ready as the new type with its
        GPUs allocatable."""
        self._renew(record)
        details = replace_details(record)
        name, target = str(details.new_nodegroup), details.target_type
        group = self._replacer().describe_managed(self.deps.state.cluster, name)
        failed = "new node group disappeared" if group is None else self._failed(group)
        if failed:
            return self.rollback(record.execution_id, failed, step="ng_ready")
        want = self._old_sizes(record).desired
        row = self.catalog.get(target)
        gpus = row.gpu_count if row else 1
        ready = [n for n in self._group_nodes(name).values() if _serves(n, target, gpus)]
        if len(ready) >= want:
            drains = math.ceil(len(details.old_nodes) / self._budget(record)) + 1
            deadline = self._now() + timedelta(seconds=self.deps.policy.drain_timeout * drains)
            return self._next(record, "ng_ready", "ng_drain", details=details.but(drain_deadline=deadline, children={}, drained={}),
                              message=f"{len(ready)} node(s) of {name} Ready as {target}, {gpus} GPU(s) each")  # fmt: skip
        missing = f"{len(ready)}/{want} node(s) of {name} Ready as {target} with {gpus} GPU(s) allocatable"
        if self._now() > record.deadline:
            return self.rollback(record.execution_id, f"deadline: {missing}", step="ng_ready")
        return self._next(record, "ng_ready", "ng_ready", wait=POLL_S, message=f"waiting: {missing}")

    def _budget(self, record: WorkflowRecord) -> int:
        policy = self.deps.policy
        return max(
            1, min(policy.max_nodes_per_run, policy.node_group_budget(self._old_sizes(record).desired))
        )

    @staticmethod
    def _old_sizes(record: WorkflowRecord) -> GroupSizes:
        """The old group's sizes as validate found them."""
        sizes = replace_details(record).old_scaling
        assert sizes is not None  # validate saved them
        return GroupSizes(*sizes)

    def _step_ng_drain(self, record: WorkflowRecord) -> StepResult:
        """Step the children in flight once; start new ones up to the disruption budget; done when every
        old node that still exists was drained."""
        self._renew(record)
        details = replace_details(record)
        children: dict[str, str] = dict(details.children)
        drained: dict[str, str] = dict(details.drained)
        failures: dict[str, int] = dict(details.failures)
        notes: list[str] = []
        for node, child_id in sorted(children.items()):
            result = self._advance(child_id)
            if result is not None and not result.finished:
                continue
            del children[node]
            child = self.deps.state.load(child_id)
            status = child.status if child is not None else "missing"
            if status == "succeeded":
                drained[node] = child_id
            elif child is not None and _refused(child):
                # The node's eligibility refuses the drain on fresh facts: retrying cannot help (issue 25).
                self._save(record, details=details.but(children=children, drained=drained))
                return self.rollback(record.execution_id, f"drain_refused:{node}: {child.details.outcome}",
                                     step="ng_drain")  # fmt: skip
            elif status != "abandoned":
                failures[node] = failures.get(node, 0) + 1
                reason = result.message if result is not None else status
                if failures[node] >= DRAIN_ATTEMPTS:
                    self._save(record, details=details.but(children=children, drained=drained))
                    return self.rollback(
                        record.execution_id, f"drain_failed:{node}: {reason}", step="ng_drain"
                    )
                notes.append(f"{node}: {status} ({reason}); will retry")
            else:
                notes.append(f"{node}: {result.message if result else status}; will retry")
        present = set(self._group_nodes(details.nodegroup))
        todo = [n for n in details.old_nodes if n in present and n not in drained and n not in children]
        if not todo and not children:
            record = self._save(record, details=details.but(children=children, drained=drained))
            return self._next(
                record, "ng_drain", "ng_scale_old", message=f"{len(drained)} old node(s) drained"
            )
        if details.drain_deadline is not None and self._now() > details.drain_deadline:
            self._save(record, details=details.but(children=children, drained=drained))
            return self.rollback(record.execution_id, "drain deadline: " + ("; ".join(notes) or f"{len(todo)} left"),
                                 step="ng_drain")  # fmt: skip
        tries: dict[str, int] = dict(details.tries)
        for node in todo[: max(0, self._budget(record) - len(children))]:
            tries[node] = tries.get(node, 0) + 1
            child_id = f"{record.execution_id}.{details.old_nodes.index(node)}.{tries[node]}"
            children[node] = child_id
            # The child is recorded before it starts: a crash here resumes it instead of starting another.
            record = self._save(record, details=details.but(children=children, drained=drained,
                                                            failures=failures, tries=tries))  # fmt: skip
            self.start(
                ReplaceDrainRequest(
                    node, child_id, f"replace:{record.execution_id}", parent=record.execution_id
                )
            )
            result = self._advance(child_id)
            if result is not None and result.finished:
                del children[node]
                child = self.deps.state.load(child_id)
                if child is not None and child.status == "succeeded":
                    drained[node] = child_id
                elif child is not None and _refused(child):
                    self._save(record, details=details.but(children=children, drained=drained,
                                                           failures=failures, tries=tries))  # fmt: skip
                    return self.rollback(record.execution_id, f"drain_refused:{node}: {child.details.outcome}",
                                         step="ng_drain")  # fmt: skip
                else:
                    notes.append(f"{node}: {result.message}; will retry")
        record = self._save(
            record,
            details=details.but(children=children, drained=drained, failures=failures, tries=tries),
        )
        message = f"{len(drained)}/{len(details.old_nodes)} drained, {len(children)} draining"
        return self._next(record, "ng_drain", "ng_drain", wait=POLL_S,
                          message=message + ("; " + "; ".join(notes) if notes else ""))  # fmt: skip

    def _advance(self, child_id: str) -> StepResult | None:
        """Run the child's current step once (its waits are the parent's poll); None when it already ended."""
        child = self.deps.state.load(child_id)
        if child is None or child.status in FINAL_STATUSES:
            return None
        try:
            return self.step(child_id)
        except RightsizerError as exc:
            # A transient failure (the step maps the others to a rollback): the record is unchanged and
            # the child's step is tried again at the parent's next poll.
            log.info("child drain %s: %s; retrying", child_id, exc)
            return StepResult(child_id, child.step, child.step, "running", POLL_S, str(exc))

    def _step_drained(self, record: WorkflowRecord) -> StepResult:
        """A child's end: the node is drained and stays cordoned until its group scales to 0."""
        self._renew(record)
        node_obj = self.deps.cluster.get_node(record.node)
        if (
            node_obj is not None
            and Node.model_validate(node_obj).metadata.annotations.get(ANN_CORDONED_BY) != record.execution_id
        ):
            return self.rollback(record.execution_id, "our cordon is gone", step="drained")
        self.deps.cluster.emit_event(
            record.node, "Drained", f"rightsizer drained the node for {_parent(record)}; it stays "
            "cordoned until its node group scales to 0",
        )  # fmt: skip
        return self._end(record, "succeeded", "drained; stays cordoned until the old group is at 0",
                         step="drained", savings=False)  # fmt: skip

    def _step_ng_scale_old(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        old = replace_details(record).nodegroup
        maximum = max(1, self._old_sizes(record).max)
        deadline = self._now() + timedelta(seconds=self.deps.policy.replace_ready_timeout)
        record = self._save(record, details=replace_details(record).but(
            point_of_no_return=True, old_sizes_changed=True, gone_deadline=deadline))  # fmt: skip
        self._replacer().update_sizes(self.deps.state.cluster, old, GroupSizes(0, 0, maximum))
        return self._next(
            record,
            "ng_scale_old",
            "ng_gone",
            wait=POLL_S,
            message=f"{old}: min 0 / desired 0 / max {maximum}",
        )

    def _step_ng_gone(self, record: WorkflowRecord) -> StepResult:
        """Savings are booked once no instance of the old group is in service any more."""
        self._renew(record)
        details = replace_details(record)
        asg, old = str(details.asg), details.nodegroup
        group = self.deps.scaler.describe_group(asg)
        desired, ids = group.sizes.desired, group.in_service
        if ids or desired:
            if details.gone_deadline is not None and self._now() > details.gone_deadline:
                return self._end(record, "failed", f"{old} still has {len(ids)} instance(s) in service", step="ng_gone",
                                 savings=False)  # fmt: skip
            return self._next(
                record, "ng_gone", "ng_gone", wait=POLL_S, message=f"{len(ids)} old instance(s) left"
            )
        left = len(details.drained)
        per_node = details.per_node_savings_usd
        hourly = None if per_node is None else float(per_node) * left
        record = self._save(record, details=details.but(hourly_savings_usd=hourly))
        new, target = details.new_nodegroup, details.target_type
        reason = f"{old} ({details.old_type}) at 0 after {left} node(s) moved to {new} ({target})"
        # One entry for the group, the savings of its ``left`` old instances from now on (services.realized).
        entry = LedgerEntry(
            execution_id=record.execution_id,
            node=record.node,
            instance_id=None,
            node_group=old,
            kind=KIND,
            step="ng_gone",
            result="applied",
            reason=reason,
            hourly_savings_usd=hourly,
            monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
            at=self._now(),
            instances=left,
        )
        self.deps.state.record(entry)
        after = self.deps.policy.replace_delete_old_after
        if after is None:
            return self._end(
                record, "succeeded", reason + f"; {old} kept at size 0", step="ng_gone", savings=False
            )
        details = details.but(delete_after=self._now() + timedelta(seconds=after))
        return self._next(
            record, "ng_gone", "ng_delete_old", wait=float(after), details=details, message=reason
        )

    def _step_ng_delete_old(self, record: WorkflowRecord) -> StepResult:
        self._renew(record)
        old = replace_details(record).nodegroup
        due = replace_details(record).delete_after or self._now()
        if self._now() < due:
            return self._next(
                record, "ng_delete_old", "ng_delete_old", wait=(due - self._now()).total_seconds()
            )
        self._replacer().delete_nodegroup(self.deps.state.cluster, old)
        return self._end(record, "succeeded", f"old node group {old} deleted after its grace period",
                         step="ng_delete_old", savings=False)  # fmt: skip

    # ------------------------------------------------------------------------------------ helpers

    def _group_nodes(self, nodegroup: str) -> dict[str, Node]:
        """Nodes labelled ``eks.amazonaws.com/nodegroup=<nodegroup>``, by name (uncached list)."""
        nodes = (Node.model_validate(n) for n in self.deps.cluster.list_nodes())
        return {n.name: n for n in nodes if n.metadata.labels.get(NODEGROUP_LABEL) == nodegroup}


#: Ends of a child drain that are its node's eligibility refusing (validate's guards, or the pods'
#: protections on fresh reads at validate and revalidate): final for the replacement.
REFUSED_OUTCOMES = ("not_a_candidate:", "protected:")


def _refused(child: WorkflowRecord) -> bool:
    """Whether the child drain ended refused by its node's eligibility (not the budget, a lease or a race)."""
    outcome = child.details.outcome or ""
    return child.status in ("abandoned", "rolled_back") and outcome.startswith(REFUSED_OUTCOMES)


def _parent(record: WorkflowRecord) -> str:
    """The replacement a child drain works for (its record's ``parent``)."""
    return record.details.parent if isinstance(record.details, ReplaceDrainDetails) else ""


def _serves(node: Node, instance_type: str, gpus: int) -> bool:
    """Ready, of ``instance_type``, with ``gpus`` GPUs allocatable, not being deleted."""
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    return (
        ready
        and node.instance_type == instance_type
        and node.allocatable_count(GPU_RESOURCE) >= gpus
        and node.metadata.deletionTimestamp is None
    )
