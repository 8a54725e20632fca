"""Contract suite of the acting ports: one set of tests, run on the fakes and on the real adapters.

``params=["fake", "real"]``. ``ClusterWriter``: ``fake`` is :class:`FakeClusterWriter`; ``real`` is
:class:`KubernetesCluster` (EKS token source, page size 2 so every list paginates) against the
:class:`KubernetesDouble` over HTTP (the ``NodeScaler`` port's suite is ``test_scaler_contract.py``).
Whatever the fake answers, the adapter answers: the drain service's unit tests can trust the fakes.

Both Kubernetes worlds share one hand-moved clock (grace periods, Event timestamps). The double's
workload controllers are switched off because the fake has none (the fake's docstring says so); PDB
statuses are frozen in both, so a test states the budget it means. Cases: BUG-14 (429 naming the PDB,
never a DELETE), BUG-17 (accepted ≠ gone), BUG-21 (pods that land after the cordon are seen), BUG-31
(401 once ⇒ refresh; 403 ⇒ PermanentError naming the identity and ``create pods/eviction``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesAccessError, KubernetesCluster
from rightsizer.domain.errors import PermanentError, StalePlan, TransientError
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY
from rightsizer.ports import AccessCheck, ClusterWriter, EvictionOutcome
from rightsizer.testing.fakes import FakeClock, FakeClusterWriter
from rightsizer.testing.k8s import KubernetesDouble, RecordedRequest
from tests.builders import gpu_node, pod

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.moto_fixtures"]

JSON = dict[str, Any]
T0 = datetime(2024, 5, 14, 10, 0, 0, tzinfo=UTC)  # BUG-17 / BUG-31 timeline
AT = "2024-05-14T10:00:00Z"
EXEC = "exec-0001"
IDENTITY = "arn:aws:iam::000000000000:role/gpu-rightsizer-lambda"  # BUG-31
CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)
NODE = "gpu-node-k"
TOO_MANY = "Cannot evict pod as it would violate the pod's disruption budget."


# ------------------------------------------------------------------------------------ Kubernetes worlds


class FakeWorld:
    """The fake cluster, seeded and inspected through the fake's own test API."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fake = FakeClusterWriter(clock=clock, identity=IDENTITY)
        self.writer: ClusterWriter = self.fake

    def add_node(self, obj: JSON) -> None:
        self.fake.add_node(obj)

    def add_pod(self, obj: JSON) -> None:
        self.fake.add_pod(obj)

    def delete_controller(self, namespace: str, plural: str, name: str) -> bool:
        return self.fake.delete_controller(namespace, plural, name)

    def add_pdb(self, obj: JSON) -> None:
        self.fake.add_pdb(obj)

    def node(self, name: str) -> JSON | None:
        return self.fake.get_node(name)

    def pod(self, namespace: str, name: str) -> JSON | None:
        return self.fake.get_pod(namespace, name)

    def pdb_status(self, namespace: str, name: str) -> JSON:
        found = next(p for p in self.fake.list_pdbs() if p["metadata"]["name"] == name)
        return dict(found["status"])

    def events(self, node: str) -> list[JSON]:
        return [e for e in self.fake.events if e["involvedObject"]["name"] == node]

    def deny(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        self.fake.deny(verb, resource, subresource, group)

    def change_node_during_patch(self, name: str, times: int) -> None:
        remaining = [times]

        def hook(node: str) -> None:
            if node == name and remaining[0] > 0:
                remaining[0] -= 1
                self.fake.update_node(name, _touch)

        self.fake.before_node_patch(hook)


class RealWorld:
    """The adapter against the Kubernetes double over HTTP; seeded and inspected through the double."""

    def __init__(self, clock: FakeClock, double: KubernetesDouble) -> None:
        self.clock = clock
        self.double = double
        double.set_recreated_owner_kinds([])  # the fake plays no controllers
        self.tokens = EksTokenSource(
            "prod-eks", "us-east-1", lambda: CREDS, clock=clock, identity=lambda: IDENTITY
        )
        self.writer: ClusterWriter = KubernetesCluster.for_eks(
            double.base_url, self.tokens, page_size=2, clock=clock.now
        )

    def add_node(self, obj: JSON) -> None:
        self.double.add_node(obj)

    def add_pod(self, obj: JSON) -> None:
        self.double.add_pod(obj)

    def delete_controller(self, namespace: str, plural: str, name: str) -> bool:
        return self.double.delete_controller(namespace, plural, name)

    def add_pdb(self, obj: JSON) -> None:
        self.double.add_pdb(obj, managed_status=False)

    def node(self, name: str) -> JSON | None:
        return self.double.get_node(name)

    def pod(self, namespace: str, name: str) -> JSON | None:
        return self.double.get_pod(namespace, name)

    def pdb_status(self, namespace: str, name: str) -> JSON:
        found = self.double.get_pdb(namespace, name)
        assert found is not None
        return dict(found["status"])

    def events(self, node: str) -> list[JSON]:
        return self.double.events(involved_name=node)

    def deny(self, verb: str, resource: str, subresource: str = "", group: str = "") -> None:
        self.double.deny(verb, resource, subresource, group)

    def change_node_during_patch(self, name: str, times: int) -> None:
        remaining = [times]

        def hook(request: RecordedRequest) -> None:
            if request.method == "PATCH" and request.path == f"/api/v1/nodes/{name}" and remaining[0] > 0:
                remaining[0] -= 1
                node = self.double.get_node(name)
                assert node is not None
                _touch(node)
                self.double.add_node(node)

        self.double.on_request(hook)


World = FakeWorld | RealWorld


def _touch(node: JSON) -> None:
    """Someone else's write to the node (a label), which moves its resourceVersion."""
    labels = node["metadata"].setdefault("labels", {})
    labels["example.com/touched"] = str(int(labels.get("example.com/touched", "0")) + 1)


@pytest.fixture(params=["fake", "real"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    clock = FakeClock(T0)
    if request.param == "fake":
        yield FakeWorld(clock)
        return
    with KubernetesDouble(clock=clock, seed=1, resource_api_versions=None) as double:
        yield RealWorld(clock, double)
        assert double.internal_errors == []


def node_obj(name: str = NODE, **kwargs: Any) -> JSON:
    return gpu_node(name, instance_id="i-0000000000000000b", **kwargs)


def human_cordoned(name: str = NODE) -> JSON:
    return node_obj(name, unschedulable=True)


def budget(
    name: str,
    match: dict[str, str],
    *,
    allowed: int,
    current: int = 2,
    desired: int = 2,
    namespace: str = "inference",
    policy: str | None = None,
) -> JSON:
    spec: JSON = {"selector": {"matchLabels": match}, "minAvailable": desired}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {
            "currentHealthy": current,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "expectedPods": current + 1,
        },
    }


def uid_of(world: World, namespace: str, name: str) -> str:
    found = world.pod(namespace, name)
    assert found is not None
    return str(found["metadata"]["uid"])


def annotations_of(node: JSON | None) -> dict[str, str]:
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


# ------------------------------------------------------------------------------------------- reads


def test_get_node_is_fresh_and_a_missing_node_is_none(world: World) -> None:
    world.add_node(node_obj())
    found = world.writer.get_node(NODE)
    assert found is not None
    assert (found["kind"], found["metadata"]["name"]) == ("Node", NODE)
    assert world.writer.get_node("gpu-node-k2") is None  # exactly that name, never a prefix


def test_list_pods_on_node_sees_pods_that_landed_after_the_cordon(world: World) -> None:
    # GIVEN an empty idle node (the 07:40:30 decision of BUG-21) and a busy neighbour
    world.add_node(node_obj())
    world.add_node(node_obj("gpu-node-q"))
    world.add_pod(pod("web-0", "gpu-node-q", namespace="web"))
    assert world.writer.list_pods_on_node(NODE) == []

    # WHEN we cordon and, meanwhile, the scheduler binds five do-not-disrupt Job pods (07:40:44-56)
    world.writer.cordon(NODE, EXEC, AT)
    for i in range(5):
        world.add_pod(
            pod(
                f"render-{i}",
                NODE,
                namespace="batch",
                owner=("Job", "batch/v1"),
                annotations={"karpenter.sh/do-not-disrupt": "true"},
            )
        )

    # THEN the fresh re-list after the cordon sees all five (across pages), and only them
    listed = world.writer.list_pods_on_node(NODE)
    assert [(p["kind"], p["metadata"]["name"]) for p in listed] == [("Pod", f"render-{i}") for i in range(5)]
    assert all(p["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true" for p in listed)


def test_get_pod_and_list_pdbs(world: World) -> None:
    world.add_node(node_obj())
    world.add_pod(pod("triton-0", NODE, namespace="inference", labels={"app": "triton"}))
    world.add_pdb(budget("triton-pdb", {"app": "triton"}, allowed=0))

    found = world.writer.get_pod("inference", "triton-0")
    assert found is not None and found["metadata"]["name"] == "triton-0"
    assert world.writer.get_pod("inference", "nope") is None
    pdbs = world.writer.list_pdbs()
    assert [(p["kind"], p["apiVersion"], p["metadata"]["name"]) for p in pdbs] == [
        ("PodDisruptionBudget", "policy/v1", "triton-pdb")
    ]
    assert pdbs[0]["status"]["disruptionsAllowed"] == 0


@pytest.mark.parametrize(
    ("group", "kind", "api_version", "plural"),
    [
        ("apps", "ReplicaSet", "apps/v1", "replicasets"),
        ("apps", "StatefulSet", "apps/v1", "statefulsets"),
        ("apps", "DaemonSet", "apps/v1", "daemonsets"),
        ("batch", "Job", "batch/v1", "jobs"),
        ("", "ReplicationController", "v1", "replicationcontrollers"),
    ],
)
def test_get_controller_reads_the_owner_back_and_a_deleted_one_is_none(
    world: World, group: str, kind: str, api_version: str, plural: str
) -> None:
    world.add_node(node_obj())
    world.add_pod(pod("w-0", NODE, namespace="ml", owner=(kind, api_version)))
    found = world.writer.get_controller("ml", group, kind, "w-0-owner")
    assert found is not None
    assert (found["kind"], found["metadata"]["name"], found["metadata"]["namespace"]) == (
        kind,
        "w-0-owner",
        "ml",
    )
    assert world.delete_controller("ml", plural, "w-0-owner")
    assert world.writer.get_controller("ml", group, kind, "w-0-owner") is None
    with pytest.raises(ValueError, match="CloneSet"):
        world.writer.get_controller("ml", "apps.kruise.io", "CloneSet", "w-0-owner")


def test_get_controller_refused_by_rbac_is_permanent_and_names_the_verb(world: World) -> None:
    world.add_node(node_obj())
    world.add_pod(pod("w-0", NODE, namespace="ml", owner=("Job", "batch/v1")))
    world.deny("get", "jobs", group="batch")
    with pytest.raises(PermanentError, match=r"get jobs\.batch"):
        world.writer.get_controller("ml", "batch", "Job", "w-0-owner")


# ------------------------------------------------------------------------------------------ cordon


def test_cordon_sets_unschedulable_and_both_annotations(world: World) -> None:
    world.add_node(node_obj(annotations={"team": "ml"}))

    patched = world.writer.cordon(NODE, EXEC, AT)

    stored = world.node(NODE)
    assert stored is not None
    assert stored["spec"]["unschedulable"] is True
    assert annotations_of(stored) == {"team": "ml", ANN_CORDONED_BY: EXEC, ANN_CORDONED_AT: AT}
    assert patched["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert patched["spec"]["unschedulable"] is True


def test_cordon_twice_is_a_no_op(world: World) -> None:
    world.add_node(node_obj())
    first = world.writer.cordon(NODE, EXEC, AT)

    again = world.writer.cordon(NODE, EXEC, "2024-05-14T10:03:00Z")  # a resumed step, later

    stored = world.node(NODE)
    assert stored is not None
    assert stored["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert annotations_of(stored)[ANN_CORDONED_AT] == AT  # the original cordon time stands


def test_cordon_of_a_human_cordoned_node_is_stale_and_changes_nothing(world: World) -> None:
    world.add_node(human_cordoned())
    before = world.node(NODE)

    with pytest.raises(StalePlan, match=r"^cordoned_by_other$"):
        world.writer.cordon(NODE, EXEC, AT)

    assert world.node(NODE) == before


def test_cordon_of_a_node_another_execution_cordoned_is_stale(world: World) -> None:
    world.add_node(
        node_obj(unschedulable=True, annotations={ANN_CORDONED_BY: "exec-other", ANN_CORDONED_AT: AT})
    )
    before = world.node(NODE)

    with pytest.raises(StalePlan, match=r"^cordoned_by_other$"):
        world.writer.cordon(NODE, EXEC, AT)

    assert world.node(NODE) == before


def test_cordon_after_a_person_uncordoned_our_node_is_stale(world: World) -> None:
    # kubectl uncordon clears spec.unschedulable and leaves our annotations behind
    world.add_node(node_obj(annotations={ANN_CORDONED_BY: EXEC, ANN_CORDONED_AT: AT}))
    before = world.node(NODE)

    with pytest.raises(StalePlan, match=r"^uncordoned_by_other$"):
        world.writer.cordon(NODE, EXEC, AT)

    assert world.node(NODE) == before


def test_cordon_of_a_missing_node_is_stale(world: World) -> None:
    with pytest.raises(StalePlan, match=r"^node_not_found$"):
        world.writer.cordon(NODE, EXEC, AT)


def test_a_change_between_our_read_and_our_patch_is_stale(world: World) -> None:
    # GIVEN someone writes the node between the cordon's GET and its PATCH
    world.add_node(node_obj())
    world.change_node_during_patch(NODE, times=1)

    # WHEN cordoning THEN the resourceVersion guard answers 409: abandon, not cordoned
    with pytest.raises(StalePlan, match=r"^node_changed$"):
        world.writer.cordon(NODE, EXEC, AT)

    stored = world.node(NODE)
    assert stored is not None
    assert not stored["spec"].get("unschedulable")
    assert ANN_CORDONED_BY not in annotations_of(stored)
    assert stored["metadata"]["labels"]["example.com/touched"] == "1"


@pytest.mark.parametrize("at", ["2024-05-14T12:00:00+02:00", "2024-05-14T10:00:00", "yesterday"])
def test_cordon_time_must_be_rfc3339_utc(world: World, at: str) -> None:
    world.add_node(node_obj())
    with pytest.raises(ValueError, match="cordoned-at"):
        world.writer.cordon(NODE, EXEC, at)
    assert ANN_CORDONED_BY not in annotations_of(world.node(NODE))


# ---------------------------------------------------------------------------------------- uncordon


def test_uncordon_removes_our_cordon(world: World) -> None:
    world.add_node(node_obj(annotations={"team": "ml"}))
    world.writer.cordon(NODE, EXEC, AT)

    assert world.writer.uncordon(NODE, EXEC) is True

    stored = world.node(NODE)
    assert stored is not None
    assert stored["spec"]["unschedulable"] is False
    assert annotations_of(stored) == {"team": "ml"}


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(human_cordoned(), id="a-persons-cordon"),
        pytest.param(
            node_obj(unschedulable=True, annotations={ANN_CORDONED_BY: "exec-other", ANN_CORDONED_AT: AT}),
            id="another-execution",
        ),
        pytest.param(node_obj(), id="not-cordoned"),
    ],
)
def test_uncordon_leaves_a_cordon_that_is_not_ours(world: World, node: JSON) -> None:
    world.add_node(node)
    before = world.node(NODE)

    assert world.writer.uncordon(NODE, EXEC) is False

    assert world.node(NODE) == before


def test_uncordon_of_a_missing_node_is_false(world: World) -> None:
    assert world.writer.uncordon(NODE, EXEC) is False


def test_uncordon_retries_once_after_a_conflict(world: World) -> None:
    world.add_node(node_obj())
    world.writer.cordon(NODE, EXEC, AT)
    world.change_node_during_patch(NODE, times=1)

    assert world.writer.uncordon(NODE, EXEC) is True

    stored = world.node(NODE)
    assert stored is not None
    assert stored["spec"]["unschedulable"] is False
    assert ANN_CORDONED_BY not in annotations_of(stored)
    assert stored["metadata"]["labels"]["example.com/touched"] == "1"  # the other write is kept


def test_uncordon_gives_up_after_two_conflicts(world: World) -> None:
    world.add_node(node_obj())
    world.writer.cordon(NODE, EXEC, AT)
    world.change_node_during_patch(NODE, times=2)

    with pytest.raises(StalePlan, match=r"^node_changed$"):
        world.writer.uncordon(NODE, EXEC)

    assert annotations_of(world.node(NODE))[ANN_CORDONED_BY] == EXEC


# ------------------------------------------------------------------------------------------- evict


def test_accepted_eviction_leaves_the_pod_until_its_grace_period_has_passed(world: World) -> None:
    # GIVEN BUG-17's trainer with a 900 s grace period (checkpoint in preStop)
    world.add_node(node_obj())
    world.add_pod(pod("trainer-2", NODE, namespace="ml", owner=("Job", "batch/v1"), grace=900))
    uid = uid_of(world, "ml", "trainer-2")

    # WHEN evicted at 10:00:00
    assert world.writer.evict("ml", "trainer-2", uid) == EvictionOutcome("accepted")

    # THEN at 10:00:02 and at 10:14:59 the pod with that UID still exists, terminating
    world.clock.advance(2)
    terminating = world.writer.get_pod("ml", "trainer-2")
    assert terminating is not None
    assert terminating["metadata"]["uid"] == uid
    assert terminating["metadata"]["deletionTimestamp"] == "2024-05-14T10:15:00Z"
    assert [p["metadata"]["name"] for p in world.writer.list_pods_on_node(NODE)] == ["trainer-2"]
    world.clock.advance(897)
    assert world.writer.get_pod("ml", "trainer-2") is not None
    # AND only once the clock passes 10:15:00 is it gone
    world.clock.advance(2)
    assert world.writer.get_pod("ml", "trainer-2") is None
    assert world.writer.list_pods_on_node(NODE) == []


def test_evicting_a_terminating_pod_again_is_accepted_and_keeps_its_deadline(world: World) -> None:
    world.add_node(node_obj())
    world.add_pod(pod("tgi-6f7d-qwert", NODE, namespace="inference", grace=120))
    uid = uid_of(world, "inference", "tgi-6f7d-qwert")
    world.writer.evict("inference", "tgi-6f7d-qwert", uid)
    world.clock.advance(60)

    assert world.writer.evict("inference", "tgi-6f7d-qwert", uid).status == "accepted"

    again = world.writer.get_pod("inference", "tgi-6f7d-qwert")
    assert again is not None and again["metadata"]["deletionTimestamp"] == "2024-05-14T10:02:00Z"


def test_eviction_of_a_gone_pod_is_gone(world: World) -> None:
    world.add_node(node_obj())
    outcome = world.writer.evict("ml", "trainer-9", "uid-gone")
    assert outcome.status == "gone"
    assert "trainer-9" in outcome.message


def test_eviction_with_a_stale_uid_is_a_uid_mismatch_and_spares_the_new_pod(world: World) -> None:
    # GIVEN the pod we classified was replaced by a namesake (StatefulSet) with a new UID
    world.add_node(node_obj())
    world.add_pod(pod("trainer-2", NODE, namespace="ml", owner=("StatefulSet", "apps/v1")))
    world.add_pdb(budget("trainer-pdb", {"app": "trainer"}, allowed=1, namespace="ml"))
    before = world.pod("ml", "trainer-2")

    outcome = world.writer.evict("ml", "trainer-2", "uid-of-the-old-pod")

    assert outcome.status == "uid_mismatch"
    assert "uid-of-the-old-pod" in outcome.message
    assert world.pod("ml", "trainer-2") == before  # not terminating
    assert world.pdb_status("ml", "trainer-pdb")["disruptionsAllowed"] == 1  # no budget spent


def test_eviction_blocked_by_a_pdb_names_the_pdb(world: World) -> None:
    # GIVEN BUG-14's triton-pdb (maxUnavailable 0 by design)
    world.add_node(node_obj())
    world.add_pod(pod("triton-0", NODE, namespace="inference", labels={"app": "triton"}))
    world.add_pdb(budget("triton-pdb", {"app": "triton"}, allowed=0))
    before = world.pod("inference", "triton-0")

    outcome = world.writer.evict("inference", "triton-0", uid_of(world, "inference", "triton-0"))

    # THEN 429 ⇒ blocked, the message names the budget, the pod is untouched
    assert outcome == EvictionOutcome(
        "blocked", f"{TOO_MANY} The disruption budget triton-pdb needs 2 healthy pods and has 2 currently"
    )
    assert world.pod("inference", "triton-0") == before


def test_an_accepted_eviction_spends_the_budget(world: World) -> None:
    world.add_node(node_obj())
    for name in ("reranker-a", "reranker-b"):
        world.add_pod(pod(name, NODE, namespace="inference", labels={"app": "reranker"}))
    world.add_pdb(budget("reranker-pdb", {"app": "reranker"}, allowed=1, current=3))

    first = world.writer.evict("inference", "reranker-a", uid_of(world, "inference", "reranker-a"))
    second = world.writer.evict("inference", "reranker-b", uid_of(world, "inference", "reranker-b"))

    assert first.status == "accepted"
    assert second.status == "blocked" and "reranker-pdb" in second.message
    assert world.pdb_status("inference", "reranker-pdb")["disruptionsAllowed"] == 0


def test_a_pod_under_two_pdbs_is_an_error(world: World) -> None:
    world.add_node(node_obj())
    world.add_pod(pod("triton-0", NODE, namespace="inference", labels={"app": "triton", "tier": "gpu"}))
    world.add_pdb(budget("triton-pdb", {"app": "triton"}, allowed=1))
    world.add_pdb(budget("gpu-tier-pdb", {"tier": "gpu"}, allowed=1))

    outcome = world.writer.evict("inference", "triton-0", uid_of(world, "inference", "triton-0"))

    assert outcome.status == "error"
    assert "more than one PodDisruptionBudget" in outcome.message
    assert world.pod("inference", "triton-0") is not None


NOT_READY = {"conditions": [{"type": "Ready", "status": "False"}], "phase": "Running"}


@pytest.mark.parametrize(
    ("policy", "current", "expected"),
    [
        # Kubernetes' IfHealthyBudget: a not-ready pod may go while the application is not disrupted
        # (currentHealthy >= desiredHealthy), even at disruptionsAllowed 0. BUG-14's note claims the
        # crash-looping reranker "still cannot be evicted" with 2/2 healthy; the API server disagrees.
        (None, 2, "accepted"),
        (None, 1, "blocked"),
        ("AlwaysAllow", 1, "accepted"),
    ],
)
def test_unhealthy_pod_eviction_policy(world: World, policy: str | None, current: int, expected: str) -> None:
    world.add_node(node_obj())
    crashing = pod("reranker-7f9c-fghij", NODE, namespace="inference", labels={"app": "reranker"})
    crashing["status"] = NOT_READY
    world.add_pod(crashing)
    world.add_pdb(budget("reranker-pdb", {"app": "reranker"}, allowed=0, current=current, policy=policy))

    outcome = world.writer.evict(
        "inference", "reranker-7f9c-fghij", uid_of(world, "inference", "reranker-7f9c-fghij")
    )

    assert outcome.status == expected


def test_forbidden_eviction_is_permanent_and_names_identity_and_verb(world: World) -> None:
    # GIVEN BUG-31 scenario B: the role may read but not create pods/eviction
    world.add_node(node_obj())
    world.add_pod(pod("trainer-2", NODE, namespace="ml"))
    world.deny("create", "pods", "eviction")

    with pytest.raises(KubernetesAccessError) as caught:
        world.writer.evict("ml", "trainer-2", uid_of(world, "ml", "trainer-2"))

    err = caught.value
    assert isinstance(err, PermanentError)
    assert (err.status, err.identity, err.check) == (403, IDENTITY, AccessCheck("create", "pods", "eviction"))
    assert f"{IDENTITY} may not create pods/eviction" in str(err)
    assert world.pod("ml", "trainer-2") is not None
    assert not (world.pod("ml", "trainer-2") or {})["metadata"].get("deletionTimestamp")


# ------------------------------------------------------------------------------------------ events


@pytest.mark.parametrize(("warning", "kind"), [(False, "Normal"), (True, "Warning")])
def test_emit_event_records_an_event_on_the_node(world: World, warning: bool, kind: str) -> None:
    world.add_node(node_obj())
    world.clock.advance(1.5)

    world.writer.emit_event(NODE, "Cordoned", "cordoned by exec-0001 (idle 30m)", warning=warning)

    [event] = world.events(NODE)
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-{NODE}"}
    assert (event["reason"], event["message"], event["type"]) == (
        "Cordoned",
        "cordoned by exec-0001 (idle 30m)",
        kind,
    )
    assert event["source"] == {"component": "rightsizer"}
    assert event["reportingComponent"] == "rightsizer"
    assert event["reportingInstance"].startswith("rightsizer-")
    assert event["action"] == "Cordoned"
    assert (event["firstTimestamp"], event["lastTimestamp"]) == (
        "2024-05-14T10:00:01Z",
        "2024-05-14T10:00:01Z",
    )
    assert event["eventTime"] == "2024-05-14T10:00:01.500000Z"


def test_emit_event_is_best_effort(world: World) -> None:
    world.add_node(node_obj())
    world.deny("create", "events")

    world.writer.emit_event(NODE, "RolledBack", "lease_expired", warning=True)  # does not raise

    assert world.events(NODE) == []


def test_emit_event_for_a_node_that_is_gone_still_names_it(world: World) -> None:
    world.writer.emit_event(NODE, "Abandoned", "node_not_found")
    [event] = world.events(NODE)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}


# ------------------------------------------------------------------------------- the fake's extras


def test_fake_scripted_eviction_answers_come_first_and_change_nothing() -> None:
    fake = FakeClusterWriter(clock=FakeClock(T0))
    fake.add_node(node_obj())
    fake.add_pod(pod("trainer-2", NODE, namespace="ml"))
    uid = uid_of_fake(fake, "ml", "trainer-2")
    fake.script_eviction("ml", "trainer-2", EvictionOutcome("error", "etcd timeout"), TransientError("boom"))

    assert fake.evict("ml", "trainer-2", uid) == EvictionOutcome("error", "etcd timeout")
    with pytest.raises(TransientError):
        fake.evict("ml", "trainer-2", uid)
    assert fake.evict("ml", "trainer-2", uid).status == "accepted"
    assert [e[3] for e in fake.evictions] == ["error", "accepted"]
    assert [c[0] for c in fake.calls].count("evict") == 3


def uid_of_fake(fake: FakeClusterWriter, namespace: str, name: str) -> str:
    found = fake.get_pod(namespace, name)
    assert found is not None
    return str(found["metadata"]["uid"])
