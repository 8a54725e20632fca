"""One cluster's assessment cut into shards and merged back (issue 33 item 3, docs/architecture.md §2
"Sharded assessment"): the pure parts.

A cluster larger than ``sharding.above_gpu_nodes`` GPU nodes is assessed by a Step Functions Distributed
Map: each shard reads only its own GPU nodes' pods (``fieldSelector=spec.nodeName=<node>``) and DCGM series
(:func:`shard_series_matchers`), reduces them to per-device facts and writes a :class:`ShardPartial`; one
final step reads the cluster-wide facts once (Nodes, unscheduled pods, PodDisruptionBudgets, volumes, DRA,
the AWS inventory) and :func:`merge_shards` puts them and every partial back into the one
``ClusterSnapshot`` the unsharded assessment would have observed, which the unchanged ``plan()`` decides.
Budgets, PDBs and the placement check therefore see the whole cluster, and the plan is the unsharded plan
(``tests/unit/test_shard_properties.py``).

Shards are cut by node group (``eks.amazonaws.com/nodegroup``): whole groups packed in name order up to
``per_shard`` nodes, a larger group (and the nodes of no group) cut into node-name ranges.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass as pydantic_dataclass

from rightsizer.domain.join import NODE_NAME_LABELS, promql_string
from rightsizer.domain.model import NODEGROUP_LABEL, ClusterSnapshot, Node, Pod
from rightsizer.domain.usage import CollectedSignals

#: The node-group label shards are cut by (EKS managed node groups set it on every Node they launch).
SHARD_GROUP_LABEL: Final = NODEGROUP_LABEL


class ShardSpec(BaseModel):
    """One shard: a Distributed Map item (small: the child execution's input is limited to 256 KiB).

    Attributes:
        id: ``s0000``…, in cut order; names the shard's objects in S3 (a retried shard overwrites its own).
        node_groups: the node groups whose GPU nodes are (some of) ``nodes``; empty for a name range of
            nodes in no group.
        nodes: the shard's GPU node names, sorted (the first and last bound its name range).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^s[0-9]{4,}$")
    node_groups: tuple[str, ...] = ()
    nodes: tuple[str, ...] = Field(min_length=1)


def cut_shards(gpu_nodes: Iterable[Node], per_shard: int) -> list[ShardSpec]:
    """The GPU nodes cut into shards of at most ``per_shard`` nodes (every node in exactly one shard).

    Whole node groups (by name) are packed into a shard while they fit; a group larger than ``per_shard``
    gets shards of its own, consecutive node-name ranges; nodes of no group come last, in name ranges.

    Raises:
        ValueError: ``per_shard`` < 1.
    """
    if per_shard < 1:
        raise ValueError(f"per_shard must be ≥ 1, got {per_shard}")
    groups: dict[str, list[str]] = {}
    loose: list[str] = []
    for node in gpu_nodes:
        group = node.labels.get(SHARD_GROUP_LABEL)
        (groups.setdefault(group, []) if group else loose).append(node.name)
    cuts: list[tuple[tuple[str, ...], list[str]]] = []
    open_groups: list[str] = []
    open_nodes: list[str] = []

    def close() -> None:
        if open_nodes:
            cuts.append((tuple(open_groups), sorted(open_nodes)))
        open_groups.clear()
        open_nodes.clear()

    for name in sorted(groups):
        members = sorted(set(groups[name]))
        if len(members) > per_shard:
            close()
            for i in range(0, len(members), per_shard):
                cuts.append(((name,), members[i : i + per_shard]))
            continue
        if len(open_nodes) + len(members) > per_shard:
            close()
        open_groups.append(name)
        open_nodes.extend(members)
    close()
    names = sorted(set(loose))
    cuts += [((), names[i : i + per_shard]) for i in range(0, len(names), per_shard)]
    return [ShardSpec(id=f"s{i:04d}", node_groups=g, nodes=tuple(n)) for i, (g, n) in enumerate(cuts)]


def shard_series_matchers(
    nodes: Sequence[Node], pods: Iterable[Pod], node_label: str | None
) -> tuple[str, ...]:
    """PromQL label matchers whose selections together hold every series the join could map to one of
    ``nodes``: ``join.node_series_matchers`` for a set of nodes (one query per matcher; the answers are
    merged by union, so a series two matchers select is counted once).

    One ``<label>=~"n1|n2|…"`` per node-name label (``node_label`` first, then ``NODE_NAME_LABELS``) and one
    ``instance`` matcher over every name the nodes' scrape targets go by (names, addresses, and the IPs and
    names of Running DaemonSet pods — a per-node exporter is one — each with or without a port; the
    one-node read takes every Running pod's, which for a thousand nodes would make a regex of every pod).
    """
    names = sorted(n.name for n in nodes)
    alternatives = "|".join(re.escape(n) for n in names)
    labels = dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS])
    matchers = [f"{label}=~{promql_string(alternatives)}" for label in labels]
    here = set(names)
    targets = set(names)
    for node in nodes:
        targets.update(a.address for a in node.status.addresses if a.address)
    for pod in pods:
        owner = pod.controller
        if (
            pod.spec.nodeName in here
            and pod.status.phase == "Running"
            and owner
            and owner.kind == "DaemonSet"
        ):
            targets.update(n for n in (pod.status.podIP, pod.metadata.name) if n)
    pattern = r"\[?(?:" + "|".join(re.escape(n) for n in sorted(targets)) + r")\]?(?::[0-9]+)?"
    matchers.append(f"instance=~{promql_string(pattern)}")
    return tuple(matchers)


XidFacts = Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]


