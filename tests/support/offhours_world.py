"""An in-memory off-hours world: fake cluster, node groups and assessor around the real drain workflow.

Used by ``tests/unit/test_offhours*.py`` and the off-hours integration tests (moto, alarms). The cluster, the
node groups and the assessor are small fakes whose node lifecycle follows the Auto Scaling group (a
terminated instance's Node goes away, a launched one appears), so a whole night — down, down again, up —
runs without sockets. Schedules and instants are Europe/Berlin unless named otherwise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.config import OffhoursConfig, OffhoursGroup
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
    TAG_OFFHOURS,
    OffhoursDeps,
    OffhoursReport,
    in_process_starters,
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

    def list_pdbs(self, namespace: str | None = None) -> list[JSON]:
        return []

    def get_controller(self, namespace: str, group: str, kind: str, name: str) -> JSON | None:
        return {"metadata": {"name": name, "namespace": namespace}}  # every controller here is alive

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
