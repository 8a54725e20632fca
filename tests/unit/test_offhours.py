"""Off-hours on fakes (docs/architecture.md §4 "Off-hours", "Periods"; BUG-27, BUG-28, BUG-29).

The drain is the real :class:`~rightsizer.services.drain.DrainWorkflow` run by the in-process runner; the
cluster, the node groups and the assessor are small in-memory fakes whose node lifecycle follows the
Auto Scaling group (a terminated instance's Node goes away, a launched one appears), so a whole night —
down, down again, up — runs without sockets.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rightsizer import cli
from rightsizer.adapters.autoscaling import error_code_of
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.config import Config, OffhoursConfig, OffhoursGroup
from rightsizer.domain.errors import ConfigError, PermanentError, StalePlan
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY, TAG_ENABLED, GroupSizes
from rightsizer.domain.periods import Period
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.verdicts import verdict_of
from rightsizer.ports import (
    EvictionOutcome,
    NodeGroupInfo,
    NodeGroupUpdate,
    ScalingFailure,
    ScalingGroup,
    TerminateResult,
)
from rightsizer.services.drain import DrainDeps
from rightsizer.services.offhours import (
    METRIC_RESTORE_OVERDUE,
    TAG_OFFHOURS,
    ForcedAssessor,
    OffhoursDeps,
    OffhoursReport,
    force_report,
    in_process_starters,
    offhours_status,
    ready_gpu_nodes,
    run_offhours,
)
from tests.builders import gpu_node, pod

JSON = dict[str, Any]
CLUSTER = "prod-eks"
BERLIN = "Europe/Berlin"
IDLE = ["idle_window_clean"]


def berlin(text: str) -> datetime:
    """An instant given as Berlin wall-clock ISO text with its offset."""
    return datetime.fromisoformat(text).astimezone(UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def periods(*specs: tuple[list[str], str, str], timezone: str = BERLIN) -> list[Period]:
    return [Period(days=days, start=start, end=end, timezone=timezone) for days, start, end in specs]


WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri"]
EVERY_DAY = [*WEEKDAYS, "Sat", "Sun"]
# BUG-29's three schedules, as the periods when the group is DOWN.
NIGHTLY = periods((EVERY_DAY, "22:30", "06:00"))
WEEKEND = periods(
    (["Fri"], "20:00", "00:00"), (["Sat", "Sun"], "00:00", "00:00"), (["Mon"], "00:00", "07:00")
)
EVENING = periods((WEEKDAYS, "18:00", "00:00"))
# BUG-28: uptime Mon-Fri 07:00-19:00 in Auckland, i.e. down on weeknights and the whole weekend.
AUCKLAND_DOWN = periods(
    (WEEKDAYS, "19:00", "07:00"),
    (["Sat", "Sun"], "00:00", "00:00"),
    (["Mon"], "00:00", "07:00"),
    timezone="Pacific/Auckland",
)
SCHEDULES: dict[str, list[Period]] = {
    "nightly": NIGHTLY,
    "weekend": WEEKEND,
    "evening": EVENING,
    "auckland": AUCKLAND_DOWN,
    # DST probes: a start inside the spring-forward gap, and the whole repeated fall-back hour.
    "gap": periods((["Sun"], "02:30", "05:00")),
    "fallback": periods((["Sun"], "02:00", "03:00")),
    # Boundaries inside the repeated fall-back hour (02:00-03:00 twice on the last Sunday of October).
    "late_end": periods((["Sat"], "22:00", "02:30")),
    "late_start": periods((["Sun"], "02:30", "06:00")),
}

SATURDAY_NOON = berlin("2024-05-18T13:00:00+02:00")  # weekend: DOWN
MONDAY_MORNING = berlin("2024-05-20T08:00:00+02:00")  # weekend: UP


# ------------------------------------------------------------------------------------------- fakes


class FakeCluster:
    """In-memory Kubernetes: the ``ClusterWriter`` port plus ``list_nodes``; evictions finish at once."""

    def __init__(self) -> None:
        self.nodes: dict[str, JSON] = {}
        self.pods: dict[tuple[str, str], JSON] = {}
        self.events: list[tuple[str, str, str]] = []
        #: Called before every read, e.g. to let a node lifecycle catch up with moto.
        self.before_read: Callable[[], None] | None = None

    def _sync(self) -> None:
        if self.before_read is not None:
            self.before_read()

    def add_node(self, node: JSON, pods: Sequence[JSON] = ()) -> None:
        self.nodes[node["metadata"]["name"]] = node
        for p in pods:
            self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        for key in [k for k, p in self.pods.items() if p["spec"].get("nodeName") == name]:
            del self.pods[key]

    def node_of_instance(self, instance_id: str) -> str | None:
        for name, node in self.nodes.items():
            if node["spec"]["providerID"].endswith("/" + instance_id):
                return name
        return None

    def set_ready(self, name: str, ready: bool) -> None:
        self.nodes[name]["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    # ClusterReader.list_nodes
    def list_nodes(self) -> list[JSON]:
        self._sync()
        return [copy.deepcopy(n) for _, n in sorted(self.nodes.items())]

    # ClusterWriter
    def get_node(self, name: str) -> JSON | None:
        self._sync()
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node is not None else None

    def list_pods_on_node(self, node: str) -> list[JSON]:
        return [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName") == node]

    def list_pdbs(self) -> list[JSON]:
        return []

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        found = self.pods.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def cordon(self, node: str, execution_id: str, at: str) -> JSON:
        obj = self.nodes[node]
        obj["spec"]["unschedulable"] = True
        obj["metadata"]["annotations"].update({ANN_CORDONED_BY: execution_id, ANN_CORDONED_AT: at})
        return copy.deepcopy(obj)

    def uncordon(self, node: str, execution_id: str) -> bool:
        obj = self.nodes.get(node)
        if obj is None or obj["metadata"]["annotations"].get(ANN_CORDONED_BY) != execution_id:
            return False
        obj["spec"]["unschedulable"] = False
        obj["metadata"]["annotations"].pop(ANN_CORDONED_BY, None)
        obj["metadata"]["annotations"].pop(ANN_CORDONED_AT, None)
        return True

    def evict(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        found = self.pods.get((namespace, name))
        if found is None:
            return EvictionOutcome("gone")
        if found["metadata"]["uid"] != uid:
            return EvictionOutcome("uid_mismatch")
        del self.pods[(namespace, name)]
        return EvictionOutcome("accepted")

    def emit_event(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((node, reason, message))


@dataclass
class FakeGroup:
    name: str
    asg: str
    min: int
    desired: int
    max: int
    instances: list[str] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    status: str = "ACTIVE"
    health: tuple[str, ...] = ()


class FakeNodeGroups:
    """Managed node groups and their ASGs: the ``NodeGroupSizer`` and ``NodeScaler`` ports.

    Launches follow ``update_sizes`` at once, limited by ``capacity`` (instances AWS can still give per
    group, like InsufficientInstanceCapacity); each launched instance gets a Node that is Ready with GPUs
    unless ``launch_ready`` is False. A terminate removes the Node as EKS eventually does.
    """

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.groups: dict[str, FakeGroup] = {}
        self.update_calls: list[tuple[str, int, int, int]] = []
        self.update_asks = 0
        self.failures: dict[str, list[ScalingFailure]] = {}
        self.launch_ready = True
        self.capacity: dict[str, int] = {}
        self._serial = 0

    def add_group(
        self, name: str, sizes: tuple[int, int, int], *, tags: Mapping[str, str] | None = None
    ) -> FakeGroup:
        group = FakeGroup(name, f"eks-{name}-asg", *sizes, tags={TAG_ENABLED: "true", **(tags or {})})
        self.groups[name] = group
        for _ in range(group.desired):
            self._launch(group, ready=True)
        return group

    def _launch(self, group: FakeGroup, *, ready: bool) -> None:
        self._serial += 1
        instance_id = f"i-{self._serial:017x}"
        group.instances.append(instance_id)
        name = f"{group.name}-node-{self._serial}"
        self.cluster.add_node(
            gpu_node(name, instance_id=instance_id, nodegroup=group.name),
            [pod(f"web-{self._serial}", name)],
        )
        self.cluster.set_ready(name, ready)

    def _by_asg(self, asg_name: str) -> FakeGroup:
        for group in self.groups.values():
            if group.asg == asg_name:
                return group
        raise StalePlan(f"Auto Scaling group {asg_name!r} not found")

    # NodeGroupSizer
    def list_nodegroups(self, cluster: str) -> list[str]:
        return sorted(self.groups)

    def describe(self, cluster: str, nodegroup: str) -> NodeGroupInfo:
        group = self.groups.get(nodegroup)
        if group is None:
            raise StalePlan(f"node group {nodegroup} not found")
        return NodeGroupInfo(group.asg, group.status, dict(group.tags), group.health)

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        self.update_asks += 1
        if sizes.max < 1:
            raise ConfigError("bad sizes", field="scalingConfig.maxSize")
        group = self.groups[nodegroup]
        before = GroupSizes(group.min, group.desired, group.max)
        if before == sizes:
            return NodeGroupUpdate(cluster, nodegroup, before, before, None, True, 1)
        self.update_calls.append((nodegroup, sizes.min, sizes.desired, sizes.max))
        group.min, group.desired, group.max = sizes.min, sizes.desired, sizes.max
        limit = self.capacity.get(nodegroup, 10**6)
        while len(group.instances) < min(group.desired, limit):
            self._launch(group, ready=self.launch_ready)
        while len(group.instances) > group.desired:
            # Lowering desired through the node group takes instances of AWS's choosing (BUG-23).
            gone = group.instances.pop()
            name = self.cluster.node_of_instance(gone)
            if name:
                self.cluster.remove_node(name)
        return NodeGroupUpdate(cluster, nodegroup, before, sizes, "update-1", False, 1)

    def failed_activities(self, asg_name: str, since: datetime) -> list[ScalingFailure]:
        return [f for f in self.failures.get(asg_name, []) if f.started_at is None or f.started_at >= since]

    # NodeScaler
    def find_group(self, instance_id: str) -> str | None:
        for group in self.groups.values():
            if instance_id in group.instances:
                return group.asg
        return None

    def describe_group(self, asg_name: str) -> ScalingGroup:
        group = self._by_asg(asg_name)
        members = frozenset(group.instances)
        return ScalingGroup(asg_name, GroupSizes(group.min, group.desired, group.max), members, members)

    def opt_in_refusal(self, asg_name: str, cluster: str) -> str | None:
        self._by_asg(asg_name)
        return None

    def terminate(self, asg_name: str, instance_id: str) -> TerminateResult:
        group = self._by_asg(asg_name)
        if instance_id not in group.instances:
            return TerminateResult(asg_name, instance_id, group.desired, group.desired, already_done=True)
        if group.desired - 1 < group.min:
            raise PermanentError(f"{asg_name}: desired {group.desired} - 1 < min {group.min}")
        group.instances.remove(instance_id)
        group.desired -= 1
        name = self.cluster.node_of_instance(instance_id)
        if name:
            self.cluster.remove_node(name)
        return TerminateResult(asg_name, instance_id, group.desired + 1, group.desired, already_done=False)

    def sizes(self, name: str) -> tuple[int, int, int]:
        group = self.groups[name]
        return group.min, group.desired, group.max


class FakeAssessor:
    """Verdicts from reason lists per node (default idle); unknown node names are not GPU nodes."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.reasons: dict[str, list[str]] = {}
        self.calls = 0

    def assess_node(self, node: str, now: datetime) -> NodeReport | None:
        self.calls += 1
        obj = self.cluster.nodes.get(node)
        if obj is None:
            return None
        reasons = self.reasons.get(node, IDLE)
        return NodeReport(
            node=node,
            verdict=verdict_of(reasons),
            reasons=list(reasons),
            node_group=obj["metadata"]["labels"].get("eks.amazonaws.com/nodegroup"),
            instance_id=obj["spec"]["providerID"].rsplit("/", 1)[-1],
            instance_type="g5.12xlarge",
            gpus=4,
            gpu_activity_max_pct=0.0,
            fb_used_max_mib=0.0,
            coverage=1.0,
            hourly_usd=5.672,
        )


