"""Measure scale-outs of the node groups the product manages (issue 30; the model is
:mod:`rightsizer.domain.restore_timing`).

The off-hours tick calls :class:`ScaleOutObserver` for every group whose schedule says *up*: each Node of
the group created since the group's last desired-size increase of ours (the ``restore`` ledger entry of
its off-hours cycle) is measured from the Kubernetes objects — the Node's ``Ready`` condition, its
allocatable GPUs, the ``Ready`` condition of the first pod requesting a GPU on it — and from EC2
(``DescribeInstances``: ``LaunchTime``; an instance launched *before* the request came from a warm pool).
A node is recorded once, as a ``scale_node_group`` / ``scaled_out`` ledger entry, when its first GPU pod is
Ready, or :data:`SETTLE` after it became Ready with allocatable GPUs and no GPU pod came (the restore
served nobody yet). The ledger keeps one entry per node (its ``entry_id``), so later ticks cannot record
it twice.

GPUs allocatable carries no timestamp in the Kubernetes API: it is taken as the scheduling of the node's
first GPU pod (``PodScheduled``; a GPU pod cannot be scheduled before), never before Node Ready; without a
GPU pod it is not known and left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from rightsizer.domain.model import GPU_RESOURCE, Node, is_gpu_resource
from rightsizer.domain.quantity import parse_count
from rightsizer.domain.restore_timing import TIMING_STEP, RestoreTiming, Start, timing_from_reason
from rightsizer.ports import JSON
from rightsizer.state import Ledger, LedgerEntry

__all__ = [
    "RESTORE_HORIZON",
    "SETTLE",
    "InstanceDescriber",
    "PodsOnNode",
    "ScaleOutObserver",
    "launch_times",
    "measure_node",
    "observe_restore",
    "recorded_timings",
]

#: How long after its GPUs became allocatable a node without a Ready GPU pod is recorded anyway.
SETTLE: Final = timedelta(minutes=15)
#: An instance launched this long before the request came from a warm pool.
WARM_SLACK: Final = timedelta(minutes=1)
#: Nodes created this long after a restore's request are no longer measured as its nodes.
RESTORE_HORIZON: Final = timedelta(hours=2)
LEDGER_KIND: Final = "scale_node_group"


class InstanceDescriber(Protocol):
    """EC2 ``DescribeInstances`` (``NodeGroupInventory.describe_instances`` satisfies it)."""

    def describe_instances(self, instance_ids: Sequence[str]) -> JSON:
        """``{"Reservations": [...]}`` for these ids (unknown ids absent)."""
        ...


class PodsOnNode(Protocol):
    """The pods bound to one node (``ClusterWriter.list_pods_on_node`` satisfies it)."""

    def list_pods_on_node(self, node: str) -> list[JSON]:
        """core/v1 Pods with ``spec.nodeName`` = ``node``."""
        ...


def recorded_timings(entries: Iterable[LedgerEntry]) -> list[RestoreTiming]:
    """The scale-out timings recorded in a ledger (applied ``scale_node_group`` / ``scaled_out``
    entries whose reason parses), oldest request first."""
    out = []
    for e in entries:
        if e.kind != LEDGER_KIND or e.step != TIMING_STEP or e.result != "applied":
            continue
        if e.node_group is None or e.node is None:
            continue
        timing = timing_from_reason(e.node_group, e.node, e.reason)
        if timing is not None:
            out.append(timing)
    return sorted(out, key=lambda t: (t.requested_at, t.node))


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo is not None else None


def _ready_since(obj: Mapping[str, Any]) -> datetime | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def _condition(obj: Mapping[str, Any], kind: str) -> datetime | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def _gpu_pod(pod: Mapping[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    for c in containers:
        limits = {
            **((c.get("resources") or {}).get("requests") or {}),
            **((c.get("resources") or {}).get("limits") or {}),
        }
        if any(is_gpu_resource(k) and parse_count(v) > 0 for k, v in limits.items()):
            return True
    return False


def _has_gpus(node: Node) -> bool:
    allocatable = node.status.allocatable
    if parse_count(allocatable.get(GPU_RESOURCE)) > 0:
        return True
    return any(is_gpu_resource(k) and parse_count(v) > 0 for k, v in allocatable.items())


def measure_node(
    node: JSON,
    pods: Sequence[JSON],
    *,
    group: str,
    cause: str,
    requested_at: datetime,
    launched_at: datetime | None,
    now: datetime,
) -> RestoreTiming | None:
    """The timing of one new node, or None while it is not final (see the module docstring).

    Args:
        node: the core/v1 Node (``kubectl get -o json`` item).
        pods: the pods bound to it.
        group: its node group; cause: ``offhours_restore`` | ``scale_out``.
        requested_at: the desired-size change it answers (aware).
        launched_at: its instance's EC2 ``LaunchTime`` (None = not known).
        now: the tick's aware instant.
    """
    parsed = Node.model_validate(node)
    ready = _ready_since(node)
    if ready is None or not _has_gpus(parsed):
        return None
    gpu_pods = [p for p in pods if _gpu_pod(p)]
    scheduled = [t for p in gpu_pods if (t := _condition(p, "PodScheduled")) is not None]
    pod_ready = [t for p in gpu_pods if (t := _ready_since(p)) is not None]
    allocatable = max(ready, min(scheduled)) if scheduled else None
    first_pod = min(pod_ready) if pod_ready else None
    if first_pod is None and now - ready < SETTLE:
        return None
    start: Start = "unknown"
    running = None
    if launched_at is not None:
        # A warm pool's instance was launched before the request (then stopped); a fresh one after it
        # (a minute of slack: LaunchTime and our clock may disagree by seconds).
        start = "warm" if launched_at < requested_at - WARM_SLACK else "cold"
        running = launched_at if start == "cold" else None
    return RestoreTiming(
        node_group=group,
        node=parsed.name,
        cause=cause,
        requested_at=requested_at,
        instance_running_at=running,
        node_ready_at=ready,
        gpu_allocatable_at=allocatable,
        first_gpu_pod_ready_at=first_pod,
        start=start,
    )


class ScaleOutObserver:
    """Records the timings of a group's new nodes in the ledger (one tick's worth; see the module)."""

    def __init__(
        self, ledger: Ledger, pods: PodsOnNode | None, instances: InstanceDescriber | None = None
    ) -> None:
        """Args: ledger to record to; pods per node (None: timings end at GPUs allocatable); instances:
        EC2 ``DescribeInstances`` for ``LaunchTime`` (None: instance running and warm/cold unknown)."""
        self._ledger = ledger
        self._pods = pods
        self._instances = instances

    def _launch_times(self, nodes: Sequence[Node]) -> dict[str, datetime]:
        ids = sorted({i for n in nodes if (i := n.instance_id)})
        if self._instances is None or not ids:
            return {}
        return launch_times(self._instances.describe_instances(ids))

    def observe(
        self,
        group: str,
        nodes: Sequence[JSON],
        *,
        requested_at: datetime,
        cause: str,
        cycle: str,
        now: datetime,
        recorded: set[str],
    ) -> list[RestoreTiming]:
        """Measure ``nodes`` (the group's Nodes) created at or after ``requested_at`` and not in
        ``recorded`` (node names already in the ledger); record and return the final ones.

        ``cycle`` is the ledger execution id (the off-hours cycle) the entries are filed under.
        """
        fresh = []
        since = requested_at.replace(microsecond=0)  # creationTimestamp has whole seconds
        for raw in nodes:
            node = Node.model_validate(raw)
            created = node.metadata.creationTimestamp
            if node.name not in recorded and created is not None and created >= since:
                fresh.append((raw, node))
        launched = self._launch_times([n for _, n in fresh])
        out = []
        for raw, node in fresh:
            pods = self._pods.list_pods_on_node(node.name) if self._pods is not None else []
            iid = node.instance_id
            timing = measure_node(
                raw,
                pods,
                group=group,
                cause=cause,
                requested_at=requested_at,
                launched_at=launched.get(iid) if iid else None,
                now=now,
            )
            if timing is None:
                continue
            digest = hashlib.sha256(f"{cycle}|{node.name}".encode()).hexdigest()[:16]
            self._ledger.record(
                LedgerEntry(
                    execution_id=cycle,
                    node=node.name,
                    instance_id=iid,
                    node_group=group,
                    kind=LEDGER_KIND,
                    step=TIMING_STEP,
                    result="applied",
                    reason=timing.reason(),
                    hourly_savings_usd=None,
                    monthly_savings_usd=None,
                    at=now,
                    entry_id=digest,
                )
            )
            recorded.add(node.name)
            out.append(timing)
        return out


def launch_times(document: Mapping[str, Any]) -> dict[str, datetime]:
    """EC2 ``LaunchTime`` per instance id from a ``describe_instances`` document (``instances.json``)."""
    out = {}
    for reservation in document.get("Reservations") or []:
        for instance in reservation.get("Instances") or []:
            at = instance.get("LaunchTime")
            parsed = _time(at) if isinstance(at, str) else (at if isinstance(at, datetime) else None)
            if parsed is not None and instance.get("InstanceId"):
                out[str(instance["InstanceId"])] = parsed.astimezone(UTC)
    return out


def observe_restore(
    observer: ScaleOutObserver,
    group: str,
    nodes: Sequence[JSON],
    entries: Sequence[LedgerEntry],
    now: datetime,
) -> list[RestoreTiming]:
    """Measure the nodes of ``group``'s latest off-hours restore (its ``restore`` ledger entry: our
    ``UpdateNodegroupConfig`` raising the desired size) within :data:`RESTORE_HORIZON` of it; record the
    final ones under the restore's cycle. Returns what this call recorded."""
    restores = [
        e
        for e in entries
        if e.kind == LEDGER_KIND and e.node_group == group and e.step == "restore" and e.result == "applied"
    ]
    if not restores:
        return []
    last = max(restores, key=LedgerEntry.sort_key)
    if now - last.at > RESTORE_HORIZON:
        return []
    recorded = {
        e.node
        for e in entries
        if e.step == TIMING_STEP and e.execution_id == last.execution_id and e.node is not None
    }
    return observer.observe(
        group, nodes, requested_at=last.at, cause="offhours_restore", cycle=last.execution_id, now=now,
        recorded=recorded,
    )  # fmt: skip
