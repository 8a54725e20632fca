"""BUG-51 (tests/fixtures/cases/BUG-51.yaml): a paginated pod LIST whose continue token expires (410 Gone).

The case's 410 answer carries an "inconsistent continue" token. The adapter must neither keep the pages read
before the 410 (a partial list says a busy GPU node is empty) nor follow that token (a splice of two lists):
it restarts the list from the beginning once, and when that expires too the read fails (TransientError, so
the cycle's pod-dependent checks are unknown) — never an incomplete list. Both the fleet-wide pod list and
the per-node list (``fieldSelector=spec.nodeName``) a drain re-reads before evicting are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.domain.errors import TransientError
from rightsizer.testing.k8s import KubernetesDouble, RecordedRequest
from tests.builders import gpu_node, pod

CASE = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "cases" / "BUG-51.yaml").read_text())
[EXPIRED] = [r for r in CASE["requests"] if r.get("status") == 410]
INCONSISTENT = EXPIRED["body"]["metadata"]["continue"]
[REAL] = CASE["pods_on_gpu_node_q_in_reality"]
NODE = "gpu-node-q"


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=1, resource_api_versions=None) as d:
        # Filler pods on other nodes sort before the case's pod: a list cut short misses it.
        for i in range(5):
            d.add_node(gpu_node(f"gpu-a{i}", instance_id=f"i-{i:017x}"))
            d.add_pod(pod(f"a-filler-{i}", f"gpu-a{i}", namespace="ml", gpus=1))
        d.add_node(gpu_node(NODE, instance_id="i-00000000000000051"))
        d.add_pod(
            pod(REAL["name"], NODE, namespace=REAL["namespace"], gpus=int(REAL["requests"]["nvidia.com/gpu"]))
        )
        yield d


def open_cluster(d: KubernetesDouble) -> KubernetesCluster:
    from botocore.credentials import ReadOnlyCredentials

    creds = ReadOnlyCredentials("AKIDEXAMPLE", "secret", None)
    return KubernetesCluster.for_eks(
        d.base_url, EksTokenSource("prod-eks", "us-east-1", lambda: creds), page_size=2
    )


def expire_continues(d: KubernetesDouble, times: int | None) -> list[RecordedRequest]:
    """Answer ``times`` (None: every) continued pod-list requests with the case's 410 body."""
    left = [times]

    def hook(request: RecordedRequest) -> None:
        if request.path == "/api/v1/pods" and request.param("continue") and left[0] != 0:
            left[0] = None if left[0] is None else left[0] - 1
            d.inject("GET", r"^/api/v1/pods$", 410, body=EXPIRED["body"], times=1)

    d.on_request(hook)
    return d.requests


def pod_lists(d: KubernetesDouble) -> list[RecordedRequest]:
    return [r for r in d.requests if r.path == "/api/v1/pods"]


READS: dict[str, Callable[[KubernetesCluster], list[Any]]] = {
    "all_pods": lambda c: c.list_pods(),
    "pods_on_node": lambda c: c.list_pods_on_node(NODE),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_bug51_every_continue_expires_the_read_fails_and_no_partial_list_is_returned(
    double: KubernetesDouble, read: Callable[[KubernetesCluster], list[Any]]
) -> None:
    if read is READS["pods_on_node"]:
        for i in range(3):  # enough pods on the node for two pages
            double.add_pod(pod(f"a-sidecar-{i}", NODE, namespace="ml", gpus=0))
    expire_continues(double, None)
    with pytest.raises(TransientError, match="continue token expired twice"):
        read(open_cluster(double))
    lists = pod_lists(double)
    assert [r.param("continue") for r in lists if not r.param("continue")] == [None, None]  # one restart
    assert all(r.param("continue") != INCONSISTENT for r in lists)  # the inconsistent token is never used


def test_bug51_one_expiry_restarts_and_the_running_job_is_in_the_list(double: KubernetesDouble) -> None:
    expire_continues(double, 1)
    pods = open_cluster(double).list_pods()
    names = [p["metadata"]["name"] for p in pods]
    assert REAL["name"] in names
    assert len(names) == len(set(names)) == 6
    assert all(r.param("continue") != INCONSISTENT for r in pod_lists(double))
    assert [r.status for r in pod_lists(double)][:2] == [200, 410]