@dataclass
class World:
    cluster: FakeCluster
    aws: FakeNodeGroups
    assessor: FakeAssessor
    state: MemoryState
    deps: OffhoursDeps
    clock: list[datetime]

    def run(self, now: datetime, **kwargs: Any) -> OffhoursReport:
        self.clock[0] = now
        return run_offhours(self.deps, now, **kwargs)

    def nodes_of(self, group: str) -> list[str]:
        return sorted(
            n
            for n, obj in self.cluster.nodes.items()
            if obj["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == group
        )


def make_world(
    groups: Sequence[tuple[str, str]] = (("gpu-a10g", "weekend"),),
    *,
    sizes: tuple[int, int, int] = (1, 3, 6),
    policy: Policy | None = None,
    dry_run: bool = False,
    tagged: Mapping[str, tuple[str, tuple[int, int, int]]] | None = None,
    untracked: Sequence[str] = (),
    aws_class: type[FakeNodeGroups] = FakeNodeGroups,
) -> World:
    """A cluster whose configured groups (name, schedule) start at ``sizes`` with that many idle nodes."""
    cluster = FakeCluster()
    aws = aws_class(cluster)
    for name, _schedule in groups:
        if name not in untracked:
            aws.add_group(name, sizes)
    for name, (schedule, group_sizes) in (tagged or {}).items():
        aws.add_group(name, group_sizes, tags={TAG_OFFHOURS: schedule})
    assessor = FakeAssessor(cluster)
    state = MemoryState(CLUSTER)
    policy = policy or Policy(dry_run=False)
    clock = [SATURDAY_NOON]
    drain_deps = DrainDeps(
        cluster=cluster, scaler=aws, assessor=assessor, state=state, policy=policy, dry_run=False,
        clock=lambda: clock[0],
    )  # fmt: skip
    normal, forced = in_process_starters(drain_deps, sleep=lambda _s: None)
    config = OffhoursConfig(
        schedules=SCHEDULES,
        node_groups=[OffhoursGroup(name=name, schedule=schedule) for name, schedule in groups],
    )
    deps = OffhoursDeps(
        cluster=CLUSTER,
        config=config,
        policy=policy,
        nodes=cluster,
        sizer=aws,
        scaler=aws,
        assessor=assessor,
        state=state,
        starter=normal,
        forced_starter=forced,
        dry_run=dry_run,
    )
    return World(cluster, aws, assessor, state, deps, clock)


def scale_node_group_entries(state: MemoryState) -> list[tuple[str, str, str]]:
    return [(e.step, e.result, e.node_group or "") for e in state.entries() if e.kind == "scale_node_group"]


# ------------------------------------------------------------------------------ down, down, up


def test_down_then_down_again_then_up_restores_the_exact_sizes() -> None:
    world = make_world()
    first = world.run(SATURDAY_NOON)
    group = first.group("gpu-a10g")
    assert group.state == "down" and group.outcome == "scaling_down", group
    assert not first.failed and not first.dry_run
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)
    # min 0 first (desired and max unchanged), then one drain per node; the drains' targeted scale-in
    # already took desired to 0, so no second UpdateNodegroupConfig (it would decrement twice).
    assert world.aws.update_calls == [("gpu-a10g", 0, 3, 6)]
    assert [d["status"] for d in group.drains] == ["succeeded"] * 3
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    assert world.nodes_of("gpu-a10g") == []
    assert scale_node_group_entries(world.state) == [("min_zero", "applied", "gpu-a10g")]
    scale_ins = [e for e in world.state.entries() if e.kind == "scale_in" and e.result == "applied"]
    assert len(scale_ins) == 3 and all(e.hourly_savings_usd == 5.672 for e in scale_ins)

    # A second run in the same off period: nothing to do, and the saved sizes are NOT replaced by 0/0/6.
    again = world.run(SATURDAY_NOON + timedelta(minutes=5))
    assert again.group("gpu-a10g").outcome == "down"
    assert world.state.get_sizes("gpu-a10g") == saved
    assert world.aws.update_calls == [("gpu-a10g", 0, 3, 6)]

    # Monday morning: the saved sizes come back, all three together.
    up = world.run(MONDAY_MORNING)
    restoring = up.group("gpu-a10g")
    assert restoring.state == "up" and restoring.outcome == "restoring"
    assert world.aws.update_calls[-1] == ("gpu-a10g", 1, 3, 6)
    assert world.state.get_sizes("gpu-a10g") is not None  # kept until the nodes are Ready

    done = world.run(MONDAY_MORNING + timedelta(minutes=5))
    assert done.group("gpu-a10g").outcome == "restored"
    assert world.aws.sizes("gpu-a10g") == (1, 3, 6)
    assert len(ready_gpu_nodes(world.cluster.list_nodes(), "gpu-a10g")) == 3
    assert world.state.get_sizes("gpu-a10g") is None
    assert scale_node_group_entries(world.state)[-2:] == [
        ("restore", "applied", "gpu-a10g"),
        ("restored", "applied", "gpu-a10g"),
    ]
    # Up and nothing saved: converged, no call.
    calls = len(world.aws.update_calls)
    assert world.run(MONDAY_MORNING + timedelta(minutes=10)).group("gpu-a10g").outcome == "up"
    assert len(world.aws.update_calls) == calls


