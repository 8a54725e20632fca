"""Hypothesis property (issue 12): whatever Kubernetes and AWS failures are injected during a drain — and
whenever a pod with node-local data lands on the node, or a pod's controller is deleted (orphaning it) —
at the end (after the next assessment's heal) no node carries our cordon without a live workflow, no pod
with node-local data was evicted, and no instance was terminated while such a pod, or a running pod
without a live controller, was on it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.domain.model import ANN_CORDONED_BY, Node, PersistentVolume, PersistentVolumeClaim, Pod
from rightsizer.domain.pods import controllers_to_check
from rightsizer.domain.volumes import VolumeFacts, claim_names, volume_local_data
from rightsizer.ports import TerminateResult
from rightsizer.services.drain import DrainRequest
from rightsizer.services.healing import heal_expired_leases, heal_stale_cordons, stale_cordons
from rightsizer.services.runner import InProcessRunner
from rightsizer.testing.fakes import FakeClusterWriter
from tests.builders import claim_volume, pdb, pod, pv, pvc
from tests.unit.test_drain import World, make_world

WRITER_CALLS = (
    "get_node",
    "list_nodes",
    "find_node",
    "list_pods_on_node",
    "list_pdbs",
    "get_persistent_volume_claim",
    "get_persistent_volume",
    "get_controller",
    "cordon",
    "uncordon",
    "evict",
)
SCALER_CALLS = ("find_group", "describe_group", "terminate")
ERRORS = {
    "transient": lambda: TransientError("injected 503", retry_after=1.0),
    "permanent": lambda: PermanentError("injected 403"),
    "conflict": lambda: StalePlan("node_changed"),
}
LANDERS = {
    "hostpath": lambda: pod("cache-0", "gpu-1", volumes=[{"name": "c", "hostPath": {"path": "/models"}}]),
    "local-pv": lambda: pod("db-0", "gpu-1", owner=("StatefulSet", "apps/v1"), volumes=[claim_volume("data-db-0")]),
    "ephemeral": lambda: pod("tmp-0", "gpu-1", volumes=[{"name": "s", "ephemeral": {"volumeClaimTemplate": {}}}]),
}  # fmt: skip


class Chaos:
    """Wraps a port object: the i-th call of method ``name`` raises ``schedule[name][i]`` (an ``ERRORS``
    key; None = answer normally); ``on_call(n)`` runs before the n-th call overall (a pod landing)."""

    def __init__(self, inner: Any, schedule: dict[str, list[str | None]], names: tuple[str, ...]) -> None:
        self._inner, self._schedule, self._names = inner, schedule, names
        self.count = 0
        self.per_method: dict[str, int] = {}
        self.on_call: Any = None

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in self._names:
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            index = self.per_method.get(name, 0)
            self.per_method[name] = index + 1
            if self.on_call is not None:
                self.on_call(self.count)
            planned = self._schedule.get(name, [])
            if index < len(planned) and planned[index] is not None:
                raise ERRORS[planned[index]]()
            return target(*args, **kwargs)

        return call


def _node_local_pods(writer: FakeClusterWriter, node: str) -> list[str]:
    """Pods on ``node`` whose data is node-local, judged from the writer's true state (no faults)."""
    pods = [Pod.model_validate(p) for p in writer.list_pods_on_node(node)]
    claims = [writer.get_persistent_volume_claim(ns, name) for ns, name in claim_names(pods)]
    volumes = [writer.get_persistent_volume(c["spec"]["volumeName"]) for c in claims if c]
    facts = VolumeFacts.of(
        [PersistentVolumeClaim.model_validate(c) for c in claims if c],
        [PersistentVolume.model_validate(v) for v in volumes if v],
        [Node.model_validate(n) for n in writer.list_nodes()],
    )
    return [p.key for p in pods if any(volume_local_data(p, v, facts) for v in p.spec.volumes)]


def _orphans(writer: FakeClusterWriter, node: str) -> list[str]:
    """Running, non-terminating pods on ``node`` whose ReplicaSet/StatefulSet/Job/... no longer exists."""
    pods = [Pod.model_validate(p) for p in writer.list_pods_on_node(node)]
    gone = {
        r
        for r in controllers_to_check(pods)
        if writer.get_controller(r.namespace, r.group, r.kind, r.name) is None
    }
    return [
        p.key
        for p in pods
        if p.metadata.deletionTimestamp is None
        and p.controller is not None
        and any(r.name == p.controller.name and r.kind == p.controller.kind for r in gone)
    ]


