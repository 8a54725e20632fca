"""The sharded run's steps (``services.shard``) on in-memory ports: one lock for the whole run, each shard's
own reads, a retried shard counted once, and the merged assessment starting exactly the drains (same
execution ids, same budget) the unsharded assessment starts on the same facts."""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rightsizer.adapters.kubernetes_models import ModelPages
from rightsizer.adapters.memory_state import MemoryState
from rightsizer.adapters.shard_codec import RunDecoder
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.gpu import is_gpu_node
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import ClusterSnapshot, Node, Pod
from rightsizer.domain.policy import Policy
from rightsizer.domain.shard import SPECS_CODEC, ShardPartial, ShardsIncomplete
from rightsizer.domain.usage import Window, collect_signals
from rightsizer.services import shard as service
from rightsizer.services.assess import AssessmentDeps, run_assessment
from rightsizer.services.drain import DrainRequest
from rightsizer.state import LeaseLostError
from rightsizer.testing.fakes import FakeClusterWriter
from tests.builders import AT, const, gpu_node, merge_metrics, node_devices, pod, snapshot


class Bucket:
    bucket = "shards"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []

    def put_bytes(self, key: str, body: bytes) -> None:
        self.objects[key] = body
        self.puts.append(key)

    def get_bytes(self, key: str) -> bytes:
        return self.objects[key]


