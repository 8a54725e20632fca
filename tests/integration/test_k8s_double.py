"""The Kubernetes API double, exercised over real HTTP with the official client and raw httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rightsizer.testing.k8s import ApiError, KubernetesDouble, RecordedRequest

pytestmark = pytest.mark.integration

TOKEN = "token-1"
T0 = 1_750_000_000.0  # a fixed clock: only advance() moves time, so no test sleeps


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(
    name: str,
    node_name: str | None = "gpu-a",
    *,
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    grace: int | None = None,
    phase: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1"}]}
    if node_name:
        spec["nodeName"] = node_name
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": f"uid-{owner_name}",
                "controller": True,
            }
        ]
        if kind == "ReplicaSet":
            metadata["generateName"] = f"{owner_name}-"
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def pdb(name: str, selector: dict[str, str], *, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": selector}, **spec},
    }


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(clock=lambda: T0, seed=7) as started:
        started.accept_tokens(TOKEN)
        for name in ("gpu-a", "gpu-b", "gpu-c"):
            started.add_node(node(name, **{"nvidia.com/gpu.present": "true"}))
        yield started
    assert started.internal_errors == []


def api_client(base_url: str, token: str = TOKEN) -> client.ApiClient:
    configuration = client.Configuration(host=base_url)
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(configuration)


@pytest.fixture
def core(double: KubernetesDouble) -> Iterator[client.CoreV1Api]:
    with api_client(double.base_url) as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def http(double: KubernetesDouble) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=double.base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        yield session


def evict(core: client.CoreV1Api, name: str, *, namespace: str = "ml", uid: str | None = None) -> Any:
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
    body = client.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        delete_options=options,
    )
    return core.create_namespaced_pod_eviction(name, namespace, body)


def api_error(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)


# ------------------------------------------------------------------------------------------------ lists


def test_pagination_walks_a_consistent_snapshot_with_opaque_continue_tokens(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    for index in range(7):
        double.add_pod(pod(f"p{index}", labels={"app": "train"}))

    first = core.list_pod_for_all_namespaces(limit=3)
    double.add_pod(pod("p0-late", labels={"app": "train"}))  # written between pages: not part of the snapshot
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    pages = 1
    while token:
        page = core.list_pod_for_all_namespaces(limit=3, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
        pages += 1

    assert pages == 3
    assert names == [f"p{index}" for index in range(7)]
    assert first.metadata.remaining_item_count == 4
    assert int(first.metadata.resource_version) < double.resource_version
    assert len(core.list_pod_for_all_namespaces().items) == 8
    status, body = api_error(lambda: core.list_pod_for_all_namespaces(limit=1, _continue="not-a-token"))
    assert (status, body["reason"]) == (400, "BadRequest")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("pool=a", {"gpu-a", "gpu-b"}),
        ("pool==b", {"gpu-c"}),
        ("pool!=a", {"gpu-c", "cpu-1"}),
        ("pool in (a,b),tier=gpu", {"gpu-a", "gpu-b", "gpu-c"}),
        ("pool notin (a)", {"gpu-c", "cpu-1"}),
        ("pool", {"gpu-a", "gpu-b", "gpu-c"}),
        ("!pool", {"cpu-1"}),
    ],
)
def test_label_selectors_follow_api_server_semantics(
    double: KubernetesDouble, core: client.CoreV1Api, selector: str, expected: set[str]
) -> None:
    for name, pool in (("gpu-a", "a"), ("gpu-b", "a"), ("gpu-c", "b")):
        double.add_node(node(name, pool=pool, tier="gpu"))
    double.add_node(node("cpu-1", tier="cpu"))

    found = {n.metadata.name for n in core.list_node(label_selector=selector).items}

    assert found == expected


def test_field_selectors_and_namespaced_lists(double: KubernetesDouble, core: client.CoreV1Api) -> None:
    double.add_pod(pod("a1", "gpu-a"))
    double.add_pod(pod("a2", "gpu-a", phase="Succeeded"))
    double.add_pod(pod("b1", "gpu-b", namespace="other"))

    on_a = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a,status.phase!=Succeeded")
    in_other = core.list_namespaced_pod("other")
    by_name = core.list_pod_for_all_namespaces(field_selector="metadata.name==b1,metadata.namespace=other")

    assert [p.metadata.name for p in on_a.items] == ["a1"]
    assert [p.metadata.name for p in in_other.items] == ["b1"]
    assert [p.metadata.name for p in by_name.items] == ["b1"]
    status, body = api_error(lambda: core.list_pod_for_all_namespaces(field_selector="spec.bogus=x"))
    assert (status, body["message"]) == (400, "field label not supported: spec.bogus")


def test_list_items_carry_no_kind_like_the_api_server(double: KubernetesDouble, http: httpx.Client) -> None:
    body = http.get("/api/v1/nodes").json()

    assert body["kind"] == "NodeList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == str(double.resource_version)
    assert all("kind" not in item for item in body["items"])
    assert http.get("/api/v1/nodes/gpu-a").json()["kind"] == "Node"


def _pages(http: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every page of a list, its continue token dropped (it names a fresh snapshot each time)."""
    pages, token = [], None
    while True:
        answer = http.get(path, params={**params, **({"continue": token} if token else {})})
        assert answer.headers["content-type"] == "application/json"
        page = answer.json()
        token = page["metadata"].pop("continue", None)
        pages.append(page)
        if not token:
            return pages


