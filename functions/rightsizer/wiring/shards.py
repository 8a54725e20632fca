"""The sharded assessment's composition (issue 33 item 3, docs/architecture.md §2 "Sharded assessment"):
its settings, the hand-off from the scheduled assessment, and the state machine's four steps
(``infra/statemachine/shard.asl.json``) put together from the deployment's ``Runtime``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rightsizer.domain.model import ClusterSnapshot, Node, Pod
from rightsizer.domain.shard import ShardPartial, ShardSpec, shard_series_matchers
from rightsizer.ports import NodeReader
from rightsizer.services import observe as live
from rightsizer.services import shard as service
from rightsizer.services.assess import AssessmentSummary
from rightsizer.wiring.runtime import Runtime


class ShardSettings(BaseSettings):
    """The sharded assessment's settings (``RIGHTSIZER_SHARD_*``, set by ``template.yaml`` with
    ``EnableSharding``; docs/operations.md "Sharded assessment")."""

    model_config = SettingsConfigDict(env_prefix="RIGHTSIZER_SHARD_", env_ignore_empty=True, frozen=True)

    state_machine_arn: str | None = Field(None, description="The sharded run's state machine; None: off.")
    bucket: str | None = Field(None, description="The shard bucket (Nodes, shard lists, partials).")
    above_gpu_nodes: int = Field(
        5000,
        ge=1,
        description="Shard a cluster with more GPU nodes than this (one invocation reads ~10,000).",
    )
    gpu_nodes_per_shard: int = Field(1000, ge=1, le=5000, description="GPU nodes per shard (a Map item).")
    max_concurrency: int = Field(40, ge=1, le=10_000, description="Shards read at once (Map MaxConcurrency).")
    lock_seconds: int = Field(
        3600, ge=60, description="The run lock's lifetime (the state machine's timeout)."
    )
    region: str = Field("us-east-1", validation_alias="AWS_REGION")
    endpoint_url: str | None = Field(None, validation_alias="RIGHTSIZER_AWS_ENDPOINT_URL")


def _bucket(settings: ShardSettings) -> service.BlobStore:
    from rightsizer.adapters.shard_store import shard_bucket

    if not settings.bucket:
        raise ValueError("RIGHTSIZER_SHARD_BUCKET is not set")
    return shard_bucket(settings.bucket, settings.region, settings.endpoint_url)


def _floored(runtime: Runtime, at: datetime) -> datetime:
    """``at`` floored to the query step, as the live observation floors it (``services.observe``)."""
    step = int(runtime.config.prometheus.step)
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % step, at.tzinfo)


def _nodes(runtime: Runtime) -> list[Node]:
    """Every Node, each page decoded from its bytes into the compact models the plan reads
    (``ClusterReader.list_models``, as the unsharded observation lists them)."""
    return runtime.observers.cluster.list_models(Node, _same)


def _same(node: Node) -> Node:
    return node


def _is_gpu() -> Any:
    from rightsizer.domain.catalog import load_catalog
    from rightsizer.domain.gpu import is_gpu_node

    catalog = load_catalog()
    return lambda node: is_gpu_node(node, catalog)


def run_name(tick_id: str) -> str:
    """The sharded run's execution name for a schedule tick (deterministic: a retried tick is the same
    run; ≤ 80 characters of ``[A-Za-z0-9_-]``)."""
    return ("assess-" + re.sub(r"[^A-Za-z0-9_-]", "-", tick_id))[:80]


def start_if_large(runtime: Runtime, settings: ShardSettings, at: datetime, tick_id: str) -> str | None:
    """The scheduled assessment's hand-off: with a sharded state machine configured and more GPU nodes
    than ``above_gpu_nodes``, start the sharded run for this tick (one Node list; ``StartExecution``,
    idempotent by name) and return its name; otherwise None (assess in this invocation)."""
    if not settings.state_machine_arn:
        return None
    gpu = _is_gpu()
    count = sum(1 for n in _nodes(runtime) if gpu(n))
    if count <= settings.above_gpu_nodes:
        return None
    from rightsizer.adapters.shard_store import start_sharded_run

    name = run_name(tick_id)
    document = {"at": at.isoformat(), "gpu_nodes": count}
    return start_sharded_run(
        settings.state_machine_arn, name, document, settings.region, settings.endpoint_url
    )


def prepare_run(runtime: Runtime, settings: ShardSettings, run: str, at: datetime) -> dict[str, Any]:
    """The state machine's first step: lock, list, cut, write (``services.shard.prepare``).

    Returns:
        ``{manifest: {bucket, key} | None, shards, gpu_nodes, max_concurrency, locked_by}``.
    """
    prepared = service.prepare(
        run,
        at,
        _nodes(runtime),
        _is_gpu(),
        _bucket(settings),
        runtime.state,
        per_shard=settings.gpu_nodes_per_shard,
        lock_seconds=settings.lock_seconds,
    )
    return {
        "manifest": None
        if prepared.manifest is None
        else {"bucket": settings.bucket, "key": prepared.manifest},
        "shards": prepared.shards,
        "gpu_nodes": prepared.gpu_nodes,
        "max_concurrency": settings.max_concurrency,
        "locked_by": prepared.locked_by,
    }


def _signals_reader(runtime: Runtime, at: datetime) -> service.SignalsReader:
    """Reads one shard's series like the whole cluster's read (``collect_live``), scoped to the shard
    (``shard_series_matchers``), joined by a ``ResolvingJoiner`` (a series naming a node of another shard
    is asked about, so it joins as the whole cluster's join would), with the XID facts over the plan's
    window."""
    from rightsizer.domain.health import xid_facts
    from rightsizer.domain.usage import Window
    from rightsizer.services.node_view import ResolvingJoiner
    from rightsizer.services.snapshot import xid_document

    config, policy = runtime.config, runtime.policy()
    floored = _floored(runtime, at)
    request = live.observe_request(config, policy, floored)
    node_label = config.prometheus.node_label
    prom = config.prometheus
    observers = runtime.observers
    reader = cast(NodeReader, runtime.observers.cluster)

    def read(nodes: Sequence[Node], pods: Sequence[Pod]) -> ShardPartial:
        joiner = ResolvingJoiner(nodes, pods, node_label, reader)
        scope = shard_series_matchers(nodes, pods, node_label)

        def collect(seconds: int) -> Any:
            window = Window.ending(floored, seconds, int(prom.step))
            return observers.collect(
                joiner,
                window,
                policy,
                node_label,
                job=prom.job,
                scope=scope,
                deadline_seconds=float(prom.deadline),
                fail_share=0.5,  # most queries failed: the shard fails (and is retried), as a whole read would
            )

        signals = collect(int(policy.idle_window))
        longer = None
        if policy.workloads.scale_to_zero and policy.workloads.idle_window != policy.idle_window:
            longer = collect(int(policy.workloads.idle_window))
        answers = dict(observers.decode_xids(xid_document(observers.metrics, request, scope)))
        # plan() joins the XID answers over the window ending at its own instant (the tick's): the same here
        start = Window.ending(at, policy.idle_window, int(prom.step)).start
        xids = xid_facts(answers, lambda labels: joiner.join(labels).node, start)
        return ShardPartial("", "", (), signals=signals, workload_signals=longer, xids=xids)

    return read


def observe_shard(
    runtime: Runtime, settings: ShardSettings, run: str, at: datetime, spec: ShardSpec
) -> dict[str, Any]:
    """One Distributed Map item (``services.shard.observe_shard``); returns a small summary (the partial
    itself is in S3)."""
    partial = service.observe_shard(
        run, spec, _bucket(settings), runtime.observers.cluster, _signals_reader(runtime, at)
    )
    return {
        "shard": spec.id,
        "nodes": len(partial.nodes),
        "pods": len(partial.pods),
        "devices": sum(len(d) for d in partial.signals.devices.values()),
        "key": service.partial_key(run, spec.id),
    }


def merge_run(runtime: Runtime, settings: ShardSettings, run: str, at: datetime) -> AssessmentSummary:
    """The final step (``services.shard.merge``): the cluster-wide facts, the partials, the assessment."""
    config, policy = runtime.config, runtime.policy()
    request = live.observe_request(config, policy, _floored(runtime, at))
    cluster = runtime.observers.cluster

    def facts(nodes: Sequence[Node], pods: Sequence[Pod]) -> ClusterSnapshot:
        observation = service.cluster_facts(cluster, runtime.inventory, request, nodes, pods)
        snapshot = live.snapshot_from_observation(observation, runtime.observers.decode)
        return dataclasses.replace(snapshot, node_label=config.prometheus.node_label)

    from rightsizer.adapters.shard_codec import RunDecoder

    return service.merge(
        run,
        at,
        runtime.assessment(),
        _bucket(settings),
        facts,
        RunDecoder(),
        lock_seconds=settings.lock_seconds,
    )


def release_run(runtime: Runtime, run: str) -> bool:
    """Give the run lock back after a failed run (``services.shard.release``)."""
    return service.release(run, runtime.state)
