"""Off-hours (docs/architecture.md §4 "Off-hours", "Periods"): node groups follow a schedule down to zero and back.

Level-triggered, like AWS Instance Scheduler: every tick (an EventBridge rate schedule, or the CLI)
evaluates each selected node group's schedule at ``now`` — the schedule lists the periods when the group is
*down* — and converges one step further, so a missed or repeated tick never loses a transition (BUG-29)
and the weekday is always read in the schedule's own zone (BUG-28).

The executor of :func:`rightsizer.domain.offhours.decide` (the decision, its actions and its rules are
documented there): per group and round it **reads** the facts once — saved sizes, the Auto Scaling group's
sizes and members, drains in flight, Ready GPU nodes, failed scaling activities, and a verdict, snooze and
last failed drain per member only when the decision will look at them (one assessment per node per tick,
on one observation; the snoozes and the ledger read once per tick) —
**decides**, and **applies** the decision in :meth:`_Tick._apply`:

- save the sizes once per cycle (write-once store, no TTL), or restart the cycle of an interrupted restore;
- start the restore clock (``restore_deadline``, ``RestoreOverdue``);
- send the one ``UpdateNodegroupConfig`` (``minSize`` 0 so that targeted scale-in may go below the old
  minimum; ``desiredSize`` 0 with no node left; the saved sizes on the way up — a failed restore call is
  reported and retried by the next tick);
- drain and remove the first node through the drain workflow (``DrainRequest(offhours=True)``: exempt from
  ``max_nodes_per_*``, cooldown and disruption windows). An in-process starter finishes the drain before
  returning, so the tick reads and decides again; an asynchronous one (Step Functions) leaves it to the
  next tick;
- forget the saved sizes after a successful restore (BUG-27: nodes Ready with allocatable GPUs, never an
  HTTP 200).

Dry run (``deps.dry_run`` or the policy's ``dry_run``) is decided in that one method: the facts are read and
the decision made as in a live run, then nothing is changed — no sizes saved, no node group call, no drain,
no ledger entry — and each change is reported as "would …". The report keeps what was requested (every
decision, ``GroupReport.requested``) apart from what was taken (``actions``, ``drains``, the ledger).

Ports only (``rightsizer.ports``, ``rightsizer.state``); no clock: callers pass ``now``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from rightsizer.config import OffhoursConfig
from rightsizer.domain.errors import RightsizerError
from rightsizer.domain.model import (
    ANN_CORDONED_BY,
    GPU_RESOURCE,
    TAG_ENABLED,
    GroupSizes,
    Node,
    is_gpu_resource,
    opt_in_refusal,
)
from rightsizer.domain.offhours import (
    FORCE_OVERRIDABLE,
    Direction,
    GroupFacts,
    OffhoursAction,
    OffhoursDecision,
    Resize,
    decide,
    force_report,
    wants_verdicts,
)
from rightsizer.domain.periods import Period, next_transition, schedule_contains
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.quantity import parse_count
from rightsizer.ports import (
    JSON,
    Assessor,
    NodeGroupInfo,
    NodeGroupSizer,
    NodeScaler,
    ScalingFailure,
    SnoozeReader,
    WorkflowStarter,
)
from rightsizer.services.backoff import last_failures
from rightsizer.services.drain import FINAL_STATUSES, DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.offhours_report import GroupReport, OffhoursReport, rfc3339_or_none
from rightsizer.services.restore_timing import (
    InstanceDescriber,
    PodsOnNode,
    ScaleOutObserver,
    observe_restore,
)
from rightsizer.services.runner import InProcessRunner, Progress
from rightsizer.state import LedgerEntry, LedgerResult, StateStore

__all__ = [
    "FORCE_OVERRIDABLE",
    "LABEL_NODEGROUP",
    "LEDGER_KIND",
    "METRIC_RESTORE_OVERDUE",
    "TAG_OFFHOURS",
    "Direction",
    "ForcedAssessor",
    "GroupReport",
    "NodeLister",
    "OffhoursDeps",
    "OffhoursReport",
    "force_report",
    "in_process_starters",
    "offhours_status",
    "ready_gpu_nodes",
    "run_offhours",
]

log = logging.getLogger(__name__)


#: EKS tag on a managed node group that selects it for off-hours; the value names the schedule.
TAG_OFFHOURS = "rightsizer.io/offhours"
#: Node label naming the managed node group (set by EKS on every node it launches).
LABEL_NODEGROUP = "eks.amazonaws.com/nodegroup"
#: CloudWatch metric (EMF) raised when a restore is not complete ``restore_deadline`` after it began.
METRIC_RESTORE_OVERDUE = "RestoreOverdue"
#: Ledger ``kind`` of node group sizing entries (docs/architecture.md §5 action kinds).
LEDGER_KIND = "scale_node_group"
# Step Functions execution names allow 80 characters of [A-Za-z0-9-_]; ours must fit and stay unique.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_EXECUTION_NAME_MAX = 80


class NodeLister(Protocol):
    """The one Kubernetes read off-hours makes itself (``ClusterReader.list_nodes`` satisfies it)."""

    def list_nodes(self) -> list[JSON]:
        """core/v1 Nodes as ``kubectl get -o json`` items."""
        ...


@dataclass
class OffhoursDeps:
    """What an off-hours tick talks to.

    Attributes:
        cluster: EKS cluster name (node groups are looked up in it).
        config: the ``offhours`` config section (schedules and configured node groups).
        policy: the decision policy (``restore_deadline`` in seconds, ``dry_run``).
        nodes: lists Kubernetes Nodes (group membership by label, readiness after a restore).
        sizer: managed node group listing, tags, health and sizing (EKS, ``UpdateNodegroupConfig``).
        scaler: Auto Scaling sizes, members and failed scaling activities (``describe_group``,
            ``failed_activities``) — sizes are always read from the ASG.
        assessor: a fresh verdict per node (the same decision the drain's validate step makes).
        state: saved sizes, ledger, slots and leases (in-flight drains).
        starter: starts normal off-hours drains; None when this caller cannot drain (``status``).
        forced_starter: starts drains whose validate/revalidate ignore busy verdicts (``--force``), e.g.
            built by :func:`in_process_starters`; None = force is not available here.
        dry_run: True = change nothing; the policy's ``dry_run`` also turns it on.
        snoozes: the snoozes people set through approval requests (a snoozed member is not drained);
            None = none.
        pods: the pods of one node, to time a restore up to its first GPU pod Ready
            (``services.restore_timing``); None = timings end at GPUs allocatable.
        instances: EC2 DescribeInstances, for the restored instances' launch time and warm/cold start;
            None = not known.
    """

    cluster: str
    config: OffhoursConfig
    policy: Policy
    nodes: NodeLister
    sizer: NodeGroupSizer
    scaler: NodeScaler
    assessor: Assessor
    state: StateStore
    starter: WorkflowStarter | None = None
    forced_starter: WorkflowStarter | None = None
    dry_run: bool = True
    snoozes: SnoozeReader | None = None
    pods: PodsOnNode | None = None
    instances: InstanceDescriber | None = None

    @property
    def acting(self) -> bool:
        """True only when both switches allow acting (docs/architecture.md §5 "Live needs every switch")."""
        return not self.dry_run and not self.policy.dry_run


# --------------------------------------------------------------------------------------------------
# Force
# --------------------------------------------------------------------------------------------------


class ForcedAssessor:
    """An ``Assessor`` that lifts busy verdicts (``--force``) and keeps every other reason.

    The drain workflow re-checks candidacy in validate and revalidate through its assessor, so a forced
    off-hours drain runs the same workflow with this decorator around the normal assessor.
    """

    def __init__(self, inner: Assessor) -> None:
        """Args: inner: the assessor whose reports are filtered."""
        self._inner = inner

    def assess_node(self, node: str, now: datetime) -> NodeReport | None:
        """The inner assessor's ``NodeReport`` for ``node`` at ``now``, busy reasons removed."""
        report: NodeReport | None = self._inner.assess_node(node, now)
        return force_report(report)


def in_process_starters(
    drain_deps: DrainDeps,
    *,
    sleep: Callable[[float], None] = time.sleep,
    progress: Progress | None = None,
) -> tuple[InProcessRunner, InProcessRunner]:
    """Two in-process drain starters over the same ports: (normal, forced).

    The forced one's workflow assesses through :class:`ForcedAssessor`; everything else (state, cluster,
    scaler, dry run) is shared. For the CLI and tests; production drains go through Step Functions.
    """
    normal = InProcessRunner(DrainWorkflow(drain_deps), sleep=sleep, progress=progress)
    forced_deps = replace(drain_deps, assessor=ForcedAssessor(drain_deps.assessor))
    forced = InProcessRunner(DrainWorkflow(forced_deps), sleep=sleep, progress=progress)
    return normal, forced


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _execution_name(*parts: str) -> str:
    """A unique, Step Functions-safe execution name: readable prefix + hash of every part."""
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    readable = _UNSAFE.sub("-", "-".join(parts)).strip("-")
    return f"{readable[: _EXECUTION_NAME_MAX - len(digest) - 1]}-{digest}"


def _tick(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _group_nodes(nodes: Sequence[JSON], group: str) -> list[Node]:
    found = []
    for raw in nodes:
        node = Node.model_validate(raw)
        if node.labels.get(LABEL_NODEGROUP) == group and node.metadata.deletionTimestamp is None:
            found.append(node)
    return sorted(found, key=lambda n: n.name)


def _in_group(raw: JSON, group: str) -> bool:
    labels = (raw.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_NODEGROUP) == group)


def _has_allocatable_gpus(node: Node) -> bool:
    """Any GPU resource (whole GPUs, shared, MIG) allocatable > 0: the device plugin has registered
    (BUG-20: a node can be Ready before its GPUs are)."""
    allocatable = node.status.allocatable
    if parse_count(allocatable.get(GPU_RESOURCE)) > 0:
        return True
    return any(is_gpu_resource(name) and parse_count(value) > 0 for name, value in allocatable.items())


def ready_gpu_nodes(nodes: Sequence[JSON], group: str) -> list[str]:
    """Names of the group's Nodes (label ``eks.amazonaws.com/nodegroup``) that are Ready with allocatable
    GPUs and not being deleted, sorted — what a restore counts as success (BUG-27)."""
    ready = []
    for node in _group_nodes(nodes, group):
        is_ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        if is_ready and _has_allocatable_gpus(node):
            ready.append(node.name)
    return ready


def _asg_sizes(scaler: NodeScaler, asg: str) -> tuple[GroupSizes, frozenset[str]]:
    group = scaler.describe_group(asg)
    return group.sizes, group.in_service


@dataclass(frozen=True)
class _Selected:
    name: str
    schedule: str
    source: Literal["config", "tag"]
    info: NodeGroupInfo | None
    error: str | None = None
    notes: tuple[str, ...] = ()


def _select_groups(deps: OffhoursDeps, errors: list[str]) -> list[_Selected]:
    """Configured groups first (config wins over a tag), then groups tagged ``rightsizer.io/offhours``."""
    configured: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for entry in deps.config.node_groups:
        if entry.name in configured:
            notes.setdefault(entry.name, []).append(f"duplicate_config_entry:{entry.schedule}")
            continue
        configured[entry.name] = entry.schedule
    infos: dict[str, NodeGroupInfo] = {}
    describe_errors: dict[str, str] = {}
    try:
        listed: list[str] | None = deps.sizer.list_nodegroups(deps.cluster)
    except RightsizerError as exc:
        # Without the list, tagged groups are unknown this tick; configured ones are still served.
        errors.append(f"list_nodegroups: {exc}")
        listed = None
    names = sorted(set(listed or []) | set(configured))
    for name in names:
        if listed is not None and name not in listed:
            describe_errors[name] = "node_group_not_found"
            continue
        try:
            infos[name] = deps.sizer.describe(deps.cluster, name)
        except RightsizerError as exc:
            describe_errors[name] = f"describe_failed: {exc}"
    selected: list[_Selected] = []
    for name in names:
        info = infos.get(name)
        tag = info.tags.get(TAG_OFFHOURS) if info is not None else None
        if name in configured:
            group_notes = list(notes.get(name, []))
            if tag is not None and tag != configured[name]:
                group_notes.append(f"config_overrides_tag:{tag}")
            selected.append(
                _Selected(
                    name, configured[name], "config", info, describe_errors.get(name), tuple(group_notes)
                )
            )
        elif tag is not None:
            selected.append(_Selected(name, tag, "tag", info))
    return selected


# --------------------------------------------------------------------------------------------------
# The tick: read facts, decide (rightsizer.domain.offhours), apply
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    """What one round read about a group: the decision's facts plus what only the report needs."""

    facts: GroupFacts
    failures: tuple[ScalingFailure, ...]


class _Tick:
    """One evaluation at ``now``; holds the per-tick context so group handlers stay short."""

    def __init__(self, deps: OffhoursDeps, now: datetime, *, force: bool, only: Direction | None) -> None:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, got naive {now.isoformat()}")
        self.deps = deps
        self.now = now.astimezone(UTC)
        self.force = force
        self.only = only
        # The one place a dry run is decided: every change goes through _apply, which asks this.
        self.acting = deps.acting
        self.report = OffhoursReport(deps.cluster, self.now, not self.acting, force, only)
        # One assessment per node per tick: the blocker check and the drain's savings (USD/h) share it.
        self._verdicts: dict[str, NodeReport | None] = {}
        # Holds that no verdict shows (domain.holds), read once per tick when a decision looks at members.
        self._snoozed: dict[str, datetime] | None = None
        self._failed_drains: dict[str, tuple[datetime, str]] | None = None
        self._entries: list[LedgerEntry] | None = None

    # ------------------------------------------------------------------------------ per group

    def group(self, selected: _Selected, *, status_only: bool) -> GroupReport:
        """Evaluate one group; errors become the group's ``failed`` outcome, never the tick's."""
        report = GroupReport(selected.name, selected.schedule, selected.source)
        report.reasons.extend(selected.notes)
        periods: list[Period] | None = self.deps.config.schedules.get(selected.schedule)
        if periods is None:
            known = ",".join(sorted(self.deps.config.schedules)) or "none"
            report.reasons.append(f"unknown_schedule:{selected.schedule}")
            report.error = f"schedule {selected.schedule!r} is not defined (known: {known})"
            log.warning("off-hours: %s skipped: %s", selected.name, report.error)
            return report
        report.state = "down" if schedule_contains(periods, self.now) else "up"
        report.next_transition = next_transition(periods, self.now)
        if selected.error is not None or selected.info is None:
            report.outcome = "failed"
            report.error = selected.error or "node_group_not_found"
            return report
        report.asg_name = selected.info.asg_name
        report.health_issues = list(selected.info.health_issues)
        if report.asg_name is None:
            report.outcome = "failed"
            report.error = "node group has no Auto Scaling group yet"
            return report
        refusal = opt_in_refusal(selected.info.tags, self.deps.cluster, asg=False)
        if refusal is not None:  # IAM would deny UpdateNodegroupConfig (template.yaml)
            report.outcome, report.error = "failed", f"node group lacks the tag {TAG_ENABLED}=true"
            report.reasons.append(refusal)
            return report
        try:
            report.saved = self.deps.state.get_sizes(selected.name)
            if status_only:
                self._status(report)
            elif self.only is not None and self.only != report.state:
                report.outcome = "skipped"
                report.reasons.append(f"schedule_says_{report.state}")
            else:
                self._converge(report)
            if report.state == "up" and self.acting:
                self._measure(report)
        except RightsizerError as exc:
            report.outcome = "failed"
            report.error = f"{type(exc).__name__}: {exc}"
            log.error("off-hours: %s failed: %s", selected.name, report.error)
        return report

    def _measure(self, report: GroupReport) -> None:
        """Time the nodes of the group's latest restore (``services.restore_timing``): one ledger entry
        per node once it serves. The ledger is read once per tick."""
        if self._entries is None:
            self._entries = self.deps.state.entries()
        nodes = [n for n in self.deps.nodes.list_nodes() if _in_group(n, report.node_group)]
        observer = ScaleOutObserver(self.deps.state, self.deps.pods, self.deps.instances)
        for timing in observe_restore(observer, report.node_group, nodes, self._entries, self.now):
            report.actions.append(f"measured restore of {timing.node}: {timing.reason()}")

    def _status(self, report: GroupReport) -> None:
        assert report.asg_name is not None
        report.outcome = "status"
        report.current, _ids = _asg_sizes(self.deps.scaler, report.asg_name)
        nodes = self.deps.nodes.list_nodes()
        report.in_flight = self._in_flight(report.asg_name, _group_nodes(nodes, report.node_group))
        report.ready_nodes = len(ready_gpu_nodes(nodes, report.node_group))
        started = report.saved.restore_started_at if report.saved is not None else None
        if started is not None and report.state == "up":
            report.restore_overdue = self.now >= started + timedelta(
                seconds=self.deps.policy.restore_deadline
            )

    def _converge(self, report: GroupReport) -> None:
        """Read, decide, apply — again after each drain that finished in this tick (an in-process starter),
        bounded so that nodes which never go away (a lagging node lifecycle) cannot keep the tick running."""
        rounds_left: int | None = None
        progressed = False
        while rounds_left is None or rounds_left > 0:
            read = self._read(report)
            rounds_left = (len(read.facts.members) + 1 if rounds_left is None else rounds_left) - 1
            decision = decide(read.facts, self.deps.policy, force=self.force)
            report.requested.append(decision.to_json_dict())
            report.outcome = decision.outcome
            if progressed and decision.action is OffhoursAction.HOLD:
                report.outcome = "scaling_down"  # this tick took the group the rest of the way
            report.reasons.extend(decision.reasons)
            report.node_reasons = {name: list(why) for name, why in decision.node_reasons.items()}
            if not self._apply(report, decision, read):
                return
            progressed = True
        report.reasons.append("nodes_still_present")

    # ------------------------------------------------------------------------------ reading facts

    def _read(self, report: GroupReport) -> _Read:
        """Every fact the decision needs, read once per round (the observation behind the verdicts is
        memoized per tick by the wiring)."""
        asg, group, saved = report.asg_name, report.node_group, report.saved
        assert asg is not None and report.state is not None
        # Nodes before sizes: a node lifecycle that follows the ASG (the demo, tests) has caught up then.
        nodes = self.deps.nodes.list_nodes()
        labelled = _group_nodes(nodes, group)
        report.current, ids = _asg_sizes(self.deps.scaler, asg)
        # A Node whose instance left the group (Terminating, gone) is on its way out, not to drain.
        members = tuple(n.name for n in labelled if n.instance_id in ids)
        report.in_flight = self._in_flight(asg, labelled)
        in_flight = tuple(report.in_flight)
        failures: tuple[ScalingFailure, ...] = ()
        if report.state == "up":
            report.ready_nodes = len(ready_gpu_nodes(nodes, group))
            if saved is not None:
                since = saved.restore_started_at or self.now
                failures = tuple(self.deps.scaler.failed_activities(asg, since))
        if wants_verdicts(report.state, members, in_flight):
            for name in members:
                if name not in self._verdicts:
                    self._verdicts[name] = self.deps.assessor.assess_node(name, self.now)
            self._read_holds()
        facts = GroupFacts(
            direction=report.state,
            now=self.now,
            saved=saved.sizes if saved is not None else None,
            current=report.current,
            restore_started_at=saved.restore_started_at if saved is not None else None,
            members=members,
            in_flight=in_flight,
            ready_nodes=report.ready_nodes or 0,
            verdicts={name: self._verdicts[name] for name in members if name in self._verdicts},
            failed_activity_codes=tuple(f.code for f in failures),
            snoozed={n: t for n, t in (self._snoozed or {}).items() if n in members},
            failed_drains={n: f for n, f in (self._failed_drains or {}).items() if n in members},
        )
        return _Read(facts, failures)

    def _read_holds(self) -> None:
        """The cluster's running snoozes and every node's last failed drain, once per tick: a member
        snoozed or backed off is not drained (the drain's validate would abandon it anyway)."""
        if self._snoozed is None:
            self._snoozed = self.deps.snoozes.snoozes(self.now) if self.deps.snoozes is not None else {}
        if self._failed_drains is None:
            held = self.deps.policy.drain_failure_backoff > 0
            self._failed_drains = last_failures(self.deps.state) if held else {}

    def _in_flight(self, asg: str, nodes: Sequence[Node]) -> list[str]:
        """Nodes of the group being drained now: a budget slot held on the ASG, or our cordon with a live
        lease held by the cordoning execution."""
        flying = {slot.node for slot in self.deps.state.slots() if slot.group == asg}
        for node in nodes:
            owner = node.metadata.annotations.get(ANN_CORDONED_BY)
            if not owner:
                continue
            lease = self.deps.state.get(node.name)
            if lease is not None and lease.owner == owner and not lease.expired(self.now):
                flying.add(node.name)
        return sorted(flying)

    # ------------------------------------------------------------------------------ applying

    def _apply(self, report: GroupReport, decision: OffhoursDecision, read: _Read) -> bool:
        """Report the decision and, unless this is a dry run, take it. True = a drain finished, read again."""
        if decision.action is OffhoursAction.RESTORE:
            report.failed_activities = [_failure_json(f) for f in read.failures]
        if decision.overdue_since is not None:
            self._overdue(report, decision.overdue_since, read.facts)
        if not self.acting:
            report.actions.extend(_would(decision))
            return False
        self._save(report, decision)
        if decision.start_restore_clock:
            report.saved = self.deps.state.mark_restore_started(report.node_group, self.now) or report.saved
        if decision.resize is not None:
            try:
                self._resize(report, decision.resize)
            except RightsizerError as exc:
                if decision.action is not OffhoursAction.RESTORE:
                    raise
                # Reported, and retried by the next tick; the restore deadline still applies.
                report.error = f"{type(exc).__name__}: {exc}"
        if decision.overdue_since is not None:
            codes = sorted({code or "unknown" for code in read.facts.failed_activity_codes})
            self._ledger(
                report, "restore", "failed", "restore_overdue:" + ",".join(codes or ["nodes_not_ready"])
            )
        if decision.forget_saved:
            self._ledger(report, "restored", "applied", f"{read.facts.ready_nodes} node(s) Ready with GPUs")
            self.deps.state.forget_sizes(report.node_group)
            report.actions.append("restore complete: saved sizes forgotten")
        return bool(decision.drain) and self._drain_one(report, decision.drain[0])

    def _save(self, report: GroupReport, decision: OffhoursDecision) -> None:
        """Save the sizes once per cycle; keep the first ones forever (write-once store)."""
        saved = report.saved
        if decision.restart_restore_clock and saved is not None:
            # A restore that never completed is interrupted by a new off period: the sizes from before
            # the first scale-down are still the truth; only the restore clock must restart, so the next
            # up period does not raise RestoreOverdue at once.
            self.deps.state.forget_sizes(report.node_group)
            report.saved = self.deps.state.save_sizes(report.node_group, saved.sizes, self.now)
        elif decision.save is not None:
            sizes = decision.save
            report.saved = self.deps.state.save_sizes(report.node_group, sizes, self.now)
            if report.saved.sizes == sizes:
                report.actions.append(
                    f"saved sizes: min {sizes.min}, desired {sizes.desired}, max {sizes.max}"
                )

    def _ledger(self, report: GroupReport, step: str, result: LedgerResult, reason: str) -> None:
        """Record a ``scale_node_group`` entry. The execution id is the group's off-hours cycle (its
        saved_at), so an outcome repeated by later ticks of one cycle is stored once."""
        if report.saved is None:
            return
        cycle = _execution_name("offhours", report.node_group, _tick(report.saved.saved_at))
        self.deps.state.record(
            LedgerEntry(
                execution_id=cycle,
                node=None,
                instance_id=None,
                node_group=report.node_group,
                kind=LEDGER_KIND,
                step=step,
                result=result,
                reason=reason,
                # Savings are recorded per removed node by the drains (kind scale_in); counting them here
                # again would double them.
                hourly_savings_usd=None,
                monthly_savings_usd=None,
                at=self.now,
            )
        )

    def _resize(self, report: GroupReport, resize: Resize) -> None:
        """Send ``resize`` through ``UpdateNodegroupConfig``; ledger on change and on failure."""
        sizes = resize.sizes
        try:
            changed = self.deps.sizer.update_sizes(self.deps.cluster, report.node_group, sizes).changed
        except RightsizerError as exc:
            self._ledger(report, resize.step, "failed", f"{type(exc).__name__}: {exc}")
            raise
        if changed:
            report.actions.append(resize.text())
            self._ledger(report, resize.step, "applied", resize.text())

    def _overdue(self, report: GroupReport, deadline: datetime, facts: GroupFacts) -> None:
        """Raise ``RestoreOverdue`` (a report metric and an error log; also in a dry run)."""
        report.restore_overdue = True
        self.report.metrics.append(
            {
                "name": METRIC_RESTORE_OVERDUE,
                "value": 1,
                "unit": "Count",
                "dimensions": {"cluster": self.deps.cluster, "node_group": report.node_group},
            }
        )
        codes = sorted({code or "unknown" for code in facts.failed_activity_codes})
        want = facts.saved.desired if facts.saved is not None else 0
        log.error(
            "off-hours: restore of %s overdue since %s: %d/%d nodes Ready with GPUs; failed activities: %s",
            report.node_group,
            rfc3339_or_none(deadline),
            facts.ready_nodes,
            want,
            ", ".join(codes) or "none",
        )

    def _drain_one(self, report: GroupReport, node: str) -> bool:
        """Start the drain of ``node``; True when it finished successfully (go on with the next node)."""
        starter = self.deps.forced_starter if self.force else self.deps.starter
        if starter is None:
            report.outcome = "failed"
            report.error = "forced drains are not available here" if self.force else "no drain starter"
            return False
        execution_id = _execution_name("offhours", report.node_group, node, _tick(self.now))
        assessed = self._verdicts.get(node)
        request = DrainRequest(
            node=node,
            execution_id=execution_id,
            trigger=f"offhours:{report.node_group}",
            hourly_savings_usd=assessed.hourly_usd if assessed is not None else None,
            offhours=True,
        )
        starter.start(request)
        record = self.deps.state.load(execution_id)
        status = record.status if record is not None else "started"
        report.drains.append({"node": node, "execution_id": execution_id, "status": status})
        if record is None or record.status not in FINAL_STATUSES:
            report.outcome = "waiting"
            report.actions.append(f"started drain of {node} ({execution_id})")
            return False
        if record.status != "succeeded":
            report.outcome = "failed"
            report.reasons.append(f"drain_{record.status}:{node}")
            report.error = f"drain of {node} ended {record.status}"
            return False
        report.actions.append(f"drained and removed {node}")
        return True


def _would(decision: OffhoursDecision) -> list[str]:
    """A dry run's account of ``decision``: each change it would make, in order."""
    lines = []
    if decision.save is not None:
        s = decision.save
        lines.append(f"would save sizes: min {s.min}, desired {s.desired}, max {s.max}")
    if decision.resize is not None:
        lines.append(f"would {decision.resize.text()}")
    if decision.drain:
        lines.append(f"would drain and remove, one at a time: {', '.join(decision.drain)}")
    if decision.then is not None:
        t = decision.then
        lines.append(f"would set desired {t.desired}: min {t.min}, desired {t.desired}, max {t.max}")
    if decision.forget_saved:
        lines.append("would forget the saved sizes (restore complete)")
    return lines


def _failure_json(failure: ScalingFailure) -> dict[str, Any]:
    return {
        "activity_id": failure.activity_id,
        "started_at": rfc3339_or_none(failure.started_at),
        "status": failure.status,
        "code": failure.code,
        "message": failure.message,
    }


def _run(
    deps: OffhoursDeps, now: datetime, *, force: bool, only: Direction | None, status_only: bool
) -> OffhoursReport:
    tick = _Tick(deps, now, force=force, only=only)
    for selected in _select_groups(deps, tick.report.errors):
        group = tick.group(selected, status_only=status_only)
        tick.report.groups.append(group)
        log.info(
            "off-hours %s: %s schedule %s says %s -> %s %s",
            "status" if status_only else ("tick" if tick.acting else "dry run"),
            group.node_group,
            group.schedule,
            group.state,
            group.outcome,
            "; ".join(group.actions + group.reasons),
        )
    return tick.report


def run_offhours(
    deps: OffhoursDeps, now: datetime, *, force: bool = False, only: Direction | None = None
) -> OffhoursReport:
    """Converge every selected node group one step towards its schedule at ``now``.

    Groups are those of ``deps.config.node_groups`` plus managed node groups tagged
    ``rightsizer.io/offhours=<schedule>`` (the config wins for a group in both). A group whose schedule is
    not defined is reported (``unknown_schedule:<name>``) and skipped.

    Args:
        deps: the ports; ``deps.acting`` decides between acting and a dry run.
        now: aware instant of the tick (the scheduler's ``scheduled_time``, or the CLI's now).
        force: drain nodes whose verdict is busy/underutilized too (never unknown or protected).
        only: act only on groups whose schedule says this direction (the CLI's ``down`` / ``up``);
            the others are reported as ``skipped`` (``schedule_says_<direction>``).

    Returns:
        The :class:`OffhoursReport`; a failure of one group never stops the others.

    Raises:
        ValueError: ``now`` is naive.
    """
    return _run(deps, now, force=force, only=only, status_only=False)


def offhours_status(deps: OffhoursDeps, now: datetime) -> OffhoursReport:
    """Read-only view per group: schedule state at ``now``, next transition, saved and current sizes,
    drains in flight, Ready GPU nodes and whether a restore is overdue. Changes nothing."""
    return _run(deps, now, force=False, only=None, status_only=True)
