"""The facts a workflow carries between its steps, one frozen model per workflow kind (issue 25).

A :class:`rightsizer.state.WorkflowRecord` holds one of these as ``details``, a discriminated union on
``kind``: ``scale_in`` (the drain and its off-hours use; records of it carry no ``kind`` key, as they
never did), ``consolidate``, ``resize_instance``, ``replace_node_group`` and ``replace_drain`` (a
replacement's child drain). The stores keep it as one JSON document exactly as earlier releases wrote it
(:meth:`Details.stored`: only the keys a step has set, instants as ``datetime.isoformat()``, numbers as
given), so records in flight during an upgrade load and finish (``tests/unit/test_workflow_details.py``
loads records frozen from the release before).

Unknown keys (a record written by a newer release, or edited by hand) are **kept**, verbatim, so a
record read by healing or ``status`` is never refused and a save never loses what another release wrote;
they are never read. Acting on facts this release does not understand is refused: the engine rolls such
a record back at its next step (``failed:unknown_facts:<keys>``, :func:`rightsizer.services.workflow.engine.run_step`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PlainSerializer, Tag, TypeAdapter

__all__ = [
    "ApprovalShown",
    "ConsolidateDetails",
    "Details",
    "DrainStepDetails",
    "NewGroupSpec",
    "PendingRollback",
    "ReplaceDetails",
    "ReplaceDrainDetails",
    "ResizeDetails",
    "ScaleInDetails",
    "TemplateVersion",
    "WorkflowDetails",
    "parse_details",
]

#: An instant stored as ``datetime.isoformat()`` (``+00:00``, never ``Z``), as earlier releases wrote it.
Instant = Annotated[datetime, PlainSerializer(lambda v: v.isoformat(), return_type=str, when_used="json")]
#: A number kept as it was given (an ``int`` stays ``3``, not ``3.0``): the stored JSON stays byte-equal.
Number = int | float


class _Part(BaseModel):
    """A nested part of the facts: frozen, unknown keys kept (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="allow")


class ApprovalShown(_Part):
    """What an approval request shows, saved by validate (``expires_at``: when it is abandoned unanswered)."""

    verdict: str | None = None
    reasons: tuple[str, ...] = ()
    instance_type: str | None = None
    expires_at: Instant


class PendingRollback(_Part):
    """A rollback whose uncordon failed and is retried (step ``rollback``): what it will end with."""

    reason: str = "rollback"
    status: str = "rolled_back"
    step: str = "rollback"


class TemplateVersion(_Part):
    """An EC2 launch template version a replacement made (deleted again by its rollback)."""

    id: str
    version: str


class NewGroupSpec(_Part):
    """The replacement node group's spec (``rightsizer.ports.ManagedNodeGroup``'s fields); ``scaling`` is
    ``[min, desired, max]`` in instances, as records in flight hold it."""

    name: str
    status: str
    instance_types: tuple[str, ...]
    scaling: tuple[int, int, int]
    labels: dict[str, str]
    taints: tuple[dict[str, str], ...]
    subnets: tuple[str, ...]
    node_role: str
    launch_template: dict[str, str] | None
    capacity_type: str | None
    ami_type: str | None
    tags: dict[str, str]
    asg_name: str | None
    health_issues: tuple[str, ...] = ()
    disk_size: int | None = None


class Details(BaseModel):
    """What every workflow kind carries.

    Attributes:
        trigger: who started it (``schedule``, ``alert:<fingerprint>``, ``offhours:<group>``, ``cli``,
            ``replace:<execution>``).
        dry_run: validate only, record what would happen.
        hourly_savings_usd: the savings the ledger books on success (USD per hour), None when unpriced.
        asg, node_group: the Auto Scaling group and node group, once validate found them.
        outcome: why the workflow ended (set by its end).
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    trigger: str = "schedule"
    dry_run: bool = True
    hourly_savings_usd: Number | None = None
    asg: str | None = None
    node_group: str | None = None
    outcome: str | None = None

    def stored(self) -> dict[str, Any]:
        """The JSON document a store keeps: the keys set so far (and unknown ones, kept), as written before."""
        return self.model_dump(mode="json", exclude_unset=True)

    def but(self, **changes: Any) -> Self:
        """A copy with ``changes`` (field name → value), validated like a load; the keys set so far stay set."""
        return self.model_validate({**self.model_dump(exclude_unset=True), **changes})

    def unknown(self) -> list[str]:
        """Keys of the stored document this release does not know (kept, never acted on), sorted."""
        return sorted(self.model_extra or {})

    # A read-only view of the stored document by key, for what prints a record (``status``, demo, tests).
    def __getitem__(self, key: str) -> Any:
        return self.stored()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.stored()

    def get(self, key: str, default: Any = None) -> Any:
        """The stored document's value at ``key``, or ``default``."""
        return self.stored().get(key, default)


