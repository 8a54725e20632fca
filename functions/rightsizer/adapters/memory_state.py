"""In-memory :class:`~rightsizer.state.StateStore` with the DynamoDB store's semantics.

A runtime adapter: the state of ``rightsizer serve`` without a table, and of the demo; tests use it as
the fast store. It is held to the same contract suite as
:class:`rightsizer.adapters.dynamodb_state.DynamoDbState` (``tests/integration/test_state_contract.py``),
so it cannot drift. One re-entrant lock guards every method: each call is atomic, as each conditional
write or transaction is in DynamoDB, and the store is safe to share between threads.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rightsizer.domain.model import GroupSizes
from rightsizer.state import (
    REFUSAL_SLOT_HELD,
    ApprovalRequest,
    ApprovalStatus,
    ConflictError,
    EvictedPod,
    Lease,
    LeaseLostError,
    LedgerEntry,
    SavedSizes,
    Slot,
    SlotRefusal,
    WorkflowRecord,
    approval_decision,
    require_aware,
    slot_refusal,
    sorted_slots,
)

__all__ = ["MemoryApprovals", "MemoryPlans", "MemoryState"]


def _utc(value: datetime, name: str = "now") -> datetime:
    # Both stores hand back UTC datetimes, so values compare and print alike whatever zone came in.
    return require_aware(value, name).astimezone(UTC)


@dataclass
class _LeaseRow:
    # A released lease stays as a tombstone (held=False) that keeps the epoch, so a later acquisition
    # gets a higher epoch and a stale holder of an old epoch can never match again.
    epoch: int
    held: bool
    owner: str = ""
    expires_at: datetime | None = None
    cancel_requested: bool = False


class MemoryState:
    """Every state port in memory, bound to ``cluster``; thread-safe.

    Args:
        cluster: the cluster name leases, slots, off-hours sizes and the ledger view belong to.
    """

    def __init__(self, cluster: str) -> None:
        self._cluster = cluster
        self._lock = threading.RLock()
        self._leases: dict[str, _LeaseRow] = {}
        self._slots: dict[str, Slot] = {}
        self._ledger: dict[tuple[str, str], LedgerEntry] = {}
        self._workflows: dict[str, WorkflowRecord] = {}
        self._sizes: dict[str, SavedSizes] = {}

    @property
    def cluster(self) -> str:
        """The cluster this store is bound to."""
        return self._cluster

    # ---------------------------------------------------------------------------------- leases

    def _lease(self, node: str, row: _LeaseRow) -> Lease:
        assert row.expires_at is not None
        return Lease(
            cluster=self._cluster,
            node=node,
            epoch=row.epoch,
            owner=row.owner,
            expires_at=row.expires_at,
            cancel_requested=row.cancel_requested,
        )

    def acquire(self, node: str, owner: str, now: datetime, ttl_seconds: int) -> Lease | None:
        """See :meth:`rightsizer.state.LeaseStore.acquire`."""
        now = _utc(now)
        with self._lock:
            row = self._leases.get(node)
            if row is not None and row.held and row.expires_at is not None and row.expires_at > now:
                return self._lease(node, row) if row.owner == owner else None
            epoch = (row.epoch if row is not None else 0) + 1
            new = _LeaseRow(
                epoch=epoch, held=True, owner=owner, expires_at=now + timedelta(seconds=ttl_seconds)
            )
            self._leases[node] = new
            return self._lease(node, new)

    def renew(self, node: str, owner: str, epoch: int, now: datetime, ttl_seconds: int) -> Lease:
        """See :meth:`rightsizer.state.LeaseStore.renew`."""
        now = _utc(now)
        with self._lock:
            row = self._leases.get(node)
            if (
                row is None
                or not row.held
                or row.owner != owner
                or row.epoch != epoch
                or row.expires_at is None
                or row.expires_at <= now
            ):
                raise LeaseLostError(f"lease of node {node} epoch {epoch} is not held by {owner} at {now}")
            row.expires_at = now + timedelta(seconds=ttl_seconds)
            return self._lease(node, row)

    def release(self, node: str, owner: str, epoch: int) -> bool:
        """See :meth:`rightsizer.state.LeaseStore.release`."""
        with self._lock:
            row = self._leases.get(node)
            if row is None or not row.held or row.owner != owner or row.epoch != epoch:
                return False
            self._leases[node] = _LeaseRow(epoch=row.epoch, held=False)
            return True

    def get(self, node: str) -> Lease | None:
        """See :meth:`rightsizer.state.LeaseStore.get`."""
        with self._lock:
            row = self._leases.get(node)
            return self._lease(node, row) if row is not None and row.held else None

    def expired(self, now: datetime) -> list[Lease]:
        """See :meth:`rightsizer.state.LeaseStore.expired`."""
        now = _utc(now)
        with self._lock:
            return [
                self._lease(node, row)
                for node, row in sorted(self._leases.items())
                if row.held and row.expires_at is not None and row.expires_at <= now
            ]

    def live(self, now: datetime, prefix: str = "") -> list[Lease]:
        """See :meth:`rightsizer.state.LeaseStore.live`."""
        now = _utc(now)
        with self._lock:
            return [
                self._lease(node, row)
                for node, row in sorted(self._leases.items())
                if node.startswith(prefix)
                and row.held
                and row.expires_at is not None
                and row.expires_at > now
            ]

    def request_cancel(self, node: str, epoch: int) -> bool:
        """See :meth:`rightsizer.state.LeaseStore.request_cancel`."""
        with self._lock:
            row = self._leases.get(node)
            if row is None or not row.held or row.epoch != epoch:
                return False
            row.cancel_requested = True
            return True

    # ----------------------------------------------------------------------------- budget slots

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
        """See :meth:`rightsizer.state.BudgetSlots.take_slot`."""
        now = _utc(now)
        with self._lock:
            existing = self._slots.get(node)
            if existing is not None:
                if existing.owner == owner:
                    return existing
                return SlotRefusal(
                    REFUSAL_SLOT_HELD, f"node {node} is already in flight for {existing.owner}"
                )
            refusal = slot_refusal(
                cluster=self._cluster,
                group=group,
                in_cluster=len(self._slots),
                in_group=sum(1 for slot in self._slots.values() if slot.group == group),
                max_per_run=max_per_run,
                max_per_group=max_per_group,
                desired=desired,
                min_size=min_size,
            )
            if refusal is not None:
                return refusal
            slot = Slot(cluster=self._cluster, group=group, node=node, owner=owner, taken_at=now)
            self._slots[node] = slot
            return slot

    def release_slot(self, node: str, owner: str) -> bool:
        """See :meth:`rightsizer.state.BudgetSlots.release_slot`."""
        with self._lock:
            slot = self._slots.get(node)
            if slot is None or slot.owner != owner:
                return False
            del self._slots[node]
            return True

    def slots(self) -> list[Slot]:
        """See :meth:`rightsizer.state.BudgetSlots.slots`."""
        with self._lock:
            return sorted_slots(list(self._slots.values()))

    def reap_slots(self, now: datetime) -> list[Slot]:
        """See :meth:`rightsizer.state.BudgetSlots.reap_slots`."""
        now = _utc(now)
        with self._lock:
            reaped = []
            for slot in list(self._slots.values()):
                row = self._leases.get(slot.node)
                alive = (
                    row is not None
                    and row.held
                    and row.owner == slot.owner
                    and row.expires_at is not None
                    and row.expires_at > now
                )
                if not alive and self.release_slot(slot.node, slot.owner):
                    reaped.append(slot)
            return sorted_slots(reaped)

    # ----------------------------------------------------------------------------------- ledger

    def record(self, entry: LedgerEntry) -> bool:
        """See :meth:`rightsizer.state.Ledger.record`."""
        key = (entry.execution_id, entry.entry_id)
        with self._lock:
            if key in self._ledger:
                return False
            self._ledger[key] = entry
            return True

    def entries(self, execution_id: str | None = None, node: str | None = None) -> list[LedgerEntry]:
        """See :meth:`rightsizer.state.Ledger.entries`."""
        with self._lock:
            chosen = [
                entry
                for entry in self._ledger.values()
                if (execution_id is None or entry.execution_id == execution_id)
                and (node is None or entry.node == node)
            ]
        return sorted(chosen, key=LedgerEntry.sort_key)

    # -------------------------------------------------------------------------------- workflows

    def save(self, record: WorkflowRecord, expected_version: int) -> WorkflowRecord:
        """See :meth:`rightsizer.state.WorkflowRecords.save`."""
        stored = _normalise_record(record, expected_version + 1)
        with self._lock:
            current = self._workflows.get(record.execution_id)
            actual = current.version if current is not None else None
            if (actual or 0) != expected_version:
                raise ConflictError(
                    f"workflow {record.execution_id}: expected version {expected_version}, found {actual}",
                    expected=expected_version,
                    actual=actual,
                )
            self._workflows[record.execution_id] = stored
            return stored

    def load(self, execution_id: str) -> WorkflowRecord | None:
        """See :meth:`rightsizer.state.WorkflowRecords.load`."""
        with self._lock:
            record = self._workflows.get(execution_id)
            return (
                None if record is None else dataclasses.replace(record, details=copy.deepcopy(record.details))
            )

    # --------------------------------------------------------------------------------- off-hours

    def save_sizes(self, group: str, sizes: GroupSizes, now: datetime) -> SavedSizes:
        """See :meth:`rightsizer.state.OffhoursStore.save_sizes`."""
        now = _utc(now)
        with self._lock:
            return self._sizes.setdefault(group, SavedSizes(group=group, sizes=sizes, saved_at=now))

    def get_sizes(self, group: str) -> SavedSizes | None:
        """See :meth:`rightsizer.state.OffhoursStore.get_sizes`."""
        with self._lock:
            return self._sizes.get(group)

    def mark_restore_started(self, group: str, now: datetime) -> SavedSizes | None:
        """See :meth:`rightsizer.state.OffhoursStore.mark_restore_started`."""
        now = _utc(now)
        with self._lock:
            saved = self._sizes.get(group)
            if saved is None or saved.restore_started_at is not None:
                return saved
            saved = dataclasses.replace(saved, restore_started_at=now)
            self._sizes[group] = saved
            return saved

    def forget_sizes(self, group: str) -> bool:
        """See :meth:`rightsizer.state.OffhoursStore.forget_sizes`."""
        with self._lock:
            return self._sizes.pop(group, None) is not None


def _normalise_record(record: WorkflowRecord, version: int) -> WorkflowRecord:
    """The record as a store keeps it: datetimes in UTC, ``version`` set."""
    return dataclasses.replace(
        record,
        details=copy.deepcopy(record.details),
        started_at=_utc(record.started_at, "started_at"),
        deadline=_utc(record.deadline, "deadline"),
        cordoned_at=_utc(record.cordoned_at, "cordoned_at") if record.cordoned_at else None,
        evicted=tuple(
            EvictedPod(pod.uid, pod.namespace, pod.name, _utc(pod.grace_deadline, "grace_deadline"))
            for pod in record.evicted
        ),
        version=version,
    )


class MemoryPlans:
    """In-memory :class:`~rightsizer.state.PlanHistory` (no expiry), with the DynamoDB store's order."""

    def __init__(self) -> None:
        self._plans: dict[datetime, dict[str, Any]] = {}
        self._lock = threading.RLock()

    def save_plan(self, document: dict[str, Any], at: datetime) -> None:
        """Store a deep copy of ``document`` under ``at`` (replacing one saved at the same instant)."""
        with self._lock:
            self._plans[_utc(at, "at")] = copy.deepcopy(document)

    def plans(self, limit: int = 1) -> list[dict[str, Any]]:
        """Up to ``limit`` documents, newest first."""
        with self._lock:
            newest = sorted(self._plans, reverse=True)[: max(limit, 0)]
            return [copy.deepcopy(self._plans[at]) for at in newest]