def test_encoded_lists_answer_as_before_until_the_store_changes(
    double: KubernetesDouble, http: httpx.Client
) -> None:
    for index in range(5):
        double.add_pod(pod(f"p{index}", labels={"app": "train" if index % 2 else "serve"}))
    before = _pages(http, "/api/v1/pods", limit=2)
    selected = _pages(http, "/api/v1/pods", labelSelector="app=train")

    double.encode_lists("/api/v1/pods", "/api/v1/nodes")

    assert _pages(http, "/api/v1/pods", limit=2) == before
    assert [len(p["items"]) for p in before] == [2, 2, 1]
    assert before[0]["metadata"]["remainingItemCount"] == 3
    assert _pages(http, "/api/v1/pods", labelSelector="app=train") == selected
    assert [p["metadata"]["name"] for p in _pages(http, "/api/v1/nodes")[0]["items"]] == [
        "gpu-a",
        "gpu-b",
        "gpu-c",
    ]
    double.add_pod(pod("p5"))  # a write: the encoded lists are stale
    after = _pages(http, "/api/v1/pods")[0]
    assert [p["metadata"]["name"] for p in after["items"]] == [f"p{index}" for index in range(6)]
    assert after["metadata"]["resourceVersion"] == str(double.resource_version)
    with pytest.raises(ApiError):
        double.encode_lists("/api/v1/bogus")


# ------------------------------------------------------------------------------------------------ writes


def test_merge_patch_of_a_node_through_the_client_cordons_and_annotates(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    before = double.get_node("gpu-a")
    assert before is not None

    patched = core.patch_node(
        "gpu-a",
        {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {"rightsizer.io/cordoned-by": "exec-1"}},
        },
        _content_type="application/merge-patch+json",
    )

    assert patched.spec.unschedulable is True
    assert patched.metadata.annotations == {"rightsizer.io/cordoned-by": "exec-1"}
    assert int(patched.metadata.resource_version) > int(before["metadata"]["resourceVersion"])
    assert patched.metadata.uid == before["metadata"]["uid"]
    assert double.requests[-1].headers["content-type"] == "application/merge-patch+json"