def schedules(names: tuple[str, ...]) -> st.SearchStrategy[dict[str, list[str | None]]]:
    """Per method, which of its successive calls fail and how."""
    kinds = st.none() | st.sampled_from(sorted(ERRORS))
    return st.dictionaries(st.sampled_from(names), st.lists(kinds, max_size=8), max_size=len(names))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writer_faults=schedules(WRITER_CALLS),
    scaler_faults=schedules(SCALER_CALLS),
    lander=st.none() | st.sampled_from(sorted(LANDERS)),
    land_at=st.integers(min_value=1, max_value=60),
    pdb_at=st.none() | st.integers(min_value=1, max_value=40),
    orphan_at=st.none() | st.integers(min_value=1, max_value=60),
)
def test_no_forgotten_cordon_and_no_terminated_node_local_data(
    writer_faults: dict[str, list[str | None]],
    scaler_faults: dict[str, list[str | None]],
    lander: str | None,
    land_at: int,
    pdb_at: int | None,
    orphan_at: int | None,
) -> None:
    world: World = make_world()
    writer = world.writer
    writer.add_pvc(pvc("data-db-0", "local-1"))
    writer.add_pv(pv("local-1", local_path="/mnt/nvme", affinity={"kubernetes.io/hostname": ["gpu-1"]}))
    chaos_writer = Chaos(writer, writer_faults, WRITER_CALLS)
    chaos_scaler = Chaos(world.scaler, scaler_faults, SCALER_CALLS)
    violations: list[str] = []

    def land(count: int) -> None:
        if lander is not None and count == land_at:
            writer.add_pod(LANDERS[lander]())
        if count == pdb_at:  # a PodDisruptionBudget that never allows a disruption, created mid-drain
            writer.add_pdb(pdb("web", "default", {"app": "web"}, allowed=0))
        if count == orphan_at:  # kubectl delete replicaset web-2-owner --cascade=orphan
            writer.delete_controller("default", "replicasets", "web-2-owner")

    chaos_writer.on_call = land
    original_terminate = world.scaler.terminate

    def guarded_terminate(asg: str, instance_id: str) -> TerminateResult:
        node = next(
            n["metadata"]["name"]
            for n in writer.list_nodes()
            if n["spec"]["providerID"].endswith(instance_id)
        )
        violations.extend(_node_local_pods(writer, node))
        violations.extend(f"orphan {key}" for key in _orphans(writer, node))
        answer = original_terminate(asg, instance_id)
        writer.delete_node(node)  # the cloud node lifecycle controller removes the Node of a gone instance
        return answer

    world.scaler.terminate = guarded_terminate  # type: ignore[method-assign]
    original_evict = writer.evict

    original_get_controller = writer.get_controller
    seen_gone: set[str] = set()

    def guarded_get_controller(namespace: str, group: str, kind: str, name: str) -> Any:
        found = original_get_controller(namespace, group, kind, name)
        if found is None:
            seen_gone.add(name)  # from now on the drain knows: no pod of it may be evicted
        return found

    def guarded_evict(namespace: str, name: str, uid: str) -> Any:
        if f"{namespace}/{name}" in _node_local_pods(writer, "gpu-1"):
            violations.append(f"evicted {namespace}/{name}")
        if f"{name}-owner" in seen_gone:
            violations.append(f"evicted {namespace}/{name}, whose controller the drain saw gone")
        return original_evict(namespace, name, uid)

    writer.evict = guarded_evict  # type: ignore[method-assign]
    writer.get_controller = guarded_get_controller  # type: ignore[method-assign]
    world.writer = chaos_writer  # type: ignore[assignment]
    world.scaler = chaos_scaler  # type: ignore[assignment]
    runner = InProcessRunner(world.workflow(), sleep=world.clock.advance, max_transient_retries=3)
    runner.start(DrainRequest("gpu-1", "exec-1"))
    record = world.state.load("exec-1")
    assert record is not None and record.status != "running"
    assert violations == []

    # The next assessment (no more faults) heals whatever the drain could not.
    now = world.clock.now()
    heal_expired_leases(writer, world.state, now)
    nodes = [Node.model_validate(n) for n in writer.list_nodes()]
    heal_stale_cordons(writer, world.state, stale_cordons(nodes, world.state, now), now)
    left = [
        n["metadata"]["name"]
        for n in writer.list_nodes()
        if ANN_CORDONED_BY in n["metadata"]["annotations"] or n["spec"].get("unschedulable")
    ]
    assert left == [], (record.status, [(e.step, e.reason) for e in world.state.entries()])
