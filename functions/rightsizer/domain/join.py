"""Joining DCGM series to Kubernetes nodes (docs/architecture.md §3 "Joining series to nodes").

Every method that applies is evaluated; a series maps to a node only when all of them agree. The
``Hostname`` label is a trap (BUG-01: it is often the exporter pod's name, or ``localhost``), so it only
counts when its value is exactly a Node's name, and even then it must agree with the other methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rightsizer.domain.model import Node, Pod

NODE_NAME_LABELS = ("node", "kubernetes_node", "Hostname", "hostname")
_POD_LABEL_PAIRS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))


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
    """

    def __init__(self, nodes: Iterable[Node], pods: Iterable[Pod], node_label: str | None = None) -> None:
        self._names = {n.name for n in nodes}
        self._labels = tuple(dict.fromkeys([*([node_label] if node_label else []), *NODE_NAME_LABELS]))
        self._pod_node: dict[tuple[str, str], str] = {}
        ip_nodes: dict[str, set[str]] = {}
        for pod in pods:
            if pod.spec.nodeName:
                self._pod_node[(pod.metadata.namespace, pod.metadata.name)] = pod.spec.nodeName
                if pod.status.phase == "Running" and pod.status.podIP:
                    ip_nodes.setdefault(pod.status.podIP, set()).add(pod.spec.nodeName)
        for node in nodes:
            for ip in node.internal_ips:
                ip_nodes.setdefault(ip, set()).add(node.name)
        self._ip_nodes = ip_nodes
        self._cache: dict[tuple[tuple[str, str], ...], JoinResult] = {}

    def join(self, labels: Mapping[str, str]) -> JoinResult:
        """Resolve one series' labels to a node name (cached per distinct join-relevant label set)."""
        key = tuple(
            (k, labels[k])
            for k in (*self._labels, "namespace", "pod", "exported_namespace", "exported_pod", "instance")
            if labels.get(k)
        )
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
        for ns_label, pod_label in _POD_LABEL_PAIRS:
            ns, pod = labels.get(ns_label), labels.get(pod_label)
            if ns and pod and (ns, pod) in self._pod_node:
                found.add(self._pod_node[(ns, pod)])
        instance = labels.get("instance")
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
