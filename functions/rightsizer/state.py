"""Durable state of the act phase: ports (Protocols) and the value types that cross them.

docs/architecture.md §3 "Disruption budget (ours)", §4 "Lease", "Off-hours", "Webhook" and BUG-32 (resumable drains).
Two implementations keep the same semantics and are held to it by one contract suite
(``tests/integration/test_state_contract.py``): :class:`rightsizer.adapters.dynamodb_state.DynamoDbState`
(production, one DynamoDB table) and :class:`rightsizer.adapters.memory_state.MemoryState` (in memory).

Ports are small and named by capability, so a use case asks only for what it needs:

- :class:`LeaseStore` — one node lease per node, fenced by an increasing ``epoch``;
- :class:`BudgetSlots` — our disruption budget (nodes in flight per cluster and per node group);
- :class:`Ledger` — one record per action/step outcome, with its savings;
- :class:`WorkflowRecords` — the per-execution drain record with optimistic concurrency;
- :class:`OffhoursStore` — the node group sizes saved before an off-hours scale-down;
- :class:`StateStore` — all of the above, what the wiring builds once per cold start.

A store instance is bound to one cluster (leases, slots, off-hours sizes and the cluster-wide ledger
view are per cluster); execution ids are globally unique, so workflow records and a single execution's
ledger entries are not.

Time is always an argument (``now``), never read from a clock; every datetime must be timezone-aware
(a naive one raises ``ValueError``). Expected refusals (lease held by another, no budget slot, a
second off-hours save) are return values; errors are raised only as the taxonomy of
:mod:`rightsizer.domain.errors` (``TransientError`` for throttling, ``ConfigError`` for a missing table,
``PermanentError`` for access denied) plus the two :class:`~rightsizer.domain.errors.StalePlan`
subclasses below.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol, runtime_checkable

from rightsizer.domain.errors import StalePlan
from rightsizer.domain.model import GroupSizes
from rightsizer.domain.workflow_details import ScaleInDetails, WorkflowDetails

__all__ = [
    "APPROVAL_STATUSES",
    "LEDGER_RESULTS",
    "LEDGER_RETENTION",
    "REFUSAL_AT_MIN_SIZE",
    "REFUSAL_BUDGET_EXHAUSTED",
    "REFUSAL_SLOT_HELD",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalStatus",
    "ApprovalStore",
    "BudgetSlots",
    "ConflictError",
    "EvictedPod",
    "Lease",
    "LeaseLostError",
    "LeaseStore",
    "Ledger",
    "LedgerEntry",
    "LedgerResult",
    "OffhoursStore",
    "PlanHistory",
    "SavedSizes",
    "Slot",
    "SlotRefusal",
    "StateStore",
    "WorkflowRecord",
    "WorkflowRecords",
    "approval_decision",
    "lease_ttl_seconds",
    "require_aware",
    "slot_refusal",
    "sorted_slots",
]

#: Refusal reason codes of :meth:`BudgetSlots.take_slot` (the first two are docs/architecture.md §3 reason codes).
REFUSAL_BUDGET_EXHAUSTED: Final = "disruption_budget_exhausted"
REFUSAL_AT_MIN_SIZE: Final = "node_group_at_min_size"
#: Another execution holds the slot of this very node (it is already in flight).
REFUSAL_SLOT_HELD: Final = "slot_held_by_other"

#: How long ledger items live before DynamoDB TTL deletes them.
LEDGER_RETENTION: Final = timedelta(days=90)

LedgerResult = Literal["applied", "already_done", "abandoned", "rolled_back", "failed", "dry_run"]
LEDGER_RESULTS: Final[frozenset[str]] = frozenset(
    {"applied", "already_done", "abandoned", "rolled_back", "failed", "dry_run"}
)

# docs/architecture.md §4: a lease outlives the drain deadline by this margin so that the last steps (remove,
# verify) still run under it.
_LEASE_MARGIN: Final = timedelta(minutes=5)


def require_aware(value: datetime, name: str = "now") -> datetime:
    """Return ``value`` unchanged; raise ``ValueError`` when it is naive (no ``tzinfo``).

    Naive datetimes would compare as local time on one machine and UTC on another: refuse them.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {value.isoformat()}")
    return value


def lease_ttl_seconds(drain_timeout: timedelta) -> int:
    """Lease duration in seconds for a drain: ``drain_timeout`` + 5 min (docs/architecture.md §4 "Lease")."""
    return int((drain_timeout + _LEASE_MARGIN).total_seconds())