def test_merge_patch_null_removes_an_annotation_and_status_is_not_writable(http: httpx.Client) -> None:
    merge = {"Content-Type": "application/merge-patch+json"}
    http.patch("/api/v1/nodes/gpu-a", json={"metadata": {"annotations": {"a": "1", "b": "2"}}}, headers=merge)

    answer = http.patch(
        "/api/v1/nodes/gpu-a",
        json={"metadata": {"annotations": {"a": None}}, "status": {"conditions": []}},
        headers=merge,
    )

    assert answer.status_code == 200
    assert answer.json()["metadata"]["annotations"] == {"b": "2"}
    assert answer.json()["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json-patch+json", [{"op": "add", "path": "/spec/unschedulable", "value": True}]),
        ("application/strategic-merge-patch+json", {"spec": {"unschedulable": True}}),
        ("application/apply-patch+yaml", {"spec": {"unschedulable": True}}),
    ],
)
def test_patch_formats_the_product_never_sends_are_415_and_change_nothing(
    double: KubernetesDouble, http: httpx.Client, content_type: str, body: Any
) -> None:
    before = double.get_node("gpu-a")

    answer = http.patch("/api/v1/nodes/gpu-a", json=body, headers={"Content-Type": content_type})

    assert answer.status_code == 415
    assert answer.json()["reason"] == "UnsupportedMediaType"
    assert double.get_node("gpu-a") == before


def test_stale_resource_version_on_patch_or_put_is_a_409_conflict_status(
    double: KubernetesDouble, http: httpx.Client
) -> None:
    stale = double.get_node("gpu-b")
    assert stale is not None
    http.patch(
        "/api/v1/nodes/gpu-b",
        json={"spec": {"unschedulable": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )

    patch = http.patch(
        "/api/v1/nodes/gpu-b",
        json={
            "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
            "spec": {"unschedulable": False},
        },
        headers={"Content-Type": "application/merge-patch+json"},
    )
    put = http.put("/api/v1/nodes/gpu-b", json=stale)

    for answer in (patch, put):
        assert answer.status_code == 409
        body = answer.json()
        assert {k: body[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Conflict",
            "code": 409,
        }
        assert "the object has been modified" in body["message"]
    current = double.get_node("gpu-b")
    assert current is not None and current["spec"]["unschedulable"] is True


def test_missing_objects_are_404_status_and_create_fills_identity(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    status, body = api_error(lambda: core.read_node("nope"))
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'nodes "nope" not found')

    created = core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="gpu-a."),
            involved_object=client.V1ObjectReference(kind="Node", name="gpu-a"),
            reason="Cordoned",
            message="cordoned by rightsizer",
            source=client.V1EventSource(component="rightsizer"),
        ),
    )
    events = core.list_namespaced_event(
        "default", field_selector="involvedObject.name=gpu-a,source=rightsizer"
    )

    assert created.metadata.name.startswith("gpu-a.") and created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert [e.reason for e in events.items] == ["Cordoned"]
    assert [e["reason"] for e in double.events(involved_name="gpu-a")] == ["Cordoned"]
    status, body = api_error(
        lambda: core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="gpu-a")))
    )
    assert (status, body["reason"]) == (409, "AlreadyExists")


# --------------------------------------------------------------------------------------------- eviction


def test_eviction_201_then_the_pod_terminates_for_its_grace_period(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("trainer", grace=120))

    evict(core, "trainer")

    terminating = double.get_pod("ml", "trainer")
    assert terminating is not None
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 120
    assert terminating["metadata"]["deletionTimestamp"] == "2025-06-15T15:08:40Z"  # T0 + 120 s
    assert double.requests[-1].status == 201
    double.advance(119)
    assert double.get_pod("ml", "trainer") is not None
    double.advance(1)
    assert double.get_pod("ml", "trainer") is None
    status, body = api_error(lambda: evict(core, "trainer"))
    assert (status, body["reason"]) == (404, "NotFound")


def test_delete_options_grace_period_and_plain_delete_are_graceful_too(
    double: KubernetesDouble, core: client.CoreV1Api, http: httpx.Client
) -> None:
    double.add_pod(pod("short"))
    double.add_pod(pod("deleted"))
    double.add_pod(pod("unscheduled", node_name=None))
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "short"}}

    http.post(
        "/api/v1/namespaces/ml/pods/short/eviction",
        json={**eviction, "deleteOptions": {"gracePeriodSeconds": 5}},
    )
    deleted = http.delete("/api/v1/namespaces/ml/pods/deleted")
    core.delete_namespaced_pod("unscheduled", "ml")

    assert deleted.status_code == 200 and deleted.json()["metadata"]["deletionGracePeriodSeconds"] == 30
    assert double.get_pod("ml", "unscheduled") is None  # nothing to stop on a node: gone at once
    double.advance(5)
    assert double.get_pod("ml", "short") is None
    assert double.get_pod("ml", "deleted") is not None
    double.advance(25)
    assert double.get_pod("ml", "deleted") is None


