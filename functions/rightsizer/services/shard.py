"""The sharded assessment's three steps (issue 33 item 3, docs/architecture.md §2 "Sharded assessment"):
``prepare`` (take the run's lock, list the Nodes once, cut the shards, write them), ``observe_shard`` (one
Distributed Map item: its nodes' pods and series, reduced, written as a ``ShardPartial``) and ``merge``
(the cluster-wide facts once, every partial, ``domain.shard.merge_shards``, then the scheduled assessment
itself, ``services.assess.run_assessment``, on the merged snapshot: healing, budgets, decision records and
deterministic drain execution ids exactly as an unsharded tick).

One lock for the whole run: the lease ``assessment:run`` (a key no Node can have), taken by the run's
execution name in ``prepare``, checked and renewed before ``merge`` acts and released after it; a second
run while it is held prepares nothing. A shard writes only its own object (a retry overwrites it) and the
merge takes one partial per shard, so nothing is counted twice; drains are named from the run's id, so a
retried merge starts none twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import TypeAdapter

from rightsizer.domain.dra_fields import claim_fields, slice_fields
from rightsizer.domain.model import (
    ClusterSnapshot,
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodDisruptionBudget,
)
from rightsizer.domain.shard import (
    PARTIAL_CODEC,
    SPECS_CODEC,
    ShardPartial,
    ShardsIncomplete,
    ShardSpec,
    cut_shards,
)
from rightsizer.domain.shard import merge_shards as merge_partials
from rightsizer.gc_pause import cyclic_gc_paused
from rightsizer.ports import ClusterReader, NodeGroupInventory
from rightsizer.services.assess import AssessmentDeps, AssessmentSummary, run_assessment
from rightsizer.services.snapshot import (
    Observation,
    ObserveRequest,
    _preflight,
    _workload_documents,
    kubectl_list,
    snapshot_meta,
)
from rightsizer.state import LeaseLostError, LeaseStore

log = logging.getLogger(__name__)

#: The run lock's lease key (``:`` never occurs in a Node name, so the lease healer only releases it).
RUN_LOCK = "assessment:run"
#: Where a run's objects live in the shard bucket.
RUNS_PREFIX = "shards/runs/"
NODES_CODEC = TypeAdapter(list[Node])
#: Per-node pod lists asked at once by one shard (``fieldSelector=spec.nodeName=<node>``).
POD_READS_AT_ONCE = 8


class BlobStore(Protocol):
    """The shard bucket (``adapters.shard_store.ShardBucket``): bytes in, bytes out."""

    bucket: str

    def put_bytes(self, key: str, body: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...


def run_key(run: str, name: str) -> str:
    """``shards/runs/<run>/<name>``."""
    return f"{RUNS_PREFIX}{run}/{name}"


def shard_input_key(run: str, shard: str) -> str:
    """Where ``prepare`` writes a shard's Nodes."""
    return run_key(run, f"{shard}.nodes.json")


def partial_key(run: str, shard: str) -> str:
    """Where a shard writes its partial (one object per shard: a retry overwrites it)."""
    return run_key(run, f"{shard}.partial.json")


@dataclass(frozen=True)
class Prepared:
    """What ``prepare`` hands the state machine: the Map's items (``manifest``, a JSON array of
    ``ShardSpec``), how many, and the lock (None: another run holds it; nothing was prepared)."""

    run: str
    manifest: str | None
    shards: int
    gpu_nodes: int
    locked_by: str | None = None


def prepare(
    run: str,
    now: datetime,
    nodes: Sequence[Node],
    gpu: Callable[[Node], bool],
    store: BlobStore,
    locks: LeaseStore,
    *,
    per_shard: int,
    lock_seconds: int,
) -> Prepared:
    """Take the run lock, cut the GPU nodes into shards and write them (``<run>/nodes.json``: every Node
    the merge plans with; ``<run>/sNNNN.nodes.json``: each shard's; ``<run>/shards.json``: the items).

    Returns:
        :class:`Prepared`; ``locked_by`` set (and nothing written) when another run holds the lock.
    """
    lease = locks.acquire(RUN_LOCK, run, now, lock_seconds)
    if lease is None:
        held = locks.get(RUN_LOCK)
        return Prepared(run, None, 0, 0, locked_by=held.owner if held else "?")
    members = [n for n in nodes if gpu(n)]
    specs = cut_shards(members, per_shard)
    by_name = {n.name: n for n in members}
    store.put_bytes(run_key(run, "nodes.json"), NODES_CODEC.dump_json(list(nodes)))
    for spec in specs:
        mine = [by_name[name] for name in spec.nodes]
        store.put_bytes(shard_input_key(run, spec.id), NODES_CODEC.dump_json(mine))
    manifest = run_key(run, "shards.json")
    store.put_bytes(manifest, SPECS_CODEC.dump_json(specs))
    return Prepared(run, manifest, len(specs), len(members))