#: The partial's format: 2 writes non-finite floats as the strings ``"NaN"``, ``"Infinity"``,
#: ``"-Infinity"`` (the body is strict JSON, so the merge decodes its pods from bytes,
#: ``adapters.shard_codec``) and says ``"format": 2``; 1 (no ``format`` field) wrote them as the bare
#: constants ``NaN``/``Infinity`` only Python's ``json`` reads. The merge reads both (a shard of the
#: previous release may have written a run's partial).
PARTIAL_FORMAT: Final = 2


@pydantic_dataclass(frozen=True, config=ConfigDict(ser_json_inf_nan="strings"))
class ShardPartial:
    """What one shard observed (written to S3 as JSON by :data:`PARTIAL_CODEC`, format
    :data:`PARTIAL_FORMAT`).

    Attributes:
        run: the sharded run (Step Functions execution name) it belongs to.
        shard: the :class:`ShardSpec` id.
        nodes: the shard's GPU node names it was asked for.
        pods: the pods bound to those nodes (``fieldSelector=spec.nodeName=<node>``, all namespaces).
        signals: the nodes' device signals over the decision window (``collect_live`` scoped to the
            shard's series); a query that failed for the shard is a problem of its nodes only.
        workload_signals: the same over ``workloads.idle_window`` when the policy reads it, else None.
        xids: node → XID facts (``domain.health.xid_facts``) of the shard's nodes.
        format: the body's format (:data:`PARTIAL_FORMAT` when written by this release).
    """

    run: str
    shard: str
    nodes: tuple[str, ...]
    pods: tuple[Pod, ...] = ()
    signals: CollectedSignals = field(default_factory=CollectedSignals)
    workload_signals: CollectedSignals | None = None
    xids: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    format: int = PARTIAL_FORMAT


#: JSON codec of a partial; NaN and ±Inf (a non-finite sample's facts) survive as JSON strings.
PARTIAL_CODEC: Final = TypeAdapter(ShardPartial)
#: JSON codec of a run's shard list (the Distributed Map's items).
SPECS_CODEC: Final = TypeAdapter(list[ShardSpec])


class ShardsIncomplete(ValueError):
    """The merge lacks a shard's partial, or a partial does not answer its shard: no plan is made."""


def _scoped(signals: CollectedSignals, nodes: tuple[str, ...]) -> CollectedSignals:
    """A shard's signals with its collection-wide problems made problems of its own nodes."""
    if not signals.problems:
        return signals
    node_problems = dict(signals.node_problems)
    for node in nodes:
        node_problems[node] = tuple(dict.fromkeys((*signals.problems, *node_problems.get(node, ()))))
    return dataclasses.replace(signals, problems=(), node_problems=node_problems)


def merge_signals(parts: Sequence[tuple[tuple[str, ...], CollectedSignals]]) -> CollectedSignals:
    """The union of disjoint shards' signals (each a set of nodes and what was read for them): devices,
    ``up`` coverage and node problems by node, unmapped series in shard order, ``present`` families by
    union — what one unsharded read of the same series gives (``SeriesShard``'s merge rule)."""
    out = CollectedSignals()
    present: set[str] = set()
    for nodes, signals in parts:
        scoped = _scoped(signals, nodes)
        out.devices.update(scoped.devices)
        out.up_coverage.update(scoped.up_coverage)
        out.node_problems.update(scoped.node_problems)
        out.unmapped.extend(scoped.unmapped)
        present |= scoped.present
    return dataclasses.replace(out, present=frozenset(present))


def merge_shards(
    base: ClusterSnapshot, specs: Sequence[ShardSpec], partials: Iterable[ShardPartial]
) -> ClusterSnapshot:
    """``base`` (the cluster-wide facts: every Node, the unscheduled pods, PDBs, volumes, DRA objects, the
    inventory, workload owners) with every shard's pods, signals and XID facts: the snapshot one unsharded
    observation gives.

    A partial is taken once per shard id (a retried shard rewrote its own object: nothing counts twice);
    pods are in the API's list order (namespace, name) whatever the shard order.

    Raises:
        ShardsIncomplete: a shard has no partial, a partial answers another node set than its shard, or
            a partial names a shard that is not in ``specs``.
    """
    wanted = {s.id: s for s in specs}
    taken: dict[str, ShardPartial] = {}
    for partial in partials:
        spec = wanted.get(partial.shard)
        if spec is None:
            raise ShardsIncomplete(f"partial of unknown shard {partial.shard!r}")
        if tuple(partial.nodes) != spec.nodes:
            raise ShardsIncomplete(f"shard {spec.id}: partial answers other nodes than the shard's")
        taken[spec.id] = partial
    missing = sorted(set(wanted) - set(taken))
    if missing:
        raise ShardsIncomplete(f"no partial for shard(s) {', '.join(missing[:10])}")
    ordered = [taken[s.id] for s in specs]
    sharded = {n for s in specs for n in s.nodes}
    pods = [p for p in base.pods if p.spec.nodeName not in sharded]
    pods += [p for part in ordered for p in part.pods]
    pods.sort(key=lambda p: (p.metadata.namespace, p.metadata.name))
    signals = merge_signals([(p.nodes, p.signals) for p in ordered])
    longer: CollectedSignals | None = None
    if any(p.workload_signals is not None for p in ordered):
        longer = merge_signals([(p.nodes, p.workload_signals or CollectedSignals()) for p in ordered])
    xids: dict[str, Any] = {}
    for part in ordered:
        xids.update(part.xids)
    return dataclasses.replace(
        base, pods=tuple(pods), signals=signals, workload_signals=longer, xids=xids, source="live"
    )
