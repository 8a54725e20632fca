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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Protocol

from rightsizer.domain.catalog import Catalog, load_catalog
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.model import (
    TAG_ENABLED,
    GroupSizes,
)
from rightsizer.domain.plan import Plan
from rightsizer.domain.replacement import KnownReplacement
from rightsizer.domain.workflow_details import (
    ReplaceDetails,
    TemplateVersion,
)
from rightsizer.ports import InstanceTypeChanger, LaunchTemplateVersions, ManagedNodeGroup, NodeGroupReplacer
from rightsizer.services import replace_drain, replace_steps
from rightsizer.services.drain import ScaleIn
from rightsizer.services.replace_drain import ReplaceDrain
from rightsizer.services.replace_drain import ReplaceDrainRequest as ReplaceDrainRequest
from rightsizer.services.replace_drain import child_blockers as child_blockers
from rightsizer.services.replace_drain import child_facts as child_facts
from rightsizer.services.replace_steps import group_nodes, replace_details
from rightsizer.services.resize import Resize
from rightsizer.services.workflow.engine import FINAL_STATUSES, StepFn, StepResult
from rightsizer.services.workflow.executor import Executor, Kind
from rightsizer.services.workflow.record_ops import RecordOps
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
from rightsizer.state import LeaseStore, WorkflowRecord

log = logging.getLogger(__name__)

KIND = "replace_node_group"
#: The kind of a replacement's child drains (``rightsizer.services.replace_drain``).
CHILD_KIND = replace_drain.KIND
#: Tags the replacement carries: what it replaces, and which execution created it (a retried create).
TAG_REPLACES = "rightsizer.io/replaces"
TAG_EXECUTION = "rightsizer.io/execution"
#: Lease keys of node groups (a replacement holds its old and its new group's); ``:`` is never in a Node name.
LEASE_PREFIX = "nodegroup:"
#: The owner suffix of a finished replacement's hold on its new group while it settles.
SETTLE_SUFFIX = ":settle"


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


