"""The Kubernetes writer adapter on the wire: what :class:`KubernetesCluster` sends to the API server
(merge patches guarded by resourceVersion, Eviction bodies with the UID precondition, field-selected pages)
and how it reads 401/403/429/503 answers, against the :class:`KubernetesDouble` over HTTP. The contract
suite both worlds share is ``test_writer_contract.py``; its worlds and builders are reused here.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from rightsizer.adapters.eks_auth import build_token
from rightsizer.adapters.kubernetes import KubernetesAccessError
from rightsizer.domain.errors import TransientError
from rightsizer.domain.model import ANN_CORDONED_AT, ANN_CORDONED_BY
from rightsizer.ports import EvictionOutcome
from rightsizer.testing.fakes import FakeClock
from rightsizer.testing.k8s import KubernetesDouble, RecordedRequest
from tests.builders import pod
from tests.integration.test_writer_contract import (
    AT,
    CREDS,
    EXEC,
    JSON,
    NODE,
    T0,
    TOO_MANY,
    RealWorld,
    node_obj,
    uid_of,
)

pytestmark = pytest.mark.integration

# -------------------------------------------------------------------- the adapter on the wire (real)


@pytest.fixture
def real() -> Iterator[RealWorld]:
    clock = FakeClock(T0)
    with KubernetesDouble(clock=clock, seed=1, resource_api_versions=None) as double:
        yield RealWorld(clock, double)
        assert double.internal_errors == []


def test_one_401_rebuilds_the_token_and_resends_the_eviction(real: RealWorld) -> None:
    # GIVEN BUG-31 scenario A: the first token stops being accepted just as the eviction goes out
    real.add_node(node_obj())
    real.add_pod(pod("trainer-2", NODE, namespace="ml", grace=900))
    first = real.tokens.token()
    rebuilt = build_token(CREDS, "prod-eks", "us-east-1", datetime.fromtimestamp(T0.timestamp() + 1, UTC))
    real.double.accept_tokens(first, rebuilt)
    revoked = [False]

    def expire(request: RecordedRequest) -> None:
        if not revoked[0] and request.path.endswith("/eviction"):
            revoked[0] = True
            real.double.revoke_token(first)
            real.clock.advance(1)

    real.double.on_request(expire)

    # WHEN evicting THEN one 401, a rebuilt token, the same eviction again, accepted
    outcome = real.writer.evict("ml", "trainer-2", uid_of(real, "ml", "trainer-2"))

    assert outcome.status == "accepted"
    evictions = [r for r in real.double.requests if r.path.endswith("/eviction")]
    assert [r.status for r in evictions] == [401, 201]
    assert evictions[1].headers["authorization"] == f"Bearer {rebuilt}"
    assert real.tokens.builds == 2


def test_cordon_is_one_merge_patch_guarded_by_the_fresh_resource_version(real: RealWorld) -> None:
    real.add_node(node_obj())
    real.double.clear_requests()

    real.writer.cordon(NODE, EXEC, AT)

    get, patch = real.double.requests
    assert (get.method, get.path) == ("GET", f"/api/v1/nodes/{NODE}")
    assert (patch.method, patch.path) == ("PATCH", f"/api/v1/nodes/{NODE}")
    assert patch.headers["content-type"].startswith("application/merge-patch+json")
    resource_version = patch.body["metadata"]["resourceVersion"]
    assert resource_version and patch.body == {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {ANN_CORDONED_BY: EXEC, ANN_CORDONED_AT: AT},
        },
        "spec": {"unschedulable": True},
    }


def test_uncordon_sends_nulls_for_our_annotations(real: RealWorld) -> None:
    real.add_node(node_obj())
    real.writer.cordon(NODE, EXEC, AT)
    real.double.clear_requests()

    real.writer.uncordon(NODE, EXEC)

    patch = real.double.requests[-1]
    assert patch.body["metadata"]["annotations"] == {ANN_CORDONED_BY: None, ANN_CORDONED_AT: None}
    assert patch.body["spec"] == {"unschedulable": False}


def test_eviction_body_carries_the_uid_precondition(real: RealWorld) -> None:
    real.add_node(node_obj())
    real.add_pod(pod("trainer-2", NODE, namespace="ml"))
    uid = uid_of(real, "ml", "trainer-2")

    real.writer.evict("ml", "trainer-2", uid)

    [request] = [r for r in real.double.requests if r.method == "POST"]
    assert request.path == "/api/v1/namespaces/ml/pods/trainer-2/eviction"
    assert request.body["apiVersion"] == "policy/v1" and request.body["kind"] == "Eviction"
    assert request.body["deleteOptions"] == {"preconditions": {"uid": uid}}
    assert not [r for r in real.double.requests if r.method == "DELETE"]  # never a plain delete


@pytest.mark.parametrize(
    ("headers", "details", "expected"),
    [
        ({"Retry-After": "7"}, None, 7.0),
        ({}, {"retryAfterSeconds": 10}, 10.0),
        ({}, None, None),
    ],
)
def test_429_retry_after(
    real: RealWorld, headers: dict[str, str], details: JSON | None, expected: float | None
) -> None:
    real.add_node(node_obj())
    real.add_pod(pod("triton-0", NODE, namespace="inference"))
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 429,
        "reason": "TooManyRequests",
        "message": TOO_MANY,
    }
    if details is not None:
        body["details"] = details
    real.double.inject("POST", r"/eviction$", 429, body=body, headers=headers)

    outcome = real.writer.evict("inference", "triton-0", uid_of(real, "inference", "triton-0"))

    assert outcome == EvictionOutcome("blocked", TOO_MANY, expected)


def test_eviction_503_is_transient_and_403_names_the_rightsizer_role(real: RealWorld) -> None:
    real.add_node(node_obj())
    real.add_pod(pod("trainer-2", NODE, namespace="ml"))
    uid = uid_of(real, "ml", "trainer-2")
    real.double.inject("POST", r"/eviction$", 503)
    with pytest.raises(TransientError):
        real.writer.evict("ml", "trainer-2", uid)

    real.deny("create", "pods", "eviction")
    with pytest.raises(KubernetesAccessError, match="ClusterRole rightsizer "):
        real.writer.evict("ml", "trainer-2", uid)


def test_pods_on_node_are_listed_with_a_field_selector_page_by_page(real: RealWorld) -> None:
    real.add_node(node_obj())
    for i in range(3):
        real.add_pod(pod(f"render-{i}", NODE, namespace="batch"))
    real.double.clear_requests()

    assert len(real.writer.list_pods_on_node(NODE)) == 3

    listed = [r for r in real.double.requests if r.path == "/api/v1/pods"]
    assert [r.param("fieldSelector") for r in listed] == [f"spec.nodeName={NODE}"] * 2
    assert {r.param("limit") for r in listed} == {"2"}
