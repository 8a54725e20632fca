"""Healing after a drain died (docs/architecture.md §4 "Lease"): uncordon what no live workflow owns.

Run by every scheduled assessment before it plans: nodes whose drain lease expired, and nodes carrying our
cordon annotation without a live workflow, are uncordoned (our annotation only), with an Event and a
ledger entry. A resize that died after it stopped its instance is not merely uncordoned (that would leave
the instance stopped): :func:`heal_dead_resizes` takes its lease back and starts the resize again, which
restores the original type, starts the instance, waits for its Node and uncordons it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from rightsizer.domain.capacity import interruption_signals
from rightsizer.domain.errors import RightsizerError
from rightsizer.domain.model import ANN_CORDONED_BY, Node
from rightsizer.domain.names import dns1123_subdomain_problem
from rightsizer.domain.workflow_details import ReplaceDrainDetails, ResizeDetails
from rightsizer.ports import ClusterWriter, WorkflowStarter
from rightsizer.services.resize import ResizeRequest
from rightsizer.state import LedgerEntry, StateStore, WorkflowRecord

log = logging.getLogger(__name__)

__all__ = [
    "heal_dead_resizes",
    "heal_expired_leases",
    "heal_stale_cordons",
    "is_stopped_resize",
    "stale_cordons",
]


def is_stopped_resize(record: WorkflowRecord | None) -> bool:
    """A running resize that has (maybe) stopped its instance: from the ``stop`` step on, only the resize
    itself may undo it — uncordoning its Node alone would leave the instance stopped."""
    return (
        record is not None
        and record.status == "running"
        and isinstance(record.details, ResizeDetails)
        and record.details.stopping
    )


def heal_dead_resizes(
    state: StateStore, starter: WorkflowStarter, now: datetime, ttl_seconds: int
) -> list[str]:
    """Restart every resize whose workflow died after the stop; returns the nodes whose resize was restarted.

    Dead = its node lease expired (every step renews it: a dead process, Lambda or state machine execution
    stops renewing). For each: take the lease back for the same execution id (a new epoch E, ``ttl_seconds``
    as a drain's) and start ``ResizeRequest(resume=E)`` — a new Step Functions execution named
    ``<execution id>-r<E>`` (or the in-process runner) that adopts the lease and continues the *same*
    record (:meth:`ResizeWorkflow._resume`): before ``ready`` it restores the original type, then stop → set
    type → start → Node Ready with its GPUs → uncordon, ending ``rolled_back``. While the restart holds the
    lease nothing else happens; if it dies too, the lease expires again and the next assessment starts
    another (epoch E+1): retried until done. A finished record holds no lease: a second heal does nothing.

    Reads workflow records and writes only the lease (the assess role's grants); a failed start is logged
    and left to the next assessment (the lease expires again).
    """
    healed = []
    for lease in state.expired(now):
        record = state.load(lease.owner)
        if not is_stopped_resize(record):
            continue
        assert record is not None
        taken = state.acquire(lease.node, lease.owner, now, ttl_seconds)
        if taken is None:
            continue  # someone else took the node meanwhile
        log.warning("resize %s of %s died at step %s (lease expired %s): restarting it (epoch %d)",
                    record.execution_id, record.node, record.step, lease.expires_at.isoformat(),
                    taken.epoch)  # fmt: skip
        request = ResizeRequest(
            record.node,
            record.execution_id,
            "heal",
            None,
            target_type=record.details.target_type if isinstance(record.details, ResizeDetails) else "",
            resume=taken.epoch,
        )
        try:
            starter.start(request)
        except (RightsizerError, ValueError) as exc:
            log.error("restarting resize %s failed (next assessment retries): %s", record.execution_id, exc)
            continue
        healed.append(record.node)
    return healed


def heal_expired_leases(cluster: ClusterWriter, state: StateStore, now: datetime) -> list[str]:
    """Uncordon nodes whose drain lease expired (the workflow died): only nodes carrying our annotation
    with the lease owner's execution id. Emits ``RolledBack`` (``lease_expired``); returns healed nodes.
    A lease that names no Node (a node group replacement's ``nodegroup:<name>``) is only released: the
    nodes its drains cordoned are healed by :func:`heal_stale_cordons`."""
    healed = []
    for lease in state.expired(now):
        if is_stopped_resize(state.load(lease.owner)):
            continue  # heal_dead_resizes restarts it: an uncordon alone would leave its instance stopped
        try:
            is_node = dns1123_subdomain_problem(lease.node) is None
            if is_node and cluster.uncordon(lease.node, lease.owner):
                cluster.emit_event(
                    lease.node, "RolledBack", "rightsizer rolled back: lease_expired", warning=True
                )
                healed.append(lease.node)
            state.release_slot(lease.node, lease.owner)
            state.release(lease.node, lease.owner, lease.epoch)
        except RightsizerError as exc:
            log.warning("healing %s failed: %s", lease.node, exc)
    return healed


def stale_cordons(nodes: Sequence[Node], state: StateStore, now: datetime) -> dict[str, str]:
    """Nodes carrying our ``rightsizer.io/cordoned-by`` annotation without a live workflow: node name →
    the execution id the annotation names.

    A node under an interruption handler's notice is not stale: its drain yielded and the cordon is the
    handler's now. Live = the node's lease is held by that execution and not expired (every drain takes its lease before
    it cordons and keeps renewing it). Anything else — the workflow ended (a failed uncordon), its record
    expired or never existed, another execution holds the lease — is stale.
    """
    stale = {}
    for node in nodes:
        owner = node.metadata.annotations.get(ANN_CORDONED_BY)
        if owner is None or interruption_signals(node, None):
            continue  # a drain that yielded to an interruption handler left the cordon to it (issue 28)
        lease = state.get(node.name)
        if lease is not None and lease.owner == owner and not lease.expired(now):
            continue
        stale[node.name] = owner
    return stale


def _orphaned(record: WorkflowRecord, state: StateStore, now: datetime) -> bool:
    """A node drained for a node group replacement (it stays cordoned until its group scales to 0) whose
    replacement died: the parent record still runs but no live lease of it is held."""
    parent_id = record.details.parent if isinstance(record.details, ReplaceDrainDetails) else None
    if not parent_id:
        return False
    parent = state.load(str(parent_id))
    if parent is None:
        return True
    if parent.status != "running":
        return False
    lease = state.get(parent.node)
    return lease is None or lease.owner != parent.execution_id or lease.expired(now)


def heal_stale_cordons(
    cluster: ClusterWriter, state: StateStore, stale: dict[str, str], now: datetime
) -> list[str]:
    """Uncordon every node of ``stale`` (from :func:`stale_cordons`: no live workflow holds its lease),
    emitting ``RolledBack`` and a ledger entry (step ``heal``); returns the nodes healed now.

    Only our own annotation for that execution is undone (``ClusterWriter.uncordon`` re-checks it); a
    failure is logged and retried by the next assessment. Kubernetes RBAC of the caller: ``get``/``patch``
    nodes and ``create`` events (ClusterRole ``rightsizer-heal``, bound to the assess function).
    """
    healed = []
    for node, owner in sorted(stale.items()):
        record = state.load(owner)
        if record is not None and record.status == "succeeded" and not _orphaned(record, state, now):
            continue  # the instance is gone; its Node lingers until the cloud controller deletes it
        if is_stopped_resize(record):
            continue  # its instance may be stopped: heal_dead_resizes restores it, then uncordons
        # A running record without a live lease is a dead workflow too (the lease healer's case).
        why = f"workflow {owner} is {record.status if record is not None else 'unknown'}"
        try:
            if not cluster.uncordon(node, owner):
                continue
        except RightsizerError as exc:
            log.warning("healing the stale cordon of %s failed (%s): %s", node, why, exc)
            continue
        cluster.emit_event(node, "RolledBack", f"rightsizer removed its stale cordon: {why}", warning=True)
        state.record(
            LedgerEntry(
                execution_id=owner,
                node=node,
                instance_id=record.instance_id if record is not None else None,
                node_group=record.details.node_group if record is not None else None,
                kind="scale_in",
                step="heal",
                result="rolled_back",
                reason=f"stale_cordon:{why}",
                hourly_savings_usd=None,
                monthly_savings_usd=None,
                at=now,
            )
        )
        healed.append(node)
    return healed