SignalsReader = Callable[[Sequence[Node], Sequence[Pod]], ShardPartial]
"""Reads and reduces a shard's series: (its Nodes, their pods) → a partial with ``signals``,
``workload_signals`` and ``xids`` set (``run``, ``shard`` and ``pods`` are filled in by the caller)."""


def pods_on(cluster: ClusterReader, nodes: Sequence[str]) -> list[Pod]:
    """The pods bound to ``nodes``: one ``fieldSelector=spec.nodeName=<node>`` list each, a few at a time;
    sorted as the API lists them (namespace, name).

    It is the kubelet's own query: the API server's pod cacher keeps an index on ``spec.nodeName``
    (kubernetes ``pkg/registry/core/pod/storage/storage.go``, and lists served from the watch cache use the
    store's indexes: KEP 4933 "cacher label index", kubernetes/enhancements @2581defd,
    ``keps/sig-api-machinery/4933-cacher-label-index/README.md``), so a shard's reads cost in its own pods,
    where a ``labelSelector`` cannot name a node and a whole list would read every pod of the cluster.
    The Kubernetes double answers the same selector (``testing/k8s/selectors``). Each answer is decoded
    from its bytes into the compact models the unsharded read makes (``ClusterReader.list_models``)."""

    def one(node: str) -> list[Pod]:
        return cluster.list_models(Pod, _every, field_selector=f"spec.nodeName={node}")

    with ThreadPoolExecutor(max_workers=POD_READS_AT_ONCE) as pool:
        pods = [p for batch in pool.map(one, nodes) for p in batch]
    pods.sort(key=lambda p: (p.metadata.namespace, p.metadata.name))
    return pods


def _every(pod: Pod) -> Pod:
    return pod


def observe_shard(
    run: str, spec: ShardSpec, store: BlobStore, cluster: ClusterReader, read_signals: SignalsReader
) -> ShardPartial:
    """One Distributed Map item: the shard's Nodes (as ``prepare`` wrote them), their pods, their series;
    the partial is written to ``<run>/<shard>.partial.json`` and returned.

    Raises:
        PermanentError / TransientError: a Kubernetes read failed (the state machine retries the item).
        PrometheusUnavailable, MetricsFailed: the shard's series could not be read.
    """
    nodes = NODES_CODEC.validate_json(store.get_bytes(shard_input_key(run, spec.id)))
    if tuple(n.name for n in nodes) != spec.nodes:
        raise ValueError(f"shard {spec.id}: its Nodes object does not match the manifest")
    pods = pods_on(cluster, spec.nodes)
    read = read_signals(nodes, pods)
    partial = ShardPartial(
        run=run,
        shard=spec.id,
        nodes=spec.nodes,
        pods=tuple(pods),
        signals=read.signals,
        workload_signals=read.workload_signals,
        xids=read.xids,
    )
    store.put_bytes(partial_key(run, spec.id), PARTIAL_CODEC.dump_json(partial))
    return partial


class RunDecoder(Protocol):
    """Reads a run's objects back from their bytes (``adapters.shard_codec.RunDecoder``): the Nodes and
    the partials as compact models, equal parts shared across every object it reads."""

    def nodes(self, body: bytes) -> list[Node]: ...

    def partial(self, body: bytes) -> ShardPartial: ...

    def close(self) -> None: ...


def load_run(
    run: str, store: BlobStore, decoder: RunDecoder
) -> tuple[list[Node], list[ShardSpec], list[ShardPartial]]:
    """Every Node, shard and partial of ``run`` from the shard bucket, one object at a time, decoded by
    ``decoder`` (closed afterwards: at 100,000 GPU nodes the merge holds 1.5 million pods, and pods of one
    DaemonSet or template share their equal parts).

    Raises:
        the store's error for a missing object (a shard that never wrote its partial);
        ShardsIncomplete: an object is malformed, a partial of a format this release does not read, or
            of another run.
    """
    try:
        nodes = decoder.nodes(store.get_bytes(run_key(run, "nodes.json")))
        specs = SPECS_CODEC.validate_json(store.get_bytes(run_key(run, "shards.json")))
        partials = [_partial_of(run, s, store, decoder) for s in specs]
    finally:
        decoder.close()
    return nodes, specs, partials


def _partial_of(run: str, spec: ShardSpec, store: BlobStore, decoder: RunDecoder) -> ShardPartial:
    """``spec``'s partial of ``run``; one that says it is another run's (copied under this run, or left by
    an earlier one) holds another time's signals: stale, refused (``ShardsIncomplete``)."""
    key = partial_key(run, spec.id)
    partial = decoder.partial(store.get_bytes(key))
    if partial.run != run:
        raise ShardsIncomplete(f"{key} is a partial of run {partial.run!r}, not of {run}: stale, not merged")
    return partial


