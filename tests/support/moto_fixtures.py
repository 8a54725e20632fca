"""pytest fixtures: one moto server per session, a fresh EKS cluster with GPU node groups per test.

Use from a test module with ``pytest_plugins = ["tests.support.moto_fixtures"]`` (or from a conftest).
State is wiped between tests through moto's ``/moto-api/reset`` endpoint, so tests are independent
without paying for a server start each time.
"""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from rightsizer.adapters.aws import AwsClients, make_clients
from rightsizer.testing.moto_eks import (
    BuiltCluster,
    MotoServer,
    NodeGroupReconciler,
    NodeGroupSpec,
    build_cluster,
    reset_moto,
    start_moto_server,
)

REGION = "us-east-1"
CLUSTER = "prod-eks"
#: The BUG-23 shape: min 1, desired 3, max 6.
GPU_GROUP = NodeGroupSpec(name="gpu-a10g", instance_type="g5.2xlarge", min_size=1, desired=3, max_size=6)
OTHER_GROUP = NodeGroupSpec(name="gpu-l4", instance_type="g6.xlarge", min_size=0, desired=1, max_size=2)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A ``ThreadedMotoServer`` on 127.0.0.1 (random port) for the whole session."""
    server = start_moto_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def boto_session() -> boto3.session.Session:
    """One boto3 session for the run: it caches the service models, clients stay per test."""
    return boto3.session.Session(
        region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


@pytest.fixture
def aws_clients(
    moto_server: MotoServer, boto_session: boto3.session.Session, monkeypatch: pytest.MonkeyPatch
) -> AwsClients:
    """Fresh clients (no hooks left by other tests) on a freshly reset moto server.

    Dummy credentials are also put in the environment for code that builds its own session.
    """
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    reset_moto(moto_server.endpoint_url)
    return make_clients(REGION, endpoint_url=moto_server.endpoint_url, session=boto_session)


@pytest.fixture
def gpu_cluster(aws_clients: AwsClients) -> BuiltCluster:
    """Cluster ``prod-eks`` with node groups ``gpu-a10g`` (1/3/6, g5.2xlarge) and ``gpu-l4`` (0/1/2)."""
    return build_cluster(aws_clients, cluster=CLUSTER, region=REGION, nodegroups=[GPU_GROUP, OTHER_GROUP])


@pytest.fixture
def reconciler(aws_clients: AwsClients, gpu_cluster: BuiltCluster) -> Iterator[NodeGroupReconciler]:
    """The EKS ⇄ ASG size mirror for ``gpu_cluster``; call ``reconcile()`` after each action."""
    with NodeGroupReconciler(aws_clients, gpu_cluster.cluster, region=REGION) as mirror:
        mirror.reconcile()
        yield mirror
