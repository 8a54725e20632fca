"""Joining DCGM series to Kubernetes nodes (docs/architecture.md §3 "Joining series to nodes").

Every method that applies is evaluated; a series maps to a node only when all of them agree. The
``Hostname`` label is a trap (BUG-01: it is often the exporter pod's name, or ``localhost``), so it only
counts when its value is exactly a Node's name, and even then it must agree with the other methods.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rightsizer.domain.model import Node, Pod, PodAddress

NODE_NAME_LABELS = ("node", "kubernetes_node", "Hostname", "hostname")
#: (namespace label, pod label) pairs naming the pod a series belongs to (dcgm-exporter's pod mapping;
#: ``exported_*`` after Prometheus renamed a clash with the scrape target's own labels).
POD_LABEL_PAIRS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))
#: The scrape target's address (``host:port``), Prometheus' own label.
INSTANCE_LABEL = "instance"


def join_label_keys(node_label: str | None = None) -> tuple[str, ...]:
    """Every series label the join reads, in the order it tries them: the configured ``node_label``
    (config ``prometheus.node_label``), ``NODE_NAME_LABELS``, the ``POD_LABEL_PAIRS`` and ``instance``."""
    names = dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS])
    return (*names, *(label for pair in POD_LABEL_PAIRS for label in pair), INSTANCE_LABEL)


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The node a series belongs to, or why it has none (``reason``: ``no_match`` / ``ambiguous:a,b``)."""

    node: str | None
    reason: str | None = None


class NodeJoiner:
    """Maps series labels to node names using the cluster's Nodes and Pods.

    Args:
        nodes: all Nodes (names and InternalIPs).
        pods: all Pods (``spec.nodeName``, ``status.podIP``, phase).
        node_label: the operator's configured node-name label (tried first), e.g. ``"node"``.
        addresses: more pods, known only by what the join reads (the live plan's pods of non-GPU nodes).

    Attributes:
        node_label: as given.
        label_keys: every series label the join reads (``join_label_keys``); a series' other labels
            cannot change its node.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        pods: Iterable[Pod],
        node_label: str | None = None,
        addresses: Iterable[PodAddress] = (),
    ) -> None:
        self._names: set[str] = set()
        self.node_label = node_label
        self.label_keys = join_label_keys(node_label)
        self._labels = tuple(dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS]))
        self._pod_node: dict[tuple[str, str], str] = {}
        self._ip_nodes: dict[str, set[str]] = {}
        self._cache: dict[tuple[tuple[str, str], ...], JoinResult] = {}
        self.add(nodes, pods, addresses)

    def add(self, nodes: Iterable[Node], pods: Iterable[Pod], addresses: Iterable[PodAddress] = ()) -> None:
        """Learn more Nodes and Pods (a one-node view resolving what a series names, issue 11 item 5);
        ``addresses`` are pods known only by what the join reads (``ClusterSnapshot.pod_addresses``)."""
        nodes = list(nodes)
        self._names.update(n.name for n in nodes)
        known = (PodAddress.of(pod) for pod in pods)
        for address in itertools.chain((a for a in known if a is not None), addresses):
            self._pod_node[(address.namespace, address.name)] = address.node
            if address.ip:
                self._ip_nodes.setdefault(address.ip, set()).add(address.node)
        for node in nodes:
            for ip in node.internal_ips:
                self._ip_nodes.setdefault(ip, set()).add(node.name)
        self._cache.clear()

    def unknown_references(
        self, labels: Mapping[str, str]
    ) -> tuple[list[str], list[tuple[str, str]], list[str]]:
        """What ``labels`` name that this joiner does not know: (node-name label values that are no
        known Node, (namespace, pod) pairs of no known Pod, instance hosts of no known Node or Pod).

        A joiner built from one node's view asks the cluster about exactly these (a GET, a selected
        list), so that a series naming another node is still found ambiguous, as the whole cluster's
        join would find it.
        """
        names = [v for label in self._labels if (v := labels.get(label)) and v not in self._names]
        pairs = [
            (ns, pod)
            for ns_label, pod_label in POD_LABEL_PAIRS
            if (ns := labels.get(ns_label))
            and (pod := labels.get(pod_label))
            and (ns, pod) not in self._pod_node
        ]
        instance = labels.get(INSTANCE_LABEL)
        hosts = [host] if instance and (host := _strip_port(instance)) not in self._ip_nodes else []
        return names, pairs, hosts

    def join(self, labels: Mapping[str, str]) -> JoinResult:
        """Resolve one series' labels to a node name (cached per distinct join-relevant label set)."""
        key = tuple([(k, v) for k in self.label_keys if (v := labels.get(k))])
        cached = self._cache.get(key)
        if cached is None:
            cached = self._join(dict(key))
            self._cache[key] = cached
        return cached

    def _join(self, labels: Mapping[str, str]) -> JoinResult:
        found: set[str] = set()
        for label in self._labels:
            value = labels.get(label)
            if value and value in self._names:
                found.add(value)
        for ns_label, pod_label in POD_LABEL_PAIRS:
            ns, pod = labels.get(ns_label), labels.get(pod_label)
            if ns and pod and (ns, pod) in self._pod_node:
                found.add(self._pod_node[(ns, pod)])
        instance = labels.get(INSTANCE_LABEL)
        if instance:
            host = _strip_port(instance)
            found.update(self._ip_nodes.get(host, ()))
        if len(found) == 1:
            return JoinResult(next(iter(found)))
        if not found:
            return JoinResult(None, "no_match")
        return JoinResult(None, "ambiguous:" + ",".join(sorted(found)))


def _strip_port(instance: str) -> str:
    if instance.startswith("["):  # [IPv6]:port
        return instance[1:].split("]", 1)[0]
    if instance.count(":") == 1:
        return instance.rsplit(":", 1)[0]
    return instance


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (backslash and double quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def node_series_matchers(node: Node, pods: Iterable[Pod], node_label: str | None = None) -> tuple[str, ...]:
    """PromQL label matchers that together select every series the join could map to ``node``.

    One matcher per node-name label (the configured ``node_label`` first, then ``NODE_NAME_LABELS``) equal
    to the node's name, and one ``instance`` matcher for every name the node's scrape targets go by: the
    node's name and addresses (``status.addresses``: InternalIP, InternalDNS, Hostname…) and the IPs and
    names of its Running pods, each with or without a port. A series joins a node only through one of
    these labels (or a workload pod's labels, which DCGM series carry beside the exporter's own
    ``instance`` and ``Hostname``), so the union of the selections is the node's series: the per-node
    read of the drain (issue 11 item 5), whose cost does not grow with the cluster. The ``instance``
    names also select the node's exporters' ``up``, whose scrape attempts set the freshness bound
    (``usage.target_of``) — a scrape config that names its targets by node or pod name (a host-network
    exporter, a relabelled ``instance``) is read with its own bound, as the whole cluster's read reads it.
    """
    labels = dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS])
    matchers = [f"{label}={promql_string(node.name)}" for label in labels]
    names = {node.name, *(a.address for a in node.status.addresses if a.address)}
    for p in pods:
        if p.spec.nodeName == node.name and p.status.phase == "Running":
            names.update(n for n in (p.status.podIP, p.metadata.name) if n)
    alternatives = "|".join(re.escape(n) for n in sorted(names))
    pattern = r"\[?(?:" + alternatives + r")\]?(?::[0-9]+)?"  # RE2, anchored by Prometheus
    matchers.append(f"instance=~{promql_string(pattern)}")
    return tuple(matchers)