def test_saved_sizes_come_from_the_asg_once_even_when_a_tick_is_interrupted() -> None:
    world = make_world()
    # The first node's drain is refused by the workflow (a bare pod the assessor did not see).
    first_node = world.nodes_of("gpu-a10g")[0]
    world.cluster.add_node(world.cluster.nodes[first_node], [pod("bare", first_node, owner=None)])
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert group.outcome == "failed" and report.failed
    assert group.reasons[-1] == f"drain_abandoned:{first_node}"
    assert world.aws.sizes("gpu-a10g") == (0, 3, 6)  # min already lowered
    # Next tick reads min 0 from the ASG, but the saved sizes keep the original minimum.
    world.run(SATURDAY_NOON + timedelta(minutes=5))
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)


# ------------------------------------------------------------------------------ skip and force


def busy(node: str) -> list[str]:
    return [f"activity_above_threshold:{node}:GPU-0:87.0"]


def test_a_group_with_busy_or_unknown_nodes_is_skipped_with_reasons_per_node() -> None:
    world = make_world()
    a, b, _c = world.nodes_of("gpu-a10g")
    world.assessor.reasons[a] = busy(a)
    world.assessor.reasons[b] = ["coverage_below_min:0.42"]
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert group.outcome == "skipped"
    assert group.node_reasons == {
        a: ["verdict:busy", f"activity_above_threshold:{a}:GPU-0:87.0"],
        b: ["verdict:unknown", "coverage_below_min:0.42"],
    }
    assert group.reasons == [f"nodes_not_drainable:{a},{b}"]
    # Skipped means untouched: nothing saved, no sizing call, every node still there.
    assert world.state.get_sizes("gpu-a10g") is None
    assert world.aws.update_calls == []
    assert len(world.nodes_of("gpu-a10g")) == 3
    assert not report.failed