def cluster_facts(
    cluster: ClusterReader,
    inventory: NodeGroupInventory | None,
    request: ObserveRequest,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
) -> Observation:
    """The documents of the whole cluster's observation (``services.snapshot.observe``'s, projected) for
    the Nodes ``prepare`` listed and the shards' ``pods``, read once by the merge: the unscheduled pods
    (``fieldSelector=spec.nodeName=``), PodDisruptionBudgets, PersistentVolumeClaims and Volumes, DRA
    claims and slices when served, the workloads of GPU holders, the AWS inventory of every instance.

    Raises:
        PermanentError: a read permission is denied (the remedy named); TransientError: as the reads.
    """
    dra = _preflight(cluster)
    unbound = cluster.list_models(Pod, _every, field_selector="spec.nodeName=")
    documents: dict[str, Any] = {
        "snapshot.json": snapshot_meta(request),
        "nodes.json": kubectl_list(nodes),
        "pods.json": kubectl_list([*unbound, *pods]),
        "pdbs.json": kubectl_list(
            cluster.list_projected("poddisruptionbudgets", PodDisruptionBudget.model_validate)
        ),
        "persistentvolumeclaims.json": kubectl_list(
            cluster.list_projected("persistentvolumeclaims", PersistentVolumeClaim.model_validate)
        ),
        "persistentvolumes.json": kubectl_list(
            cluster.list_projected("persistentvolumes", PersistentVolume.model_validate)
        ),
    }
    documents.update(_workload_documents(cluster, nodes, pods))
    if dra:
        documents["resourceclaims.json"] = kubectl_list(
            cluster.list_projected("resourceclaims", claim_fields)
        )
        documents["resourceslices.json"] = kubectl_list(
            cluster.list_projected("resourceslices", slice_fields)
        )
    if inventory is not None and request.eks_cluster:
        ids = sorted({n.instance_id for n in nodes if n.instance_id})
        documents["nodegroups.json"] = inventory.describe(ids, request.eks_cluster)
        documents["instances.json"] = inventory.describe_instances(ids)
    return Observation(documents)


def merge(
    run: str,
    now: datetime,
    deps: AssessmentDeps,
    store: BlobStore,
    facts: Callable[[Sequence[Node], Sequence[Pod]], ClusterSnapshot],
    decoder: RunDecoder,
    *,
    lock_seconds: int,
) -> AssessmentSummary:
    """The final step: the cluster-wide facts (``facts``: :func:`cluster_facts` decoded, for the Nodes
    ``prepare`` listed and the shards' pods), every partial (read by ``decoder``) merged in
    (``domain.shard.merge_shards``), then the scheduled assessment on that snapshot with the run's id as
    the tick id; the lock is released afterwards.

    Raises:
        LeaseLostError: the run no longer holds the lock (it expired and another run took it): nothing
            is acted on.
        ShardsIncomplete: a shard's partial is missing or foreign.
    """
    held = deps.state.get(RUN_LOCK)
    if held is None or held.owner != run:
        raise LeaseLostError(
            f"run {run} does not hold {RUN_LOCK} (held by {held.owner if held else 'nobody'})"
        )
    lease = deps.state.renew(RUN_LOCK, run, held.epoch, now, lock_seconds)
    with _long_lived():
        nodes, specs, partials = load_run(run, store, decoder)
        pods = [p for part in partials for p in part.pods]
        merged = merge_partials(facts(nodes, pods), specs, partials)
    try:
        summary = run_assessment(_with_observe(deps, lambda _at: merged), now, run)
    finally:
        gc.unfreeze()
    deps.state.release(RUN_LOCK, run, lease.epoch)
    return summary


@contextlib.contextmanager
def _long_lived() -> Iterator[None]:
    """What the block makes (the run's Nodes and 1.5 million pods at 100,000 GPU nodes, all acyclic) is
    kept out of the cyclic garbage collector's scans: the collector is paused while it is made, then
    everything it tracks is frozen (``gc.freeze``, undone by the caller's ``gc.unfreeze``), so the plan's
    collections scan only what the plan makes. Each full collection would otherwise walk every pod: a
    fifth of the merge's CPU at 10,000 GPU nodes (``benchmarks/shard_scale.py``). Reference counting
    still frees a frozen object nothing refers to."""
    with cyclic_gc_paused():
        yield
        gc.freeze()


def release(run: str, locks: LeaseStore) -> bool:
    """Give the run lock back after a failed run (the state machine's Catch): the next tick can run at
    once. True when ``run`` held it."""
    held = locks.get(RUN_LOCK)
    return held is not None and held.owner == run and locks.release(RUN_LOCK, run, held.epoch)


def _with_observe(deps: AssessmentDeps, observe: Callable[[datetime], ClusterSnapshot]) -> AssessmentDeps:
    return dataclasses.replace(deps, observe=observe)