class LeaseLostError(StalePlan):
    """The caller no longer holds the lease epoch it named (expired, released or taken over).

    A :class:`~rightsizer.domain.errors.StalePlan`: the workflow abandons without further side effects.
    """


class ConflictError(StalePlan):
    """A workflow record was saved by someone else since it was loaded (version mismatch).

    ``expected`` is the version the caller read, ``actual`` the stored one (``None`` when absent).
    """

    def __init__(self, message: str, *, expected: int, actual: int | None) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


# --------------------------------------------------------------------------------------------------
# Node lease
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """A node lease (docs/architecture.md §4): who drains ``node`` and until when.

    Attributes:
        cluster: cluster name the store is bound to.
        node: Kubernetes Node name.
        epoch: fencing token, 1 for the first acquisition of this node, +1 on each new acquisition
            (never reused, also across releases).
        owner: execution id of the holder (Step Functions execution name or the in-process run id).
        expires_at: aware UTC instant; the lease is expired when ``expires_at <= now``.
        cancel_requested: a resolved alert asked this epoch to stop (honoured only by this epoch).
    """

    cluster: str
    node: str
    epoch: int
    owner: str
    expires_at: datetime
    cancel_requested: bool = False

    def expired(self, now: datetime) -> bool:
        """True when the lease is no longer valid at ``now`` (``expires_at <= now``)."""
        return self.expires_at <= require_aware(now)


@runtime_checkable
class LeaseStore(Protocol):
    """Node leases, one per node of the bound cluster, fenced by ``epoch`` (docs/architecture.md §4 "Lease").

    Expiry is decided by comparing ``expires_at`` with the caller's ``now`` inside the write condition,
    never by DynamoDB TTL (which deletes up to days late).
    """

    def acquire(self, node: str, owner: str, now: datetime, ttl_seconds: int) -> Lease | None:
        """Take the lease of ``node`` for ``owner`` until ``now + ttl_seconds``.

        Succeeds when there is no lease, the lease was released, or it expired (``expires_at <= now``):
        the epoch then increases by one and ``cancel_requested`` is cleared. When ``owner`` already holds
        a live lease, returns it unchanged (same epoch, same expiry; use :meth:`renew` to extend).

        Returns:
            The lease now held by ``owner``; ``None`` when another owner holds a live lease.
        """
        ...

    def renew(self, node: str, owner: str, epoch: int, now: datetime, ttl_seconds: int) -> Lease:
        """Extend our live lease to ``now + ttl_seconds`` (every workflow step renews).

        Raises:
            LeaseLostError: ``owner`` does not hold ``epoch`` of ``node``, or it expired at ``now``.
        """
        ...

    def release(self, node: str, owner: str, epoch: int) -> bool:
        """Give the lease back (expired or not) if ``owner`` still holds ``epoch``.

        Returns:
            True when released now; False when it was not held by that owner/epoch (idempotent).
        """
        ...

    def get(self, node: str) -> Lease | None:
        """The held lease of ``node`` (live or expired), or ``None`` when none is held."""
        ...

    def expired(self, now: datetime) -> list[Lease]:
        """Held leases with ``expires_at <= now``, sorted by node (the assessment heals their cordons)."""
        ...

    def live(self, now: datetime, prefix: str = "") -> list[Lease]:
        """Held leases with ``expires_at > now`` whose key starts with ``prefix``, sorted by key (a node
        group replacement's ``nodegroup:<name>`` leases tell the plan what is being replaced)."""
        ...

    def request_cancel(self, node: str, epoch: int) -> bool:
        """Ask the holder of ``epoch`` to stop (a resolved alert, docs/architecture.md §4 "Webhook").

        Returns:
            True when recorded on that held epoch; False (no-op) when no lease is held or the held
            lease has another epoch.
        """
        ...


# --------------------------------------------------------------------------------------------------
# Budget slots
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """A budget slot: ``node`` of ``group`` counts as in flight for ``owner`` since ``taken_at``."""

    cluster: str
    group: str
    node: str
    owner: str
    taken_at: datetime


@dataclass(frozen=True, slots=True)
class SlotRefusal:
    """Why no slot was granted; ``reason`` is a stable code, ``detail`` says which limit and counts.

    ``reason`` ∈ {``disruption_budget_exhausted``, ``node_group_at_min_size``, ``slot_held_by_other``}.
    """

    reason: str
    detail: str


