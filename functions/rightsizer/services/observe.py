"""The live observation use case: a ``ClusterSnapshot`` read from the cluster, AWS and Prometheus now.

``rightsizer plan --config``, the assess Lambda and the drain's validate/revalidate steps observe through
here. Every collaborator arrives as a parameter (:class:`Observers`, built by ``rightsizer.wiring``): the
Kubernetes and AWS ports, the Prometheus client as a ``MetricsRangeReader``, ``collect_live`` bound to
that client (:class:`SignalCollector`) and the snapshot directory's decoders — the very code
``plan --snapshot`` decodes a written snapshot with, so a live plan and a replayed one cannot drift.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import ClusterSnapshot, MetricData, Node
from rightsizer.domain.policy import Policy
from rightsizer.ports import ClusterReader, MetricsRangeReader, NodeGroupInventory, NodeReader
from rightsizer.services.snapshot import Observation, ObserveRequest

if TYPE_CHECKING:
    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.observation import Shard
    from rightsizer.domain.usage import CollectedSignals, Window

__all__ = [
    "DocumentsDecoder",
    "Observers",
    "SignalCollector",
    "XidDecoder",
    "live_signals",
    "observe_live",
    "observe_node_live",
    "observe_request",
    "snapshot_from_observation",
]


class SignalCollector(Protocol):
    """Per-device signals of a window read live from Prometheus (``adapters.prometheus.collect_live``
    bound to one client; its docstring has the queries, DCGM fields and errors). The joiner may come as
    a ``Future``: the queries then start before it is known (``adapters.prometheus_ahead``)."""

    def __call__(
        self,
        joiner: NodeJoiner | Future[NodeJoiner],
        window: Window,
        policy: Policy,
        node_label: str | None = None,
        *,
        job: str | None = None,
        scope: tuple[str, ...] = (),
        shards: Sequence[Shard] = (),
        deadline_seconds: float | None = None,
        fail_share: float | None = None,
    ) -> CollectedSignals: ...


#: A snapshot directory's documents (relative path → JSON) → the ``ClusterSnapshot`` it holds
#: (``adapters.snapshot_dir.snapshot_from_documents``). Raises ``SnapshotError`` naming the document.
DocumentsDecoder = Callable[[Mapping[str, Any]], ClusterSnapshot]
#: ``xid.json`` → the XID answers by key (``adapters.snapshot_dir.decode_xid_document``).
XidDecoder = Callable[[Any], Mapping[str, MetricData]]


@dataclass(frozen=True)
class Observers:
    """The read side of one cluster: Kubernetes, the AWS inventory (None without an EKS name), the
    Prometheus client as the snapshot's ``MetricsRangeReader`` and as ``collect`` (``collect_live``), and
    the snapshot decoders a live observation is decoded with."""

    cluster: ClusterReader
    inventory: NodeGroupInventory | None
    metrics: MetricsRangeReader
    collect: SignalCollector
    decode: DocumentsDecoder
    decode_xids: XidDecoder


def observe_request(config: Config, policy: Policy, at: datetime) -> ObserveRequest:
    """The observation parameters for ``config`` at ``at``: window from ``policy.idle_window``.

    Raises:
        ConfigError: ``prometheus.step`` is longer than the (possibly overridden) idle window.
    """
    if config.prometheus.step > policy.idle_window:
        raise ConfigError("prometheus.step must be ≤ policy.idle_window", field="prometheus.step")
    return ObserveRequest(
        at=at.replace(microsecond=0),
        window_seconds=int(policy.idle_window),
        step_seconds=int(config.prometheus.step),
        cluster=str(config.cluster.name or config.cluster.context),
        region=config.cluster.region or config.aws.region,
        eks_cluster=config.cluster.name,
        job=config.prometheus.job,
        node_label=config.prometheus.node_label,
    )


def snapshot_from_observation(observation: Observation, decode: DocumentsDecoder) -> ClusterSnapshot:
    """Decode an observation into a ``ClusterSnapshot`` exactly as ``load_snapshot`` would decode its
    written directory, without touching the disk: ``decode`` is the snapshot directory's decoder
    (``snapshot_dir.snapshot_from_documents``), so the two paths cannot drift.

    Raises:
        SnapshotError: a document does not match its schema (names the document and the field).
    """
    return dataclasses.replace(decode(observation.documents), source="live")


def _floored(config: Config, at: datetime) -> datetime:
    """``at`` floored to ``prometheus.step``: range and subquery points then coincide."""
    step = int(config.prometheus.step)
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % step, at.tzinfo)


def live_signals(
    config: Config,
    policy: Policy,
    snapshot: ClusterSnapshot,
    collect: SignalCollector,
    *,
    joiner: NodeJoiner | None = None,
    scope: tuple[str, ...] = (),
) -> ClusterSnapshot:
    """``snapshot`` with ``signals`` read from Prometheus for the window ending at ``taken_at``
    (``collect``: the snapshot's queries, a constant number whatever the node count, docs/architecture.md §8).
    With more GPU nodes than ``prometheus.shard_nodes``, each DCGM query is split into series shards:
    of that many nodes by ``prometheus.node_label`` when it is set (``series_shards``), else by the GPU
    index (label ``gpu``) every DCGM series carries, ⌈GPU nodes / ``shard_nodes``⌉ shards rounded up to
    a power of two, at most 16 (``device_shards``).

    ``joiner`` (default: one over the snapshot's Nodes and Pods) maps series to nodes; ``scope``, when
    given, reads only the series its label matchers select (one node's, ``join.node_series_matchers``).

    Raises:
        PrometheusUnavailable: ``prometheus.deadline`` passed with queries unanswered.
        MetricsFailed: most queries of a whole-cluster read failed.
    """
    from rightsizer.domain.join import NodeJoiner
    from rightsizer.domain.usage import Window

    node_label = config.prometheus.node_label
    window = Window.ending(snapshot.meta.taken_at, policy.idle_window, snapshot.meta.step_seconds)
    shards = () if scope else _shards(config, snapshot.nodes)  # one node's read needs no shards
    joiner = joiner or NodeJoiner(snapshot.nodes, snapshot.pods, node_label, snapshot.pod_addresses)
    signals = collect(
        joiner,
        window,
        policy,
        node_label,
        job=config.prometheus.job,
        shards=shards,
        scope=scope,
        deadline_seconds=float(config.prometheus.deadline),
        # a whole-cluster read with most queries failed is a failed run; one node's read (the drain's
        # validate) keeps its failed metrics as problems: that node is then unknown and not drained
        fail_share=None if scope else 0.5,
    )
    longer = None if scope else _workload_signals(config, policy, snapshot, collect, joiner, shards)
    return dataclasses.replace(snapshot, signals=signals, workload_signals=longer)


def _shards(config: Config, nodes: Sequence[Node]) -> tuple[Shard, ...]:
    """The series shards of a whole-cluster read of ``nodes`` (see :func:`live_signals`)."""
    from rightsizer.domain.catalog import load_catalog
    from rightsizer.domain.gpu import is_gpu_node
    from rightsizer.domain.observation import device_shards, series_shards

    node_label, per_shard = config.prometheus.node_label, config.prometheus.shard_nodes
    catalog = load_catalog()
    gpu_nodes = [n.name for n in nodes if is_gpu_node(n, catalog)]
    if len(gpu_nodes) > per_shard and node_label:
        return series_shards(node_label, gpu_nodes, per_shard)
    if len(gpu_nodes) > per_shard:
        return device_shards(-(-len(gpu_nodes) // per_shard))
    return ()


def _workload_signals(
    config: Config,
    policy: Policy,
    snapshot: ClusterSnapshot,
    collect: SignalCollector,
    joiner: NodeJoiner,
    shards: Sequence[Shard],
) -> CollectedSignals | None:
    """Workload verdicts judge nodes over the workloads' own window (issue 32): one more read, only when
    the policy acts on workloads (docs/workloads.md) over another window than the nodes'."""
    from rightsizer.domain.usage import Window

    if not policy.workloads.scale_to_zero or policy.workloads.idle_window == policy.idle_window:
        return None
    return collect(
        joiner,
        Window.ending(snapshot.meta.taken_at, policy.workloads.idle_window, snapshot.meta.step_seconds),
        policy,
        config.prometheus.node_label,
        job=config.prometheus.job,
        shards=shards,
        deadline_seconds=float(config.prometheus.deadline),
        fail_share=0.5,
    )


class _MetricsAhead:
    """The whole-cluster Prometheus read, started in a thread as soon as the Nodes are listed (the shards
    need only them) while the rest of the Kubernetes read runs; its joiner is handed over when that read
    is done (``adapters.prometheus_ahead``: answers wait for it, bounded). Prometheus works while the
    client decodes the Pods: the assessment's wall is no longer their sum (docs/architecture.md §8)."""

    def __init__(self, config: Config, policy: Policy, collect: SignalCollector, request: ObserveRequest):
        self._config, self._policy, self._collect, self._request = config, policy, collect, request
        self._joiner: Future[NodeJoiner] = Future()
        self._thread: threading.Thread | None = None
        self._shards: tuple[Shard, ...] = ()
        self._outcome: CollectedSignals | BaseException | None = None

    def start(self, nodes: Sequence[Node]) -> None:
        """``observe``'s ``on_nodes``: start the collection over these Nodes' shards."""
        from rightsizer.domain.usage import Window

        request, policy = self._request, self._policy
        window = Window.ending(request.at, policy.idle_window, request.step_seconds)
        self._shards = _shards(self._config, nodes)
        thread = threading.Thread(target=self._run, args=(window,), name="metrics-ahead", daemon=True)
        thread.start()
        self._thread = thread  # only once started: cancel() joins it (a thread that never ran cannot be)

    def _run(self, window: Window) -> None:
        config = self._config
        try:
            self._outcome = self._collect(
                self._joiner,
                window,
                self._policy,
                config.prometheus.node_label,
                job=config.prometheus.job,
                shards=self._shards,
                deadline_seconds=float(config.prometheus.deadline),
                fail_share=0.5,
            )
        except BaseException as exc:  # handed to the caller's thread by finish
            self._outcome = exc

    def cancel(self, cause: BaseException) -> None:
        """The Kubernetes read failed: the collection asks nothing more, and its thread (with its pool) is
        joined before the caller raises ``cause``: no thread or connection outlives the call (a warm
        Lambda would carry them into its next invocation). Queries in flight end within their budget
        (``prometheus.deadline``); the collection's own outcome is dropped."""
        if not self._joiner.done():
            self._joiner.set_exception(cause)
        if self._thread is not None:
            self._thread.join()

    def finish(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` with the collection's signals, once its joiner (from ``snapshot``) is handed over.

        Raises:
            PrometheusUnavailable / MetricsFailed: as :func:`live_signals`.
        """
        from rightsizer.domain.join import NodeJoiner

        node_label = self._config.prometheus.node_label
        try:
            joiner = NodeJoiner(snapshot.nodes, snapshot.pods, node_label, snapshot.pod_addresses)
        except BaseException as exc:  # the collection would wait for a joiner that never comes
            self.cancel(exc)
            raise
        if self._thread is None:  # the Nodes were never announced: read now
            return live_signals(self._config, self._policy, snapshot, self._collect, joiner=joiner)
        self._joiner.set_result(joiner)
        self._thread.join()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        longer = _workload_signals(self._config, self._policy, snapshot, self._collect, joiner, self._shards)
        return dataclasses.replace(snapshot, signals=outcome, workload_signals=longer)


def observe_live(
    config: Config, policy: Policy, observers: Observers, at: datetime, *, floor: bool = True
) -> ClusterSnapshot:
    """A live ``ClusterSnapshot`` at ``at`` (floored to the query step unless ``floor`` is false, so range
    and subquery points coincide) with GPU signals aggregated in Prometheus (:func:`live_signals`'s
    queries and shards). The Prometheus read starts once the Nodes are listed and runs while the Pods
    and the rest are read (:class:`_MetricsAhead`); its answers are reduced once the join is known.

    Raises:
        ConfigError / PermanentError / TransientError / PrometheusUnavailable / MetricsFailed: as
            :func:`observe_request`, ``services.snapshot.observe`` and :func:`live_signals`.
    """
    from rightsizer.services.snapshot import observe

    request = observe_request(config, policy, _floored(config, at) if floor else at)
    ahead = _MetricsAhead(config, policy, observers.collect, request)
    try:
        # Page by page, keeping only what the plan reads (issue 11 item 7): nothing here is written to
        # disk; the Prometheus read starts once the Nodes are listed.
        observation = observe(
            observers.cluster, observers.inventory, None, request, project=True, on_nodes=ahead.start
        )
        snapshot = _with_xids(snapshot_from_observation(observation, observers.decode), observers, request)
    except BaseException as exc:
        ahead.cancel(exc)
        raise
    return ahead.finish(snapshot)


def _with_xids(
    snapshot: ClusterSnapshot, observers: Observers, request: ObserveRequest, scope: tuple[str, ...] = ()
) -> ClusterSnapshot:
    """``snapshot`` with the XID answers read live (``services.snapshot.xid_document``, issue 28): the same
    two queries and the same decoding as a written snapshot's ``xid.json``."""
    from rightsizer.services.snapshot import xid_document

    answers = observers.decode_xids(xid_document(observers.metrics, request, scope))
    return dataclasses.replace(snapshot, xid_answers=answers)


def observe_node_live(
    config: Config,
    policy: Policy,
    observers: Observers,
    node: str,
    at: datetime,
    *,
    range_metrics: MetricsRangeReader | None = None,
) -> ClusterSnapshot:
    """One node's ``ClusterSnapshot`` at ``at``, read without any cluster-wide list or query
    (``services.node_view``; the drain's validate and revalidate steps, issue 11 item 5).

    Live (``range_metrics`` None), ``at`` is floored to the query step and the node's series are read
    with ``collect(scope=…)``; with ``range_metrics`` (the demo) the node's series are asked as
    snapshot files. Either way a :class:`~rightsizer.services.node_view.ResolvingJoiner` maps them.

    Raises:
        PermanentError / TransientError: a Kubernetes or AWS read failed.
        PrometheusUnavailable: ``prometheus.deadline`` passed with queries unanswered.
    """
    from rightsizer.domain.join import node_series_matchers
    from rightsizer.domain.observation import signals_from_observation
    from rightsizer.domain.usage import Window
    from rightsizer.services.node_view import ResolvingJoiner, observe_node

    if range_metrics is None:
        at = _floored(config, at)
    reader = cast(NodeReader, observers.cluster)
    request = observe_request(config, policy, at)
    snapshot = snapshot_from_observation(
        observe_node(reader, observers.inventory, range_metrics, request, node), observers.decode
    )
    here = next((n for n in snapshot.nodes if n.name == node), None)
    if here is None:
        return snapshot
    node_label = config.prometheus.node_label
    joiner = ResolvingJoiner(snapshot.nodes, snapshot.pods, node_label, reader)
    if range_metrics is not None:
        files = {"step": snapshot.metrics, "timestamp": snapshot.timestamps, **snapshot.metric_extras}
        window = Window.ending(snapshot.meta.taken_at, policy.idle_window, snapshot.meta.step_seconds)
        signals = signals_from_observation(files, joiner, window, float(policy.gpu_activity_max_pct))
        return dataclasses.replace(snapshot, signals=signals)
    scope = node_series_matchers(here, snapshot.pods, node_label)
    snapshot = _with_xids(snapshot, observers, request, scope)
    return live_signals(config, policy, snapshot, observers.collect, joiner=joiner, scope=scope)