def test_eviction_with_a_stale_uid_is_409_and_spends_no_budget(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("trainer", labels={"app": "t"}))
    double.add_pdb(pdb("t", {"app": "t"}, maxUnavailable=1))

    status, body = api_error(lambda: evict(core, "trainer", uid="not-the-uid"))

    assert (status, body["reason"], body["code"]) == (409, "Conflict", 409)
    assert "UID in precondition: not-the-uid" in body["message"]
    current = double.get_pdb("ml", "t")
    assert current is not None and current["status"]["disruptionsAllowed"] == 1
    live = double.get_pod("ml", "trainer")
    assert live is not None and "deletionTimestamp" not in live["metadata"]
    evict(core, "trainer", uid=live["metadata"]["uid"])


def test_a_blocking_pdb_answers_429_with_the_api_servers_status_body(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    for index in range(2):
        double.add_pod(pod(f"web-{index}", labels={"app": "web"}))
    double.add_pdb(pdb("web-pdb", {"app": "web"}, minAvailable=2))

    status, body = api_error(lambda: evict(core, "web-0"))

    assert status == 429
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 currently",
                }
            ]
        },
        "code": 429,
    }


def test_a_pod_matched_by_two_pdbs_answers_500(double: KubernetesDouble, core: client.CoreV1Api) -> None:
    double.add_pod(pod("web-0", labels={"app": "web", "tier": "gpu"}))
    double.add_pdb(pdb("by-app", {"app": "web"}, maxUnavailable=1))
    double.add_pdb(pdb("by-tier", {"tier": "gpu"}, maxUnavailable="50%"))

    status, body = api_error(lambda: evict(core, "web-0"))

    assert (status, body["reason"]) == (500, "InternalError")
    assert (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
        in (body["message"])
    )


def test_disruptions_allowed_is_spent_and_recomputed_when_the_replacement_is_ready() -> None:
    with (
        KubernetesDouble(clock=lambda: T0, seed=1, replacement_start_seconds=20) as double,
        api_client(double.base_url) as raw,
    ):
        api = client.CoreV1Api(raw)
        for name in ("gpu-a", "gpu-b"):
            double.add_node(node(name))
        for index in range(3):
            double.add_pod(pod(f"web-{index}", labels={"app": "web"}, owner=("ReplicaSet", "web-5d9")))
        double.add_pdb(pdb("web", {"app": "web"}, maxUnavailable="34%"))  # ceil(3 × 34 %) = 2 -> desired 1
        double.add_pdb(pdb("frozen", {"app": "never"}, minAvailable=1))

        evict(api, "web-0")
        evict(api, "web-1")
        after_two = double.get_pdb("ml", "web")
        status, _ = api_error(lambda: evict(api, "web-2"))
        double.advance(20)  # the two replacements on gpu-b become Running and Ready
        recomputed = double.get_pdb("ml", "web")

        assert after_two is not None and after_two["status"]["disruptionsAllowed"] == 0
        assert after_two["status"]["desiredHealthy"] == 1 and after_two["status"]["currentHealthy"] == 1
        assert status == 429
        assert recomputed is not None
        assert (recomputed["status"]["currentHealthy"], recomputed["status"]["disruptionsAllowed"]) == (3, 2)
        assert recomputed["status"]["expectedPods"] == 3
        evict(api, "web-2")