def test_force_drains_a_busy_group() -> None:
    world = make_world()
    for node in world.nodes_of("gpu-a10g"):
        world.assessor.reasons[node] = busy(node)
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "skipped"
    report = world.run(SATURDAY_NOON + timedelta(minutes=1), force=True)
    group = report.group("gpu-a10g")
    assert report.force and group.outcome == "scaling_down", group
    # The drain workflow itself re-assessed each node through the forcing assessor and still succeeded.
    assert [d["status"] for d in group.drains] == ["succeeded"] * 3
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)


@pytest.mark.parametrize(
    ("reasons", "verdict"),
    [
        (["no_series:GPU-0"], "unknown"),
        (["node_too_young"], "unknown"),
        (["do_not_disrupt:node"], "protected"),
        (["activity_above_threshold:x:GPU-0:90.0", "pending_gpu_pods:1"], "busy"),
    ],
)
def test_force_never_overrides_unknown_or_protected(reasons: list[str], verdict: str) -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    world.assessor.reasons[node] = reasons
    group = world.run(SATURDAY_NOON, force=True).group("gpu-a10g")
    assert group.outcome == "skipped"
    assert group.node_reasons[node][0] == f"verdict:{verdict}"
    assert world.aws.update_calls == [] and len(world.nodes_of("gpu-a10g")) == 3


def test_force_report_lifts_only_busy_codes() -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    world.assessor.reasons[node] = ["fb_above_threshold:x", "power_above_idle:x", "do_not_disrupt:node"]
    forced = ForcedAssessor(world.assessor).assess_node(node, SATURDAY_NOON)
    assert forced is not None and forced.verdict == "protected" and forced.reasons == ["do_not_disrupt:node"]
    assert force_report(None) is None