class DrainStepDetails(Details):
    """What the drain's steps (validate → cordon → revalidate → evict → wait) carry, whatever follows them.

    Attributes:
        offhours: an off-hours drain (exempt from ``max_nodes_per_*``, slot floor 0).
        validated_pods: UIDs of the pods validate saw (a pod landing after them rolls back).
        desired_before, desired_after, already_done: the scale-in's group sizes (instances) and whether
            the instance was already gone.
        attempts: eviction errors per pod UID; blocked: the last round's blocked evictions;
            stuck: pods no longer waited for (``namespace/name, …``).
        approval: what the approval request shows, while one is open.
        uncordon_attempts, rollback: a rollback's failed uncordons and what it ends with;
            uncordon_pending: the uncordon failed for good (the next assessment heals it).
    """

    offhours: bool = False
    validated_pods: tuple[str, ...] = ()
    desired_before: int | None = None
    desired_after: int | None = None
    already_done: bool = False
    attempts: dict[str, int] = Field(default_factory=dict)
    blocked: tuple[str, ...] = ()
    stuck: str = ""
    approval: ApprovalShown | None = None
    uncordon_attempts: int = 0
    rollback: PendingRollback | None = None
    uncordon_pending: bool = False


class ScaleInDetails(DrainStepDetails):
    """A scale-in drain (also off-hours'): the drain, then the instance removed from its group. Its stored
    document has no ``kind`` key unless one was given."""

    kind: Literal["scale_in"] = "scale_in"


class ConsolidateDetails(DrainStepDetails):
    """A consolidation: the drain in mode ``consolidate``; ``moves`` the plan's (pod ``namespace/name``,
    node) pairs; ``placement_checked`` when the pre-eviction placement check passed."""

    kind: Literal["consolidate"]
    moves: tuple[tuple[str, str], ...] = ()
    placement_checked: Instant | None = None


class ReplaceDrainDetails(DrainStepDetails):
    """A replacement's child drain of one old node; ``parent`` is the replacement's execution id."""

    kind: Literal["replace_drain"]
    parent: str = ""


class ResizeDetails(DrainStepDetails):
    """A standalone instance's resize: the drain, then stop → set type → start.

    Attributes:
        target_type: the type asked for; want_type: the type being set (the original one while restoring);
        original_type: the type before; driver_check: ``code: detail`` of the driver rule that passed.
        stopping: the stop was asked (from here on every failure restores); resize_deadline: the current
            phase's deadline; restoring: why the original type is being restored; resumes: healer restarts.
    """

    kind: Literal["resize_instance"]
    target_type: str = ""
    original_type: str | None = None
    want_type: str | None = None
    driver_check: str | None = None
    stopping: bool = False
    resize_deadline: Instant | None = None
    restoring: str | None = None
    resumes: int = 0


class ReplaceDetails(Details):
    """A managed node group replacement (``rightsizer.services.replace``).

    Attributes:
        nodegroup, target_type: the old group and the new instance type; new_nodegroup, new_spec: the new group.
        new_lease, new_lease_epoch: the new group's lease key and epoch.
        old_type, old_scaling (``[min, desired, max]``), old_nodes: the old group as validate found it.
        per_node_savings_usd: USD per hour per old node that leaves.
        template_version_created: the launch template version made for the new group.
        creating: CreateNodegroup was called (a rollback deletes the new group).
        drain_deadline, children, drained, failures, tries: the child drains (node → execution id, counts).
        point_of_no_return, old_sizes_changed, gone_deadline: the old group scaled to 0.
        delete_after: when the old group is deleted (``replace_delete_old_after``).
    """

    kind: Literal["replace_node_group"]
    nodegroup: str
    target_type: str
    new_lease: str | None = None
    new_lease_epoch: int | None = None
    old_type: str | None = None
    old_scaling: tuple[int, int, int] | None = None
    old_nodes: tuple[str, ...] = ()
    new_nodegroup: str | None = None
    new_spec: NewGroupSpec | None = None
    per_node_savings_usd: Number | None = None
    template_version_created: TemplateVersion | None = None
    creating: bool = False
    drain_deadline: Instant | None = None
    children: dict[str, str] = Field(default_factory=dict)
    drained: dict[str, str] = Field(default_factory=dict)
    failures: dict[str, int] = Field(default_factory=dict)
    tries: dict[str, int] = Field(default_factory=dict)
    point_of_no_return: bool = False
    old_sizes_changed: bool = False
    gone_deadline: Instant | None = None
    delete_after: Instant | None = None


def _kind(value: Any) -> str:
    """The discriminator: a stored document's ``kind`` (absent on a drain's) or a model's."""
    if isinstance(value, Mapping):
        return str(value.get("kind", "scale_in"))
    return str(getattr(value, "kind", "scale_in"))


#: The facts of any workflow, chosen by ``kind``.
WorkflowDetails = Annotated[
    Annotated[ScaleInDetails, Tag("scale_in")]
    | Annotated[ConsolidateDetails, Tag("consolidate")]
    | Annotated[ReplaceDrainDetails, Tag("replace_drain")]
    | Annotated[ResizeDetails, Tag("resize_instance")]
    | Annotated[ReplaceDetails, Tag("replace_node_group")],
    Discriminator(_kind),
]

_ADAPTER: TypeAdapter[WorkflowDetails] = TypeAdapter(WorkflowDetails)


def parse_details(document: Mapping[str, Any]) -> WorkflowDetails:
    """The facts of a stored document (the JSON a store keeps).

    Raises:
        pydantic.ValidationError: an unknown ``kind``, or a known key of the wrong type.
    """
    return _ADAPTER.validate_python(dict(document))