class Replace:
    """The node group replacement kind: its own steps (module docstring), its child drains run by the
    :class:`~rightsizer.services.replace_drain.ReplaceDrain` kind it is given.

    Args:
        deps: the workflow's dependencies.
        child: the child drain kind (started, stepped and rolled back by the replacement).
        replacer: the EKS calls of a replacement (None: replacements refused).
        templates: the EC2 launch template calls of a replacement (None: a pinned template is refused).
        planner: a fresh plan of the cluster at an instant (validate re-checks the replacement on it, its own
            leases not counted).
        catalog: instance types (GPU counts, prices).
    """

    name = KIND
    request_type = ReplaceRequest

    def __init__(
        self,
        deps: DrainDeps,
        child: ReplaceDrain,
        replacer: NodeGroupReplacer | None,
        templates: LaunchTemplateVersions | None,
        planner: FreshPlanner | None,
        catalog: Catalog,
    ) -> None:
        self.deps = deps
        self.child = child
        self.replacer = replacer
        self.templates = templates
        self.planner = planner
        self.catalog = catalog
        self.ops = RecordOps(deps, also_renew=self._renew_new_group, also_release=self._release_new_group)

    def steps(self) -> Mapping[str, StepFn]:
        """ng_validate → ng_create → ng_created → ng_ready → ng_drain → ng_scale_old → ng_gone → ng_delete_old."""
        return {
            "ng_validate": self.ng_validate,
            "ng_create": partial(replace_steps.ng_create, self),
            "ng_created": partial(replace_steps.ng_created, self),
            "ng_ready": partial(replace_steps.ng_ready, self),
            "ng_drain": partial(replace_steps.ng_drain, self),
            "ng_scale_old": partial(replace_steps.ng_scale_old, self),
            "ng_gone": partial(replace_steps.ng_gone, self),
            "ng_delete_old": partial(replace_steps.ng_delete_old, self),
        }

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """A replacement has no approval step (validate refuses one that would need it)."""
        record = self.deps.state.load(execution_id)
        step = record.step if record is not None else "approval"
        status = record.status if record is not None else "failed"
        return StepResult(execution_id, "approval", step, status, 0.0, "not waiting")

    def _renew_new_group(self, record: WorkflowRecord) -> None:
        """The new group's lease: while it is held, the plan protects the new group's nodes."""
        details = record.details
        if isinstance(details, ReplaceDetails) and details.new_lease_epoch is not None:
            self.deps.state.renew(
                str(details.new_lease),
                record.execution_id,
                details.new_lease_epoch,
                self.ops.now(),
                self.ops.ttl,
            )

    def _release_new_group(self, record: WorkflowRecord) -> None:
        """Give back the new group's lease; past the point of no return it settles first (domain.replacement)."""
        details = record.details
        if not isinstance(details, ReplaceDetails) or details.new_lease_epoch is None:
            return
        key, settle = str(details.new_lease), self.deps.policy.replace_settle_seconds
        self.deps.state.release(key, record.execution_id, details.new_lease_epoch)
        if details.point_of_no_return and settle > 0:
            self.deps.state.acquire(key, record.execution_id + SETTLE_SUFFIX, self.ops.now(), settle)

    def eks(self) -> NodeGroupReplacer:
        if self.replacer is None:
            raise PermanentError("replace_not_configured")
        return self.replacer

    # ------------------------------------------------------------------------------------ entry

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the replacement's record (idempotent: an existing record of that execution is returned)."""
        assert isinstance(request, ReplaceRequest)
        return self.ops.create(
            request,
            ReplaceDetails(
                kind=KIND,
                nodegroup=request.nodegroup,
                target_type=request.target_type,
                trigger=request.trigger,
                dry_run=self.deps.dry_run,
                hourly_savings_usd=request.hourly_savings_usd,
            ),
            step="ng_validate",
            timeout=self.deps.policy.replace_ready_timeout,
        )

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """A replacement before its point of no return: uncordon what its children cordoned, restore the old
        group's sizes if changed, delete the new group and the launch template version validate made; after it (the old group already scaling to 0) the
        workflow ends ``failed`` with the reason. Other records: the drain's / resize's rollback."""
        record = self.deps.state.load(execution_id)
        if record is None:
            raise KeyError(execution_id)
        if not isinstance(record.details, ReplaceDetails):
            raise PermanentError(f"not_a_replacement_record:{record.details.kind}")
        if record.status in FINAL_STATUSES:
            return StepResult(execution_id, step, None, record.status, 0.0, "already finished")
        details = record.details
        if details.point_of_no_return:
            return self.ops.end(record, "failed", f"after scaling the old group to 0: {reason}", step=step)
        cluster = self.deps.state.cluster
        for node, child_id in sorted({**details.drained, **details.children}.items()):
            child = self.deps.state.load(child_id)
            if child is not None and child.status not in FINAL_STATUSES:
                self.child.rollback(child_id, f"replacement rolled back: {reason}")
            elif self.deps.cluster.uncordon(node, child_id):
                self.deps.cluster.emit_event(
                    node,
                    "RolledBack",
                    f"rightsizer rolled back the node group replacement: {reason}",
                    warning=True,
                )
        sizes = details.old_scaling
        if details.old_sizes_changed and sizes:
            self.eks().update_sizes(cluster, details.nodegroup, GroupSizes(*sizes))
        deleted = ""
        if details.creating:
            gone = not self.eks().delete_nodegroup(cluster, str(details.new_nodegroup))
            deleted = f"; new node group {details.new_nodegroup} {'already gone' if gone else 'deleted'}"
        made = details.template_version_created
        if made and self.templates is not None:
            # Ours alone: the old group runs its own version and the new group is being deleted.
            now_gone = self.templates.delete_version(made.id, made.version)
            deleted += (
                f"; launch template {made.id} v{made.version} {'deleted' if now_gone else 'already gone'}"
            )
        log.warning("replacement %s of %s rolled back: %s", execution_id, details.nodegroup, reason)
        return self.ops.end(record, status, reason + deleted, step=step)

    # ------------------------------------------------------------------------------------ replacement steps

    def ng_validate(self, record: WorkflowRecord) -> StepResult:
        deps, now, policy = self.deps, self.ops.now(), self.deps.policy
        old, target = replace_details(record).nodegroup, replace_details(record).target_type
        cluster = deps.state.cluster
        lease = deps.state.acquire(record.node, record.execution_id, now, self.ops.ttl)
        if lease is None:
            return self.ops.end(record, "abandoned", "lease_held_by_other", step="ng_validate")
        record = self.ops.save(record, lease_epoch=lease.epoch)
        new_key = lease_key(replacement_name(old, target))
        held = deps.state.acquire(new_key, record.execution_id, now, self.ops.ttl)
        if held is None:
            # Another replacement made (or is making) a group of that name, or it is still settling.
            return self.ops.end(record, "abandoned", f"lease_held_by_other:{new_key}", step="ng_validate")
        record = self.ops.save(
            record, details=replace_details(record).but(new_lease=new_key, new_lease_epoch=held.epoch)
        )
        if not policy.allow_replace_node_group:
            return self.ops.end(
                record, "abandoned", "replace_not_allowed:allow_replace_node_group", step="ng_validate"
            )
        if self.replacer is None or self.planner is None or self.templates is None:
            return self.ops.end(record, "abandoned", "replace_not_configured", step="ng_validate")
        group = self.replacer.describe_managed(cluster, old)
        if group is None:
            return self.ops.end(record, "abandoned", "node_group_not_found", step="ng_validate")
        template = group.launch_template
        # A launch template that names an instance type wins over the group's instanceTypes (EKS refuses both).
        pinned = self.templates.instance_type(template["id"], template["version"]) if template else None
        current = pinned or (group.instance_types[0] if len(group.instance_types) == 1 else None)
        refusal = self._refusal(group, current, target)
        if refusal is None and policy.approval_required(old, group.asg_name):
            # The approval gate (policy approval) guards single drains; a replacement has no approval step.
            refusal = "approval_required:node group replacement has no approval step"
        if refusal is not None or current is None:
            return self.ops.end(record, "abandoned", refusal or "instance_type_unknown", step="ng_validate")
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
            return self.ops.end(
                record, "abandoned", "not_a_candidate:" + ",".join(refused), step="ng_validate"
            )
        fresh = [a for a in fresh_plan.actions if a.kind == KIND and a.node_group == old and a.to == target]
        if not fresh:
            return self.ops.end(record, "abandoned", f"not_a_candidate:no {KIND} of {old} to {target} in a fresh plan",
                             step="ng_validate")  # fmt: skip
        old_nodes = group_nodes(self, old)
        if not old_nodes:
            return self.ops.end(record, "abandoned", "no_nodes_to_replace", step="ng_validate")
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
        record = self.ops.save(record, details=details)
        if record.details.dry_run:
            message = (
                f"dry run: would create node group {spec.name} ({target}, {template_note}, sizes "
                f"{group.scaling.min}/{group.scaling.desired}/{group.scaling.max}), wait for its GPUs, drain {len(old_nodes)} node(s) of {old} "
                f"one disruption budget at a time and scale {old} to 0"
            )
            return self.ops.end(record, "dry_run", message, step="ng_validate")
        return self.ops.next(record, "ng_validate", "ng_create", message=f"validated; {template_note}")

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
                    record = self.ops.save(
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


def replacement_kinds(
    deps: DrainDeps,
    changer: InstanceTypeChanger | None,
    replacer: NodeGroupReplacer | None = None,
    templates: LaunchTemplateVersions | None = None,
    planner: FreshPlanner | None = None,
    catalog: Catalog | None = None,
) -> list[Kind]:
    """The kinds of :class:`ReplaceWorkflow`: scale-in, resize, node group replacement and its child drain."""
    rows = catalog or load_catalog()
    child = ReplaceDrain(deps)
    return [
        ScaleIn(deps),
        Resize(deps, changer, rows),
        Replace(deps, child, replacer, templates, planner, rows),
        child,
    ]


class ReplaceWorkflow(Executor):
    """The executor of scale-ins, resizes of standalone instances and managed node group replacements.

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
        super().__init__(deps, replacement_kinds(deps, changer, replacer, templates, planner, catalog))