class MemoryApprovals:
    """In-memory :class:`~rightsizer.state.ApprovalStore` with the DynamoDB store's semantics; thread-safe."""

    def __init__(self) -> None:
        self._requests: dict[str, ApprovalRequest] = {}
        self._snoozes: dict[str, datetime] = {}
        self._lock = threading.RLock()

    def open_approval(self, request: ApprovalRequest) -> ApprovalRequest:
        """Create ``request`` unless one exists; a pending one gets the new task token."""
        with self._lock:
            stored = self._requests.get(request.execution_id)
            if stored is None:
                stored = dataclasses.replace(
                    request,
                    status="pending",
                    requested_at=_utc(request.requested_at, "requested_at"),
                    expires_at=_utc(request.expires_at, "expires_at"),
                    details=copy.deepcopy(request.details),
                )
            elif stored.status == "pending" and request.task_token:
                stored = dataclasses.replace(stored, task_token=request.task_token)
            self._requests[request.execution_id] = stored
            return stored

    def mark_notified(self, execution_id: str) -> None:
        """Record that the request was published."""
        with self._lock:
            if execution_id in self._requests:
                self._requests[execution_id] = dataclasses.replace(
                    self._requests[execution_id], notified=True
                )

    def get_approval(self, execution_id: str) -> ApprovalRequest | None:
        """The stored request, or ``None``."""
        with self._lock:
            return self._requests.get(execution_id)

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
        """Decide a pending request once (``ApprovalStore.decide_approval``): the rule's check and write
        under the lock."""
        decision = approval_decision(status, by=by, now=now, nonce=nonce, snooze_until=snooze_until)
        with self._lock:
            stored = self._requests.get(execution_id)
            if stored is None or not decision.allows(stored):
                return None
            self._requests[execution_id] = decided = decision.applied(stored)
            return decided

    def snooze(self, node: str, until: datetime, *, by: str, now: datetime) -> None:
        """Keep ``node`` out of plans until ``until``."""
        with self._lock:
            self._snoozes[node] = _utc(until, "until")

    def snoozes(self, now: datetime) -> dict[str, datetime]:
        """Snoozes running at ``now``."""
        now = _utc(now)
        with self._lock:
            return {node: until for node, until in self._snoozes.items() if until > now}