def test_exempt_protections_do_not_skip_an_offhours_group() -> None:
    """cooldown, disruption windows, MinSize and our budget do not apply to off-hours (docs/architecture.md §4)."""
    world = make_world()
    for node in world.nodes_of("gpu-a10g"):
        world.assessor.reasons[node] = [
            "node_group_at_min_size:1",
            "cooldown:3m",
            "outside_disruption_window",
        ]
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "scaling_down"
    assert world.nodes_of("gpu-a10g") == []


# ------------------------------------------------------------------------------ one at a time


def test_a_group_with_a_drain_in_flight_waits_for_the_next_tick() -> None:
    world = make_world()
    node = world.nodes_of("gpu-a10g")[0]
    lease = world.state.acquire(node, "other-exec", SATURDAY_NOON, 900)
    assert lease is not None
    world.state.take_slot(
        "eks-gpu-a10g-asg", node, "other-exec", SATURDAY_NOON,
        max_per_run=1, max_per_group=1, desired=3, min_size=0,
    )  # fmt: skip
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and group.in_flight == [node]
    assert world.aws.update_calls == [] and len(world.nodes_of("gpu-a10g")) == 3


def test_an_asynchronous_starter_drains_one_node_per_tick() -> None:
    world = make_world()
    started: list[str] = []

    class Recorder:
        def start(self, request: Any) -> str:
            started.append(request.node)
            assert request.offhours and request.trigger == "offhours:gpu-a10g"
            return str(request.execution_id)

    world.deps.starter = Recorder()
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and started == [world.nodes_of("gpu-a10g")[0]]
    assert group.drains[0]["status"] == "started"


class LaggingNodeGroups(FakeNodeGroups):
    """EKS accepted the new sizes; the Auto Scaling group has not been updated yet."""

    def update_sizes(self, cluster: str, nodegroup: str, sizes: GroupSizes) -> NodeGroupUpdate:
        self.update_calls.append((nodegroup, sizes.min, sizes.desired, sizes.max))
        return NodeGroupUpdate(cluster, nodegroup, sizes, sizes, "update-1", False, 1)


def test_min_size_not_yet_on_the_asg_waits_instead_of_draining() -> None:
    world = make_world(sizes=(1, 1, 6), aws_class=LaggingNodeGroups)
    group = world.run(SATURDAY_NOON).group("gpu-a10g")
    assert group.outcome == "waiting" and "waiting_for_min_size:1" in group.reasons
    assert group.drains == [] and world.aws.update_calls == [("gpu-a10g", 0, 1, 6)]
    assert len(world.nodes_of("gpu-a10g")) == 1


# ------------------------------------------------------------------------------ restore (BUG-27)


def ice(asg: str, at: datetime) -> ScalingFailure:
    return ScalingFailure(
        activity_id="a-1",
        started_at=at,
        status="Failed",
        code="InsufficientInstanceCapacity",
        message="Could not launch On-Demand Instances. InsufficientInstanceCapacity - capacity not "
        "available for g5.12xlarge in us-east-1a. Launching EC2 instance failed.",
    )


def test_a_failed_restore_is_retried_every_tick_and_alarms_after_the_deadline() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    world.aws.capacity["gpu-a10g"] = 1  # AWS has one g5.12xlarge left
    world.aws.launch_ready = False  # and its node is not Ready yet
    world.aws.failures["eks-gpu-a10g-asg"] = [ice("eks-gpu-a10g-asg", MONDAY_MORNING + timedelta(seconds=7))]

    first = world.run(MONDAY_MORNING)
    group = first.group("gpu-a10g")
    assert group.outcome == "restoring" and not group.restore_overdue
    assert group.failed_activities[0]["code"] == "InsufficientInstanceCapacity"
    assert "scaling_failed:InsufficientInstanceCapacity" in group.reasons
    assert world.aws.sizes("gpu-a10g") == (1, 3, 6)  # desired 3 even though one instance launched
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.restore_started_at == MONDAY_MORNING
    assert first.metrics == [] and not first.failed

    asks = world.aws.update_asks
    later = world.run(MONDAY_MORNING + timedelta(minutes=10)).group("gpu-a10g")
    assert later.outcome == "restoring" and "ready:0/3" in later.reasons
    assert world.aws.update_asks == asks + 1  # re-applied (a no-op while the sizes still match)

    overdue = world.run(MONDAY_MORNING + timedelta(minutes=30))
    group = overdue.group("gpu-a10g")
    assert group.restore_overdue and overdue.failed and overdue.alarms == ["gpu-a10g"]
    assert overdue.metrics == [
        {
            "name": METRIC_RESTORE_OVERDUE,
            "value": 1,
            "unit": "Count",
            "dimensions": {"cluster": CLUSTER, "node_group": "gpu-a10g"},
        }
    ]
    assert ("restore", "failed", "gpu-a10g") in scale_node_group_entries(world.state)
    assert world.state.get_sizes("gpu-a10g") is not None  # the restore stays resumable

    # Capacity comes back: the group launches the rest, the nodes turn Ready, the restore completes.
    world.aws.capacity.clear()
    world.aws.launch_ready = True
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.set_ready(name, True)
    group_obj = world.aws.groups["gpu-a10g"]
    while len(group_obj.instances) < group_obj.desired:
        world.aws._launch(group_obj, ready=True)
    done = world.run(MONDAY_MORNING + timedelta(minutes=35))
    assert done.group("gpu-a10g").outcome == "restored" and not done.failed
    assert world.state.get_sizes("gpu-a10g") is None