class Pods:
    """``list_models(Pod, field_selector=spec.nodeName=<node>)`` over the snapshot's pods (one list page
    each, decoded as the adapter decodes it), recording each ask."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        self._snap = snap
        self.asked: list[str] = []

    def list_models(
        self, kind: type[Pod], project: Callable[[Pod], Any], *, field_selector: str = "", **_: Any
    ) -> list[Any]:
        self.asked.append(field_selector)
        node = field_selector.removeprefix("spec.nodeName=")
        items = [
            p.model_dump(mode="json", by_alias=True, exclude_none=True)
            for p in self._snap.pods
            if p.spec.nodeName == node
        ]
        pods, _ = ModelPages(kind).page(json.dumps({"items": items}).encode())
        return [kept for p in pods if (kept := project(p)) is not None]


class Starter:
    def __init__(self) -> None:
        self.requests: list[DrainRequest] = []

    def start(self, request: DrainRequest) -> str:
        self.requests.append(request)
        return request.execution_id


POLICY = Policy(max_nodes_per_run=3, max_nodes_per_node_group="100%", cooldown=0)


def cluster() -> ClusterSnapshot:
    nodes, pods, parts = [], [], []
    for g, busy in (("a", ()), ("b", (1,)), ("c", (0, 2))):
        for i in range(3):
            name = f"{g}-{i}"
            nodes.append(
                gpu_node(name, instance_type="g5.xlarge", gpus=1, nodegroup=g, instance_id=f"i-{g}{i}")
            )
            parts.append(node_devices(name, 1, util=const(90) if i in busy else const(0)))
            pods.append(pod(f"web-{g}{i}", name))
    return snapshot(nodes, pods, merge_metrics(*parts))


def reader_for(snap: ClusterSnapshot) -> service.SignalsReader:
    def read(nodes: Sequence[Node], pods: Sequence[Pod]) -> ShardPartial:
        mine = {n.name for n in nodes}
        metrics = {
            k: dataclasses.replace(m, series=tuple(s for s in m.series if s.labels.get("node") in mine))
            for k, m in snap.metrics.items()
        }
        window = Window.ending(snap.meta.taken_at, POLICY.idle_window, snap.meta.step_seconds)
        signals = collect_signals(
            metrics, snap.timestamps, NodeJoiner(nodes, pods), window, POLICY.gpu_activity_max_pct
        )
        return ShardPartial("", "", (), signals=signals)

    return read


def deps(snap: ClusterSnapshot, state: MemoryState, starter: Starter, observe: Any) -> AssessmentDeps:
    writer = FakeClusterWriter()
    return AssessmentDeps(
        cluster_name="demo", observe=observe, policy=POLICY, cluster=writer, state=state, starter=starter
    )


def gpu(node: Node) -> bool:
    return is_gpu_node(node, load_catalog())


def test_a_sharded_run_locks_once_reads_per_shard_and_starts_the_unsharded_drains() -> None:
    snap = cluster()
    whole = dataclasses.replace(snap, signals=reader_for(snap)(snap.nodes, snap.pods).signals, source="live")
    unsharded = Starter()
    expected = run_assessment(deps(snap, MemoryState("demo"), unsharded, lambda _at: whole), AT, "run-1")

    state, bucket, starter = MemoryState("demo"), Bucket(), Starter()
    # WHEN the run prepares: the lock is taken, the 9 GPU nodes cut into groups of at most 3
    prepared = service.prepare("run-1", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600)
    assert (prepared.shards, prepared.gpu_nodes, prepared.locked_by) == (3, 9, None)
    # AND a second run while it holds the lock prepares nothing
    other = service.prepare("run-2", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600)
    assert (other.manifest, other.locked_by) == (None, "run-1")
    # WHEN every shard observes (one retried), each asking only for its own nodes' pods
    specs = SPECS_CODEC.validate_json(bucket.get_bytes(prepared.manifest or ""))
    for spec in [*specs, specs[1]]:
        reads = Pods(snap)
        partial = service.observe_shard("run-1", spec, bucket, reads, reader_for(snap))
        assert reads.asked == [f"spec.nodeName={n}" for n in spec.nodes]
        assert {p.spec.nodeName for p in partial.pods} == set(spec.nodes)
    # THEN the merge assesses once: the same drains, execution ids and verdicts as unsharded
    base = dataclasses.replace(snap, pods=(), metrics={})
    summary = service.merge(
        "run-1",
        AT,
        deps(snap, state, starter, None),
        bucket,
        lambda _n, _p: base,
        RunDecoder(),
        lock_seconds=600,
    )
    assert summary.started == expected.started and len(summary.started) == 3  # the run's budget, once
    assert [r.execution_id for r in starter.requests] == [r.execution_id for r in unsharded.requests]
    assert summary.verdicts == expected.verdicts == {"busy": 3, "idle": 3, "protected": 3}
    assert [r.model_dump() for r in summary.records] == [r.model_dump() for r in expected.records]
    # AND the lock is free again: the next run prepares
    assert state.get(service.RUN_LOCK) is None
    assert (
        service.prepare("run-3", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600).locked_by
        is None
    )
    # AND the process's garbage collector is as it was (a warm Lambda runs the next merge in it)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_merge_that_fails_while_reading_leaves_the_garbage_collector_as_it_was() -> None:
    snap = cluster()
    state, bucket = MemoryState("demo"), Bucket()
    prepared = service.prepare("run-1", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600)
    for spec in SPECS_CODEC.validate_json(bucket.get_bytes(prepared.manifest or "")):
        service.observe_shard("run-1", spec, bucket, Pods(snap), reader_for(snap))

    def facts(_n: object, _p: object) -> ClusterSnapshot:
        raise TimeoutError("the PodDisruptionBudget list timed out")

    with pytest.raises(TimeoutError):
        service.merge(
            "run-1", AT, deps(snap, state, Starter(), None), bucket, facts, RunDecoder(), lock_seconds=600
        )
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_merge_without_the_lock_acts_on_nothing_and_release_gives_it_back() -> None:
    snap = cluster()
    state, bucket, starter = MemoryState("demo"), Bucket(), Starter()
    service.prepare("run-1", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600)
    with pytest.raises(LeaseLostError, match="run-9"):
        service.merge(
            "run-9",
            AT,
            deps(snap, state, starter, None),
            bucket,
            lambda _n, _p: snap,
            RunDecoder(),
            lock_seconds=600,
        )
    assert starter.requests == []
    assert service.release("run-9", state) is False
    assert service.release("run-1", state) is True
    assert state.get(service.RUN_LOCK) is None


def test_a_partial_of_another_run_under_this_run_is_refused_and_nothing_acted_on() -> None:
    """A partial is read from ``<run>/<shard>.partial.json``; one whose own ``run`` is another (copied
    there, or left by an earlier run) holds another time's signals: stale, so the merge is refused."""
    snap = cluster()
    state, bucket, starter = MemoryState("demo"), Bucket(), Starter()
    prepared = service.prepare("run-1", AT, snap.nodes, gpu, bucket, state, per_shard=3, lock_seconds=600)
    specs = SPECS_CODEC.validate_json(bucket.get_bytes(prepared.manifest or ""))
    for spec in specs:
        service.observe_shard("run-1", spec, bucket, Pods(snap), reader_for(snap))
    key = service.partial_key("run-1", specs[0].id)
    bucket.objects[key] = bucket.objects[key].replace(b'"run":"run-1"', b'"run":"run-0"', 1)
    with pytest.raises(ShardsIncomplete, match=rf"{key} is a partial of run 'run-0', not of run-1"):
        service.merge(
            "run-1",
            AT,
            deps(snap, state, starter, None),
            bucket,
            lambda n, p: snap,
            RunDecoder(),
            lock_seconds=600,
        )
    assert starter.requests == [] and gc.isenabled()