@runtime_checkable
class BudgetSlots(Protocol):
    """Our disruption budget (docs/architecture.md §3), enforced by the validate step with conditional writes.

    Slot lifetime: taken by validate after the node lease is acquired, released when the workflow ends
    (:meth:`release_slot`) or, when the workflow died, by :meth:`reap_slots` once the node's lease held
    by the slot's owner has expired or is gone. Ordering hazard: acquire the lease *before* taking the
    slot, otherwise a concurrent reap can release the fresh slot.
    """

    def take_slot(
        self,
        group: str,
        node: str,
        owner: str,
        now: datetime,
        *,
        max_per_run: int,
        max_per_group: int,
        desired: int,
        min_size: int,
    ) -> Slot | SlotRefusal:
        """Take the slot of ``node`` in node group ``group`` for ``owner``, atomically.

        Granted only when, counting slots already held: cluster slots < ``max_per_run``, group slots <
        ``max_per_group``, and ``desired − group slots − 1 ≥ min_size``. A slot already held by
        ``owner`` for ``node`` is returned as it is, whatever the limits (idempotent re-take).

        Args:
            group: node group (or ASG) name.
            max_per_run: nodes in flight per cluster (policy ``max_nodes_per_run``).
            max_per_group: nodes in flight per group, already resolved from ``"N%"`` by the caller.
            desired: the group's current DesiredCapacity (instances), read just before.
            min_size: the group's MinSize (instances).

        Returns:
            The held :class:`Slot`, or a :class:`SlotRefusal`; never raises for a refusal. When several
            limits are hit the reason is chosen in this order: ``slot_held_by_other``,
            ``node_group_at_min_size``, ``disruption_budget_exhausted``.
        """
        ...

    def release_slot(self, node: str, owner: str) -> bool:
        """Release ``owner``'s slot of ``node``; True when released now, False when not held (idempotent)."""
        ...

    def slots(self) -> list[Slot]:
        """Slots held in the bound cluster, sorted by (group, node)."""
        ...

    def reap_slots(self, now: datetime) -> list[Slot]:
        """Release every slot whose node has no lease held by the slot's owner that is live at ``now``.

        Returns:
            The slots released by this call, sorted by (group, node).
        """
        ...


# --------------------------------------------------------------------------------------------------
# Ledger
# --------------------------------------------------------------------------------------------------