def test_unmanaged_pdb_status_is_taken_as_given_and_decremented_by_evictions(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    for index in range(3):
        double.add_pod(pod(f"db-{index}", labels={"app": "db"}))
    budget = pdb("db", {"app": "db"}, minAvailable=1)
    budget["status"] = {"disruptionsAllowed": 1, "currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3}
    double.add_pdb(budget, managed_status=False)

    evict(core, "db-0")
    status, body = api_error(lambda: evict(core, "db-1"))

    assert status == 429
    assert (
        body["details"]["causes"][0]["message"]
        == "The disruption budget db needs 2 healthy pods and has 3 currently"
    )


# ------------------------------------------------------------------------------------------ controllers


def test_replicaset_pods_come_back_with_a_new_uid_and_name_on_another_node(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("web-5d9-abcde", "gpu-a", owner=("ReplicaSet", "web-5d9"), labels={"app": "web"}))
    core.patch_node("gpu-a", {"spec": {"unschedulable": True}}, _content_type="application/merge-patch+json")
    old = double.get_pod("ml", "web-5d9-abcde")
    assert old is not None

    evict(core, "web-5d9-abcde")

    pods = {p["metadata"]["name"]: p for p in double.list_pods()}
    (new_name,) = set(pods) - {"web-5d9-abcde"}
    new = pods[new_name]
    assert new_name.startswith("web-5d9-") and len(new_name) == len("web-5d9-abcde")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"]["nodeName"] == "gpu-b"
    assert new["status"]["phase"] == "Running"
    assert core.list_namespaced_pod(
        "ml", label_selector="app=web", field_selector="spec.nodeName=gpu-b"
    ).items


def test_statefulset_pods_keep_their_name_and_return_only_after_the_old_one_is_gone(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("db-0", "gpu-a", owner=("StatefulSet", "db"), grace=10))
    old_uid = double.get_pod("ml", "db-0")["metadata"]["uid"]  # type: ignore[index]

    evict(core, "db-0")
    double.advance(9)
    still_old = double.get_pod("ml", "db-0")
    double.advance(1)
    new = double.get_pod("ml", "db-0")

    assert still_old is not None and still_old["metadata"]["uid"] == old_uid
    assert new is not None and new["metadata"]["uid"] != old_uid
    assert new["spec"]["nodeName"] == "gpu-b" and "deletionTimestamp" not in new["metadata"]
    status, _ = api_error(lambda: evict(core, "db-0", uid=old_uid))
    assert status == 409


def test_a_replacement_stays_pending_until_a_node_fits(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    spot = pod("infer-0", "gpu-a", owner=("StatefulSet", "infer"), grace=0)
    spot["spec"]["nodeSelector"] = {"pool": "inference"}
    double.add_pod(spot)

    evict(core, "infer-0")
    pending = double.get_pod("ml", "infer-0")
    double.add_node(node("gpu-z", pool="inference"))
    core.list_node()  # any request lets the double reschedule
    placed = double.get_pod("ml", "infer-0")

    assert (
        pending is not None and pending["status"]["phase"] == "Pending" and "nodeName" not in pending["spec"]
    )
    assert placed is not None and placed["spec"]["nodeName"] == "gpu-z"


def test_deleting_a_node_removes_its_pods_and_an_on_request_hook_can_do_it(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("web-5d9-aaaaa", "gpu-c", owner=("ReplicaSet", "web-5d9")))
    double.add_pod(pod("bare", "gpu-c"))
    terminated: set[str] = set()

    def follow_ec2(request: RecordedRequest) -> None:
        for name in terminated:
            double.delete_node(name)

    double.on_request(follow_ec2)
    terminated.add("gpu-c")
    nodes = core.list_node()

    assert [n.metadata.name for n in nodes.items] == ["gpu-a", "gpu-b"]
    assert [
        (p["metadata"]["name"].startswith("web-5d9-"), p["spec"]["nodeName"]) for p in double.list_pods()
    ] == [(True, "gpu-a")]
    assert double.list_pods(node="gpu-c") == []


# --------------------------------------------------------------------------------------- auth and faults


def test_401_for_unknown_or_revoked_tokens(double: KubernetesDouble, core: client.CoreV1Api) -> None:
    assert core.list_node().items
    with api_client(double.base_url, token="wrong") as wrong:
        status, body = api_error(lambda: client.CoreV1Api(wrong).list_node())
    assert (status, body["reason"]) == (401, "Unauthorized")
    assert httpx.get(f"{double.base_url}/api/v1/nodes").status_code == 401

    double.revoke_token(TOKEN)  # the EKS token expired mid-run
    status, _ = api_error(core.list_node)
    double.accept_tokens("token-2")
    with api_client(double.base_url, token="token-2") as refreshed:
        assert client.CoreV1Api(refreshed).list_node().items

    assert status == 401
    assert double.requests[-1].headers["authorization"] == "Bearer token-2"


def test_the_pre_v36_api_key_name_drops_the_bearer_prefix(double: KubernetesDouble) -> None:
    """kubernetes 36 renamed the api_key entry to ``BearerToken``: the old ``authorization`` key is still
    read, but its ``api_key_prefix`` is not, so the header lacks ``Bearer`` and a real server says 401."""
    configuration = client.Configuration(host=double.base_url)
    configuration.api_key = {"authorization": TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(configuration) as legacy:
        status, _ = api_error(lambda: client.CoreV1Api(legacy).list_node())

    assert status == 401
    assert double.requests[-1].headers["authorization"] == TOKEN


def test_injected_faults_are_queued_per_verb_and_path_and_logged(
    double: KubernetesDouble, core: client.CoreV1Api, http: httpx.Client
) -> None:
    double.add_pod(pod("trainer"))
    double.add_pod(pod("flaky"))
    double.inject("POST", r"/pods/trainer/eviction$", 429, times=2)
    double.inject("POST", r"/pods/flaky/eviction$", 500, times=None)
    forbidden = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
    }
    double.inject("GET", r"^/api/v1/nodes$", 403, body=forbidden)

    first, _ = api_error(lambda: evict(core, "trainer"))
    second, _ = api_error(lambda: evict(core, "trainer"))
    evict(core, "trainer")
    failures = [api_error(lambda: evict(core, "flaky"))[0] for _ in range(3)]
    denied = http.get("/api/v1/nodes")

    assert (first, second) == (429, 429)
    assert failures == [500, 500, 500]
    assert (denied.status_code, denied.json()) == (403, forbidden)
    assert http.get("/api/v1/nodes").status_code == 200
    evictions = [r for r in double.requests if r.path.endswith("/pods/trainer/eviction")]
    assert [r.status for r in evictions] == [429, 429, 201]
    assert evictions[0].method == "POST" and evictions[0].body["metadata"]["name"] == "trainer"
    assert evictions[0].headers["authorization"] == f"Bearer {TOKEN}"
    listing = core.list_node(limit=1)
    assert listing.items and double.requests[-1].query == {"limit": ["1"]}


def test_self_subject_access_review_answers_from_the_deny_list_which_rbac_also_enforces(
    double: KubernetesDouble, core: client.CoreV1Api
) -> None:
    double.add_pod(pod("trainer"))
    double.deny("create", "pods", "eviction", "")
    with api_client(double.base_url) as raw:
        authz = client.AuthorizationV1Api(raw)

        def review(verb: str, resource: str, subresource: str = "", group: str = "") -> Any:
            attributes = client.V1ResourceAttributes(
                verb=verb, resource=resource, subresource=subresource, group=group
            )
            body = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
            )
            return authz.create_self_subject_access_review(body).status

        denied = review("create", "pods", "eviction")
        allowed = review("patch", "nodes")
        status, body = api_error(lambda: evict(core, "trainer"))
        double.allow("create", "pods", "eviction", "")
        now_allowed = review("create", "pods", "eviction")

    assert (denied.allowed, denied.denied) == (False, True)
    assert allowed.allowed is True
    assert now_allowed.allowed is True
    assert (status, body["reason"]) == (403, "Forbidden")
    assert 'cannot create resource "pods/eviction" in API group ""' in body["message"]