def test_nodes_ready_without_allocatable_gpus_do_not_count() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.run(MONDAY_MORNING)
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.nodes[name]["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # BUG-20
    group = world.run(MONDAY_MORNING + timedelta(minutes=5)).group("gpu-a10g")
    assert group.outcome == "restoring" and group.ready_nodes == 0


def test_restore_never_lowers_a_desired_size_an_autoscaler_raised() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.run(MONDAY_MORNING)
    group = world.aws.groups["gpu-a10g"]
    group.desired = 5
    while len(group.instances) < 5:
        world.aws._launch(group, ready=False)
    before = len(world.aws.update_calls)
    report = world.run(MONDAY_MORNING + timedelta(minutes=5)).group("gpu-a10g")
    assert report.outcome == "restored"  # 3 Ready with GPUs are enough
    assert world.aws.sizes("gpu-a10g") == (1, 5, 6)
    assert len(world.aws.update_calls) == before


def test_a_new_off_period_during_an_unfinished_restore_keeps_the_original_sizes() -> None:
    world = make_world(groups=[("gpu-a10g", "nightly")])
    night = berlin("2024-05-14T23:00:00+02:00")
    world.run(night)
    world.aws.launch_ready = False
    world.run(berlin("2024-05-15T07:00:00+02:00"))  # restore starts, nodes never get Ready
    world.assessor.reasons.clear()
    for name in world.nodes_of("gpu-a10g"):
        world.cluster.set_ready(name, True)
    next_night = berlin("2024-05-15T23:00:00+02:00")
    report = world.run(next_night).group("gpu-a10g")
    assert "restore_interrupted" in report.reasons
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.sizes == GroupSizes(1, 3, 6)
    assert saved.restore_started_at is None and saved.saved_at == next_night


# ------------------------------------------------------------------------------ dry run


@pytest.mark.parametrize("switch", ["deps", "policy"])
def test_dry_run_reports_and_changes_nothing(switch: str) -> None:
    world = (
        make_world(dry_run=True)
        if switch == "deps"
        else make_world(policy=Policy(dry_run=True), dry_run=False)
    )
    report = world.run(SATURDAY_NOON)
    group = report.group("gpu-a10g")
    assert report.dry_run and group.outcome == "scaling_down"
    nodes = world.nodes_of("gpu-a10g")
    assert group.actions == [
        "would save sizes: min 1, desired 3, max 6",
        "would set min 0: min 0, desired 3, max 6",
        f"would drain and remove, one at a time: {', '.join(nodes)}",
        "would set desired 0: min 0, desired 0, max 6",
    ]
    assert world.state.get_sizes("gpu-a10g") is None
    assert world.state.entries() == [] and world.aws.update_calls == []
    assert len(nodes) == 3 and world.state.slots() == []


def test_dry_run_up_with_saved_sizes_only_says_so() -> None:
    world = make_world()
    world.run(SATURDAY_NOON)
    world.deps.dry_run = True
    group = world.run(MONDAY_MORNING).group("gpu-a10g")
    assert group.outcome == "restoring"
    assert group.actions == ["would restore saved sizes: min 1, desired 3, max 6"]
    saved = world.state.get_sizes("gpu-a10g")
    assert saved is not None and saved.restore_started_at is None
    assert world.aws.sizes("gpu-a10g") == (0, 0, 6)


# ------------------------------------------------------------------------------ selection


def test_unknown_schedule_is_reported_and_the_group_skipped() -> None:
    world = make_world(groups=[("gpu-a10g", "weekend"), ("gpu-l4", "weekned")])
    report = world.run(SATURDAY_NOON)
    typo = report.group("gpu-l4")
    assert typo.outcome == "skipped" and typo.reasons == ["unknown_schedule:weekned"]
    assert typo.error is not None and "weekned" in typo.error
    assert report.group("gpu-a10g").outcome == "scaling_down"
    assert len(world.nodes_of("gpu-l4")) == 3
    assert report.failed  # a person has to fix the config


def test_tag_selected_group_follows_its_schedule_and_config_wins_over_a_tag() -> None:
    world = make_world(
        groups=[("gpu-a10g", "weekend")],
        tagged={"gpu-l4": ("nightly", (0, 1, 2)), "gpu-h100": ("weekend", (0, 1, 1))},
    )
    world.aws.groups["gpu-a10g"].tags[TAG_OFFHOURS] = "nightly"  # the config says weekend
    report = world.run(SATURDAY_NOON)
    assert [(g.node_group, g.source, g.schedule) for g in report.groups] == [
        ("gpu-a10g", "config", "weekend"),
        ("gpu-h100", "tag", "weekend"),
        ("gpu-l4", "tag", "nightly"),
    ]
    assert report.group("gpu-a10g").reasons[0] == "config_overrides_tag:nightly"
    assert report.group("gpu-h100").outcome == "scaling_down"
    assert world.nodes_of("gpu-h100") == []
    assert report.group("gpu-l4").state == "up" and report.group("gpu-l4").outcome == "up"


def test_a_configured_group_that_does_not_exist_fails_alone() -> None:
    world = make_world(groups=[("gpu-a10g", "weekend"), ("gpu-gone", "weekend")], untracked=["gpu-gone"])
    report = world.run(SATURDAY_NOON)
    assert report.group("gpu-gone").outcome == "failed"
    assert report.group("gpu-gone").error == "node_group_not_found"
    assert report.group("gpu-a10g").outcome == "scaling_down"


def test_only_acts_in_the_requested_direction() -> None:
    world = make_world()
    group = world.run(SATURDAY_NOON, only="up").group("gpu-a10g")
    assert group.outcome == "skipped" and group.reasons == ["schedule_says_down"]
    assert world.aws.update_calls == []


def test_status_shows_state_transition_sizes_and_in_flight_and_changes_nothing() -> None:
    world = make_world(groups=[("gpu-a10g", "nightly")])
    noon = berlin("2024-05-14T12:00:00+02:00")
    report = offhours_status(world.deps, noon)
    group = report.group("gpu-a10g")
    assert group.outcome == "status" and group.state == "up"
    assert group.next_transition == berlin("2024-05-14T22:30:00+02:00")
    assert group.current == GroupSizes(1, 3, 6) and group.saved is None and group.in_flight == []
    assert group.ready_nodes == 3
    assert world.assessor.calls == 0 and world.aws.update_asks == 0
    doc = report.to_json_dict()
    assert doc["groups"][0]["next_transition"] == "2024-05-14T20:30:00Z"
    assert doc["groups"][0]["current"] == {"min": 1, "desired": 3, "max": 6}
    json.dumps(doc)


def test_naive_now_is_refused() -> None:
    world = make_world()
    with pytest.raises(ValueError, match="timezone-aware"):
        run_offhours(world.deps, datetime(2024, 5, 18, 13, 0))  # noqa: DTZ001


# ------------------------------------------------------------------------------ schedules at instants


@pytest.mark.parametrize(
    ("schedule", "instant", "expected"),
    [
        # BUG-28: weekday and time both from the Auckland local time.
        ("auckland", utc("2024-03-03T19:30:00Z"), "up"),  # Monday 08:30 NZDT (Sunday in UTC)
        ("auckland", utc("2024-03-08T06:30:00Z"), "down"),  # Friday 19:30 NZDT
        ("auckland", utc("2024-03-08T19:30:00Z"), "down"),  # Saturday 08:30 NZDT (Friday in UTC)
        # BUG-29: across midnight and the weekend.
        ("nightly", berlin("2024-05-14T23:15:00+02:00"), "down"),
        ("nightly", berlin("2024-05-14T02:00:00+02:00"), "down"),
        ("nightly", berlin("2024-05-14T06:00:00+02:00"), "up"),
        ("nightly", berlin("2024-05-14T12:00:00+02:00"), "up"),
        ("weekend", berlin("2024-05-18T13:00:00+02:00"), "down"),
        ("weekend", berlin("2024-05-20T06:59:00+02:00"), "down"),
        ("weekend", berlin("2024-05-17T19:59:00+02:00"), "up"),
        ("evening", berlin("2024-05-17T23:59:30+02:00"), "down"),
        ("evening", berlin("2024-05-18T00:00:30+02:00"), "up"),
        # The week boundary itself: Sunday 23:59:59 and Monday 00:00 are in, Monday 07:00 is out.
        ("weekend", berlin("2024-05-19T23:59:59+02:00"), "down"),
        ("weekend", berlin("2024-05-20T00:00:00+02:00"), "down"),
        ("weekend", berlin("2024-05-20T07:00:00+02:00"), "up"),
        # DST, Europe/Berlin: 06:00 local is 04:00 UTC after spring-forward, 05:00 UTC after fall-back.
        ("nightly", utc("2024-03-31T03:59:59Z"), "down"),
        ("nightly", utc("2024-03-31T04:00:00Z"), "up"),
        ("nightly", utc("2024-10-27T04:59:59Z"), "down"),
        ("nightly", utc("2024-10-27T05:00:00Z"), "up"),
        # A start inside the spring-forward gap (02:30) takes effect when the clock jumps to 03:00.
        ("gap", utc("2024-03-31T00:59:59Z"), "up"),
        ("gap", utc("2024-03-31T01:00:00Z"), "down"),
        # The repeated fall-back hour 02:00-03:00 is wholly in: both occurrences.
        ("fallback", utc("2024-10-26T23:59:59Z"), "up"),
        ("fallback", utc("2024-10-27T00:00:00Z"), "down"),
        ("fallback", utc("2024-10-27T01:30:00Z"), "down"),
        ("fallback", utc("2024-10-27T02:00:00Z"), "up"),
    ],
)
def test_the_schedule_drives_the_direction_at_exact_instants(
    schedule: str, instant: datetime, expected: str
) -> None:
    world = make_world(groups=[("gpu-a10g", schedule)])
    report = world.run(instant)
    group = report.group("gpu-a10g")
    assert group.state == expected
    if expected == "down":
        assert group.outcome == "scaling_down" and world.nodes_of("gpu-a10g") == []
        assert world.aws.sizes("gpu-a10g") == (0, 0, 6)
    else:
        assert group.outcome == "up" and world.aws.update_calls == []
        assert len(world.nodes_of("gpu-a10g")) == 3


@pytest.mark.parametrize("schedule", ["late_end", "late_start"])
def test_a_boundary_in_the_repeated_hour_scales_down_once_and_restores_once(schedule: str) -> None:
    """Issue 12: a tick every 5 minutes through the fall-back night; the wall clock passes 02:30 twice,
    the schedule acts once: one scale-down, one restore, never a restore undone and redone."""
    world = make_world(groups=[("gpu-a10g", schedule)])
    tick = utc("2024-10-26T19:00:00Z")  # Saturday 21:00 CEST
    outcomes = []
    while tick <= utc("2024-10-27T06:00:00Z"):  # Sunday 07:00 CET
        outcomes.append(world.run(tick).group("gpu-a10g").state)
        tick += timedelta(minutes=5)
    flips = [(a, b) for a, b in itertools.pairwise(outcomes) if a != b]
    assert flips == [("up", "down"), ("down", "up")]
    downs = [c for c in world.aws.update_calls if c[1] == 0]
    restores = [c for c in world.aws.update_calls if c[1] != 0]
    assert len(downs) == 1 and len(restores) == 1, world.aws.update_calls


def test_bug28_auckland_evaluations_give_up_down_down() -> None:
    world = make_world(groups=[("gpu-a10g", "auckland")])
    instants = [utc("2024-03-03T19:30:00Z"), utc("2024-03-08T06:30:00Z"), utc("2024-03-08T19:30:00Z")]
    states = [offhours_status(world.deps, at).group("gpu-a10g").state for at in instants]
    assert [s.upper() if s else s for s in states] == ["UP", "DOWN", "DOWN"]


def test_a_missed_tick_still_converges() -> None:
    """Level-triggered: no tick at 20:00 Friday; the next one, Saturday noon, still brings the group down."""
    world = make_world()
    assert world.run(berlin("2024-05-17T19:55:00+02:00")).group("gpu-a10g").outcome == "up"
    assert world.run(SATURDAY_NOON).group("gpu-a10g").outcome == "scaling_down"


# ------------------------------------------------------------------------------ CLI


def write_config(tmp_path: Any) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(
        "cluster: {name: prod-eks}\n"
        "aws: {table: rightsizer}\n"
        "policy: {dry_run: false}\n"
        "offhours:\n"
        "  schedules:\n"
        "    weekend:\n"
        "      - {days: [Sat, Sun], start: '00:00', end: '00:00', timezone: Europe/Berlin}\n"
        "  node_groups: [{name: gpu-a10g, schedule: weekend}]\n",
        encoding="utf-8",
    )
    return str(path)


def cli_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["offhours", *argv])


