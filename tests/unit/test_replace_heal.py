"""A node group replacement that died leaves nothing cordoned (issue 17, ``services.healing``).

A node drained for a replacement stays cordoned on purpose (its child drain ``succeeded``) until the old
group scales to 0. GIVEN the replacement's workflow died (its lease on ``nodegroup:<name>`` expired) WHEN
the assessment heals THEN the lease is released without touching any Node by that name, and the drained
node's cordon is undone; while the replacement is alive the cordon stays.
"""

from __future__ import annotations

from datetime import timedelta

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.domain.model import ANN_CORDONED_BY, Node
from rightsizer.domain.workflow_details import ReplaceDetails, ReplaceDrainDetails
from rightsizer.services.healing import heal_expired_leases, heal_stale_cordons, stale_cordons
from rightsizer.services.replace import CHILD_KIND, KIND, lease_key
from rightsizer.state import WorkflowRecord
from rightsizer.testing.fakes import FakeClusterWriter
from tests.builders import AT, gpu_node

PARENT, CHILD, NODE = "replace-1", "replace-1.0.1", "gpu-1"


def world(parent_lease_ttl: int) -> tuple[FakeClusterWriter, MemoryState]:
    cluster = FakeClusterWriter()
    cluster.add_node(gpu_node(NODE, unschedulable=True, annotations={ANN_CORDONED_BY: CHILD}))
    state = MemoryState("prod")
    lease = state.acquire(lease_key("gpu-a10g"), PARENT, AT, parent_lease_ttl)
    assert lease is not None
    common = {"started_at": AT, "deadline": AT + timedelta(minutes=30)}
    state.save(
        WorkflowRecord(PARENT, lease_key("gpu-a10g"), None, "ng_drain", "running", lease_epoch=lease.epoch,
                       details=ReplaceDetails(kind=KIND, nodegroup="gpu-a10g", target_type="g5.xlarge"),
                       **common),  # type: ignore[arg-type]
        expected_version=0,
    )  # fmt: skip
    state.save(
        WorkflowRecord(CHILD, NODE, "i-1", "done", "succeeded", details=ReplaceDrainDetails(kind=CHILD_KIND, parent=PARENT),
                       **common),  # type: ignore[arg-type]
        expected_version=0,
    )  # fmt: skip
    return cluster, state


def heal(cluster: FakeClusterWriter, state: MemoryState) -> list[str]:
    now = AT + timedelta(minutes=20)
    heal_expired_leases(cluster, state, now)
    nodes = [Node.model_validate(n) for n in cluster.list_nodes()]
    return heal_stale_cordons(cluster, state, stale_cordons(nodes, state, now), now)


def test_a_dead_replacement_leaves_no_cordon_and_no_lease() -> None:
    cluster, state = world(parent_lease_ttl=600)  # expired at +10 min
    assert heal(cluster, state) == [NODE]
    node = cluster.get_node(NODE)
    assert node is not None and not node["spec"]["unschedulable"]
    assert state.get(lease_key("gpu-a10g")) is None
    assert ("uncordon", lease_key("gpu-a10g"), PARENT) not in cluster.calls


def test_a_live_replacement_keeps_its_drained_node_cordoned() -> None:
    cluster, state = world(parent_lease_ttl=3600)
    assert heal(cluster, state) == []
    node = cluster.get_node(NODE)
    assert node is not None and node["spec"]["unschedulable"]
