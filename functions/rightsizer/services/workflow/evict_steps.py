"""The drain's evict and wait steps (docs/architecture.md §4; kubectl drain semantics): evict through the
Eviction API (PodDisruptionBudgets honoured, ``Retry-After`` respected, never past the drain deadline),
then wait until every evicted pod UID is gone (BUG-17), adopting evictions a dead invocation made (BUG-32).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING

from rightsizer.domain.model import Pod
from rightsizer.ports import EvictionOutcome
from rightsizer.services.workflow.engine import StepResult
from rightsizer.services.workflow.record_ops import drain_details
from rightsizer.state import EvictedPod, WorkflowRecord

if TYPE_CHECKING:
    from rightsizer.services.workflow.drain_steps import DrainSteps

log = logging.getLogger(__name__)

EVICTION_ERROR_RETRIES = 3
EVICTION_CONCURRENCY = 8
EVICT_MARGIN_S = 60
POLL_S = 5.0
MAX_RETRY_AFTER_S = 60.0


def evict(steps: DrainSteps, record: WorkflowRecord) -> StepResult:
    """Evict what is left to evict (uncached pods, the kind's blocking protections re-checked)."""
    steps.ops.renew(record)
    deps, now = steps.deps, steps.ops.now()
    if now >= record.deadline:
        return steps.timeout(record)
    pods, blocking = steps.pods.classify(*steps.pods.pods_and_budgets(record.node), record)
    if blocking:
        return steps.rollback(record.execution_id, "protected:" + ",".join(blocking), step="evict")
    evicted = {p.uid: p for p in record.evicted}
    # A pod already terminating that we did not record was evicted by an invocation that died before
    # saving (BUG-32): track it by UID like our own, instead of bouncing between evict and wait.
    adopted = [
        EvictedPod(
            p.metadata.uid,
            p.metadata.namespace,
            p.metadata.name,
            (p.metadata.deletionTimestamp or now) + timedelta(seconds=p.grace_seconds),
        )
        for p in pods
        if p.metadata.uid not in evicted and p.metadata.deletionTimestamp is not None
    ]
    todo = [p for p in pods if p.metadata.uid not in evicted and p.metadata.deletionTimestamp is None]
    too_late = [
        p for p in todo if now + timedelta(seconds=p.grace_seconds + EVICT_MARGIN_S) > record.deadline
    ]
    if too_late:
        # No eviction may start that cannot finish before the deadline: it is as good as reached.
        names = ",".join(p.key for p in too_late)
        why = "; ".join(drain_details(record).blocked) or f"grace_period_exceeds_deadline:{names}"
        return steps.rollback(record.execution_id, f"drain_timeout:{why}", step="evict")
    attempts: dict[str, int] = dict(drain_details(record).attempts)
    blocked: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, min(EVICTION_CONCURRENCY, len(todo)))) as pool:
        outcomes: list[EvictionOutcome] = list(
            pool.map(
                lambda p: deps.cluster.evict(p.metadata.namespace, p.metadata.name, p.metadata.uid), todo
            )
        )
    new_evicted = [*record.evicted, *adopted]
    hints: list[float] = []
    for pod, outcome in zip(todo, outcomes, strict=True):
        if outcome.status == "accepted":
            new_evicted.append(
                EvictedPod(
                    pod.metadata.uid,
                    pod.metadata.namespace,
                    pod.metadata.name,
                    now + timedelta(seconds=pod.grace_seconds),
                )
            )
        elif outcome.status == "blocked":
            blocked.append(f"{pod.key}: {outcome.message}")
            if outcome.retry_after:
                hints.append(outcome.retry_after)
        elif outcome.status == "error":
            attempts[pod.metadata.uid] = attempts.get(pod.metadata.uid, 0) + 1
            if attempts[pod.metadata.uid] >= EVICTION_ERROR_RETRIES:
                return steps.rollback(
                    record.execution_id, f"eviction_failed:{pod.key}: {outcome.message}", step="evict"
                )
            blocked.append(f"{pod.key}: {outcome.message}")
        elif outcome.status == "gone" and steps.pods.still_there(pod):
            # 404 from the eviction subresource while the pod exists: the API server does not serve
            # policy/v1 Eviction for it (kubectl falls back to DELETE; we never delete pods).
            return steps.rollback(
                record.execution_id,
                f"failed:eviction_unsupported:{pod.key}: the Eviction API answered 404 for a pod that "
                "exists; rightsizer never deletes pods",
                status="failed",
                step="evict",
            )
        # gone (404) and uid_mismatch (409) are done for that UID; a replacement is re-classified next round.
    details = drain_details(record).but(attempts=attempts, blocked=blocked)
    if blocked:
        if tuple(blocked) != drain_details(record).blocked:
            deps.cluster.emit_event(
                record.node, "DrainBlocked", "eviction blocked: " + "; ".join(blocked), warning=True
            )
        # The API server's Retry-After is a hint: honour it, but never wait past the drain deadline.
        wait = min(
            max([POLL_S, *hints]), MAX_RETRY_AFTER_S, max(0.0, (record.deadline - now).total_seconds())
        )
        return steps.ops.next(record, "evict", "evict", wait=max(wait, 0.5), evicted=tuple(new_evicted), details=details,
                          message="waiting for PodDisruptionBudgets: " + "; ".join(blocked))  # fmt: skip
    return steps.ops.next(
        record,
        "evict",
        "wait",
        evicted=tuple(new_evicted),
        details=details,
        message=f"{len(todo)} eviction(s) accepted",
    )


