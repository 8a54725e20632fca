"""The Kubernetes adapter against the Kubernetes API double over real HTTP (and moto for EKS/STS).

Covers pagination (⌈N/page⌉ list calls), DRA discovery, the SelfSubjectAccessReview preflight, error
translation, and BUG-31: token refresh on age and on one 401 (scenario A), persistent 401 and 403 ⇒
PermanentError naming the identity, the verb and the remedy (scenario B).
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.aws import AwsClients
from rightsizer.adapters.eks_auth import EksTokenSource, build_token, caller_identity, describe_cluster
from rightsizer.adapters.kubernetes import KubernetesAccessError, KubernetesCluster
from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError, PermanentError, TransientError
from rightsizer.ports import AccessCheck, ClusterReader
from rightsizer.services.snapshot import DRA_READ_CHECKS, READ_CHECKS
from rightsizer.testing.k8s import KubernetesDouble, RecordedRequest
from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
from rightsizer.wiring.builders import build_cluster_reader
from tests.builders import gpu_node, pdb, pod

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.support.moto_fixtures"]

CREDS = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)
T0 = datetime(2024, 5, 14, 10, 0, 0, tzinfo=UTC)  # BUG-31 token_created_at


class Clock:
    def __init__(self, start: datetime) -> None:
        self.t = start.timestamp()

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=1, resource_api_versions=None) as d:
        yield d


def seed(d: KubernetesDouble, nodes: int = 5) -> None:
    for i in range(nodes):
        d.add_node(gpu_node(f"gpu-{i}", instance_id=f"i-{i:017x}"))
        d.add_pod(pod(f"trainer-{i}", f"gpu-{i}", namespace="ml", gpus=1))
    d.add_pdb(pdb("trainer", "ml", {"app": "trainer"}, allowed=1))


def calls(d: KubernetesDouble, path: str) -> list[RecordedRequest]:
    return [r for r in d.requests if r.path == path]


def open_cluster(d: KubernetesDouble, page_size: int = 500) -> KubernetesCluster:
    tokens = EksTokenSource("prod-eks", "us-east-1", lambda: CREDS)
    return KubernetesCluster.for_eks(d.base_url, tokens, page_size=page_size)


# ------------------------------------------------------------------------------------------ listing


def test_lists_page_by_page_with_one_call_per_page(double: KubernetesDouble) -> None:
    # GIVEN 5 nodes and a page size of 2
    seed(double, nodes=5)
    cluster = open_cluster(double, page_size=2)

    # WHEN the nodes are listed
    nodes = cluster.list_nodes()

    # THEN all 5 come back, in kubectl form, after ⌈5/2⌉ = 3 list calls of limit 2
    assert [n["metadata"]["name"] for n in nodes] == [f"gpu-{i}" for i in range(5)]
    assert all(n["kind"] == "Node" and n["apiVersion"] == "v1" for n in nodes)
    listed = calls(double, "/api/v1/nodes")
    assert len(listed) == math.ceil(5 / 2)
    assert {r.param("limit") for r in listed} == {"2"}
    assert [r.param("continue") is None for r in listed] == [True, False, False]


def test_pods_of_all_namespaces_and_pdbs(double: KubernetesDouble) -> None:
    seed(double, nodes=3)
    double.add_pod(pod("web-0", "gpu-0", namespace="web"))
    cluster = open_cluster(double, page_size=2)

    pods = cluster.list_pods()
    pdbs = cluster.list_pdbs()

    assert sorted(p["metadata"]["namespace"] for p in pods) == ["ml", "ml", "ml", "web"]
    assert all(p["kind"] == "Pod" for p in pods)
    assert len(calls(double, "/api/v1/pods")) == 2
    assert [(p["kind"], p["apiVersion"], p["metadata"]["name"]) for p in pdbs] == [
        ("PodDisruptionBudget", "policy/v1", "trainer")
    ]
    assert calls(double, "/apis/policy/v1/poddisruptionbudgets")


def test_provider_id_maps_to_the_instance_id(double: KubernetesDouble) -> None:
    from rightsizer.domain.model import Node

    seed(double, nodes=1)
    [raw] = open_cluster(double).list_nodes()
    assert Node.model_validate(raw).instance_id == "i-00000000000000000"


def test_expired_continue_token_restarts_the_list_from_the_beginning(double: KubernetesDouble) -> None:
    # GIVEN the API server expires the continue token of the second page (410 Gone)
    seed(double, nodes=5)
    armed = [True]

    def expire_second_page(request: RecordedRequest) -> None:
        if request.path == "/api/v1/nodes" and request.param("continue") and armed[0]:
            armed[0] = False
            double.inject("GET", r"^/api/v1/nodes$", 410, times=1)

    double.on_request(expire_second_page)

    # WHEN listing THEN the adapter lists again from scratch: one consistent list, no duplicates
    nodes = open_cluster(double, page_size=2).list_nodes()
    assert [n["metadata"]["name"] for n in nodes] == [f"gpu-{i}" for i in range(5)]
    statuses = [r.status for r in calls(double, "/api/v1/nodes")]
    assert statuses == [200, 410, 200, 200, 200]


def test_server_errors_are_transient_and_nothing_partial_is_returned(double: KubernetesDouble) -> None:
    seed(double, nodes=5)
    served = [0]

    def fail_third_page(request: RecordedRequest) -> None:
        if request.path == "/api/v1/nodes":
            served[0] += 1
            if served[0] == 3:
                double.inject("GET", r"^/api/v1/nodes$", 503, times=1)

    double.on_request(fail_third_page)
    with pytest.raises(TransientError, match="list nodes"):
        open_cluster(double, page_size=2).list_nodes()


def test_connection_refused_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tokens = EksTokenSource("c", "us-east-1", lambda: CREDS)
    cluster = KubernetesCluster.for_eks(f"http://127.0.0.1:{port}", tokens, request_timeout=2)
    with pytest.raises(TransientError):
        cluster.list_nodes()


# ---------------------------------------------------------------------------------------------- DRA


def dra_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trainer-gpu", "namespace": "ml"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-0"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u"}],
        },
    }
    resource_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "gpu-0-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "gpu-0",
            "pool": {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
    return claim, resource_slice


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["v1", "v1beta2", "v1beta1"], "resource.k8s.io/v1"),
        (["v1beta2", "v1beta1"], "resource.k8s.io/v1beta2"),
        (["v1beta1"], "resource.k8s.io/v1beta1"),
    ],
)
def test_dra_uses_the_newest_served_version(
    double: KubernetesDouble, served: list[str], expected: str
) -> None:
    # GIVEN resource.k8s.io served in some versions, with one claim and one slice
    double.set_resource_api_versions(served)
    claim, resource_slice = dra_objects()
    double.add_resource_claim(claim)
    double.add_resource_slice(resource_slice)
    cluster = open_cluster(double, page_size=1)

    # WHEN discovering and listing THEN the newest served version is used, unstructured, kubectl form
    assert cluster.served_resource_api() == expected
    claims = cluster.list_resource_claims()
    slices = cluster.list_resource_slices()
    assert [(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in claims] == [
        (expected, "ResourceClaim", "trainer-gpu")
    ]
    assert [(s["apiVersion"], s["kind"]) for s in slices] == [(expected, "ResourceSlice")]
    version = expected.rpartition("/")[2]
    assert calls(double, f"/apis/resource.k8s.io/{version}/resourceclaims")
    assert len([r for r in double.requests if r.path.rstrip("/") == "/apis"]) == 1  # discovered once


def test_dra_not_served_means_no_claims_and_no_requests(double: KubernetesDouble) -> None:
    cluster = open_cluster(double)
    assert cluster.served_resource_api() is None
    assert cluster.list_resource_claims() == []
    assert cluster.list_resource_slices() == []
    assert not [r for r in double.requests if r.path.startswith("/apis/resource.k8s.io")]


def test_forbidden_or_failing_dra_on_a_served_version_is_an_error(double: KubernetesDouble) -> None:
    double.set_resource_api_versions(["v1"])
    double.deny("list", "resourceclaims", group="resource.k8s.io")
    with pytest.raises(KubernetesAccessError, match=r"list resourceclaims\.resource\.k8s\.io"):
        open_cluster(double).list_resource_claims()
    double.inject("GET", r"/resourceslices$", 500, times=1)
    with pytest.raises(TransientError):
        open_cluster(double).list_resource_slices()


# ----------------------------------------------------------------------------------------- preflight


def test_preflight_returns_the_denied_checks(double: KubernetesDouble) -> None:
    double.deny("list", "pods")
    double.deny("list", "poddisruptionbudgets", group="policy")
    cluster: ClusterReader = open_cluster(double)

    denied = cluster.preflight(READ_CHECKS + DRA_READ_CHECKS)

    assert denied == [
        AccessCheck("list", "pods"),
        AccessCheck("list", "poddisruptionbudgets", group="policy"),
    ]
    reviews = calls(double, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    assert len(reviews) == len(READ_CHECKS) + len(DRA_READ_CHECKS)
    assert reviews[0].body["spec"]["resourceAttributes"] == {"verb": "list", "resource": "nodes", "group": ""}


# -------------------------------------------------------------------------- BUG-31 authentication


def test_scenario_a_token_revoked_mid_run_is_rebuilt_once_and_the_list_continues(
    double: KubernetesDouble,
) -> None:
    # GIVEN the API server accepts only the first token, and will take a token signed one second later
    seed(double, nodes=5)
    clock = Clock(T0)
    tokens = EksTokenSource("prod-eks", "us-east-1", lambda: CREDS, clock=clock)
    first = tokens.token()
    rebuilt = build_token(CREDS, "prod-eks", "us-east-1", datetime.fromtimestamp(T0.timestamp() + 1, UTC))
    double.accept_tokens(first, rebuilt)
    cluster = KubernetesCluster.for_eks(double.base_url, tokens, page_size=2)

    # WHEN the first token stops being accepted while the second page is on its way
    revoked = [False]

    def expire(request: RecordedRequest) -> None:
        if not revoked[0] and request.path == "/api/v1/nodes" and request.param("continue"):
            revoked[0] = True
            double.revoke_token(first)
            clock.t += 1

    double.on_request(expire)
    nodes = cluster.list_nodes()

    # THEN exactly one 401, the same page is asked again with a new token, and the list is complete
    assert len(nodes) == 5
    listed = calls(double, "/api/v1/nodes")
    assert [r.status for r in listed] == [200, 401, 200, 200]
    assert listed[1].param("continue") == listed[2].param("continue")
    assert listed[1].headers["authorization"] == f"Bearer {first}"
    assert listed[2].headers["authorization"] == f"Bearer {rebuilt}"
    assert tokens.builds == 2


def test_token_older_than_ten_minutes_is_rebuilt_before_sending(double: KubernetesDouble) -> None:
    # GIVEN a run that lasts more than 10 minutes
    seed(double, nodes=2)
    clock = Clock(T0)
    tokens = EksTokenSource("prod-eks", "us-east-1", lambda: CREDS, clock=clock)
    later = datetime.fromtimestamp(T0.timestamp() + 601, UTC)
    double.accept_tokens(tokens.token(), build_token(CREDS, "prod-eks", "us-east-1", later))
    cluster = KubernetesCluster.for_eks(double.base_url, tokens)
    cluster.list_nodes()

    # WHEN the next request goes out 601 s after the token was signed
    clock.t += 601
    cluster.list_pods()

    # THEN it carries a fresh token and no 401 was ever needed
    assert [r.status for r in double.requests] == [200, 200]
    assert double.requests[0].headers["authorization"] != double.requests[1].headers["authorization"]


def test_scenario_b_persistent_401_names_identity_and_remedy(
    double: KubernetesDouble, aws_clients: AwsClients, moto_server: MotoServer
) -> None:
    # GIVEN a role the cluster does not map: every token is refused
    seed(double, nodes=1)
    double.accept_tokens("k8s-aws-v1.somebody-else")
    sts = boto3.session.Session(region_name="us-east-1").client("sts", endpoint_url=moto_server.endpoint_url)
    arn = caller_identity(sts)
    assert arn.startswith("arn:aws:")
    tokens = EksTokenSource("prod-eks", "us-east-1", lambda: CREDS, identity=lambda: caller_identity(sts))
    cluster = KubernetesCluster.for_eks(double.base_url, tokens)

    # WHEN listing nodes THEN one rebuild, one retry, then a PermanentError — no retry loop
    with pytest.raises(KubernetesAccessError) as caught:
        cluster.list_nodes()
    err = caught.value
    assert isinstance(err, PermanentError)
    assert (err.status, err.identity, err.check) == (401, arn, AccessCheck("list", "nodes"))
    assert arn in str(err)
    assert "access entry" in str(err) and "aws-auth" in str(err)
    assert [r.status for r in calls(double, "/api/v1/nodes")] == [401, 401]
    assert tokens.builds == 2


def test_scenario_b_403_names_identity_and_the_refused_verb(double: KubernetesDouble) -> None:
    double.deny("list", "pods")
    tokens = EksTokenSource(
        "prod-eks", "us-east-1", lambda: CREDS, identity=lambda: "arn:aws:iam::000000000000:role/rs"
    )
    cluster = KubernetesCluster.for_eks(double.base_url, tokens)
    with pytest.raises(KubernetesAccessError) as caught:
        cluster.list_pods()
    assert caught.value.status == 403
    message = str(caught.value)
    assert "arn:aws:iam::000000000000:role/rs may not list pods" in message
    # list pods is granted by each function's own role (issue 26: off-hours has its own): all are named,
    # each with whose group it is
    assert "bind the ClusterRole rightsizer-read (infra/k8s/rbac.yaml; the assess function's" in message
    assert "or the ClusterRole rightsizer (infra/k8s/rbac.yaml; the drain function's EKS" in message
    assert "or the ClusterRole rightsizer-offhours (infra/k8s/rbac.yaml; the off-hours function's" in message
    assert [r.status for r in calls(double, "/api/v1/pods")] == [403]  # 403 is never retried


# ------------------------------------------------------------------------------------- kubeconfig


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: other\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {server}\n"
        f"users:\n- name: tester\n  user:\n    token: {token}\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: tester\n"
        "- name: other\n  context:\n    cluster: double\n    user: nobody\n",
        encoding="utf-8",
    )
    return path


def test_kubeconfig_context(double: KubernetesDouble, tmp_path: Path) -> None:
    seed(double, nodes=3)
    double.accept_tokens("kubeconfig-token")
    kubeconfig = write_kubeconfig(tmp_path / "config", double.base_url, "kubeconfig-token")

    cluster = KubernetesCluster.from_kubeconfig("double", str(kubeconfig), page_size=2)

    assert len(cluster.list_nodes()) == 3
    assert cluster.identity() == "kubeconfig context double (user tester)"
    with pytest.raises(ConfigError, match=r"cluster\.context"):
        KubernetesCluster.from_kubeconfig("missing", str(kubeconfig)).list_nodes()


# ------------------------------------------------------------------------------- EKS DescribeCluster


def test_describe_cluster_endpoint_and_ca_through_moto(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster
) -> None:
    # GIVEN an EKS cluster on the moto server
    target = describe_cluster(aws_clients.eks, gpu_cluster.cluster)

    # THEN endpoint and CA bytes are plumbed through (moto's CA data is random bytes, not PEM)
    assert target.name == gpu_cluster.cluster
    assert target.endpoint.startswith("https://")
    assert target.ca_pem
    with pytest.raises(ConfigError, match=r"cluster\.name"):
        describe_cluster(aws_clients.eks, "no-such-cluster")


def test_wiring_fails_closed_on_a_ca_that_is_not_pem(
    aws_clients: AwsClients, gpu_cluster: BuiltCluster, moto_server: MotoServer
) -> None:
    config = Config.model_validate(
        {"cluster": {"name": gpu_cluster.cluster}, "aws": {"endpoint_url": moto_server.endpoint_url}}
    )
    with pytest.raises(PermanentError, match="not a PEM certificate"):
        build_cluster_reader(config)
