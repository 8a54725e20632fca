"""Would the pods a drain evicts find a node? A pure placement simulation over a snapshot (issue 29).

Modelled on Cluster Autoscaler's removal simulator (``simulator/cluster.go``: the pods of the nodes to
remove are scheduled, one by one, on a cluster snapshot in which every placement is committed before the
next is tried) and Karpenter's consolidation (``pkg/controllers/disruption``: a node is removed only when
its reschedulable pods fit the rest of the cluster). Requests decide, never measured use: an exclusive GPU
cannot be shared by measuring it.

A target must be schedulable, Ready, initialised (a GPU node whose GPU allocatable is present), not being
deleted and not tainted for removal (``ToBeDeletedByClusterAutoscaler``, ``karpenter.sh/disrupted``); then
the pod's filters, in kube-scheduler order: taints, nodeSelector and required node affinity, zonal
volumes, host ports, the pod count, cpu, memory, GPUs / MIG profiles / other extended resources, DRA
devices, required pod anti-affinity (both ways), required pod affinity, topology spread
``DoNotSchedule``. The first filter that refuses is the node's cause; a pod that fits nowhere reports the
cause of the node it came closest on (the latest filter reached), typed (:data:`CAUSES`).

Scale: targets are indexed (by free whole GPUs, by nodeSelector label, by extended resource), pods try
them fullest first and stop at the first fit, topology counts are kept per selector and updated on
every commit, and a pod whose twin already fit nowhere is not tried again: a drain's check costs the
pods it moves times the targets they try, not the cluster's pods times its nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rightsizer.domain.model import LabelSelector, Node, Taint, Toleration, is_gpu_resource
from rightsizer.domain.placement_demand import (
    ANY_IP,
    CPU,
    MEMORY,
    PODS,
    Demand,
    resource_units,
    spread_selector,
    term_namespaces,
)

Cause = Literal[
    "gpu",
    "mig",
    "dra",
    "cpu",
    "memory",
    "pods",
    "taint",
    "affinity",
    "anti_affinity",
    "spread",
    "volume_zone",
    "host_port",
    "unknown",
]
CAUSES: tuple[Cause, ...] = (
    "gpu", "mig", "dra", "cpu", "memory", "pods", "taint", "affinity", "anti_affinity", "spread",
    "volume_zone", "host_port", "unknown",
)  # fmt: skip
GPU = "nvidia.com/gpu"
REMOVAL_TAINTS = frozenset({"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"})
#: kubelet's default ``--max-pods``: the pod count of a node whose allocatable omits ``pods``.
DEFAULT_MAX_PODS = 110
_NON_GPU = -1


@dataclass(frozen=True, slots=True)
class Move:
    """``pod`` (namespace/name) lands on node ``to``."""

    pod: str
    to: str


@dataclass(frozen=True, slots=True)
class Unplaced:
    """``pod`` fits on no target; ``cause`` is typed, ``detail`` says where it came closest."""

    pod: str
    cause: Cause
    detail: str

    @property
    def reason(self) -> str:
        """``no_placement:<namespace>/<pod>:<cause>`` (docs/architecture.md §3 reason codes)."""
        return f"no_placement:{self.pod}:{self.cause}"


@dataclass(frozen=True, slots=True)
class Placement:
    """The outcome for the pods to move: where each lands, or why it lands nowhere."""

    moves: tuple[Move, ...]
    unplaced: tuple[Unplaced, ...]

    @property
    def ok(self) -> bool:
        """Every pod that must move found a node."""
        return not self.unplaced


def _units(values: Mapping[str, str]) -> dict[str, int]:
    return {name: resource_units(name, value) for name, value in values.items()}


def target_refusal(node: Node) -> str | None:
    """Why ``node`` may receive no pod, or None (module docstring: schedulable, Ready, initialised, not
    being removed)."""
    if node.metadata.deletionTimestamp is not None:
        return "being deleted"
    if node.spec.unschedulable:
        return "cordoned"
    removal = next((t.key for t in node.spec.taints if t.key in REMOVAL_TAINTS), None)
    if removal:
        return f"tainted {removal}"
    if not any(c.type == "Ready" and c.status == "True" for c in node.status.conditions):
        return "not Ready"
    has_gpus = node.labels.get("nvidia.com/gpu.present") == "true" or any(
        is_gpu_resource(k) and resource_units(k, v) > 0 for k, v in node.status.capacity.items()
    )
    if has_gpus and not any(
        is_gpu_resource(k) and resource_units(k, v) > 0 for k, v in node.status.allocatable.items()
    ):
        return "GPUs not initialised (no GPU allocatable)"
    return None


def _tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    for tol in tolerations:
        if tol.effect and tol.effect != taint.effect:
            continue
        if tol.operator == "Exists":
            if not tol.key or tol.key == taint.key:
                return True
        elif tol.key == taint.key and (tol.value or "") == taint.value:
            return True
    return False


class _NodeState:
    __slots__ = ("allocatable", "dra_free", "labels", "name", "node", "ports", "taints", "used")

    def __init__(self, node: Node, dra_free: Mapping[str, int]) -> None:
        self.node = node
        self.name = node.name
        self.labels = node.labels
        self.taints = tuple(t for t in node.spec.taints if t.effect in ("NoSchedule", "NoExecute"))
        self.allocatable = _units(node.status.allocatable)
        self.allocatable.setdefault(PODS, DEFAULT_MAX_PODS)
        self.used: dict[str, int] = {}
        self.ports: dict[tuple[str, int, str], int] = {}
        self.dra_free = dict(dra_free)

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.used.get(resource, 0)

    def bucket(self) -> int:
        return self.free(GPU) if self.allocatable.get(GPU, 0) > 0 else _NON_GPU


def _resource_cause(name: str) -> Cause:
    if name == PODS:
        return "pods"
    if name == CPU:
        return "cpu"
    if name == MEMORY:
        return "memory"
    if name.startswith("nvidia.com/mig-"):
        return "mig"
    if is_gpu_resource(name):
        return "gpu"
    return "unknown"


def _port_conflict(wanted: frozenset[tuple[str, int, str]], held: Mapping[tuple[str, int, str], int]) -> bool:
    for ip, port, proto in wanted:
        for h_ip, h_port, h_proto in held:
            if port == h_port and proto == h_proto and (ip == h_ip or ANY_IP in (ip, h_ip)):
                return True
    return False


_Key = tuple[frozenset[str] | None, str, str]


class PlacementState:
    """A cluster as the scheduler would see it, mutable by commits that can be undone.

    Args:
        nodes: every Node of the cluster (targets are those :func:`target_refusal` accepts).
        placed: (node name, demand) of every pod bound to a node and not finished.
        dra_free: node → DRA driver → devices on the node's ResourceSlices not allocated to a claim.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        placed: Iterable[tuple[str, Demand]],
        *,
        dra_free: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self._nodes = {n.name: _NodeState(n, (dra_free or {}).get(n.name, {})) for n in nodes}
        self._targets: set[str] = {n.name for n in nodes if target_refusal(n) is None}
        self._removed: set[str] = set()
        self._pods: dict[str, tuple[str, Demand]] = {}
        self._pending: set[str] = set()
        self._counts: dict[_Key, dict[str, int]] = {}
        self._selectors: dict[_Key, LabelSelector] = {}
        # topologyKey → domain value → keys of the placed pods whose required anti-affinity has that key
        self._anti: dict[str, dict[str, set[str]]] = {}
        self._on_node: dict[str, set[str]] = {}  # node → keys of the pods placed there
        self._domains: dict[tuple[object, ...], set[str]] = {}
        self._buckets: dict[int, set[str]] = {}
        self._sorted: dict[int, list[str]] = {}
        self._by_label: dict[tuple[str, str], set[str]] = {}
        self._by_resource: dict[str, set[str]] = {}
        self._journal: list[tuple[str, str, str, Demand | None]] = []
        self._failed: dict[tuple[object, ...], Unplaced] = {}
        for name in sorted(self._targets):
            state = self._nodes[name]
            for item in state.labels.items():
                self._by_label.setdefault(item, set()).add(name)
            for resource, amount in state.allocatable.items():
                if amount > 0 and resource not in (CPU, MEMORY, PODS, GPU):
                    self._by_resource.setdefault(resource, set()).add(name)
        for node, demand in placed:
            if node in self._nodes:
                self._add(demand, node)
        for name in self._targets:
            self._bucket_add(name)

    # ------------------------------------------------------------------ indexes
    def _bucket_add(self, name: str) -> None:
        b = self._nodes[name].bucket()
        self._buckets.setdefault(b, set()).add(name)
        self._sorted.pop(b, None)

    def _bucket_drop(self, name: str) -> None:
        b = self._nodes[name].bucket()
        self._buckets.get(b, set()).discard(name)
        self._sorted.pop(b, None)

    def _bucket_names(self, b: int) -> list[str]:
        names = self._sorted.get(b)
        if names is None:
            names = self._sorted[b] = sorted(self._buckets.get(b, ()))
        return names

    def _candidates(self, d: Demand) -> Iterator[str]:
        """Targets in trial order: fullest first (non-GPU nodes first for a pod wanting no whole GPU),
        then by name; only nodes with the pod's nodeSelector labels and extended resources."""
        sets = [self._by_label.get(item, set()) for item in d.node_selector.items()]
        sets += [self._by_resource.get(r, set()) for r in d.resources if r not in (CPU, MEMORY, PODS, GPU)]
        if sets:
            chosen = set.intersection(*sets) & self._targets if len(sets) > 1 else sets[0] & self._targets
            yield from sorted(chosen, key=lambda n: (self._nodes[n].bucket(), n))
            return
        want = d.gpus
        for b in sorted(self._buckets):
            if b >= want or (want == 0 and b == _NON_GPU):
                yield from list(self._bucket_names(b))

    def _track(self, d: Demand, node: str, sign: int) -> None:
        labels = self._nodes[node].labels
        for ckey, counts in self._counts.items():
            namespaces, _json, key = ckey
            value = labels.get(key)
            if value is None or (namespaces is not None and d.namespace not in namespaces):
                continue
            if self._selectors[ckey].matches(dict(d.labels)):
                counts[value] = counts.get(value, 0) + sign
        for term in d.anti_affinity:
            value = labels.get(term.topologyKey)
            if value is not None:
                holders = self._anti.setdefault(term.topologyKey, {}).setdefault(value, set())
                (holders.add if sign > 0 else holders.discard)(d.key)
        on_node = self._on_node.setdefault(node, set())
        (on_node.add if sign > 0 else on_node.discard)(d.key)

    def _count(self, namespaces: frozenset[str] | None, selector: LabelSelector, key: str) -> dict[str, int]:
        ckey = (namespaces, selector.model_dump_json(), key)
        counts = self._counts.get(ckey)
        if counts is None:
            counts = {}
            for node, d in self._pods.values():
                value = self._nodes[node].labels.get(key)
                if value is None or (namespaces is not None and d.namespace not in namespaces):
                    continue
                if selector.matches(dict(d.labels)):
                    counts[value] = counts.get(value, 0) + 1
            self._counts[ckey] = counts
            self._selectors[ckey] = selector
        return counts

    # ------------------------------------------------------------------ commits
    def _add(self, d: Demand, node: str) -> None:
        state = self._nodes[node]
        for r, amount in d.resources.items():
            state.used[r] = state.used.get(r, 0) + amount
        for port in d.host_ports:
            state.ports[port] = state.ports.get(port, 0) + 1
        for _cls, driver, count in d.dra:
            state.dra_free[driver] = state.dra_free.get(driver, 0) - count
        self._pods[d.key] = (node, d)
        self._track(d, node, +1)

    def _drop(self, key: str) -> tuple[str, Demand]:
        node, d = self._pods.pop(key)
        state = self._nodes[node]
        for r, amount in d.resources.items():
            state.used[r] = state.used.get(r, 0) - amount
        for port in d.host_ports:
            state.ports[port] -= 1
            if state.ports[port] <= 0:
                del state.ports[port]
        for _cls, driver, count in d.dra:
            state.dra_free[driver] = state.dra_free.get(driver, 0) + count
        self._track(d, node, -1)
        return node, d

    def _commit(self, d: Demand, node: str) -> None:
        target = node in self._targets
        if target:
            self._bucket_drop(node)
        self._add(d, node)
        if target:
            self._bucket_add(node)
        self._journal.append(("add", d.key, node, None))

    def _uncommit(self, key: str) -> None:
        node = self._pods[key][0]
        target = node in self._targets
        if target:
            self._bucket_drop(node)
        node, d = self._drop(key)
        if target:
            self._bucket_add(node)
        self._journal.append(("drop", key, node, d))

    def _remove_node(self, name: str) -> None:
        if name in self._targets:
            self._bucket_drop(name)
            self._targets.discard(name)
            self._journal.append(("untarget", "", name, None))
        self._removed.add(name)
        self._domains.clear()
        self._journal.append(("remove", "", name, None))

    def mark(self) -> int:
        """A point to :meth:`undo` back to."""
        return len(self._journal)

    def undo(self, mark: int) -> None:
        """Undo every commit and removal made since ``mark``."""
        while len(self._journal) > mark:
            op, key, node, d = self._journal.pop()
            if op == "add":
                self._bucket_drop(node) if node in self._targets else None
                self._drop(key)
                self._bucket_add(node) if node in self._targets else None
            elif op == "drop":
                assert d is not None
                self._bucket_drop(node) if node in self._targets else None
                self._add(d, node)
                self._bucket_add(node) if node in self._targets else None
            elif op == "untarget":
                self._targets.add(node)
                self._bucket_add(node)
            else:
                self._removed.discard(node)
        self._domains.clear()
        self._failed.clear()

    # ------------------------------------------------------------------ filters
    def _spread_domains(self, d: Demand, key: str, honor_affinity: bool, honor_taints: bool) -> set[str]:
        affinity = d.node_affinity.model_dump_json() if d.node_affinity is not None else ""
        dkey = (
            key,
            honor_affinity and (tuple(sorted(d.node_selector.items())), affinity),
            honor_taints and tuple(t.model_dump_json() for t in d.tolerations),
        )
        found = self._domains.get(dkey)
        if found is None:
            found = set()
            for state in self._nodes.values():
                value = state.labels.get(key)
                if value is None or state.name in self._removed:
                    continue
                if honor_affinity and not self._node_matches(d, state):
                    continue
                if honor_taints and not all(_tolerated(t, d.tolerations) for t in state.taints):
                    continue
                found.add(value)
            self._domains[dkey] = found
        return found

    @staticmethod
    def _node_matches(d: Demand, state: _NodeState) -> bool:
        if any(state.labels.get(k) != v for k, v in d.node_selector.items()):
            return False
        return d.node_affinity is None or d.node_affinity.matches(state.node)

    def _refusal(self, d: Demand, state: _NodeState) -> tuple[int, Cause, str] | None:
        """The first filter of ``state`` that refuses ``d``: (depth, cause, message), or None."""
        for taint in state.taints:
            if not _tolerated(taint, d.tolerations):
                return 0, "taint", f"taint {taint.key}={taint.value}:{taint.effect} not tolerated"
        if not self._node_matches(d, state):
            return 1, "affinity", "nodeSelector / required node affinity do not match"
        for claim, selector in d.volume_affinity:
            if not selector.matches(state.node):
                return 2, "volume_zone", f"volume of claim {claim} is not reachable from it"
        if d.host_ports and _port_conflict(d.host_ports, state.ports):
            return 3, "host_port", "a host port is taken"
        for resource in (PODS, CPU, MEMORY, *sorted(d.resources)):
            want = d.resources.get(resource, 0)
            if want and state.free(resource) < want:
                return 4, _resource_cause(resource), f"{resource}: {want} wanted, {state.free(resource)} free"
        by_driver: dict[str, int] = {}
        for _cls, driver, count in d.dra:
            by_driver[driver] = by_driver.get(driver, 0) + count
        for driver, count in sorted(by_driver.items()):
            if state.dra_free.get(driver, 0) < count:
                return 5, "dra", f"{count} {driver} devices wanted, {state.dra_free.get(driver, 0)} free"
        anti = self._anti_refusal(d, state)
        if anti:
            return 6, "anti_affinity", anti
        if self._affinity_refused(d, state):
            return 7, "affinity", "no pod matching its required pod affinity in the node's topology domain"
        spread = self._spread_refusal(d, state)
        if spread:
            return 8, "spread", spread
        return None

    def _affinity_refused(self, d: Demand, state: _NodeState) -> bool:
        for term in d.affinity:
            value = state.labels.get(term.topologyKey)
            wanted = term.labelSelector or LabelSelector()
            counts = self._count(term_namespaces(term, d.namespace), wanted, term.topologyKey)
            if value is not None and counts.get(value, 0) > 0:
                continue
            # The first pod of a group that selects itself may go anywhere (kube-scheduler InterPodAffinity).
            own = term_namespaces(term, d.namespace)
            first = not any(counts.values()) and (own is None or d.namespace in own)
            if not (first and value is not None and wanted.matches(dict(d.labels))):
                return True
        return False

    def _spread_refusal(self, d: Demand, state: _NodeState) -> str | None:
        for c in d.spread:
            if c.labelSelector is None and not c.matchLabelKeys:
                continue  # a nil selector matches no pod: nothing to spread
            value = state.labels.get(c.topologyKey)
            if value is None:
                return f"no {c.topologyKey} label"
            wanted = spread_selector(c, d.labels)
            counts = self._count(frozenset({d.namespace}), wanted, c.topologyKey)
            domains = self._spread_domains(
                d, c.topologyKey, c.nodeAffinityPolicy != "Ignore", c.nodeTaintsPolicy == "Honor"
            )
            floor = min((counts.get(v, 0) for v in domains), default=0)
            if c.minDomains is not None and len(domains) < c.minDomains:
                floor = 0
            skew = counts.get(value, 0) + (1 if wanted.matches(dict(d.labels)) else 0) - floor
            if skew > c.maxSkew:
                return f"{c.topologyKey}={value} skew {skew} > maxSkew {c.maxSkew}"
        return None

    def _anti_refusal(self, d: Demand, state: _NodeState) -> str | None:
        for term in d.anti_affinity:
            value = state.labels.get(term.topologyKey)
            if value is None:
                continue
            counts = self._count(
                term_namespaces(term, d.namespace), term.labelSelector or LabelSelector(), term.topologyKey
            )
            if counts.get(value, 0) > 0:
                return f"a pod matching its required anti-affinity runs in {term.topologyKey}={value}"
        for key, domains in self._anti.items():
            value = state.labels.get(key)
            if value is None:
                continue
            for holder in sorted(domains.get(value, ())):
                h = self._pods[holder][1]
                for term in h.anti_affinity:
                    namespaces = term_namespaces(term, h.namespace)
                    if (
                        term.topologyKey == key
                        and (namespaces is None or d.namespace in namespaces)
                        and (term.labelSelector or LabelSelector()).matches(dict(d.labels))
                    ):
                        return f"pod {holder} forbids it in {key}={value} (required anti-affinity)"
        return None

    # ------------------------------------------------------------------ placing
    def place(self, d: Demand) -> Move | Unplaced:
        """Place one pod on the first target that admits it and commit it there (undoable)."""
        if d.unverifiable:
            return Unplaced(d.key, "unknown", f"cannot verify: {d.unverifiable}")
        signature = d.signature()
        if signature is not None and signature in self._failed:
            seen = self._failed[signature]
            return Unplaced(d.key, seen.cause, seen.detail)
        best: tuple[int, Cause, str, str] | None = None
        tried = 0
        for name in self._candidates(d):
            tried += 1
            refusal = self._refusal(d, self._nodes[name])
            if refusal is None:
                self._commit(d, name)
                return Move(d.key, name)
            if best is None or refusal[0] > best[0]:
                best = (*refusal, name)
        if best is None:
            cause: Cause = "affinity" if d.node_selector else "gpu" if d.gpus else "unknown"
            for r in d.resources:
                if r not in (CPU, MEMORY, PODS, GPU) and not self._by_resource.get(r):
                    cause = _resource_cause(r)
            found = Unplaced(d.key, cause, "no schedulable target offers what it asks")
        else:
            found = Unplaced(d.key, best[1], f"{tried} targets tried; on {best[3]}: {best[2]}")
        if signature is not None:
            self._failed[signature] = found
        return found

    def settle_pending(self, pending: Sequence[Demand]) -> tuple[str, ...]:
        """Commit the Pending pods that fit somewhere now (they compete for the same targets; those that
        fit nowhere are unrelated and veto nothing). Returns the keys placed."""
        placed = []
        for d in sorted(pending, key=_order):
            if d.key in self._pods:
                continue
            if isinstance(self.place(d), Move):
                placed.append(d.key)
                self._pending.add(d.key)
        self._failed.clear()
        return tuple(placed)

    def simulate(self, sources: Sequence[str], movers: Sequence[Demand]) -> Placement:
        """Remove ``sources`` and place ``movers`` (the pods their drains evict) on the other targets,
        committed one by one, largest first. The change stays until :meth:`undo` of a :meth:`mark` taken
        before. Pending pods the state had placed on a source are placed again; they veto nothing."""
        gone = set(sources)
        pending_demands = [
            self._pods[k][1] for k in sorted(self._pending) if k in self._pods and self._pods[k][0] in gone
        ]
        for key in sorted(k for node in gone for k in self._on_node.get(node, ())):
            self._uncommit(key)
        for name in sorted(gone):
            self._remove_node(name)
        moves: list[Move] = []
        unplaced: list[Unplaced] = []
        for d in sorted(movers, key=_order):
            result = self.place(d)
            (moves if isinstance(result, Move) else unplaced).append(result)  # type: ignore[arg-type]
        for d in pending_demands:
            if isinstance(self.place(d), Unplaced):
                self._pending.discard(d.key)  # fits nowhere now: unrelated, as the settling judged it
        return Placement(tuple(moves), tuple(unplaced))

    def node_of(self, pod: str) -> str | None:
        """Where pod ``pod`` is (or was placed), None if nowhere."""
        found = self._pods.get(pod)
        return found[0] if found else None

    def is_target(self, node: str) -> bool:
        """Whether ``node`` may receive pods now."""
        return node in self._targets


def _order(d: Demand) -> tuple[int, int, int, str]:
    """First fit decreasing: most GPUs, then most CPU, then most memory first; then by name."""
    r = d.resources
    return (-r.get(GPU, 0), -r.get(CPU, 0), -r.get(MEMORY, 0), d.key)
