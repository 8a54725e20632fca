"""What a pod asks of the node it would land on: requests, tolerations, node and pod constraints (issue 29).

Pure: a :class:`Demand` is read from a ``Pod`` once (``demand_of``) and compared with nodes by
``domain.placement``. The fields are the kube-scheduler's filters that a drain's evicted pods meet again
when their controller recreates them (Kubernetes "Scheduling Framework" default filter plugins:
NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, VolumeZone/VolumeBinding,
PodTopologySpread, InterPodAffinity, DynamicResources).

Requests follow the scheduler's ``computePodResourceRequest``: the sum over containers, at least the
largest init container, plus ``spec.overhead``; a resource with a limit but no request requests its limit
(the API server's defaulting of extended resources).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from rightsizer.domain.model import (
    LabelSelector,
    NodeSelector,
    Pod,
    PodAffinityTerm,
    Toleration,
    TopologySpreadConstraint,
)
from rightsizer.domain.quantity import parse_quantity

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
#: Requests no target compares (node-local scratch space is not a placement constraint we model).
UNCOMPARED = frozenset({"ephemeral-storage"})
DEFAULT_SCHEDULERS = frozenset({"", "default-scheduler"})
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: A host port bound on every address (``hostIP`` unset): it conflicts with the same port on any address.
ANY_IP = "0.0.0.0"  # noqa: S104 - a value compared, nothing binds


@lru_cache(maxsize=8192)
def resource_units(name: str, value: str | int | float) -> int:
    """A request as an integer in the unit the simulation counts: ``cpu`` millicores, ``memory`` bytes,
    anything else (extended resources, ``pods``) a count. Invalid quantities count 0 (the API server
    rejects them, so a real object never carries one)."""
    try:
        amount = parse_quantity(value)
    except ValueError:
        return 0
    return int(amount * 1000) if name == CPU else int(amount)


@dataclass(frozen=True, slots=True)
class DraClaimFacts:
    """DRA facts the simulation reads (``resource.k8s.io``): what each claim asks and which device
    classes are understood.

    ``requests``: ``namespace/claim`` → ((DeviceClass, count), ...), from ``spec.devices.requests``.
    ``classes``: DeviceClass → the driver its selector picks (only classes whose selectors are a plain
    ``device.driver == "<driver>"``; any other class is not modelled and makes the pod "cannot verify").
    """

    requests: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)


NO_DRA = DraClaimFacts()


@dataclass(frozen=True, slots=True)
class Demand:
    """One pod's scheduling demand (see the module docstring). ``unverifiable`` names a constraint the
    simulation does not model: such a pod never counts as placed."""

    key: str
    namespace: str
    labels: Mapping[str, str]
    resources: Mapping[str, int]
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: NodeSelector | None = None
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[TopologySpreadConstraint, ...] = ()
    host_ports: frozenset[tuple[str, int, str]] = frozenset()
    volume_affinity: tuple[tuple[str, NodeSelector], ...] = ()
    dra: tuple[tuple[str, str, int], ...] = ()
    """(DeviceClass, driver, count) per DRA request of the pod's claims."""
    unverifiable: str | None = None

    @property
    def gpus(self) -> int:
        """Whole ``nvidia.com/gpu`` devices requested (time-slicing replicas count as such)."""
        return self.resources.get("nvidia.com/gpu", 0)

    def signature(self) -> tuple[object, ...] | None:
        """Equal for pods that every target judges alike, None when other pods' placement can change the
        answer (pod affinity, topology spread): a pod of the same signature that fit nowhere fits nowhere
        while targets only fill up."""
        if self.affinity or self.spread:
            return None
        return (
            self.namespace,
            tuple(sorted(self.labels.items())),
            tuple(sorted(self.resources.items())),
            tuple(t.model_dump_json() for t in self.tolerations),
            tuple(sorted(self.node_selector.items())),
            self.node_affinity.model_dump_json() if self.node_affinity is not None else None,
            tuple(t.model_dump_json() for t in self.anti_affinity),
            tuple(sorted(self.host_ports)),
            tuple((claim, selector.model_dump_json()) for claim, selector in self.volume_affinity),
            self.dra,
            self.unverifiable,
        )


def _container_requests(
    requests: Mapping[str, str | int | float], limits: Mapping[str, str | int | float]
) -> dict[str, int]:
    """One container's requests in simulation units; a resource with a limit only requests its limit."""
    out = {name: resource_units(name, value) for name, value in requests.items() if name not in UNCOMPARED}
    for name, value in limits.items():
        if name not in out and name not in UNCOMPARED:
            out[name] = resource_units(name, value)
    return out


def pod_requests(pod: Pod) -> dict[str, int]:
    """The pod's effective requests in simulation units (module docstring), ``pods`` = 1 included."""
    total: dict[str, int] = {}
    for c in pod.spec.containers:
        for name, amount in _container_requests(c.resources.requests, c.resources.limits).items():
            total[name] = total.get(name, 0) + amount
    for c in pod.spec.initContainers:
        for name, amount in _container_requests(c.resources.requests, c.resources.limits).items():
            total[name] = max(total.get(name, 0), amount)
    for name, value in pod.spec.overhead.items():
        if name not in UNCOMPARED:
            total[name] = total.get(name, 0) + resource_units(name, value)
    total[PODS] = 1
    return {k: v for k, v in total.items() if v > 0}


def _claim_key(pod: Pod, ref_name: str, claim_name: str | None) -> str | None:
    name = claim_name
    if name is None:
        name = next(
            (s.resourceClaimName for s in pod.status.resourceClaimStatuses if s.name == ref_name), None
        )
    return f"{pod.metadata.namespace}/{name}" if name else None