def wait(steps: DrainSteps, record: WorkflowRecord) -> StepResult:
    """Drained = every evicted pod UID is gone or finished (BUG-17), and nothing else is left to evict."""
    steps.ops.renew(record)
    deps, now = steps.deps, steps.ops.now()
    # One uncached list instead of a GET per pod: a UID bound to this node stays bound to it, so an
    # evicted pod is gone once its UID is no longer listed on the node (or it finished).
    listed = {p.get("metadata", {}).get("uid"): p for p in deps.cluster.list_pods_on_node(record.node)}
    remaining = [
        pod
        for pod in record.evicted
        if pod.uid in listed and listed[pod.uid].get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]
    stuck = [p for p in remaining if steps.pods.stuck(Pod.model_validate(listed[p.uid]))]
    names = ", ".join(f"{p.namespace}/{p.name}" for p in stuck)
    if stuck and drain_details(record).stuck != names:
        record = steps.ops.save(record, details=drain_details(record).but(stuck=names))
        log.warning("%s: not waiting for pods stuck terminating: %s", record.node, names)
        limit = deps.policy.skip_wait_for_delete_timeout
        deps.cluster.emit_event(record.node, "SkippedStuckPods", f"rightsizer no longer waits for pods "
                                f"terminating over {limit} s past their deletionTimestamp: {names}", warning=True)  # fmt: skip
    remaining = [p for p in remaining if p not in stuck]
    if remaining:
        if now >= record.deadline:
            return steps.timeout(record)
        # Wake up when the first grace period ends, but never spin: a pod still terminating past its
        # grace period is polled every POLL_S until it is stuck (skip_wait_for_delete_timeout).
        soonest = min((p.grace_deadline - now).total_seconds() for p in remaining)
        wait = POLL_S if soonest <= 0 else min(POLL_S, max(0.5, soonest))
        return steps.ops.next(
            record, "wait", "wait", wait=wait, message=f"waiting for {len(remaining)} pod(s) to terminate"
        )
    pods, _ = steps.pods.classify(list(listed.values()), [], record, live=False)
    evicted_uids = {p.uid for p in record.evicted}
    if [p for p in pods if p.metadata.uid not in evicted_uids]:
        return steps.ops.next(record, "wait", "evict", message="pods left to evict")
    return steps.ops.next(record, "wait", steps.rules.after_drain, message="drained")
