"""A small organisation on moto for the fleet tests (issue 31): two member accounts, spoke roles, EKS clusters
in two regions, each cluster's Kubernetes API on its own double, DCGM history in one real Prometheus.

Clusters (account / region / name → the fault it carries):

- ``A/us-east-1/ok`` — three g5.2xlarge nodes with DCGM series (``planted_cluster``): ``assessed``;
- ``A/us-east-1/private`` — its API endpoint answers nothing (a closed port): ``unreachable_endpoint``;
- ``B/us-east-1/denied`` — its API server grants the spoke role nothing (no access entry): ``access_denied``;
- ``B/us-east-1/nometrics`` — nodes without a single DCGM series: ``metrics_unavailable``;
- ``A/us-west-2/slow`` — its member Lambda is killed at the timeout (the test's invoke): ``timeout``;
- region ``ap-nowhere-1`` is not enabled in any account: ``region_not_enabled``.

moto maps an assumed role's credentials to the role's account, so every cluster is created, found and
assessed through ``sts:AssumeRole`` into its account; :func:`route_eks_to_doubles` sends the EKS API endpoint
of each cluster (``eks:DescribeCluster``) to its double and records the account of the credentials its
tokens are signed with.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import boto3
import pytest

from rightsizer.adapters.aws import make_clients
from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import NodeGroupSpec, build_cluster
from tests.builders import AT, gpu_node
from tests.support.planted_cluster import seed_cluster

ROLE = "gpu-rightsizer-spoke"
EXTERNAL_ID = "fleet-test-external-id"
NOT_ENABLED = "ap-nowhere-1"
GROUP = NodeGroupSpec(name="gpu-a10g", instance_type="g5.2xlarge", min_size=1, desired=3, max_size=6)
#: (account label, region, cluster) of every cluster the world builds.
CLUSTERS = (
    ("A", "us-east-1", "ok"),
    ("A", "us-east-1", "private"),
    ("A", "us-west-2", "slow"),
    ("B", "us-east-1", "denied"),
    ("B", "us-east-1", "nometrics"),
)


def assumed(endpoint_url: str, account: str, region: str = "us-east-1") -> boto3.session.Session:
    """A session in ``account`` through its spoke role (moto grants any AssumeRole)."""
    sts = boto3.client("sts", region_name=region, endpoint_url=endpoint_url)
    creds = sts.assume_role(
        RoleArn=f"arn:aws:iam::{account}:role/{ROLE}", RoleSessionName="fleet-world", ExternalId=EXTERNAL_ID
    )["Credentials"]
    return boto3.session.Session(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        region_name=region,
    )


def closed_port() -> str:
    """An http URL on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class FleetWorld:
    """The organisation: account ids by label, doubles by cluster name, the Prometheus URL."""

    endpoint_url: str
    prometheus_url: str
    accounts: dict[str, str]
    doubles: dict[str, KubernetesDouble]
    endpoints: dict[str, str] = field(default_factory=dict)
    #: (cluster, account of the credentials its EKS tokens were signed with), in request order.
    signed_by: list[tuple[str, str]] = field(default_factory=list)

    def key(self, label: str, region: str, cluster: str) -> str:
        return f"{self.accounts[label]}/{region}/{cluster}"


def build_world(endpoint_url: str, prometheus_url: str, stack: ExitStack) -> FleetWorld:
    """Create the organisation, the accounts' clusters (tagged with the Prometheus URL) and their doubles."""
    orgs = boto3.client("organizations", region_name="us-east-1", endpoint_url=endpoint_url)
    orgs.create_organization(FeatureSet="ALL")
    accounts = {
        label: orgs.create_account(Email=f"{label.lower()}@example.com", AccountName=f"gpu-{label}")[
            "CreateAccountStatus"
        ]["AccountId"]
        for label in ("A", "B")
    }
    world = FleetWorld(endpoint_url, prometheus_url, accounts, {})
    for label, region, name in CLUSTERS:
        clients = make_clients(region, endpoint_url, session=assumed(endpoint_url, accounts[label], region))
        # Only the clusters whose nodes are read get a node group (its VPC, ASG and instances cost moto time)
        groups = [GROUP] if name in ("ok", "nometrics") else []
        built = build_cluster(clients, cluster=name, region=region, nodegroups=groups)
        arn = clients.eks.describe_cluster(name=name)["cluster"]["arn"]
        clients.eks.tag_resource(resourceArn=arn, tags={"rightsizer.io/prometheus-url": prometheus_url})
        double = stack.enter_context(KubernetesDouble(seed=7, resource_api_versions=None))
        ids = built.nodegroups[GROUP.name].instance_ids if groups else ()
        if name == "nometrics":
            for index, instance_id in enumerate(ids):
                double.add_node(
                    gpu_node(f"quiet-{index}", instance_type="g5.2xlarge", gpus=1, instance_id=instance_id,
                             ip=f"10.9.{index}.5", created=AT - timedelta(days=3))
                )  # fmt: skip
        else:
            seed_cluster(double, ids)
        if name == "denied":
            double.bind_cluster_role({"kind": "ClusterRole", "rules": []})  # no access entry: 403 on all
        world.doubles[name] = double
        world.endpoints[name] = closed_port() if name == "private" else double.base_url
    return world


def _account_of(tokens: EksTokenSource, endpoint_url: str) -> str:
    creds = tokens._credentials()  # the frozen credentials the token is presigned with
    sts = boto3.client(
        "sts",
        region_name="us-east-1",
        endpoint_url=endpoint_url,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.token,
    )
    return str(sts.get_caller_identity()["Account"])


@contextmanager
def route_eks_to_doubles(world: FleetWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``KubernetesCluster.for_eks`` of cluster X talks to X's double (or X's closed port); the real
    ``eks:DescribeCluster`` and token path run on moto under the assumed role."""
    from rightsizer.adapters import eks_auth

    for_eks = KubernetesCluster.for_eks.__func__  # type: ignore[attr-defined]

    def at_the_double(cls: type[KubernetesCluster], _endpoint: str, tokens: Any, **kwargs: Any) -> Any:
        world.signed_by.append((tokens.cluster, _account_of(tokens, world.endpoint_url)))
        kwargs["request_timeout"] = 2.0
        return for_eks(cls, world.endpoints[tokens.cluster], tokens, **kwargs)

    monkeypatch.setattr(KubernetesCluster, "for_eks", classmethod(at_the_double))
    monkeypatch.setattr(eks_auth, "write_ca_bundle", lambda _pem, directory: _ca(directory))
    yield


def _ca(directory: str) -> Any:
    from pathlib import Path

    path = Path(directory) / "ca.crt"
    path.write_text("unused over http\n", encoding="utf-8")
    return path