def _utc(value: datetime) -> datetime:
    return require_aware(value, "at").astimezone(UTC)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One action/step outcome (docs/architecture.md §4: every action is logged and priced).

    Attributes:
        execution_id: the workflow execution that acted.
        node: Kubernetes Node name, or ``None`` for a node-group action (off-hours sizing).
        instance_id: EC2 instance id, when known.
        node_group: node group / ASG name, when known.
        kind: action kind (``scale_in``, ``resize_instance``, ``scale_node_group`` ...).
        step: workflow step (``validate``, ``cordon``, ``evict``, ``remove``, ``rollback`` ...).
        result: ``applied | already_done | abandoned | rolled_back | failed | dry_run``.
        reason: stable reason code (``disruption_budget_exhausted``, ``lease_expired`` ...) or ``""``.
        hourly_savings_usd: USD/h saved by this outcome (``None`` when unpriced or nothing saved).
        monthly_savings_usd: USD/month (hourly × 730), ``None`` like hourly.
        at: aware instant of the outcome (normalised to UTC).
        ttl: epoch seconds at which DynamoDB TTL may delete the item; default ``at`` + 90 days.
        entry_id: idempotency key; default = first 16 hex of sha256(execution|node|kind|step|result),
            so recording the same outcome twice (a retried step) keeps one entry. Pass your own to
            record repeated outcomes of one step (e.g. one per attempt).
        instances: how many EC2 instances the savings are for (a node group replacement's old nodes);
            ``None`` = the node's one instance.
    """

    execution_id: str
    node: str | None
    instance_id: str | None
    node_group: str | None
    kind: str
    step: str
    result: LedgerResult
    reason: str
    hourly_savings_usd: float | None
    monthly_savings_usd: float | None
    at: datetime
    ttl: int = 0
    entry_id: str = ""
    instances: int | None = None

    def __post_init__(self) -> None:
        if self.result not in LEDGER_RESULTS:
            raise ValueError(f"ledger result {self.result!r} is not one of {sorted(LEDGER_RESULTS)}")
        at = _utc(self.at)
        object.__setattr__(self, "at", at)
        if not self.ttl:
            object.__setattr__(self, "ttl", int((at + LEDGER_RETENTION).timestamp()))
        if not self.entry_id:
            identity = "|".join((self.execution_id, self.node or "", self.kind, self.step, str(self.result)))
            object.__setattr__(self, "entry_id", hashlib.sha256(identity.encode()).hexdigest()[:16])

    def sort_key(self) -> tuple[datetime, str, str]:
        """Ledger order: (at, execution_id, entry_id); both stores list entries in this order."""
        return (self.at, self.execution_id, self.entry_id)


@runtime_checkable
class Ledger(Protocol):
    """Append-only record of what was done (or would have been, in dry run), with savings."""

    def record(self, entry: LedgerEntry) -> bool:
        """Store ``entry``; True when written, False when an entry with its ``entry_id`` already exists
        for that execution (the stored one is kept)."""
        ...

    def entries(self, execution_id: str | None = None, node: str | None = None) -> list[LedgerEntry]:
        """Entries, oldest first (newest last), optionally only one execution's and/or one node's.

        Without ``execution_id`` the bound cluster's entries are listed; the DynamoDB store reads them
        from a global secondary index, which is eventually consistent (a just-written entry may show
        a moment later). With ``execution_id`` reads are strongly consistent.
        """
        ...


# --------------------------------------------------------------------------------------------------
# Workflow records (BUG-32: resumable drains)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EvictedPod:
    """A pod we asked to evict, tracked by UID; ``grace_deadline`` = eviction time + its grace period."""

    uid: str
    namespace: str
    name: str
    grace_deadline: datetime


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """Per-execution drain progress, saved before each side effect so a re-invocation resumes.

    Attributes:
        execution_id: workflow execution id (also the lease/slot owner).
        node: Kubernetes Node name; instance_id: its EC2 instance id.
        step: the step to run next / in progress (``validate``, ``cordon``, ``evict`` ...).
        status: ``running``, ``succeeded``, ``abandoned``, ``rolled_back``, ``failed`` (free text to
            the store).
        started_at, deadline: aware instants; ``deadline`` is the overall drain deadline.
        cordoned_at: when our cordon was applied (``None`` before).
        evicted: pods evicted so far, by UID, with their grace deadlines.
        lease_epoch: the lease epoch this execution holds, for renew/release after a resume.
        details: the facts the steps carry between invocations, typed per workflow kind
            (:data:`rightsizer.domain.workflow_details.WorkflowDetails`, a union on ``kind``: node group,
            pod UIDs seen at validation, eviction attempts per UID, dry run, savings …); stored as one JSON
            document, byte for byte as earlier releases wrote it.
        version: optimistic-concurrency version; 0 = never saved. Set by the store on save.
    """

    execution_id: str
    node: str
    instance_id: str | None
    step: str
    status: str
    started_at: datetime
    deadline: datetime
    cordoned_at: datetime | None = None
    evicted: tuple[EvictedPod, ...] = ()
    lease_epoch: int | None = None
    details: WorkflowDetails = field(default_factory=ScaleInDetails)
    version: int = 0


@runtime_checkable
class WorkflowRecords(Protocol):
    """Workflow records with optimistic concurrency on ``version``."""

    def save(self, record: WorkflowRecord, expected_version: int) -> WorkflowRecord:
        """Write ``record`` if the stored version is ``expected_version`` (0 = must not exist yet).

        Returns:
            The record as stored, with ``version = expected_version + 1``.

        Raises:
            ConflictError: the stored version differs (another invocation saved in between).
        """
        ...

    def load(self, execution_id: str) -> WorkflowRecord | None:
        """The stored record (strongly consistent read), or ``None``."""
        ...


# --------------------------------------------------------------------------------------------------
# Off-hours saved sizes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SavedSizes:
    """Sizes saved before an off-hours scale-down; ``restore_started_at`` set by the first up tick."""

    group: str
    sizes: GroupSizes
    saved_at: datetime
    restore_started_at: datetime | None = None


@runtime_checkable
class OffhoursStore(Protocol):
    """Saved node group sizes for off-hours (docs/architecture.md §4): written once, no TTL, forgotten on success."""

    def save_sizes(self, group: str, sizes: GroupSizes, now: datetime) -> SavedSizes:
        """Save ``sizes`` unless sizes are already saved for ``group``.

        Returns:
            What is stored after the call: the new value, or the earlier one untouched (a second
            going-down run must never overwrite the original sizes with already-reduced ones).
        """
        ...

    def get_sizes(self, group: str) -> SavedSizes | None:
        """Saved sizes of ``group``, or ``None``."""
        ...

    def mark_restore_started(self, group: str, now: datetime) -> SavedSizes | None:
        """Record ``now`` as the start of the restore unless already recorded (for ``restore_deadline``).

        Returns:
            The stored value after the call; ``None`` when no sizes are saved for ``group``.
        """
        ...

    def forget_sizes(self, group: str) -> bool:
        """Delete the saved sizes (call only after a successful restore); True when something was deleted."""
        ...


@runtime_checkable
class StateStore(LeaseStore, BudgetSlots, Ledger, WorkflowRecords, OffhoursStore, Protocol):
    """Every state port at once, bound to ``cluster``; what the wiring builds once per cold start."""

    @property
    def cluster(self) -> str:
        """The cluster whose leases, slots, off-hours sizes and ledger view this store serves."""
        ...


@runtime_checkable
class PlanHistory(Protocol):
    """The latest assessments of the bound cluster, newest first, kept for a short time.

    A document is JSON-ready (``rightsizer.domain.decisions.plan_document``: ``cluster``, ``at`` RFC 3339
    UTC, ``dry_run``, ``summary``, ``records``); documents are ordered by ``at``.
    """

    def save_plan(self, document: dict[str, Any], at: datetime) -> None:
        """Store ``document`` as the assessment at ``at``; saving the same ``at`` again replaces it."""
        ...

    def plans(self, limit: int = 1) -> list[dict[str, Any]]:
        """Up to ``limit`` stored documents, newest first (``[]`` when none is stored)."""
        ...


# --------------------------------------------------------------------------------------------------
# Human approval (docs/architecture.md §4 "Approval")
# --------------------------------------------------------------------------------------------------

ApprovalStatus = Literal["pending", "approved", "rejected", "snoozed", "expired"]
APPROVAL_STATUSES: Final[frozenset[str]] = frozenset(
    {"pending", "approved", "rejected", "snoozed", "expired"}
)


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A drain waiting for (or decided by) a person.

    Attributes:
        execution_id: the drain execution that waits (before its cordon).
        node: the Kubernetes Node it would drain.
        nonce: random id of this request; links carry it and a decision by link must name it.
        requested_at, expires_at: aware instants; unanswered at ``expires_at`` the drain is abandoned.
        status: ``pending`` until decided once: ``approved``, ``rejected``, ``snoozed`` or ``expired``.
        task_token: the Step Functions task token the drain waits on (``None`` in process).
        notified: True once the request was published (a retried request is not published twice).
        decided_by, decided_at: who decided (``link``, ``cli:<ARN or user>``, ``timeout``) and when.
        snooze_until: for ``snoozed``, until when the node stays out of plans.
        details: what the request shows (verdict, reasons, node group, instance, savings in USD/h).
    """

    execution_id: str
    node: str
    nonce: str
    requested_at: datetime
    expires_at: datetime
    status: ApprovalStatus = "pending"
    task_token: str | None = None
    notified: bool = False
    decided_by: str | None = None
    decided_at: datetime | None = None
    snooze_until: datetime | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """A decision of an approval request, as a store writes it in one conditional write.

    The rule is :func:`approval_decision`; a store only checks ``requires`` and writes ``sets`` atomically
    (the memory store under its lock, the DynamoDB store as a ``ConditionExpression`` and an
    ``UpdateExpression``), so both decide exactly alike.

    Attributes:
        status: the new status (never ``pending``).
        decided_by, decided_at: who (``link``, ``cli:<user>``, ``timeout``) and when (aware, UTC).
        nonce: the stored request must carry this nonce (a link's), or None (no nonce check).
        unexpired_at: the stored ``expires_at`` must be later than this (the deciding instant), or None —
            marking a request ``expired`` is allowed at or after its deadline.
        snooze_until: for ``snoozed``, until when the node stays out of plans (aware, UTC); else None.
    """

    status: ApprovalStatus
    decided_by: str
    decided_at: datetime
    nonce: str | None
    unexpired_at: datetime | None
    snooze_until: datetime | None

    def allows(self, stored: ApprovalRequest | None) -> bool:
        """Whether ``stored`` may take this decision: it exists, is ``pending``, carries ``nonce`` (when
        required) and has not expired at ``unexpired_at`` (when required)."""
        return (
            stored is not None
            and stored.status == "pending"
            and (self.nonce is None or stored.nonce == self.nonce)
            and (self.unexpired_at is None or stored.expires_at > self.unexpired_at)
        )

    def applied(self, stored: ApprovalRequest) -> ApprovalRequest:
        """``stored`` after the write: status, decider, instant, and the snooze end when there is one."""
        return dataclasses.replace(
            stored,
            status=self.status,
            decided_by=self.decided_by,
            decided_at=self.decided_at,
            snooze_until=self.snooze_until or stored.snooze_until,
        )


def approval_decision(
    status: ApprovalStatus,
    *,
    by: str,
    now: datetime,
    nonce: str | None = None,
    snooze_until: datetime | None = None,
) -> ApprovalDecision:
    """The one rule of :meth:`ApprovalStore.decide_approval`: a request is decided once, while
    ``pending``; by a link only with the link's ``nonce``; and — except when marking it ``expired`` at its
    deadline — only before ``expires_at``.

    Raises:
        ValueError: ``status`` is ``pending`` or not a status; ``now``/``snooze_until`` naive; a
            ``snooze_until`` for another status than ``snoozed``.
    """
    if status not in APPROVAL_STATUSES or status == "pending":
        raise ValueError(f"an approval decision cannot be {status!r}")
    if snooze_until is not None and status != "snoozed":
        raise ValueError(f"snooze_until is only for a snooze, not {status!r}")
    at = require_aware(now, "now").astimezone(UTC)
    return ApprovalDecision(
        status=status,
        decided_by=by,
        decided_at=at,
        nonce=nonce,
        unexpired_at=None if status == "expired" else at,
        snooze_until=None
        if snooze_until is None
        else require_aware(snooze_until, "snooze_until").astimezone(UTC),
    )


@runtime_checkable
class ApprovalStore(Protocol):
    """Approval requests of the bound cluster's drains and the snoozes people set on nodes."""

    def open_approval(self, request: ApprovalRequest) -> ApprovalRequest:
        """Create ``request`` unless one exists for its execution; a pending one gets the new
        ``task_token`` (a re-entered wait). Returns what is stored after the call."""
        ...

    def mark_notified(self, execution_id: str) -> None:
        """Record that the request was published."""
        ...

    def get_approval(self, execution_id: str) -> ApprovalRequest | None:
        """The stored request (strongly consistent), or ``None``."""
        ...

    def decide_approval(
        self,
        execution_id: str,
        status: ApprovalStatus,
        *,
        by: str,
        now: datetime,
        nonce: str | None = None,
        snooze_until: datetime | None = None,
    ) -> ApprovalRequest | None:
        """Decide a pending request, once: one conditional write of :func:`approval_decision` (status
        ``pending``, the ``nonce`` when given, and — except for ``expired`` — ``expires_at > now``).

        Returns:
            The decided request; ``None`` when the condition failed (decided before, expired, no such
            request, another nonce): the caller reads it again to say which.
        """
        ...

    def snooze(self, node: str, until: datetime, *, by: str, now: datetime) -> None:
        """Keep ``node`` out of plans until ``until`` (a later snooze replaces an earlier one)."""
        ...

    def snoozes(self, now: datetime) -> dict[str, datetime]:
        """Node → snoozed-until for snoozes still running at ``now``."""
        ...


def slot_refusal(
    *,
    cluster: str,
    group: str,
    in_cluster: int,
    in_group: int,
    max_per_run: int,
    max_per_group: int,
    desired: int,
    min_size: int,
) -> SlotRefusal | None:
    """The budget rule of docs/architecture.md §3 on counts of slots already held; ``None`` = a slot may be taken.

    Shared by both stores so their refusal reasons (and their priority) cannot drift: the node group's
    MinSize first (it holds however long we wait), then nodes per cluster, then nodes per group.
    """
    if desired - in_group - 1 < min_size:
        return SlotRefusal(
            REFUSAL_AT_MIN_SIZE,
            f"node group {group}: desired {desired} − {in_group} in flight − 1 < min size {min_size}",
        )
    if in_cluster >= max_per_run:
        return SlotRefusal(
            REFUSAL_BUDGET_EXHAUSTED,
            f"cluster {cluster}: {in_cluster} of max_nodes_per_run {max_per_run} in flight",
        )
    if in_group >= max_per_group:
        return SlotRefusal(
            REFUSAL_BUDGET_EXHAUSTED,
            f"node group {group}: {in_group} of max_nodes_per_node_group {max_per_group} in flight",
        )
    return None


def sorted_slots(slots: Sequence[Slot]) -> list[Slot]:
    """Slots in the order both stores list them: (group, node)."""
    return sorted(slots, key=lambda slot: (slot.group, slot.node))
