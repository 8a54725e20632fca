"""Managed node group replacement (issue 17) end to end: EKS, Auto Scaling and EC2 on a moto server, the
Kubernetes double over HTTP through the real adapter, and kubelets that register the new group's Nodes.

GIVEN managed node group ``gpu-a10g`` (g5.12xlarge, min 1 / desired 2 / max 3, from a launch template that
pins its instance type, labels and a GPU taint), opted in (tag ``rightsizer.io/enabled=true`` and
``allow_replace_node_group``), whose two nodes each keep one of four A10Gs busy — the plan proposes
``replace_node_group`` → g5.xlarge —
WHEN the replacement runs (in-process runner, fake clock for the workflow's deadlines; moto, the double and
the kubelets on real threads)
THEN a new group ``gpu-a10g-g5-xlarge`` is created from a new launch template version with the same labels,
taints, subnets, node role, capacity type, AMI type and sizes; once its Nodes are Ready with their GPU
allocatable the old nodes are drained one budget at a time, the old group goes to 0 (kept), the savings are
booked; no capacity or Nodes that never get ready roll back (new group deleted, old sizes and Nodes
untouched, nothing cordoned); a concurrent scale-in of the old group gets no budget slot while a node of
it is being drained.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.autoscaling import AutoScalingGroups
from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.eks_nodegroups import EksNodeGroups
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.launch_templates import LaunchTemplates
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.model import ANN_CORDONED_BY, TAG_ENABLED
from rightsizer.domain.policy import Policy
from rightsizer.handler_io import use_drain_workflow
from rightsizer.services.drain import DrainDeps, DrainRequest, StepResult
from rightsizer.services.realized import realized_savings
from rightsizer.services.replace import ReplaceRequest, ReplaceWorkflow, lease_key
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeClock
from rightsizer.testing.k8s.double import KubernetesDouble
from rightsizer.testing.moto_eks import NodeGroupReconciler, NodeGroupSpec, build_cluster
from tests.builders import AT, gpu_node, pod
from tests.integration.test_statemachine import AslInterpreter, LambdaContext, drain_handler, load_asl
from tests.support.replace_world import GroupKubelet, Observed, drive

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTER = "prod-eks"
OLD, NEW = "gpu-a10g", "gpu-a10g-g5-xlarge"
EXECUTION = "nodegroup-gpu-a10g-0011223344556677"
CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)
LABELS = {"workload": "gpu", "nvidia.com/gpu.present": "true"}
TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}


@dataclass
class World:
    clients: AwsClients
    double: KubernetesDouble
    observed: Observed
    reconciler: NodeGroupReconciler
    kubelet: GroupKubelet
    clock: FakeClock
    state: MemoryState
    old_nodes: list[str]
    old_asg: str

    def workflow(self, **policy: Any) -> ReplaceWorkflow:
        settings = {"dry_run": False, "allow_replace_node_group": True, "replace_ready_timeout": 120,
                    "max_nodes_per_node_group": 1, "cooldown": 0, **policy}  # fmt: skip
        self.observed.policy = Policy.model_validate(settings)
        cluster = KubernetesCluster.for_eks(
            self.double.base_url, EksTokenSource(CLUSTER, "us-east-1", lambda: CREDS)
        )
        deps = DrainDeps(
            cluster, AutoScalingGroups(self.clients.autoscaling), self.observed, self.state, self.observed.policy,
            dry_run=False, clock=self.clock.now,
        )  # fmt: skip
        replacer = EksNodeGroups(self.clients.eks, max_attempts=2, delay_s=0.05)
        return ReplaceWorkflow(deps, None, replacer, LaunchTemplates(self.clients.ec2), self.observed.plan)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        time.sleep(0.03)  # the reconciler and the kubelets run on real threads

    def run(self, **policy: Any) -> StepResult:
        runner = InProcessRunner(self.workflow(**policy), sleep=self.advance)
        runner.start(self.request())
        return runner.results[EXECUTION]

    def request(self) -> ReplaceRequest:
        (action,) = [a for a in self.observed.plan().actions if a.kind == "replace_node_group"]
        assert (action.node_group, action.from_, action.to) == (OLD, "g5.12xlarge", "g5.xlarge")
        return ReplaceRequest(
            lease_key(OLD),
            EXECUTION,
            "schedule",
            action.hourly_savings_usd,
            nodegroup=OLD,
            target_type="g5.xlarge",
        )

    def nodegroup(self, name: str) -> dict[str, Any] | None:
        if name not in self.clients.eks.list_nodegroups(clusterName=CLUSTER)["nodegroups"]:
            return None
        return dict(self.clients.eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"])

    def old_sizes(self) -> tuple[int, int, int]:
        config = (self.nodegroup(OLD) or {})["scalingConfig"]
        return config["minSize"], config["desiredSize"], config["maxSize"]

    def new_asg(self) -> str | None:
        """The Auto Scaling group of the new node group, once EKS (the reconciler) made it."""
        group = self.nodegroup(NEW)
        found = ((group or {}).get("resources") or {}).get("autoScalingGroups") or []
        return str(found[0]["name"]) if found else None

    def nodes_of(self, nodegroup: str) -> list[str]:
        return sorted(
            n["metadata"]["name"]
            for n in self.double.list_nodes()
            if n["metadata"]["labels"].get("eks.amazonaws.com/nodegroup") == nodegroup
        )

    def cordoned(self) -> list[str]:
        return sorted(
            n["metadata"]["name"]
            for n in self.double.list_nodes()
            if n["spec"].get("unschedulable") or ANN_CORDONED_BY in (n["metadata"].get("annotations") or {})
        )


def make_world(clients: AwsClients, *, no_capacity: frozenset[str] = frozenset(),
               never_ready: frozenset[str] = frozenset(), desired: int = 2) -> Iterator[World]:  # fmt: skip
    spec = NodeGroupSpec(OLD, "g5.12xlarge", min_size=1, desired=desired, max_size=3, labels=LABELS,
                         pinned_template=True, taints=(TAINT,))  # fmt: skip
    built = build_cluster(clients, cluster=CLUSTER, nodegroups=[spec]).nodegroups[OLD]
    with KubernetesDouble(seed=5, resource_api_versions=None) as double:
        names = []
        for i, instance_id in enumerate(built.instance_ids):
            name = f"ip-10-0-1-{10 + i}.ec2.internal"
            names.append(name)
            double.add_node(gpu_node(name, instance_type="g5.12xlarge", gpus=4, instance_id=instance_id,
                                     nodegroup=OLD, labels=LABELS))  # fmt: skip
            double.add_pod(pod(f"infer-{i}", name, namespace="ml", gpus=1, grace=0, cpu="2", memory="8Gi",
                               labels={"app": "infer"}))  # fmt: skip
        observed = Observed(clients, double, {built.asg_name: OLD}, Policy(), busy=set(names))
        reconciler = NodeGroupReconciler(clients, CLUSTER, no_capacity=no_capacity)
        # New Nodes are "created" a day before the series' instant AT, so the plans made at AT judge them.
        kubelet = GroupKubelet(
            clients, double, CLUSTER, never_ready=never_ready, created=AT - timedelta(days=1)
        )
        reconciler.start(0.03)
        kubelet.start(0.03)
        world = World(clients, double, observed, reconciler, kubelet, FakeClock(AT), MemoryState(CLUSTER),
                      names, built.asg_name)  # fmt: skip
        try:
            yield world
        finally:
            kubelet.stop()
            reconciler.stop()
        assert reconciler.errors == [] and kubelet.errors == []


@pytest.fixture
def world(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients)


def test_the_replacement_moves_the_group_to_the_recommended_type(world: World) -> None:
    old = world.nodegroup(OLD)
    assert old is not None
    result = world.run()

    assert result.status == "succeeded", result.message
    new = world.nodegroup(NEW)
    assert new is not None and new["status"] == "ACTIVE"
    # a copy of the old group but for the instance type: a new version of the launch template that pinned it
    assert (
        new["launchTemplate"]["id"] == old["launchTemplate"]["id"] and new["launchTemplate"]["version"] == "2"
    )
    version = world.clients.ec2.describe_launch_template_versions(
        LaunchTemplateId=new["launchTemplate"]["id"], Versions=["2"]
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert version["InstanceType"] == "g5.xlarge"
    for key in ("labels", "taints", "subnets", "nodeRole", "capacityType", "amiType", "scalingConfig"):
        assert new[key] == old[key], key
    assert new["tags"][TAG_ENABLED] == "true" and new["tags"]["rightsizer.io/replaces"] == OLD
    # the new nodes serve; the old group is at 0 and kept; nothing of ours is left cordoned
    assert sorted(world.kubelet.registered) == [(NEW, "g5.xlarge")] * 2
    assert world.old_sizes() == (0, 0, 3)
    world.kubelet.sync()  # the old instances are gone: so are their Nodes, with our cordons
    assert {n["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] for n in world.double.list_nodes()} == {
        NEW
    }
    assert world.cordoned() == []
    assert world.state.get(lease_key(OLD)) is None and world.state.slots() == []
    # the old pods were evicted through the Eviction API, one node (the budget) at a time
    for name in world.old_nodes:
        reasons = [e["reason"] for e in world.double.events(involved_name=name)]
        assert reasons[:2] == ["CordonedIdle", "Drained"], reasons
    # savings booked once the old instances left: (g5.12xlarge − g5.xlarge) × 2 nodes
    catalog = load_catalog()
    per_node = (catalog.get("g5.12xlarge").hourly_usd or 0) - (catalog.get("g5.xlarge").hourly_usd or 0)  # type: ignore[union-attr]
    booked = [e for e in world.state.entries(execution_id=EXECUTION) if e.hourly_savings_usd is not None]
    assert [(e.step, e.result, e.instances) for e in booked] == [("ng_gone", "applied", 2)]
    assert booked[0].hourly_savings_usd == pytest.approx(per_node * 2)
    # AND `rightsizer savings` books it: 2 h after the old instances left, 2 × 2 old-type instance-hours
    # not run, at the price difference (5.672 − 1.006 USD/h per node)
    rows = realized_savings(world.state.entries(), booked[0].at + timedelta(hours=2))
    assert [(r.kind, r.node_group, r.instance_hours, r.removals) for r in rows] == [
        ("replace_node_group", OLD, pytest.approx(4.0), 1)
    ]
    assert rows[0].usd == pytest.approx(2 * 2 * (5.672 - 1.006))


def test_the_old_group_is_deleted_after_the_grace_period_when_asked(world: World) -> None:
    result = world.run(replace_delete_old_after=600)
    assert result.status == "succeeded", result.message
    assert world.nodegroup(OLD) is None and world.nodegroup(NEW) is not None


@pytest.fixture
def no_capacity(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients, no_capacity=frozenset({"g5.xlarge"}))


def test_no_capacity_for_the_new_type_rolls_back(no_capacity: World) -> None:
    result = no_capacity.run()
    assert result.status == "rolled_back", result.message
    assert "no_capacity" in result.message and "AsgInstanceLaunchFailures" in result.message, result.message
    assert no_capacity.nodegroup(NEW) is None  # deleted
    assert no_capacity.old_sizes() == (1, 2, 3)
    assert sorted(n["metadata"]["name"] for n in no_capacity.double.list_nodes()) == no_capacity.old_nodes
    assert no_capacity.cordoned() == [] and no_capacity.double.list_pods(no_capacity.old_nodes[0])
    assert no_capacity.state.get(lease_key(OLD)) is None
    # the launch template version made for the new group went with it; the old group's own stays
    template = (no_capacity.nodegroup(OLD) or {})["launchTemplate"]
    assert "launch template" in result.message and "v2 deleted" in result.message, result.message
    left = no_capacity.clients.ec2.describe_launch_template_versions(LaunchTemplateId=template["id"])
    assert [v["VersionNumber"] for v in left["LaunchTemplateVersions"]] == [1]


def test_a_dry_run_creates_nothing_not_even_a_launch_template_version(world: World) -> None:
    workflow = world.workflow()
    workflow.deps.dry_run = True
    runner = InProcessRunner(workflow, sleep=world.advance)
    runner.start(world.request())
    result = runner.results[EXECUTION]

    assert result.status == "dry_run", result.message
    assert "would create node group gpu-a10g-g5-xlarge" in result.message, result.message
    assert "a new version of launch template" in result.message, result.message
    template = (world.nodegroup(OLD) or {})["launchTemplate"]
    left = world.clients.ec2.describe_launch_template_versions(LaunchTemplateId=template["id"])
    assert [v["VersionNumber"] for v in left["LaunchTemplateVersions"]] == [1]
    assert world.nodegroup(NEW) is None and world.state.get(lease_key(OLD)) is None


@pytest.fixture
def never_ready(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients, never_ready=frozenset({"g5.xlarge"}))


def test_nodes_that_never_get_ready_roll_back_at_the_deadline(never_ready: World) -> None:
    result = never_ready.run()
    assert result.status == "rolled_back", result.message
    assert "deadline: 0/2 node(s) of gpu-a10g-g5-xlarge Ready" in result.message, result.message
    assert never_ready.nodegroup(NEW) is None
    assert never_ready.old_sizes() == (1, 2, 3)
    assert never_ready.cordoned() == []
    # the deleted group's instances and Nodes go away; the old ones were never touched
    assert never_ready.observed.asg_names and never_ready.double.list_pods(never_ready.old_nodes[1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(never_ready.double.list_nodes()) != 2:
        time.sleep(0.05)
    assert sorted(n["metadata"]["name"] for n in never_ready.double.list_nodes()) == never_ready.old_nodes


@pytest.fixture
def three_nodes(aws_clients: AwsClients) -> Iterator[World]:
    yield from make_world(aws_clients, desired=3)


def test_a_concurrent_scale_in_of_the_old_group_respects_the_budget(three_nodes: World) -> None:
    w = three_nodes
    workflow = w.workflow()
    workflow.start(w.request())
    slots_seen: list[int] = []
    concurrent: StepResult | None = None
    for _result in drive(lambda: workflow.step(EXECUTION), w.advance):
        slots_seen.append(len([s for s in w.state.slots() if s.group == w.old_asg]))
        record = w.state.load(EXECUTION)
        assert record is not None
        if concurrent is None and record.details.get("children"):
            # A node of the old group is being drained (its slot held). The third node's work ends and the
            # scheduled assessment asks to scale it in: no slot for it while the budget (1 per group) is spent.
            (draining,) = record.details["children"]
            idle = next(
                n for n in w.old_nodes if n != draining and n not in record.details.get("drained", {})
            )
            for done in w.double.list_pods(idle):
                done["status"]["phase"] = "Succeeded"
                done["metadata"].pop("resourceVersion", None)
                w.double.add_pod(done)
            w.observed.busy.discard(idle)
            w.observed.idle.add(idle)
            runner = InProcessRunner(workflow, sleep=w.advance)
            runner.start(DrainRequest(idle, "scale-in-1"))
            concurrent = runner.results["scale-in-1"]
            w.observed.idle.discard(idle)
            w.observed.busy.add(idle)
        assert len(w.cordoned()) <= 1 + len(record.details.get("drained") or {})

    assert concurrent is not None
    assert (concurrent.status, concurrent.message) == ("abandoned", "disruption_budget_exhausted")
    assert max(slots_seen) == 1
    record = w.state.load(EXECUTION)
    assert record is not None and record.status == "succeeded", record.details
    assert len(record.details["drained"]) == 3 and w.old_sizes() == (0, 0, 3)
    w.kubelet.sync()  # the old instances are gone: so are their Nodes, with our cordons
    assert w.cordoned() == []


def test_the_plan_knows_the_replacement_while_it_runs_and_while_the_new_group_settles(world: World) -> None:
    # The plans the assessment would make every tick, with the replacement's leases as the state holds them.
    world.observed.leases = world.state
    workflow = world.workflow(replace_settle=900)
    workflow.start(world.request())
    seen: set[str] = set()
    for result in drive(lambda: workflow.step(EXECUTION), world.advance):
        record = world.state.load(EXECUTION)
        assert record is not None
        if result.finished or record.step in ("ng_validate", "ng_create"):
            continue
        if record.step not in seen:
            seen.add(record.step)
            new_asg = world.new_asg()
            if new_asg is not None:  # its Nodes join the plan as they register, empty while the old drain
                world.observed.asg_names[new_asg] = NEW
                world.observed.idle |= {n for n in world.nodes_of(NEW) if n not in world.observed.busy}
            now = world.clock.now()
            tick = world.observed.plan(now)
            assert [a.kind for a in tick.actions if a.kind != "recommend"] == [], (record.step, tick.actions)
            for report in tick.nodes:
                assert f"replacement_in_progress:{EXECUTION}" in report.reasons, (record.step, report)
            if record.step == "ng_created":  # the old group untouched yet: validate's own fresh plan, which
                # does not count its own leases, still proposes the replacement
                mine = world.observed.plan(now, ignore=EXECUTION)
                assert [a.kind for a in mine.actions if a.kind != "recommend"] == ["replace_node_group"]
    assert result.status == "succeeded", result.message
    assert {"ng_created", "ng_ready", "ng_drain", "ng_gone"} <= seen, seen

    # the old nodes are gone; the new ones (empty in these series) settle for replace_settle, then count
    world.kubelet.sync()
    world.observed.busy.clear()
    world.observed.idle = set(world.nodes_of(NEW))
    ended = world.clock.now()
    settling = world.observed.plan(ended)
    assert [a.kind for a in settling.actions if a.kind != "recommend"] == []
    assert {r.verdict for r in settling.nodes} == {"protected"}, [(r.node, r.reasons) for r in settling.nodes]
    stamp = (ended + timedelta(seconds=900)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert all(f"replacement_settling:until:{stamp}" in r.reasons for r in settling.nodes)
    settled = world.observed.plan(ended + timedelta(seconds=900))
    assert [a.kind for a in settled.actions] == ["scale_in"]  # one per node group budget


class NudgingClock(FakeClock):
    """The state machine's fake clock; each Wait also yields real time to moto's and the kubelets' threads."""

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        time.sleep(0.03)


def test_the_replacement_through_the_state_machine(world: World) -> None:
    # The same workflow, one Lambda invocation per step through infra/statemachine/drain.asl.json.
    world.clock = NudgingClock(AT)
    workflow = world.workflow()
    handler, context = drain_handler(), LambdaContext()
    use_drain_workflow(workflow)
    try:
        interpreter = AslInterpreter(load_asl(), lambda _arn, payload: handler(payload, context), world.clock)
        run = interpreter.run(asdict(world.request()), EXECUTION)
    finally:
        use_drain_workflow(None)

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.output["drain"]["status"] == "succeeded"
    assert "Wait" in run.states  # EKS and the kubelets were waited for in the state machine, not in Lambda
    assert world.nodegroup(NEW) is not None and world.old_sizes() == (0, 0, 3)
    world.kubelet.sync()
    assert world.cordoned() == []