def _dra(pod: Pod, facts: DraClaimFacts) -> tuple[tuple[tuple[str, str, int], ...], str | None]:
    out: list[tuple[str, str, int]] = []
    for ref in pod.spec.resourceClaims:
        key = _claim_key(pod, ref.name, ref.resourceClaimName)
        requests = facts.requests.get(key) if key else None
        if requests is None:
            return (), f"DRA claim {ref.name}: its requests were not observed"
        for device_class, count in requests:
            driver = facts.classes.get(device_class)
            if driver is None:
                return (), f"DeviceClass {device_class} is not modelled"
            out.append((device_class, driver, count))
    return tuple(out), None


def _pinned(pod: Pod, affinity: NodeSelector | None) -> bool:
    """The pod names its node (``kubernetes.io/hostname`` or ``metadata.name``): wherever its controller
    puts the next one is not something a scheduler simulation can answer."""
    node = pod.spec.nodeName
    if not node:
        return False
    if pod.spec.nodeSelector.get(HOSTNAME_LABEL) == node:
        return True
    for term in affinity.nodeSelectorTerms if affinity is not None else ():
        for r in (*term.matchFields, *term.matchExpressions):
            if r.key in ("metadata.name", HOSTNAME_LABEL) and r.operator == "In" and r.values == [node]:
                return True
    return False


def _merged(term: PodAffinityTerm, labels: Mapping[str, str]) -> PodAffinityTerm:
    """``matchLabelKeys`` / ``mismatchLabelKeys`` folded into the selector, as the API server does."""
    if not term.matchLabelKeys and not term.mismatchLabelKeys:
        return term
    selector = term.labelSelector or LabelSelector()
    exprs: list[dict[str, object]] = [e.model_dump() for e in selector.matchExpressions]
    for key in term.matchLabelKeys:
        if key in labels:
            exprs.append({"key": key, "operator": "In", "values": [labels[key]]})
    for key in term.mismatchLabelKeys:
        if key in labels:
            exprs.append({"key": key, "operator": "NotIn", "values": [labels[key]]})
    merged = LabelSelector.model_validate({"matchLabels": selector.matchLabels, "matchExpressions": exprs})
    return term.model_copy(update={"labelSelector": merged, "matchLabelKeys": [], "mismatchLabelKeys": []})


def demand_of(
    pod: Pod,
    volume_affinity: tuple[tuple[str, NodeSelector], ...] = (),
    *,
    dra: DraClaimFacts = NO_DRA,
    volume_problem: str | None = None,
) -> Demand:
    """The :class:`Demand` of ``pod``.

    Args:
        pod: the pod (bound or Pending).
        volume_affinity: (claim name, the bound PersistentVolume's required node affinity) per claim of
            the pod whose volume is reachable from some nodes only (a zonal EBS volume).
        dra: the DRA claims' requests and the modelled DeviceClasses.
        volume_problem: why a claim of the pod could not be resolved (the pod is then unverifiable).
    """
    spec = pod.spec
    affinity = spec.affinity
    node_affinity = (
        affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
        if affinity is not None and affinity.nodeAffinity is not None
        else None
    )
    labels = pod.metadata.labels
    pod_terms = tuple(
        _merged(t, labels)
        for t in (
            affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution
            if affinity is not None and affinity.podAffinity is not None
            else []
        )
    )
    anti_terms = tuple(
        _merged(t, labels)
        for t in (
            affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution
            if affinity is not None and affinity.podAntiAffinity is not None
            else []
        )
    )
    spread = tuple(c for c in spec.topologySpreadConstraints if c.whenUnsatisfiable == "DoNotSchedule")
    ports = frozenset(
        (p.hostIP or ANY_IP, p.hostPort, p.protocol or "TCP")
        for c in (*spec.containers, *spec.initContainers)
        for p in c.ports
        if p.hostPort
    )
    dra_requests, dra_problem = _dra(pod, dra)
    unverifiable = volume_problem or dra_problem
    if (spec.schedulerName or "") not in DEFAULT_SCHEDULERS:
        unverifiable = f"schedulerName {spec.schedulerName} is not the default scheduler"
    elif _pinned(pod, node_affinity):
        unverifiable = f"pinned to node {spec.nodeName} by name"
    elif any(
        t.namespaceSelector is not None and t.namespaceSelector != LabelSelector()
        for t in (*pod_terms, *anti_terms)
    ):
        unverifiable = "a pod affinity term selects namespaces by label"
    return Demand(
        key=pod.key,
        namespace=pod.metadata.namespace,
        labels=labels,
        resources=pod_requests(pod),
        tolerations=tuple(spec.tolerations),
        node_selector=spec.nodeSelector,
        node_affinity=node_affinity,
        affinity=pod_terms,
        anti_affinity=anti_terms,
        spread=spread,
        host_ports=ports,
        volume_affinity=volume_affinity,
        dra=dra_requests,
        unverifiable=unverifiable,
    )


def term_namespaces(term: PodAffinityTerm, own: str) -> frozenset[str] | None:
    """The namespaces a term's selector looks in; None = every namespace (``namespaceSelector: {}``)."""
    if term.namespaceSelector is not None:
        return None
    return frozenset(term.namespaces) if term.namespaces else frozenset({own})


def spread_selector(c: TopologySpreadConstraint, labels: Mapping[str, str]) -> LabelSelector:
    """A constraint's selector with ``matchLabelKeys`` folded in (their values taken from the pod)."""
    selector = c.labelSelector or LabelSelector()
    keys = [k for k in c.matchLabelKeys if k in labels]
    if not keys:
        return selector
    return LabelSelector.model_validate(
        {
            "matchLabels": {**selector.matchLabels, **{k: labels[k] for k in keys}},
            "matchExpressions": [e.model_dump() for e in selector.matchExpressions],
        }
    )
