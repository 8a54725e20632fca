"""Records in flight survive the typed workflow details (issue 25, ``rightsizer.domain.workflow_details``).

GIVEN the details documents the release before (commit 36655c9, ``details: dict[str, Any]``) wrote for
every workflow kind — frozen below byte for byte, captured from its own test runs — WHEN a store holding
one is read by this release THEN the document loads as its kind's model, saves back byte-equal, and (on
the drain's, the resize's and the replacement's fakes) the workflow resumes from that record and ends as
it would have: succeeded, or rolled back with our cordon undone. Both stores: memory and DynamoDB on moto.
A key this release does not know is kept and never acted on: the workflow rolls back ``unknown_facts``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any

import boto3
import pytest

from rightsizer.adapters.dynamodb_state import DynamoDbState
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import (
    ConsolidateDetails,
    ReplaceDetails,
    ReplaceDrainDetails,
    ResizeDetails,
    ScaleInDetails,
    parse_details,
)
from rightsizer.services.assess import PlanningAssessor
from rightsizer.services.consolidate import ConsolidateRequest, ConsolidateWorkflow
from rightsizer.services.drain import DrainDeps, DrainRequest, DrainWorkflow
from rightsizer.services.replace import ReplaceDrainRequest, ReplaceWorkflow
from rightsizer.services.resize import ResizeRequest, ResizeWorkflow
from rightsizer.services.runner import InProcessRunner
from rightsizer.state import StateStore, WorkflowRecord
from rightsizer.testing.dynamodb_table import create_state_table
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter, FakeNodeScaler
from rightsizer.testing.moto_eks import MotoServer
from tests.builders import AT, gpu_node, pod
from tests.integration.test_replace_nodegroup_moto import EXECUTION
from tests.integration.test_replace_nodegroup_moto import make_world as replace_world
from tests.support.replace_world import drive
from tests.support.resize_world import FakeInstances, Kubelet
from tests.unit.test_drain import make_world

pytest_plugins = ["tests.support.moto_fixtures"]
pytestmark = [pytest.mark.integration]

CLUSTER = "prod-eks"

#: ``details`` as the release before wrote them (``json.dumps(details, sort_keys=True,
#: separators=(",", ":"))``, the DynamoDB item's ``details`` attribute), one per kind and shape.
FROZEN: dict[str, str] = {
    "scale_in_wait": (
        '{"asg":"eks-gpu-a10g-asg","attempts":{},"blocked":[],"desired_before":3,"dry_run":false,"hourly_'
        'savings_usd":1.006,"node_group":"gpu-a10g","offhours":false,"trigger":"schedule","validated_pods'
        '":["uid-default-web-1","uid-default-web-2"]}'
    ),
    "scale_in_approval": (
        '{"approval":{"expires_at":"2026-11-02T11:00:00.400000+00:00","instance_type":"g5.12xlarge","reas'
        'ons":["idle_window_clean"],"verdict":"idle"},"asg":"eks-gpu-a10g-5ac5e5d2","desired_before":3,"d'
        'ry_run":false,"hourly_savings_usd":5.672,"node_group":"gpu-a10g","offhours":false,"trigger":"sch'
        'edule","validated_pods":[]}'
    ),
    "scale_in_rollback": (
        '{"asg":"eks-gpu-a10g-asg","desired_before":3,"dry_run":false,"hourly_savings_usd":1.006,"node_gr'
        'oup":"gpu-a10g","offhours":false,"rollback":{"reason":"failed:eviction refused","status":"failed'
        '","step":"evict"},"trigger":"schedule","uncordon_attempts":1,"validated_pods":["uid-default-infe'
        'r-0"]}'
    ),
    "consolidate_evict": (
        '{"asg":"eks-gpu-a10g-asg","desired_before":3,"dry_run":false,"hourly_savings_usd":1.006,"kind":"'
        'consolidate","moves":[["default/holder","gpu-2"]],"node_group":"gpu-a10g","offhours":false,"trig'
        'ger":"schedule","validated_pods":["uid-default-holder"]}'
    ),
    "replace_drain_evict": (
        '{"asg":"eks-b77ee6c0-1349-4db1-8126-79f16cafc7ad","desired_before":2,"dry_run":false,"hourly_sav'
        'ings_usd":5.672,"kind":"replace_drain","node_group":"gpu-a10g","offhours":false,"parent":"nodegr'
        'oup-gpu-a10g-0011223344556677","trigger":"replace:nodegroup-gpu-a10g-0011223344556677","validate'
        'd_pods":["uid-ml-infer-0"]}'
    ),
    "resize_stopped": (
        '{"asg":null,"attempts":{},"blocked":[],"driver_check":"same_gpu_model: same GPU model (NVIDIA A1'
        '0G): its driver drives it now","dry_run":false,"hourly_savings_usd":0.6180000000000001,"kind":"r'
        'esize_instance","node_group":null,"offhours":false,"original_type":"g5.4xlarge","resize_deadline'
        '":"2026-12-07T07:01:20.223863+00:00","stopping":true,"target_type":"g5.xlarge","trigger":"schedu'
        'le","validated_pods":["uid-ml-api-0","uid-ml-api-1"],"want_type":"g5.xlarge"}'
    ),
    "resize_restoring": (
        '{"asg":null,"attempts":{},"blocked":[],"driver_check":"same_gpu_model: same GPU model (NVIDIA A1'
        '0G): its driver drives it now","dry_run":false,"hourly_savings_usd":0.6180000000000001,"kind":"r'
        'esize_instance","node_group":null,"offhours":false,"original_type":"g5.4xlarge","resize_deadline'
        '":"2026-12-07T07:01:23.944261+00:00","restoring":"start failed: StartInstances failed: Insuffici'
        'entInstanceCapacity: injected by test","stopping":true,"target_type":"g5.xlarge","trigger":"sche'
        'dule","validated_pods":["uid-ml-api-0","uid-ml-api-1"],"want_type":"g5.4xlarge"}'
    ),
    "replace_ng_drain": (
        '{"asg":"eks-b77ee6c0-1349-4db1-8126-79f16cafc7ad","children":{},"creating":true,"drain_deadline"'
        ':"2026-11-02T10:30:20+00:00","drained":{},"dry_run":false,"hourly_savings_usd":9.331999999999999'
        ',"kind":"replace_node_group","new_lease":"nodegroup:gpu-a10g-g5-xlarge","new_lease_epoch":1,"new'
        '_nodegroup":"gpu-a10g-g5-xlarge","new_spec":{"ami_type":"AL2_x86_64","asg_name":null,"capacity_t'
        'ype":"ON_DEMAND","disk_size":null,"health_issues":[],"instance_types":[],"labels":{"nvidia.com/g'
        'pu.present":"true","workload":"gpu"},"launch_template":{"id":"lt-e768041697d01c267","version":"2'
        '"},"name":"gpu-a10g-g5-xlarge","node_role":"arn:aws:iam::123456789012:role/eks-node","scaling":['
        '1,2,3],"status":"","subnets":["subnet-6a1e868561ee11d14","subnet-bd06fcfe9a797ef31"],"tags":{"ri'
        'ghtsizer.io/enabled":"true","rightsizer.io/execution":"nodegroup-gpu-a10g-0011223344556677","rig'
        'htsizer.io/replaces":"gpu-a10g"},"taints":[{"effect":"NO_SCHEDULE","key":"nvidia.com/gpu","value'
        '":"true"}]},"node_group":"gpu-a10g","nodegroup":"gpu-a10g","old_nodes":["ip-10-0-1-10.ec2.intern'
        'al","ip-10-0-1-11.ec2.internal"],"old_scaling":[1,2,3],"old_type":"g5.12xlarge","per_node_saving'
        's_usd":4.6659999999999995,"target_type":"g5.xlarge","template_version_created":{"id":"lt-e768041'
        '697d01c267","version":"2"},"trigger":"schedule"}'
    ),
}

KINDS = {
    "scale_in_wait": ScaleInDetails,
    "scale_in_approval": ScaleInDetails,
    "scale_in_rollback": ScaleInDetails,
    "consolidate_evict": ConsolidateDetails,
    "replace_drain_evict": ReplaceDrainDetails,
    "resize_stopped": ResizeDetails,
    "resize_restoring": ResizeDetails,
    "replace_ng_drain": ReplaceDetails,
}


@dataclass
class Store:
    """A store under test and how to put a details document into a saved record as a release wrote it."""

    state: StateStore
    plant: Callable[[str, str, str], None]  # (execution id, step, details JSON)
    raw_details: Callable[[str], str]


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        memory = MemoryState(CLUSTER)

        def plant_memory(execution_id: str, step: str, document: str) -> None:
            record = memory.load(execution_id)
            assert record is not None
            memory.save(
                replace(record, step=step, details=parse_details(json.loads(document))), record.version
            )

        def raw_memory(execution_id: str) -> str:
            record = memory.load(execution_id)
            assert record is not None
            return json.dumps(record.details.stored(), sort_keys=True, separators=(",", ":"))

        return Store(memory, plant_memory, raw_memory)
    server: MotoServer = request.getfixturevalue("moto_server")
    session: boto3.session.Session = request.getfixturevalue("boto_session")
    client = session.client("dynamodb", endpoint_url=server.endpoint_url)
    table = f"rightsizer-compat-{uuid.uuid4().hex[:12]}"
    create_state_table(client, table)
    key = lambda execution_id: {"pk": {"S": f"wf#{execution_id}"}, "sk": {"S": "wf"}}  # noqa: E731

    def plant_dynamodb(execution_id: str, step: str, document: str) -> None:
        # The item as the release before wrote it: only the details (and the step) differ from ours.
        item = client.get_item(TableName=table, Key=key(execution_id), ConsistentRead=True)["Item"]
        item["details"] = {"S": document}
        item["step"] = {"S": step}
        item["version"] = {"N": str(int(item["version"]["N"]) + 1)}
        client.put_item(TableName=table, Item=item)

    def raw_dynamodb(execution_id: str) -> str:
        item = client.get_item(TableName=table, Key=key(execution_id), ConsistentRead=True)["Item"]
        return str(item["details"]["S"])

    return Store(DynamoDbState(client, table, CLUSTER), plant_dynamodb, raw_dynamodb)


def _record(execution_id: str = "exec-1") -> WorkflowRecord:
    return WorkflowRecord(execution_id, "gpu-1", "i-1", "validate", "running", AT, AT + timedelta(minutes=30))


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_a_document_of_the_release_before_loads_as_its_kind_and_saves_byte_equal(
    store: Store, name: str
) -> None:
    store.state.save(_record(), expected_version=0)
    store.plant("exec-1", "evict", FROZEN[name])
    loaded = store.state.load("exec-1")
    assert loaded is not None and type(loaded.details) is KINDS[name] and loaded.details.unknown() == []
    store.state.save(loaded, expected_version=loaded.version)
    assert store.raw_details("exec-1") == FROZEN[name]


def test_an_unknown_key_is_kept_and_the_workflow_refuses_to_act_on_it(store: Store) -> None:
    world = make_world()
    workflow = DrainWorkflow(_deps(world, store.state))
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    _until(workflow, store.state, "exec-1", "evict", world.clock)
    newer = json.loads(FROZEN["scale_in_wait"]) | {"drain_via": "someday"}
    store.plant("exec-1", "evict", json.dumps(newer, sort_keys=True, separators=(",", ":")))
    record = store.state.load("exec-1")
    assert record is not None and record.details.unknown() == ["drain_via"]
    result = workflow.step("exec-1")
    assert (result.status, result.message) == ("failed", "failed:unknown_facts:drain_via")
    assert json.loads(store.raw_details("exec-1"))["drain_via"] == "someday"  # kept
    assert not world.writer.get_node("gpu-1")["spec"].get("unschedulable")  # our cordon undone
    assert world.scaler.terminated == [] and world.writer.evictions == []


# ------------------------------------------------------------------------------------ resuming


def _deps(world: Any, state: StateStore, **kw: Any) -> DrainDeps:
    return DrainDeps(
        cluster=world.writer,
        scaler=world.scaler,
        assessor=kw.pop("assessor", None) or PlanningAssessor(world.observe, world.policy),
        state=state,
        policy=world.policy,
        dry_run=False,
        clock=world.clock.now,
        **kw,
    )


def _until(
    workflow: Any, state: StateStore, execution_id: str, step: str, clock: FakeClock
) -> WorkflowRecord:
    """Run the workflow (this release) until its record is at ``step``: where the frozen one is planted."""
    for _ in range(100):
        record = state.load(execution_id)
        assert record is not None and record.status == "running", record
        if record.step == step:
            return record
        result = workflow.step(execution_id)
        clock.advance(max(result.wait_seconds, 1.0))
    raise AssertionError(f"never reached {step}")


def _finish(workflow: Any, execution_id: str, clock: FakeClock) -> Any:
    return InProcessRunner(workflow, sleep=clock.advance).run(execution_id)


def test_a_scale_in_waiting_for_its_pods_resumes_and_removes_the_instance(store: Store) -> None:
    world = make_world()  # the world the frozen document was written in (tests/unit/test_drain.py)
    workflow = DrainWorkflow(_deps(world, store.state))
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    _until(workflow, store.state, "exec-1", "wait", world.clock)
    store.plant("exec-1", "wait", FROZEN["scale_in_wait"])
    result = _finish(workflow, "exec-1", world.clock)
    assert result.status == "succeeded", result.message
    assert world.scaler.terminated == ["i-1"]
    [entry] = [e for e in store.state.entries(execution_id="exec-1") if e.result == "applied"]
    assert entry.hourly_savings_usd == 1.006 and entry.node_group == "gpu-a10g" and entry.kind == "scale_in"


def test_a_rollback_retrying_its_uncordon_resumes_and_ends_with_the_node_uncordoned(store: Store) -> None:
    world = make_world()
    workflow = DrainWorkflow(_deps(world, store.state))
    workflow.start(DrainRequest("gpu-1", "exec-1"))
    _until(workflow, store.state, "exec-1", "revalidate", world.clock)  # cordoned
    store.plant("exec-1", "rollback", FROZEN["scale_in_rollback"])
    result = _finish(workflow, "exec-1", world.clock)
    # The rollback the release before had pending: its reason, status and step.
    assert (result.status, result.message, result.step) == ("failed", "failed:eviction refused", "evict")
    assert not world.writer.get_node("gpu-1")["spec"].get("unschedulable")
    assert world.scaler.terminated == []


def test_a_consolidation_before_its_placement_check_resumes_checks_and_removes(store: Store) -> None:
    world = make_world(
        policy=Policy(dry_run=False, consolidation="idle_holders"),
        pods=[pod("holder", "gpu-1", gpus=1, grace=30)],
    )
    workflow = ConsolidateWorkflow(_deps(world, store.state), None, observe_cluster=world.observe)
    workflow.start(ConsolidateRequest("gpu-1", "exec-1", moves=(("default/holder", "gpu-2"),)))
    _until(workflow, store.state, "exec-1", "evict", world.clock)
    store.plant("exec-1", "evict", FROZEN["consolidate_evict"])
    result = _finish(workflow, "exec-1", world.clock)
    assert result.status == "succeeded", result.message
    record = store.state.load("exec-1")
    assert record is not None and isinstance(record.details, ConsolidateDetails)
    assert record.details.placement_checked is not None and world.scaler.terminated == ["i-1"]


def test_a_replacement_child_drain_resumes_and_ends_drained_and_cordoned(store: Store) -> None:
    world = make_world()
    workflow = ReplaceWorkflow(_deps(world, store.state), None)
    parent = "nodegroup-gpu-a10g-0011223344556677"
    workflow.start(ReplaceDrainRequest("gpu-1", "exec-1", f"replace:{parent}", parent=parent))
    _until(workflow, store.state, "exec-1", "evict", world.clock)
    store.plant("exec-1", "evict", FROZEN["replace_drain_evict"])
    result = _finish(workflow, "exec-1", world.clock)
    assert result.status == "succeeded" and result.step == "drained", result.message
    assert world.writer.get_node("gpu-1")["spec"].get("unschedulable")  # until its group is at 0
    assert world.writer.list_pods_on_node("gpu-1") == [] and world.scaler.terminated == []


class _Underutilized:
    def assess_node(self, node: str, now: Any) -> NodeReport | None:
        return NodeReport(
            node=node, verdict="underutilized", reasons=["activity_above_threshold:30%"], node_group=None,
            instance_id="i-1", instance_type="g5.4xlarge", gpus=1, gpu_activity_max_pct=30.0,
            fb_used_max_mib=4096.0, coverage=1.0, hourly_usd=1.624,
        )  # fmt: skip


@dataclass
class _ResizeWorld:
    clock: FakeClock
    writer: FakeClusterWriter
    scaler: FakeNodeScaler
    policy: Policy
    instances: FakeInstances
    kubelet: Kubelet


@pytest.fixture
def resize_world() -> Iterator[_ResizeWorld]:
    clock = FakeClock(AT)
    writer = FakeClusterWriter(clock=clock)
    writer.add_node(gpu_node("gpu-1", instance_type="g5.4xlarge", gpus=1, instance_id="i-1", nodegroup=None))
    for i in range(2):
        writer.add_pod(pod(f"api-{i}", "gpu-1", namespace="ml", grace=1, labels={"app": "api"}))
    instances = FakeInstances("i-1", "g5.4xlarge", {"rightsizer.io/resize": "allowed"})
    kubelet = Kubelet(writer, "gpu-1", lambda: (instances.state, instances.instance_type))
    instances.on_change = kubelet.sync
    kubelet.sync()
    policy = Policy(dry_run=False, allow_resize=True, resize_allow_instance_store_loss=True)
    yield _ResizeWorld(clock, writer, FakeNodeScaler(), policy, instances, kubelet)


@pytest.mark.parametrize(
    ("name", "status", "serving"),
    [("resize_stopped", "succeeded", "g5.xlarge"), ("resize_restoring", "rolled_back", "g5.4xlarge")],
)
def test_a_stopped_resize_resumes_and_ends_serving(
    store: Store, resize_world: _ResizeWorld, name: str, status: str, serving: str
) -> None:
    w = resize_world
    workflow = ResizeWorkflow(_deps(w, store.state, assessor=_Underutilized()), w.instances)
    workflow.start(ResizeRequest("gpu-1", "exec-1", target_type="g5.xlarge"))
    _until(workflow, store.state, "exec-1", "set_type", w.clock)  # the instance is stopped
    store.plant("exec-1", "set_type", FROZEN[name])
    result = _finish(workflow, "exec-1", w.clock)
    assert result.status == status, result.message
    w.kubelet.sync()
    node = w.writer.get_node("gpu-1")
    assert (w.instances.state, w.instances.instance_type) == ("running", serving)
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == serving
    assert not node["spec"].get("unschedulable")


@pytest.mark.slow
def test_a_replacement_about_to_drain_the_old_group_resumes_and_scales_it_to_zero(
    aws_clients: Any, store: Store
) -> None:
    # aws_clients first: it resets the moto server, which would drop the store's table.
    for world in replace_world(aws_clients):
        world.state = store.state  # type: ignore[assignment]
        workflow = world.workflow()
        workflow.start(world.request())
        for result in drive(partial(workflow.step, EXECUTION), world.advance):
            if result.next_step == "ng_drain":
                break
        live = store.state.load(EXECUTION)
        assert live is not None and isinstance(live.details, ReplaceDetails)
        # This moto world's own resources (ids made at random) in the frozen document; the rest as it was.
        frozen = json.loads(FROZEN["replace_ng_drain"])
        mine = live.details.stored()
        for key in ("asg", "new_spec", "template_version_created"):
            frozen[key] = mine[key]
        store.plant(EXECUTION, "ng_drain", json.dumps(frozen, sort_keys=True, separators=(",", ":")))
        result = InProcessRunner(workflow, sleep=world.advance).run(EXECUTION)
        assert result.status == "succeeded", result.message
        assert world.old_sizes() == (0, 0, 3) and sorted(world.nodes_of("gpu-a10g-g5-xlarge"))
        record = store.state.load(EXECUTION)
        assert record is not None and isinstance(record.details, ReplaceDetails)
        assert sorted(record.details.drained) == world.old_nodes


@pytest.mark.parametrize("document", ['{"kind":"future_kind"}', '{"dry_run":"maybe","trigger":"schedule"}'])
def test_details_this_release_cannot_read_do_not_load_and_say_which(
    moto_server: MotoServer, boto_session: boto3.session.Session, document: str
) -> None:
    client = boto_session.client("dynamodb", endpoint_url=moto_server.endpoint_url)
    table = f"rightsizer-compat-{uuid.uuid4().hex[:12]}"
    create_state_table(client, table)
    state = DynamoDbState(client, table, CLUSTER)
    state.save(_record(), expected_version=0)
    key = {"pk": {"S": "wf#exec-1"}, "sk": {"S": "wf"}}
    item = client.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    client.put_item(TableName=table, Item={**item, "details": {"S": document}})
    with pytest.raises(PermanentError, match="workflow record exec-1: details this release cannot read"):
        state.load("exec-1")