def test_cli_offhours_dry_run_by_default_and_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    world = make_world()
    seen: list[bool] = []

    def build(config: Config, *, dry_run: bool) -> OffhoursDeps:
        seen.append(dry_run)
        assert config.offhours.node_groups[0].name == "gpu-a10g"
        world.deps.dry_run = dry_run
        return world.deps

    path = write_config(tmp_path)
    args = cli_args("down", "--config", path, "--json", "--at", "2024-05-18T13:00:00+02:00")
    assert cli.cmd_offhours(args, build=build) == cli.EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert seen == [True] and doc["dry_run"] is True
    assert doc["groups"][0]["outcome"] == "scaling_down" and doc["groups"][0]["state"] == "down"
    assert world.state.get_sizes("gpu-a10g") is None

    assert cli.cmd_offhours(cli_args("status", "--config", path), build=build) == cli.EXIT_OK
    assert "gpu-a10g [config: weekend]" in capsys.readouterr().out


def test_cli_offhours_exit_codes(tmp_path: Any) -> None:
    world = make_world(groups=[("gpu-a10g", "nope")])
    path = write_config(tmp_path)

    def build(config: Config, *, dry_run: bool) -> OffhoursDeps:
        return world.deps

    assert cli.cmd_offhours(cli_args("status", "--config", path), build=build) == cli.EXIT_FAILED
    with pytest.raises(ConfigError, match="--at"):
        cli.cmd_offhours(cli_args("down", "--config", path, "--execute", "--at", "2024-05-18T13:00:00Z"))


# ------------------------------------------------------------------------------ adapter helper


@pytest.mark.parametrize(
    ("texts", "code"),
    [
        (
            (
                "Could not launch On-Demand Instances. InsufficientInstanceCapacity - capacity not "
                "available for g5.12xlarge in us-east-1a. Launching EC2 instance failed.",
            ),
            "InsufficientInstanceCapacity",
        ),
        (
            (
                "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you "
                "requested (us-east-1c).",
            ),
            "InsufficientInstanceCapacity",
        ),
        (
            (
                "You have requested more vCPU capacity than your current vCPU limit allows.",
                "VcpuLimitExceeded - x",
            ),
            "VcpuLimitExceeded",
        ),
        (
            ("Launching a new EC2 instance: i-0abc. Status Reason: SomethingNewHappened - details",),
            "SomethingNewHappened",
        ),
        (("Launching a new EC2 instance failed.", ""), None),
    ],
)
def test_error_code_of_scaling_activity_messages(texts: tuple[str, ...], code: str | None) -> None:
    assert error_code_of(*texts) == code
